// Scenario b: the official Python SDK (mcp 2.x) client resumes a
// long-running call through the proxy after a "pulled cable".
//
//   py_client.py (mcp.Client) --> relay --> mcp-resume-proxy --> server-everything (streamableHttp)
//
// mode auto: the client first probes `server/discover` (2026-07-28); the
// proxy must pass the upstream's rejection through so that the client falls
// back to `initialize`. mode legacy: initialize directly.
//
// usage: node scenarios/b-py-resume.mjs [auto] [legacy]   (default: both, one after the other)
import { spawn } from 'node:child_process';
import path from 'node:path';
import readline from 'node:readline';
import {
  INTEROP_DIR, PYTHON, log, runScenario, startEverythingHttp, startProxy, stop,
} from '../lib/harness.mjs';
import { Relay } from '../lib/relay.mjs';

const modes = process.argv.length > 2 ? process.argv.slice(2) : ['auto', 'legacy'];
const DURATION = 4;
const STEPS = 8;
const CUT_AFTER = 3;

await runScenario(`b-py-resume (${modes.join(' + ')}): Python SDK mcp.Client, cut mid-call, resume`, async (checks) => {
  const everything = await startEverythingHttp();
  const proxy = await startProxy({ upstream: everything.url });
  for (const mode of modes) await oneMode(checks, mode, everything, proxy);
}, { timeoutMs: 90000 });

async function oneMode(checks, mode, everything, proxy) {
  const ok = (cond, what, detail) => checks.ok(cond, `[${mode}] ${what}`, detail);
  console.log(`-- mode="${mode}"`);
  const relay = new Relay(proxy.port, { log });
  await relay.listen();
  log('server-everything', everything.url, '| proxy', proxy.url, '| relay', relay.url);

  const py = spawn(PYTHON, [path.join(INTEROP_DIR, 'scenarios', 'py_client.py'), relay.url, mode, String(DURATION), String(STEPS)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  py.label = 'py_client';
  const exited = new Promise((resolve) => py.on('exit', (code, signal) => resolve({ code, signal })));
  let stderr = '';
  py.stderr.on('data', (d) => { stderr += d; });
  const events = [];
  let cutAt;
  for await (const line of readline.createInterface({ input: py.stdout })) {
    let ev;
    try {
      ev = JSON.parse(line);
    } catch {
      log('py:', line);
      continue;
    }
    events.push(ev);
    log('py', JSON.stringify(ev).slice(0, 200));
    if (ev.event === 'progress' && ev.progress === CUT_AFTER && cutAt === undefined) {
      cutAt = Date.now();
      const n = relay.cut();
      ok(n >= 1, `relay cut ${n} live connection(s) after progress ${CUT_AFTER}`);
    }
  }
  const { code } = await exited;
  if (code !== 0) log('py_client stderr:\n' + stderr.split('\n').slice(-30).join('\n'));
  ok(code === 0, `python client exited 0 (got ${code})`);

  const connected = events.find((e) => e.event === 'connected');
  ok(connected && connected.protocol !== '2026-07-28', `connected through the proxy with a handshake-era protocol (${connected?.protocol})`);
  ok(cutAt !== undefined, 'the connection was cut mid-call');
  checks.progressExactlyOnce(events.filter((e) => e.event === 'progress').map((e) => e.progress), STEPS, `[${mode}] Python client`);
  const result = events.find((e) => e.event === 'result');
  const text = result?.result?.content?.[0]?.text ?? '';
  ok(/Long running operation completed/.test(text), 'tool result arrived after the resume', text || result);
  ok(JSON.stringify(events.find((e) => e.event === 'echo') ?? {}).includes('still here'), 'the same session answers echo after the resume');

  const reqs = relay.requests;
  const resumes = reqs.filter((r) => r.method === 'GET' && r.at >= (cutAt ?? Infinity) && r.headers['last-event-id']);
  ok(resumes.some((r) => r.status === 200), 'the client resumed with GET Last-Event-ID and got 200',
    resumes.map((r) => ({ status: r.status })));
  const posts = reqs.filter((r) => r.method === 'POST').map((r) => `${r.headers['mcp-method'] ?? '?'}:${r.status}`);
  log('POSTs seen by the relay (mcp-method:status):', posts.join(' '));
  if (mode === 'auto') {
    const probe = reqs.find((r) => r.method === 'POST' && r.headers['mcp-protocol-version'] === '2026-07-28');
    ok(probe !== undefined, 'mode=auto sent the server/discover probe (mcp-protocol-version 2026-07-28) through the proxy');
    ok(probe && probe.status >= 400 && probe.status < 500, `the probe got the upstream's 4xx back (got ${probe?.status})`);
    const init = reqs.findIndex((r) => r.method === 'POST' && r.headers['mcp-protocol-version'] === undefined && !r.headers['mcp-session-id']);
    ok(init > reqs.indexOf(probe), 'then fell back to initialize (a POST without session or protocol header)');
  } else {
    ok(!reqs.some((r) => r.headers['mcp-protocol-version'] === '2026-07-28'), 'mode=legacy sent no 2026-07-28 request');
  }
  await stop(py);
  await relay.close();
}
