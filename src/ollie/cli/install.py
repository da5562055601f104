"""Installing ollie's defaults into $OLLIE_CFG_PATH (`ollie init`, and `first_use`), and keeping them up to
date without touching what you changed.

The set is whatever the package's `defaults/` directory holds (agent configs, tool scripts, the s/,
b/ and u/ scripts, a commented sandbox.yaml): each file goes to the same path under $OLLIE_CFG_PATH,
except `s/`, `b/` and `u/`, which go to `scripts/s/`, `scripts/b/` and `scripts/u/` (the file server
serves them from there, with your own scripts beside them). The u/ scripts went to `utils/` before:
what is there moves to `scripts/u/` (`migrate_utils`). `.installed.json` records the
sha256 of each file as it was installed: a file that still has it is ollie's, and is updated when the
package's differs; a file that differs from it was changed by you, and is kept (`--force` replaces it).
`ollie run`, `ollie tools` and `ollie srv` call `first_use()`, which runs the install once, quietly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PACKAGE_DEFAULTS = Path(__file__).resolve().parent.parent / "defaults"
MANIFEST = ".installed.json"
# A top-level directory of defaults/ that is installed under another name.
_PLACES = {d: PurePosixPath("scripts", d) for d in ("s", "b", "u")}
OLD_UTILS = "utils"  # where the u/ scripts were installed before they joined s/ and b/ in scripts/


@dataclass(frozen=True)
class Shipped:
    """A file of the package's defaults: where it goes (relative to $OLLIE_CFG_PATH), what it holds."""

    rel: str
    data: bytes
    executable: bool

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class Outcome:
    rel: str
    action: str  # installed, updated, unchanged, kept, replaced, removed, moved
    note: str = ""
    replaceable: bool = False  # kept, and --force would replace it

    def line(self) -> str:
        return f"{self.action:<9}  {self.rel}{f' ({self.note})' if self.note else ''}"


def shipped(root: Path = PACKAGE_DEFAULTS) -> list[Shipped]:
    """Every file under `root`, in the order of where it goes; executable when it is in the package or starts with #!
    (an installer that drops the mode bits of package data must not make a tool script unrunnable)."""
    files = []
    for path in sorted(root.rglob("*")):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if not path.is_file() or any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        data = path.read_bytes()
        dest = _PLACES.get(rel.parts[0], PurePosixPath(rel.parts[0])).joinpath(*rel.parts[1:])
        files.append(Shipped(str(dest), data, bool(path.stat().st_mode & 0o111) or data.startswith(b"#!")))
    return sorted(files, key=lambda f: PurePosixPath(f.rel).parts)


def install(cfg: Path, force: bool = False) -> list[Outcome]:
    """Install the package's defaults into `cfg`; one Outcome per file, in path order."""
    cfg.mkdir(mode=0o700, parents=True, exist_ok=True)  # it will hold your API keys (env)
    with _locked(cfg):
        recorded = _read_manifest(cfg)
        manifest: dict[str, str] = {}
        outcomes = _migrate_utils(cfg, recorded)
        files = shipped()
        for f in files:
            outcome, digest = _install_one(cfg, f, recorded.get(f.rel), force)
            outcomes.append(outcome)
            if digest:
                manifest[f.rel] = digest
        gone = sorted(set(recorded) - {f.rel for f in files})
        outcomes += [o for rel in gone if (o := _retire(cfg, rel, recorded[rel]))]
        _write(cfg / MANIFEST, _manifest_text(manifest), executable=False)
    return outcomes


def migrate_utils(cfg: Path) -> list[Outcome]:
    """Move what `utils/` holds to `scripts/u/` (see `_migrate_utils`), alone: what `ollie run` and
    `ollie srv` do on an upgrade, where `first_use` installs nothing."""
    with _locked(cfg):
        recorded = _read_manifest(cfg)
        before = dict(recorded)
        outcomes = _migrate_utils(cfg, recorded)
        if recorded != before:
            _write(cfg / MANIFEST, _manifest_text(recorded), executable=False)
    return outcomes


def _migrate_utils(cfg: Path, recorded: dict[str, str]) -> list[Outcome]:
    """u/ is served from `scripts/u/` now, as s/ and b/ are from theirs; an earlier `ollie init`
    put its scripts in `utils/`, and you may have put yours there. Without `scripts/u/`, `utils/`
    becomes it (a link stays a link); else each entry moves that takes no name already there. The
    manifest's record of a file moves with it, so that one you changed stays yours and one you
    did not is updated. What cannot move stays, said; an empty `utils/` goes."""
    old, new = cfg / OLD_UTILS, cfg / _PLACES["u"]
    if not old.is_dir():
        return []
    if not os.path.lexists(new):
        new.parent.mkdir(parents=True, exist_ok=True)
        names = sorted(os.listdir(old))
        os.rename(old, new)
        moved = names
    elif old.is_symlink():
        return [Outcome(f"{OLD_UTILS}/", "kept", f"a link, and {_PLACES['u']}/ exists: move your scripts there")]
    else:
        moved = []
        for name in sorted(os.listdir(old)):
            if os.path.lexists(new / name):
                continue
            os.rename(old / name, new / name)
            moved.append(name)
        with contextlib.suppress(OSError):
            old.rmdir()  # empty now, else what is left says so below
    outcomes = []
    for name in moved:
        rel = f"{_PLACES['u']}/{name}"
        if (digest := recorded.pop(f"{OLD_UTILS}/{name}", None)) is not None:
            recorded[rel] = digest
        outcomes.append(Outcome(rel, "moved", f"from {OLD_UTILS}/{name}; u/ is served from {_PLACES['u']}/"))
    if old.is_dir():
        for name in sorted(os.listdir(old)):
            note = f"{_PLACES['u']}/{name} exists; u/ serves that one"
            outcomes.append(Outcome(f"{OLD_UTILS}/{name}", "kept", note))
    return outcomes


def _install_one(cfg: Path, f: Shipped, recorded: str | None, force: bool) -> tuple[Outcome, str | None]:
    """What to do with one shipped file, done; and the digest to record for it (None: none)."""
    dest = cfg / f.rel
    if not os.path.lexists(dest):
        _write(dest, f.data, f.executable)
        return Outcome(f.rel, "installed"), f.digest
    current = _digest(dest)
    if current == f.digest:
        return Outcome(f.rel, "unchanged"), f.digest
    if current is None:  # a directory, a fifo, a dangling link: yours, whatever it is
        return Outcome(f.rel, "kept", "not a regular file"), recorded
    if current == recorded and not dest.is_symlink():
        _write(dest, f.data, f.executable)
        return Outcome(f.rel, "updated"), f.digest
    why = "changed by you" if recorded else "yours: it was there before ollie init"
    if force:
        _write(dest, f.data, f.executable)
        return Outcome(f.rel, "replaced", f"{why}; --force"), f.digest
    # The digest recorded stays: should you return to what was installed, the file is ollie's again.
    return Outcome(f.rel, "kept", why, replaceable=True), recorded


def _retire(cfg: Path, rel: str, recorded: str) -> Outcome | None:
    """A file installed before that the package no longer ships: removed unless you changed it."""
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts:  # not ours to touch, whatever the manifest says
        return None
    dest = cfg / rel
    current = _digest(dest)
    if current is None or dest.is_symlink():
        return None
    if current != recorded:
        return Outcome(rel, "kept", "changed by you; ollie no longer ships it")
    dest.unlink()
    return Outcome(rel, "removed", "ollie no longer ships it")


def _digest(path: Path) -> str | None:
    """The sha256 of a regular file's contents (through a link); None when there is none."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _write(dest: Path, data: bytes, executable: bool) -> None:
    """Replace `dest` whole (a reader never sees half a file), mode 0755 or 0644 less the umask."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.ollie-init-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if executable else 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_manifest(cfg: Path) -> dict[str, str]:
    path = cfg / MANIFEST
    try:
        files = json.loads(path.read_text())["files"]
        if isinstance(files, dict):
            return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    print(f"ollie init: {path} is unreadable: files that differ from ollie's are kept", file=sys.stderr)
    return {}


def _manifest_text(files: dict[str, str]) -> bytes:
    about = (
        "Written by `ollie init`: the sha256 of each file as it installed it. A file that no longer has it "
        "was changed by you, and is kept when ollie's version changes."
    )
    return (json.dumps({"about": about, "files": files}, indent=1, sort_keys=True) + "\n").encode()


@contextlib.contextmanager
def _locked(cfg: Path) -> Iterator[None]:
    """One install at a time (two `ollie run`s started at once on a fresh machine)."""
    import fcntl

    fd = os.open(cfg, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def first_use() -> None:
    """Install the defaults when ollie first runs here, saying so in one line on stderr.

    First use: no manifest yet, and $OLLIE_CFG_PATH either unset (the default place) or not yet a
    directory. A configuration directory you named and made yourself is yours to manage: `ollie init`
    fills it when you ask. A failure is reported, and the command goes on without the defaults."""
    from .. import config
    from ..chatfmt import visible
    from ..types import OllieError

    cfg = config.cfg_path()
    if (cfg / OLD_UTILS).is_dir():  # an upgrade: u/ is served from scripts/u/ now
        try:
            moved = [o for o in migrate_utils(cfg) if o.action == "moved"]
        except OSError as e:
            print(visible(f"ollie: could not move {cfg / OLD_UTILS} to {cfg / _PLACES['u']}: {e}"), file=sys.stderr)
        else:
            if moved:
                files = "1 file" if len(moved) == 1 else f"{len(moved)} files"
                line = f"ollie: moved {files} from {cfg / OLD_UTILS} to {cfg / _PLACES['u']}"
                print(visible(f"{line}, which u/ serves now"), file=sys.stderr)
    if (cfg / MANIFEST).exists() or (os.environ.get("OLLIE_CFG_PATH") and cfg.exists()):
        return
    try:
        outcomes = install(cfg)
    except (OSError, OllieError) as e:
        why = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e)
        print(visible(f"ollie: could not set up {cfg}: {why}; `ollie init` tries again"), file=sys.stderr)
        return
    done = [o for o in outcomes if o.action in ("installed", "updated", "unchanged")]
    places = sorted({o.rel.split("/")[0] + ("/" if "/" in o.rel else "") for o in done})
    kept = len(outcomes) - len(done)
    line = f"ollie: first run: installed {len(done)} files into {cfg} ({', '.join(places)})"
    if kept:
        line += f", kept {kept} of yours"
    print(visible(f"{line}; `ollie init` lists them"), file=sys.stderr)
