// The official TS SDK client with OAuth, driven headlessly: an
// OAuthClientProvider whose "browser" is a fetch of the authorization URL
// (redirect: manual) that reads the code from the Location of the redirect,
// and the SDK's own flow around it (UnauthorizedError -> finishAuth ->
// connect again; auth() for a second token of the same client). Every HTTP
// request of the client (discovery, registration, authorization, token, MCP)
// is recorded, and the client's live SSE responses can be cut (their fetch
// aborted, which closes the TCP connection) to make the SDK resume by itself.
import crypto from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError, auth } from '@modelcontextprotocol/sdk/client/auth.js';
import { log } from './harness.mjs';
import { RECONNECTION, short } from './tsclient.mjs';

/** Where the demo authorization server is told to send the browser back; never fetched. */
export const REDIRECT_URL = 'http://localhost:9/oauth/callback';

/**
 * An OAuthClientProvider with in-memory storage (like the SDK's example
 * InMemoryOAuthClientProvider) whose redirect to the authorization server is
 * a headless fetch: it records the code, and the caller completes the flow.
 */
export class HeadlessOAuthProvider {
  constructor(name, recorder) {
    this.name = name;
    this.recorder = recorder;
    this._clientInformation = undefined;
    this._tokens = undefined;
    this._codeVerifier = undefined;
    this._state = undefined;
    this.pendingCode = undefined;
    this.authorizations = 0;
  }

  get redirectUrl() {
    return REDIRECT_URL;
  }

  get clientMetadata() {
    return {
      client_name: `interop ${this.name}`,
      redirect_uris: [REDIRECT_URL],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_post',
    };
  }

  state() {
    this._state = crypto.randomBytes(12).toString('hex');
    return this._state;
  }

  clientInformation() {
    return this._clientInformation;
  }

  saveClientInformation(info) {
    this._clientInformation = info;
  }

  tokens() {
    return this._tokens;
  }

  saveTokens(tokens) {
    this._tokens = tokens;
    log(`${this.name}: got access token ${short(tokens.access_token)}${tokens.refresh_token ? ' (with a refresh token)' : ' (no refresh token)'}`);
  }

  saveCodeVerifier(v) {
    this._codeVerifier = v;
  }

  codeVerifier() {
    if (!this._codeVerifier) throw new Error('no code verifier saved');
    return this._codeVerifier;
  }

  invalidateCredentials(scope) {
    if (scope === 'all' || scope === 'client') this._clientInformation = undefined;
    if (scope === 'all' || scope === 'tokens') this._tokens = undefined;
    if (scope === 'all' || scope === 'verifier') this._codeVerifier = undefined;
  }

  /** The "browser": GET the authorization URL, read the code from the redirect. */
  async redirectToAuthorization(url) {
    this.authorizations += 1;
    const res = await fetch(url, { redirect: 'manual' });
    const location = res.headers.get('location');
    await res.text().catch(() => {});
    this.recorder?.push({ at: Date.now(), method: 'GET', url: `${url.origin}${url.pathname}`, path: url.pathname, status: res.status, who: this.name,
      resource: url.searchParams.get('resource') ?? undefined });
    if (res.status !== 302 || !location) throw new Error(`${this.name}: authorization endpoint answered ${res.status} without a redirect`);
    const back = new URL(location);
    if (back.searchParams.get('error')) throw new Error(`${this.name}: authorization refused: ${location}`);
    if (back.searchParams.get('state') !== this._state) throw new Error(`${this.name}: state mismatch in ${location}`);
    this.pendingCode = back.searchParams.get('code');
    log(`${this.name}: authorized (resource=${url.searchParams.get('resource')}); code ${short(this.pendingCode)}`);
  }

  takeCode() {
    const c = this.pendingCode;
    this.pendingCode = undefined;
    if (!c) throw new Error(`${this.name}: no authorization code`);
    return c;
  }
}

/**
 * A fetch that records every request (method, URL without query, status,
 * Last-Event-ID, the bearer token's short form) and keeps the live responses
 * with a body so that cut() can abort them.
 */
export function recordingFetch(requests, { quiet = false } = {}) {
  const live = new Set();
  const f = async (input, init = {}) => {
    const u = new URL(typeof input === 'string' ? input : input.url ?? String(input));
    const headers = new Headers(init.headers);
    const authz = headers.get('authorization');
    const rec = {
      at: Date.now(),
      method: init.method ?? 'GET',
      url: `${u.origin}${u.pathname}`,
      path: u.pathname,
      lastEventId: headers.get('last-event-id') ?? undefined,
      sessionId: headers.get('mcp-session-id') ?? undefined,
      token: authz?.startsWith('Bearer ') ? authz.slice(7) : undefined,
      body: typeof init.body === 'string' ? bodyMethod(init.body) : undefined,
    };
    requests.push(rec);
    const ac = new AbortController();
    const signal = init.signal ? AbortSignal.any([init.signal, ac.signal]) : ac.signal;
    try {
      const res = await fetch(input, { ...init, signal });
      rec.status = res.status;
      rec.wwwAuthenticate = res.headers.get('www-authenticate') ?? undefined;
      if (!quiet) {
        log(`http ${rec.method} ${rec.url}${rec.body ? ` ${rec.body}` : ''}${rec.lastEventId ? ` Last-Event-ID=${short(rec.lastEventId)}` : ''}${rec.token ? ` token=${short(rec.token)}` : ''} -> ${res.status}`);
      }
      if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) {
        const entry = { ac, rec };
        live.add(entry);
        // Dropped from the set once the body is done or cancelled.
        const [a, b] = res.body.tee();
        (async () => {
          const r = b.getReader();
          try {
            for (;;) if ((await r.read()).done) break;
          } catch {
            /* aborted */
          }
          live.delete(entry);
        })();
        return new Response(a, { status: res.status, statusText: res.statusText, headers: res.headers });
      }
      return res;
    } catch (e) {
      rec.error = String(e?.cause?.code ?? e?.name ?? e?.message ?? e);
      if (!quiet) log(`http ${rec.method} ${rec.url} failed: ${rec.error}`);
      throw e;
    }
  };
  /** Aborts every live SSE response (the TCP connection closes); returns how many. */
  f.cut = () => {
    const n = live.size;
    for (const e of [...live]) {
      e.rec.cut = true;
      e.ac.abort(new Error('cut by the test'));
    }
    live.clear();
    return n;
  };
  f.live = () => live.size;
  return f;
}

function bodyMethod(body) {
  try {
    const m = JSON.parse(body);
    const one = Array.isArray(m) ? m[0] : m;
    return one.method ?? (one.result !== undefined ? `result#${one.id}` : one.error ? `error#${one.id}` : undefined);
  } catch {
    return undefined;
  }
}

/**
 * Connects the SDK client to url with the provider, doing the whole OAuth
 * dance the way the SDK's simpleOAuthClient example does: connect, catch
 * UnauthorizedError (the provider has been "redirected" and holds a code),
 * transport.finishAuth(code), connect again with a new transport.
 * Returns {client, transport, authorized, resourceMetadataUrl} (authorized: a
 * flow ran; resourceMetadataUrl: from the 401's WWW-Authenticate).
 */
export async function connectWithOAuth(url, provider, fetchFn, { capabilities = {}, onNotification } = {}) {
  const make = () => {
    const transport = new StreamableHTTPClientTransport(new URL(url), {
      authProvider: provider,
      fetch: fetchFn,
      reconnectionOptions: RECONNECTION,
    });
    const client = new Client({ name: `interop-${provider.name}`, version: '0.0.1' }, { capabilities });
    client.onerror = (e) => log(`${provider.name} client onerror: ${String(e?.message ?? e)}`);
    onNotification?.(client);
    return { client, transport };
  };
  let { client, transport } = make();
  try {
    await client.connect(transport);
    return { client, transport, authorized: false };
  } catch (e) {
    if (!(e instanceof UnauthorizedError)) throw e;
    log(`${provider.name}: connect -> UnauthorizedError (redirected to the authorization server); finishing the flow`);
    await transport.finishAuth(provider.takeCode());
    await transport.close().catch(() => {});
  }
  // The protected resource metadata URL of the 401 (a private field of the transport).
  const resourceMetadataUrl = transport._resourceMetadataUrl;
  ({ client, transport } = make());
  await client.connect(transport);
  return { client, transport, authorized: true, resourceMetadataUrl };
}

/**
 * A second access token for the same registered client, by the SDK's own
 * auth() (discovery, authorization with PKCE, token): the provider's copy
 * starts without tokens, so auth() redirects; the code is exchanged by a
 * second auth() call. The provider's active tokens are left unchanged.
 * resourceMetadataUrl: what the transport passes to auth() when it
 * re-authorizes after a 401 (the resource_metadata of that 401).
 */
export async function anotherToken(url, provider, fetchFn, { resourceMetadataUrl } = {}) {
  const twin = new HeadlessOAuthProvider(`${provider.name}'`, provider.recorder);
  twin._clientInformation = provider.clientInformation();
  const first = await auth(twin, { serverUrl: new URL(url), resourceMetadataUrl, fetchFn });
  if (first !== 'REDIRECT') throw new Error(`auth() without tokens returned ${first}, expected REDIRECT`);
  const second = await auth(twin, { serverUrl: new URL(url), resourceMetadataUrl, authorizationCode: twin.takeCode(), fetchFn });
  if (second !== 'AUTHORIZED') throw new Error(`auth() with the code returned ${second}`);
  if (twin.clientInformation()?.client_id !== provider.clientInformation()?.client_id) {
    throw new Error('the second token was issued to another client');
  }
  return twin.tokens();
}
