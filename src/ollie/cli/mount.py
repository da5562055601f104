"""`ollie mount ADDR [MNT]`: mount another ollie server's namespace (over 9P) with FUSE."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mount",
        help="mount a remote ollie server's files (9P) here, with FUSE",
        description="Mount the namespace of the ollie server at ADDR on MNT, in the foreground, "
        "until interrupted or the server goes away.",
    )
    p.add_argument("addr", help="unix!/path, tcp!host!port or host:port")
    p.add_argument("mnt", nargs="?", help="mount point (default: $OLLIE or ~/mnt/ollie)")
    add_token_options(p, "the server's token, for TCP (default: $OLLIE_9P_TOKEN)")
    p.set_defaults(func=_mount)


def add_token_options(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--token-file", metavar="PATH", help=f"a file holding {help}")
    p.add_argument("--token", nargs="?", const="", help=argparse.SUPPRESS)  # refused: see token()


def token(args: argparse.Namespace) -> str:
    """The token from --token-file, else $OLLIE_9P_TOKEN, else "". --token is refused: a token on
    a command line is shown to every user by ps."""
    from ..types import ConfigError

    if args.token is not None:
        raise ConfigError(
            "--token would show the token to every user (ps): put it in a file and give "
            "--token-file PATH, or set $OLLIE_9P_TOKEN"
        )
    if args.token_file:
        text = Path(args.token_file).expanduser().read_text().strip()
        if not text:
            raise ConfigError(f"{args.token_file}: the token file is empty")
        return text
    return os.environ.get("OLLIE_9P_TOKEN", "")


def _mount(args: argparse.Namespace) -> int:
    import asyncio

    from .. import config
    from ..chatfmt import visible
    from ..vfs.ninep_client import RemoteError, parse_address

    try:
        parse_address(args.addr)
    except ValueError as e:
        print(f"ollie mount: {e}", file=sys.stderr)
        return 2
    secret = token(args)
    mnt = args.mnt or str(config.mount_path())
    try:
        why = asyncio.run(_run(args.addr, mnt, secret))
    except (OSError, RemoteError) as e:
        print(visible(f"ollie mount: {args.addr}: {e}"), file=sys.stderr)  # the server's words
        return 1
    print(f"ollie mount: unmounted {mnt}: {why}", file=sys.stderr)
    return 0 if why == "stopped" else 1


async def _run(addr: str, mnt: str, token: str) -> str:
    """Mount the server at `addr` on `mnt` until a signal or the connection is lost; why it ended."""
    import asyncio
    import signal

    from ..vfs.fuse import Mount
    from ..vfs.remote import RemoteNamespace

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    ns = await RemoteNamespace.connect(addr, token)
    try:
        m = Mount(ns, mnt)
        await m.start()
        try:
            print(f"ollie mount: {addr} mounted on {mnt}", file=sys.stderr, flush=True)
            waits = [asyncio.ensure_future(ns.wait_lost()), asyncio.ensure_future(stop.wait())]
            _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in pending:
                w.cancel()
            return "stopped" if stop.is_set() else "connection to the server lost"
        finally:
            await m.unmount()
    finally:
        await ns.close()
