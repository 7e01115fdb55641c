// A stock OAuth client for the conformance tool's client `auth/*` scenarios:
// the TS SDK's Client + StreamableHTTPClientTransport (the version in
// package.json), its auth() with an OAuthClientProvider, and its
// ClientCredentialsProvider / PrivateKeyJwtProvider. It is a plain-JS port
// of the auth part of the conformance repository's own reference client
// (examples/clients/typescript/everything-client.ts with
// helpers/withOAuthRetry.ts and helpers/ConformanceOAuthProvider.ts, tag
// v0.1.16, the version in package.json), behaviour unchanged: the tool sets
// MCP_CONFORMANCE_SCENARIO (and MCP_CONFORMANCE_CONTEXT) and appends the
// server URL; the client connects, lists tools, calls test-tool, exits 0.
//
//   node auth-client.mjs <server url>
//
// The "browser" of the authorization step is a fetch of the authorization
// URL with redirect: manual; the code is read from the Location.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ClientCredentialsProvider, PrivateKeyJwtProvider } from '@modelcontextprotocol/sdk/client/auth-extensions.js';
import { UnauthorizedError, auth, extractWWWAuthenticateParams } from '@modelcontextprotocol/sdk/client/auth.js';

/** The suite's fixed client metadata URL (auth/basic-cimd). */
const CIMD_CLIENT_METADATA_URL = 'https://conformance-test.local/client-metadata.json';
const REDIRECT = 'http://localhost:3000/callback';
const debug = (...a) => console.log(...a);

/** helpers/ConformanceOAuthProvider.ts */
class ConformanceOAuthProvider {
  constructor(redirectUrl, clientMetadata, clientMetadataUrl) {
    this._redirectUrl = redirectUrl;
    this._clientMetadata = clientMetadata;
    this._clientMetadataUrl = clientMetadataUrl;
  }

  get redirectUrl() { return this._redirectUrl; }
  get clientMetadata() { return this._clientMetadata; }
  get clientMetadataUrl() { return this._clientMetadataUrl?.toString(); }
  clientInformation() { return this._clientInformation; }
  saveClientInformation(info) { this._clientInformation = info; }
  tokens() { return this._tokens; }
  saveTokens(tokens) { this._tokens = tokens; }

  async redirectToAuthorization(authorizationUrl) {
    const response = await fetch(authorizationUrl.toString(), { redirect: 'manual' });
    const location = response.headers.get('location');
    if (!location) throw new Error(`No redirect location received, from '${authorizationUrl.toString()}'`);
    const code = new URL(location).searchParams.get('code');
    if (!code) throw new Error('No auth code in redirect URL');
    this._authCode = code;
  }

  async getAuthCode() {
    if (this._authCode) return this._authCode;
    throw new Error('No authorization code');
  }

  saveCodeVerifier(v) { this._codeVerifier = v; }
  codeVerifier() {
    if (!this._codeVerifier) throw new Error('No code verifier saved');
    return this._codeVerifier;
  }
}

/** helpers/withOAuthRetry.ts: handle401 */
async function handle401(response, provider, next, serverUrl) {
  const { resourceMetadataUrl, scope } = extractWWWAuthenticateParams(response);
  let result = await auth(provider, { serverUrl, resourceMetadataUrl, scope, fetchFn: next });
  if (result === 'REDIRECT') {
    const authorizationCode = await provider.getAuthCode();
    result = await auth(provider, { serverUrl, resourceMetadataUrl, scope, authorizationCode, fetchFn: next });
    if (result !== 'AUTHORIZED') throw new UnauthorizedError(`Authentication failed with result: ${result}`);
  }
}

/** helpers/withOAuthRetry.ts: withOAuthRetryWithProvider */
function withOAuthRetryWithProvider(provider, baseUrl) {
  return (next) => async (input, init) => {
    const makeRequest = async () => {
      const headers = new Headers(init?.headers);
      const tokens = await provider.tokens();
      if (tokens) headers.set('Authorization', `Bearer ${tokens.access_token}`);
      return next(input, { ...init, headers });
    };
    let response = await makeRequest();
    if (response.status === 401 || response.status === 403) {
      const serverUrl = baseUrl || (typeof input === 'string' ? new URL(input).origin : input.origin);
      await handle401(response, provider, next, serverUrl);
      response = await makeRequest();
    }
    if (response.status === 401 || response.status === 403) {
      throw new UnauthorizedError(`Authentication failed for ${typeof input === 'string' ? input : input.toString()}`);
    }
    return response;
  };
}

const withOAuthRetry = (clientName, baseUrl, clientMetadataUrl) => withOAuthRetryWithProvider(
  new ConformanceOAuthProvider(REDIRECT, { client_name: clientName, redirect_uris: [REDIRECT] }, clientMetadataUrl),
  baseUrl,
);

function context(name) {
  const raw = process.env.MCP_CONFORMANCE_CONTEXT;
  if (!raw) throw new Error('MCP_CONFORMANCE_CONTEXT not set');
  const ctx = JSON.parse(raw);
  if (ctx.name !== name) throw new Error(`Expected ${name} context, got ${ctx.name}`);
  return ctx;
}

async function runAuthClient(serverUrl) {
  const client = new Client({ name: 'test-auth-client', version: '1.0.0' }, { capabilities: {} });
  const oauthFetch = withOAuthRetry('test-auth-client', new URL(serverUrl), CIMD_CLIENT_METADATA_URL)(fetch);
  const transport = new StreamableHTTPClientTransport(new URL(serverUrl), { fetch: oauthFetch });
  await client.connect(transport);
  debug('Successfully connected to MCP server');
  await client.listTools();
  debug('Successfully listed tools');
  await client.callTool({ name: 'test-tool', arguments: {} });
  debug('Successfully called tool');
  await transport.close();
  debug('Connection closed successfully');
}

async function runWithProvider(serverUrl, provider, name) {
  const client = new Client({ name, version: '1.0.0' }, { capabilities: {} });
  const transport = new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider });
  await client.connect(transport);
  debug('Successfully connected');
  await client.listTools();
  debug('Successfully listed tools');
  await transport.close();
  debug('Connection closed successfully');
}

async function runClientCredentialsJwt(serverUrl) {
  const ctx = context('auth/client-credentials-jwt');
  const provider = new PrivateKeyJwtProvider({ clientId: ctx.client_id, privateKey: ctx.private_key_pem, algorithm: ctx.signing_algorithm || 'ES256' });
  await runWithProvider(serverUrl, provider, 'conformance-client-credentials-jwt');
}

async function runClientCredentialsBasic(serverUrl) {
  const ctx = context('auth/client-credentials-basic');
  const provider = new ClientCredentialsProvider({ clientId: ctx.client_id, clientSecret: ctx.client_secret });
  await runWithProvider(serverUrl, provider, 'conformance-client-credentials-basic');
}

async function runPreRegistration(serverUrl) {
  const ctx = context('auth/pre-registration');
  const client = new Client({ name: 'conformance-pre-registration', version: '1.0.0' }, { capabilities: {} });
  const provider = new ConformanceOAuthProvider(REDIRECT, { client_name: 'conformance-pre-registration', redirect_uris: [REDIRECT] });
  provider.saveClientInformation({ client_id: ctx.client_id, client_secret: ctx.client_secret, redirect_uris: [REDIRECT] });
  const oauthFetch = withOAuthRetryWithProvider(provider, new URL(serverUrl))(fetch);
  const transport = new StreamableHTTPClientTransport(new URL(serverUrl), { fetch: oauthFetch });
  await client.connect(transport);
  debug('Successfully connected with pre-registered credentials');
  await client.listTools();
  debug('Successfully listed tools');
  await transport.close();
  debug('Connection closed successfully');
}

/** SEP-990: IdP ID token -> ID-JAG (at the IdP) -> access token (at the AS) -> MCP. */
async function runCrossAppAccessCompleteFlow(serverUrl) {
  const ctx = context('auth/cross-app-access-complete-flow');
  const prmResponse = await fetch(new URL('/.well-known/oauth-protected-resource/mcp', serverUrl).toString());
  if (!prmResponse.ok) throw new Error(`PRM discovery failed: ${prmResponse.status}`);
  const prm = await prmResponse.json();
  const resource = prm.resource;
  const authServerUrl = prm.authorization_servers[0];
  debug('Discovered resource:', resource, 'auth server:', authServerUrl);
  const asMetadataResponse = await fetch(new URL('/.well-known/oauth-authorization-server', authServerUrl).toString());
  if (!asMetadataResponse.ok) throw new Error(`Auth server metadata discovery failed: ${asMetadataResponse.status}`);
  const asMetadata = await asMetadataResponse.json();
  const grantTypes = asMetadata.grant_types_supported || [];
  if (!grantTypes.includes('urn:ietf:params:oauth:grant-type:jwt-bearer')) {
    throw new Error(`Auth server does not support jwt-bearer grant type. Supported: ${grantTypes.join(', ')}`);
  }
  const tokenExchangeResponse = await fetch(ctx.idp_token_endpoint, {
    method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({
      grant_type: 'urn:ietf:params:oauth:grant-type:token-exchange',
      requested_token_type: 'urn:ietf:params:oauth:token-type:id-jag',
      audience: asMetadata.issuer,
      resource,
      subject_token: ctx.idp_id_token,
      subject_token_type: 'urn:ietf:params:oauth:token-type:id_token',
      client_id: ctx.idp_client_id,
    }),
  });
  if (!tokenExchangeResponse.ok) throw new Error(`Token exchange failed: ${await tokenExchangeResponse.text()}`);
  const idJag = (await tokenExchangeResponse.json()).access_token;
  const basicAuth = Buffer.from(`${encodeURIComponent(ctx.client_id)}:${encodeURIComponent(ctx.client_secret)}`).toString('base64');
  const tokenResponse = await fetch(asMetadata.token_endpoint, {
    method: 'POST',
    headers: { 'Content-Type': 'application/x-www-form-urlencoded', Authorization: `Basic ${basicAuth}` },
    body: new URLSearchParams({ grant_type: 'urn:ietf:params:oauth:grant-type:jwt-bearer', assertion: idJag }),
  });
  if (!tokenResponse.ok) throw new Error(`JWT bearer grant failed: ${await tokenResponse.text()}`);
  const tokenResult = await tokenResponse.json();
  const client = new Client({ name: 'conformance-cross-app-access', version: '1.0.0' }, { capabilities: {} });
  const transport = new StreamableHTTPClientTransport(new URL(serverUrl), {
    requestInit: { headers: { Authorization: `Bearer ${tokenResult.access_token}` } },
  });
  await client.connect(transport);
  await client.listTools();
  await client.callTool({ name: 'test-tool', arguments: {} });
  await transport.close();
  debug('Complete cross-app access flow completed successfully');
}

const handlers = {
  'auth/client-credentials-jwt': runClientCredentialsJwt,
  'auth/client-credentials-basic': runClientCredentialsBasic,
  'auth/pre-registration': runPreRegistration,
  'auth/cross-app-access-complete-flow': runCrossAppAccessCompleteFlow,
};

// Every HTTP exchange on stdout (`trace: ...`), for p-conformance-auth to
// show why a scenario differs: method, URL, status, WWW-Authenticate, and
// the `resource` of protected resource metadata.
const realFetch = globalThis.fetch;
globalThis.fetch = async (input, init) => {
  const url = typeof input === 'string' ? input : (input.url ?? String(input));
  const method = init?.method ?? input?.method ?? 'GET';
  const res = await realFetch(input, init);
  let extra = '';
  const challenge = res.headers.get('www-authenticate');
  if (challenge) extra += ` WWW-Authenticate: ${challenge}`;
  if ((res.headers.get('content-type') ?? '').includes('application/json') && method === 'GET') {
    const body = await res.clone().json().catch(() => undefined);
    if (body && typeof body.resource === 'string') extra += ` resource=${body.resource}`;
  }
  console.log(`trace: ${method} ${url.split('?')[0]} -> ${res.status}${extra}`);
  return res;
};

const scenario = process.env.MCP_CONFORMANCE_SCENARIO;
const serverUrl = process.argv[2];
if (!scenario || !serverUrl) {
  console.error('Usage: MCP_CONFORMANCE_SCENARIO=<auth/...> node auth-client.mjs <server url>');
  process.exit(1);
}
if (!scenario.startsWith('auth/')) {
  console.error(`Unknown scenario: ${scenario}`);
  process.exit(1);
}
try {
  await (handlers[scenario] ?? runAuthClient)(serverUrl);
  process.exit(0);
} catch (error) {
  console.error('Error:', error);
  process.exit(1);
}
