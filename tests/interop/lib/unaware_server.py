"""A task-UNAWARE MCP server for scenario j-tasks: the official Python SDK's
MCPServer (mcp 2.x) with the tool fixture the conformance tasks-* scenarios
expect. It knows nothing of the io.modelcontextprotocol/tasks extension:
every task a client sees comes from the proxy in front of it.

Timing suits a proxy with `task_after_ms = 500` (the scenario's proxy.toml):
  greet(name)                 instant                   -> plain result
  slow_compute(seconds,label) sleeps `seconds`          -> a task when seconds >= 1
  failing_job()               1 s, then isError:true    -> task, completed + isError
  protocol_error_job()        1 s, then JSON-RPC error  -> task, failed + error
  confirm_delete(filename)    1 s, then one MRTR ask    -> task, input_required
  multi_input()               1 s, then two MRTR asks   -> task, input_required (2 keys)
  test_tool_with_task()       round 1 instant MRTR (no task); round 2 1.5 s -> task

GET /stats answers what became of each slow_compute call, by label:
{"started": n, "finished": n, "cancelled": n, "calls": {label: state}}. A
cancelled call is one whose handler was cancelled because the request's
response was closed (the modern wire's cancellation), so the scenario can
tell that cancelling a task stopped the work here.

usage: python unaware_server.py PORT   (binds 127.0.0.1, endpoint /mcp)
"""
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import InputRequiredResult
from starlette.requests import Request
from starlette.responses import JSONResponse

mcp = MCPServer("task-unaware-fixture")
stats = {"started": 0, "finished": 0, "cancelled": 0, "calls": {}}


def ask(message: str, field: str) -> dict:
    """One elicitation/create input request for a form with one field."""
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": {field: {"type": "boolean" if field == "confirm" else "string"}},
                "required": [field],
            },
        },
    }


def input_required(requests: dict, state: str | None = None) -> InputRequiredResult:
    wire = {"resultType": "input_required", "inputRequests": requests}
    if state is not None:
        wire["requestState"] = state
    return InputRequiredResult.model_validate(wire)


def answered(answer, field: str):
    """The value of `field` in an elicitation answer (an ElicitResult)."""
    return (getattr(answer, "content", None) or {}).get(field)


@mcp.tool()
async def greet(name: str) -> str:
    return f"Hello, {name}!"


@mcp.tool()
async def slow_compute(seconds: float = 1, label: str = "") -> str:
    stats["started"] += 1
    stats["calls"][label] = "started"
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        stats["cancelled"] += 1
        stats["calls"][label] = "cancelled"
        raise
    stats["finished"] += 1
    stats["calls"][label] = "finished"
    return f"computed {label} after {seconds}s"


@mcp.tool()
async def failing_job() -> str:
    await anyio.sleep(1)
    raise ToolError("failing_job always fails (tool error)")


@mcp.tool()
async def protocol_error_job() -> str:
    await anyio.sleep(1)
    raise MCPError(code=-32603, message="protocol_error_job: internal failure")


@mcp.tool()
async def confirm_delete(filename: str, ctx: Context):
    answers = ctx.input_responses
    if not answers:
        # Slower than task_after_ms, so the question reaches the client as a
        # task in input_required rather than as a plain InputRequiredResult.
        await anyio.sleep(1)
        return input_required({"confirm": ask(f"Delete {filename}?", "confirm")}, state=f"delete:{filename}")
    return f"deleted {filename} (confirm={answered(answers.get('confirm'), 'confirm')})"


@mcp.tool()
async def multi_input(ctx: Context):
    answers = ctx.input_responses or {}
    if not ("first" in answers and "second" in answers):
        await anyio.sleep(1)
        return input_required({"first": ask("First name?", "name"), "second": ask("Second name?", "name")})
    return f"got both: {answered(answers['first'], 'name')}, {answered(answers['second'], 'name')}"


@mcp.tool()
async def test_tool_with_task(ctx: Context):
    answers = ctx.input_responses or {}
    if not answers:
        # Instant: round 1 is a plain InputRequiredResult (no task yet).
        return input_required({"user_name": ask("Your name?", "name")}, state="round-1")
    await anyio.sleep(1.5)
    (answer,) = answers.values()
    return f"Hello, {answered(answer, 'name')}!"


@mcp.custom_route("/stats", methods=["GET"])
async def get_stats(request: Request) -> JSONResponse:
    return JSONResponse(stats)


if __name__ == "__main__":
    mcp.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
