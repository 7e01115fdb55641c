// Scenario a: the official TS SDK client resumes a long-running call through
// the proxy after a "pulled cable", using only its own Last-Event-ID
// reconnect.
//
//   TS Client --> relay --> mcp-resume-proxy --> server-everything
//                                              (http: streamableHttp | stdio: --upstream-command)
//
// usage: node scenarios/a-ts-resume.mjs http|stdio
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  EXIT_NEEDS_FEATURE, everythingStdioCommand, log, proxyHasUpstreamCommand, runScenario, startEverythingHttp, startProxy,
} from '../lib/harness.mjs';
import { Relay } from '../lib/relay.mjs';
import { connectClient, short } from '../lib/tsclient.mjs';

const mode = process.argv[2] ?? 'http';
const DURATION = 4;
const STEPS = 8;
const CUT_AFTER = 3;

if (mode === 'stdio' && !proxyHasUpstreamCommand()) {
  console.log('a-ts-resume stdio: this proxy binary has no --upstream-command flag (yet); not run');
  process.exit(EXIT_NEEDS_FEATURE);
}

await runScenario(`a-ts-resume (${mode}): TS SDK client, cut mid-call, SDK Last-Event-ID resume`, async (checks) => {
  let proxy;
  if (mode === 'http') {
    const everything = await startEverythingHttp();
    log('server-everything (streamableHttp) at', everything.url);
    proxy = await startProxy({ upstream: everything.url });
  } else {
    proxy = await startProxy({ upstreamCommand: everythingStdioCommand() });
  }
  log('proxy at', proxy.url);
  const relay = new Relay(proxy.port, { log });
  await relay.listen();
  log('relay at', relay.url);

  const { client, transport, requests } = await connectClient(relay.url);
  log('connected; session', transport.sessionId, 'protocol', transport.protocolVersion);
  const { tools } = await client.listTools();
  checks.ok(tools.some((t) => t.name === 'trigger-long-running-operation'), 'tools/list through the proxy has trigger-long-running-operation');

  const progress = [];
  const tokens = [];
  let cutAt;
  let tokenAtCut;
  const result = await client.request(
    { method: 'tools/call', params: { name: 'trigger-long-running-operation', arguments: { duration: DURATION, steps: STEPS } } },
    CallToolResultSchema,
    {
      timeout: 60000,
      resetTimeoutOnProgress: true,
      onresumptiontoken: (t) => tokens.push({ t, at: Date.now(), afterCut: cutAt !== undefined }),
      onprogress: (p) => {
        progress.push(p.progress);
        log(`progress ${p.progress}/${p.total}${cutAt ? ' (after the cut)' : ''}`);
        if (p.progress === CUT_AFTER && cutAt === undefined) {
          // Let the SDK see the event id first (it is set before onmessage).
          tokenAtCut = tokens.at(-1)?.t;
          cutAt = Date.now();
          const n = relay.cut();
          checks.ok(n >= 1, `relay cut ${n} live connection(s) after progress ${CUT_AFTER}`);
        }
      },
    },
  );
  const text = result.content?.[0]?.text ?? '';
  log('result', JSON.stringify(result));

  checks.ok(cutAt !== undefined, 'the connection was cut mid-call');
  checks.progressExactlyOnce(progress, STEPS, 'TS client');
  checks.ok(/Long running operation completed/.test(text) && text.includes(`Steps: ${STEPS}`), 'tool result arrived after the resume', text);
  const resumeGets = requests.filter((r) => r.method === 'GET' && r.at >= cutAt && r.lastEventId);
  checks.ok(
    resumeGets.some((r) => r.lastEventId === tokenAtCut && r.status === 200),
    `the SDK resumed with GET Last-Event-ID = the last id it saw before the cut (${short(tokenAtCut)}) and got 200`,
    resumeGets.map((r) => ({ lastEventId: short(r.lastEventId), status: r.status, error: r.error })),
  );
  checks.ok(
    requests.filter((r) => r.method === 'POST' && r.body === 'tools/call').length === 1,
    'the tools/call was POSTed once (no re-send)',
  );
  const ids = tokens.map((x) => x.t);
  checks.ok(new Set(ids).size === ids.length, `no event id delivered twice (${ids.length} ids)`);

  // The session is still usable afterwards.
  const echo = await client.callTool({ name: 'echo', arguments: { message: 'still here' } });
  checks.ok(JSON.stringify(echo).includes('still here'), 'the same session answers echo after the resume');
  await transport.terminateSession().catch((e) => log('terminate failed', e.message));
  await client.close();
  await relay.close();
}, { timeoutMs: 60000 });
