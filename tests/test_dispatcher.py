"""The dispatcher: routing, visible name collisions, argument validation, timeouts, server status."""

import asyncio

from ollie.tools import CallContext, Dispatcher, Tool, ToolResult, dispatcher_factory, format_status

CTX = CallContext(cwd="/")
NUMBERS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}


class Local:
    """An in-process tool server: the dispatcher treats it like any other."""

    def __init__(self, *tools: Tool, delay: float = 0.0, broken: str = "") -> None:
        self.tools, self.delay, self.broken = list(tools), delay, broken
        self.calls: list[tuple[str, dict]] = []
        self.cancelled = self.closed = False

    async def list_tools(self) -> list[Tool]:
        if self.broken:
            raise RuntimeError(self.broken)
        return self.tools

    async def call_tool(self, name, arguments, ctx):
        self.calls.append((name, arguments))
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if name == "explode":
            raise ConnectionError("pipe broke")
        if name == "own_timeout":  # a timeout of the server's own, as a jail slow to start raised it
            raise TimeoutError()
        if name == "plain":  # a server written in haste: text, not a ToolResult
            return "just text"
        return ToolResult.of(f"{name} {sorted(arguments.items())}")

    async def close(self) -> None:
        self.closed = True


def dispatcher(**servers) -> Dispatcher:
    d = Dispatcher()
    for name, server in servers.items():
        d.add_server(name, server)
    return d


async def test_routes_by_name_and_prefixes_colliding_names_with_the_server():
    a, b = Local(Tool("echo"), Tool("add", input_schema=NUMBERS)), Local(Tool("echo"), Tool("upper"))
    d = dispatcher(a=a, b=b)
    assert sorted(await d.list_tools()) == ["a__echo", "add", "b__echo", "upper"]
    assert (await d.dispatch("b__echo", {"x": 1}, CTX)).text() == "echo [('x', 1)]"
    assert b.calls == [("echo", {"x": 1})] and a.calls == []  # the server sees its own name
    assert (await d.dispatch("add", {"a": 1, "b": 2}, CTX)).text() == "add [('a', 1), ('b', 2)]"
    unknown = await d.dispatch("echo", {}, CTX)
    assert unknown.is_error and "unknown tool 'echo'" in unknown.text() and "a__echo" in unknown.text()


async def test_collision_names_do_not_depend_on_registration_order():
    names = [sorted(await dispatcher(**{n: Local(Tool("echo")) for n in order}).list_tools()) for order in ("xy", "yx")]
    assert names[0] == names[1] == ["x__echo", "y__echo"]


async def test_arguments_failing_the_schema_get_the_validation_message_and_never_reach_the_server():
    server = Local(Tool("add", input_schema=NUMBERS))
    d = dispatcher(calc=server)
    result = await d.dispatch("add", {"a": "one"}, CTX)
    assert result.is_error
    assert result.text() == (
        "invalid arguments for add:\n(arguments): 'b' is a required property\na: 'one' is not of type 'integer'"
    )
    not_object = await d.dispatch("add", ["1", "2"], CTX)  # type: ignore[arg-type]
    assert not_object.is_error and "expected a JSON object, got list" in not_object.text()
    assert server.calls == []


async def test_a_call_over_the_servers_timeout_is_cancelled_and_reported():
    slow = Local(Tool("wait"), delay=30)
    d = Dispatcher()
    d.add_server("slow", slow, timeout=0.1)
    result = await d.dispatch("wait", {}, CTX)
    assert result.is_error and result.text() == "tool wait timed out after 0.1 s (server slow)"
    assert slow.cancelled


async def test_a_servers_own_timeout_is_its_failure_not_ours():
    """A server without a dispatcher timeout raising TimeoutError (a jail that took over 10 s to
    start) failed the turn with "unsupported format string passed to NoneType"."""
    d = dispatcher(own=Local(Tool("own_timeout")))
    result = await d.dispatch("own_timeout", {}, CTX)
    assert result.is_error and result.text() == "tool own_timeout failed: timed out"


async def test_a_failing_server_gives_an_error_result_and_the_others_carry_on():
    d = dispatcher(bad=Local(Tool("explode")), good=Local(Tool("fine")), gone=Local(broken="connection refused"))
    result = await d.dispatch("explode", {}, CTX)
    assert result.is_error and result.text() == "tool explode failed: pipe broke"
    assert (await d.dispatch("fine", {}, CTX)).text() == "fine []"
    missing = await d.dispatch("gone_tool", {}, CTX)
    assert "server gone is unavailable: connection refused" in missing.text()


async def test_a_server_that_returns_no_tool_result_gives_an_error_result_saying_so():
    """A user's server returning a `str` ended the turn with "'str' object has no attribute 'text'"."""
    d = dispatcher(mine=Local(Tool("plain")))
    result = await d.dispatch("plain", {}, CTX)
    assert result.is_error and result.text() == "tool plain failed: server mine returned a str, not a ToolResult"


async def test_server_status_shows_each_server_its_tools_and_why_it_is_unavailable():
    d = dispatcher(a=Local(Tool("echo", "Repeat the text.\nMore.")), b=Local(Tool("echo")), c=Local(broken="exited"))
    status = await d.server_status()
    assert {n: (sorted(s.tools), s.error) for n, s in status.items()} == {
        "a": (["a__echo"], ""),
        "b": (["b__echo"], ""),
        "c": ([], "exited"),
    }
    assert format_status(status) == "a: ok\n  a__echo: Repeat the text.\nb: ok\n  b__echo\nc: unavailable: exited"


async def test_the_factory_builds_fresh_servers_and_close_closes_them_all():
    factory = dispatcher_factory({"local": lambda: Local(Tool("echo"))})
    first, second = factory(), factory()
    old = first.get_server("local")
    assert old is not second.get_server("local")
    await first.close()
    assert old.closed and first.servers() == {}
    assert not second.get_server("local").closed
