// The fast upstream of the load harness, in Node (`--upstream node`): the
// same wire as `fast_upstream.rs`, written with nothing but node's `http`
// module (no npm install), so the harness's tables read as a deployment
// in front of a typical Node MCP server does.
//
// Usage: node fast_upstream.mjs --port P   (listens on 127.0.0.1:P)
//
// Legacy Streamable HTTP, stateless: `initialize` mints an `Mcp-Session-Id`
// from a counter and echoes a supported `protocolVersion`; notifications and
// responses get 202; `ping` and `tools/list` (one tool, `echo`) answer at
// once; `GET` opens a standalone SSE stream that stays silent until the
// client leaves; `DELETE` gets 200. `tools/call` reads its behaviour from its
// arguments, as the Rust upstream does:
//
// - `{}`: a small result at once, as `application/json`;
// - `{"delay_ms":D,"progress":N,"interval_us":I,"sse":true}`: an SSE answer
//   whose head goes out at once, then after D ms N `notifications/progress`
//   events (I µs apart, default back to back), then the result.

import http from "node:http";

const VERSIONS = ["2025-06-18", "2025-11-25", "2025-03-26", "2024-11-05"];
let sessions = 0;

function port() {
  const i = process.argv.indexOf("--port");
  const p = Number(i > 0 ? process.argv[i + 1] : NaN);
  if (!Number.isInteger(p)) {
    console.error("usage: node fast_upstream.mjs --port P");
    process.exit(2);
  }
  return p;
}

function status(res, code) {
  res.writeHead(code, { "content-length": "0" });
  res.end();
}

function json(res, body, headers = {}) {
  res.writeHead(200, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    ...headers,
  });
  res.end(body);
}

function sseHead(res) {
  res.writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
  });
  // The head goes out now, not with the first event.
  res.flushHeaders();
}

// The id is written back as JSON, so a string id keeps its quotes.
function result(id, value) {
  return `{"jsonrpc":"2.0","id":${JSON.stringify(id)},"result":${value}}`;
}

const CALL_RESULT = '{"content":[{"type":"text","text":"ok"}],"isError":false}';
const TOOLS =
  '{"tools":[{"name":"echo","description":"echo","inputSchema":{"type":"object"}}]}';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Writes one SSE event; waits for `drain` when the socket's buffer is full,
// so a slow reader holds a bounded amount here. False once the client left.
async function event(res, data) {
  if (res.destroyed) return false;
  if (!res.write(`event: message\ndata: ${data}\n\n`)) {
    await new Promise((r) => {
      res.once("drain", r);
      res.once("close", r);
    });
  }
  return !res.destroyed;
}

async function streamCall(res, msg, args) {
  sseHead(res);
  if (args.delay_ms > 0) await sleep(args.delay_ms);
  const token = JSON.stringify(msg.params?._meta?.progressToken ?? msg.id);
  const total = args.progress ?? 0;
  for (let n = 1; n <= total; n++) {
    const note =
      '{"jsonrpc":"2.0","method":"notifications/progress","params":' +
      `{"progressToken":${token},"progress":${n},"total":${total}}}`;
    if (!(await event(res, note))) return;
    // setTimeout has millisecond resolution: sub-millisecond pauses round up.
    if (args.interval_us > 0) await sleep(args.interval_us / 1000);
  }
  if (await event(res, result(msg.id, CALL_RESULT))) res.end();
}

function call(res, msg) {
  const args = msg.params?.arguments ?? {};
  if (!args.delay_ms && !args.progress && !args.sse) {
    return json(res, result(msg.id, CALL_RESULT));
  }
  streamCall(res, msg, args).catch(() => res.destroy());
}

function post(res, body) {
  let msg;
  try {
    msg = JSON.parse(body);
  } catch {
    return status(res, 400);
  }
  if (msg.id === undefined || typeof msg.method !== "string") {
    return status(res, 202); // notifications and responses
  }
  switch (msg.method) {
    case "initialize": {
      const want = msg.params?.protocolVersion;
      const version = VERSIONS.includes(want) ? want : VERSIONS[0];
      const init =
        `{"protocolVersion":"${version}","capabilities":{"tools":{}},` +
        '"serverInfo":{"name":"fast-upstream-node","version":"1"}}';
      return json(res, result(msg.id, init), {
        "mcp-session-id": `node-${sessions++}`,
      });
    }
    case "tools/call":
      return call(res, msg);
    case "tools/list":
      return json(res, result(msg.id, TOOLS));
    default:
      return json(res, result(msg.id, "{}")); // ping and anything else
  }
}

const server = http.createServer((req, res) => {
  if (req.method === "POST") {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => post(res, Buffer.concat(chunks).toString("utf8")));
  } else if (req.method === "GET") {
    sseHead(res); // silent until the client goes away
  } else if (req.method === "DELETE") {
    status(res, 200);
  } else {
    status(res, 405);
  }
});
// Idle keep-alive connections (the proxies' pools between rounds) stay open,
// as hyper's do: a pooled connection closed under a proxy would fail a POST.
server.keepAliveTimeout = 0;
server.requestTimeout = 0;
server.maxRequestsPerSocket = 0;
server.listen(port(), "127.0.0.1");
