// Our client for the conformance `sse-retry` scenario, run by
// sse-retry-wrapper.sh against mcp-resume-proxy (which sits in front of the
// conformance tool's test server). Official TS SDK: initialize, tools/list,
// call `test_reconnection`; the test server closes that call's SSE stream
// after a priming event (retry: 500) and delivers the result only on a GET
// that resumes with Last-Event-ID.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const url = new URL(process.argv[2]);
const t0 = Date.now();
const ts = () => `[+${Date.now() - t0}ms]`;
const transport = new StreamableHTTPClientTransport(url, {
  reconnectionOptions: { initialReconnectionDelay: 500, maxReconnectionDelay: 2000, reconnectionDelayGrowFactor: 1.5, maxRetries: 5 },
});
const client = new Client({ name: 'interop-sse-retry-client', version: '0.0.1' }, { capabilities: {} });
client.onerror = (e) => console.log(ts(), 'client onerror:', e?.message ?? e);
await client.connect(transport);
console.log(ts(), 'connected; protocol', transport.protocolVersion);
const { tools } = await client.listTools();
console.log(ts(), 'tools:', tools.map((t) => t.name).join(', '));
const result = await client.callTool({ name: 'test_reconnection', arguments: {} }, undefined, {
  timeout: 15000,
  onresumptiontoken: (t) => console.log(ts(), 'event id', t),
});
const text = result.content?.[0]?.text ?? '';
console.log(ts(), 'result:', text);
await client.close();
process.exit(/Reconnection test completed successfully/.test(text) ? 0 : 1);
