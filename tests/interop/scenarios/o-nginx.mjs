// Scenario o: the README's scale-out example as printed, with a real nginx
// (issue 35: nginx sent `Host: mcp_resume_proxy`, the upstream block's name,
// and every request got `403 Host not allowed`).
//
//   raw HTTP client --> nginx (the README's ```nginx block) --+--> proxy A --+--> server-everything
//    Host: mcp.example.com                                     +--> proxy B --+
//                         (A and B: the README's ```toml block: one Redis, one key_prefix, one token key)
//
// Both blocks are read from README.md's section "Scale-out: several instances
// on one Redis" and only addresses, ports and paths are replaced, by the exact
// strings in TOML_SUBSTITUTIONS and NGINX_SUBSTITUTIONS below: a string the
// README no longer contains fails the test, so the README cannot drift from
// what runs here. Around the nginx block (which is what goes in conf.d/,
// inside http {}) the test adds only its own frame: one worker (one
// round-robin sequence), temp paths and logs in the work dir, an access log
// and an `X-Served-By: $upstream_addr` header that say which instance served
// each request.
//
// Through nginx, with the public name a real deployment's clients use:
// initialize (not 403), a long tool call whose first events come from one
// instance, the connection cut, and the GET with Last-Event-ID sent until
// nginx's round robin lands it on the other instance (an attempt that lands
// on the call's own instance is dropped before its body is read); every
// progress event and the result must arrive exactly once. Straight at an
// instance, a foreign Host is still refused with 403.
//
// Needs `nginx` (Debian package nginx; run.sh installs it when missing, as
// root, without starting its service) and Redis at REDIS_URL (run.sh starts
// a private redis-server when REDIS_URL is unset). Keys of this run (prefix
// interop-nginx-<random>) are deleted at the end.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import {
  REPO_DIR, log, runScenario, start, startEverythingHttp, startProxy, stop, tail, waitForPort, freePort, workdir,
} from '../lib/harness.mjs';
import { Redis } from '../lib/redis.mjs';
import { PROTOCOL, message, sseEvents } from '../lib/rawmcp.mjs';

const REDIS_URL = process.env.REDIS_URL;
if (!REDIS_URL) {
  console.log('o-nginx needs `redis-server` on PATH (Debian package redis-server) or REDIS_URL=redis://host:port');
  process.exit(1);
}
// Debian puts nginx in /usr/sbin, which a non-root PATH may lack.
const NGINX = [...(process.env.PATH ?? '').split(':'), '/usr/sbin']
  .map((d) => path.join(d, 'nginx'))
  .find((p) => { try { fs.accessSync(p, fs.constants.X_OK); return true; } catch { return false; } });
if (!NGINX) {
  console.log('o-nginx needs `nginx` (Debian package nginx: `apt-get install nginx`; run.sh installs it when run as root)');
  process.exit(1);
}

const PREFIX = `interop-nginx-${randomBytes(6).toString('hex')}`;
/** The name clients of a real deployment use; resolves to nginx. */
const PUBLIC_HOST = 'mcp.example.com';
/** A name nobody configured: straight at an instance it must be refused. */
const FOREIGN_HOST = 'evil.example';
const DURATION_S = 5;
const STEPS = 10;
const CUT_AFTER = 3;
const CALL_ID = 7;
const MAX_RESUME_TRIES = 4;

// ---------------------------------------------------------------- the README
const SECTION = 'Scale-out: several instances on one Redis';

/** The fenced blocks of the README's scale-out section, by info string. */
function readmeBlocks() {
  const lines = fs.readFileSync(path.join(REPO_DIR, 'README.md'), 'utf8').split('\n');
  const at = lines.findIndex((l) => /^#+ /.test(l) && l.replace(/^#+ /, '') === SECTION);
  if (at < 0) throw new Error(`README.md has no section "${SECTION}"`);
  const blocks = {};
  let fence; // {lang, body}
  for (const line of lines.slice(at + 1)) {
    if (fence) {
      if (line.startsWith('```')) {
        (blocks[fence.lang] ??= []).push(`${fence.body.join('\n')}\n`);
        fence = undefined;
      } else {
        fence.body.push(line);
      }
    } else if (line.startsWith('```')) {
      fence = { lang: line.slice(3).trim(), body: [] };
    } else if (/^#{1,3} /.test(line)) {
      break; // the next section
    }
  }
  for (const lang of ['toml', 'nginx']) {
    if (blocks[lang]?.length !== 1) {
      throw new Error(`README section "${SECTION}" has ${blocks[lang]?.length ?? 0} \`\`\`${lang} blocks; this test expects exactly one`);
    }
  }
  return { toml: blocks.toml[0], nginx: blocks.nginx[0], sh: (blocks.sh ?? []).join('') };
}

/** Replaces each exact `from` (all occurrences); a `from` the block lacks is drift. */
function substitute(label, text, pairs) {
  for (const [from, to] of pairs) {
    if (!text.includes(from)) {
      throw new Error(`the README's scale-out \`\`\`${label} block no longer contains ${JSON.stringify(from)}: `
        + `README.md and tests/interop/scenarios/o-nginx.mjs (${label.toUpperCase()}_SUBSTITUTIONS) disagree; update one of them`);
    }
    text = text.split(from).join(to);
  }
  return text;
}

const TOML_SUBSTITUTIONS = ({ redisUrl, keyFile, upstreamUrl }) => [
  ['redis://10.0.0.5:6379/0', redisUrl],
  // A prefix of this run's own, so its keys can be found and deleted on a shared REDIS_URL.
  ['"mcp-prod"', JSON.stringify(PREFIX)],
  ['/etc/mcp-resume-proxy/token.key', keyFile],
  ['http://mcp-server.internal:3000/mcp', upstreamUrl],
];
const NGINX_SUBSTITUTIONS = ({ portA, portB, port }) => [
  ['server 127.0.0.1:8081;', `server 127.0.0.1:${portA};`],
  ['server 127.0.0.1:8082;', `server 127.0.0.1:${portB};`],
  // Tests listen on free loopback ports only.
  ['listen 8080;', `listen 127.0.0.1:${port};`],
];

// ---------------------------------------------------------------- nginx
function nginxFrame(dir, readmeBlock) {
  const tmp = (name) => path.join(dir, name);
  return [
    '# o-nginx: the test\'s frame around the README\'s block (which goes in conf.d/, inside http {}).',
    'worker_processes 1;   # one worker: one round-robin sequence',
    // As root the workers would run as nobody, who cannot enter the 0700 work dir.
    ...(process.getuid?.() === 0 ? ['user root root;'] : []),
    'events { worker_connections 256; }',
    'http {',
    `    client_body_temp_path ${tmp('client_body')};`,
    `    proxy_temp_path ${tmp('proxy_temp')};`,
    `    fastcgi_temp_path ${tmp('fastcgi_temp')};`,
    `    uwsgi_temp_path ${tmp('uwsgi_temp')};`,
    `    scgi_temp_path ${tmp('scgi_temp')};`,
    '    log_format served \'$request_method $request_uri $status upstream=$upstream_addr host=$http_host \'',
    '                      \'last_event_id=$http_last_event_id session=$http_mcp_session_id\';',
    `    access_log ${path.join(workdir(), 'nginx-access.log')} served;`,
    '    # Which instance answered (inherited by the README\'s server block, which sets no add_header).',
    '    add_header X-Served-By $upstream_addr always;',
    '',
    '    # ---- README.md, "Scale-out: several instances on one Redis", addresses substituted',
    readmeBlock.replace(/^/gm, '    ').trimEnd(),
    '}',
    '',
  ].join('\n');
}

async function startNginx(readmeBlock, backends) {
  const dir = path.join(workdir(), 'nginx');
  fs.mkdirSync(dir, { recursive: true });
  const port = await freePort();
  const block = substitute('nginx', readmeBlock, NGINX_SUBSTITUTIONS({ portA: backends.A, portB: backends.B, port }));
  const conf = path.join(dir, 'nginx.conf');
  fs.writeFileSync(conf, nginxFrame(dir, block));
  const errorLog = path.join(workdir(), 'nginx-error.log');
  const args = [
    '-p', `${dir}/`, '-c', conf, '-e', errorLog,
    '-g', `daemon off; pid ${path.join(dir, 'nginx.pid')}; error_log ${errorLog} info;`,
  ];
  // -t first, so a README block nginx refuses fails with nginx's own words.
  try {
    execFileSync(NGINX, [...args, '-t'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    throw new Error(`nginx -t refused the config built from the README's block:\n${e.stderr || e.message}\n---- ${conf}\n${fs.readFileSync(conf, 'utf8')}`);
  }
  const child = start('nginx', NGINX, args);
  await waitForPort(port, child);
  return { child, port, conf };
}

// ---------------------------------------------------------------- HTTP
/**
 * One request on a connection of its own (so that cutting it cuts exactly
 * this exchange), with the Host header we choose. Resolves once the
 * response headers are in; the body is left to the caller.
 */
function send(port, method, { host, headers = {}, body, path: target = '/mcp' } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port, path: target, method, agent: false,
      headers: { host, ...headers, ...(body ? { 'content-type': 'application/json' } : {}) },
    }, (res) => resolve({ req, res, status: res.statusCode, headers: res.headers }));
    req.on('error', reject);
    req.end(body ? JSON.stringify(body) : undefined);
  });
}

const text = async (res) => {
  let s = '';
  for await (const chunk of res) s += chunk;
  return s;
};

const mcpHeaders = (session) => ({
  accept: 'application/json, text/event-stream',
  ...(session ? { 'mcp-session-id': session, 'mcp-protocol-version': PROTOCOL } : {}),
});

const initializeBody = (id) => ({
  jsonrpc: '2.0', id, method: 'initialize',
  params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'interop-o-nginx', version: '0' } },
});

/** The first JSON-RPC message of a JSON or SSE body. */
function firstMessage(contentType, body) {
  if (!contentType?.includes('text/event-stream')) return JSON.parse(body);
  const data = body.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim());
  return data.map((d) => { try { return JSON.parse(d); } catch { return undefined; } }).find(Boolean);
}

/** Runs one named step; an exception says which step it came from. */
async function step(name, fn) {
  log(`-- ${name}`);
  try {
    return await fn();
  } catch (e) {
    throw new Error(`step "${name}" failed: ${e?.message ?? e}`);
  }
}

const ourKeys = (redis) => redis.keys(`${PREFIX}:*`, `{${PREFIX}:*`);

await runScenario('o-nginx: the README\'s scale-out example (nginx + two instances on Redis) as printed; a call on one instance, its resume on the other', async (checks) => {
  let redis;
  try {
    redis = await Redis.connect(REDIS_URL);
    if ((await redis.command('PING')) !== 'PONG') throw new Error('PING was not answered with PONG');
  } catch (e) {
    redis?.close();
    throw new Error(`the Redis at REDIS_URL=${REDIS_URL} did not answer PING: ${e?.message ?? e}`);
  }
  const proxies = [];
  try {
    // ---------------------------------------------------------- the README's two blocks
    const readme = await step('read the README\'s scale-out blocks', async () => readmeBlocks());
    const everything = await step('start server-everything (streamableHttp)', () => startEverythingHttp());
    log('server-everything at', everything.url);
    const config = await step('write proxy.toml from the README\'s ```toml block', async () => {
      const keyFile = path.join(workdir(), 'token.key');
      fs.writeFileSync(keyFile, randomBytes(32), { mode: 0o600 });
      const file = path.join(workdir(), 'proxy.toml');
      fs.writeFileSync(file, substitute('toml', readme.toml, TOML_SUBSTITUTIONS({ redisUrl: REDIS_URL, keyFile, upstreamUrl: everything.url })));
      return file;
    });
    log(`proxy.toml (${config}):\n${fs.readFileSync(config, 'utf8').trimEnd()}`);

    // As the README's ```sh block: --config proxy.toml --listen 127.0.0.1:<port> --data-dir <dir>.
    await step('start instances A and B on the README\'s TOML', async () => {
      for (const name of ['A', 'B']) {
        const p = await startProxy({ name: `proxy-${name}`, extraArgs: ['--config', config] });
        p.name = name;
        proxies.push(p);
        log(`proxy ${name} at 127.0.0.1:${p.port} (log ${p.child.logFile})`);
      }
    });
    const listens = [...readme.sh.matchAll(/--listen (\S+)/g)].map((m) => m[1]);
    checks.ok(
      ['127.0.0.1:8081', '127.0.0.1:8082'].every((a) => listens.includes(a)),
      `the README's instances listen where its nginx block sends (--listen ${listens.join(', ') || 'none'})`,
    );
    const instanceOf = (addr) => proxies.find((p) => addr === `127.0.0.1:${p.port}`)?.name ?? `?(${addr ?? 'no X-Served-By header'})`;

    const nginx = await step('start nginx with the README\'s ```nginx block', () => startNginx(readme.nginx, { A: proxies[0].port, B: proxies[1].port }));
    log(`nginx ${NGINX} on 127.0.0.1:${nginx.port} (config ${nginx.conf})`);

    // ---------------------------------------------------------- through nginx
    await step('initialize through nginx by its loopback address (a try on one machine)', async () => {
      const r = await send(nginx.port, 'POST', { host: `127.0.0.1:${nginx.port}`, headers: mcpHeaders(), body: initializeBody(1) });
      const body = await text(r.res);
      checks.ok(r.status === 200 && r.headers['mcp-session-id'],
        `initialize with Host 127.0.0.1:${nginx.port} -> ${r.status} (served by ${instanceOf(r.headers['x-served-by'])}), session ${r.headers['mcp-session-id'] ?? 'none'}`,
        body.slice(0, 300));
    });

    const session = await step(`initialize through nginx as a client of ${PUBLIC_HOST}`, async () => {
      const r = await send(nginx.port, 'POST', { host: PUBLIC_HOST, headers: mcpHeaders(), body: initializeBody(1) });
      const body = await text(r.res);
      const sid = r.headers['mcp-session-id'];
      const m = r.status === 200 ? firstMessage(r.headers['content-type'], body) : undefined;
      checks.ok(r.status === 200 && sid && m?.result?.protocolVersion,
        `initialize with Host ${PUBLIC_HOST} -> ${r.status} (served by ${instanceOf(r.headers['x-served-by'])}; not 403: nginx passed the name on and the instance believed it)`,
        body.slice(0, 300));
      if (!sid) throw new Error(`no session (${r.status}: ${body.slice(0, 200)})`);
      const n = await send(nginx.port, 'POST', { host: PUBLIC_HOST, headers: mcpHeaders(sid), body: { jsonrpc: '2.0', method: 'notifications/initialized' } });
      await text(n.res);
      checks.ok(n.status === 202, `notifications/initialized -> ${n.status} (served by ${instanceOf(n.headers['x-served-by'])})`);
      return sid;
    });

    const seen = []; // {id, m, via}
    const call = await step('a long tool call through nginx, cut after its first events', async () => {
      const t0 = Date.now();
      const r = await send(nginx.port, 'POST', {
        host: PUBLIC_HOST,
        headers: mcpHeaders(session),
        body: {
          jsonrpc: '2.0', id: CALL_ID, method: 'tools/call',
          params: { name: 'trigger-long-running-operation', arguments: { duration: DURATION_S, steps: STEPS }, _meta: { progressToken: 'o-nginx' } },
        },
      });
      const by = instanceOf(r.headers['x-served-by']);
      if (r.status !== 200 || !r.headers['content-type']?.includes('text/event-stream')) {
        throw new Error(`tools/call -> ${r.status} ${r.headers['content-type']} (served by ${by}): ${(await text(r.res)).slice(0, 300)}`);
      }
      let cutAt;
      for await (const ev of sseEvents(r.res)) {
        const m = message(ev);
        if (!m) continue;
        seen.push({ id: ev.id, m, via: `POST on ${by}` });
        if (m.method === 'notifications/progress') log(`POST stream (${by}): progress ${m.params.progress} (id ${ev.id})`);
        if (m.method === 'notifications/progress' && m.params.progress === CUT_AFTER) {
          cutAt = Date.now() - t0;
          break;
        }
      }
      // Cut: the client's connection to nginx drops mid-stream.
      r.res.destroy();
      r.req.destroy();
      checks.ok(cutAt !== undefined && cutAt < DURATION_S * 1000 - 1000,
        `progress 1..${CUT_AFTER} arrived through nginx from instance ${by} by +${cutAt} ms, before the call's end at +${DURATION_S * 1000} ms (SSE not buffered); connection cut`);
      return { by, lastId: seen.at(-1)?.id };
    });
    if (!call.lastId) throw new Error('the tool call\'s events carried no event id to resume from');

    const resume = await step('resume through nginx with Last-Event-ID until the other instance serves it', async () => {
      const landed = [];
      for (let i = 1; i <= MAX_RESUME_TRIES; i++) {
        const r = await send(nginx.port, 'GET', {
          host: PUBLIC_HOST,
          headers: { accept: 'text/event-stream', 'mcp-session-id': session, 'mcp-protocol-version': PROTOCOL, 'last-event-id': call.lastId },
        });
        const by = instanceOf(r.headers['x-served-by']);
        landed.push(`${by} ${r.status}`);
        if (by === call.by || !proxies.some((p) => p.name === by)) {
          // Round robin gave it to the call's own instance: drop it unread
          // and ask again (its Last-Event-ID is the same, so nothing is lost).
          log(`resume attempt ${i}: served by ${by} (${r.status}); dropped unread, asking again`);
          r.res.destroy();
          r.req.destroy();
          continue;
        }
        log(`resume attempt ${i}: served by ${by} (${r.status})`);
        if (r.status !== 200) throw new Error(`GET Last-Event-ID -> ${r.status} on ${by}: ${(await text(r.res)).slice(0, 300)}`);
        const deadline = setTimeout(() => r.res.destroy(new Error('no result within 15 s')), 15000);
        try {
          for await (const ev of sseEvents(r.res)) {
            const m = message(ev);
            if (!m) continue;
            seen.push({ id: ev.id, m, via: `GET on ${by}` });
            log(`resumed GET (${by}): ${m.method === 'notifications/progress' ? `progress ${m.params.progress}` : m.id === CALL_ID ? 'the result' : JSON.stringify(m).slice(0, 120)} (id ${ev.id})`);
            if (m.id === CALL_ID) break;
          }
        } finally {
          clearTimeout(deadline);
          r.res.destroy();
        }
        return { by, attempts: i, landed };
      }
      throw new Error(`${MAX_RESUME_TRIES} resumes never reached the instance other than ${call.by}: ${landed.join(', ')}`);
    });
    checks.ok(resume.by !== call.by,
      `the call's events came from instance ${call.by}, its resume from instance ${resume.by} (attempts: ${resume.landed.join(', ')})`);

    const progress = seen.filter((s) => s.m.method === 'notifications/progress').map((s) => s.m.params.progress);
    checks.progressExactlyOnce(progress, STEPS, `the call (through nginx, cut on ${call.by}, resumed on ${resume.by})`);
    const results = seen.filter((s) => s.m.id === CALL_ID);
    checks.ok(results.length === 1 && /completed/.test(results[0].m.result?.content?.[0]?.text ?? ''),
      `the result arrived exactly once (${results.map((r) => r.via).join(', ') || 'never'})`, JSON.stringify(results.map((r) => r.m)).slice(0, 300));
    const ids = seen.map((s) => s.id).filter(Boolean);
    checks.ok(new Set(ids).size === ids.length, `no event id delivered twice (${ids.length} ids)`);

    await step('DELETE the session through nginx', async () => {
      const r = await send(nginx.port, 'DELETE', { host: PUBLIC_HOST, headers: mcpHeaders(session) });
      await text(r.res);
      checks.ok(r.status >= 200 && r.status < 300, `DELETE -> ${r.status} (served by ${instanceOf(r.headers['x-served-by'])})`);
    });

    await step('OAuth discovery through nginx', async () => {
      // The README's location covers the discovery paths the proxy routes to
      // the upstream (server-everything has no OAuth: its answer is a 404,
      // but one an instance gave, not nginx).
      const target = '/.well-known/oauth-protected-resource/mcp';
      const r = await send(nginx.port, 'GET', { host: PUBLIC_HOST, path: target });
      await text(r.res);
      const by = instanceOf(r.headers['x-served-by']);
      checks.ok(proxies.some((p) => p.name === by), `GET ${target} reached instance ${by} through nginx (${r.status})`);
    });

    // ---------------------------------------------------------- straight at the instances
    await step(`a foreign Host (${FOREIGN_HOST}) straight at each instance`, async () => {
      for (const p of proxies) {
        const r = await send(p.port, 'POST', { host: FOREIGN_HOST, headers: mcpHeaders(), body: initializeBody(1) });
        const body = await text(r.res);
        let said;
        try { said = JSON.parse(body).error?.message; } catch { said = body.slice(0, 120); }
        checks.ok(r.status === 403 && /Host not allowed/.test(said ?? ''),
          `instance ${p.name} refuses Host ${FOREIGN_HOST} from a client straight at it: ${r.status} ${said}`);
      }
    });

    log(`nginx access log (which instance served what):\n${tail(path.join(workdir(), 'nginx-access.log'), 20)
      .split('\n').filter(Boolean).map((l) => `    ${l.replace(/upstream=(\S+)/, (_, a) => `upstream=${a} (${instanceOf(a.replace(/,$/, ''))})`)}`).join('\n')}`);
  } finally {
    // Stop the instances (so nothing writes any more), then delete this run's keys.
    await Promise.all(proxies.map((p) => stop(p.child, 6000)));
    try {
      const n = await redis.del(await ourKeys(redis));
      log(`redis: deleted ${n} key(s) under ${PREFIX}`);
    } catch (e) {
      log(`redis: could not delete the keys under ${PREFIX}: ${e?.message ?? e}`);
    }
    redis.close();
  }
}, { timeoutMs: 60000 });
