// A loopback TCP relay that the test controls: it sits between an MCP client
// and the proxy and can cut every connection it carries on command — a
// "pulled cable" in the middle of a call. After a cut it keeps accepting new
// connections (the client's reconnect goes through it again).
import { LoopbackServer } from './loopback.mjs';
import net from 'node:net';

export class Relay extends LoopbackServer {
  /**
   * @param {number} targetPort port of the proxy on 127.0.0.1
   * @param {{log?: (msg: string) => void}} [opts]
   */
  constructor(targetPort, opts = {}) {
    super(net.createServer((client) => this.#onConnection(client)));
    this.targetPort = targetPort;
    this.log = opts.log ?? (() => {});
    this.pairs = new Set();
    this.accepted = 0;
    this.cuts = 0;
    this.paused = false;
    /** Every HTTP request seen (method, path, selected headers, status). */
    this.requests = [];

  }

  #onConnection(client) {
    this.accepted += 1;
    if (this.paused) {
      client.destroy();
      return;
    }
    const upstream = net.connect({ host: '127.0.0.1', port: this.targetPort });
    const pair = { client, upstream };
    this.pairs.add(pair);
    const done = () => {
      this.pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', done);
    upstream.on('error', done);
    client.on('close', done);
    upstream.on('close', done);
    // Observe (never modify) the HTTP/1.1 request heads and status lines.
    const pending = [];
    client.on('data', (chunk) => {
      const text = chunk.toString('latin1');
      for (const m of text.matchAll(/(?:^|\r\n)(GET|POST|DELETE|PUT|OPTIONS) (\S+) HTTP\/1\.1\r\n([\s\S]*?)\r\n\r\n/g)) {
        const headers = {};
        for (const line of m[3].split('\r\n')) {
          const i = line.indexOf(':');
          if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
        }
        const rec = { at: Date.now(), method: m[1], path: m[2], headers };
        this.requests.push(rec);
        pending.push(rec);
      }
    });
    upstream.on('data', (chunk) => {
      const text = chunk.toString('latin1');
      for (const m of text.matchAll(/(?:^|\r\n\r\n|\r\n0\r\n\r\n)HTTP\/1\.1 (\d{3})/g)) {
        const rec = pending.shift();
        if (rec) rec.status = Number(m[1]);
      }
    });
    client.pipe(upstream);
    upstream.pipe(client);
  }

  /** Number of connections currently relayed. */
  get open() {
    return this.pairs.size;
  }

  /**
   * Cuts every current connection at once, both sides (RST toward the client
   * when possible, so it sees an abrupt network error, not a clean end).
   * Returns how many connections were cut.
   */
  cut() {
    const n = this.pairs.size;
    for (const { client, upstream } of [...this.pairs]) {
      if (typeof client.resetAndDestroy === 'function') client.resetAndDestroy();
      else client.destroy();
      upstream.destroy();
    }
    this.pairs.clear();
    this.cuts += 1;
    this.log(`relay: cut ${n} connection(s)`);
    return n;
  }

  async close() {
    this.cut();
    await new Promise((resolve) => this.server.close(() => resolve()));
  }
}
