"""`ollie mount ADDR [MNT]`: mount another ollie server's namespace (over 9P) with FUSE."""

from __future__ import annotations

import argparse
import os
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mount", help="mount a remote ollie server's files (9P) here, with FUSE",
                       description="Mount the namespace of the ollie server at ADDR on MNT, in the foreground, "
                                   "until interrupted or the server goes away.")
    p.add_argument("addr", help="unix!/path, tcp!host!port or host:port")
    p.add_argument("mnt", nargs="?", help="mount point (default: $OLLIE or ~/mnt/ollie)")
    p.add_argument("--token", help="the server's token, for TCP (default: $OLLIE_9P_TOKEN)")
    p.set_defaults(func=_mount)


def _mount(args: argparse.Namespace) -> int:
    import asyncio

    from .. import config
    from ..fs.ninep_client import RemoteError, parse_address

    try:
        parse_address(args.addr)
    except ValueError as e:
        print(f"ollie mount: {e}", file=sys.stderr)
        return 2
    token = args.token if args.token is not None else os.environ.get("OLLIE_9P_TOKEN", "")
    mnt = args.mnt or str(config.mount_path())
    try:
        why = asyncio.run(_run(args.addr, mnt, token))
    except (OSError, RemoteError) as e:
        print(f"ollie mount: {args.addr}: {e}", file=sys.stderr)
        return 1
    print(f"ollie mount: unmounted {mnt}: {why}", file=sys.stderr)
    return 0 if why == "stopped" else 1


async def _run(addr: str, mnt: str, token: str) -> str:
    import asyncio
    import signal

    from ..fs.remote import mount

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)

    def ready() -> None:
        print(f"ollie mount: {addr} mounted on {mnt}", file=sys.stderr, flush=True)

    return await mount(addr, mnt, token, stop=stop, ready=ready)
