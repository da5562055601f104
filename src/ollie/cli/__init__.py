"""The `ollie` command. Each subcommand imports what it needs when it runs, so `--help` stays fast."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..agent.session import SessionStore

# Subcommands that live in their own module; each module has `register(subparsers)`.
_MODULES = ("init", "tools", "srv", "mount", "trust", "web", "completion")


def _gone_cwd(e: OSError) -> str:
    """Why a call failed with no file named, when it is this process's directory that is gone: a
    shell left in a mount whose server stopped (ENOTCONN), or in a directory since removed."""
    if e.errno not in (errno.ENOTCONN, errno.ENOENT):
        return ""
    try:
        os.getcwd()
    except OSError:
        return " (this shell's directory is gone: a stopped server's mount, or removed; cd out of it first)"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["chat", *argv]  # `ollie` alone, or with the terminal's options: the terminal frontend
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    from .. import config
    from ..types import OllieError

    try:
        try:
            config.load_env_file()
        except OllieError as e:
            if not getattr(args, "env_optional", False):
                raise
            _say(f"ollie: {e}; going on without it")
        return args.func(args)
    except OllieError as e:  # the message may quote a server's reply or a file
        _say(f"ollie: {e}")
        return 1
    except BrokenPipeError:  # `ollie sessions | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit must not fail
        return 141  # as a program killed by SIGPIPE, which `ollie run` reports alike
    except OSError as e:  # e.g. a data directory that cannot be created
        _say(f"ollie: {e.filename}: {e.strerror}" if e.filename else f"ollie: {e}{_gone_cwd(e)}")
        return 1
    except KeyboardInterrupt:
        print("ollie: interrupted", file=sys.stderr)
        return 130


def _say(message: str) -> None:
    """A failure on stderr, its control characters made visible (it may quote a file or a server);
    chatfmt is imported only then: a command that succeeds need not pay for it."""
    from ..chatfmt import visible

    print(visible(message), file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="ollie",
        usage="ollie [-h] [--version] COMMAND ...\n       ollie [--new | --resume | --session ID] [--addr ADDR] …",
        description="Agents with a sandboxed execute_code tool, served as files. Without a command (or with "
        "only the terminal's options), `ollie` is `ollie chat`, the terminal frontend: see `ollie chat --help`.",
    )
    parser.add_argument("--version", action="version", version=f"ollie {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND", prog="ollie")

    run = sub.add_parser("run", help="run one prompt and stream the conversation")
    run.add_argument("prompt", help="the prompt, or - to read it from stdin")
    _backend_args(run)
    run.add_argument("--agent", help="agent config name (agents/<name>.json)")
    run.add_argument("--cwd", help="working directory of the session (default: here)")
    run.add_argument("--session", help="continue a stored session")
    run.add_argument(
        "-c", "--continue", dest="cont", action="store_true", help="continue the last session of this directory (--cwd)"
    )
    run.add_argument("--json", action="store_true", help="print the events as JSON lines")
    run.add_argument(
        "-v", "--verbose", action="store_true", help="log each model request (time, tokens, retries) on stderr"
    )
    run.set_defaults(func=_run)

    sessions = sub.add_parser("sessions", help="list stored sessions, or show one")
    sessions.add_argument("action", nargs="?", choices=["show"], help="show ID: print a session's chat")
    sessions.add_argument("id", nargs="?")
    sessions.set_defaults(func=_sessions)

    sub.add_parser("backends", help="list the backends").set_defaults(func=_backends)
    models = sub.add_parser("models", help="list a backend's models")
    _backend_args(models)
    models.set_defaults(func=_models)

    chat = sub.add_parser("chat", help="the terminal frontend (also `ollie` with no command)")
    from .chat_args import add_arguments

    add_arguments(chat)
    chat.set_defaults(func=_chat)

    keys = sub.add_parser("keys", help="store a provider's API key in $OLLIE_CFG_PATH/env (0600)")
    keys.add_argument("action", choices=["set", "list", "rm"])
    keys.add_argument("provider", nargs="?", help="anthropic, openai, openrouter or copilot")
    keys.set_defaults(func=_keys)

    for name in _MODULES:  # a module that fails to import fails `ollie` loudly, never hides its command
        importlib.import_module(f".{name}", __name__).register(sub)
    return parser


def _backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", help="backend name (see `ollie backends`; default OLLIE_BACKEND)")
    p.add_argument("--model", help="model name (default OLLIE_MODEL or the backend's default)")
    p.add_argument("--script", help="a script of model turns (JSON or YAML) for the scripted backend, which it implies")


def _backend(args: argparse.Namespace) -> str | None:
    """The backend asked for: --script implies the scripted one, and makes no sense with another."""
    from ..types import ConfigError

    if args.script and args.backend not in (None, "scripted"):
        raise ConfigError(f"--script is for --backend scripted, not --backend {args.backend}")
    return "scripted" if args.script else args.backend


def _stored_session(sid: str) -> SessionStore:
    """The SessionStore of an existing session; a ConfigError saying what is wrong otherwise."""
    from ..agent.session import SessionStore
    from ..types import ConfigError

    try:
        store = SessionStore(sid)
    except ValueError as e:  # a malformed id
        raise ConfigError(str(e)) from None
    store.load_meta()  # names the session when it does not exist
    return store


def _shown_session(sid: str) -> SessionStore:
    """A stored session's store, or a killed one's while its transcript is kept (`tr/<id>/`)."""
    from .. import config
    from ..agent.session import SessionStore
    from ..types import OllieError

    try:
        return _stored_session(sid)
    except OllieError:
        killed = SessionStore(sid, config.data_path() / "transcripts")
        if not killed.chat_path.is_file():
            raise
        print(f"ollie: {sid} was killed; its transcript:", file=sys.stderr)
        return killed


def _last_session_of(cwd: str | None) -> str:
    """The id of the session last used in `cwd` (here by default), for `run --continue`."""
    import os

    from ..agent.session import list_stored
    from ..types import ConfigError

    here = os.path.realpath(os.path.expanduser(cwd or "."))
    mine = [m for m in list_stored() if m.cwd == here and not m.cwd_within]  # not a sub-agent's
    if not mine:
        raise ConfigError(f"--continue: no session has worked in {here} yet; leave --continue out to start one")
    return max(mine, key=lambda m: m.updated).id


def _run(args: argparse.Namespace) -> int:
    import asyncio

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        print("ollie run: the prompt is empty", file=sys.stderr)
        return 2
    if args.cont:
        args.session = _last_session_of(args.cwd)
    if args.session:
        _stored_session(args.session)  # a typo must not start a new, empty conversation
    from .install import first_use

    first_use()  # a fresh machine gets the default agents and tool scripts before its first run
    if args.verbose:  # a line per request (ollie.requests) and whatever else ollie logs, on stderr
        import logging

        logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("ollie").setLevel(logging.INFO)
    return asyncio.run(_run_async(args, prompt))


async def _run_async(args: argparse.Namespace, prompt: str) -> int:
    import asyncio
    import signal

    from ..agent import commands, open_session
    from ..chatfmt import visible

    output = _Output(args.json, echo_prompt=args.session is not None)
    core = output.core = await open_session(
        agent=args.agent,
        cwd=args.cwd,
        backend=_backend(args),
        model=args.model,
        session_id=args.session,
        script=args.script,
        on_event=output.show,
    )
    stopped_by = 0
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C; `timeout`, `docker stop`; a closed terminal

    def stop(signum: int) -> None:  # the turn stops; what it completed is kept and saved
        nonlocal stopped_by
        stopped_by = stopped_by or signum
        core.interrupt()

    loop = asyncio.get_running_loop()
    for sig in stops:
        loop.add_signal_handler(sig, stop, sig)
    try:
        if not output.closed:
            await commands.submit(core, prompt)
        if not (output.errors or stopped_by or output.closed):
            _check_script_consumed(core.backend, output.errors)
    finally:
        for sig in stops:
            loop.remove_signal_handler(sig)
        await core.close()
    print(f"session: {core.session_id}", file=sys.stderr)  # (stderr: there even when stdout's reader left)
    if output.closed:
        return 141  # as a program killed by SIGPIPE: the shell's pipeline status says what happened
    if stopped_by:
        what = "interrupted" if stopped_by == signal.SIGINT else f"stopped by {signal.Signals(stopped_by).name}"
        print(f"ollie: {what}; the session is saved (continue with --session {core.session_id})", file=sys.stderr)
        return 128 + stopped_by  # as the shell reports a program the signal killed
    if output.errors:
        print(f"ollie: {visible(output.errors[-1].splitlines()[0])}", file=sys.stderr)
        return 1
    return 0


class _Output:
    """`ollie run`'s stdout: the conversation as it goes (or its events as JSON lines). When the
    reader goes away (`ollie run … | head`), the turn stops, quietly: what it completed is saved."""

    def __init__(self, as_json: bool, echo_prompt: bool) -> None:
        from ..chatfmt import ChatRenderer

        self.as_json, self.echo_prompt = as_json, echo_prompt
        self.renderer = ChatRenderer()
        self.errors: list[str] = []
        self.closed = False
        self.core: Any = None

    def show(self, ev: Any) -> None:
        import json
        import os

        if ev.kind == "error":
            self.errors.append(ev.text)
        if self.closed:
            return
        try:
            if self.as_json:  # all but ASCII escaped: JSON leaves DEL and C1 controls (U+009B is a CSI) raw
                sys.stdout.write(json.dumps(ev.to_dict()) + "\n")
            elif ev.kind != "user" or self.echo_prompt:  # the user typed it: no need to echo it
                sys.stdout.write(self.renderer.render(ev))
            sys.stdout.flush()
        except BrokenPipeError:
            self.closed = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit must not fail
            if self.core is not None:
                self.core.interrupt()


def _check_script_consumed(backend: Any, errors: list[str]) -> None:
    """A scripted run fails when turns of its script were never requested."""
    try:
        getattr(backend, "assert_consumed", lambda: None)()
    except AssertionError as e:
        errors.append(str(e))


def _chat(args: argparse.Namespace) -> int:
    from .. import tui
    from .install import first_use

    first_use()
    return tui.main(args)


def _keys(args: argparse.Namespace) -> int:
    import getpass

    from .. import keys

    if args.action == "list":
        listed = keys.list_vars()
        for key, masked in listed:
            print(f"{key}={masked}")
        if not listed:
            print(f"ollie keys: no keys stored in {keys.env_file()} (ollie keys set PROVIDER)", file=sys.stderr)
        return 0
    var = keys.PROVIDERS.get(args.provider or "")
    if var is None:
        print(f"ollie keys {args.action}: name a provider: {', '.join(keys.PROVIDERS)}", file=sys.stderr)
        return 2
    if args.action == "rm":
        found = keys.remove_var(var)
        print(f"{var} {'removed from' if found else 'is not in'} {keys.env_file()}")
        return 0
    # Read from the terminal without echo, or from stdin when piped; never from the command line.
    value = getpass.getpass(f"{var}: ") if sys.stdin.isatty() else sys.stdin.readline()
    if not value.strip():
        print("ollie keys set: no key given", file=sys.stderr)
        return 2
    print(f"{var} saved in {keys.set_var(var, value.strip())}")
    return 0


def _sessions(args: argparse.Namespace) -> int:
    import time

    from ..agent.session import list_stored
    from ..chatfmt import visible

    if args.action == "show":
        if not args.id:
            print("usage: ollie sessions show ID", file=sys.stderr)
            return 2
        # Chat logs are written escaped; those from before that are escaped here.
        sys.stdout.write(visible(_shown_session(args.id).chat_path.read_text()))
        return 0
    for m in list_stored():
        updated = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.updated))
        first = m.first_prompt.replace("\n", " ")[:60]
        print(visible(f"{m.id}\t{m.agent}\t{m.cwd}\t{updated}\t{first}"))
    return 0


def _backends(args: argparse.Namespace) -> int:
    from .. import backends

    default = _default_backend()
    for name in backends.names():
        print(f"{name}{'  (default)' if name == default else ''}")
    return 0


def _default_backend() -> str:
    """The backend `ollie run` uses when told none: the default agent's, else the environment's."""
    from .. import backends, config
    from ..types import ConfigError

    try:
        chosen = config.load_agent("default").backend
    except ConfigError:  # `ollie run` says what is wrong with it
        chosen = ""
    return chosen or backends.default_name()


def _models(args: argparse.Namespace) -> int:
    import asyncio

    from .. import backends

    async def list_models() -> list[str]:
        options: dict[str, Any] = {"script": args.script} if args.script else {}
        be = backends.create(_backend(args) or _default_backend(), args.model, **options)
        try:
            return sorted(await be.models())
        finally:
            await be.aclose()

    from ..chatfmt import visible

    print(visible("\n".join(asyncio.run(list_models()))))  # names a server sent
    return 0
