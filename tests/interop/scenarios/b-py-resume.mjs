// Scenario b: the official Python SDK (mcp 2.x) client resumes a
// long-running call through the proxy after a "pulled cable".
//
//   py_client.py (mcp.Client) --> relay --> mcp-resume-proxy --> server-everything
//                                                           (streamableHttp; stdio via --upstream-command)
//
// mode auto: the client first probes `server/discover` (2026-07-28); the
// proxy must pass the upstream's rejection through so that the client falls
// back to `initialize`. mode legacy: initialize directly.
//
// usage: node scenarios/b-py-resume.mjs [UPSTREAM:MODE ...]   UPSTREAM http|stdio, MODE auto|legacy
//        default: http:auto http:legacy stdio:auto (stdio only if the proxy has --upstream-command)
import path from 'node:path';
import readline from 'node:readline';
import {
  INTEROP_DIR, PYTHON, everythingStdioCommand, log, proxyHasUpstreamCommand, runScenario, start, startEverythingHttp, startProxy, stop,
} from '../lib/harness.mjs';
import { Relay } from '../lib/relay.mjs';

const runs = process.argv.length > 2
  ? process.argv.slice(2)
  : ['http:auto', 'http:legacy', ...(proxyHasUpstreamCommand() ? ['stdio:auto'] : [])];
const DURATION = 4;
const STEPS = 8;
const CUT_AFTER = 3;

await runScenario(`b-py-resume (${runs.join(' + ')}): Python SDK mcp.Client, cut mid-call, resume`, async (checks) => {
  const proxies = {};
  for (const run of runs) {
    const [upstream, mode] = run.split(':');
    if (!proxies[upstream]) {
      if (upstream === 'http') {
        const everything = await startEverythingHttp();
        proxies.http = await startProxy({ upstream: everything.url, name: 'proxy-http' });
      } else {
        proxies.stdio = await startProxy({ upstreamCommand: everythingStdioCommand(), name: 'proxy-stdio' });
      }
    }
    await oneMode(checks, mode, upstream, proxies[upstream]);
  }
}, { timeoutMs: 110000 });

async function oneMode(checks, mode, upstream, proxy) {
  const ok = (cond, what, detail) => checks.ok(cond, `[${upstream} ${mode}] ${what}`, detail);
  console.log(`-- mode="${mode}", server-everything over ${upstream}`);
  const relay = new Relay(proxy.port, { log });
  await relay.listen();
  log('proxy', proxy.url, '| relay', relay.url);

  const py = start(`py_client-${upstream}-${mode}`, PYTHON,
    [path.join(INTEROP_DIR, 'scenarios', 'py_client.py'), relay.url, mode, String(DURATION), String(STEPS)],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  const { exited } = py;
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
  checks.progressExactlyOnce(events.filter((e) => e.event === 'progress').map((e) => e.progress), STEPS, `[${upstream} ${mode}] Python client`);
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
    ok(probe && probe.status >= 400 && probe.status < 500, `the probe got a 4xx back (the upstream's; for stdio the proxy's own) (got ${probe?.status})`);
    const init = reqs.findIndex((r) => r.method === 'POST' && r.headers['mcp-protocol-version'] === undefined && !r.headers['mcp-session-id']);
    ok(init > reqs.indexOf(probe), 'then fell back to initialize (a POST without session or protocol header)');
  } else {
    ok(!reqs.some((r) => r.headers['mcp-protocol-version'] === '2026-07-28'), 'mode=legacy sent no 2026-07-28 request');
  }
  await stop(py);
  await relay.close();
}
