// A tiny MCP server on the official TS SDK's StreamableHTTPServerTransport
// with an event store, so that a GET with Last-Event-ID re-attaches to a
// request that is still running (what a restarted proxy does to resume its
// upstream). server-everything's HTTP mode cannot serve that: its own event
// store returns an event id where the SDK expects a stream id, so a resumed
// GET gets the stored events but nothing live (runbook G3, scenario d), and
// it replays every stream of the session mixed.
//
// The SDK's examples/shared InMemoryEventStore is not used either: it orders
// events by `${streamId}_${Date.now()}_${random}`, so two events of one stream
// in the same millisecond (the last progress and the result) can replay out of
// order. This store keeps insertion order; ids are `${streamId}_${seq}`.
//
// Tools: `long-op` {steps, intervalMs}: a progress notification per step
// (when the call has a progressToken), then the result "long-op done: N steps"
// (a cancelled call stops and is counted in /stats as `aborted`);
// `ask-colour`: asks the client (elicitation/create on the call's stream) and
// answers with the colour it got. It knows nothing of tasks.
//
// With LOG_REQUESTS=1 it logs each request and each session it creates, one
// line each on stdout ("request POST session=<id|-> rpc=<method>", "session
// created <id>"): a replica's own account of what reached it (q-replicas).
//
// usage: node lib/resumable-server.mjs <port>   (listens on 127.0.0.1)
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { CallToolRequestSchema, ElicitResultSchema, ListToolsRequestSchema, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';

class OrderedEventStore {
  constructor() {
    this.events = new Map(); // insertion order = store order
    this.seq = 0;
  }
  async storeEvent(streamId, message) {
    this.seq += 1;
    const eventId = `${streamId}_${String(this.seq).padStart(10, '0')}`;
    this.events.set(eventId, { streamId, message });
    return eventId;
  }
  async replayEventsAfter(lastEventId, { send }) {
    const last = this.events.get(lastEventId);
    if (!last) return '';
    let after = false;
    for (const [eventId, { streamId, message }] of this.events) {
      if (eventId === lastEventId) {
        after = true;
        continue;
      }
      if (after && streamId === last.streamId) await send(eventId, message);
    }
    return last.streamId;
  }
}

function mcpServer() {
  const server = new Server({ name: 'interop-resumable', version: '0.0.0' }, { capabilities: { tools: {} } });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({
    tools: [{
      name: 'long-op',
      description: 'steps progress notifications, intervalMs apart, then a result',
      inputSchema: { type: 'object', properties: { steps: { type: 'number' }, intervalMs: { type: 'number' } } },
    }, {
      name: 'ask-colour',
      description: 'asks the client for a colour (elicitation) and answers with it',
      inputSchema: { type: 'object', properties: {} },
    }],
  }));
  server.setRequestHandler(CallToolRequestSchema, async (req, extra) => {
    if (req.params.name === 'ask-colour') {
      const answer = await extra.sendRequest({
        method: 'elicitation/create',
        params: { message: 'Pick a colour', requestedSchema: { type: 'object', properties: { colour: { type: 'string' } } } },
      }, ElicitResultSchema);
      return { content: [{ type: 'text', text: `colour: ${answer.content?.colour}` }] };
    }
    if (req.params.name !== 'long-op') throw new Error(`unknown tool ${req.params.name}`);
    const steps = Number(req.params.arguments?.steps ?? 5);
    const intervalMs = Number(req.params.arguments?.intervalMs ?? 100);
    const progressToken = req.params._meta?.progressToken;
    for (let i = 1; i <= steps; i++) {
      await new Promise((r) => setTimeout(r, intervalMs));
      if (extra.signal.aborted) {
        stats.aborted += 1;
        throw new Error('cancelled');
      }
      if (progressToken !== undefined) {
        await extra.sendNotification({ method: 'notifications/progress', params: { progressToken, progress: i, total: steps } });
      }
    }
    return { content: [{ type: 'text', text: `long-op done: ${steps} steps` }] };
  });
  return server;
}

const transports = new Map();
const stats = { posts: 0, gets: 0, resumes: 0, calls: 0, aborted: 0 };

const logRequests = process.env.LOG_REQUESTS === '1';
const note = (line) => logRequests && console.log(line);

async function readJson(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const text = Buffer.concat(chunks).toString('utf8');
  return text ? JSON.parse(text) : undefined;
}

const httpServer = http.createServer(async (req, res) => {
  try {
    if (req.url === '/stats') {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(stats));
      return;
    }
    if (!req.url.startsWith('/mcp')) {
      res.writeHead(404).end();
      return;
    }
    const sid = req.headers['mcp-session-id'];
    if (req.method === 'POST') {
      stats.posts += 1;
      const body = await readJson(req);
      const msgs = Array.isArray(body) ? body : [body];
      stats.calls += msgs.filter((m) => m?.method === 'tools/call').length;
      note(`request POST session=${sid ?? '-'} rpc=${msgs.map((m) => m?.method ?? 'response').join(',')}`);
      let transport = sid ? transports.get(sid) : undefined;
      if (!transport) {
        if (sid || !msgs.some((m) => isInitializeRequest(m))) {
          res.writeHead(sid ? 404 : 400, { 'content-type': 'application/json' })
            .end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'no such session' }, id: null }));
          return;
        }
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          eventStore: new OrderedEventStore(),
          onsessioninitialized: (id) => {
            transports.set(id, transport);
            note(`session created ${id}`);
          },
        });
        transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
        await mcpServer().connect(transport);
      }
      await transport.handleRequest(req, res, body);
      return;
    }
    note(`request ${req.method} session=${sid ?? '-'}`);
    const transport = sid ? transports.get(sid) : undefined;
    if (!transport) {
      res.writeHead(404).end();
      return;
    }
    if (req.method === 'GET') {
      stats.gets += 1;
      if (req.headers['last-event-id']) stats.resumes += 1;
    }
    await transport.handleRequest(req, res);
  } catch (e) {
    console.error('request failed:', e);
    if (!res.headersSent) res.writeHead(500).end();
  }
});

const port = Number(process.argv[2] ?? 0);
httpServer.listen(port, '127.0.0.1', () => {
  console.log(`resumable-server listening on 127.0.0.1:${httpServer.address().port}`);
});
