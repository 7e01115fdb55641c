// Scenario m: the official Python SDK (mcp 2.x) OAuth client against an
// OAuth-protected Python SDK 2.x server, direct and through the proxy.
//
//   py_oauth_client.py (OAuthClientProvider + mcp.Client, mode="legacy")
//       --> [mcp-resume-proxy, public URL http://127.0.0.1:<proxy>/mcp] -->
//   lib/py_oauth_server.py: MCPServer with AuthSettings + an introspecting TokenVerifier
//       (http://localhost:<port>/mcp), and a tiny authorization server on the SDK's
//       own AS routes (http://localhost:<auth port>/: registration, PKCE, refresh tokens)
//
// Steps, each phase: 401 + resource_metadata, protected resource metadata,
// authorization server metadata, registration, authorization (resource =
// the URL the client used), token, tools/list, a tool call with progress;
// after the access token's lifetime (ACCESS_TTL s) the provider refreshes
// it before the next request, and that request (a tool call) must still be
// served on the same Mcp-Session-Id; a second user's token on the first
// user's session gets 404 (the Python server itself binds a session to the
// principal client_id/iss/sub; through the proxy the answer must be the same).
// Third phase: the server is its own authorization server and is told the
// proxy's public URL; the proxy forwards its discovery documents untouched
// and the authorization paths listed in `passthrough`.
import path from 'node:path';
import fs from 'node:fs';
import readline from 'node:readline';
import {
  INTEROP_DIR, PROXY_BIN, PYTHON, freePort, log, runScenario, sleep, start, stop, tail, waitForPort, workdir,
} from '../lib/harness.mjs';

const ACCESS_TTL = 3;
const only = process.argv[2]; // 'direct' | 'proxy' | 'own-as' | undefined (all three)
const short = (t) => (t && t.length > 14 ? `${t.slice(0, 8)}…${t.slice(-4)}` : t);

await runScenario(`m-py-oauth${only ? ` (${only})` : ''}: Python SDK OAuthClientProvider vs a Python SDK server with auth settings, direct and through the proxy`, async (checks) => {
  let server;
  let serverUrl;
  let asUrl;
  if (only === undefined || only === 'direct' || only === 'proxy') {
    const port = await freePort();
    let authPort = await freePort();
    while (authPort === port) authPort = await freePort();
    server = start('py-oauth-server', PYTHON, [path.join(INTEROP_DIR, 'lib', 'py_oauth_server.py'),
      '--port', String(port), '--auth-port', String(authPort), '--access-ttl', String(ACCESS_TTL)]);
    await waitForPort(port, server, 30000);
    await waitForPort(authPort, server, 30000);
    serverUrl = `http://localhost:${port}/mcp`;
    asUrl = `http://localhost:${authPort}/`;
    log(`Python SDK server at ${serverUrl}; its authorization server at ${asUrl}`);
  }
  if (only === undefined || only === 'direct') {
    console.log('-- DIRECT: Python client -> the server');
    await phase(checks, 'direct', serverUrl, asUrl);
  }
  if (only === undefined || only === 'proxy') {
    console.log('-- THROUGH THE PROXY: Python client -> proxy (http://127.0.0.1:<port>/mcp) -> the server (http://localhost:<port>/mcp)');
    const proxyPort = await freePort();
    const configFile = path.join(workdir(), 'proxy.toml');
    fs.writeFileSync(configFile, [
      `listen = "127.0.0.1:${proxyPort}"`,
      `data_dir = "${path.join(workdir(), 'proxy-data')}"`,
      '[[upstream]]',
      'path = "/mcp"',
      `url = "${serverUrl}"`,
      '',
    ].join('\n'));
    const proxy = start('proxy', PROXY_BIN, ['--config', configFile], { env: { RUST_LOG: process.env.RUST_LOG ?? 'mcp_resume_proxy=debug,info' } });
    await waitForPort(proxyPort, proxy);
    await phase(checks, 'proxy', `http://127.0.0.1:${proxyPort}/mcp`, asUrl);
    await stop(proxy);
  }
  if (only === undefined || only === 'own-as') {
    // The server is its own authorization server and is told its public URL
    // (the proxy's): the proxy passes its metadata untouched and forwards
    // the listed authorization paths.
    console.log('-- THROUGH THE PROXY, the server its own authorization server: Python client -> proxy (passthrough /authorize /token /register) -> the server');
    if (server) await stop(server);
    const proxyPort = await freePort();
    const publicUrl = `http://127.0.0.1:${proxyPort}/mcp`;
    const ownPort = await freePort();
    const own = start('py-oauth-server-own-as', PYTHON, [path.join(INTEROP_DIR, 'lib', 'py_oauth_server.py'),
      '--port', String(ownPort), '--own-as', '--public-url', publicUrl, '--access-ttl', String(ACCESS_TTL)]);
    await waitForPort(ownPort, own, 30000);
    const configFile = path.join(workdir(), 'proxy-own-as.toml');
    fs.writeFileSync(configFile, [
      `listen = "127.0.0.1:${proxyPort}"`,
      `data_dir = "${path.join(workdir(), 'proxy-own-as-data')}"`,
      '[[upstream]]',
      'path = "/mcp"',
      `url = "http://localhost:${ownPort}/mcp"`,
      'passthrough = ["/authorize", "/token", "/register"]',
      '',
    ].join('\n'));
    const proxy = start('proxy-own-as', PROXY_BIN, ['--config', configFile], { env: { RUST_LOG: process.env.RUST_LOG ?? 'mcp_resume_proxy=debug,info' } });
    await waitForPort(proxyPort, proxy);
    await phase(checks, 'proxy, own AS', publicUrl, `http://127.0.0.1:${proxyPort}/`);
    await stop(proxy);
  }
}, { timeoutMs: 85000 });

async function phase(checks, label, url, asUrl) {
  const ok = (cond, what, detail) => checks.ok(cond, `[${label}] ${what}`, detail);
  const origin = new URL(url).origin;
  const py = start(`py_oauth_client-${label}`, PYTHON, [path.join(INTEROP_DIR, 'scenarios', 'py_oauth_client.py'), url, String(ACCESS_TTL)],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  py.stderr.on('data', (d) => { stderr += d; });
  const ev = [];
  for await (const line of readline.createInterface({ input: py.stdout })) {
    let e;
    try {
      e = JSON.parse(line);
    } catch {
      log('py:', line);
      continue;
    }
    ev.push(e);
    if (e.event === 'http') {
      log(`py http ${e.who} ${e.method} ${e.url}${e.body ? ` ${e.body}` : ''}${e.token ? ` token=${short(e.token)}` : ''}${e.session ? ` session=${short(e.session)}` : ''} -> ${e.status}`);
    } else {
      log('py', JSON.stringify(e).slice(0, 240));
    }
  }
  const { code } = await py.exited;
  const http = ev.filter((e) => e.event === 'http' && e.who === 'alice');
  const error = ev.find((e) => e.event === 'error');
  if (error) ok(false, `the Python client stopped: ${error.error}`);
  if (code !== 0) log(`py_oauth_client stderr:\n${stderr.split('\n').slice(-30).join('\n')}`);

  const first = http.find((e) => e.method === 'POST' && e.url === url);
  const rm = /resource_metadata="([^"]+)"/.exec(first?.www_authenticate ?? '')?.[1];
  ok(first?.status === 401, `the first POST ${url} got 401 (got ${first?.status})`);
  ok(rm === `${origin}/.well-known/oauth-protected-resource/mcp`, `its WWW-Authenticate names resource_metadata on the URL the client used (${origin}/.well-known/oauth-protected-resource/mcp)`, first?.www_authenticate);
  const prm = http.find((e) => e.url.includes('/.well-known/oauth-protected-resource'));
  ok(prm?.status === 200 && new URL(prm.url).origin === origin, `discovery: ${prm?.url ?? 'no protected resource metadata fetched'} -> ${prm?.status ?? '-'}`);
  const meta = await fetch(`${origin}/.well-known/oauth-protected-resource/mcp`).then(async (r) => (r.ok ? r.json() : { status: r.status })).catch((e) => ({ error: String(e) }));
  ok(meta.resource === url, `the protected resource metadata says resource = ${url}`, meta);
  ok(JSON.stringify(meta.authorization_servers) === JSON.stringify([asUrl]), `...and authorization_servers = ["${asUrl}"] as the server wrote it`, meta.authorization_servers);
  const asm = http.find((e) => e.url === `${asUrl}.well-known/oauth-authorization-server`);
  ok(asm?.status === 200, `discovery: authorization server metadata -> ${asm?.status ?? 'not fetched'}`);
  const reg = http.find((e) => e.method === 'POST' && e.url === `${asUrl}register`);
  ok(reg?.status === 201, `registration: POST ${asUrl}register -> ${reg?.status ?? 'not sent'}`);
  const authz = http.find((e) => e.url === `${asUrl}authorize`);
  ok(authz?.status === 302 && authz.resource === url, `authorization: GET ${asUrl}authorize with resource=${url} -> 302`, authz);
  const tok = http.find((e) => e.url === `${asUrl}token` && e.body === 'authorization_code');
  ok(tok?.status === 200, `token: POST ${asUrl}token (authorization_code) -> ${tok?.status ?? 'not sent'}`);

  const connected = ev.find((e) => e.event === 'connected');
  ok(connected !== undefined, `connected (protocol ${connected?.protocol})`);
  if (!connected) {
    log(`[${label}] stopped before the MCP session: tools/list, the tool call, the refresh and the second user were not run`);
    return;
  }
  const tools = ev.find((e) => e.event === 'tools');
  ok(tools?.names?.includes('slow-count'), `tools/list: ${tools?.names?.join(', ') ?? '-'}`);
  checks.progressExactlyOnce(ev.filter((e) => e.event === 'progress').map((e) => e.progress), 4, `[${label}] slow-count`);
  const result = ev.find((e) => e.event === 'result');
  ok(/counted to 4/.test(JSON.stringify(result?.result ?? '')), 'the tool call\'s result arrived');

  const sid = http.find((e) => e.session)?.session;
  const refresh = http.find((e) => e.url === `${asUrl}token` && e.body === 'refresh_token');
  ok(refresh?.status === 200, `after ${ACCESS_TTL} s the provider refreshed the access token by itself: POST ${asUrl}token (refresh_token) -> ${refresh?.status ?? 'not sent'}`);
  const echo = ev.find((e) => e.event === 'echo');
  const echoErr = ev.find((e) => e.event === 'echo-error');
  const echoReq = http.filter((e) => e.body === 'tools/call').at(-1);
  ok(echo && echo.token !== result?.token && /after the refresh/.test(JSON.stringify(echo.result)),
    `a tool call with the refreshed token (${short(echo?.token)}, was ${short(result?.token)}) was served`, echoErr?.error);
  ok(echoReq?.session === sid && echoReq?.token === echo?.token && echoReq?.status === 200,
    `...on the same Mcp-Session-Id ${short(sid)} (status ${echoReq?.status}, session ${short(echoReq?.session)})`);
  const bob = ev.find((e) => e.event === 'bob-connected');
  ok(bob && bob.client_id !== bob.alice_client_id, `a second user registered as another client (${bob?.client_id}) and connected`);
  const bobPost = ev.find((e) => e.event === 'bob-on-alice' && e.method === 'POST');
  const bobGet = ev.find((e) => e.event === 'bob-on-alice' && e.method === 'GET');
  ok(bobPost?.status === 404, `his token on the first user's session: POST -> ${bobPost?.status} (expected 404)`, bobPost?.body);
  ok(bobGet?.status === 404, `his token on the first user's session: GET -> ${bobGet?.status} (expected 404)`);
  const after = ev.find((e) => e.event === 'alice-after-bob');
  const afterReq = http.filter((e) => e.body === 'tools/call').at(-1);
  ok(/still alice/.test(JSON.stringify(after?.result ?? '')) && afterReq?.session === sid,
    `the session still answers the first user after that (session ${short(afterReq?.session)})`, after?.error);
  ok(code === 0 && ev.some((e) => e.event === 'closed'), `the Python client ran to its end (exit ${code})`);
  await sleep(10);
}
