// Scenario i: scale-out. A stock TS SDK session is round-robined over two
// proxy instances A and B that share one Redis store (backend = "redis", one
// key_prefix) and one token key, through a small loopback HTTP balancer that
// sends each request to the next instance in turn.
//
//   TS Client --> balancer (round-robin per request) --+--> proxy A --+--> resumable-server (TS SDK)
//                                                      +--> proxy B --+
//                         (both: Redis at REDIS_URL, same key_prefix, same tokens.key_file)
//
// initialize lands on one instance, notifications/initialized on the other,
// and so on. A long tool call with progress is cut mid-stream by the balancer;
// the SDK's GET with Last-Event-ID is the next request, so it lands on the
// other instance, which must replay what the client missed from Redis and
// follow the call live (it runs on the first instance) to its result. A
// second call then shows the session still works on both instances.
//
// Needs Redis at REDIS_URL, which run.sh sets to a private redis-server it
// starts when REDIS_URL is unset (never the shared 127.0.0.1:6379): without
// one the scenario fails with one line, it does not skip. Its keys (prefix
// interop-scale-<random>) are deleted at the end.
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  INTEROP_DIR, freePort, log, runScenario, start, startProxy, stop, waitForPort, workdir,
} from '../lib/harness.mjs';
import { Balancer } from '../lib/balancer.mjs';
import { Redis } from '../lib/redis.mjs';
import { connectClient, short } from '../lib/tsclient.mjs';

const REDIS_URL = process.env.REDIS_URL;
if (!REDIS_URL) {
  console.log('i-scale-out needs `redis-server` on PATH (Debian package redis-server) or REDIS_URL=redis://host:port');
  process.exit(1);
}
const PREFIX = `interop-scale-${randomBytes(6).toString('hex')}`;
const STEPS = 10;
const INTERVAL_MS = 300;
const CUT_AFTER = 3;
const STEPS_2 = 4;
const INTERVAL_MS_2 = 100;

const ok2xx = (r) => r && r.status >= 200 && r.status < 300;

/** The proxy config both instances share (only --listen and --data-dir differ). */
function writeConfig(upstreamUrl) {
  const dir = workdir();
  const keyFile = path.join(dir, 'token.key');
  fs.writeFileSync(keyFile, randomBytes(32), { mode: 0o600 });
  const file = path.join(dir, 'proxy.toml');
  fs.writeFileSync(file, [
    '[store]',
    'backend = "redis"',
    `redis_url = ${JSON.stringify(REDIS_URL)}`,
    `key_prefix = ${JSON.stringify(PREFIX)}`,
    'lease_ms = 1000',
    '',
    '[tokens]',
    `key_file = ${JSON.stringify(keyFile)}`,
    '',
    '[[upstream]]',
    `url = ${JSON.stringify(upstreamUrl)}`,
    '',
  ].join('\n'));
  return file;
}

/** This run's keys: `P:...` and the hash-tagged `{P:...}:...`. */
const ourKeys = (redis) => redis.keys(`${PREFIX}:*`, `{${PREFIX}:*`);

await runScenario('i-scale-out: TS SDK session round-robined over two proxies sharing Redis, resumed across instances', async (checks) => {
  // ------------------------------------------------------------ Redis
  let redis;
  try {
    redis = await Redis.connect(REDIS_URL);
    const pong = await redis.command('PING');
    if (pong !== 'PONG') throw new Error(`PING answered ${JSON.stringify(pong)}`);
  } catch (e) {
    redis?.close();
    throw new Error(`the Redis at REDIS_URL=${REDIS_URL} did not answer PING: ${e?.message ?? e}`);
  }
  checks.ok(true, `Redis at ${REDIS_URL} answers PING; key prefix ${PREFIX}`);

  const proxies = [];
  try {
    // ---------------------------------------------------------- peers
    const upstreamPort = await freePort();
    const upstream = start('upstream', process.execPath, [path.join(INTEROP_DIR, 'lib', 'resumable-server.mjs'), String(upstreamPort)]);
    await waitForPort(upstreamPort, upstream);
    const upstreamUrl = `http://127.0.0.1:${upstreamPort}/mcp`;
    const config = writeConfig(upstreamUrl);
    log('upstream (TS SDK, event store) at', upstreamUrl, '; config', config);

    for (const name of ['A', 'B']) {
      const p = await startProxy({ name: `proxy-${name}`, extraArgs: ['--config', config] });
      p.name = name;
      proxies.push(p);
      log(`proxy ${name} at ${p.url} (data dir ${p.dataDir}, log ${p.child.logFile})`);
    }
    const balancer = new Balancer(proxies.map((p) => ({ name: p.name, port: p.port })), { log });
    await balancer.listen();
    log('balancer at', balancer.url);

    // ---------------------------------------------------------- session
    const { client, transport, requests } = await connectClient(balancer.url);
    log('connected; session', transport.sessionId, 'protocol', transport.protocolVersion);
    const init = balancer.requests.find((r) => r.rpc === 'initialize');
    const initialized = balancer.requests.find((r) => r.rpc === 'notifications/initialized');
    checks.ok(
      ok2xx(init) && ok2xx(initialized) && init.backend !== initialized.backend,
      `initialize was served by ${init?.backend} (${init?.status}), notifications/initialized by ${initialized?.backend} (${initialized?.status})`,
    );
    const { tools } = await client.listTools();
    const listed = balancer.requests.findLast((r) => r.rpc === 'tools/list');
    checks.ok(tools.some((t) => t.name === 'long-op'), `tools/list (served by ${listed?.backend}) has long-op`);

    // ---------------------------------------------------------- call 1, cut once
    const progress = [];
    const tokens = [];
    let cut; // {at, token, recs}
    const result = await client.request(
      { method: 'tools/call', params: { name: 'long-op', arguments: { steps: STEPS, intervalMs: INTERVAL_MS } } },
      CallToolResultSchema,
      {
        timeout: 60000,
        resetTimeoutOnProgress: true,
        onresumptiontoken: (t) => tokens.push(t),
        onprogress: (p) => {
          progress.push(p.progress);
          log(`call 1 progress ${p.progress}/${p.total}${cut ? ' (after the cut)' : ''}`);
          if (p.progress === CUT_AFTER && !cut) {
            // The SDK reported this event's id before the message.
            const recs = balancer.cut((r) => r.method === 'POST' && r.rpc === 'tools/call');
            cut = { at: Date.now(), token: tokens.at(-1), recs };
          }
        },
      },
    );
    const text = result.content?.[0]?.text ?? '';
    log('call 1 result', JSON.stringify(result));
    const callPost = balancer.requests.find((r) => r.method === 'POST' && r.rpc === 'tools/call');
    checks.ok(cut?.recs.length === 1, `the balancer cut the tools/call SSE response (served by ${callPost?.backend}) after progress ${CUT_AFTER}`);
    checks.progressExactlyOnce(progress, STEPS, 'call 1 (cut, resumed on the other instance)');
    checks.ok(text === `long-op done: ${STEPS} steps`, 'call 1: its final result arrived', text);
    const resumes = balancer.requests.filter((r) => r.method === 'GET' && r.lastEventId && cut && r.at >= cut.at);
    const first = resumes[0];
    checks.ok(
      first && first.lastEventId === cut.token && first.status === 200,
      `the SDK resumed with GET Last-Event-ID = the last id it saw before the cut (${short(cut?.token)}) and got 200`,
      resumes.map((r) => ({ backend: r.backend, lastEventId: short(r.lastEventId), status: r.status, error: r.error })),
    );
    checks.ok(
      first && callPost && first.backend !== callPost.backend,
      `the resume GET was served by the other instance (POST on ${callPost?.backend}, GET Last-Event-ID on ${first?.backend})`,
    );
    checks.ok(resumes.length === 1, `one resume GET was enough (${resumes.length})`);
    checks.ok(
      requests.filter((r) => r.method === 'POST' && r.body === 'tools/call').length === 1,
      'the tools/call was POSTed once (no re-send)',
    );
    checks.ok(new Set(tokens).size === tokens.length, `no event id delivered twice (${tokens.length} ids)`);

    // ---------------------------------------------------------- the session on both instances
    const afterResume = balancer.requests.length;
    const { tools: tools2 } = await client.listTools();
    checks.ok(tools2.some((t) => t.name === 'long-op'), `tools/list again (served by ${balancer.requests.at(-1)?.backend})`);
    const progress2 = [];
    const result2 = await client.request(
      { method: 'tools/call', params: { name: 'long-op', arguments: { steps: STEPS_2, intervalMs: INTERVAL_MS_2 } } },
      CallToolResultSchema,
      { timeout: 30000, onprogress: (p) => progress2.push(p.progress) },
    );
    const call2 = balancer.requests.findLast((r) => r.method === 'POST' && r.rpc === 'tools/call');
    checks.progressExactlyOnce(progress2, STEPS_2, `call 2 (served by ${call2?.backend})`);
    checks.ok(result2.content?.[0]?.text === `long-op done: ${STEPS_2} steps`, 'call 2: its final result arrived', JSON.stringify(result2));
    const served = (rs) => [...new Set(rs.filter(ok2xx).map((r) => r.backend))].sort().join(',');
    checks.ok(served(balancer.requests.slice(afterResume)) === 'A,B', `after the resume both instances served the session (${served(balancer.requests.slice(afterResume))})`);
    checks.ok(served(balancer.requests) === 'A,B', `every instance served requests: ${['A', 'B'].map((b) => `${b} ${balancer.requests.filter((r) => r.backend === b).length}`).join(', ')}`);

    const upstreamStats = await fetch(`http://127.0.0.1:${upstreamPort}/stats`).then((x) => x.json());
    log('upstream stats', JSON.stringify(upstreamStats));
    checks.ok(upstreamStats.calls === 2, `the upstream ran each tools/call once (${upstreamStats.calls} tools/call POSTs upstream)`);

    const keys = await ourKeys(redis);
    checks.ok(keys.length > 0, `the proxies keep their state in Redis under ${PREFIX} (${keys.length} keys, e.g. ${keys.slice(0, 4).join(' ')})`);

    let deleted;
    try {
      await transport.terminateSession();
      deleted = balancer.requests.findLast((r) => r.method === 'DELETE');
    } catch (e) {
      log('DELETE failed:', e.message);
    }
    checks.ok(ok2xx(deleted), `DELETE of the session answered ${deleted?.status} (served by ${deleted?.backend})`);
    await client.close();
    await balancer.close();
    log('balancer log:', balancer.requests.map((r) => `#${r.n} ${r.method}${r.rpc ? ` ${r.rpc}` : ''}${r.lastEventId ? ' (Last-Event-ID)' : ''} -> ${r.backend} ${r.status ?? r.error ?? '-'}${r.cut ? ' CUT' : ''}`).join('; '));
  } finally {
    // Best effort: stop the instances (so nothing writes any more), then
    // delete this run's keys.
    await Promise.all(proxies.map((p) => stop(p.child, 6000)));
    try {
      const keys = await ourKeys(redis);
      const n = await redis.del(keys);
      log(`redis: deleted ${n} key(s) under ${PREFIX}${keys.length ? `: ${keys.join(" ")}` : ""}`);
    } catch (e) {
      log(`redis: could not delete the keys under ${PREFIX}: ${e?.message ?? e}`);
    }
    redis.close();
  }
}, { timeoutMs: 75000 });
