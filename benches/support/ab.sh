#!/bin/bash
# Runs the load harness against two (or more) proxy binaries in turns, so that
# a change is compared with the commit before it in the same sitting: this
# machine's speed drifts by more than most changes (BENCHMARKS.md, method).
#
#   cargo build --release && cp target/release/mcp-resume-proxy /tmp/proxy-new
#   (the same at the commit before, copied to /tmp/proxy-old)
#   cargo bench --bench load --no-run
#   benches/support/ab.sh "/tmp/proxy-old /tmp/proxy-new" 3 --scenario small --sync batch --concurrency 1
#
# Arguments: the binaries (one string), how many turns, then the harness's own
# options. Prints each run's result rows, headed by the binary.
set -euo pipefail
bins=$1
turns=$2
shift 2
harness=$(ls -t target/release/deps/load-* 2>/dev/null | grep -v '\.d$' | head -1)
if [ -z "$harness" ]; then
    echo "no harness binary: run 'cargo bench --bench load --no-run' first" >&2
    exit 2
fi
for turn in $(seq 1 "$turns"); do
    for bin in $bins; do
        echo "== $bin, turn $turn"
        MCP_RESUME_PROXY_BIN=$bin "$harness" --bench "$@" 2>&1 |
            grep -E '^(target|direct|floor|proxy|plain|dialect|nginx|mcp-)' || true
    done
done
