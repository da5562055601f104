"""`ollie srv start|fg|stop|status`: the file server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .mount import add_token_options, token

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
DEFAULT_WEB_ADDR = "127.0.0.1:5642"  # the web page's, for `srv start --web` and `ollie web`


def register(sub) -> None:
    p = sub.add_parser("srv", help="serve the sessions as files (9P socket and FUSE mount)")
    actions = p.add_subparsers(metavar="ACTION", required=True)
    for name, func, text in (
        ("start", _start, "start the server in the background; return once it serves"),
        ("fg", _fg, "run the server in the foreground"),
        ("stop", _stop, "stop the server: sessions closed, unmounted, socket removed"),
        ("status", _status, "is a server running, where"),
    ):
        a = actions.add_parser(name, help=text)
        a.add_argument("--socket", help="the 9P socket (default $NAMESPACE/ollie)")
        if name in ("start", "fg"):
            a.add_argument("--mount", help="where to mount with FUSE (default $OLLIE or ~/mnt/ollie)")
            a.add_argument("--no-mount", action="store_true", help="serve 9P only")
            a.add_argument(
                "--tcp",
                metavar="[HOST:]PORT",
                help="also serve 9P on TCP (loopback unless a host is given); needs a token",
            )
            add_token_options(a, "the TCP token (default: $OLLIE_9P_TOKEN, else generated; written to <socket>.token)")
            add_web_options(a)
        # A broken env file must not keep a server from being stopped or asked after.
        a.set_defaults(func=func, env_optional=name in ("stop", "status"))


def add_web_options(p: argparse.ArgumentParser, flag: str = "--web") -> None:
    p.add_argument(
        flag,
        metavar="[HOST:]PORT",
        nargs="?" if flag == "--web" else None,
        const=DEFAULT_WEB_ADDR,
        default=None if flag == "--web" else DEFAULT_WEB_ADDR,
        help=f"serve the web page (default {DEFAULT_WEB_ADDR}; a host other than loopback needs --web-token-file)",
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
    server, and a service's unit may give it), else "" (generated). A token given must be long;
    anything but loopback needs one: a generated token would be known only to this machine's user,
    and a page open to the network with a weak one is not."""
    from ..types import ConfigError
    from ..web.app import is_loopback

    if args.web_token_file:
        source, text = args.web_token_file, Path(args.web_token_file).expanduser().read_text().strip()
    else:
        source, text = "OLLIE_WEB_TOKEN", os.environ.get("OLLIE_WEB_TOKEN", "").strip()
    if text and len(text) < 16:
        raise ConfigError(f"{source}: a web token must be 16 characters at least, and random")
    if not text and not is_loopback(host):
        raise ConfigError(
            f"--web {host}: a web page reachable from other machines needs a token you chose: "
            "give --web-token-file PATH (a file holding a long random token)"
        )
    return text


def _options(args: argparse.Namespace):
    from ..fs.options import default_options

    opts = default_options()
    if args.socket:
        opts.socket = Path(args.socket).absolute()
    if getattr(args, "no_mount", False):
        opts.mount = None
    elif getattr(args, "mount", None):
        opts.mount = Path(args.mount).expanduser().absolute()
    if getattr(args, "tcp", None):
        host, _, port = args.tcp.rpartition(":")
        opts.tcp = (host or "127.0.0.1", int(port))
    if hasattr(args, "token"):
        opts.token = token(args)
    if getattr(args, "web", None):
        opts.web = web_address(args.web)
        opts.web_token = web_token(args, opts.web[0])
    return opts


def _running_pid(opts) -> int | None:
    """The pid in the pid file if that process is alive (a server killed with -9 leaves the file)."""
    try:
        pid = int(opts.pid_file.read_text().split()[0])
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return None if state in ("Z", "X") else pid


def _fg(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from ..chatfmt import visible
    from ..fs.server import serve
    from .install import first_use

    opts = _options(args)
    os.environ.pop("OLLIE_9P_TOKEN", None)  # read: the sessions' hooks and tools need not inherit it
    os.environ.pop("OLLIE_WEB_TOKEN", None)
    if pid := _running_pid(opts):
        print(f"ollie srv: already running (pid {pid})", file=sys.stderr)
        return 1
    first_use()  # the default agents, tool scripts and s/ scripts, before the namespace is built
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    ready = os.environ.pop("OLLIE_SRV_READY_FD", None)
    try:
        asyncio.run(serve(opts, int(ready) if ready else None))
    except OSError as e:
        print(visible(f"ollie srv: {e or type(e).__name__}"), file=sys.stderr)
        return 1
    return 0


def _start(args: argparse.Namespace) -> int:
    """Run `fg` as a daemon and wait for it to say it serves (or why it cannot)."""
    import select
    import subprocess

    from .. import config
    from ..chatfmt import visible
    from .install import first_use

    try:  # the server starts in this directory (its sessions' default cwd)
        os.getcwd()
    except OSError as e:
        print(
            f"ollie srv: this shell's directory is gone ({e.strerror}): cd out of it (a stopped server's mount?)",
            file=sys.stderr,
        )
        return 1
    opts = _options(args)
    if pid := _running_pid(opts):
        print(f"ollie srv: already running (pid {pid})", file=sys.stderr)
        return 1
    first_use()  # here, where its line reaches the terminal; `fg` then finds it done
    config.private_dir(opts.socket.parent)  # the log goes there before the server checks it (ConfigError)
    argv = [*config.own_command(), "srv", "fg", "--socket", str(opts.socket)]
    argv += ["--no-mount"] if opts.mount is None else ["--mount", str(opts.mount)]
    if opts.tcp:
        argv += ["--tcp", f"{opts.tcp[0]}:{opts.tcp[1]}"]
    if opts.web:
        argv += ["--web", f"{opts.web[0]}:{opts.web[1]}"]
    env = config.own_environ()  # the server loads the env file itself, and again for each new session
    if opts.token:
        env["OLLIE_9P_TOKEN"] = opts.token  # not on the command line, where ps shows it
    if opts.web_token:
        env["OLLIE_WEB_TOKEN"] = opts.web_token
    r, w = os.pipe()
    env["OLLIE_SRV_READY_FD"] = str(w)
    with open(opts.log_file, "ab") as logf:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, pass_fds=(w,), start_new_session=True
        )
    os.close(w)
    answer = b""
    with os.fdopen(r, "rb") as pipe:
        if select.select([pipe], [], [], START_TIMEOUT)[0]:
            answer = pipe.read()
    text = answer.decode().strip()
    if text == "ok":
        where = f", mounted at {opts.mount}" if opts.mount else ""
        print(f"ollie srv: serving on {opts.socket}{where} (pid {proc.pid})")
        if opts.web:
            print(f"ollie srv: the web page: {opts.web_file.read_text().strip()}")
        return 0
    if proc.poll() is None and not text:
        proc.terminate()
    print(visible(f"ollie srv: did not start: {text or 'no answer'}; see {opts.log_file}"), file=sys.stderr)
    return 1


def _stop(args: argparse.Namespace) -> int:
    import select
    import signal

    opts = _options(args)
    pid = _running_pid(opts)
    if pid is None:
        print("ollie srv: not running", file=sys.stderr)
        return 1
    fd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGTERM)
        if not select.select([fd], [], [], STOP_TIMEOUT)[0]:
            _kill_group(pid)
            _clean_after_kill(opts)
            print(f"ollie srv: pid {pid} did not stop in {STOP_TIMEOUT:.0f} s: killed", file=sys.stderr)
            return 1
    finally:
        os.close(fd)
    print("ollie srv: stopped")
    return 0


def _kill_group(pid: int) -> None:
    """Kill the server, and what it started in its process group (a `git` taking a snapshot,
    which would go on without it): `ollie srv start` makes it the leader of one."""
    import signal

    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return
    if group == pid:
        os.killpg(group, signal.SIGKILL)
    else:  # `ollie srv fg`: the terminal's group, not the server's
        os.kill(pid, signal.SIGKILL)


def _recorded_mount(opts) -> str:
    """The mount the running server wrote into its pid file (the second line)."""
    try:
        lines = opts.pid_file.read_text().splitlines()
    except OSError:
        return ""
    return lines[1] if len(lines) > 1 else ""


def _clean_after_kill(opts) -> None:
    from ..vfs.fuse import fusermount_u

    if mount := _recorded_mount(opts):
        fusermount_u(mount)
    for path in (opts.socket, opts.pid_file, opts.token_file, opts.web_file):
        path.unlink(missing_ok=True)


def _status(args: argparse.Namespace) -> int:
    opts = _options(args)
    pid = _running_pid(opts)
    if pid is None:
        print("ollie srv: not running")
        return 1
    mount = _recorded_mount(opts)
    mounted = f", mounted at {mount}" if mount and os.path.ismount(mount) else ""
    print(f"ollie srv: running (pid {pid}) on {opts.socket}{mounted}")
    return 0
