"""FastMCP 4.1 client with fastmcp-tasks for scenario j-tasks, driven one
command per line on stdin so the Node driver can kill and restart the proxy
between the steps of one task. Every command answers one JSON line on stdout
({"cmd": ..., "ok": true, ...} or {"cmd": ..., "ok": false, "error": ...}),
bounded by STEP_TIMEOUT seconds, so a proxy that never answers cannot hang
the scenario. Elicitations answered by the handler are reported as they
happen ({"event": "elicitation", "message": ...}).

commands:
  fast                      greet via call_tool (plain result expected), then
                            call_tool_task on greet (ToolError expected: no task)
  slow                      call_tool_task slow_compute 2 s: create result,
                            status, result()
  cancel LABEL              call_tool_task slow_compute 60 s, cancel(), wait()
  mrtr                      call_tool_task confirm_delete, result() (answers
                            input_required through the elicitation handler)
  compose                   call_tool test_tool_with_task (round 1 a plain
                            InputRequiredResult, round 2 a task)
  start NAME SECONDS        call_tool_task slow_compute SECONDS (label NAME);
                            keeps the handle under NAME
  result NAME               the kept handle's result()

usage: python tasks_client.py URL
"""
import asyncio
import json
import sys
import time

import fastmcp_tasks  # noqa: F401  (importing it registers the client half)
from fastmcp import Client
from fastmcp.exceptions import ToolError
from fastmcp_tasks import call_tool_task

STEP_TIMEOUT = 30
# A task is created within task_after_ms (500 ms); a proxy that relays a long
# call instead should fail the step in seconds, not after the whole call.
CREATE_TIMEOUT = 10
T0 = time.monotonic()
handles = {}


def emit(**fields) -> None:
    print(json.dumps({"ms": int((time.monotonic() - T0) * 1000), **fields}), flush=True)


def text(result) -> str:
    return result.content[0].text if result.content else ""


async def on_elicit(message, response_type, params, context):
    emit(event="elicitation", message=message)
    return {"confirm": True, "name": "Alice"}


async def run(client: Client, cmd: str, args: list[str]) -> dict:
    if cmd == "fast":
        plain = text(await client.call_tool("greet", {"name": "World"}))
        try:
            await call_tool_task(client, "greet", {"name": "x"})
            as_task = None
        except ToolError as e:
            as_task = str(e)
        return {"text": plain, "task_error": as_task}
    if cmd == "slow":
        t = time.monotonic()
        task = await call_tool_task(client, "slow_compute", {"seconds": 2, "label": "slow"})
        created_ms = int((time.monotonic() - t) * 1000)
        create = task.create_result.model_dump(by_alias=True, exclude_none=True, mode="json")
        status = (await task.status()).status
        return {"create": create, "created_ms": created_ms, "status": status, "text": text(await task.result())}
    if cmd == "cancel":
        task = await call_tool_task(client, "slow_compute", {"seconds": 60, "label": args[0]}, timeout=CREATE_TIMEOUT)
        await task.cancel()
        final = await task.wait(timeout=10)
        return {"task_id": task.task_id, "status": final.status}
    if cmd == "mrtr":
        task = await call_tool_task(client, "confirm_delete", {"filename": "a.txt"})
        return {"task_id": task.task_id, "text": text(await task.result())}
    if cmd == "compose":
        return {"text": text(await client.call_tool("test_tool_with_task", {}))}
    if cmd == "start":
        name, seconds = args[0], float(args[1])
        handles[name] = await call_tool_task(
            client, "slow_compute", {"seconds": seconds, "label": name}, timeout=CREATE_TIMEOUT)
        return {"task_id": handles[name].task_id}
    if cmd == "result":
        return {"text": text(await handles[args[0]].result())}
    raise ValueError(f"unknown command {cmd!r}")


async def main() -> None:
    async with Client(sys.argv[1], elicitation_handler=on_elicit) as client:
        emit(event="connected")
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            cmd, *args = line.split()
            try:
                out = await asyncio.wait_for(run(client, cmd, args), STEP_TIMEOUT)
                emit(cmd=cmd, ok=True, **out)
            except Exception as e:  # reported to the driver, which judges it
                emit(cmd=cmd, ok=False, error=f"{type(e).__name__}: {e}")


asyncio.run(main())
