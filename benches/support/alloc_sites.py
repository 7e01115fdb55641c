#!/usr/bin/env python3
"""Where a proxy's heap allocations come from, per call, from a DHAT profile.

Run the proxy under valgrind's DHAT through the load harness, stop it with
SIGTERM (DHAT writes its profile when the process exits), then read it:

    printf '#!/bin/sh\\nvalgrind --tool=dhat --dhat-out-file=/tmp/dhat.%%p.json %s "$@" &\\nwait\\n' \\
        "$PWD/target/release/mcp-resume-proxy" > /tmp/proxy-dhat && chmod +x /tmp/proxy-dhat
    MCP_RESUME_PROXY_BIN=/tmp/proxy-dhat cargo bench --bench load -- --scenario small \\
        --sync batch --concurrency 32 --rounds 1 --duration 4 --warmup 1
    pkill -TERM -f tool=dhat; sleep 15
    benches/support/alloc_sites.py /tmp/dhat.*.json 40

(The wrapper backgrounds valgrind so that the harness's SIGKILL of the
wrapper leaves the proxy to be stopped gracefully.) Counts are divided by
the number of relays the proxy built, one per upstream exchange of a call.
Each line names the first frame outside the standard library and the
collections: the code that asked. A count, not a time: the same binary and
load give the same census whatever else the machine does, though batching
under valgrind (one thread at a time) amortises the log's per-batch
allocations over more calls than a native run does.
"""
import collections
import json
import re
import sys

LIBRARY = re.compile(
    r"library/(std|alloc|core)/|vgpreload|/rustc/|raw_vec|alloc\.rs|boxed\.rs|sync\.rs"
    r"|vec/mod\.rs|slice\.rs|bytes\.rs|bytes_mut\.rs|spec_|string\.rs|str\.rs|raw/mod\.rs"
    r"|hashbrown|map\.rs|value\.rs|name\.rs|byte_str\.rs|clone\.rs|borrow\.rs|rc\.rs"
    r"|into_iter|vec_deque|collect|iter"
)
ANCHOR = "new<mcp_resume_proxy::relay::Relay>"


def frame(text):
    m = re.search(r"0x[0-9A-F]+: (.*) \((.*)\)$", text)
    return (m.group(1), m.group(2)) if m else (text, "")


def main():
    profile = json.load(open(sys.argv[1]))
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    frames = profile["ftbl"]
    sites = collections.Counter()
    relays = 0
    for point in profile["pps"]:
        stack = [frame(frames[f]) for f in point["fs"]]
        if any(ANCHOR in fn for fn, _ in stack):
            relays += point["tbk"]
        asker = next(
            (f"{loc}  [{fn[:70]}]" for fn, loc in stack
             if loc and not LIBRARY.search(loc) and not loc.startswith("in ")),
            "?",
        )
        sites[asker] += point["tbk"]
    calls = max(relays, 1)
    print(f"{sum(sites.values()) / calls:.1f} allocations per call ({relays} relays)")
    for asker, blocks in sites.most_common(top):
        print(f"{blocks / calls:7.2f}  {asker}")


if __name__ == "__main__":
    main()
