// Scenario a: the official TS SDK client resumes a long-running call through
// the proxy after a "pulled cable", using only its own Last-Event-ID
// reconnect.
//
// Two concurrent calls on one session; the relay is cut twice during them.
//
//   TS Client --> relay --> mcp-resume-proxy --> server-everything
//                                              (http: streamableHttp | stdio: --upstream-command)
//
// usage: node scenarios/a-ts-resume.mjs http|stdio
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  EXIT_NEEDS_FEATURE, descendantProcesses, sleep, log, proxyHasUpstreamCommand, runScenario, startProxyForEverything,
} from '../lib/harness.mjs';
import { Relay } from '../lib/relay.mjs';
import { connectClient, short } from '../lib/tsclient.mjs';

const mode = process.argv[2] ?? 'http';
const DURATION = 4;
const STEPS = 8;
const CUTS_AFTER = [3, 6]; // the second cut hits the resumed stream
const B_DURATION = 3.5; // a concurrent second call
const B_STEPS = 5;

if (mode === 'stdio' && !proxyHasUpstreamCommand()) {
  console.log('a-ts-resume stdio: this proxy binary has no --upstream-command flag (yet); not run');
  process.exit(EXIT_NEEDS_FEATURE);
}

await runScenario(`a-ts-resume (${mode}): TS SDK client, cut mid-call, SDK Last-Event-ID resume`, async (checks) => {
  const proxy = await startProxyForEverything(mode);
  log('proxy at', proxy.url);
  const relay = new Relay(proxy.port, { log });
  await relay.listen();
  log('relay at', relay.url);

  const { client, transport, requests } = await connectClient(relay.url);
  log('connected; session', transport.sessionId, 'protocol', transport.protocolVersion);
  const { tools } = await client.listTools();
  checks.ok(tools.some((t) => t.name === 'trigger-long-running-operation'), 'tools/list through the proxy has trigger-long-running-operation');

  // Call A is cut twice; call B runs concurrently on the same session, on its
  // own SSE stream, through the same cuts: each stream must resume on its own
  // (server-everything's event store alone would mix them, runbook G3).
  const progress = [];
  const tokens = [];
  const cuts = []; // {after, at, token}
  const progressB = [];
  const tokensB = [];
  const callA = client.request(
    { method: 'tools/call', params: { name: 'trigger-long-running-operation', arguments: { duration: DURATION, steps: STEPS } } },
    CallToolResultSchema,
    {
      timeout: 60000,
      resetTimeoutOnProgress: true,
      onresumptiontoken: (t) => tokens.push({ t, at: Date.now() }),
      onprogress: (p) => {
        progress.push(p.progress);
        log(`A progress ${p.progress}/${p.total}${cuts.length ? ` (after cut ${cuts.length})` : ''}`);
        if (CUTS_AFTER.includes(p.progress) && !cuts.some((c) => c.after === p.progress)) {
          // The SDK reported this event's id before the message (onresumptiontoken first).
          cuts.push({ after: p.progress, at: Date.now(), token: tokens.at(-1)?.t });
          const n = relay.cut();
          checks.ok(n >= 1, `relay cut ${n} live connection(s) after A's progress ${p.progress}`);
        }
      },
    },
  );
  const callB = client.request(
    { method: 'tools/call', params: { name: 'trigger-long-running-operation', arguments: { duration: B_DURATION, steps: B_STEPS } } },
    CallToolResultSchema,
    {
      timeout: 60000,
      resetTimeoutOnProgress: true,
      onresumptiontoken: (t) => tokensB.push(t),
      onprogress: (p) => {
        progressB.push(p.progress);
        log(`B progress ${p.progress}/${p.total}`);
      },
    },
  );
  const [result, resultB] = await Promise.all([callA, callB]);
  const text = result.content?.[0]?.text ?? '';
  const textB = resultB.content?.[0]?.text ?? '';
  log('A result', JSON.stringify(result));
  log('B result', JSON.stringify(resultB));

  checks.ok(cuts.length === CUTS_AFTER.length, `the connections were cut mid-call ${cuts.length} times`);
  checks.progressExactlyOnce(progress, STEPS, 'call A');
  checks.ok(/Long running operation completed/.test(text) && text.includes(`Steps: ${STEPS}`), 'call A: its result arrived after the resumes', text);
  checks.progressExactlyOnce(progressB, B_STEPS, 'call B (concurrent, own stream)');
  checks.ok(/Long running operation completed/.test(textB) && textB.includes(`Steps: ${B_STEPS}`), 'call B: its own result arrived', textB);
  checks.ok(!tokensB.some((t) => tokens.some((x) => x.t === t)), 'calls A and B never saw the same event id (streams not mixed)');
  for (const [i, cut] of cuts.entries()) {
    const resumeGets = requests.filter((r) => r.method === 'GET' && r.at >= cut.at && r.lastEventId && (!cuts[i + 1] || r.at < cuts[i + 1].at));
    checks.ok(
      resumeGets.some((r) => r.lastEventId === cut.token && r.status === 200),
      `cut ${i + 1}: the SDK resumed call A with GET Last-Event-ID = the last id it saw before the cut (${short(cut.token)}) and got 200`,
      resumeGets.map((r) => ({ lastEventId: short(r.lastEventId), status: r.status, error: r.error })),
    );
  }
  checks.ok(
    requests.filter((r) => r.method === 'POST' && r.body === 'tools/call').length === 2,
    'each tools/call was POSTed once (no re-send)',
  );
  const ids = tokens.map((x) => x.t);
  checks.ok(new Set(ids).size === ids.length, `no event id delivered twice (${ids.length} ids)`);

  // The session is still usable afterwards.
  const echo = await client.callTool({ name: 'echo', arguments: { message: 'still here' } });
  checks.ok(JSON.stringify(echo).includes('still here'), 'the same session answers echo after the resume');
  const stdioChildren = () => descendantProcesses(proxy.child.pid).filter((p) => p.cmd.includes('server-everything'));
  if (mode === 'stdio') {
    checks.ok(stdioChildren().length === 1, `the proxy runs one stdio server-everything child for this session (found ${stdioChildren().length})`);
  }
  await transport.terminateSession().catch((e) => log('terminate failed', e.message));
  await client.close();
  if (mode === 'stdio') {
    const deadline = Date.now() + 5000;
    while (stdioChildren().length > 0 && Date.now() < deadline) await sleep(100);
    checks.ok(stdioChildren().length === 0, 'after DELETE the session\'s stdio child has exited');
  }
  await relay.close();
}, { timeoutMs: 60000 });
