"""A small MCP server over stdio for the tool-loop tests: one tool that works, and the ways a
tool server goes wrong (a tool error, a crash, a hang). `garbage` as the first argument makes a
process that answers every line with text that is not JSON-RPC."""
import os
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "garbage":
    for _line in sys.stdin:
        sys.stdout.write("this is not JSON-RPC\n")
        sys.stdout.flush()
    sys.exit(0)

from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

server = MCPServer("tramontane-test-tools")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the given reason (reported to the client, not a crash)."""
    raise ToolError(reason)


@server.tool()
def crash() -> str:
    """Ends the server process."""
    os._exit(3)


@server.tool()
def hang() -> str:
    """Never answers."""
    time.sleep(3600)
    return "late"


if __name__ == "__main__":
    server.run("stdio")
