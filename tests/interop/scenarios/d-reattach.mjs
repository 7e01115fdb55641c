// Scenario d: does a resumed stream re-attach to a request that is still
// running? (runbook gotcha G3)
//
// server-everything's own InMemoryEventStore ignores the stream id: a GET with
// Last-Event-ID is not re-attached to the live request, so the resumed GET
// held during the call receives nothing; only a later GET replays the events.
// Through mcp-resume-proxy the same resumed GET must get the remaining
// progress live, then the result.
//
// Raw HTTP (fetch) so that the test controls every request:
//   1. POST tools/call trigger-long-running-operation {duration 4, steps 4} with a progressToken
//   2. read until progress 1, note its event id, drop the connection
//   3. GET Last-Event-ID = that id, held until 1.5 s after the call must have ended
import {
  everythingStdioCommand, log, proxyHasUpstreamCommand, runScenario, sleep, startEverythingHttp, startProxy,
} from '../lib/harness.mjs';
import { RawSession, message, sseEvents } from '../lib/rawmcp.mjs';

const DURATION = 4;
const STEPS = 4;

/** Steps 1-3 against url; returns what the held GET received. */
async function dropAndResume(url, label) {
  const s = new RawSession(url);
  await s.initialize();
  const ac = new AbortController();
  const t0 = Date.now();
  const res = await s.post({
    jsonrpc: '2.0', id: 42, method: 'tools/call',
    params: { name: 'trigger-long-running-operation', arguments: { duration: DURATION, steps: STEPS }, _meta: { progressToken: `d-${label}` } },
  }, ac.signal);
  let firstId;
  try {
    for await (const ev of sseEvents(res.body)) {
      const m = message(ev);
      if (m?.method === 'notifications/progress') {
        firstId = ev.id;
        log(`${label}: POST stream: progress ${m.params.progress} (id ${ev.id}); dropping the connection`);
        ac.abort();
        break;
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
  }
  if (!firstId) throw new Error(`${label}: no progress event with an id on the POST stream`);
  const callEnd = t0 + DURATION * 1000;
  const deadline = callEnd + 1500;
  const held = new AbortController();
  const timer = setTimeout(() => held.abort(), deadline - Date.now());
  const getStart = Date.now();
  const r = await s.resume(firstId, held.signal);
  log(`${label}: GET Last-Event-ID -> ${r.status} ${r.headers.get('content-type')}`);
  const got = [];
  let ended = 'held until the deadline';
  try {
    for await (const ev of sseEvents(r.body)) {
      const m = message(ev);
      if (!m) continue;
      const at = ev.at - t0;
      got.push({ m, at, id: ev.id });
      log(`${label}: resumed GET got ${m.method === 'notifications/progress' ? `progress ${m.params.progress}` : m.result ? 'the result' : JSON.stringify(m)} at +${at} ms`);
    }
    ended = 'the server ended the stream';
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
  }
  clearTimeout(timer);
  log(`${label}: resumed GET: ${got.length} message(s); ${ended}`);
  return { s, firstId, got, status: r.status, t0, getStart, callEnd, ended };
}

const progressOf = (got) => got.filter((g) => g.m.method === 'notifications/progress').map((g) => g.m.params.progress);
const resultOf = (got) => got.find((g) => g.m.id === 42 && g.m.result);

await runScenario('d-reattach: a resumed GET during a live call (server-everything directly vs through the proxy)', async (checks) => {
  const everything = await startEverythingHttp();
  const proxy = await startProxy({ upstream: everything.url });

  // Directly: G3.
  const direct = await dropAndResume(everything.url, 'direct');
  checks.ok(direct.status === 200, 'directly: GET with Last-Event-ID -> 200');
  checks.ok(direct.got.length === 0,
    'directly (G3): the resumed GET held during the call got nothing live (not re-attached to the running request)',
    direct.got.map((g) => g.m.method ?? 'result'));
  // ...yet the events are in its store: a later GET replays them.
  const later = new AbortController();
  setTimeout(() => later.abort(), 1500);
  const r2 = await direct.s.resume(direct.firstId, later.signal);
  const replayed = [];
  try {
    for await (const ev of sseEvents(r2.body)) {
      const m = message(ev);
      if (m) replayed.push({ m });
    }
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
  }
  checks.ok(JSON.stringify(progressOf(replayed)) === JSON.stringify([2, 3, 4]) && resultOf(replayed),
    'directly: a second GET after the call replays progress 2,3,4 and the result (the events were stored, just not re-attached)',
    replayed.map((g) => g.m.params?.progress ?? (g.m.result ? 'result' : g.m.method)));
  await direct.s.delete();

  // Through the proxy (in front of the same HTTP server, then of the stdio server): live re-attach.
  const targets = [['through the proxy', proxy.url]];
  if (proxyHasUpstreamCommand()) {
    const stdioProxy = await startProxy({ upstreamCommand: everythingStdioCommand(), name: 'proxy-stdio' });
    targets.push(['through the proxy (stdio upstream)', stdioProxy.url]);
  }
  for (const [label, url] of targets) {
    const via = await dropAndResume(url, label);
    checks.ok(via.status === 200, `${label}: GET with Last-Event-ID -> 200`);
    checks.ok(JSON.stringify(progressOf(via.got)) === JSON.stringify([2, 3, 4]),
      `${label}: the resumed GET got progress 2,3,4 exactly once`, progressOf(via.got));
    const res = resultOf(via.got);
    checks.ok(res && /Long running operation completed/.test(res.m.result.content?.[0]?.text ?? ''),
      `${label}: the resumed GET got the tool result`);
    checks.ok(res && res.at <= via.callEnd - via.t0 + 1000,
      `${label}: the result arrived live, as the call ended (+${res?.at} ms; call ends at +${via.callEnd - via.t0} ms)`);
    const p = via.got.filter((g) => g.m.method === 'notifications/progress');
    checks.ok(p.length >= 2 && p.at(-1).at - p[0].at >= 1500,
      `${label}: progress arrived spread over time (followed live, not one batch at the end)`,
      p.map((g) => `+${g.at}`));
    checks.ok(via.ended === 'the server ended the stream', `${label}: the resumed stream ended after the result`);
    await via.s.delete();
  }
  await sleep(50);
}, { timeoutMs: 60000 });
