"""`ollie web`: the web page over the sessions (docs/web.md). It is served by the file server
(`ollie srv start --web [HOST:]PORT`); this command starts one with it when none runs, and prints
the page's address, which carries the login token."""

from __future__ import annotations

import argparse
import sys

from . import srv

ADDR = srv.DEFAULT_WEB_ADDR


def register(sub) -> None:
    p = sub.add_parser("web", help="the web page over the sessions: print its address (starting the server)")
    p.add_argument("--socket", help="the 9P socket (default $NAMESPACE/ollie)")
    p.add_argument("--addr", metavar="[HOST:]PORT", default=ADDR, help=f"where to serve it (default {ADDR})")
    p.add_argument("--web-token-file", metavar="PATH", help="a file holding the token (needed off loopback)")
    p.add_argument("--mount", help="where to mount with FUSE, when this starts the server")
    p.add_argument("--no-mount", action="store_true", help="serve no FUSE mount, when this starts the server")
    p.set_defaults(func=_web)


def _web(args: argparse.Namespace) -> int:
    opts = srv._options(args)
    if srv._running_pid(opts):
        try:
            print(opts.web_file.read_text().strip())
        except FileNotFoundError:
            print(
                "ollie web: the server runs without the web page; `ollie srv stop`, then `ollie web`",
                file=sys.stderr,
            )
            return 1
        return 0
    start = argparse.Namespace(**{**vars(args), "web": args.addr, "tcp": None, "token": None, "token_file": None})
    if srv._start(start) != 0:
        return 1
    return 0
