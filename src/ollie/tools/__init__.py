"""Tool servers and the dispatcher that routes every tool call.

All servers are equal: the built-in `execute` server and MCP-backed ones implement the same
`Server` protocol and are registered by name. A `ServerFactory` is a zero-argument callable
returning a fresh server; `dispatcher_factory` turns a map of name → ServerFactory into a
dispatcher factory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..types import ToolSpec


@dataclass(slots=True)
class Tool:
    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    read_only: bool = False  # safe to run concurrently with other read-only calls
    # For a tool that is read-only for some arguments only: decides per call (read_only stays False).
    read_only_call: Callable[[dict[str, Any]], bool] | None = None

    def reads_only(self, arguments: dict[str, Any]) -> bool:
        return self.read_only or (self.read_only_call is not None and self.read_only_call(arguments))

    def spec(self, name: str | None = None) -> ToolSpec:
        return ToolSpec(name or self.name, self.description, self.input_schema)


@dataclass(slots=True)
class ToolResult:
    """MCP's result shape: a list of content blocks and an error flag."""

    content: list[dict[str, Any]] = field(default_factory=list)
    is_error: bool = False

    @classmethod
    def of(cls, text: str, is_error: bool = False) -> ToolResult:
        return cls([{"type": "text", "text": text}], is_error)

    def text(self) -> str:
        parts = []
        for block in self.content:
            if block.get("type") == "text":
                parts.append(block.get("text", ""))
            else:
                parts.append(f"[{block.get('type', 'content')} block]")
        return "\n".join(parts)


@dataclass(slots=True)
class CallContext:
    """What a call needs to know about the session that makes it."""

    cwd: str = ""
    session_id: str = ""
    env: dict[str, str] = field(default_factory=dict)  # the session env (`Core.set_env`)
    tmpdir: str = ""
    policies: tuple[str, ...] = ("default",)  # the sandbox policies the agent's model may pick


@runtime_checkable
class Server(Protocol):
    async def list_tools(self) -> list[Tool]: ...

    async def call_tool(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult: ...

    async def close(self) -> None: ...


ServerFactory = Callable[[], Server]


@dataclass(slots=True)
class ServerStatus:
    """What `/mcp` shows for one server."""

    tools: dict[str, Tool]  # by the name a model calls them
    error: str = ""  # why its tools are unavailable ("" when healthy)


class Dispatcher:
    """Routes a tool name to the server that offers it. Names offered by more than one server
    are shown as `<server>__<tool>` for every server that offers them, so no call is ambiguous,
    but for a server added as keeping its names (ollie's own `execute_code`, which the system
    prompt names), whose tools keep them. Arguments are checked against the tool's input schema
    before the server sees them."""

    def __init__(self) -> None:
        self._servers: dict[str, Server] = {}
        self._timeouts: dict[str, float | None] = {}
        self._routes: dict[str, tuple[str, Tool]] | None = None
        self._errors: dict[str, str] = {}  # server → why its tools are missing from the routes
        self._validators: dict[str, Any] = {}
        self._keeping: set[str] = set()  # servers whose tools keep their names in a clash

    def add_server(self, name: str, server: Server, timeout: float | None = None, keeps_names: bool = False) -> None:
        """Register a server; `timeout` (seconds) bounds each of its calls."""
        self._servers[name] = server
        if keeps_names:
            self._keeping.add(name)
        self._timeouts[name] = timeout
        self.invalidate()

    def get_server(self, name: str) -> Server | None:
        return self._servers.get(name)

    def servers(self) -> dict[str, Server]:
        return dict(self._servers)

    async def _route_table(self) -> dict[str, tuple[str, Tool]]:
        if self._routes is None:
            names = list(self._servers)
            listed = await asyncio.gather(*(self._servers[n].list_tools() for n in names), return_exceptions=True)
            offered: dict[str, list[tuple[str, Tool]]] = {}
            self._errors = {}
            for server_name, tools in zip(names, listed, strict=True):
                if isinstance(tools, BaseException):
                    self._errors[server_name] = str(tools) or type(tools).__name__
                    continue
                for tool in tools:
                    offered.setdefault(tool.name, []).append((server_name, tool))
            routes: dict[str, tuple[str, Tool]] = {}
            for tool_name, owners in offered.items():
                if len(owners) == 1:
                    routes[tool_name] = owners[0]
                    continue
                for server_name, tool in owners:
                    keeps = server_name in self._keeping
                    routes[tool_name if keeps else f"{server_name}__{tool_name}"] = (server_name, tool)
            self._routes = routes
        return self._routes

    def invalidate(self) -> None:
        """Forget the route table (a server's tool list or health changed)."""
        self._routes = None
        self._validators = {}

    async def list_tools(self) -> dict[str, Tool]:
        """Every tool by the name a model calls it."""
        return {name: tool for name, (_, tool) in (await self._route_table()).items()}

    async def server_status(self) -> dict[str, ServerStatus]:
        """Every server, its tools and its health, asked afresh."""
        self.invalidate()
        routes = await self._route_table()
        status = {name: ServerStatus({}, self._errors.get(name, "")) for name in self._servers}
        for routed, (server_name, tool) in routes.items():
            status[server_name].tools[routed] = tool
        return status

    async def dispatch(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        routes = await self._route_table()
        route = routes.get(name)
        if route is None and self._errors:  # a server that was down may be back (an MCP server restarts)
            self.invalidate()
            routes = await self._route_table()
            route = routes.get(name)
        if route is None:
            return ToolResult.of(self._unknown(name, routes), is_error=True)
        invalid = self._check_arguments(name, route[1], arguments)
        if invalid:
            return ToolResult.of(invalid, is_error=True)
        server_name, tool = route
        timeout = self._timeouts.get(server_name)
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                result = await self._servers[server_name].call_tool(tool.name, arguments, ctx)
        except TimeoutError as e:
            if not scope.expired():  # a timeout of the server's own (none of ours may be set): its failure
                return ToolResult.of(f"tool {name} failed: {str(e) or 'timed out'}", is_error=True)
            return ToolResult.of(f"tool {name} timed out after {timeout:g} s (server {server_name})", is_error=True)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a server's failure is the call's result, never the session's end
            self.invalidate()  # the server may be gone: the next listing shows it
            return ToolResult.of(f"tool {name} failed: {e}", is_error=True)
        if not isinstance(result, ToolResult):  # a server of the user's, written in haste
            kind = type(result).__name__
            return ToolResult.of(f"tool {name} failed: server {server_name} returned a {kind}, not a ToolResult", True)
        return result

    def _unknown(self, name: str, routes: dict[str, tuple[str, Tool]]) -> str:
        known = ", ".join(sorted(routes)) or "none"
        text = f"unknown tool {name!r}" if name else "empty tool name"
        text += f"; available tools: {known}"
        for server_name, error in self._errors.items():
            text += f"; server {server_name} is unavailable: {error}"
        return text

    def _check_arguments(self, name: str, tool: Tool, arguments: Any) -> str:
        """The validation message for arguments that fail the tool's input schema, else ""."""
        if not isinstance(arguments, dict):
            return f"invalid arguments for {name}: expected a JSON object, got {type(arguments).__name__}"
        validator = self._validators.get(name)
        if validator is None:
            from jsonschema.validators import validator_for  # lazy: ~40 ms to import

            validator = self._validators[name] = validator_for(tool.input_schema)(tool.input_schema)
        try:
            errors = sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.absolute_path)))
        except Exception:  # a schema jsonschema cannot use: the server checks for itself
            return ""
        if not errors:
            return ""
        lines = [f"{'/'.join(map(str, e.absolute_path)) or '(arguments)'}: {e.message[:300]}" for e in errors[:5]]
        return f"invalid arguments for {name}:\n" + "\n".join(lines)

    async def close(self) -> None:
        servers, self._servers = list(self._servers.values()), {}
        self.invalidate()
        await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)


def format_status(status: dict[str, ServerStatus]) -> str:
    """Servers, their health and their tools as `/mcp` and `ollie tools list` show them."""
    lines = []
    for server_name, st in status.items():
        lines.append(f"{server_name}: {'unavailable: ' + st.error if st.error else 'ok'}")
        for name, tool in st.tools.items():
            summary = tool.description.strip().splitlines()[0] if tool.description.strip() else ""
            lines.append(f"  {name}" + (f": {summary[:100]}" if summary else ""))
    return "\n".join(lines) or "(no tool servers)"


def dispatcher_factory(
    factories: Mapping[str, ServerFactory], keeping_names: Collection[str] = ()
) -> Callable[[], Dispatcher]:
    """A factory that builds a fresh dispatcher with fresh servers on every call (those named in
    `keeping_names` keep their tools' names when another server offers the same)."""

    def build() -> Dispatcher:
        d = Dispatcher()
        for name, make in factories.items():
            d.add_server(name, make(), keeps_names=name in keeping_names)
        return d

    return build
