"""`ollie web`: the web page over the sessions (docs/web.md). It is served by the file server
(`ollie srv start --web [HOST:]PORT`); this command starts one with it when none runs, and prints
the page's address, which carries the login token."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_ADDR = "127.0.0.1:5642"


def add_web_options(p: argparse.ArgumentParser, flag: str = "--web") -> None:
    p.add_argument(
        flag,
        metavar="[HOST:]PORT",
        nargs="?" if flag == "--web" else None,
        const=DEFAULT_ADDR,
        default=None if flag == "--web" else DEFAULT_ADDR,
        help=f"serve the web page (default {DEFAULT_ADDR}; a host other than loopback needs --web-token-file)",
    )
    p.add_argument("--web-token-file", metavar="PATH", help="a file holding the web page's token (else generated)")


def web_address(text: str) -> tuple[str, int]:
    from ..types import ConfigError

    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"--web {text!r}: give [HOST:]PORT, a port from 0 to 65535")
    return host, int(port)


def web_token(args: argparse.Namespace, host: str) -> str:
    """The token from --web-token-file, else $OLLIE_WEB_TOKEN (how `srv start` hands it to the
    server), else "" (generated). Anything but loopback needs a file: a generated token would be
    known only to this machine's user, and a page open to the network with a weak one is not."""
    from ..types import ConfigError
    from ..web.app import is_loopback

    if args.web_token_file:
        text = Path(args.web_token_file).expanduser().read_text().strip()
        if len(text) < 16:
            raise ConfigError(f"{args.web_token_file}: a web token must be 16 characters at least, and random")
        return text
    if not is_loopback(host) and not os.environ.get("OLLIE_WEB_TOKEN"):
        raise ConfigError(
            f"--web {host}: a web page reachable from other machines needs a token you chose: "
            "give --web-token-file PATH (a file holding a long random token)"
        )
    return os.environ.get("OLLIE_WEB_TOKEN", "")


def register(sub) -> None:
    p = sub.add_parser("web", help="the web page over the sessions: print its address (starting the server)")
    p.add_argument("--socket", help="the 9P socket (default $NAMESPACE/ollie)")
    p.add_argument(
        "--addr", metavar="[HOST:]PORT", default=DEFAULT_ADDR, help=f"where to serve it (default {DEFAULT_ADDR})"
    )
    p.add_argument("--web-token-file", metavar="PATH", help="a file holding the token (needed off loopback)")
    p.add_argument("--mount", help="where to mount with FUSE, when this starts the server")
    p.add_argument("--no-mount", action="store_true", help="serve no FUSE mount, when this starts the server")
    p.set_defaults(func=_web)


def _web(args: argparse.Namespace) -> int:
    from . import srv

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
