// Scenario k: the 2025-11-25 experimental tasks that the proxy serves itself
// (`[upstream.tasks] legacy = true`) in front of a task-UNAWARE server, judged
// by the stock TS SDK 1.x client's `client.experimental.tasks`.
//
//   TS SDK 1.32 client (experimental.tasks) --> mcp-resume-proxy --> lib/resumable-server.mjs (TS SDK, no tasks)
//
// Checks: the proxy advertises `capabilities.tasks` and marks every tool
// `execution.taskSupport: "optional"`, so the stock `callToolStream` makes a
// task on its own (no explicit `task` option); the task's result arrives by
// polling; `tasks/list` shows it; an elicitation of the upstream during a
// task is answered through the client's handler (the task goes
// `input_required`, the client's `tasks/result` carries the question);
// `tasks/cancel` stops the upstream's work (the server's /stats counts the
// aborted handler); kill -9 of the proxy mid-task and a restart on the same
// data dir and port: the same client's task still completes with its result
// (its upstream request is resumed like any request of the session).
import fs from 'node:fs';
import path from 'node:path';
import { CallToolResultSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  INTEROP_DIR, freePort, log, runScenario, sleep, start, startProxy, waitForPort, workdir,
} from '../lib/harness.mjs';
import { connectClient } from '../lib/tsclient.mjs';

await runScenario('k-legacy-tasks: 2025-11-25 tasks served by the proxy to the TS SDK 1.x client, upstream unaware', async (checks) => {
  const upPort = await freePort();
  const upstream = start('unaware-ts-server', process.execPath, [path.join(INTEROP_DIR, 'lib', 'resumable-server.mjs'), String(upPort)]);
  await waitForPort(upPort, upstream);
  const stats = async () => (await fetch(`http://127.0.0.1:${upPort}/stats`)).json();
  const conf = path.join(workdir(), 'proxy.toml');
  fs.writeFileSync(conf, `[[upstream]]\nurl = "http://127.0.0.1:${upPort}/mcp"\n[upstream.tasks]\nlegacy = true\npoll_interval_ms = 200\n`);
  let proxy = await startProxy({ extraArgs: ['--config', conf], name: 'proxy' });

  const { client } = await connectClient(proxy.url, {
    capabilities: { elicitation: { form: {} } },
    quiet: true,
    beforeConnect: (c) => c.setRequestHandler(ElicitRequestSchema, async (req) => {
      log('elicitation asked:', req.params.message, JSON.stringify(req.params._meta ?? {}));
      return { action: 'accept', content: { colour: 'teal' } };
    }),
  });
  const caps = client.getServerCapabilities()?.tasks;
  checks.ok(caps?.requests?.tools?.call !== undefined && caps?.list && caps?.cancel,
    'initialize: capabilities.tasks (list, cancel, requests.tools.call) advertised for the unaware upstream', caps);
  const { tools } = await client.listTools();
  checks.ok(tools.length === 2 && tools.every((t) => t.execution?.taskSupport === 'optional'),
    'tools/list: every tool marked execution.taskSupport "optional"', tools.map((t) => t.execution));

  // 1. The stock stream makes the task on its own.
  const seen = await drain(client.experimental.tasks.callToolStream(
    { name: 'long-op', arguments: { steps: 6, intervalMs: 150 } }, CallToolResultSchema));
  const created = seen.find((m) => m.type === 'taskCreated');
  checks.ok(created !== undefined, 'callToolStream (no explicit task option) got a CreateTaskResult', seen.map((m) => m.type));
  const result = seen.find((m) => m.type === 'result')?.result;
  checks.ok(result?.content?.[0]?.text === 'long-op done: 6 steps', 'the task ended with the upstream\'s result', result);
  const listed = await client.experimental.tasks.listTasks();
  const mine = listed.tasks.find((t) => t.taskId === created?.task?.taskId);
  checks.ok(mine?.status === 'completed' && typeof mine.ttl === 'number', 'tasks/list shows the task, completed', listed);

  // 2. An elicitation of the upstream during the task.
  const asked = await drain(client.experimental.tasks.callToolStream({ name: 'ask-colour', arguments: {} }, CallToolResultSchema));
  const colour = asked.find((m) => m.type === 'result')?.result?.content?.[0]?.text;
  checks.ok(colour === 'colour: teal', 'the upstream\'s elicitation was answered through the client\'s handler (input_required → tasks/result)',
    asked.map((m) => m.type === 'taskStatus' ? `status:${m.task.status}` : m.type));

  // 3. Cancel stops the upstream's work.
  const long = await taskOf(client, { name: 'long-op', arguments: { steps: 200, intervalMs: 100 } });
  await sleep(300);
  const cancelled = await client.experimental.tasks.cancelTask(long);
  checks.ok(cancelled.status === 'cancelled', 'tasks/cancel answers with the task, cancelled', cancelled);
  let aborted = 0;
  for (let i = 0; i < 50 && aborted === 0; i++) {
    aborted = (await stats()).aborted;
    await sleep(100);
  }
  checks.ok(aborted === 1, 'the upstream handler was aborted (notifications/cancelled reached it)', await stats());

  // 4. kill -9 mid-task, restart on the same data dir and port.
  const survivor = await taskOf(client, { name: 'long-op', arguments: { steps: 15, intervalMs: 100 } });
  await sleep(400);
  proxy.child.kill('SIGKILL');
  log('proxy killed with SIGKILL mid-task; restarting');
  await sleep(300);
  proxy = await startProxy({ extraArgs: ['--config', conf], name: 'proxy-restarted', port: proxy.port, dataDir: proxy.dataDir });
  let status;
  for (let i = 0; i < 100; i++) {
    status = (await client.experimental.tasks.getTask(survivor)).status;
    if (status !== 'working') break;
    await sleep(200);
  }
  checks.ok(status === 'completed', 'after kill -9 and restart the task still completed', status);
  const after = await client.experimental.tasks.getTaskResult(survivor, CallToolResultSchema);
  checks.ok(after?.content?.[0]?.text === 'long-op done: 15 steps', 'tasks/result after the restart: the upstream\'s result', after);
}, { timeoutMs: 90000 });

/** Every message of a task stream. */
async function drain(stream) {
  const seen = [];
  for await (const message of stream) {
    log('stream:', message.type, message.type === 'taskStatus' ? message.task.status : '');
    seen.push(message);
  }
  return seen;
}

/** Starts a task (explicit task option) and returns its id without waiting for it. */
async function taskOf(client, params) {
  const stream = client.experimental.tasks.callToolStream(params, CallToolResultSchema, { task: { ttl: 60000 } });
  for await (const message of stream) {
    if (message.type === 'taskCreated') return message.task.taskId;
    if (message.type === 'error' || message.type === 'result') throw new Error(`no task: ${JSON.stringify(message)}`);
  }
  throw new Error('the stream ended without a task');
}
