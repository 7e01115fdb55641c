#!/usr/bin/env bash
# --command for `conformance client --scenario sse-retry`: the conformance tool
# appends the URL of its test server; we start mcp-resume-proxy in front of
# that URL, run our TS SDK client (sse-retry-client.mjs) against the proxy,
# and stop the proxy. So the tool's test server sees the proxy as its client.
#
#   conformance test server <-- mcp-resume-proxy <-- sse-retry-client.mjs (TS SDK)
#
# Env: MCP_PROXY_BIN (proxy binary), INTEROP_WRAPPER_LOG (a file that gets the
# proxy's and the client's output; the tool itself swallows it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
interop=$(cd "$here/.." && pwd)
upstream=${!#}
# The tool says http://localhost:PORT; its server listens on 127.0.0.1 (preload).
upstream=${upstream/\/\/localhost:/\/\/127.0.0.1:}
bin=${MCP_PROXY_BIN:-$interop/../../target/release/mcp-resume-proxy}
out=${INTEROP_WRAPPER_LOG:-/dev/stderr}
node=${INTEROP_NODE:-node}

data=$(mktemp -d "${TMPDIR:-/tmp}/interop-sse-retry.XXXXXX")
proxy_pid=
cleanup() {
  if [ -n "$proxy_pid" ]; then
    kill "$proxy_pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$proxy_pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$proxy_pid" 2>/dev/null || true
    wait "$proxy_pid" 2>/dev/null || true
  fi
  rm -rf "$data"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

port=$("$node" -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
echo "wrapper: upstream $upstream, proxy on 127.0.0.1:$port" >>"$out"
RUST_LOG=${RUST_LOG:-mcp_resume_proxy=debug,info} "$bin" --listen "127.0.0.1:$port" --upstream "$upstream" --data-dir "$data/db" >>"$out" 2>&1 &
proxy_pid=$!
for _ in $(seq 1 100); do
  if "$node" -e 'fetch(process.argv[1]).then(r=>process.exit(r.ok?0:1),()=>process.exit(1))' "http://127.0.0.1:$port/healthz"; then break; fi
  kill -0 "$proxy_pid" 2>/dev/null || { echo "wrapper: proxy exited early" >>"$out"; exit 1; }
  sleep 0.1
done
rc=0
"$node" "$here/sse-retry-client.mjs" "http://127.0.0.1:$port/mcp" >>"$out" 2>&1 || rc=$?
echo "wrapper: client exited $rc" >>"$out"
exit "$rc"
