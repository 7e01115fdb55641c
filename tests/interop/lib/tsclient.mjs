// The official TS SDK client, wired for the scenarios: generous reconnection
// options and a fetch wrapper that records every HTTP request (method,
// Last-Event-ID, status) so a scenario can show the SDK's own resume.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { log } from './harness.mjs';

export const RECONNECTION = {
  initialReconnectionDelay: 1000, // long enough that some progress is missed while away
  maxReconnectionDelay: 4000,
  reconnectionDelayGrowFactor: 1.5,
  maxRetries: 5,
};

/**
 * @param {string} url
 * @param {{capabilities?: object, name?: string, quiet?: boolean, beforeConnect?: (c: Client) => void}} [opts]
 */
export async function connectClient(url, opts = {}) {
  const requests = [];
  const recordingFetch = async (input, init = {}) => {
    const headers = new Headers(init.headers);
    const rec = {
      at: Date.now(),
      method: init.method ?? 'GET',
      lastEventId: headers.get('last-event-id') ?? undefined,
      body: typeof init.body === 'string' ? safeMethod(init.body) : undefined,
    };
    requests.push(rec);
    try {
      const res = await fetch(input, init);
      rec.status = res.status;
      if (!opts.quiet) log(`http ${rec.method}${rec.body ? ` ${rec.body}` : ''}${rec.lastEventId ? ` Last-Event-ID=${short(rec.lastEventId)}` : ''} -> ${res.status}`);
      return res;
    } catch (e) {
      rec.error = String(e?.cause?.code ?? e?.message ?? e);
      if (!opts.quiet) log(`http ${rec.method} failed: ${rec.error}`);
      throw e;
    }
  };
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    reconnectionOptions: RECONNECTION,
    fetch: recordingFetch,
  });
  const client = new Client(
    { name: opts.name ?? 'interop-ts-client', version: '0.0.1' },
    { capabilities: opts.capabilities ?? {} },
  );
  const errors = [];
  client.onerror = (e) => {
    errors.push(String(e?.message ?? e));
    log('client onerror:', String(e?.message ?? e));
  };
  opts.beforeConnect?.(client);
  await client.connect(transport);
  return { client, transport, requests, errors };
}

function safeMethod(body) {
  try {
    const m = JSON.parse(body);
    const one = Array.isArray(m) ? m[0] : m;
    return one.method ?? (one.result !== undefined ? `result#${one.id}` : one.error ? `error#${one.id}` : undefined);
  } catch {
    return undefined;
  }
}

export const short = (id) => (id && id.length > 16 ? `${id.slice(0, 8)}…${id.slice(-6)}` : id);
