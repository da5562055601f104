"""Paths, the env file, and agent configs (`agents/<name>.json`)."""

from __future__ import annotations

import contextlib
import difflib
import functools
import getpass
import json
import os
import re
import shutil
import stat
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .types import GENERATION_PARAM_TYPES, ConfigError, GenerationParams

HOOK_EVENTS = ("agentSpawn", "preTurn", "postTurn", "preTool", "postTool", "preCompact", "postCompact", "turnError")


def _dir(var: str, default: str) -> Path:
    return _path(os.environ.get(var) or os.path.expanduser(default))


@functools.lru_cache(maxsize=64)
def _path(text: str) -> Path:
    """A Path made once per text: the directories are asked for at every request and tool call,
    and read from the environment each time (tests and users change it), but rarely change."""
    return Path(text)


@functools.lru_cache(maxsize=64)
def _path_list(raw: str) -> tuple[Path, ...]:
    return tuple(Path(p) for p in raw.split(":") if p)


def _xdg(var: str, fallback: str) -> str:
    """An XDG base directory: the variable when it holds an absolute path (the specification
    ignores a relative one), else its default."""
    value = os.environ.get(var, "")
    return value if os.path.isabs(value) else fallback


def cfg_path() -> Path:
    return _dir("OLLIE_CFG_PATH", os.path.join(_xdg("XDG_CONFIG_HOME", "~/.config"), "ollie"))


def data_path() -> Path:
    return _dir("OLLIE_DATA_PATH", os.path.join(_xdg("XDG_DATA_HOME", "~/.local/share"), "ollie"))


def shared_dirs() -> tuple[Path, Path]:
    """The memory and the plans: directories every session's sandboxed code may read and write
    (shown on the mount as m/ and pl/), created private to the user if missing."""
    return data_dir("memory"), data_dir("plans")


def data_dir(*names: str) -> Path:
    """A directory in ollie's data by its real path, private to the user (made if missing): one a
    jail shows its code (the jail hides ollie's data by real path and shows such a grant again, and
    a symlink on the way, such as a linked ~/.local/share, would make it a grant through a link)."""
    path = Path(os.path.realpath(data_path()))
    for name in names:  # each private, not only the last (mkdir's parents get the umask's mode)
        path = private_dir(path / name)
    return path


def tmp_path() -> Path:
    return _dir("OLLIE_TMP_PATH", f"/tmp/ollie-{os.geteuid()}")  # one per user: it must be theirs alone


def namespace_path() -> Path:
    """The directory of the file server's socket: `$NAMESPACE`, else plan9port's default
    `/tmp/ns.$USER.$DISPLAY`."""
    ns = os.environ.get("NAMESPACE")
    if not ns:
        display = (os.environ.get("DISPLAY") or ":0").removesuffix(".0").replace("/", "_")
        ns = f"/tmp/ns.{_user()}.{display}"
    return Path(ns)


def _user() -> str:
    """The user's name as getpass.getuser finds it: its variables, else the password file's
    entry, read once (every sandbox's build asks for ollie's directories several times)."""
    return next((v for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if (v := os.environ.get(k))), "") or _login()


@functools.cache
def _login() -> str:
    return getpass.getuser()


def socket_path() -> Path:
    """Where the file server listens by default: `ollie` in the namespace directory."""
    return namespace_path() / "ollie"


def private_dir(path: Path) -> Path:
    """`path` as a directory only this user can enter: created 0700 (parents too) if missing, and
    refused when another user owns it or can write to it (under a shared /tmp, whoever creates a
    name first owns it, and could swap what we keep there)."""
    with contextlib.suppress(FileExistsError):  # a file there: said below, with what to do
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} must be a directory, not a link or a file; remove it or choose another path")
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}); remove it or choose another path"
        )
    if st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
    return path


def tools_path() -> list[Path]:
    return list(_path_list(os.environ.get("OLLIE_TOOLS_PATH") or str(cfg_path() / "tools")))


def agents_path() -> list[Path]:
    return list(_path_list(os.environ.get("OLLIE_AGENTS_PATH") or str(cfg_path() / "agents")))


def skills_path() -> list[Path]:
    return list(_path_list(os.environ.get("OLLIE_SKILLS_PATH") or str(cfg_path() / "skills")))


def own_paths() -> list[Path]:
    """ollie's own directories: its configuration, data, runtime files and namespaces."""
    return [cfg_path(), data_path(), tmp_path(), namespace_path()]


def hidden_dirs() -> list[str]:
    """ollie's directories that sandboxed code never sees, and no policy may grant: its
    configuration (API keys, agent configs with hooks, policies), its stored sessions, the session
    scratch directories, the file server's socket directory, and every agents directory."""
    return [str(p) for p in (*own_paths(), *agents_path())]


SYSTEM_BIN = "/usr/bin:/bin:/usr/sbin:/sbin"


def system_program(name: str) -> str:
    """A program of the system's, for ollie to run outside any sandbox: found where no sandbox
    writes, never on the user's PATH (which may start with a project's .venv/bin, the model's to
    fill). `name` itself if it is nowhere there (running it then fails, naming it)."""
    return shutil.which(name, path=SYSTEM_BIN) or name


def mount_path() -> Path:
    return _dir("OLLIE", "~/mnt/ollie")


def mount_point() -> str:
    """The mount path made real up to its parent, the last name as it is: a stat of the mount
    point itself is a request to the file server, which may be this very process's loop (a jail
    hides every mount of ollie's file server, wherever a link leads)."""
    path = mount_path()
    return os.path.join(os.path.realpath(path.parent), path.name)


def mounts() -> list[tuple[str, str]]:
    """This process's mounts, from /proc/self/mountinfo: (mount point, file system type)."""
    found = []
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split(b" ")
        dash = fields.index(b"-") if b"-" in fields else -1
        if dash > 4:  # \040 is a space in a mount point, \012 a newline
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), fields[4])
            found.append((os.fsdecode(point), os.fsdecode(fields[dash + 1])))
    return found


def ollie_mount_of(path: str) -> str:
    """The mount of an ollie file server that `path` (absolute) lies on, judged by its name alone,
    or "". Nothing is looked up: a stat there is a request to the file server, which may be this
    very process, waiting on itself. A path that only leads there through a symlink is not seen."""
    path = os.path.normpath(path)
    for mount in [mount_point(), *(point for point, kind in mounts() if kind == "fuse.ollie")]:
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            return mount
    return ""


def own_dir_of(real: str) -> str:
    """The directory of ollie's own (`hidden_dirs`) that `real` (a real path) is or lies in, or "":
    a session working there would have every tool call refused by its sandbox, so it is refused
    at once. (The sandbox decides again, by descriptor, at each call.)"""
    for own in hidden_dirs():
        top = os.path.realpath(own)
        if real == top or real.startswith(top.rstrip("/") + "/"):
            return own
    return ""


# The variables the env file set, and to what: loading it again (a server does, for each new
# session) follows its changes (`ollie keys set`), and never what the environment set itself.
_FROM_FILE: dict[str, str] = {}


def load_env_file(path: Path | None = None) -> None:
    """Fill unset variables from `$OLLIE_CFG_PATH/env` (KEY=VALUE lines, # comments). Loaded
    again, it updates the variables it set before and unsets those it no longer names."""
    path = path or cfg_path() / "env"
    try:
        text = path.read_text()
    except OSError:
        text = ""
    values = _parse_env(path, text)
    for key in set(_FROM_FILE) - set(values):
        if os.environ.get(key) == _FROM_FILE.pop(key):
            del os.environ[key]
    for key, value in values.items():
        if key not in os.environ or os.environ[key] == _FROM_FILE.get(key):
            os.environ[key] = _FROM_FILE[key] = value


def own_command() -> list[str]:
    """The `ollie` command, for a process of ollie's own (the file server): with -P, so that the
    directory it starts in (a project, whose files sandboxed code writes) is not first on its
    import path, where a planted `argparse.py` would run as the server, with every session's keys."""
    return [sys.executable, "-P", "-c", "import sys; from ollie.cli import main; sys.exit(main())"]


def own_environ() -> dict[str, str]:
    """The environment without what the env file set: for a process that loads the file itself
    (the server), so that it sees later changes of the file as the file's."""
    return {k: v for k, v in os.environ.items() if _FROM_FILE.get(k) != v}


def _parse_env(path: Path, text: str) -> dict[str, str]:
    """`KEY=VALUE` lines as .env files have them (python-dotenv's and docker's rules): `export`
    before a key is allowed; a value in single quotes is taken as it is, one in double quotes
    with `\\n`, `\\t`, `\\"` and `\\\\` escapes; a `#` after a space ends an unquoted value, and
    after the closing quote a comment may follow. Nothing is expanded."""
    values = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"{path}:{n}: expected KEY=VALUE, got {line!r}")
        try:
            values[key] = _env_value(value.strip())
        except ValueError as e:
            raise ConfigError(f"{path}:{n}: {key}: {e}") from None
    return values


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


def _env_value(raw: str) -> str:
    if not raw or raw[0] not in "'\"":
        return re.split(r"\s+#", raw, maxsplit=1)[0].rstrip()
    quote, out, i = raw[0], [], 1
    while i < len(raw) and raw[i] != quote:
        if quote == '"' and raw[i] == "\\" and i + 1 < len(raw):
            out.append(_ESCAPES.get(raw[i + 1], "\\" + raw[i + 1]))
            i += 2
            continue
        out.append(raw[i])
        i += 1
    if i >= len(raw):
        raise ValueError(f"the value's {quote} is never closed")
    rest = raw[i + 1 :].strip()
    if rest and not rest.startswith("#"):
        raise ValueError(f"{rest!r} follows the quoted value; put a # before a comment")
    return "".join(out)


@dataclass
class AgentConfig:
    """An agent: its system prompt, tools, hooks, limits, generation params and MCP servers."""

    name: str = "default"
    path: str = ""  # the file it came from ("" for the built-in default)
    description: str = ""  # what it is for: the model reads it when it may start it as a sub-agent
    prompt: str | list[str] = ""
    instructions: bool = True  # the project's AGENTS.md (or CLAUDE.md) and the user's, in the system prompt
    skills: bool = True  # the skills offered to the model
    backend: str = ""
    model: str = ""
    models: list[str] = field(default_factory=list)  # more a sub-agent of it may run on, besides `model`
    tools: bool = True
    max_steps: int = 0  # 0: no budget
    context_window: int = 0  # 0: ask the backend
    compact_warn: float = 0.60
    compact_at: float = 0.75
    hooks: dict[str, list[str]] = field(default_factory=dict)
    hook_sandbox: str | bool = "hooks"  # the sandbox policy hooks run under; False: unsandboxed
    trust_writable_hooks: bool = False  # run a hook whose file sandboxed code can write
    sandboxes: list[str] = field(default_factory=lambda: ["default"])  # policies the model may pick
    subagents: list[str] = field(default_factory=list)  # agents its code may start sub-sessions with, besides itself
    mcp_servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    params: GenerationParams = field(default_factory=GenerationParams)


# JSON key → (attribute, expected type)
_FIELDS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "description": ("description", str),
    "prompt": ("prompt", (str, list)),
    "instructions": ("instructions", bool),
    "skills": ("skills", bool),
    "backend": ("backend", str),
    "model": ("model", str),
    "models": ("models", list),
    "tools": ("tools", bool),
    "maxSteps": ("max_steps", int),
    "contextWindow": ("context_window", int),
    "compactWarn": ("compact_warn", (int, float)),
    "compactAt": ("compact_at", (int, float)),
    "hooks": ("hooks", dict),
    "hookSandbox": ("hook_sandbox", (str, bool)),
    "trustWritableHooks": ("trust_writable_hooks", bool),
    "sandboxes": ("sandboxes", list),
    "subagents": ("subagents", list),
    "mcpServers": ("mcp_servers", dict),
}
_PARAM_KEYS = {
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "minP": "min_p",
    "frequencyPenalty": "frequency_penalty",
    "presencePenalty": "presence_penalty",
    "repetitionPenalty": "repetition_penalty",
    "maxTokens": "max_tokens",
    "maxCompletionTokens": "max_completion_tokens",
    "stop": "stop",
    "responseFormat": "response_format",
    "reasoningEffort": "reasoning_effort",
    "reasoningBudget": "reasoning_budget",
}


def parse_agent(name: str, data: Any, path: str = "") -> AgentConfig:
    """Validate a decoded agent config; errors name the file, the field and the fix."""
    where = path or f"agent {name!r}"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the config must be a JSON object, got {type(data).__name__}")
    cfg = AgentConfig(name=name, path=path)
    for key, value in data.items():
        _take_field(cfg, where, key, value)
    cfg.hooks = _parse_hooks(where, cfg.hooks)
    _check(cfg, where)
    return cfg


def checked_agent(cfg: AgentConfig) -> AgentConfig:
    """An AgentConfig built in code, held to the rules a config file is (a copy: a hook given as
    one command string becomes a list of it, as in a file)."""
    where = f"AgentConfig {cfg.name!r}"
    if not _NAME.fullmatch(cfg.name):
        raise ConfigError(f"{where}: invalid name: use letters, digits, '.', '_' and '-'")
    for attr, kind in _FIELDS.values():
        value = getattr(cfg, attr)
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ConfigError(f"{where}: {attr} must be {want}, got {value!r}")
    checked = replace(cfg, hooks=_parse_hooks(where, cfg.hooks))
    _check(checked, where)
    return checked


def _take_field(cfg: AgentConfig, where: str, key: str, value: Any) -> None:
    if key in _FIELDS:
        attr, kind = _FIELDS[key]
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise ConfigError(f"{where}: field {key!r} must be {want}, got {json.dumps(value)}")
        setattr(cfg, attr, value)
    elif key in _PARAM_KEYS or key in GENERATION_PARAM_TYPES:
        try:
            cfg.params.set(_PARAM_KEYS.get(key, key), value)
        except ValueError as e:
            raise ConfigError(f"{where}: field {key!r}: {e}") from None
    elif key == "trustedTools":  # Go's: accepting it and doing nothing would look like a grant
        raise ConfigError(
            f"{where}: field 'trustedTools' is not supported: ollie asks for no approval before a "
            "tool call, and every execute_code stage runs sandboxed whatever the tool; to let the "
            'model pick a wider sandbox policy, list it under "sandboxes" (docs/sandbox.md). '
            "Remove the field"
        )
    elif key not in ("name", "$schema"):
        known = sorted([*_FIELDS, *_PARAM_KEYS])
        close = difflib.get_close_matches(key, known, n=1)
        fix = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{where}: unknown field {key!r}{fix}; known fields: {', '.join(known)}")


def _parse_hooks(where: str, raw: dict[str, Any]) -> dict[str, list[str]]:
    hooks: dict[str, list[str]] = {}
    for event, cmds in raw.items():
        if event not in HOOK_EVENTS:
            raise ConfigError(f"{where}: unknown hook event {event!r}; events: {', '.join(HOOK_EVENTS)}")
        cmds = [cmds] if isinstance(cmds, str) else cmds
        if not isinstance(cmds, list) or not all(isinstance(c, str) for c in cmds):
            raise ConfigError(f"{where}: hooks.{event} must be a command string or a list of them")
        hooks[event] = cmds
    return hooks


def _check(cfg: AgentConfig, where: str) -> None:
    """What holds between fields."""
    if cfg.hook_sandbox is True or cfg.hook_sandbox == "":
        raise ConfigError(f"{where}: hookSandbox is a sandbox policy name, or false to run hooks unsandboxed")
    if not cfg.sandboxes or not all(isinstance(p, str) and _NAME.fullmatch(p) for p in cfg.sandboxes):
        raise ConfigError(f'{where}: sandboxes must be a non-empty list of sandbox policy names, e.g. ["default"]')
    if not all(isinstance(a, str) and _NAME.fullmatch(a) for a in cfg.subagents):
        raise ConfigError(f'{where}: subagents must be a list of agent names, e.g. ["reviewer"]')
    if not all(isinstance(m, str) and m and "\n" not in m for m in cfg.models):
        raise ConfigError(f'{where}: models must be a list of model names, e.g. ["gpt-4.1-mini"]')
    for server, spec in cfg.mcp_servers.items():
        if not isinstance(spec, dict) or not ("command" in spec or "url" in spec):
            raise ConfigError(f'{where}: mcpServers.{server} needs "command" (stdio) or "url" (HTTP)')
    if cfg.max_steps < 0 or cfg.context_window < 0:
        raise ConfigError(f"{where}: maxSteps and contextWindow are counts: 0 (none, or the backend's) or more")
    if not 0 < cfg.compact_warn <= cfg.compact_at <= 1:
        raise ConfigError(f"{where}: need 0 < compactWarn <= compactAt <= 1")


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def list_agents() -> list[str]:
    found = {"default"}
    for d in agents_path():
        if d.is_dir():
            found.update(p.stem for p in d.glob("*.json"))
    return sorted(found)


def load_agent(name: str = "default") -> AgentConfig:
    """Load `agents/<name>.json` from the agents path; "default" may be absent (built-in)."""
    if not _NAME.fullmatch(name):
        raise ConfigError(f"invalid agent name {name!r}: use letters, digits, '.', '_' and '-'")
    for d in agents_path():
        path = d / f"{name}.json"
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError(f"{path}: cannot read the agent config: {e}") from None
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
            return parse_agent(name, data, str(path))
    if name == "default":
        return AgentConfig()
    raise ConfigError(
        f"no agent {name!r}: create {agents_path()[0] / (name + '.json')}; known: {', '.join(list_agents())}"
    )


DEFAULT_SYSTEM_PROMPT = """You are ollie, a capable agent working in a Linux shell environment.
Use the execute_code tool to run code when it helps: inspect files, compute, test. Prefer small steps.
When the task is done, answer concisely."""


def starts_outside_sandbox(cfg: AgentConfig) -> list[str]:
    """What a session of this agent runs outside the sandbox when it starts or as it works, in the
    session's cwd: hooks and prompt commands with `"hookSandbox": false`, stdio tool servers with
    `"sandbox": false`. A session's code that could start one in a directory it filled could run
    anything (a git hook, a module on the path)."""
    found = []
    if cfg.hook_sandbox is False and (prompt_commands(cfg.prompt) or cfg.hooks):
        found.append('hooks or prompt commands with "hookSandbox": false')
    found += [
        f'the tool server {name!r} ("sandbox": false)'
        for name, spec in cfg.mcp_servers.items()
        if isinstance(spec, dict) and spec.get("sandbox") is False
    ]
    return found


def prompt_commands(prompt: str | list[str]) -> list[str]:
    """The commands whose joined output is the system prompt: a list of them, or one `!command`."""
    if isinstance(prompt, list):
        return prompt
    return [prompt[1:]] if prompt.startswith("!") else []


def prompt_text(prompt: str) -> str:
    """A system prompt that is no command: a literal (has a newline), a file's text (relative to
    $OLLIE_CFG_PATH), or the text itself; the default if empty."""
    if not prompt:
        return DEFAULT_SYSTEM_PROMPT
    if "\n" in prompt:
        return prompt
    path = Path(os.path.expanduser(prompt))
    if not path.is_absolute():
        path = cfg_path() / path
    if path.is_file():
        return path.read_text()
    if not any(c.isspace() for c in prompt) and ("/" in prompt or _PROMPT_FILE.search(prompt)):
        # a file's name, not a prompt: a typo in it would make the name itself the system prompt
        raise ConfigError(f"prompt: no file {str(path)!r} (a file's path is relative to {cfg_path()})")
    return prompt


_PROMPT_FILE = re.compile(r"\.(md|txt|prompt)$", re.I)
