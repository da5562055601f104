"""`ollie` (and `ollie chat`): the terminal frontend, built on the file interface only.

It talks to a server (the local one on its socket, started when none runs, or `--addr` over 9P
with a token) and drives a session by its files: writes `prompt` and `ctl`, follows `chat`,
`statewait`, `cfg`, `ctxsz` and `cost`. So the session in the terminal is the one scripts and
other agents see on the mount, and it outlives the terminal and the server.

    model.py    the conversation, parsed from the chat as it grows
    render.py   the conversation as styled text
    app.py      the full-screen app: keys, status line, the tasks that follow the session
    plain.py    line output, when stdout is no terminal
    client.py   the namespace over 9P
    shell.py    `!cmd` in the user's shell
    firstrun.py no backend configured: find a local server, or say what the embedded model is
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from ..chatfmt import visible
from .client import Connection, Namespace, Unreachable
from .firstrun import first_run, stale_server
from .plain import run_plain


def main(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        with open(os.path.expanduser(args.token_file)) as f:
            return f.read().strip()
    return os.environ.get("OLLIE_9P_TOKEN", "")


async def _main(args: argparse.Namespace) -> int:
    interactive = sys.stdout.isatty() and sys.stdin.isatty()
    if args.resume and not interactive:
        print("ollie: --resume needs a terminal to pick in; give --session ID", file=sys.stderr)
        return 2
    cwd = os.path.realpath(os.path.expanduser(args.cwd or os.getcwd()))
    conn = Connection(args.addr, _token(args) if args.addr else "", args.socket)
    try:
        ns = await conn.connect(start=True)
    except Unreachable as e:  # it may quote the server's answer
        print(visible(f"ollie: {e}"), file=sys.stderr)
        return 1
    notes: list[str] = []  # shown in the UI, once it is up
    try:
        sid = await choose_session(ns, args, cwd, interactive, notes)
        if sid is None:
            return 1
        if interactive:
            from .app import TuiApp, history_for

            app = TuiApp(conn, ns, sid, history_for(cwd), home=cwd)
            app.pending.extend(notes)
            if stale := await stale_server(ns):
                app.pending.append(stale)
            await app.run()
            sid, ns = app.sid, app.ns
            print(visible(f"session: {sid} (`ollie` here resumes it)"))  # a remote server names it
            return 0

        return await run_plain(ns, sid, sys.stdin, sys.stdout)
    finally:
        await ns.close()


async def choose_session(
    ns: Namespace, args: argparse.Namespace, cwd: str, interactive: bool, notes: list[str]
) -> str | None:
    """The session to open: --session, picked (--resume), this directory's last, or a new one; a
    resumed session takes the --agent, --backend and --model given. What the UI should say about
    the choice goes to `notes`."""
    sid: str | None = None
    if args.session:
        if not await ns.exists(f"s/{args.session}"):
            print(f"ollie: no session {args.session!r} on the server (see `ollie --resume`)", file=sys.stderr)
            return None
        sid = args.session
    elif args.resume:
        sid = await pick(ns)
        if sid is None:
            return None
    elif not args.new:
        sid = await ns.last_session(cwd)
    if sid is None:
        backend = args.backend
        if backend is None and ns.is_local and interactive and not args.agent:
            backend = await first_run(notes)
        return await ns.new_session(cwd=cwd, agent=args.agent, backend=backend, model=args.model)
    for key in ("agent", "backend", "model"):
        if value := getattr(args, key):
            line = f"{key} {value} {args.model}" if key == "backend" and args.model else f"{key} {value}"
            await ns.write(f"s/{sid}/ctl", line + "\n")
            if key == "backend":
                break  # the model went with it
    return sid


async def pick(ns: Namespace) -> str | None:
    sessions = await ns.sessions()
    if not sessions:
        print("ollie: no sessions yet; `ollie` starts one", file=sys.stderr)
        return None
    times = await asyncio.gather(*(ns.mtime(f"s/{s.id}/chat") for s in sessions))
    ordered = [s for _, _, s in sorted(zip(times, range(len(sessions)), sessions, strict=True), reverse=True)][:30]
    firsts = await asyncio.gather(*(ns.first_prompt(s.id) for s in ordered))
    for i, (s, first) in enumerate(zip(ordered, firsts, strict=True), 1):
        print(visible(f"{i:3}  {s.id}  {s.cwd}  {first[:50]}"))
    while True:
        try:
            answer = (await asyncio.to_thread(input, "session (number, empty to cancel): ")).strip()
        except EOFError:
            return None
        if not answer:
            return None
        if answer.isdigit() and 1 <= int(answer) <= len(ordered):
            return ordered[int(answer) - 1].id
        print(visible(f"ollie: no session {answer!r} in the list; give a number from 1 to {len(ordered)}"))
