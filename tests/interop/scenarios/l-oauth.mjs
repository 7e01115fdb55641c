// Scenario l: an OAuth-protected MCP server, direct and through the proxy.
//
// The server is the TS SDK's own example `simpleStreamableHttp.js --oauth`
// (MCP_PORT / MCP_AUTH_PORT from the environment; it names itself
// http://localhost:<port>/mcp and brings a demo authorization server on
// http://localhost:<auth port> with dynamic client registration, PKCE and an
// open /introspect that its token verifier calls). The client is the SDK's
// Client + StreamableHTTPClientTransport with an OAuthClientProvider
// (lib/oauthclient.mjs) whose browser step is a headless fetch.
//
//   direct:  SDK client --> http://localhost:<mcp>/mcp           (--> AS on localhost:<auth>)
//   proxy:   SDK client --> http://127.0.0.1:<proxy>/mcp --> mcp-resume-proxy --> http://localhost:<mcp>/mcp
//
// Steps, each phase: discovery (401 + resource_metadata, protected resource
// metadata whose `resource` is the URL the client used), registration,
// authorization (resource indicator = that URL), token, tools/list, a long
// call (start-notification-stream: its notifications come on the session's
// GET stream, one every INTERVAL ms; its result on the POST stream). Then a
// second access token for the same client (the demo authorization server
// issues no refresh token, so the SDK's auth() authorizes again); a long call
// started under the first token, both its streams cut (fetch aborted) after
// its first notification, resumed by the SDK with GET Last-Event-ID under the
// second token: every notification and the result exactly once; the same
// session answers under the second token. Through the proxy also: the same
// with kill -9 of the proxy and a restart on the same data_dir; and a second
// user's token (another registered client) on that session.
//
// Two proxy phases. `proxy`: the default `principal = "token"`; this server
// accepts any valid token on any session (it does not tie a session to a
// client), so the proxy, never laxer than the upstream, lets bob's token in
// too — reported, as direct. `proxy-introspection`: `[auth] principal =
// "introspection"` against the demo authorization server's /introspect, the
// person named by `client_id` (its tokens carry no `sub`): alice's new tokens
// keep her session, bob's gets 404.
import fs from 'node:fs';
import path from 'node:path';
import { CallToolResultSchema, LoggingMessageNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import {
  BIND_LOCALHOST, NODE_MODULES, PROXY_BIN, freePort, log, runScenario, sleep, start, tail, waitForPort, workdir,
} from '../lib/harness.mjs';
import { HeadlessOAuthProvider, anotherToken, connectWithOAuth, recordingFetch } from '../lib/oauthclient.mjs';
import { short } from '../lib/tsclient.mjs';

const SERVER_JS = path.join(NODE_MODULES, '@modelcontextprotocol', 'sdk', 'dist', 'esm', 'examples', 'server', 'simpleStreamableHttp.js');
const COUNT = 8;
const INTERVAL = 400;
const only = process.argv[2]; // 'direct' | 'proxy' | undefined (both)

await runScenario(`l-oauth${only ? ` (${only})` : ''}: TS SDK OAuth client vs the SDK's simpleStreamableHttp --oauth, direct and through the proxy`, async (checks) => {
  const mcpPort = await freePort();
  let authPort = await freePort();
  while (authPort === mcpPort) authPort = await freePort();
  const server = start('oauth-server', process.execPath, ['-r', BIND_LOCALHOST, SERVER_JS, '--oauth'], {
    env: { MCP_PORT: String(mcpPort), MCP_AUTH_PORT: String(authPort) },
  });
  await waitForPort(mcpPort, server);
  await waitForPort(authPort, server);
  const serverUrl = `http://localhost:${mcpPort}/mcp`;
  const asUrl = `http://localhost:${authPort}/`;
  log(`simpleStreamableHttp --oauth at ${serverUrl}; its authorization server at ${asUrl}`);

  if (only !== 'proxy') {
    console.log('-- DIRECT: client -> the server');
    await phase(checks, 'direct', serverUrl, asUrl, undefined);
  }
  if (only !== 'direct') {
    console.log('-- THROUGH THE PROXY: client -> proxy (public URL http://127.0.0.1:<port>/mcp) -> the server (http://localhost:<port>/mcp)');
    const proxy = await startOAuthProxy(serverUrl, []);
    await phase(checks, 'proxy', proxy.url, asUrl, proxy);
    await proxy.kill9();
    console.log('-- THROUGH THE PROXY, principal = "introspection" (the person is the client_id)');
    const verified = await startOAuthProxy(serverUrl, [
      '[auth]',
      'principal = "introspection"',
      '[auth.introspection]',
      `endpoint = "${asUrl}introspect"`,
      'client_id = "mcp-resume-proxy"',
      'client_secret_env = "INTROSPECTION_SECRET"',
      'claim = "client_id"',
    ]);
    await phase(checks, 'proxy-introspection', verified.url, asUrl, verified, { bobRefused: true });
  }
}, { timeoutMs: 150000 });

// ---------------------------------------------------------------- the proxy
async function startOAuthProxy(upstreamUrl, authToml) {
  const port = await freePort();
  const dataDir = path.join(workdir(), `proxy-data-${port}`);
  const configFile = path.join(workdir(), `proxy-${port}.toml`);
  fs.writeFileSync(configFile, [
    `listen = "127.0.0.1:${port}"`,
    `data_dir = "${dataDir}"`,
    '[[upstream]]',
    'path = "/mcp"',
    `url = "${upstreamUrl}"`,
    ...authToml,
    '',
  ].join('\n'));
  const proxy = { port, dataDir, configFile, url: `http://127.0.0.1:${port}/mcp`, generation: 0 };
  proxy.start = async () => {
    proxy.generation += 1;
    proxy.child = start(`proxy-${proxy.generation}`, PROXY_BIN, ['--config', configFile],
      { env: { RUST_LOG: process.env.RUST_LOG ?? 'mcp_resume_proxy=debug,info', INTROSPECTION_SECRET: 'unused-by-the-demo' } });
    await waitForPort(port, proxy.child);
    const deadline = Date.now() + 10000;
    for (;;) {
      try {
        const r = await fetch(`http://127.0.0.1:${port}/healthz`);
        await r.text();
        if (r.ok) return;
      } catch {
        /* not yet */
      }
      if (Date.now() > deadline) throw new Error(`proxy /healthz not ready; log:\n${tail(proxy.child.logFile)}`);
      await sleep(50);
    }
  };
  proxy.kill9 = async () => {
    proxy.child.kill('SIGKILL');
    await proxy.child.exited;
  };
  await proxy.start();
  log(`proxy at ${proxy.url} (config ${configFile})`);
  return proxy;
}

// ---------------------------------------------------------------- one phase
async function phase(checks, label, url, asUrl, proxy, { bobRefused = false } = {}) {
  const ok = (cond, what, detail) => checks.ok(cond, `[${label}] ${what}`, detail);
  const origin = new URL(url).origin;
  const requests = [];
  const f = recordingFetch(requests);
  const alice = new HeadlessOAuthProvider('alice', requests);
  const notes = [];
  const onNotification = (client) => client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
    const m = /Periodic notification #(\d+)/.exec(String(n.params.data));
    if (m) notes.push(Number(m[1]));
  });

  // 1. discovery -> registration -> authorization -> token -> MCP
  let conn;
  try {
    conn = await connectWithOAuth(url, alice, f, { onNotification });
  } catch (e) {
    ok(false, `OAuth connect: ${e?.message ?? e}`);
  }
  const find = (pred) => requests.find(pred);
  const first401 = find((r) => r.method === 'POST' && r.url === url && r.status === 401);
  const rm = /resource_metadata="([^"]+)"/.exec(first401?.wwwAuthenticate ?? '')?.[1];
  ok(first401 !== undefined, `the first POST ${url} got 401 (no token yet)`, requests.filter((r) => r.url === url).map((r) => r.status));
  ok(rm === `${origin}/.well-known/oauth-protected-resource/mcp`,
    `its WWW-Authenticate names resource_metadata on the URL the client used (${origin}/.well-known/oauth-protected-resource/mcp)`,
    first401?.wwwAuthenticate);
  const prmReq = find((r) => r.path.startsWith('/.well-known/oauth-protected-resource'));
  ok(prmReq?.status === 200 && new URL(prmReq.url).origin === origin,
    `discovery: the client fetched ${prmReq?.url ?? 'no protected resource metadata'} -> ${prmReq?.status ?? '-'}`);
  const prm = await fetch(`${origin}/.well-known/oauth-protected-resource/mcp`).then(async (r) => (r.ok ? r.json() : { status: r.status }))
    .catch((e) => ({ error: String(e) }));
  ok(prm.resource === url, `the protected resource metadata says resource = ${url}`, prm);
  ok(JSON.stringify(prm.authorization_servers) === JSON.stringify([asUrl]),
    `...and authorization_servers = ["${asUrl}"] as the server wrote it`, prm.authorization_servers);
  const asMeta = find((r) => r.path === '/.well-known/oauth-authorization-server' && r.url.startsWith(asUrl.slice(0, -1)));
  ok(asMeta?.status === 200, `discovery: authorization server metadata ${asUrl}.well-known/oauth-authorization-server -> ${asMeta?.status ?? 'not fetched'}`);
  const reg = find((r) => r.method === 'POST' && r.path === '/register');
  ok(reg?.status === 201, `registration: POST ${asUrl}register -> ${reg?.status ?? 'not sent'} (client ${alice.clientInformation()?.client_id ?? '-'})`);
  const authz = find((r) => r.path === '/authorize');
  ok(authz?.status === 302 && authz.resource === url,
    `authorization: GET ${asUrl}authorize with resource=${url} -> 302 with a code`, authz);
  const tok = find((r) => r.method === 'POST' && r.path === '/token');
  ok(tok?.status === 200 && alice.tokens()?.access_token, `token: POST ${asUrl}token -> ${tok?.status ?? 'not sent'}`);
  if (!conn) {
    log(`[${label}] stopped after the OAuth flow failed; requests: ${requests.map((r) => `${r.method} ${r.url} ${r.status ?? r.error}`).join(' | ')}`);
    return;
  }
  const { client, transport } = conn;
  const sid = transport.sessionId;
  ok(Boolean(sid), `connected with a token: session ${sid}, protocol ${transport.protocolVersion}`);
  const { tools } = await client.listTools();
  ok(tools.some((t) => t.name === 'start-notification-stream'), `tools/list (${tools.length} tools) has start-notification-stream`);

  const t1 = alice.tokens();
  await longCall(checks, label, 'a long call under the first token', { client, transport, requests, f, notes });

  // 2. A second access token for the same client; a call started under the
  // first is cut after its first notification and resumed under the second.
  const t2 = await anotherToken(url, alice, f, { resourceMetadataUrl: conn.resourceMetadataUrl }).catch((e) => ok(false, `a second access token for ${alice.clientInformation()?.client_id}: ${e.message}`));
  if (!t2) return;
  ok(t2.access_token !== t1.access_token, `a second access token for the same client (${short(t1.access_token)} -> ${short(t2.access_token)})`);
  await longCall(checks, label, 'a call started under the first token, cut, resumed under the second', {
    client, transport, requests, f, notes,
    onCut: () => { alice.saveTokens(t2); },
  });
  await sameSessionAnswers(checks, label, 'under the second token', { client, transport, requests, sid, token: t2.access_token });

  // 3. The same across kill -9 of the proxy (a third token for the resume).
  if (proxy) {
    const t3 = await anotherToken(url, alice, f, { resourceMetadataUrl: conn.resourceMetadataUrl }).catch((e) => ok(false, `a third access token: ${e.message}`));
    if (!t3) return;
    await longCall(checks, label, 'a call under the second token, proxy killed -9 and restarted, resumed under a third', {
      client, transport, requests, f, notes,
      onCut: async () => {
        alice.saveTokens(t3);
        await proxy.kill9();
        log(`[${label}] proxy killed with SIGKILL; restarting on the same data_dir`);
        await proxy.start();
        log(`[${label}] proxy restarted (generation ${proxy.generation})`);
      },
      cutBy: 'kill',
    });
    await sameSessionAnswers(checks, label, 'after the restart, under the third token', { client, transport, requests, sid, token: t3.access_token });
  }

  // 4. Another user (another registered client) on this session.
  const bobRequests = [];
  const bob = new HeadlessOAuthProvider('bob', bobRequests);
  const bobConn = await connectWithOAuth(url, bob, recordingFetch(bobRequests, { quiet: true })).catch((e) => ok(false, `bob's OAuth connect: ${e.message}`));
  if (bobConn) {
    ok(bob.clientInformation().client_id !== alice.clientInformation().client_id,
      `a second user registered as another client (${bob.clientInformation().client_id}) and has his own session ${bobConn.transport.sessionId}`);
    const bobToken = bob.tokens().access_token;
    const post = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${bobToken}`,
        'mcp-session-id': sid, 'mcp-protocol-version': transport.protocolVersion },
      body: JSON.stringify({ jsonrpc: '2.0', id: 9001, method: 'tools/list' }),
    });
    await post.text();
    const lastId = requests.filter((r) => r.lastEventId).at(-1)?.lastEventId;
    const ac = new AbortController();
    const timer = setTimeout(() => ac.abort(), 2000);
    const get = await fetch(url, {
      headers: { accept: 'text/event-stream', authorization: `Bearer ${bobToken}`, 'mcp-session-id': sid,
        'mcp-protocol-version': transport.protocolVersion, ...(lastId ? { 'last-event-id': lastId } : {}) },
      signal: ac.signal,
    }).catch((e) => ({ status: `error ${e.name}` }));
    ac.abort();
    clearTimeout(timer);
    if (bobRefused) {
      ok(post.status === 404, `bob's token on alice's session: POST tools/list -> ${post.status} (expected 404)`);
      ok(get.status === 404, `bob's token on alice's session: GET Last-Event-ID=${short(lastId)} -> ${get.status} (expected 404)`);
    } else if (proxy) {
      log(`[${label}] note: with principal = "token" the proxy is as strict as this upstream, which takes any valid token on any session: bob's token on alice's session -> POST ${post.status}, GET ${get.status}`);
    } else {
      log(`[${label}] note: the server itself does not tie a session to a client: bob's token on alice's session -> POST ${post.status}, GET ${get.status}`);
    }
    // Whatever bob got, the session is still alice's.
    await sameSessionAnswers(checks, label, 'to alice after bob\'s attempt', { client, transport, requests, sid, token: alice.tokens().access_token });
    await bobConn.transport.terminateSession().catch(() => {});
    await bobConn.client.close();
  }
  await transport.terminateSession().catch((e) => log(`[${label}] terminate: ${e.message}`));
  await client.close();
}

/**
 * start-notification-stream {interval, count}: notifications #1..COUNT on the
 * GET stream, then the result on the POST stream. With onCut: after
 * notification #1 (the POST stream has had its first event by then), onCut()
 * runs and every live SSE response is aborted (or the proxy is killed), and
 * the SDK must resume both streams with GET Last-Event-ID.
 */
async function longCall(checks, label, what, { client, transport, requests, f, notes, onCut, cutBy = 'abort' }) {
  const ok = (cond, msg, detail) => checks.ok(cond, `[${label}] ${what}: ${msg}`, detail);
  notes.length = 0;
  const t0 = Date.now();
  const postTokens = [];
  let cut;
  let errorsBefore = 0;
  const errors = [];
  const prevOnerror = client.onerror;
  client.onerror = (e) => { errors.push(String(e?.message ?? e)); prevOnerror?.(e); };
  const watchCut = onCut ? (async () => {
    // The first event of the call's POST stream (its priming event: an id, no
    // data) and the first notification (on the GET stream): the call is running.
    while ((notes.length === 0 || postTokens.length === 0) && Date.now() - t0 < 15000) await sleep(10);
    if (notes.length === 0 || postTokens.length === 0) return;
    cut = { at: Date.now(), afterNote: notes.at(-1), postToken: postTokens.at(-1) };
    errorsBefore = errors.length;
    await onCut();
    if (cutBy === 'abort') {
      cut.n = f.cut();
      log(`[${label}] cut ${cut.n} live SSE connection(s) after notification #${cut.afterNote} (POST stream's last event id ${short(cut.postToken)})`);
    }
  })() : Promise.resolve();
  let result;
  try {
    result = await client.request(
      { method: 'tools/call', params: { name: 'start-notification-stream', arguments: { interval: INTERVAL, count: COUNT } } },
      CallToolResultSchema,
      // Bounded: a resume the SDK gives up on (e.g. after 404s) would otherwise hold the call 60 s.
      { timeout: COUNT * INTERVAL + 9000, onresumptiontoken: (t) => postTokens.push(t) },
    );
  } catch (e) {
    ok(false, `the call failed: ${e.message}`);
  }
  const took = Date.now() - t0;
  await watchCut;
  // The GET stream's last notifications may trail the result by a moment.
  const deadline = Date.now() + 3000;
  while (notes.length < COUNT && Date.now() < deadline) await sleep(50);
  client.onerror = prevOnerror;
  const text = result?.content?.[0]?.text ?? '';
  if (onCut) ok(cut !== undefined && (cutBy !== 'abort' || cut.n >= 1), `the streams were cut after notification #${cut?.afterNote} (${cutBy === 'abort' ? `${cut?.n} connection(s) aborted` : 'kill -9'})`);
  // The notifications come on the session's GET stream; the example server's
  // InMemoryEventStore cannot replay that stream (it takes the stream id of an
  // event id `_GET_stream_<ms>_<rand>` as the text before its first '_', i.e.
  // ''), so those sent while a client is away are lost unless something in
  // between kept them: reported, not checked. The call's own POST stream
  // (priming event, then the result) is what the checks below are about.
  const inOrder = notes.every((n, i) => i === 0 || notes[i - 1] < n);
  ok(inOrder && new Set(notes).size === notes.length, `GET-stream notifications never duplicated or reordered (got #${notes.join(',#')})`);
  if (notes.length !== COUNT) log(`[${label}] ${what}: note: ${COUNT - notes.length} of ${COUNT} notifications did not reach the client (GET stream not replayable upstream)`);
  ok(/Started sending periodic notifications/.test(text), `the result arrived (${took} ms; the call takes ${COUNT * INTERVAL} ms)`, result);
  ok(!errors.some((e) => /unknown message ID/i.test(e)), 'the result was delivered once (no response for an unknown id)', errors);
  if (cut) {
    const after = requests.filter((r) => r.at >= cut.at && r.method === 'GET' && r.lastEventId);
    const postResume = after.find((r) => r.lastEventId === cut.postToken);
    ok(postResume?.status === 200,
      `the SDK resumed the call's POST stream with GET Last-Event-ID=${short(cut.postToken)} -> ${postResume?.status ?? 'not sent'}${postResume?.token ? ` (token ${short(postResume.token)})` : ''}`,
      after.map((r) => ({ lastEventId: short(r.lastEventId), status: r.status, error: r.error })));
    ok(after.filter((r) => r.status === 200).every((r) => r.token === transport._authProvider.tokens().access_token),
      'every resume carried the new token', after.map((r) => short(r.token)));
    log(`[${label}] client errors during the cut (expected: disconnects): ${errors.slice(errorsBefore).join(' | ') || '(none)'}`);
  }
}

async function sameSessionAnswers(checks, label, what, { client, transport, requests, sid, token }) {
  const n = requests.length;
  let good = false;
  try {
    const { tools } = await client.listTools();
    good = tools.length > 0;
  } catch (e) {
    log(`[${label}] tools/list ${what}: ${e.message}`);
  }
  const sent = requests.slice(n).find((r) => r.method === 'POST' && r.body === 'tools/list');
  checks.ok(good && sent?.sessionId === sid && sent?.token === token && transport.sessionId === sid,
    `[${label}] the same Mcp-Session-Id ${short(sid)} answers tools/list ${what} (token ${short(token)})`,
    { status: sent?.status, session: sent?.sessionId, token: short(sent?.token) });
}
