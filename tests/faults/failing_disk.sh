#!/bin/bash
# A real write-back error under the proxy, from outside: the data directory is an ext4 file
# system on a loop device whose backing file lives on a small tmpfs. After one good call, the
# blocks of the active segment past what is on disk are punched out of the backing file and the
# tmpfs is filled, so the next `fdatasync` fails with ENOSPC as a failing disk's would. Space is
# then given back, two more calls are made, the proxy is killed with -9, clean pages are dropped
# (what the disk really holds is read back) and the proxy is started again.
#
# What a proxy that stops its log on a failed flush shows: the call in flight when the flush fails
# ends at once (its SSE stream closes), the calls after it are refused (503) and `/healthz` says
# 503; after the restart it starts, and every call a client saw complete is there. Before the log
# stopped (`2d8d95b`), calls 12 and 13 completed after the failure, `/healthz` said 200, and the
# restart refused to start ("stored record is corrupt … record checksum mismatch"), their entries
# lost.
#
# This lab disk lies once, and the proxy cannot see it: the loop driver reports a write that the
# full tmpfs cut short as done (a short write completes the request without error), so the one
# flush that first crosses into the failing blocks is reported durable while its tail is lost.
# The call in flight may therefore lose the last event it showed; the next flush reports the
# error. A disk that reports its errors loses nothing a client saw.
#
# Manual: needs root, losetup, mkfs.ext4, filefrag and fallocate; not run by `cargo test`.
#   cargo build --release && cargo bench --bench load --no-run
#   sudo tests/faults/failing_disk.sh target/release/mcp-resume-proxy
set -uo pipefail
BIN=$(realpath "${1:-target/release/mcp-resume-proxy}")
HARNESS=$(ls -t target/release/deps/load-* 2>/dev/null | grep -v '\.d$' | head -1)
[ -n "$HARNESS" ] || { echo "build the load harness first: cargo bench --bench load --no-run" >&2; exit 2; }
BACK=$(mktemp -d) DISK=$(mktemp -d) LOGS=$(mktemp -d)
PROXY=127.0.0.1:39402 UPSTREAM=127.0.0.1:39401
LOOP=
cleanup() {
    pkill -f -- "--listen $PROXY" ; pkill -f -- "upstream --port ${UPSTREAM##*:}"
    sleep 0.3
    umount "$DISK" 2>/dev/null; [ -n "$LOOP" ] && losetup -d "$LOOP"; umount "$BACK" 2>/dev/null
    rmdir "$BACK" "$DISK"
}
trap cleanup EXIT
mount -t tmpfs -o size=80M tmpfs "$BACK" && truncate -s 64M "$BACK/disk.img"
LOOP=$(losetup -f --show "$BACK/disk.img")
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$LOOP" && mount -o errors=continue "$LOOP" "$DISK"
(setsid "$HARNESS" upstream --port "${UPSTREAM##*:}" >"$LOGS/upstream.log" 2>&1 &)
start() {
    (setsid "$BIN" --listen $PROXY --upstream "http://$UPSTREAM/mcp" --data-dir "$DISK/data" >>"$LOGS/proxy.log" 2>&1 &)
    sleep 1
}
health() { curl -s -o /dev/null -w '%{http_code}' "http://$PROXY/healthz"; }
client() {
    python3 - "$@" <<'PY'
import json, sys, urllib.request
base, sid_file = "http://127.0.0.1:39402/mcp", sys.argv[2]
def post(body, sid=None):
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if sid: h["Mcp-Session-Id"] = sid
    req = urllib.request.Request(base, data=json.dumps(body).encode(), headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Mcp-Session-Id"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, None, e.read().decode()
    except Exception as e:
        return 0, None, "error: " + str(e)
if sys.argv[1] == "init":
    st, sid, _ = post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    open(sid_file, "w").write(sid or "")
    print(f"initialize: HTTP {st}")
else:
    i = int(sys.argv[3])
    st, _, body = post({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"progress": 100, "sse": True},
        "_meta": {"progressToken": f"p{i}"}}}, open(sid_file).read())
    print(f"call {i}: HTTP {st}, {body.count('notifications/progress')} progress events, "
          f"result {'seen' if chr(34) + 'result' + chr(34) in body else 'not seen'}")
    if st == 0: print("   ", body[:200])
PY
}
start
client init "$LOGS/sid"
client call "$LOGS/sid" 10
SEG=$(ls "$DISK"/data/journal/*.seg | tail -1)
PHYS=$(filefrag -v "$SEG" | awk '/^ *0:/{gsub(/\.\./," "); print $4}')
BLOCK=$(stat -f -c %S "$DISK")
END=$(python3 -c "import sys; d=open(sys.argv[1],'rb').read(); print((len(d.rstrip(bytes(1)))+4095)//4096*4096)" "$SEG")
echo "-- the disk fails past byte $END of $(basename "$SEG")"
fallocate -p -o $((PHYS * BLOCK + END)) -l $((1024 * 1024 - END)) "$BACK/disk.img"
dd if=/dev/zero of="$BACK/filler" bs=1M 2>/dev/null
client call "$LOGS/sid" 11
echo "-- the disk has room again"
rm "$BACK/filler"
client call "$LOGS/sid" 12
client call "$LOGS/sid" 13
echo "/healthz: $(health)"
echo "-- kill -9, drop clean pages, start again"
pkill -9 -f -- "--listen $PROXY"; sleep 0.5
sync; echo 3 >/proc/sys/vm/drop_caches
start
echo "/healthz after the restart: $(health)"
grep -E "corrupt|torn" "$LOGS/proxy.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200
"$BIN" streams list --data-dir "$DISK/data" 2>&1
rm -r "$LOGS"
