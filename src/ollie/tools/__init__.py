"""Tool servers and the dispatcher that routes every tool call.

All servers are equal: the built-in `execute` server and MCP-backed ones implement the same
`Server` protocol and are registered by name. A `Decl` is a zero-argument factory returning a
fresh server; `new_dispatcher_func` turns a map of name → Decl into a dispatcher factory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..types import ToolSpec


@dataclass(slots=True)
class Tool:
    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    read_only: bool = False  # safe to run concurrently with other read-only calls

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


@runtime_checkable
class Server(Protocol):
    async def list_tools(self) -> list[Tool]: ...

    async def call_tool(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult: ...

    async def close(self) -> None: ...


Decl = Callable[[], Server]


class Dispatcher:
    """Routes a tool name to the server that offers it. Names offered by more than one server
    are shown as `<server>__<tool>` for every server that offers them, so no call is ambiguous."""

    def __init__(self) -> None:
        self._servers: dict[str, Server] = {}
        self._routes: dict[str, tuple[str, Tool]] | None = None

    def add_server(self, name: str, server: Server) -> None:
        self._servers[name] = server
        self._routes = None

    def get_server(self, name: str) -> Server | None:
        return self._servers.get(name)

    def servers(self) -> dict[str, Server]:
        return dict(self._servers)

    async def _route_table(self) -> dict[str, tuple[str, Tool]]:
        if self._routes is None:
            names = list(self._servers)
            listed = await asyncio.gather(*(self._servers[n].list_tools() for n in names), return_exceptions=True)
            offered: dict[str, list[tuple[str, Tool]]] = {}
            for server_name, tools in zip(names, listed):
                if isinstance(tools, BaseException):
                    continue  # a broken server offers nothing; it reports why in its own status
                for tool in tools:
                    offered.setdefault(tool.name, []).append((server_name, tool))
            routes: dict[str, tuple[str, Tool]] = {}
            for tool_name, owners in offered.items():
                if len(owners) == 1:
                    routes[tool_name] = owners[0]
                else:
                    for server_name, tool in owners:
                        routes[f"{server_name}__{tool_name}"] = (server_name, tool)
            self._routes = routes
        return self._routes

    def invalidate(self) -> None:
        """Forget the route table (a server's tool list changed)."""
        self._routes = None

    async def list_tools(self) -> dict[str, Tool]:
        """Every tool by the name a model calls it."""
        return {name: tool for name, (_, tool) in (await self._route_table()).items()}

    async def dispatch(self, name: str, arguments: dict[str, Any], ctx: CallContext) -> ToolResult:
        routes = await self._route_table()
        route = routes.get(name)
        if route is None:
            known = ", ".join(sorted(routes)) or "none"
            what = f"unknown tool {name!r}" if name else "empty tool name"
            return ToolResult.of(f"{what}; available tools: {known}", is_error=True)
        server_name, tool = route
        try:
            return await self._servers[server_name].call_tool(tool.name, arguments, ctx)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a server's failure is the call's result, never the session's end
            return ToolResult.of(f"tool {name} failed: {e}", is_error=True)

    async def close(self) -> None:
        servers, self._servers, self._routes = list(self._servers.values()), {}, None
        await asyncio.gather(*(s.close() for s in servers), return_exceptions=True)


def new_dispatcher_func(decls: Mapping[str, Decl]) -> Callable[[], Dispatcher]:
    """A factory that builds a fresh dispatcher with fresh servers on every call."""

    def build() -> Dispatcher:
        d = Dispatcher()
        for name, decl in decls.items():
            d.add_server(name, decl())
        return d

    return build
