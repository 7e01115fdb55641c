"""Official Python SDK (mcp 2.x) client for scenario b.

Connects with mcp.Client(url, mode=...), calls trigger-long-running-operation
with a progress callback and prints one JSON line per event on stdout, so the
Node driver (b-py-resume.mjs) can cut the relay at the right moment and check
what arrived.

usage: python py_client.py URL auto|legacy DURATION STEPS
"""

import json
import sys
import time

import anyio
from mcp import Client

url, mode = sys.argv[1], sys.argv[2]
duration, steps = float(sys.argv[3]), int(sys.argv[4])
t0 = time.monotonic()


def emit(kind: str, **fields: object) -> None:
    print(json.dumps({"event": kind, "ms": int((time.monotonic() - t0) * 1000), **fields}), flush=True)


async def on_progress(progress: float, total: float | None, message: str | None) -> None:
    emit("progress", progress=progress, total=total)


async def main() -> None:
    async with Client(url, mode=mode) as client:
        emit("connected", protocol=str(client.protocol_version), server=str(client.server_info.name))
        tools = (await client.list_tools()).tools
        emit("tools", names=[t.name for t in tools])
        res = await client.call_tool(
            "trigger-long-running-operation",
            {"duration": duration, "steps": steps},
            read_timeout_seconds=60,
            progress_callback=on_progress,
        )
        emit("result", result=json.loads(res.model_dump_json(exclude_none=True)))
        echo = await client.call_tool("echo", {"message": "still here"})
        emit("echo", result=json.loads(echo.model_dump_json(exclude_none=True)))
    emit("closed")


anyio.run(main)
