// Scenario j: tasks (the io.modelcontextprotocol/tasks extension, SEP-2663)
// that the proxy serves itself in front of a task-UNAWARE server, judged by
// the extension's own client and by the conformance tool.
//
//   tasks_client.py (FastMCP 4.1 + fastmcp-tasks) --> mcp-resume-proxy --> unaware_server.py (mcp 2.x)
//   conformance 0.2 tasks-*                       --> mcp-resume-proxy --> unaware_server.py
//   conformance 0.2 tasks-*                       --> native_server.py (fastmcp-tasks), the reference
//
// The proxy runs with --config WORK/proxy.toml: `[upstream.tasks]
// task_after_ms = 500` (a declaring tools/call still unanswered after 500 ms
// becomes a task) and `required_tools = ["failing_job"]` (what the
// conformance fixture expects of a tool that only runs as a task).
//
// Client checks: a fast call gets its plain result; a slow one becomes a task
// whose result arrives by polling; an input request (MRTR) of the upstream is
// answered through the client's elicitation handler; a round-1 MRTR then a
// task (composition); cancel stops the upstream's work (the server's /stats
// counts the cancelled handler); kill -9 of the proxy and a restart on the
// same data dir and port: a task whose upstream call had finished and been
// logged still gives its result to the same handle, and one killed mid-call
// ends failed with the proxy's restart error.
// Conformance: every tasks-* scenario passes through the proxy; the native
// server's scores are printed beside them (one line per scenario).
//
// A binary without tasks fails fast: it refuses [upstream.tasks] in the
// config, or does not advertise the extension in server/discover; then
// nothing else runs.
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import {
  CONFORMANCE_TASKS_JS, INTEROP_DIR, PYTHON, freePort, log, runScenario, sleep, start, startProxy, tail, waitForPort, workdir,
} from '../lib/harness.mjs';
import { readChecks, runConformance } from '../lib/conformance.mjs';

const EXT = 'io.modelcontextprotocol/tasks';
/** The proxy's error for a call it was relaying when it was killed. */
const RESTARTED = 'the proxy restarted while the upstream was answering this request';
const SCENARIOS = [
  'tasks-lifecycle', 'tasks-capability-negotiation', 'tasks-dispatch-and-envelope', 'tasks-request-headers',
  'tasks-wire-fields', 'tasks-request-state-removal', 'tasks-mrtr-input', 'tasks-required-task-error',
  'tasks-mrtr-composition', 'tasks-status-notifications',
];

/** A Python server of lib/ on a free port, up when its port opens. */
async function startPythonServer(name, script) {
  const port = await freePort();
  // FastMCP would otherwise look for its own updates on the network.
  const child = start(name, PYTHON, [path.join(INTEROP_DIR, 'lib', script), String(port)],
    { env: { FASTMCP_CHECK_FOR_UPDATES: 'off' } });
  await waitForPort(port, child, 30000);
  return { child, base: `http://127.0.0.1:${port}`, url: `http://127.0.0.1:${port}/mcp` };
}

/** Polls fn() every 100 ms until it returns something truthy or ms pass. */
async function waitFor(fn, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v || Date.now() > deadline) return v;
    await sleep(100);
  }
}

/** One 2026-07-28 server/discover (the client declares the extension). */
async function discover(url) {
  const r = await fetch(url, {
    method: 'POST',
    signal: AbortSignal.timeout(10000),
    headers: {
      'content-type': 'application/json', accept: 'application/json, text/event-stream',
      'mcp-protocol-version': '2026-07-28', 'mcp-method': 'server/discover',
    },
    body: JSON.stringify({
      jsonrpc: '2.0', id: 1, method: 'server/discover', params: {
        _meta: {
          'io.modelcontextprotocol/protocolVersion': '2026-07-28',
          'io.modelcontextprotocol/clientInfo': { name: 'j-tasks', version: '0' },
          'io.modelcontextprotocol/clientCapabilities': { extensions: { [EXT]: {} } },
        },
      },
    }),
  });
  const text = await r.text();
  try {
    return { status: r.status, body: JSON.parse(text) };
  } catch {
    return { status: r.status, body: text.slice(0, 300) };
  }
}

/** tasks_client.py, one command per line; each answers one JSON line. */
class TasksClient {
  constructor(url) {
    this.child = start('tasks_client', PYTHON, [path.join(INTEROP_DIR, 'scenarios', 'tasks_client.py'), url],
      { stdio: ['pipe', 'pipe', 'pipe'], env: { FASTMCP_CHECK_FOR_UPDATES: 'off' } });
    const err = fs.createWriteStream(path.join(workdir(), 'tasks_client.log'));
    this.child.stderr.pipe(err);
    this.lines = [];
    this.wake = () => {};
    this.elicitations = [];
    readline.createInterface({ input: this.child.stdout }).on('line', (line) => {
      let ev;
      try {
        ev = JSON.parse(line);
      } catch {
        log('client:', line);
        return;
      }
      log('client', line.slice(0, 300));
      if (ev.event === 'elicitation') this.elicitations.push(ev.message);
      else this.lines.push(ev);
      this.wake();
    });
    this.child.exited.then(() => this.wake());
  }

  /** The next line matching pred, or undefined after ms (or when the client exited). */
  async next(pred, ms) {
    const deadline = Date.now() + ms;
    for (;;) {
      const i = this.lines.findIndex(pred);
      if (i >= 0) return this.lines.splice(i, 1)[0];
      if (this.child.exitCode !== null || Date.now() > deadline) return undefined;
      await new Promise((r) => {
        this.wake = r;
        setTimeout(r, Math.max(0, deadline - Date.now()));
      });
    }
  }

  /** Runs one command; its answer, or {ok: false, error} after ms. */
  async run(command, ms = 40000) {
    const cmd = command.split(' ')[0];
    this.child.stdin.write(`${command}\n`);
    return (await this.next((l) => l.cmd === cmd, ms))
      ?? { cmd, ok: false, error: `no answer in ${ms} ms (client ${this.child.exitCode === null ? 'running' : 'exited'})` };
  }
}

await runScenario('j-tasks: tasks served by the proxy in front of a task-unaware server (FastMCP client, conformance tasks-*)', async (checks) => {
  const [unaware, native] = await Promise.all([
    startPythonServer('unaware', 'unaware_server.py'), startPythonServer('native', 'native_server.py'),
  ]);
  log('task-unaware server (mcp 2.x) at', unaware.url, '| native fastmcp-tasks server at', native.url);
  const stats = async () => (await fetch(`${unaware.base}/stats`)).json();

  const config = path.join(workdir(), 'proxy.toml');
  fs.writeFileSync(config, [
    '[[upstream]]', `url = "${unaware.url}"`, '',
    '[upstream.tasks]', 'task_after_ms = 500', 'required_tools = ["failing_job"]', '',
  ].join('\n'));
  const port = await freePort();
  const dataDir = path.join(workdir(), 'proxy-data');
  let generation = 0;
  const startTasksProxy = () => {
    generation += 1;
    return startProxy({ name: `proxy-${generation}`, port, dataDir, extraArgs: ['--config', config] });
  };
  const bare = await discover(unaware.url).catch((e) => ({ status: 0, body: String(e) }));
  checks.ok(bare.status === 200 && !(EXT in (bare.body?.result?.capabilities?.extensions ?? {})),
    'the upstream alone answers server/discover without the tasks extension (it is task-unaware)', bare);
  let proxy;
  try {
    proxy = await startTasksProxy();
  } catch (e) {
    checks.ok(false, 'the proxy starts with [upstream.tasks] in its config (does this binary have tasks?)',
      String(e.message ?? e).split('\n').slice(0, 12).join('\n         '));
    return;
  }
  const disc = await discover(proxy.url).catch((e) => ({ status: 0, body: String(e) }));
  const extensions = disc.body?.result?.capabilities?.extensions ?? {};
  if (!checks.ok(disc.status === 200 && EXT in extensions,
    `server/discover through the proxy advertises ${EXT} (the upstream does not)`, disc)) {
    log('the proxy does not serve tasks: nothing else is run');
    return;
  }

  // ------------------------------------------------------------ the FastMCP client
  const client = new TasksClient(proxy.url);
  const connected = await client.next((l) => l.event === 'connected', 20000);
  if (!checks.ok(connected !== undefined, 'the FastMCP client connected through the proxy',
    tail(path.join(workdir(), 'tasks_client.log'), 15))) return;

  const fast = await client.run('fast');
  checks.ok(fast.ok && fast.text === 'Hello, World!', 'fast call (greet): call_tool gets the plain result', fast);
  checks.ok(/did not run as a task/.test(fast.task_error ?? ''),
    'fast call: call_tool_task refuses it, as the proxy answered without a task', fast.task_error);

  const slow = await client.run('slow');
  checks.ok(slow.ok && slow.create?.resultType === 'task' && slow.create?.status === 'working' && slow.created_ms < 1900,
    `slow call (slow_compute 2 s): a task, created before the call ended (${slow.created_ms} ms)`, slow.create ?? slow);
  checks.ok(slow.status === 'working', `slow call: tasks/get says working (${slow.status})`);
  checks.ok(/^computed slow after 2(\.0)?s$/.test(slow.text ?? ''), 'slow call: result() polls to the tool\'s result', slow);

  const mrtr = await client.run('mrtr');
  checks.ok(client.elicitations.includes('Delete a.txt?'),
    'MRTR: the upstream\'s input request reached the elicitation handler', client.elicitations);
  checks.ok(mrtr.ok && /^deleted a\.txt/.test(mrtr.text ?? ''), 'MRTR: the answer went upstream and the task completed', mrtr);

  const compose = await client.run('compose');
  checks.ok(compose.ok && compose.text === 'Hello, Alice!',
    'MRTR before a task (test_tool_with_task): call_tool answers the round-1 input request and gets the result', compose);

  const cancel = await client.run('cancel cancel-me');
  checks.ok(cancel.ok && cancel.status === 'cancelled', `cancel: the task ends cancelled (${cancel.status})`, cancel);
  const cancelled = await waitFor(async () => (await stats()).calls['cancel-me'] === 'cancelled', 5000);
  checks.ok(cancelled, 'cancel: the upstream\'s call was cancelled (its handler saw the response closed)',
    await stats().catch((e) => String(e)));

  // ------------------------------------------------------------ kill -9, restart
  const kill9 = async () => {
    proxy.child.kill('SIGKILL');
    await proxy.child.exited;
  };
  const survivor = await client.run('start survivor 1.5');
  checks.ok(survivor.ok, 'restart: a 1.5 s call became a task', survivor);
  const finished = await waitFor(async () => (await stats()).calls.survivor === 'finished', 10000);
  checks.ok(finished, 'restart: the upstream finished that call');
  await sleep(500); // the proxy logs the upstream's answer as it arrives; leave it ample time
  await kill9();
  proxy = await startTasksProxy();
  const survived = await client.run('result survivor');
  checks.ok(survived.ok && /^computed survivor after 1\.5s$/.test(survived.text ?? ''),
    'restart: the same handle\'s result() returns the result logged before kill -9', survived);

  const doomed = await client.run('start doomed 30');
  checks.ok(doomed.ok, 'restart mid-call: a 30 s call became a task', doomed);
  await kill9();
  const dropped = await waitFor(async () => (await stats()).calls.doomed === 'cancelled', 5000);
  checks.ok(dropped, 'restart mid-call: the upstream cancelled the call when the proxy died');
  proxy = await startTasksProxy();
  const lost = await client.run('result doomed');
  checks.ok(!lost.ok && (lost.error ?? '').includes(RESTARTED),
    'restart mid-call: result() fails with the proxy\'s restart error (the task is failed)', lost);

  // ------------------------------------------------------------ conformance
  const out = path.join(workdir(), 'conformance');
  const score = (list) => {
    const passed = list.filter((c) => c.status === 'SUCCESS').length;
    const failed = list.filter((c) => c.status === 'FAILURE' || c.status === 'WARNING').length;
    const skipped = list.length > 0 && list.every((c) => c.status === 'SKIPPED');
    return { passed, failed, skipped, text: skipped ? 'skipped' : list.length ? `${passed}/${passed + failed}` : 'no results' };
  };
  const rows = [];
  for (const scenario of SCENARIOS) {
    const t = Date.now();
    const [viaProxy, direct] = await Promise.all([['proxy', proxy.url], ['native', native.url]].map(async ([label, url]) => {
      const dir = path.join(out, label, scenario);
      await runConformance(['server', '--url', url, '--scenario', scenario, '-o', dir], {
        js: CONFORMANCE_TASKS_JS, timeoutMs: 60000, logFile: path.join(workdir(), `conformance-${label}-${scenario}.log`),
      });
      return readChecks(dir);
    }));
    const p = score(viaProxy);
    const n = score(direct);
    rows.push(`  ${scenario.padEnd(30)} proxy→unaware ${p.text.padEnd(10)} native ${n.text.padEnd(10)} (${Date.now() - t} ms)`);
    for (const c of viaProxy.filter((c) => c.status === 'FAILURE' || c.status === 'WARNING')) {
      log(`  proxy ${scenario}/${c.id}: ${c.status} ${c.errorMessage ?? ''} ${JSON.stringify(c.details ?? {}).slice(0, 300)}`);
    }
    checks.ok(p.skipped || (p.passed > 0 && p.failed === 0), `conformance ${scenario} through the proxy: ${p.text}`);
    checks.ok(direct.length > 0, `conformance ${scenario} against the native server ran (${n.text})`);
  }
  console.log('  conformance tasks-* (0.2.0-alpha.12), checks passed/total:');
  for (const row of rows) console.log(row);
}, { timeoutMs: 225000 });
