// Scenario h: crash loop against a real peer. The real proxy binary, in front
// of an official-TS-SDK server (StreamableHTTPServerTransport + an event
// store, lib/resumable-server.mjs), is killed with SIGKILL at random moments
// and restarted on the same data dir and port while several clients run long
// tool calls with progress through it. Each client resumes with GET +
// Last-Event-ID whenever its connection drops (and re-POSTs the call under
// the same id while it has no event id yet). The restarted proxy must resume
// the upstream from the last upstream event id it logged and carry each call
// on to its result.
//
//   raw fetch clients --> mcp-resume-proxy (kill -9, restart) --> resumable-server (TS SDK)
//
// Checks: progress 1..N exactly once, in order, then the final response (0
// lost, 0 duplicated, 0 foreign); uninterrupted calls end with their result;
// every interrupted call whose first upstream event had been logged ends with
// its result (100 %; a call killed before that has nothing to resume from and
// ends with the proxy's restart error: reported separately); no connection
// falls silent; after one more kill + restart every call is served again,
// from its first event id, as its client saw it. One summary line.
//
// Two upstreams, one run each (run.sh lists both):
// - the TS SDK server with an event store (default), which re-attaches a
//   resumed GET live;
// - CRASH_UPSTREAM=everything: server-everything's streamableHttp, whose
//   event store replays every stream of the session after the named id and
//   never re-attaches live. The proxy must ask again while a resumed stream
//   stays silent, and keep other calls' messages out of each stream.
//
// Env: CRASH_KILLS=n (default 6), CRASH_SEED=n (replays the kill plan and
// the calls' shapes; upstream timing is not replayed), CRASH_CLIENTS=n (6),
// CRASH_UPSTREAM=everything.
import path from 'node:path';
import {
  INTEROP_DIR, PROXY_BIN, freePort, startEverythingHttp, log, runScenario, sleep, start, tail, waitForPort, workdir,
} from '../lib/harness.mjs';
import { RawSession, message, sseEvents } from '../lib/rawmcp.mjs';

const KILLS = Number(process.env.CRASH_KILLS ?? 6);
const CLIENTS = Number(process.env.CRASH_CLIENTS ?? 6);
const SEED = Number(process.env.CRASH_SEED ?? (Date.now() % 2 ** 31));
/** No call may take longer than this end to end, interruptions included. */
const CALL_LIMIT_MS = 60000;
/** A connection silent this long (the proxy is up) counts as a stall. */
const SILENCE_MS = 15000;
const RETRY_EVERY_MS = 50;
const EVERYTHING = process.env.CRASH_UPSTREAM === 'everything';
/** The tools/call params of a long call. */
const callParams = (steps, intervalMs, progressToken) => (EVERYTHING
  ? { name: 'trigger-long-running-operation', arguments: { duration: (steps * intervalMs) / 1000, steps }, _meta: { progressToken } }
  : { name: 'long-op', arguments: { steps, intervalMs }, _meta: { progressToken } });
/** The proxy's error for a call killed before any upstream event id was logged. */
const RESTARTED = 'the proxy restarted while the upstream was answering this request; its outcome is unknown';

/** mulberry32: seeded, deterministic. */
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return { next, range: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)) };
}

// ---------------------------------------------------------------- the proxy
let generation = 0;
async function startProxyAt(port, dataDir, upstreamUrl) {
  generation += 1;
  const child = start(`proxy-${generation}`, PROXY_BIN,
    ['--listen', `127.0.0.1:${port}`, '--data-dir', dataDir, '--upstream', upstreamUrl],
    { env: { RUST_LOG: process.env.RUST_LOG ?? 'mcp_resume_proxy=debug,info' } });
  await waitForPort(port, child);
  const deadline = Date.now() + 10000;
  for (;;) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/healthz`);
      await r.text();
      if (r.ok) return child;
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) throw new Error(`proxy /healthz not ready; log:\n${tail(child.logFile)}`);
    await sleep(50);
  }
}

async function kill9(child) {
  child.kill('SIGKILL');
  await child.exited;
}

// ---------------------------------------------------------------- one call
const refused = (e) => e?.cause?.code === 'ECONNREFUSED' || e?.code === 'ECONNREFUSED';

/** Runs one call to its final response, resuming after every drop. */
async function runCall(s, client, id, steps, intervalMs, stalls) {
  const rec = { client, sid: s.sessionId, id, steps, seen: [], firstId: undefined, interrupted: false, outcome: undefined, trace: '' };
  const deadline = Date.now() + CALL_LIMIT_MS;
  const token = `h-${client}-${id}`;
  let lastId;
  for (;;) {
    if (Date.now() > deadline) throw new Error(`call ${id} of client ${client} never ended: ${JSON.stringify(rec)}`);
    const ac = new AbortController();
    let silence;
    const quiet = () => {
      clearTimeout(silence);
      silence = setTimeout(() => { rec.trace += 's'; stalls.n += 1; ac.abort(); }, SILENCE_MS);
    };
    quiet();
    rec.trace += lastId ? 'G' : 'P';
    let res;
    try {
      res = lastId
        ? await s.resume(lastId, ac.signal)
        : await s.post({
          jsonrpc: '2.0', id, method: 'tools/call',
          params: callParams(steps, intervalMs, token),
        }, ac.signal);
    } catch (e) {
      clearTimeout(silence);
      // Refused: the proxy is down and the request never left. Anything
      // else may have reached the proxy.
      rec.trace += refused(e) ? 'c' : 'x';
      rec.interrupted ||= !refused(e);
      await sleep(RETRY_EVERY_MS);
      continue;
    }
    if (res.status >= 500) {
      clearTimeout(silence);
      await res.text().catch(() => {});
      rec.trace += String(res.status);
      rec.interrupted = true;
      await sleep(RETRY_EVERY_MS);
      continue;
    }
    if (res.status !== 200) {
      clearTimeout(silence);
      throw new Error(`call ${id} of client ${client}: ${res.status} ${await res.text().catch(() => '')}; ${JSON.stringify(rec)}`);
    }
    let final;
    try {
      for await (const ev of sseEvents(res.body)) {
        quiet();
        rec.trace += '.';
        if (ev.id) {
          lastId = ev.id;
          rec.firstId ??= ev.id;
        }
        const m = message(ev);
        if (!m) continue;
        rec.seen.push({ id: ev.id, m });
        if (m.id === id && (m.result !== undefined || m.error !== undefined)) {
          final = m;
          break;
        }
      }
    } catch {
      /* the connection dropped (or was aborted as stalled); or, after the
         final response, closing the body failed: not an interruption */
    }
    clearTimeout(silence);
    ac.abort();
    if (final) {
      rec.outcome = final.result !== undefined ? 'result' : 'error';
      return rec;
    }
    rec.interrupted = true;
    await sleep(RETRY_EVERY_MS);
  }
}

/** How one call's delivery compares with exactly-once, in order. */
function delivery(rec) {
  const progress = rec.seen.slice(0, -1).map(({ m }) => m);
  const token = `h-${rec.client}-${rec.id}`;
  const foreign = progress.filter((m) => m.method !== 'notifications/progress' || m.params?.progressToken !== token).length;
  const values = progress.filter((m) => m.method === 'notifications/progress').map((m) => m.params.progress);
  const distinct = [...new Set(values)].sort((a, b) => a - b);
  let duplicated = values.length - distinct.length;
  let outOfOrder = 0;
  for (let i = 1; i < values.length; i++) if (values[i - 1] >= values[i]) outOfOrder += 1;
  const reached = rec.outcome === 'result' ? rec.steps : (distinct.at(-1) ?? 0);
  const lost = reached - distinct.filter((v) => v >= 1 && v <= reached).length;
  const ids = rec.seen.map((x) => x.id).filter(Boolean);
  duplicated = Math.max(duplicated, ids.length - new Set(ids).size);
  return { lost, duplicated, outOfOrder, foreign };
}

/** The messages a GET with Last-Event-ID = firstId must serve again. */
function expectedReplay(rec) {
  const i = rec.seen.findIndex((x) => x.id === rec.firstId);
  return rec.seen.slice(i + 1).map((x) => x.m);
}

async function clientLoop(url, client, seed, stop, stalls) {
  const s = new RawSession(url);
  await s.initialize();
  const r = rng(seed);
  const calls = [];
  let id = 100;
  while (!stop.stop) {
    id += 1;
    calls.push(await runCall(s, client, id, r.range(8, 16), r.range(50, 140), stalls));
  }
  return { s, calls };
}

await runScenario(`h-crash-loop: kill -9 the proxy ${KILLS} times under ${CLIENTS} clients (${EVERYTHING ? "server-everything" : "TS SDK server with an event store"})`, async (checks) => {
  log(`seed ${SEED} (CRASH_SEED=${SEED} replays the kill plan)`);
  const r = rng(SEED);
  let upstreamPort;
  if (EVERYTHING) {
    upstreamPort = (await startEverythingHttp()).port;
  } else {
    upstreamPort = await freePort();
    const upstream = start('upstream', process.execPath, [path.join(INTEROP_DIR, 'lib', 'resumable-server.mjs'), String(upstreamPort)]);
    await waitForPort(upstreamPort, upstream);
  }
  const upstreamUrl = `http://127.0.0.1:${upstreamPort}/mcp`;
  const port = await freePort();
  const dataDir = path.join(workdir(), 'proxy-data');
  let proxy = await startProxyAt(port, dataDir, upstreamUrl);
  const url = `http://127.0.0.1:${port}/mcp`;
  log(`upstream (${EVERYTHING ? 'server-everything' : 'TS SDK, event store'}) at`, upstreamUrl, '; proxy at', url);

  const stop = { stop: false };
  const stalls = { n: 0 };
  const t0 = Date.now();
  const loops = Array.from({ length: CLIENTS }, (_, n) => clientLoop(url, n, Math.floor(r.next() * 2 ** 31), stop, stalls));
  for (let k = 1; k <= KILLS; k++) {
    await sleep(r.range(700, 2500));
    await kill9(proxy);
    const down = r.range(0, 300);
    log(`kill ${k}/${KILLS}: SIGKILL; restarting in ${down} ms`);
    await sleep(down);
    proxy = await startProxyAt(port, dataDir, upstreamUrl);
  }
  stop.stop = true;
  const done = await Promise.all(loops);
  const calls = done.flatMap((d) => d.calls);
  const loopSecs = ((Date.now() - t0) / 1000).toFixed(1);

  // Everything any client saw is served again by a restarted proxy.
  await kill9(proxy);
  proxy = await startProxyAt(port, dataDir, upstreamUrl);
  let replayMismatches = 0;
  const sessions = new Map(done.map((d) => [d.s.sessionId, d.s]));
  for (const rec of calls) {
    if (!rec.firstId) continue;
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), 10000);
    const again = [];
    try {
      const res = await sessions.get(rec.sid).resume(rec.firstId, ac.signal);
      if (res.status !== 200) throw new Error(`replay -> ${res.status}`);
      for await (const ev of sseEvents(res.body)) {
        const m = message(ev);
        if (m) again.push(m);
        if (m && m.id === rec.id && (m.result !== undefined || m.error !== undefined)) break;
      }
    } catch (e) {
      again.push({ replayError: String(e) });
    }
    clearTimeout(timer);
    ac.abort();
    if (JSON.stringify(again) !== JSON.stringify(expectedReplay(rec))) {
      replayMismatches += 1;
      log(`replay differs for client ${rec.client} call ${rec.id}: got ${JSON.stringify(again).slice(0, 300)}`);
    }
  }
  const upstreamStats = EVERYTHING
    ? { calls: '?', resumes: '?' }
    : await fetch(`http://127.0.0.1:${upstreamPort}/stats`).then((x) => x.json());

  const f = {
    kills: KILLS, calls: calls.length, interrupted: 0, interruptedResults: 0, killedBeforeFirst: 0,
    results: 0, errors: 0, lost: 0, duplicated: 0, outOfOrder: 0, foreign: 0, uninterruptedErrors: 0,
  };
  const errorsSeen = new Map();
  for (const rec of calls) {
    const d = delivery(rec);
    if (d.lost + d.duplicated + d.outOfOrder + d.foreign > 0) {
      log(`delivery ${JSON.stringify(d)} in client ${rec.client} call ${rec.id} (trace ${rec.trace}): ${JSON.stringify(rec.seen.map((x) => x.m.params?.progress ?? (x.m.result ? 'result' : x.m.error?.message)))}`);
    }
    f.lost += d.lost;
    f.duplicated += d.duplicated;
    f.outOfOrder += d.outOfOrder;
    f.foreign += d.foreign;
    if (rec.outcome === 'result') f.results += 1;
    else f.errors += 1;
    if (rec.interrupted) {
      f.interrupted += 1;
      if (rec.outcome === 'result') {
        f.interruptedResults += 1;
      } else {
        const msg = rec.seen.at(-1).m.error?.message;
        if (rec.seen.length === 1 && msg === RESTARTED) f.killedBeforeFirst += 1;
        errorsSeen.set(msg, (errorsSeen.get(msg) ?? 0) + 1);
        log(`client ${rec.client} call ${rec.id} (${rec.steps} steps, trace ${rec.trace}): error after ${rec.seen.length - 1} progress: ${msg}`);
      }
    } else if (rec.outcome !== 'result') {
      f.uninterruptedErrors += 1;
      log(`uninterrupted call ended with an error: ${JSON.stringify(rec)}`);
    }
  }
  const resumable = f.interrupted - f.killedBeforeFirst;
  console.log(`h-crash-loop: seed=${SEED} kills=${f.kills} clients=${CLIENTS} calls=${f.calls} interrupted=${f.interrupted} `
    + `(then result ${f.interruptedResults}, then error ${f.interrupted - f.interruptedResults}, of which killed before the first upstream event ${f.killedBeforeFirst}) `
    + `results=${f.results} errors=${f.errors} lost=${f.lost} duplicated=${f.duplicated} out_of_order=${f.outOfOrder} `
    + `replay_mismatches=${replayMismatches} stalls=${stalls.n} upstream_tools_call_posts=${upstreamStats.calls} upstream_resume_gets=${upstreamStats.resumes} loop=${loopSecs}s`);
  for (const [msg, n] of errorsSeen) log(`  error x${n}: ${msg}`);

  checks.ok(f.interrupted > 0, `the kills interrupted calls (${f.interrupted} of ${f.calls})`);
  checks.ok(f.lost === 0, `0 lost progress notifications (${f.lost})`);
  checks.ok(f.duplicated === 0, `0 duplicated progress notifications or event ids (${f.duplicated})`);
  checks.ok(f.outOfOrder === 0, `progress in order (${f.outOfOrder} out of order)`);
  checks.ok(f.foreign === 0, `no other call's messages on a call's stream (${f.foreign})`);
  checks.ok(f.uninterruptedErrors === 0, `every uninterrupted call ended with its result (${f.uninterruptedErrors} did not)`);
  checks.ok(f.interruptedResults === resumable,
    `every interrupted call whose first upstream event had been logged ended with its result (${f.interruptedResults}/${resumable})`);
  checks.ok(replayMismatches === 0, `after one more kill + restart every call is served again as its client saw it (${replayMismatches} differ)`);
  checks.ok(stalls.n === 0, `no connection fell silent for ${SILENCE_MS / 1000} s (${stalls.n})`);
  checks.ok(EVERYTHING || upstreamStats.resumes > 0, `the restarted proxy resumed the upstream with GET Last-Event-ID (${upstreamStats.resumes} times)`);
  await Promise.all(done.map((d) => d.s.delete()));
}, { timeoutMs: 150000 });
