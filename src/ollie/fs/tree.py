"""The namespace ollie serves: which store backs which directory.

ctl backends help        root files
a/    agent configs      $OLLIE_CFG_PATH/agents (first of OLLIE_AGENTS_PATH), validated on write
p/    prompt templates   $OLLIE_CFG_PATH/prompts (read-only)
sk/   skills             $OLLIE_CFG_PATH/skills (first of OLLIE_SKILLS_PATH), read-only: <name>/SKILL.md
                         and its files; `idx` lists the skills of every directory
t/    tool scripts       $OLLIE_CFG_PATH/tools (first of OLLIE_TOOLS_PATH), `idx` of every directory
u/    utility scripts    $OLLIE_CFG_PATH/utils
x/    plugins            $OLLIE_CFG_PATH/plugins
m/    memory             $OLLIE_DATA_PATH/memory (sandboxed code reads and writes it: $OLLIE_MEMORY_DIR)
pl/   plans              $OLLIE_DATA_PATH/plans (likewise: $OLLIE_PLANS_DIR)
tr/   transcripts        $OLLIE_DATA_PATH/transcripts (ctl `save` writes here; killed sessions
                         are kept here a while, see transcripts.py)
tmp/  scratch            $OLLIE_TMP_PATH/scratch, 0700
s/    sessions           see sessions.py; its scripts from $OLLIE_CFG_PATH/scripts/s, else the package's
b/    batch jobs         see jobs.py; its scripts from $OLLIE_CFG_PATH/scripts/b, likewise
"""

from __future__ import annotations

import logging
from pathlib import Path

from .. import config
from ..types import ConfigError
from .jobs import Jobs, JobsDir
from .namespace import Namespace, StaticDir
from .session_files import SessionsDir, root_ctl
from .sessions import Sessions
from .stores import DiskDir, TextFile, text_size, tools_index, validate_agent
from .transcripts import TranscriptsDir

log = logging.getLogger(__name__)

HELP = """ollie file server

ctl           write `new [agent=A] [cwd=DIR] [backend=B] [model=M] [name=N]` to create a session
              (read the same open file back for its id), `kill <id>` to end one
backends      the backends this server knows; the default is marked *
s/            one directory per session, in creation order (ids sort by creation)
b/            batch jobs: write a spec to b/new (cat it for the template); b/<id>/status, result,
              log, usage, cost, statewait; rm -r b/<id> cancels; b/q b/sched b/job: scripts
s/new         read: a template; write `k=v` lines to create a session
s/idx         id, state, cwd, backend, model of every session
s/sh s/ls s/kill   scripts: a prompt loop, a listing, kill sessions
s/<id>/prompt     write a prompt; it is submitted when the file is closed (queued while a turn runs)
s/<id>/chat       the conversation; `tail -f chat` follows it
s/<id>/state      idle, thinking, calling: <tool>, compacting, limitretry
s/<id>/reply      the assistant text of the last completed turn; emptied by a write to prompt
s/<id>/statewait  blocks until the state changes (5 s at most), then gives the state
s/<id>/ctl        the session commands (stop, inject, queue, backend, model, agent, cwd, set,
                  compact, clear, …: `cat` it), and kill, rn <name>, save [name]
s/<id>/cfg        state backend model agent cwd and generation parameters; write k=v lines
s/<id>/fifo.in    queue a prompt (starts it when idle);  fifo.out: pop the next queued prompt
s/<id>/usage cost ctxsz systemprompt env context offset plan prompt.prev (models, mcp,
                  statewait, fifo.out open by name: reading them acts, so they are not listed)
rm -r s/<id>      kill a session (kept read-only in tr/<id>/ for $OLLIE_TRANSCRIPT_DAYS days);
                  mv s/<id> s/<name>  rename it (not while it runs)
a/ p/ sk/ t/ u/ x/ m/ pl/ tr/ tmp/   agent configs, prompts, skills, tools (t/idx), utilities,
                  plugins, memory, plans, transcripts (saved chats, killed sessions), scratch
"""

# The s/ and b/ scripts ship as files in the package; `ollie init` installs them into
# $OLLIE_CFG_PATH/scripts/s/ and scripts/b/, and a copy there (yours to change) is what is served,
# read when the server starts.
PACKAGE_DEFAULTS = Path(__file__).resolve().parent.parent / "defaults"


def scripts_of(directory: str) -> dict[str, str]:
    """The scripts of s/ or b/ by name: the installed copy when there is one, else the package's."""
    installed = config.cfg_path() / "scripts" / directory
    scripts = {}
    for shipped in sorted((PACKAGE_DEFAULTS / directory).iterdir()):
        if not shipped.is_file() or shipped.name.startswith("."):
            continue
        scripts[shipped.name] = shipped.read_text()
        try:
            scripts[shipped.name] = (installed / shipped.name).read_text()
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError) as e:
            log.warning(
                "%s/%s: serving the package's script: cannot read %s: %s", directory, shipped.name, installed, e
            )
    return scripts


def backends_text() -> str:
    from .. import backends

    try:
        config.load_env_file()  # the default as a new session would get it (keys set since start)
    except ConfigError as e:
        log.warning("%s", e)
    default = backends.default_name()
    return "".join(f"{n}{' *' if n == default else ''}\n" for n in backends.names())


def skills_index(cwd: str | None = None) -> str:
    """sk/idx: the user's skills (OLLIE_SKILLS_PATH), and with `cwd` the project's, as the model is
    offered them."""
    from .. import skills

    return skills.index(skills.list_skills(cwd)[0])


def _private(path: Path) -> Path:
    """Scratch under a shared /tmp: ours alone, or the server refuses to start (ConfigError)."""
    config.private_dir(path.parent)
    return config.private_dir(path)


def build(sessions: Sessions, jobs: Jobs | None = None) -> Namespace:
    cfg, data = config.cfg_path(), config.data_path()
    tools = config.tools_path()[0]
    root = StaticDir(
        {
            "ctl": root_ctl(sessions),
            "backends": TextFile(backends_text),
            "help": TextFile(lambda: HELP, text_size(lambda: HELP)),
            "a": DiskDir(config.agents_path()[0], validate=validate_agent),
            "p": DiskDir(cfg / "prompts", writable=False),
            "sk": DiskDir(
                config.skills_path()[0], writable=False, nested=True, synthetic={"idx": TextFile(skills_index)}
            ),
            "t": DiskDir(tools, synthetic={"idx": TextFile(lambda: tools_index(config.tools_path()))}),
            "u": DiskDir(cfg / "utils"),
            "x": DiskDir(cfg / "plugins"),
            "m": DiskDir(data / "memory", shared=True),
            "pl": DiskDir(data / "plans", shared=True),
            "tr": TranscriptsDir(data / "transcripts"),
            "tmp": DiskDir(_private(config.tmp_path() / "scratch")),
            "s": SessionsDir(sessions, scripts_of("s")),
            "b": JobsDir(jobs or Jobs(sessions), scripts_of("b")),
        }
    )
    return Namespace(root)
