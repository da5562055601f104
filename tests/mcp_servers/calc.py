"""A small MCP server for the tests: `python calc.py [stdio|http|sse] [name]`.

Over HTTP it binds 127.0.0.1 on a free port and prints `PORT <n>` on stdout once it listens.
"""

import asyncio
import os
import socket
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
server = MCPServer(sys.argv[2] if len(sys.argv) > 2 else "calc")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the given reason."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def env(name: str) -> str:
    """The value of an environment variable in the server's process ("" if unset)."""
    return os.environ.get(name, "")


@server.tool()
def cwd() -> str:
    """The server's working directory."""
    return os.getcwd()


@server.tool()
def read(path: str) -> str:
    """A file's text, or why it could not be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return f"cannot read: {e.strerror}"


@server.tool()
def write(path: str, text: str) -> str:
    """Write a file, or say why not."""
    try:
        with open(path, "w") as f:
            f.write(text)
        return "written"
    except OSError as e:
        return f"cannot write: {e.strerror}"


async def serve_http(sse: bool) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # before the port is told: a client may connect at once (uvicorn listens later)
    app = server.sse_app() if sse else server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


print("calc server starting", file=sys.stderr, flush=True)  # must land in the log, not the terminal
if transport == "stdio":
    server.run("stdio")
else:
    asyncio.run(serve_http(transport == "sse"))
