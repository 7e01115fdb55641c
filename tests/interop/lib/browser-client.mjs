// The page script of scenario n (bundled with esbuild at run time, loaded by
// headless Chromium): the official TS SDK client in a browser, talking to an
// MCP server on another origin. window.mcpRun({...}) connects, lists tools,
// runs trigger-long-running-operation with progress, cuts its own live SSE
// responses (their fetch aborted: the browser closes the connection) after
// progress `cutAfter`, lets the SDK resume by itself (GET Last-Event-ID), and
// returns everything it saw: progress values, event ids, every HTTP request
// (method, Last-Event-ID, status or error), the result or the error.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

window.mcpRun = async ({ target, duration, steps, cutAfter, reconnectDelay = 1000, waitMs = 30000 }) => {
  const out = { origin: location.origin, target, requests: [], progress: [], tokens: [], errors: [], steps: [] };
  const step = (s) => { out.steps.push(s); console.log(`step: ${s}`); };
  const live = new Set();
  const cut = () => {
    const n = live.size;
    for (const e of live) e.ac.abort(new DOMException('cut by the page', 'AbortError'));
    live.clear();
    return n;
  };
  const recordingFetch = async (input, init = {}) => {
    const headers = new Headers(init.headers);
    const rec = { at: Date.now(), method: init.method ?? 'GET', lastEventId: headers.get('last-event-id') ?? undefined, body: methodOf(init.body) };
    out.requests.push(rec);
    const ac = new AbortController();
    const signal = init.signal ? AbortSignal.any([init.signal, ac.signal]) : ac.signal;
    try {
      const res = await fetch(input, { ...init, signal });
      rec.status = res.status;
      console.log(`http ${rec.method}${rec.body ? ` ${rec.body}` : ''}${rec.lastEventId ? ` Last-Event-ID=${rec.lastEventId}` : ''} -> ${res.status}`);
      if ((res.headers.get('content-type') ?? '').includes('text/event-stream') && res.body) {
        const entry = { ac };
        live.add(entry);
        const body = res.body.pipeThrough(new TransformStream({ flush() { live.delete(entry); } }));
        return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
      }
      return res;
    } catch (e) {
      rec.error = `${e?.name}: ${e?.message}`;
      console.log(`http ${rec.method}${rec.body ? ` ${rec.body}` : ''} failed: ${rec.error}`);
      throw e;
    }
  };
  const transport = new StreamableHTTPClientTransport(new URL(target), {
    fetch: recordingFetch,
    reconnectionOptions: { initialReconnectionDelay: reconnectDelay, maxReconnectionDelay: 4000, reconnectionDelayGrowFactor: 1.5, maxRetries: 5 },
  });
  const client = new Client({ name: 'interop-browser', version: '0.0.1' }, { capabilities: {} });
  client.onerror = (e) => { out.errors.push(String(e?.message ?? e)); console.log(`client onerror: ${e?.message ?? e}`); };
  try {
    await client.connect(transport);
    out.sessionId = transport.sessionId;
    out.protocol = transport.protocolVersion;
    step(`connected (session ${transport.sessionId}, protocol ${transport.protocolVersion})`);
    const { tools } = await client.listTools();
    out.tools = tools.map((t) => t.name);
    step(`tools/list: ${tools.length} tools`);
    const call = client.request(
      { method: 'tools/call', params: { name: 'trigger-long-running-operation', arguments: { duration, steps } } },
      CallToolResultSchema,
      {
        timeout: waitMs,
        onresumptiontoken: (t) => out.tokens.push(t),
        onprogress: (p) => {
          out.progress.push(p.progress);
          console.log(`progress ${p.progress}/${p.total}`);
          if (p.progress === cutAfter && out.cut === undefined) {
            out.cut = { at: Date.now(), afterProgress: p.progress, lastToken: out.tokens.at(-1) };
            // After this message has been handled: the SDK has already recorded its event id.
            setTimeout(() => { out.cut.n = cut(); console.log(`cut ${out.cut.n} live SSE response(s) after progress ${p.progress}`); }, 0);
          }
        },
      },
    );
    step('long call sent');
    const result = await call;
    out.result = result;
    step('result received');
    await transport.terminateSession().catch((e) => out.errors.push(`terminate: ${e.message}`));
    await client.close();
  } catch (e) {
    out.failure = `${out.steps.length === 0 ? 'connect' : out.steps.at(-1) === 'long call sent' ? 'the long call' : `after "${out.steps.at(-1)}"`}: ${e?.name}: ${e?.message}`;
    console.log(`failed: ${out.failure}`);
    await client.close().catch(() => {});
  }
  return out;
};

function methodOf(body) {
  if (typeof body !== 'string') return undefined;
  try {
    const m = JSON.parse(body);
    return m.method ?? (m.result !== undefined ? `result#${m.id}` : undefined);
  } catch {
    return undefined;
  }
}
