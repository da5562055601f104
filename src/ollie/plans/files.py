"""Plan files in pl/: their names, their signature line, their bounds, and reading them.

A plan is `<UTC time>_<hex>--<goal>__<todo|wip|done>.md`: a goal line ("# …"), a signature line,
then its steps ("- [ ] title — description (after: titles)"). The signature is an HMAC with the
session's key over the plan's stem, the session id, the goal, the steps and their dependencies
(not the check marks). The default tool scripts, which run sandboxed and cannot import ollie,
compute it too (`_toolkit.py`'s `plan_mac`): tests/test_tool_scripts.py checks that both agree.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import itertools
import os
import re
import time
from dataclasses import dataclass

from .. import config

SIGNATURE_TAG = "ollie-plan v1"

# Bounds on what a plan may hold (task_plan refuses more; a plan beyond them is not committed).
MAX_PLAN_BYTES = 128 * 1024
MAX_STEPS = 64
MAX_TITLE = 200
MAX_DESCRIPTION = 1000
MAX_GOAL = 200

NAME = re.compile(r"(?P<stem>\d{8}T\d{6}Z_[0-9a-f]{6}--[^_/]*)__(?P<status>todo|wip|done)\.md")
SIGNATURE = re.compile(
    r"<!-- ollie-plan v1 session=(?P<sid>[A-Za-z0-9._-]{1,128}) deps=(?P<deps>[0-9,;]*) "
    r"mac=(?P<mac>[0-9a-f]{64}) -->"
)
STEP = re.compile(r"- \[([ xX])\] ")
STATUS_ORDER = {"todo": 0, "wip": 1, "done": 2}


@dataclass(slots=True)
class Step:
    title: str
    description: str
    after: tuple[int, ...]  # the steps it depends on, by index (always earlier ones)
    checked: bool


@dataclass(slots=True)
class PlanFile:
    """A plan this session's key signed, as read from pl/."""

    name: str
    stem: str
    status: str  # todo, wip or done
    goal: str
    steps: list[Step]
    text: str  # the file without its signature line: the session's plan
    mtime: float


def signature(key: bytes, stem: str, sid: str, deps: str, goal_line: str, step_lines: list[str]) -> str:
    """What task_plan writes as mac=: the same computation in both (the steps with their boxes
    unchecked, so checking one keeps the signature)."""
    message = "\n".join([SIGNATURE_TAG, stem, sid, deps, goal_line, *step_lines])
    return hmac.new(key, message.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


@dataclass(slots=True)
class Signed:
    """What a file in pl/ says of itself, before its signature is checked."""

    sid: str
    deps: str
    mac: str
    goal_line: str
    step_lines: list[str]  # unchecked form
    checked: list[bool]
    text: str


def read_signed(text: str) -> Signed | None:
    lines = text.split("\n")
    if len(lines) < 3 or not lines[0].startswith("# "):
        return None
    found = SIGNATURE.fullmatch(lines[1])
    if found is None:
        return None
    step_lines, checked = [], []
    for line in lines[2:]:
        if m := STEP.match(line):
            step_lines.append("- [ ] " + line[m.end() :])
            checked.append(m.group(1) != " ")
    rest = "\n".join([lines[0], *lines[2:]])
    return Signed(found["sid"], found["deps"], found["mac"], lines[0], step_lines, checked, rest)


def steps_of(signed: Signed) -> tuple[str, list[Step]]:
    """The goal and the steps of a signed plan (raises ValueError when it breaks the bounds or
    its own structure): each line is "- [ ] title — description (after: titles)"."""
    goal = signed.goal_line[2:].strip()
    if not goal or len(goal) > MAX_GOAL:
        raise ValueError(f"its goal is {'empty' if not goal else f'longer than {MAX_GOAL} characters'}")
    deps = signed.deps.split(";")
    if not signed.step_lines or len(signed.step_lines) > MAX_STEPS or len(deps) != len(signed.step_lines):
        raise ValueError(f"it has {len(signed.step_lines)} steps for {len(deps)} dependency lists (1 to {MAX_STEPS})")
    steps: list[Step] = []
    for i, (line, dep) in enumerate(zip(signed.step_lines, deps, strict=True)):
        after = tuple(int(j) for j in dep.split(",")) if dep else ()
        if any(j >= i for j in after):
            raise ValueError(f"step {i + 1} depends on a step after it")
        body = line[len("- [ ] ") :]
        if after:
            suffix = " (after: " + ", ".join(steps[j].title for j in after) + ")"
            if not body.endswith(suffix):
                raise ValueError(f"step {i + 1} does not end with its dependencies")
            body = body[: -len(suffix)]
        title, _, description = body.partition(" — ")
        title, description = title.strip(), description.strip()
        if not title or len(title) > MAX_TITLE or len(description) > MAX_DESCRIPTION:
            raise ValueError(f"step {i + 1}'s title or description is empty or too long")
        steps.append(Step(title, description, after, signed.checked[i]))
    return goal, steps


TICK_NS = 2_000_000_000  # a file or directory changed less than this ago may change again unseen
# Every session's code writes pl/, so what a sync does there is bounded, and done in a thread: a
# listing reads at most PLANS_READ_MAX entries, and a sync looks at PLANS_MAX plans at most (the
# newest by name, a name beginning with its UTC time), and at the plans it knows as its own.
PLANS_READ_MAX = 10_000
PLANS_MAX = 256
# The plans directory (pl/), found once per data path: config.shared_dirs() resolves the path and
# makes the directories (a realpath, two mkdirs and their checks), too much for every tool round of
# every session; it is found again if the directory goes missing.
_PLANS_DIR: tuple[str, str] | None = None  # (the settings it was found for, the directory)
# Its plan files, listed once per change of the directory (shared by every session of the process):
# (the directory's (inode, mtime), when listed, the newest plans' names, whether there were more).
_LISTING: tuple[tuple[int, int], int, list[str], bool] | None = None


def plan_entries() -> tuple[str, list[str], bool]:
    """pl/, the names of its PLANS_MAX newest plan files, and whether it held more (or more than
    PLANS_READ_MAX entries, past which nothing is read); ("", [], False) when it cannot be listed.
    A listing is reused while the directory's inode and mtime stay what they were, and was taken
    more than a clock tick (2 s) after that mtime (a file added in the same tick would leave it
    unchanged)."""
    global _PLANS_DIR, _LISTING
    settings = _settings()
    if _PLANS_DIR is None or _PLANS_DIR[0] != settings:
        _PLANS_DIR, _LISTING = (settings, str(config.shared_dirs()[1])), None  # its errors are sync's to tell
    directory = _PLANS_DIR[1]
    try:
        key, listed = _listed(directory)
        if listed is not None:
            return directory, *listed
        now = time.time_ns()
        with os.scandir(directory) as it:
            read = list(itertools.islice((e.name for e in it), PLANS_READ_MAX + 1))
    except OSError:
        _PLANS_DIR = _LISTING = None  # found (and made) again next time
        return "", [], False
    names = [name for name in read[:PLANS_READ_MAX] if NAME.fullmatch(name)]
    newest, cut = heapq.nlargest(PLANS_MAX, names), len(read) > PLANS_READ_MAX or len(names) > PLANS_MAX
    _LISTING = (key, now, newest, cut)
    return directory, newest, cut


def listed_plans() -> tuple[list[str], bool] | None:
    """plan_entries()'s names and whether pl/ held more, if its last listing still holds (one
    stat, no listing: cheap enough for the event loop); None if pl/ must be found or listed anew."""
    found = _PLANS_DIR  # read once: a sync's thread may set it meanwhile
    if found is None or found[0] != _settings():
        return None
    try:
        return _listed(found[1])[1]
    except OSError:
        return None


def _settings() -> str:
    return f"{os.environ.get('OLLIE_DATA_PATH')}\0{os.environ.get('HOME')}"  # what config.data_path() reads


def _listed(directory: str) -> tuple[tuple[int, int], tuple[list[str], bool] | None]:
    """The directory's (inode, mtime), and its last listing if that still holds: the two unchanged
    since, and the listing taken more than a tick after that mtime."""
    st = os.stat(directory)
    key, listing = (st.st_ino, st.st_mtime_ns), _LISTING  # read once: syncs of other sessions list too
    if listing is not None and listing[0] == key and listing[1] - st.st_mtime_ns > TICK_NS:
        return key, (listing[2], listing[3])
    return key, None


def read_file(path: str) -> str | None:
    """A regular file's text, never through a link nor blocking on a FIFO, within the bound."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > MAX_PLAN_BYTES:
            return None
        data = os.read(fd, MAX_PLAN_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data[:MAX_PLAN_BYTES].decode("utf-8", "surrogateescape")


def names_of(stem: str) -> set[str]:
    """A plan's file names, in each of its states."""
    return {f"{stem}__{status}.md" for status in STATUS_ORDER}


def lexists(directory: str, name: str) -> bool:
    """Whether `name` is in `directory`, a link or not."""
    try:
        os.stat(os.path.join(directory, name), follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # there, but unreadable: not gone
    return True
