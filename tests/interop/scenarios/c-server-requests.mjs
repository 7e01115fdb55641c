// Scenario c: server-to-client requests through the proxy. A TS SDK client
// that declares sampling + elicitation answers server-everything's
// `sampling/createMessage` and `elicitation/create` (sent on the tools/call's
// SSE stream); the answers go back as separate POSTs. Then the same with the
// connection cut after the server's request arrived and before the client
// answered: the answer still reaches the server and the client still gets
// the tool result (via its Last-Event-ID resume), and the server's request is
// not delivered twice. Also `roots/list`, which server-everything sends on
// the standalone GET stream right after `notifications/initialized`.
//
//   TS Client --> relay --> mcp-resume-proxy --> server-everything (streamableHttp, then stdio)
//
// usage: node scenarios/c-server-requests.mjs [http] [stdio]   (default: both; stdio only if the
//        proxy has --upstream-command)
import { CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  log, proxyHasUpstreamCommand, runScenario, sleep, startProxyForEverything,
} from '../lib/harness.mjs';
import { Relay } from '../lib/relay.mjs';
import { connectClient } from '../lib/tsclient.mjs';

const kinds = process.argv.length > 2 ? process.argv.slice(2) : ['http', ...(proxyHasUpstreamCommand() ? ['stdio'] : [])];

await runScenario(`c-server-requests (${kinds.join(' + ')}): sampling + elicitation round trips through the proxy, with and without a cut`, async (checks) => {
  for (const kind of kinds) await oneUpstream(checks, kind);
}, { timeoutMs: 60000 });

async function oneUpstream(allChecks, kind) {
  console.log(`-- upstream: server-everything over ${kind}`);
  const checks = { ok: (c, w, d) => allChecks.ok(c, `[${kind}] ${w}`, d) };
  const proxy = await startProxyForEverything(kind, { name: `proxy-${kind}` });
  const relay = new Relay(proxy.port, { log });
  await relay.listen();
  log('proxy', proxy.url, '| relay', relay.url);

  const rootsAsked = [];
  const { client, requests } = await connectClient(relay.url, {
    capabilities: { sampling: {}, elicitation: { form: {} }, roots: { listChanged: true } },
    beforeConnect: (c) => c.setRequestHandler(ListRootsRequestSchema, async () => {
      rootsAsked.push(Date.now());
      log('server asked roots/list (standalone stream)');
      return { roots: [{ uri: 'file:///tmp/interop-root', name: `interop-root-${kind}` }] };
    }),
  });
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  checks.ok(names.includes('trigger-sampling-request') && names.includes('trigger-elicitation-request'),
    'server-everything registered the sampling and elicitation tools (it saw the client capabilities through the proxy)', names);

  // Behaviour of the handlers for the current case.
  let cutBeforeAnswer = false;
  let nonce = '';
  const seen = { sampling: [], elicitation: [] };
  let cutAt = 0;
  const maybeCut = async (kind) => {
    if (!cutBeforeAnswer) return;
    cutAt = Date.now();
    const n = relay.cut();
    log(`cut ${n} connection(s) after ${kind} request arrived, before answering`);
    await sleep(300);
  };
  client.setRequestHandler(CreateMessageRequestSchema, async (req) => {
    seen.sampling.push(req.params.messages?.[0]?.content?.text);
    log('server asked sampling/createMessage:', JSON.stringify(req.params.messages?.[0]?.content));
    await maybeCut('sampling');
    return { model: 'interop-model', role: 'assistant', stopReason: 'endTurn', content: { type: 'text', text: `sampled-${nonce}` } };
  });
  client.setRequestHandler(ElicitRequestSchema, async (req) => {
    seen.elicitation.push(req.params.message);
    log('server asked elicitation/create:', req.params.message);
    await maybeCut('elicitation');
    return { action: 'accept', content: { name: `elicited-${nonce}`, check: true, integer: 7 } };
  });

  const cases = [
    { kind: 'sampling', cut: false },
    { kind: 'elicitation', cut: false },
    { kind: 'sampling', cut: true },
    { kind: 'elicitation', cut: true },
  ];
  for (const c of cases) {
    cutBeforeAnswer = c.cut;
    nonce = `${c.kind}-${c.cut ? 'cut' : 'plain'}-${Math.random().toString(36).slice(2, 8)}`;
    const before = seen[c.kind].length;
    const cutsBefore = relay.cuts;
    const t = Date.now();
    const res = c.kind === 'sampling'
      ? await client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: `hello ${nonce}`, maxTokens: 20 } }, undefined, { timeout: 30000 })
      : await client.callTool({ name: 'trigger-elicitation-request', arguments: {} }, undefined, { timeout: 30000 });
    const text = (res.content ?? []).map((x) => x.text).join('\n');
    const label = `${c.kind}${c.cut ? ' with a cut before the answer' : ''}`;
    log(`${label}: result after ${Date.now() - t} ms:`, text.replace(/\s+/g, ' ').slice(0, 160));
    checks.ok(seen[c.kind].length === before + 1, `${label}: the server's request reached the client exactly once`,
      `handler ran ${seen[c.kind].length - before} times`);
    if (c.kind === 'sampling') {
      checks.ok(seen.sampling.at(-1)?.includes(`hello ${nonce}`), `${label}: the request carried the tool's prompt`);
    }
    checks.ok(text.includes(`${c.kind === 'sampling' ? 'sampled' : 'elicited'}-${nonce}`),
      `${label}: the tool result contains the client's answer`, text.slice(0, 300));
    if (c.cut) {
      checks.ok(relay.cuts === cutsBefore + 1, `${label}: the connection was cut`);
      // Only requests sent after the cut: the cut also kills whatever else was
      // in flight then (e.g. the client's answer to roots/list), which the
      // SDK does not retry and which is not this case's answer.
      const after = requests.filter((r) => r.at >= cutAt);
      const answerPost = after.find((r) => r.method === 'POST' && r.body?.startsWith('result#'));
      checks.ok(answerPost?.status === 202, `${label}: the answer POST (sent after the cut) got 202`, answerPost);
      // Several GETs reconnect after a cut (this call's stream and the
      // standalone one); the call's resume has completed by now.
      const resumed = after.filter((r) => r.method === 'GET' && r.lastEventId);
      checks.ok(resumed.some((r) => r.status === 200), `${label}: the client resumed with GET Last-Event-ID -> 200`, resumed);
    }
  }
  // roots/list came on the standalone GET stream ~350 ms after initialized.
  checks.ok(rootsAsked.length === 1, `roots/list (server-initiated, standalone stream) reached the client exactly once (got ${rootsAsked.length})`);
  const roots = await client.callTool({ name: 'get-roots-list', arguments: {} });
  checks.ok(JSON.stringify(roots).includes(`interop-root-${kind}`), 'get-roots-list shows the roots the client answered');
  await client.close();
  await relay.close();
}
