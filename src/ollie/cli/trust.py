"""`ollie trust`: let the MCP servers of a project's `.mcp.json` start, once you have read them.

A project's file starts nothing until trusted (`project_mcp`): sandboxed code writes the project,
and could declare a server there. This shows what the file would start, asks, and remembers the
sha256 of exactly the bytes shown; a file that changes afterwards asks again. What the file says
is printed with every unprintable character escaped (`project_mcp.shown`): it may be the model's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "trust",
        help="start the MCP servers of a project's .mcp.json (shows them, asks, remembers the file's hash)",
        description="A project's .mcp.json starts no server until you trust that exact content; a file that "
        "changes asks again. DIR's file and that of its git repository's root are the ones a session in DIR reads.",
    )
    p.add_argument("directory", nargs="?", metavar="DIR", help="the project (default: the current directory)")
    p.add_argument("-y", "--yes", action="store_true", help="trust what is shown without asking")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="the trusted files, and whether each is still as trusted")
    what.add_argument("--revoke", action="store_true", help="forget the trust of DIR's files")
    p.set_defaults(func=_trust)


def _trust(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    directory = os.path.realpath(os.path.expanduser(args.directory or os.getcwd()))
    if not os.path.isdir(directory):
        print(f"ollie trust: {directory} is not a directory", file=sys.stderr)
        return 2
    from .. import project_mcp

    dirs = project_mcp.directories(directory)
    if args.revoke:
        return _revoke(dirs)
    files = [f for f in map(project_mcp.read, dirs) if f is not None]
    if not files:
        where = " or ".join(os.path.join(d, project_mcp.FILE_NAME) for d in dirs)
        print(f"ollie trust: no {where}", file=sys.stderr)
        return 1
    status = 0
    for found in files:
        status = max(status, _trust_file(found, args.yes))
    return status


def _trust_file(found: Any, yes: bool) -> int:
    from .. import project_mcp
    from ..types import ConfigError

    if found.error:
        print(f"ollie trust: {project_mcp.shown(found.error)}", file=sys.stderr)
        return 1
    try:
        servers = found.servers()
    except ConfigError as e:
        print(f"ollie trust: {project_mcp.shown(str(e))}; fix it, then trust it", file=sys.stderr)
        return 1
    before = project_mcp.trusted_files().get(found.path, {}).get("sha256")
    if before == found.sha256:
        print(f"already trusted: {found.path}")
        return 0
    state = "changed since you trusted it" if before else "not trusted yet"
    print(f"{found.path} ({state}; sha256 {found.sha256[:16]}):")
    for line in _describe(servers, found) or ["  (no servers)"]:
        print(line)
    if names := found.variables():
        print(f"  it reads these variables of yours: {', '.join(names)}")
    print("  each stdio server runs in a jail of its own under the tools policy (the network, the project")
    print("  read-only), as an agent config's do; HTTP servers are reached by ollie itself")
    if not yes:
        if not sys.stdin.isatty():
            print(
                "ollie trust: not trusted: no terminal to ask on; read the above, then run with --yes", file=sys.stderr
            )
            return 1
        try:
            answer = input(f"Start these servers in sessions under {found.directory}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("not trusted")
            return 1
    project_mcp.trust(found)
    print(f"trusted: {found.path}; it starts its servers until it changes (ollie trust --revoke to undo)")
    return 0


def _describe(servers: dict[str, Any], found: Any) -> list[str]:
    """One line per server, more for what it is given; every word as the file has it, escaped. A
    server that will not start says why (`mcp.parse_spec` is what a session asks too)."""
    from .. import mcp
    from ..project_mcp import shown
    from ..types import ConfigError

    lines = []
    for name, raw in servers.items():
        head = f"  {shown(name)}: "
        if not isinstance(raw, dict):
            lines.append(head + f"will not start: not an object ({shown(repr(raw)[:80])})")
            continue
        note = ""
        try:
            if mcp.disabled(name, raw, found.path):
                note = " (disabled)"
            else:
                mcp.parse_spec(name, raw, found.directory, source=found.path)
        except ConfigError as e:
            why = str(e).removeprefix(f"{found.path}: mcpServers.{name}").lstrip(".: ")
            note = f" (will not start: {shown(why)})"
        if "command" in raw:
            args = raw.get("args")
            argv = [raw["command"], *(args if isinstance(args, list) else [args] if args else [])]
            lines.append(head + shown(shlex.join(map(str, argv))) + note)
            for key in ("cwd", "timeout", "startupTimeout"):
                if key in raw:
                    lines.append(f"      {key}: {shown(str(raw[key]))}")
            env = raw.get("env")
            for key, value in env.items() if isinstance(env, dict) else ():
                lines.append(f"      env {shown(str(key))}={shown(str(value))}")
        else:
            kind = raw.get("type") or raw.get("transport") or "http"
            lines.append(head + f"{shown(str(raw.get('url')))} ({shown(str(kind))})" + note)
            headers = raw.get("headers")
            for key, value in headers.items() if isinstance(headers, dict) else ():
                lines.append(f"      header {shown(str(key))}: {shown(str(value))}")
        known = {"command", "args", "env", "cwd", "url", "headers", "type", "transport", "timeout", "startupTimeout"}
        if others := sorted(set(raw) - known - {"disabled", "sandbox"}):
            lines.append(f"      other fields: {', '.join(shown(str(k)) for k in others)}")
    return lines


def _list() -> int:
    from .. import project_mcp

    files = project_mcp.trusted_files()
    if not files:
        print(f"no project {project_mcp.FILE_NAME} is trusted")
        return 0
    for path, entry in sorted(files.items()):
        found = project_mcp.read(os.path.dirname(path))
        if found is None:
            state = "missing"
        elif found.error:
            state = "unreadable"
        elif found.sha256 == entry["sha256"]:
            state = "trusted"
        else:
            state = "changed"
        print(f"{state:10} {project_mcp.shown(path)}  (sha256 {entry['sha256'][:16]}, {entry.get('at', '?')})")
    return 0


def _revoke(dirs: list[str]) -> int:
    from .. import project_mcp

    revoked = False
    for d in dirs:
        path = os.path.join(d, project_mcp.FILE_NAME)
        if project_mcp.revoke(path):
            print(f"revoked: {path}")
            revoked = True
    if not revoked:
        print(f"ollie trust: nothing to revoke: no {project_mcp.FILE_NAME} of {dirs[-1]} is trusted", file=sys.stderr)
        return 1
    return 0
