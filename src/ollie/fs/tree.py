"""The namespace ollie serves: which store backs which directory.

ctl backends help        root files
a/    agent configs      $OLLIE_CFG_PATH/agents (first of OLLIE_AGENTS_PATH), validated on write; a
                         refused write leaves its reason in a/<name>.err (stores.ConfigDir)
p/    system prompts     $OLLIE_CFG_PATH/prompts: what an agent config's "prompt": "prompts/NAME" reads
sk/   skills             $OLLIE_CFG_PATH/skills (first of OLLIE_SKILLS_PATH), read-only: <name>/SKILL.md
                         and its files; `idx` lists the skills of every directory
t/    tool scripts       $OLLIE_CFG_PATH/tools (first of OLLIE_TOOLS_PATH), `idx` of every directory
u/    utility scripts    $OLLIE_CFG_PATH/scripts/u, and the package's not installed there
m/    memory             $OLLIE_DATA_PATH/memory (sandboxed code reads and writes it: $OLLIE_MEMORY_DIR)
pl/   plans              $OLLIE_DATA_PATH/plans (likewise: $OLLIE_PLANS_DIR)
tr/   transcripts        $OLLIE_DATA_PATH/transcripts (ctl `save` writes here; killed sessions
                         are kept here a while, see transcripts.py)
tmp/  scratch            $OLLIE_TMP_PATH/scratch, 0700
s/    sessions           see sessions.py; its scripts from $OLLIE_CFG_PATH/scripts/s, else the package's,
                         and your own there beside them
b/    batch jobs         see jobs.py; its scripts from $OLLIE_CFG_PATH/scripts/b, likewise
"""

from __future__ import annotations

import errno as E
import json
import logging
import os
from pathlib import Path

from .. import backends, config, skills
from ..tools.scripts import index_text
from ..types import ConfigError
from ..vfs.namespace import Dir, File, FsError, Handle, Namespace, StaticDir
from ..vfs.stores import ConfigDir, DiskDir, TextFile, text_size
from .job_files import JobsDir
from .jobs import Jobs
from .session_files import SessionsDir, root_ctl, script_file
from .sessions import Sessions
from .transcripts import TranscriptsDir

log = logging.getLogger(__name__)

HELP = """ollie file server

ctl           write `new [agent=A] [cwd=DIR] [backend=B] [model=M] [name=N] [worktree=1]` to create a
              session (read the same open file back for its id), `kill <id>` to end one
backends      the backends this server knows; the default is marked *
s/            one directory per session that has an id, in creation order (ids sort by creation); a
              session you named opens by its name, and is listed in s/idx, not here
b/            batch jobs: write a spec to b/new (cat it for the template); b/<id>/status, result,
              log, usage, cost, statewait, worktree (worktree=1); rm -r b/<id> cancels (and drops
              its worktree and branch); b/q b/sched b/job: scripts
s/new         read: a template; write `k=v` lines to create a session
s/idx         id, state, cwd, backend, model of every session
s/sh s/ls s/kill   scripts: a prompt loop, a listing, kill sessions (and yours: $OLLIE_CFG_PATH/scripts/s)
s/<id>/prompt     write a prompt; it is submitted when the file is closed (queued while a turn runs)
s/<id>/chat       the conversation; `tail -f chat` follows it
s/<id>/state      idle, thinking, calling: <tool>, compacting, limitretry
s/<id>/reply      the assistant text of the last completed turn; emptied by a write to prompt
s/<id>/statewait  blocks until the state changes (5 s at most), then gives the state
s/<id>/idlewait   blocks until the session is idle (at once when it is), then gives `idle`
s/<id>/ctl        the session commands (stop, inject, queue, backend, model, agent, cwd, set,
                  compact, clear, …: `cat` it), and kill, rn <name>, save [name]
s/<id>/cfg        state backend model agent cwd and generation parameters; write k=v lines
s/<id>/fifo.in    queue a prompt (starts it when idle);  fifo.out: pop the next queued prompt
s/<id>/usage cost ctxsz systemprompt env context offset plan prompt.prev (models, mcp,
                  statewait, idlewait, fifo.out, worktree open by name: reading them acts, so they
                  are not listed; worktree commits a worktree=1 session's work on its branch
                  ollie/<id>)
rm -r s/<id>      kill a session (kept read-only in tr/<id>/ for $OLLIE_TRANSCRIPT_DAYS days);
                  mv s/<id> s/<name>  rename it (not while it runs)
a/ p/ sk/ t/ u/ m/ pl/ tr/ tmp/   agent configs (a refused one says why in a/<name>.json.err), system
                  prompts ("prompt": "prompts/NAME" in a config), skills, tools (t/idx), utilities
                  (yours and ollie's), memory, plans, transcripts (saved chats, killed sessions), scratch
"""

# The s/, b/ and u/ scripts ship as files in the package; `ollie init` installs them into
# $OLLIE_CFG_PATH/scripts/s/, scripts/b/ and scripts/u/, and a copy there (yours to change) is what
# is served; scripts of your own there are served beside them. s/ and b/ read theirs when the
# server starts; u/ is the directory itself.
PACKAGE_DEFAULTS = Path(__file__).resolve().parent.parent / "defaults"


def shipped_scripts(directory: str) -> dict[str, str]:
    """The package's scripts of s/, b/ or u/ by name."""
    return {
        f.name: f.read_text()
        for f in sorted((PACKAGE_DEFAULTS / directory).iterdir())
        if f.is_file() and not f.name.startswith(".")
    }


def scripts_of(directory: str, yours: bool = False) -> dict[str, str]:
    """The scripts of s/ or b/ by name: each of the package's, or your copy of it in
    $OLLIE_CFG_PATH/scripts/<directory>/ when there is one; with `yours`, every other script there
    too (a file whose name starts with a dot is none). A session's view serves the package's names
    alone: your own scripts are yours, not its code's to read."""
    installed = config.cfg_path() / "scripts" / directory
    scripts = shipped_scripts(directory)
    names = sorted(set(scripts) | (set(_files_in(installed)) if yours else set()))
    for name in names:
        try:
            scripts[name] = (installed / name).read_text()
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError) as e:
            served = "serving the package's script" if name in scripts else "not served"
            log.warning("%s/%s: %s: cannot read %s: %s", directory, name, served, installed / name, e)
    return scripts


def _files_in(directory: Path) -> list[str]:
    """The regular files of `directory` (through links: a script may be one), dotfiles aside."""
    try:
        return [e.name for e in os.scandir(directory) if not e.name.startswith(".") and e.is_file()]
    except (FileNotFoundError, NotADirectoryError):
        return []


class UtilsDir(DiskDir):
    """u/: the directory $OLLIE_CFG_PATH/scripts/u as it is on disk (yours, written through the mount
    too: a file made there is executable), and the package's utilities that are not there (`ollie
    init` installs them), read-only."""

    def __init__(self, path: Path, shipped: dict[str, str]):
        super().__init__(path)
        self.shipped: dict[str, File] = {name: script_file(text) for name, text in shipped.items()}

    def lookup(self, name: str) -> File | Dir:
        try:
            return super().lookup(name)
        except FsError:
            if name in self.shipped:
                return self.shipped[name]
            raise

    async def create(self, name: str, mode: int) -> Handle:
        return await super().create(name, mode | 0o111)  # a script (the mount takes no chmod)

    async def list(self) -> list[tuple[str, File | Dir]]:
        listed = await super().list()
        on_disk = {name for name, _ in listed}
        missing = [(name, f) for name, f in self.shipped.items() if name not in on_disk]
        return sorted([*listed, *missing], key=lambda entry: entry[0])


def help_text(yours: dict[str, list[str]]) -> str:
    """HELP, and the scripts of yours that s/ and b/ serve (they are not listed there)."""
    names = [f"{d}/{name}" for d, found in yours.items() for name in found]
    return HELP + (f"yours, by name (not listed): {' '.join(names)}\n" if names else "")


def backends_text() -> str:
    try:
        config.load_env_file()  # the default as a new session would get it (keys set since start)
    except ConfigError as e:
        log.warning("%s", e)
    default = backends.default_name()
    return "".join(f"{n}{' *' if n == default else ''}\n" for n in backends.names())


def skills_index(cwd: str | None = None) -> str:
    """sk/idx: the user's skills (OLLIE_SKILLS_PATH), and with `cwd` the project's, as the model is
    offered them."""

    return skills.index(skills.list_skills(cwd)[0])


def _private(path: Path) -> Path:
    """Scratch under a shared /tmp: ours alone, or the server refuses to start (ConfigError)."""
    config.private_dir(path.parent)
    return config.private_dir(path)


def build(sessions: Sessions, jobs: Jobs | None = None) -> Namespace:
    cfg, data = config.cfg_path(), config.data_path()
    tools = config.tools_path()[0]
    scripts = {d: scripts_of(d, yours=True) for d in ("s", "b")}
    help_text_now = help_text({d: sorted(set(found) - set(shipped_scripts(d))) for d, found in scripts.items()})
    root = StaticDir(
        {
            "ctl": root_ctl(sessions),
            "backends": TextFile(backends_text),
            "help": TextFile(lambda: help_text_now, text_size(lambda: help_text_now)),
            "a": ConfigDir(config.agents_path()[0], validate_agent, "a"),
            "p": DiskDir(cfg / "prompts"),
            "sk": DiskDir(
                config.skills_path()[0], writable=False, nested=True, synthetic={"idx": TextFile(skills_index)}
            ),
            "t": DiskDir(tools, synthetic={"idx": TextFile(lambda: index_text(config.tools_path()))}),
            "u": UtilsDir(cfg / "scripts" / "u", shipped_scripts("u")),
            "m": DiskDir(data / "memory", shared=True),
            "pl": DiskDir(data / "plans", shared=True),
            "tr": TranscriptsDir(data / "transcripts"),
            "tmp": DiskDir(_private(config.tmp_path() / "scratch")),
            "s": SessionsDir(sessions, scripts["s"]),
            "b": JobsDir(jobs or Jobs(sessions), scripts["b"]),
        }
    )
    return Namespace(root)


def validate_agent(name: str, text: str) -> None:
    """Agent configs (a/<name>.json) must parse and validate before they replace anything. Other
    names are plain files, ignored by the agent loader: the temporary file that `sed -i` or an
    editor writes before renaming it over a config (the rename validates)."""
    stem, dot, ext = name.rpartition(".")
    if not dot or ext != "json" or not stem:
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FsError(E.EINVAL, f"{name}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    agent = config.parse_agent(stem, data, name)
    if agent.backend and agent.backend not in backends.names():  # a typo heard of now, not at a session's start
        known = ", ".join(backends.names())
        raise FsError(E.EINVAL, f"{name}: unknown backend {agent.backend!r}; backends: {known}")
