// A raw Streamable HTTP client (fetch + a tiny SSE parser) for scenarios that
// need to control exactly which request carries which Last-Event-ID.

export const PROTOCOL = '2025-11-25';

/** Parses an SSE body incrementally; yields {id, event, data, retry, at}. */
export async function* sseEvents(body) {
  const decoder = new TextDecoder();
  let buf = '';
  let ev = {};
  for await (const chunk of body) {
    buf += decoder.decode(chunk, { stream: true });
    let nl;
    while ((nl = buf.search(/\r\n|\n|\r/)) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + (buf.startsWith('\r\n', nl) ? 2 : 1));
      if (line === '') {
        if (ev.data !== undefined || ev.id !== undefined) yield { ...ev, at: Date.now() };
        ev = {};
        continue;
      }
      if (line.startsWith(':')) continue;
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? '' : line.slice(i + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'data') ev.data = ev.data === undefined ? value : `${ev.data}\n${value}`;
      else if (field === 'id') ev.id = value;
      else if (field === 'event') ev.event = value;
      else if (field === 'retry') ev.retry = Number(value);
    }
  }
}

export class RawSession {
  constructor(url) {
    this.url = url;
    this.sessionId = undefined;
    this.nextId = 1;
  }

  headers(extra = {}) {
    const h = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...extra };
    if (this.sessionId) {
      h['mcp-session-id'] = this.sessionId;
      h['mcp-protocol-version'] = PROTOCOL;
    }
    return h;
  }

  /** POSTs a JSON-RPC message; returns the fetch Response (body unread). */
  async post(message, signal) {
    return fetch(this.url, { method: 'POST', headers: this.headers(), body: JSON.stringify(message), signal });
  }

  async initialize(capabilities = {}) {
    const res = await this.post({
      jsonrpc: '2.0', id: this.nextId++, method: 'initialize',
      params: { protocolVersion: PROTOCOL, capabilities, clientInfo: { name: 'interop-raw', version: '0' } },
    });
    if (!res.ok) throw new Error(`initialize -> ${res.status} ${await res.text()}`);
    this.sessionId = res.headers.get('mcp-session-id');
    await res.text();
    const r2 = await this.post({ jsonrpc: '2.0', method: 'notifications/initialized' });
    await r2.text();
    if (r2.status !== 202) throw new Error(`initialized -> ${r2.status}`);
    return this.sessionId;
  }

  /** GET with Last-Event-ID; returns the Response (body unread). */
  async resume(lastEventId, signal) {
    return fetch(this.url, {
      method: 'GET',
      headers: { accept: 'text/event-stream', 'mcp-session-id': this.sessionId, 'mcp-protocol-version': PROTOCOL, 'last-event-id': lastEventId },
      signal,
    });
  }

  async delete() {
    const r = await fetch(this.url, { method: 'DELETE', headers: this.headers() }).catch(() => undefined);
    await r?.text().catch(() => {});
  }
}

/** The JSON-RPC message in an SSE event, or undefined (priming events). */
export function message(ev) {
  if (!ev.data) return undefined;
  try {
    return JSON.parse(ev.data);
  } catch {
    return undefined;
  }
}
