"""`ollie chat`'s options (the terminal frontend), apart from the frontend itself: `ollie --help` and
every other command build the parser without importing the terminal UI and asyncio."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--new", action="store_true", help="start a new session (default: resume this directory's last)")
    which.add_argument("--resume", action="store_true", help="pick the session to resume from a list")
    which.add_argument("--session", metavar="ID", help="open this session")
    p.add_argument("--backend", help="backend of a new session (or switch the resumed one)")
    p.add_argument("--model", help="model (likewise)")
    p.add_argument("--agent", help="agent config (likewise)")
    p.add_argument("--cwd", help="working directory (default: here); sessions of this directory are resumed")
    p.add_argument("--addr", help="a remote server: tcp!host!port or host:port (default: the local server)")
    p.add_argument("--token-file", help="the remote server's token (default: $OLLIE_9P_TOKEN)")
    p.add_argument("--socket", help=argparse.SUPPRESS)  # the local server's socket (tests)
