"""`ollie tools list` and `ollie tools call`: an agent's tools, run without a model, as a session of
that agent would run them (its cwd, its tool servers, the sandbox policies its "sandboxes" allow).

What a tool server says (its tools' names and descriptions, a call's output, its errors) is printed
with its control characters escaped (`chatfmt.visible`): a tool must not drive the terminal.
`--json` is ASCII-only JSON, escaped already."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("tools", help="list or call an agent's tools directly, without a model")
    sub = p.add_subparsers(dest="tools_command", metavar="{list,call}", required=True)
    lp = sub.add_parser("list", help="the agent's tool servers, their health and their tools")
    lp.add_argument("--json", action="store_true", help='print {server: {"error": ..., "tools": [...]}}')
    _common(lp)
    lp.set_defaults(func=_list)
    cp = sub.add_parser("call", help="call a tool and print its result; exit status 1 on a tool error")
    cp.add_argument("tool", help="the tool's name as `ollie tools list` shows it")
    cp.add_argument("arguments", metavar="JSON", help="the arguments as a JSON object ('-' reads them from stdin)")
    _common(cp)
    cp.set_defaults(func=_call)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", default="default", help="the agent whose tools to use (default: default)")
    p.add_argument("--cwd", help="the working directory for the tools (default: the current one)")


def _list(args: argparse.Namespace) -> int:
    return _run(args, _print_list)


def _call(args: argparse.Namespace) -> int:
    import json

    text = sys.stdin.read() if args.arguments == "-" else args.arguments
    try:
        args.parsed = json.loads(text)
    except json.JSONDecodeError as e:
        print(f"ollie tools call: invalid JSON arguments at line {e.lineno} column {e.colno}: {e.msg}", file=sys.stderr)
        return 2
    if not isinstance(args.parsed, dict):
        print("ollie tools call: the arguments must be a JSON object, e.g. '{\"x\": 1}'", file=sys.stderr)
        return 2
    return _run(args, _print_call)


def _run(args: argparse.Namespace, action: Callable[[argparse.Namespace, Any], Awaitable[int]]) -> int:
    import asyncio

    from .install import first_use

    first_use()  # as `ollie run` does: the default agents and tool scripts on a fresh machine
    return asyncio.run(_with_env(args, action))  # a ConfigError reaches `ollie` main, which prints it


async def _with_env(args: argparse.Namespace, action: Callable[[argparse.Namespace, Any], Awaitable[int]]) -> int:
    from .. import config
    from ..agent.env import build_agent_env
    from ..chatfmt import visible
    from ..tools import dispatcher_factory, execute
    from ..types import ConfigError

    cwd = os.path.realpath(os.path.expanduser(args.cwd or os.getcwd()))
    if not os.path.isdir(cwd):
        raise ConfigError(f"--cwd {cwd!r} is not a directory")
    cfg = config.load_agent(args.agent)
    env = await build_agent_env(cfg, dispatcher_factory({"execute": execute.factory(cwd)})(), cwd)
    try:
        for info in env.infos:
            print(visible(f":: {info}"), file=sys.stderr)  # a server's failure, in its words
        return await action(args, env)
    finally:
        await env.dispatcher.close()


async def _print_list(args: argparse.Namespace, env: Any) -> int:
    from ..chatfmt import visible
    from ..tools import format_status

    status = await env.dispatcher.server_status()
    if args.json:
        import json

        out = {
            name: {
                "error": st.error,
                "tools": [
                    {"name": n, "description": t.description, "input_schema": t.input_schema}
                    for n, t in st.tools.items()
                ],
            }
            for name, st in status.items()
        }
        print(json.dumps(out, indent=2))
    else:
        print(visible(format_status(status)))
    return 0


async def _print_call(args: argparse.Namespace, env: Any) -> int:
    import shutil
    import tempfile

    from .. import config
    from ..chatfmt import visible
    from ..tools import CallContext

    config.tmp_path().mkdir(parents=True, exist_ok=True, mode=0o700)
    tmpdir = tempfile.mkdtemp(prefix="tools-", dir=config.tmp_path())
    try:
        ctx = CallContext(
            cwd=env.cwd,
            session_id=os.path.basename(tmpdir),
            tmpdir=tmpdir,
            policies=tuple(env.config.sandboxes),  # as a session of the agent runs its calls
        )
        result = await env.dispatcher.dispatch(args.tool, args.parsed, ctx)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    text = visible(result.text())
    print(text, end="" if text.endswith("\n") else "\n", file=sys.stderr if result.is_error else sys.stdout)
    return 1 if result.is_error else 0
