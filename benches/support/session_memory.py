#!/usr/bin/env python3
"""Resident memory of a proxy per idle session (issue 36).

Starts the demo upstream (the binary's hidden `demo-upstream` subcommand) and
a proxy in front of it with a fresh data dir and the default config, opens a
few sessions to warm the allocator, reads the proxy's VmRSS, opens N more
sessions the way a client does (`initialize`, then
`notifications/initialized`, over one keep-alive connection), waits for the
log to settle and reads VmRSS again. Prints the difference per session.
The upstream's memory is not counted: it runs in a process of its own.

    benches/support/session_memory.py target/release/mcp-resume-proxy [N] [--fresh]

With --fresh every session is opened on a connection of its own, closed
after it (as a curl loop does); by default all share one connection.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

INITIALIZE = json.dumps({
    "jsonrpc": "2.0", "id": 0, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "memory", "version": "1"}},
})
INITIALIZED = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
HEADERS = {"content-type": "application/json",
           "accept": "application/json, text/event-stream"}


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_session(conn):
    conn.request("POST", "/mcp", INITIALIZE, HEADERS)
    res = conn.getresponse()
    session = res.getheader("mcp-session-id")
    body = res.read()
    if res.status != 200 or not session:
        raise RuntimeError(f"initialize: {res.status} {body[:200]!r}")
    headers = dict(HEADERS, **{"mcp-session-id": session,
                               "mcp-protocol-version": "2025-11-25"})
    conn.request("POST", "/mcp", INITIALIZED, headers)
    res = conn.getresponse()
    res.read()
    if res.status != 202:
        raise RuntimeError(f"notifications/initialized: {res.status}")
    return session


def wait_healthy(port):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the proxy did not answer /healthz")


def main():
    args = [a for a in sys.argv[1:] if a != "--fresh"]
    fresh = "--fresh" in sys.argv
    binary = os.path.abspath(args[0])
    n = int(args[1]) if len(args) > 1 else 2000
    with tempfile.TemporaryDirectory() as tmp:
        record = os.path.join(tmp, "demo-upstream")
        upstream = subprocess.Popen([binary, "demo-upstream", record],
                                    stdout=subprocess.PIPE, text=True)
        addr = upstream.stdout.readline().strip()
        # The upstream stays while this script is its live owner.
        with open(record, "w") as f:
            f.write(f"{upstream.pid} {addr} {os.getpid()}\n")
        port = free_port()
        env = dict(os.environ, RUST_LOG="warn")
        proxy = subprocess.Popen(
            [binary, "--upstream", f"http://{addr}/mcp",
             "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(tmp, "data")],
            env=env)
        try:
            wait_healthy(port)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for _ in range(20):
                open_session(conn)
            time.sleep(1)
            before = rss_kib(proxy.pid)
            started = time.time()
            for _ in range(n):
                if fresh:
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                open_session(conn)
            took = time.time() - started
            time.sleep(2)
            after = rss_kib(proxy.pid)
            per = (after - before) / n
            how = "a connection each" if fresh else "one connection"
            print(f"sessions {n} ({how}) in {took:.1f} s; VmRSS {before} KiB -> {after} KiB; "
                  f"{per:.1f} KiB per idle session")
        finally:
            proxy.terminate()
            proxy.wait()
            upstream.terminate()
            upstream.wait()


if __name__ == "__main__":
    main()
