"""A NATIVE task server for scenario j-tasks: FastMCP 4.1 with fastmcp-tasks'
TasksExtension (in-memory Docket), serving the same tool fixture as
unaware_server.py with the extension doing the work. The conformance tasks-*
scenarios run against it directly as the reference the proxy (in front of
unaware_server.py) is compared with.

test_tool_with_task (tasks-mrtr-composition) cannot be written natively:
FastMCP decides whether to task a call before the tool body runs, so a tool
that runs as a task cannot answer round 1 with a plain InputRequiredResult.
That scenario's second check fails here by construction.

usage: python native_server.py PORT   (binds 127.0.0.1, endpoint /mcp)
"""
import asyncio
import sys

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from mcp.shared.exceptions import MCPError
from mcp_types import InputRequiredResult

mcp = FastMCP("native-tasks-fixture")
mcp.add_extension(TasksExtension())  # memory:// backend


def ask(message: str, field: str) -> dict:
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]},
        },
    }


def input_required(requests: dict) -> InputRequiredResult:
    return InputRequiredResult.model_validate({"resultType": "input_required", "inputRequests": requests})


@mcp.tool()
async def greet(name: str) -> str:
    return f"Hello, {name}!"


@mcp.tool(task=True)
async def slow_compute(seconds: float = 1, label: str = "") -> str:
    await asyncio.sleep(seconds)
    return f"computed {label} after {seconds}s"


@mcp.tool(task=TaskConfig(mode="required"))
async def failing_job() -> str:
    await asyncio.sleep(1)
    raise ToolError("failing_job always fails (tool error)")


@mcp.tool(task=True)
async def protocol_error_job() -> str:
    await asyncio.sleep(1)
    raise MCPError(code=-32603, message="protocol_error_job: internal failure")


@mcp.tool(task=True)
async def confirm_delete(filename: str, ctx: Context):
    if not ctx.input_responses:
        return input_required({"confirm": ask(f"Delete {filename}?", "confirm")})
    return f"deleted {filename}"


@mcp.tool(task=True)
async def multi_input(ctx: Context):
    if not ctx.input_responses:
        return input_required({"first": ask("First name?", "name"), "second": ask("Second name?", "name")})
    return f"got both: {sorted(ctx.input_responses)}"


if __name__ == "__main__":
    # No banner: it is also what checks the package index for updates.
    mcp.run("http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
