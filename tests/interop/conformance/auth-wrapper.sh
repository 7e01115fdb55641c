#!/usr/bin/env bash
# --command for `conformance client --scenario auth/...`, through the proxy:
# the conformance tool appends the URL of its test server (a protected MCP
# server; its authorization server is another port); we start
# mcp-resume-proxy in front of that URL, run the stock OAuth client
# (auth-client.mjs, with the tool's MCP_CONFORMANCE_SCENARIO and
# MCP_CONFORMANCE_CONTEXT) against the proxy, and stop the proxy.
#
#   conformance test server <-- mcp-resume-proxy <-- auth-client.mjs (TS SDK)
#                  authorization server <-------------'  (direct, as its metadata says)
#
# The upstream is the URL exactly as the tool gives it (http://localhost:PORT/mcp):
# that is the name the server uses for itself in its metadata and challenges,
# which the proxy rewrites to its own.
#
# Env: MCP_PROXY_BIN (proxy binary), INTEROP_WRAPPER_LOG (a file that gets the
# proxy's and the client's output), INTEROP_NODE (node for the client),
# PROXY_PASSTHROUGH (optional: a TOML array for the upstream's `passthrough`,
# e.g. ["/authorize", "/token", "/register"]).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
interop=$(cd "$here/.." && pwd)
upstream=${!#}
bin=${MCP_PROXY_BIN:-$interop/../../target/release/mcp-resume-proxy}
out=${INTEROP_WRAPPER_LOG:-/dev/stderr}
node=${INTEROP_NODE:-node}

data=$(mktemp -d "${TMPDIR:-/tmp}/interop-auth.XXXXXX")
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
{
  echo "listen = \"127.0.0.1:$port\""
  echo "data_dir = \"$data/db\""
  echo '[[upstream]]'
  echo 'path = "/mcp"'
  echo "url = \"$upstream\""
  if [ -n "${PROXY_PASSTHROUGH:-}" ]; then echo "passthrough = $PROXY_PASSTHROUGH"; fi
} > "$data/proxy.toml"
echo "wrapper: $MCP_CONFORMANCE_SCENARIO: upstream $upstream, proxy on 127.0.0.1:$port${PROXY_PASSTHROUGH:+, passthrough = $PROXY_PASSTHROUGH}" >>"$out"
RUST_LOG=${RUST_LOG:-mcp_resume_proxy=debug,info} "$bin" --config "$data/proxy.toml" >>"$out" 2>&1 &
proxy_pid=$!
for _ in $(seq 1 100); do
  if "$node" -e 'fetch(process.argv[1]).then(r=>process.exit(r.ok?0:1),()=>process.exit(1))' "http://127.0.0.1:$port/healthz"; then break; fi
  kill -0 "$proxy_pid" 2>/dev/null || { echo "wrapper: proxy exited early" >>"$out"; exit 1; }
  sleep 0.1
done
rc=0
"$node" "$here/auth-client.mjs" "http://127.0.0.1:$port/mcp" >>"$out" 2>&1 || rc=$?
echo "wrapper: client exited $rc" >>"$out"
exit "$rc"
