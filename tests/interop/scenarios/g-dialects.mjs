// Scenario g: the stock official TS SDK client with the proxy's dialects
// negotiated — resumableRequests (seed 002) and streams (seed 003) — in front
// of server-everything.
//
//   1. The client declares capabilities.experimental {resumableRequests, streams};
//      the initialize result advertises both.
//   2. A long tools/call (progress via onprogress) runs to its end: the
//      resumePolicy and stream/create notifications open its stream (before
//      any progress and the result, policy.requestId = the call's JSON-RPC
//      id), stream/end follows the result; the SDK hands all three to the
//      application's zod-typed notification handlers.
//   3. requests/getStatus and stream/poll (and stream/poll/all), sent with the
//      SDK's own client.request(): "completed".
//   4. A second long call is cut mid-call (relay paused, so the SDK's own
//      Last-Event-ID reconnects go nowhere); a raw POST requests/resume with
//      the original id and the resumeToken, straight to the proxy on the same
//      session, gets the rest (original event ids, no duplicate progress)
//      and the tool's result under the original id.
//
//   TS Client --> relay --> mcp-resume-proxy --> server-everything
//   raw fetch ------------> (same session)       (http: streamableHttp | stdio: --upstream-command)
//
// usage: node scenarios/g-dialects.mjs http|stdio
import { z } from 'zod';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  EXIT_NEEDS_FEATURE, log, proxyHasUpstreamCommand, runScenario, sleep, startProxyForEverything,
} from '../lib/harness.mjs';
import { message, sseEvents } from '../lib/rawmcp.mjs';
import { Relay } from '../lib/relay.mjs';
import { connectClient, short } from '../lib/tsclient.mjs';

const mode = process.argv[2] ?? 'http';
const DURATION = 2; // call 1: runs to its end
const STEPS = 4;
const CUT_DURATION = 4; // call 2: cut after progress CUT_AFTER, resumed raw
const CUT_STEPS = 8;
const CUT_AFTER = 2;
const TOOL = 'trigger-long-running-operation';

const POLICY = 'notifications/requests/resumePolicy';
const CREATE = 'notifications/stream/create';
const END = 'notifications/stream/end';

if (mode === 'stdio' && !proxyHasUpstreamCommand()) {
  console.log('g-dialects stdio: this proxy binary has no --upstream-command flag (yet); not run');
  process.exit(EXIT_NEEDS_FEATURE);
}

// What the seeds say the proxy sends, as the application would declare it.
const Id = z.union([z.string(), z.number()]);
const ResumePolicyNotification = z.object({
  method: z.literal(POLICY),
  params: z.object({ requestId: Id, resumeToken: z.string().min(1), minWait: z.number(), maxWait: z.number() }),
});
const StreamCreateNotification = z.object({
  method: z.literal(CREATE),
  params: z.object({ stream: z.object({ streamId: z.string().min(1), resumeInterval: z.object({ min: z.number(), max: z.number() }) }) }),
});
const StreamEndNotification = z.object({
  method: z.literal(END),
  params: z.object({ streamId: z.string().min(1) }),
});
const GetStatusResult = z.object({
  requestId: Id,
  status: z.enum(['processing', 'completed', 'failed']),
  hasPendingMessage: z.boolean(),
  hasInputRequest: z.boolean(),
});
const PollResult = z.object({
  streamId: z.string(),
  status: z.enum(['live', 'completed']),
  pendingMessages: z.boolean(),
  hasRequest: z.boolean(),
  hasError: z.boolean(),
});
const PollAllResult = z.object({ statuses: z.array(PollResult), nextCursor: z.string().optional() });

/** Resolves when cond() holds, polling; false after timeoutMs. */
async function waitFor(cond, timeoutMs, stepMs = 25) {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) return false;
    await sleep(stepMs);
  }
  return true;
}

const describe = (m) => (m.method === 'notifications/progress' ? `progress ${m.params.progress}`
  : m.method ? m.method : m.result !== undefined ? `result#${m.id}` : m.error ? `error#${m.id} ${JSON.stringify(m.error)}` : JSON.stringify(m));

await runScenario(`g-dialects (${mode}): TS SDK client with resumableRequests + streams negotiated`, async (checks) => {
  const proxy = await startProxyForEverything(mode);
  log('proxy at', proxy.url);
  const relay = new Relay(proxy.port, { log });
  await relay.listen();
  log('relay at', relay.url);

  // What the SDK hands to the application's handlers.
  const got = { policy: [], create: [], end: [], other: [] };
  const { client, transport, errors } = await connectClient(relay.url, {
    capabilities: { experimental: { resumableRequests: {}, streams: {} } },
    beforeConnect: (c) => {
      c.setNotificationHandler(ResumePolicyNotification, (n) => { got.policy.push(n.params); });
      c.setNotificationHandler(StreamCreateNotification, (n) => { got.create.push(n.params); });
      c.setNotificationHandler(StreamEndNotification, (n) => { got.end.push(n.params); });
      c.fallbackNotificationHandler = async (n) => { got.other.push(n.method); };
    },
  });
  log('connected; session', transport.sessionId, 'protocol', transport.protocolVersion);

  // A tap on the transport (after connect, which installs the SDK's own
  // handlers): every message in wire order, and each one's SSE event id and
  // call when it came on a call's stream (the SDK reports an event's id via
  // onresumptiontoken synchronously just before handing the message over).
  const wire = []; // {dir, m, tag?: {call, eventId}}
  let tagNext;
  const onmessage = transport.onmessage;
  transport.onmessage = (m, extra) => {
    wire.push({ dir: 'in', m, tag: tagNext });
    tagNext = undefined;
    onmessage?.call(transport, m, extra);
  };
  const send = transport.send.bind(transport);
  transport.send = (m, opts) => {
    wire.push({ dir: 'out', m });
    return send(m, opts);
  };
  const tagger = (call, tokens) => (eventId) => {
    tokens.push(eventId);
    tagNext = { call, eventId };
    queueMicrotask(() => { tagNext = undefined; }); // a priming event (id, no data) tags nothing
  };
  const sentId = (from) => wire.slice(from).find((w) => w.dir === 'out' && w.m.method === 'tools/call')?.m.id;

  // ---- 1. negotiation
  const caps = client.getServerCapabilities() ?? {};
  log('server capabilities', JSON.stringify(caps));
  checks.ok(caps.experimental?.resumableRequests !== undefined, 'initialize result advertises experimental.resumableRequests', caps.experimental);
  checks.ok(caps.experimental?.streams !== undefined, 'initialize result advertises experimental.streams', caps.experimental);
  const { tools } = await client.listTools();
  checks.ok(tools.some((t) => t.name === TOOL), `tools/list through the proxy has ${TOOL}`);

  // ---- 2. a long call to its end
  const progress1 = [];
  const tokens1 = [];
  const mark1 = wire.length;
  const result1 = await client.request(
    { method: 'tools/call', params: { name: TOOL, arguments: { duration: DURATION, steps: STEPS } } },
    CallToolResultSchema,
    {
      timeout: 30000,
      resetTimeoutOnProgress: true,
      onresumptiontoken: tagger(1, tokens1),
      onprogress: (p) => { progress1.push(p.progress); log(`call 1 progress ${p.progress}/${p.total}`); },
    },
  );
  const id1 = sentId(mark1);
  const text1 = result1.content?.[0]?.text ?? '';
  log(`call 1 (JSON-RPC id ${id1}) result`, JSON.stringify(result1));
  checks.ok(/Long running operation completed/.test(text1) && text1.includes(`Steps: ${STEPS}`), 'call 1: the tool result arrived normally', text1);
  checks.progressExactlyOnce(progress1, STEPS, 'call 1');

  const on1 = () => wire.map((w, i) => ({ ...w, i })).filter((w) => w.tag?.call === 1);
  const stream1 = on1();
  log('call 1 stream as the SDK got it:', stream1.map((w) => `${describe(w.m)} [${short(w.tag.eventId)}]`).join(' | '));
  const policyW = stream1.find((w) => w.m.method === POLICY);
  const createW = stream1.find((w) => w.m.method === CREATE);
  const resultW = stream1.find((w) => w.m.id === id1 && w.m.result !== undefined);
  const firstProgressW = stream1.find((w) => w.m.method === 'notifications/progress');
  checks.ok(policyW && createW, `call 1: resumePolicy and stream/create arrived on the call's stream`, stream1.map((w) => describe(w.m)));
  checks.ok(
    stream1.length >= 2 && new Set([stream1[0].m.method, stream1[1].m.method]).size === 2
      && [POLICY, CREATE].includes(stream1[0].m.method) && [POLICY, CREATE].includes(stream1[1].m.method),
    'call 1: the first two messages of its stream are the resumePolicy and stream/create',
    stream1.slice(0, 2).map((w) => describe(w.m)),
  );
  checks.ok(policyW && createW && resultW && firstProgressW && Math.max(policyW.i, createW.i) < Math.min(resultW.i, firstProgressW.i),
    'call 1: both arrived before any progress and before the result');
  checks.ok(policyW?.m.params.requestId === id1, `call 1: resumePolicy.requestId is the call's JSON-RPC id (${id1})`, policyW?.m.params);
  const streamId1 = createW?.m.params.stream.streamId;
  // stream/end follows the result on the same stream (the SDK keeps reading
  // after the result). It may come without an SSE id (it is not a log entry),
  // so it is found by the streamId it names, not by the tag.
  const findEnd = () => wire.map((w, i) => ({ ...w, i })).find((w) => w.dir === 'in' && w.m.method === END && w.m.params?.streamId === streamId1);
  await waitFor(() => findEnd(), 5000);
  const endW = findEnd();
  log(`call 1: stream/end ${endW ? `at wire #${endW.i} (result at #${resultW?.i}), ${endW.tag ? `event id ${short(endW.tag.eventId)}` : 'without an SSE event id'}` : 'not seen'}`);
  checks.ok(endW && resultW && endW.i > resultW.i, 'call 1: stream/end naming the stream stream/create announced arrived after the result',
    wire.filter((w) => w.dir === 'in').map((w) => describe(w.m)));
  const token1 = policyW?.m.params.resumeToken;
  // What the application's handlers received (the SDK validated them with our zod schemas).
  checks.ok(got.policy.some((p) => p.requestId === id1 && p.resumeToken === token1), 'call 1: the SDK handed the resumePolicy to its setNotificationHandler handler', got.policy);
  checks.ok(got.create.some((p) => p.stream.streamId === streamId1), 'call 1: the SDK handed stream/create to its handler', got.create);
  checks.ok(got.end.some((p) => p.streamId === streamId1), 'call 1: the SDK handed stream/end to its handler', got.end);
  const ids1 = stream1.map((w) => w.tag.eventId);
  checks.ok(new Set(ids1).size === ids1.length, `call 1: every message of its stream has its own event id (${ids1.length})`);

  // ---- 3. the dialects' own methods, sent with the SDK's client.request()
  const status1 = await client.request({ method: 'requests/getStatus', params: { requestId: id1, resumeToken: token1 } }, GetStatusResult, { timeout: 10000 });
  log('requests/getStatus ->', JSON.stringify(status1));
  checks.ok(status1.status === 'completed' && status1.requestId === id1, 'requests/getStatus (SDK client.request) after the call: completed, same requestId', status1);
  const poll1 = await client.request({ method: 'stream/poll', params: { streamId: streamId1 } }, PollResult, { timeout: 10000 });
  log('stream/poll ->', JSON.stringify(poll1));
  checks.ok(poll1.status === 'completed' && poll1.streamId === streamId1, 'stream/poll (SDK client.request) after the call: completed', poll1);
  const all = await client.request({ method: 'stream/poll/all', params: {} }, PollAllResult, { timeout: 10000 });
  log('stream/poll/all ->', JSON.stringify(all));
  checks.ok(all.statuses.some((s) => s.streamId === streamId1 && s.status === 'completed'), 'stream/poll/all lists call 1\'s stream as completed', all);

  // ---- 4. a second long call, cut mid-call, resumed with a raw requests/resume
  const progress2 = [];
  const tokens2 = [];
  const mark2 = wire.length;
  let cutAt = 0;
  const on2 = () => wire.filter((w) => w.tag?.call === 2);
  const call2 = client.request(
    { method: 'tools/call', params: { name: TOOL, arguments: { duration: CUT_DURATION, steps: CUT_STEPS } } },
    CallToolResultSchema,
    {
      timeout: 60000,
      resetTimeoutOnProgress: true,
      onresumptiontoken: tagger(2, tokens2),
      onprogress: (p) => {
        progress2.push(p.progress);
        log(`call 2 progress ${p.progress}/${p.total}`);
        if (p.progress === CUT_AFTER && !cutAt && on2().some((w) => w.m.method === POLICY)) {
          // Paused first: the SDK's own Last-Event-ID reconnects are refused, so
          // only the raw requests/resume below can bring the rest.
          relay.paused = true;
          cutAt = Date.now();
          const n = relay.cut();
          checks.ok(n >= 1, `relay cut ${n} live connection(s) after call 2's progress ${p.progress} (the policy had arrived)`);
        }
      },
    },
  );
  const call2Outcome = call2.then((r) => ({ result: r }), (e) => ({ error: String(e?.message ?? e) }));
  const id2 = sentId(mark2);
  checks.ok(await waitFor(() => cutAt > 0, 15000), 'call 2 was cut mid-call');
  const before = on2();
  const policy2 = before.find((w) => w.m.method === POLICY)?.m.params;
  log(`call 2 (JSON-RPC id ${id2}) before the cut:`, before.map((w) => `${describe(w.m)} [${short(w.tag.eventId)}]`).join(' | '));
  checks.ok(policy2?.requestId === id2, `call 2: resumePolicy.requestId is the call's JSON-RPC id (${id2})`, policy2);
  checks.ok(!before.some((w) => w.m.id === id2), 'call 2: the SDK had not got the result before the cut');

  const headers = {
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
    'mcp-session-id': transport.sessionId,
    'mcp-protocol-version': transport.protocolVersion,
  };
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), 20000);
  const resumed = []; // {id, m}
  let res;
  try {
    res = await fetch(proxy.url, {
      method: 'POST', headers, signal: ac.signal,
      body: JSON.stringify({ jsonrpc: '2.0', id: id2, method: 'requests/resume', params: { resumeToken: policy2?.resumeToken } }),
    });
    log(`raw POST requests/resume id ${id2} -> ${res.status} ${res.headers.get('content-type')}`);
    for await (const ev of sseEvents(res.body)) {
      const m = message(ev);
      if (!m) continue;
      resumed.push({ id: ev.id, m });
      log(`raw resume got ${describe(m)} ${ev.id ? `[${short(ev.id)}]` : '(no event id)'}`);
      if (m.id === id2 && (m.result !== undefined || m.error)) {
        // Not required: whatever follows until the proxy ends the stream (bounded).
        clearTimeout(timer);
        setTimeout(() => ac.abort(), 2000);
      }
    }
    log('raw resume: the proxy ended the stream');
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
    log(resumed.some((r) => r.m.id === id2) ? 'raw resume: stream still open 2 s after the response; dropped it' : 'raw resume: timed out reading');
  } finally {
    clearTimeout(timer);
    ac.abort();
  }
  checks.ok(res?.status === 200 && /text\/event-stream/.test(res?.headers.get('content-type') ?? ''), 'raw requests/resume: 200 text/event-stream', { status: res?.status, type: res?.headers.get('content-type') });
  const final = resumed.find((r) => r.m.id === id2 && (r.m.result !== undefined || r.m.error));
  const text2 = final?.m.result?.content?.[0]?.text ?? '';
  checks.ok(/Long running operation completed/.test(text2) && text2.includes(`Steps: ${CUT_STEPS}`), `raw requests/resume: ends with the tool's result under the original id ${id2}`, final?.m ?? resumed.map((r) => describe(r.m)));
  const trailing = final ? resumed.slice(resumed.indexOf(final) + 1) : [];
  log(`raw resume: after the response: ${trailing.length ? trailing.map((r) => `${describe(r.m)} ${r.id ? `[${short(r.id)}]` : '(no event id)'}`).join(' | ') : 'nothing'}`);
  if (final) resumed.splice(resumed.indexOf(final) + 1);
  const rawProgress = resumed.filter((r) => r.m.method === 'notifications/progress').map((r) => r.m.params.progress);
  checks.ok(new Set(rawProgress).size === rawProgress.length, `raw requests/resume: no progress value delivered twice ([${rawProgress.join(',')}])`);
  checks.ok(rawProgress.every((v, i) => i === 0 || v > rawProgress[i - 1]), 'raw requests/resume: progress in order');
  const union = [...new Set([...progress2, ...rawProgress])].sort((a, b) => a - b);
  checks.progressExactlyOnce(union, CUT_STEPS, 'call 2 (SDK before the cut ∪ raw resume)');
  const rawIds = resumed.map((r) => r.id).filter(Boolean);
  checks.ok(rawIds.length === resumed.length && new Set(rawIds).size === rawIds.length, 'raw requests/resume: every message has its own event id');
  // (compared by what they are: the SDK's parsed copies are not byte-equal to the wire)
  const seenBefore = new Map(before.map((w) => [w.tag.eventId, describe(w.m)]));
  const replayed = resumed.filter((r) => seenBefore.has(r.id));
  checks.ok(replayed.length > 0 && replayed.every((r) => seenBefore.get(r.id) === describe(r.m)),
    `raw requests/resume: the ${replayed.length} entries it replayed from before the cut carry their original event ids`);
  const sdkBeforeProgress = new Map(before.filter((w) => w.m.method === 'notifications/progress').map((w) => [w.m.params.progress, w.tag.eventId]));
  checks.ok(resumed.filter((r) => r.m.method === 'notifications/progress' && sdkBeforeProgress.has(r.m.params.progress))
    .every((r) => sdkBeforeProgress.get(r.m.params.progress) === r.id), 'raw requests/resume: a progress the SDK saw before the cut comes again only under its original event id');

  // The status, asked raw on the same session (answered as JSON).
  const st = await fetch(proxy.url, {
    method: 'POST', headers, signal: AbortSignal.timeout(10000),
    body: JSON.stringify({ jsonrpc: '2.0', id: 'g-status', method: 'requests/getStatus', params: { requestId: id2, resumeToken: policy2?.resumeToken } }),
  });
  const stType = st.headers.get('content-type') ?? '';
  const stBody = await st.text();
  log(`raw requests/getStatus -> ${st.status} ${stType} ${stBody}`);
  let stMsg;
  try { stMsg = JSON.parse(stBody); } catch { /* checked below */ }
  checks.ok(st.status === 200 && /application\/json/.test(stType) && stMsg?.result?.status === 'completed' && stMsg?.result?.requestId === id2,
    'raw requests/getStatus after the resume: application/json, completed', stBody);

  checks.ok(!errors.some((e) => /notification handler/.test(e)), 'the SDK raised no notification-handler (schema) errors', errors);
  log('other notifications the SDK passed to fallbackNotificationHandler:', JSON.stringify([...new Set(got.other)]));
  log('client errors (expected: the cut and refused reconnects):', JSON.stringify(errors));

  await client.close();
  log('call 2 in the SDK after close:', JSON.stringify(await call2Outcome));
  const del = await fetch(proxy.url, { method: 'DELETE', headers, signal: AbortSignal.timeout(5000) }).catch((e) => ({ status: String(e) }));
  log('DELETE session ->', del.status);
  await relay.close();
}, { timeoutMs: 60000 });
