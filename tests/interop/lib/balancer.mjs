// A tiny loopback HTTP load balancer (node:http) for the scale-out scenario:
// every incoming HTTP request goes to the next backend in turn (A, B, A, B,
// ...: round-robin per request, not per connection), with its method, path,
// headers and body passed through unchanged, and the response streamed back
// as it arrives (SSE streams are long-lived; nothing is buffered). Only the
// hop-by-hop headers (Connection, Keep-Alive, Transfer-Encoding, ...) are
// left to each hop, as any HTTP proxy does.
//
// It records every request (which backend served it, its JSON-RPC method,
// Last-Event-ID, status) and can cut a response in flight — a dropped
// connection between the client and the balancer, mid-stream.
import { LoopbackServer } from './loopback.mjs';
import http from 'node:http';

const HOP_BY_HOP = new Set([
  'connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization',
  'te', 'trailer', 'transfer-encoding', 'upgrade',
]);

function endToEnd(headers) {
  const out = {};
  for (const [k, v] of Object.entries(headers)) if (!HOP_BY_HOP.has(k.toLowerCase())) out[k] = v;
  return out;
}

/** The JSON-RPC method (or result#id / error#id) of a request body, for the log. */
function rpcOf(text) {
  if (!text) return undefined;
  try {
    const m = JSON.parse(text);
    const one = Array.isArray(m) ? m[0] : m;
    return one.method ?? (one.result !== undefined ? `result#${one.id}` : one.error ? `error#${one.id}` : undefined);
  } catch {
    return '(unparsed body)';
  }
}

const short = (id) => (id && id.length > 16 ? `${id.slice(0, 8)}…${id.slice(-6)}` : id);

export class Balancer extends LoopbackServer {
  /**
   * @param {{name: string, port: number}[]} backends on 127.0.0.1, served in this order
   * @param {{log?: (...a: any[]) => void}} [opts]
   */
  constructor(backends, opts = {}) {
    super(http.createServer((req, res) => this.#forward(req, res)));
    this.backends = backends.map((b) => ({ ...b, agent: new http.Agent({ keepAlive: true }) }));
    this.log = opts.log ?? (() => {});
    this.next = 0;
    /** Every request: {n, at, method, path, rpc, lastEventId, sessionId, backend, status, contentType, error, cut, done}. */
    this.requests = [];
    this.active = new Set(); // {rec, req, res, upstreamReq}

  }

  #forward(req, res) {
    const backend = this.backends[this.next % this.backends.length];
    this.next += 1;
    const rec = {
      n: this.requests.length + 1,
      at: Date.now(),
      method: req.method,
      path: req.url,
      lastEventId: req.headers['last-event-id'],
      sessionId: req.headers['mcp-session-id'],
      backend: backend.name,
    };
    this.requests.push(rec);
    const upstreamReq = http.request({
      host: '127.0.0.1',
      port: backend.port,
      method: req.method,
      path: req.url,
      headers: endToEnd(req.headers),
      agent: backend.agent,
    });
    const ex = { rec, req, res, upstreamReq };
    this.active.add(ex);
    // Peek at the body for the log while it streams through untouched.
    let head = '';
    req.on('data', (chunk) => {
      if (head.length < 4096) head += chunk.toString('utf8');
    });
    req.on('end', () => {
      rec.rpc = rpcOf(head);
    });
    req.pipe(upstreamReq);
    upstreamReq.on('response', (upstreamRes) => {
      rec.status = upstreamRes.statusCode;
      rec.contentType = upstreamRes.headers['content-type'];
      this.log(`balancer: #${rec.n} ${rec.method}${rec.rpc ? ` ${rec.rpc}` : ''}${rec.lastEventId ? ` Last-Event-ID=${short(rec.lastEventId)}` : ''} -> ${backend.name} (:${backend.port}) ${rec.status}${rec.contentType ? ` ${rec.contentType.split(';')[0]}` : ''}`);
      res.writeHead(upstreamRes.statusCode, upstreamRes.statusMessage, endToEnd(upstreamRes.headers));
      res.flushHeaders();
      upstreamRes.pipe(res);
      upstreamRes.on('error', () => res.destroy());
    });
    upstreamReq.on('error', (e) => {
      if (rec.cut) return;
      rec.error = String(e?.code ?? e?.message ?? e);
      this.log(`balancer: #${rec.n} ${rec.method}${rec.rpc ? ` ${rec.rpc}` : ''} -> ${backend.name}: upstream error ${rec.error}`);
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' }).end(`balancer: ${backend.name}: ${rec.error}\n`);
      else res.destroy();
    });
    res.on('close', () => {
      rec.done = Date.now();
      this.active.delete(ex);
      // The client went away (or the response ended): drop the backend leg too.
      if (!res.writableFinished) upstreamReq.destroy();
    });
  }

  /** Requests in flight (response not finished). */
  inFlight(pred = () => true) {
    return [...this.active].filter(({ rec }) => pred(rec)).map(({ rec }) => rec);
  }

  /**
   * Cuts the in-flight responses whose record matches pred: the client's
   * connection is reset (it sees a network error mid-stream) and the
   * backend's is closed. Returns the records cut.
   */
  cut(pred) {
    const hit = [...this.active].filter(({ rec }) => pred(rec));
    for (const { rec, res, upstreamReq } of hit) {
      rec.cut = Date.now();
      const sock = res.socket;
      if (sock && typeof sock.resetAndDestroy === 'function') sock.resetAndDestroy();
      else if (sock) sock.destroy();
      else res.destroy();
      upstreamReq.destroy();
      this.log(`balancer: cut #${rec.n} ${rec.method}${rec.rpc ? ` ${rec.rpc}` : ''} (served by ${rec.backend})`);
    }
    return hit.map((x) => x.rec);
  }

  async close() {
    for (const { res, upstreamReq } of [...this.active]) {
      upstreamReq.destroy();
      res.destroy();
    }
    this.active.clear();
    await new Promise((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections?.();
    });
    for (const b of this.backends) b.agent.destroy();
  }
}
