"""`ollie init`: the command; the installing is install.py's, imported when the command runs (it
needs hashing, JSON, dataclasses and pathlib, which `ollie --help` should not pay for)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "init",
        help="install the default agent configs, tool scripts, s/, b/ and u/ scripts and a commented sandbox.yaml",
        description="Install ollie's defaults into $OLLIE_CFG_PATH (default ~/.config/ollie): agents/, "
        "tools/, scripts/s/, scripts/b/, scripts/u/ and a sandbox.yaml whose settings are all commented "
        "out. Files you changed are kept; files ollie installed and you did not change are updated; what "
        "utils/ holds (where u/ scripts were installed before) moves to scripts/u/. One line per file "
        "says what was done.",
    )
    p.add_argument("--force", action="store_true", help="replace the files you changed with ollie's too")
    p.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    from .. import config
    from .install import install

    cfg = config.cfg_path()
    outcomes = install(cfg, force=args.force)
    print(f"ollie init: {cfg}")
    for o in outcomes:
        print(o.line())
    kept = sum(o.replaceable for o in outcomes)
    if kept:
        print(f"ollie init --force replaces {'the kept file' if kept == 1 else f'the {kept} kept files'} with ollie's")
    return 0
