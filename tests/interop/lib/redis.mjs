// A minimal Redis client (RESP2 over node:net) for the scenarios that run the
// proxy with backend = "redis": check that Redis answers, count and delete a
// test's keys. No dependency on redis-cli or an npm package.
import net from 'node:net';

/** Parses one RESP reply from buf at pos: [value, nextPos], or undefined if incomplete. */
function parse(buf, pos) {
  const eol = buf.indexOf('\r\n', pos);
  if (eol < 0) return undefined;
  const type = String.fromCharCode(buf[pos]);
  const line = buf.toString('utf8', pos + 1, eol);
  const after = eol + 2;
  switch (type) {
    case '+': return [line, after];
    case '-': return [new RedisError(line), after];
    case ':': return [Number(line), after];
    case '$': {
      const len = Number(line);
      if (len < 0) return [null, after];
      if (buf.length < after + len + 2) return undefined;
      return [buf.toString('utf8', after, after + len), after + len + 2];
    }
    case '*': {
      const count = Number(line);
      if (count < 0) return [null, after];
      const out = [];
      let p = after;
      for (let i = 0; i < count; i++) {
        const r = parse(buf, p);
        if (!r) return undefined;
        out.push(r[0]);
        p = r[1];
      }
      return [out, p];
    }
    default: throw new Error(`redis: unexpected reply type ${JSON.stringify(type)}`);
  }
}

export class RedisError extends Error {}

export class Redis {
  /** Connects to a redis:// URL (host, port, optional user:password, /db). */
  static async connect(url, timeoutMs = 2000) {
    const u = new URL(url);
    if (u.protocol !== 'redis:') throw new Error(`redis: only redis:// URLs are supported here (${url})`);
    const sock = net.connect({ host: u.hostname || '127.0.0.1', port: Number(u.port || 6379) });
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        sock.destroy();
        reject(new Error(`no answer from ${u.host} within ${timeoutMs} ms`));
      }, timeoutMs);
      sock.once('connect', () => { clearTimeout(timer); resolve(); });
      sock.once('error', (e) => { clearTimeout(timer); reject(e); });
    });
    const r = new Redis(sock, timeoutMs);
    if (u.password) {
      await r.command('AUTH', ...(u.username ? [decodeURIComponent(u.username)] : []), decodeURIComponent(u.password));
    }
    const db = u.pathname.replace(/^\//, '');
    if (db) await r.command('SELECT', db);
    return r;
  }

  constructor(sock, timeoutMs) {
    this.sock = sock;
    this.timeoutMs = timeoutMs;
    this.buf = Buffer.alloc(0);
    this.waiting = [];
    sock.on('data', (chunk) => {
      this.buf = Buffer.concat([this.buf, chunk]);
      for (;;) {
        const r = parse(this.buf, 0);
        if (!r) break;
        this.buf = this.buf.subarray(r[1]);
        const w = this.waiting.shift();
        if (!w) continue;
        clearTimeout(w.timer);
        if (r[0] instanceof RedisError) w.reject(r[0]);
        else w.resolve(r[0]);
      }
    });
    const fail = (e) => {
      for (const w of this.waiting.splice(0)) {
        clearTimeout(w.timer);
        w.reject(e);
      }
    };
    sock.on('error', fail);
    sock.on('close', () => fail(new Error('redis: connection closed')));
  }

  /** Sends one command; resolves to its reply (rejects on an error reply). */
  command(...args) {
    const parts = [`*${args.length}\r\n`];
    for (const a of args) {
      const s = String(a);
      parts.push(`$${Buffer.byteLength(s)}\r\n${s}\r\n`);
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`redis: no reply to ${args[0]} within ${this.timeoutMs} ms`)), this.timeoutMs);
      this.waiting.push({ resolve, reject, timer });
      this.sock.write(parts.join(''));
    });
  }

  /** Every key matching one of the glob patterns (SCAN, not KEYS). */
  async keys(...patterns) {
    const found = new Set();
    for (const pattern of patterns) {
      let cursor = '0';
      do {
        const [next, batch] = await this.command('SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000);
        for (const k of batch) found.add(k);
        cursor = next;
      } while (cursor !== '0');
    }
    return [...found].sort();
  }

  /** Deletes the keys (in batches); resolves to how many existed. */
  async del(keys) {
    let n = 0;
    for (let i = 0; i < keys.length; i += 500) n += await this.command('DEL', ...keys.slice(i, i + 500));
    return n;
  }

  close() {
    this.sock.end();
    this.sock.destroy();
  }
}
