#!/bin/bash
# Counts what a call costs the proxy in system calls, as counts rather than
# time: futex (cross-thread wake-ups), all system calls, context switches,
# pread64 (a read-back of what was just written) and fdatasync, per
# tools/call, over 3 s of the load harness's `small` scenario.
#
#   cargo bench --bench load --no-run
#   benches/support/count_syscalls.sh never     # or batch, always
#
# It waits for the harness's proxy to get busy, attaches `perf stat` to it
# for 3 s, and divides by the tools/call requests the proxy's own /metrics
# counted over the same window. Needs perf with tracepoint access (root).
# perf costs the proxy a quarter of its throughput while attached, so read
# the counts, not the harness's req/s.
set -euo pipefail
sync=${1:-never}
cargo bench --bench load -- --scenario small --sync "$sync" --concurrency 32 --rounds 1 \
    --duration 8 >/dev/null 2>&1 &
harness=$!
pid=
for _ in $(seq 600); do
    pid=$(pgrep -f -- "--config /tmp/mcp-resume-proxy-load" | head -1 || true)
    [ -n "$pid" ] && break
    sleep 0.2
done
[ -n "$pid" ] || { echo "the harness started no proxy" >&2; exit 1; }
config=$(tr '\0' ' ' </proc/"$pid"/cmdline | awk '{print $3}')
addr=$(grep '^listen' "$config" | cut -d'"' -f2)
cpu() { cut -d')' -f2 /proc/"$pid"/stat | awk '{print $12 + $13}'; }
calls() {
    curl -s "http://$addr/metrics" |
        awk '/^mcp_proxy_requests_total\{/ && /tools\/call/ {s += $NF} END {print s + 0}'
}
# Busy: more than 40 ticks of CPU in half a second; then a second more.
prev=$(cpu)
while sleep 0.5; do
    now=$(cpu)
    [ $((now - prev)) -gt 40 ] && break
    prev=$now
done
sleep 1
before=$(calls)
counts=$(perf stat -x, -e 'syscalls:sys_enter_futex,raw_syscalls:sys_enter,context-switches,syscalls:sys_enter_pread64,syscalls:sys_enter_fdatasync' \
    -p "$pid" -- sleep 3 2>&1)
after=$(calls)
wait "$harness" || true
n=$((after - before))
echo "sync = $sync, c = 32: $n tools/call in 3 s"
echo "$counts" | awk -F, -v n="$n" 'NF > 2 {printf "  %-28s %9d  %6.2f per call\n", $3, $1, $1 / n}'
