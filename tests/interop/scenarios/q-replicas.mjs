// Scenario q: a replicated upstream. Three replicas of the TS SDK resumable
// server (sessions in memory, as in a pod) behind one [[upstream]] `urls`;
// sixteen stock TS SDK clients, each with its own session.
//
//   16 TS Clients --> proxy --+--> replica-0 (resumable-server.mjs)
//                             +--> replica-1
//                             +--> replica-2
//
// Each replica logs every request with the upstream session it names, and
// every session it creates (LOG_REQUESTS=1): from those logs alone, the
// sessions must be spread over the three, and every request naming a session
// must have reached the replica that created it. Then the busiest replica is
// killed (SIGKILL): every client calls again on the session it holds, and each
// of the dead replica's sessions must be created again on a survivor, once,
// with every later request of it on that survivor.
import fs from 'node:fs';
import path from 'node:path';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  INTEROP_DIR, freePort, log, runScenario, sleep, start, startProxy, waitForPort, workdir,
} from '../lib/harness.mjs';
import { connectClient } from '../lib/tsclient.mjs';

const REPLICAS = 3;
const CLIENTS = 16;
const STEPS = 3;

async function startReplica(i) {
  const port = await freePort();
  const child = start(`replica-${i}`, process.execPath, [path.join(INTEROP_DIR, 'lib', 'resumable-server.mjs'), String(port)], {
    env: { LOG_REQUESTS: '1' },
  });
  await waitForPort(port, child);
  return { i, child, url: `http://127.0.0.1:${port}/mcp` };
}

/** What a replica's own log says reached it. */
function replicaLog(replica) {
  const lines = fs.readFileSync(replica.child.logFile, 'utf8').split('\n');
  const created = new Set();
  const requests = [];
  for (const line of lines) {
    const made = /^session created (\S+)/.exec(line);
    if (made) created.add(made[1]);
    const req = /^request (\S+) session=(\S+)(?: rpc=(\S+))?/.exec(line);
    if (req) requests.push({ method: req[1], session: req[2], rpc: req[3] });
  }
  return { created, requests };
}

/** Requests at a replica naming a session it did not create. */
const strays = (seen) => seen.requests.filter((r) => r.session !== '-' && !seen.created.has(r.session));

async function longOp(c) {
  const progress = [];
  const result = await c.client.request(
    { method: 'tools/call', params: { name: 'long-op', arguments: { steps: STEPS, intervalMs: 20 } } },
    CallToolResultSchema,
    { timeout: 30000, onprogress: (p) => progress.push(p.progress) },
  );
  return { text: result.content?.[0]?.text ?? '', progress };
}

async function everyClientCalls(checks, clients, what) {
  const answers = await Promise.allSettled(clients.map(longOp));
  const done = answers.filter((a) => a.status === 'fulfilled' && a.value.text === `long-op done: ${STEPS} steps`);
  const complete = done.filter((a) => a.value.progress.join(',') === '1,2,3');
  checks.ok(done.length === clients.length, `${what}: ${done.length}/${clients.length} calls got their result`,
    answers.filter((a) => a.status === 'rejected').map((a) => String(a.reason?.message ?? a.reason)).slice(0, 4));
  checks.ok(complete.length === clients.length, `${what}: every call's progress 1,2,3 arrived in order`);
}

function writeConfig(replicas) {
  const file = path.join(workdir(), 'proxy.toml');
  fs.writeFileSync(file, [
    '[[upstream]]',
    `urls = [${replicas.map((r) => JSON.stringify(r.url)).join(', ')}]`,
    '',
  ].join('\n'));
  return file;
}

await runScenario('q-replicas: 16 TS SDK sessions over three TS SDK server replicas, one killed', async (checks) => {
  const replicas = [];
  for (let i = 0; i < REPLICAS; i++) replicas.push(await startReplica(i));
  const proxy = await startProxy({ extraArgs: ['--config', writeConfig(replicas)] });
  log('replicas at', replicas.map((r) => r.url).join(' '), '; proxy at', proxy.url);

  const clients = [];
  for (let i = 0; i < CLIENTS; i++) clients.push(await connectClient(proxy.url, { quiet: true, name: `client-${i}` }));
  const held = clients.map((c) => c.transport.sessionId);
  checks.ok(new Set(held).size === CLIENTS && held.every(Boolean), `${CLIENTS} clients, each with a session of its own`);
  await everyClientCalls(checks, clients, 'before the kill');

  const before = replicas.map(replicaLog);
  const counts = before.map((s) => s.created.size);
  checks.ok(counts.reduce((a, b) => a + b, 0) === CLIENTS, `the replicas created ${CLIENTS} sessions in all, none twice (${counts.join('/')})`);
  checks.ok(counts.every((n) => n >= 4), `spread over the three replicas (${counts.join('/')})`);
  before.forEach((seen, i) => checks.ok(strays(seen).length === 0,
    `replica-${i}: each of its ${seen.requests.length} requests naming a session named one it created`, strays(seen).slice(0, 3)));

  const victim = replicas[counts.indexOf(Math.max(...counts))];
  const lost = counts[victim.i];
  victim.child.kill('SIGKILL');
  await victim.child.exited;
  log(`killed replica-${victim.i} with ${lost} sessions`);
  const survivors = replicas.filter((r) => r !== victim);
  const lengths = survivors.map((r) => replicaLog(r).requests.length);

  await everyClientCalls(checks, clients, 'after the kill');
  checks.ok(clients.every((c, k) => c.transport.sessionId === held[k]), 'every client still holds the session it had');
  const after = survivors.map(replicaLog);
  const grown = after.reduce((n, seen, k) => n + seen.created.size - counts[survivors[k].i], 0);
  checks.ok(grown === lost, `the killed replica's ${lost} sessions were created again on the survivors, once each (${grown})`);
  after.forEach((seen, k) => {
    const since = seen.requests.slice(lengths[k]);
    checks.ok(since.length > 0 && strays(seen).length === 0,
      `replica-${survivors[k].i}: its ${since.length} requests since the kill each named a session it created`, strays(seen).slice(0, 3));
  });
  // The proxy writes its log from a thread of its own: give it a moment.
  const movedLines = () => fs.readFileSync(proxy.child.logFile, 'utf8').split('\n')
    .filter((l) => l.includes('re-initialized it on another')).length;
  for (let waited = 0; movedLines() < lost && waited < 5000; waited += 100) await sleep(100);
  const moved = movedLines();
  checks.ok(moved === lost, `the proxy logged ${moved} sessions moved off the dead replica`);

  const late = await connectClient(proxy.url, { quiet: true, name: 'late' });
  const answer = await longOp(late);
  checks.ok(answer.text === `long-op done: ${STEPS} steps`, 'a new session after the kill works');
  await Promise.all([...clients, late].map((c) => c.client.close().catch(() => {})));
}, { timeoutMs: 100000 });
