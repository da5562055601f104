#!/usr/bin/env python3
"""The code ollie's default tool scripts share, beside them in their directory: one copy, imported,
where each script used to carry its own. It is no tool (it has no `description:` header, so t/idx
and execute_code's description leave it out), and run as one it only says so.

Each script imports it from its own directory, found through its own path with links resolved,
put first on sys.path before the import:

    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    import _toolkit
    from _toolkit import fail, ...

    _toolkit.NAME = "file_read"  # what its error messages start with

so a `_toolkit.py` elsewhere (a project's tools directory earlier in OLLIE_TOOLS_PATH, the cwd,
$PYTHONPATH, even with PYTHONSAFEPATH set) is never the one a shipped script runs; and the tools
directories are read-only in every jail, this file with them. A script copied elsewhere needs this
file beside it.

Standard library only. In a jail the directory is read-only, so no bytecode is cached and this file
is compiled at each run (about 2 ms); re, json, hashlib, hmac and difflib, which cost more, are
imported where they are used, not here.

The plan signature (`plan_mac`) is also computed by ollie/plans/files.py (`signature`), which the
sandboxed scripts cannot import; tests/test_tool_scripts.py computes both on the same plans."""

import os
import sys
import time

NAME = "tool"  # the script's name, which starts its error messages: each script sets it


def fail(reason, status=1, details=""):
    """Say why on stderr as `NAME: reason` (and `details` on stdout), and exit with `status`."""
    sys.stderr.write(f"{NAME}: {reason}\n")
    sys.stderr.flush()
    if details:
        emit(details)
    sys.exit(status)


def emit(text):
    """Text out as UTF-8; bytes that were not UTF-8 in the file go out as they were."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "replace")
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


# ---- read state: file_read, file_write, file_edit ------------------------------------------------
# One record per file, `mtime_ns size sha256 path`, in the session's private $TMPDIR, written whole
# and renamed into place, so concurrent reads never tear it. No json, re or tempfile, and sha256
# from the interpreter's own module when it has one: importing those (hashlib loads OpenSSL) would
# cost more than reading a source file.

try:
    from _sha2 import sha256  # type: ignore[import-not-found]  # Python 3.12 and later
except ImportError:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # up to 3.11
    except ImportError:
        from hashlib import sha256


def state_dir():
    base = os.environ.get("TMPDIR") or "/tmp"
    session = "".join(c if c.isalnum() or c in "._-" else "_" for c in os.environ.get("OLLIE_SESSION_ID", ""))
    return os.path.join(base, f".ollie-file-state-{os.getuid()}", session or "no-session")


def state_file(real):
    return os.path.join(state_dir(), sha256(os.fsencode(real)).hexdigest())


def remember(real, mtime_ns, size, digest):
    """Record that the session has seen `real` with this content."""
    path = state_file(real)
    mine = os.path.dirname(os.path.dirname(path))
    try:
        os.makedirs(mine, mode=0o700, exist_ok=True)
        if os.stat(mine).st_uid != os.getuid():
            return  # a directory someone else made in a shared /tmp: keep no record there
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(b"%d %d %s " % (mtime_ns, size, digest.encode()) + os.fsencode(real))
        os.replace(tmp, path)
    except OSError:
        pass  # no record: a later file_write or file_edit asks for a read first


def recalled(real):
    """(mtime_ns, size, sha256) as the session last read or wrote `real`, or None."""
    try:
        if os.stat(os.path.dirname(state_dir())).st_uid != os.getuid():
            return None
        with open(state_file(real), "rb") as f:
            mtime_ns, size, digest, path = f.read().split(b" ", 3)
        return (int(mtime_ns), int(size), digest.decode()) if path == os.fsencode(real) else None
    except (OSError, ValueError):
        return None


def unchanged_reason(path, real, data):
    """Why `path` (now holding `data`) may not be overwritten: "" when the session read it and it
    has not changed since."""
    record = recalled(real)
    if record is None:
        return f"{path} exists and was not read in this session; file_read {path} first"
    if record[1:] != (len(data), sha256(data).hexdigest()):
        return f"{path} changed since it was last read in this session; file_read {path} again first"
    return ""


# ---- diff and write: file_write, file_edit -------------------------------------------------------

MAX_DIFF_LINES = 400


def split_lines(text):
    """Lines as file_read numbers them (split at \n only), each with its end."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def diff(path, before, after):
    """A unified diff of two texts, at most MAX_DIFF_LINES lines."""
    import difflib  # here: a file written anew needs no diff, nor difflib's import

    out = []
    for line in difflib.unified_diff(split_lines(before), split_lines(after), path, path, n=3):
        if line.endswith("\n"):
            out.append(line.rstrip("\n").rstrip("\r"))
        else:
            out += [line.rstrip("\r"), "\\ No newline at end of file"]
    if len(out) > MAX_DIFF_LINES:
        out[MAX_DIFF_LINES:] = [f"… {len(out) - MAX_DIFF_LINES} more diff lines (file_read {path} to see the result)"]
    return "".join(line + "\n" for line in out)


def write(real, data):
    """Write `data` over `real` in place (its mode and links kept) and record it as read."""
    with open(real, "wb") as f:
        f.write(data)
        f.flush()
        st = os.fstat(f.fileno())
    remember(real, st.st_mtime_ns, len(data), sha256(data).hexdigest())


# ---- plans: file_write, file_edit, task_plan -----------------------------------------------------
# A plan task_plan wrote (pl/<stem>__todo.md, later __wip and __done) carries a signature on its
# second line: an HMAC with the session's key ($OLLIE_PLAN_KEY) over the plan's stem, the session,
# the goal, the steps and their dependencies (task_plan makes it; ollie/plans/files.py checks it).
# The session takes only plans its own key signed, so that another session's code, which can write
# pl/ too, cannot hand it steps. An edit breaks the signature: so a revision of a plan this
# session signed and no other code changed since (its signature still verifies) is signed anew
# here, its dependencies read from the "(after: …)" ends of its steps. A plan that is not the
# session's, or that other code changed, is written as given and stays unsigned for this session.
# What plans/files.py also knows (the bounds, the signature line and its MAC, a plan's file name and its
# step lines) is checked against it by tests/test_tool_scripts.py.

PLAN_MAX_STEPS, PLAN_MAX_TITLE, PLAN_MAX_DESCRIPTION, PLAN_MAX_GOAL = 64, 200, 1000, 200  # as plans/files.py
PLAN_SIGNATURE = (
    r"<!-- ollie-plan v1 session=(?P<sid>[A-Za-z0-9._-]{1,128}) deps=(?P<deps>[0-9,;]*) "
    r"mac=(?P<mac>[0-9a-f]{64}) -->"
)
PLAN_NAME = r"(?P<stem>\d{8}T\d{6}Z_[0-9a-f]{6}--[^_/]*)__(?P<status>todo|wip|done)\.md"


def plan_step(line):
    """Whether `line` is a step of a plan ("- [ ] …", "- [x] …"), as plans/files.py reads them."""
    return line[:3] == "- [" and line[3:4] in (" ", "x", "X") and line[4:6] == "] "


def plan_mac(key, stem, sid, deps, goal_line, step_lines):
    """The plan's signature: an HMAC-SHA256 with the session's key over its stem, the session, the
    dependencies, the goal line and the step lines (each with its box unchecked), as plans/files.py's
    `signature` computes it."""
    import hashlib
    import hmac

    message = "\n".join(["ollie-plan v1", stem, sid, deps, goal_line, *step_lines])
    return hmac.new(key, message.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def plan_signature(key, stem, sid, deps, goal_line, step_lines):
    """The signature line, a plan's second."""
    mac = plan_mac(key, stem, sid, deps, goal_line, step_lines)
    return f"<!-- ollie-plan v1 session={sid} deps={deps} mac={mac} -->"


def plan_session():
    """(key, session id) of the session whose stage this is, from $OLLIE_PLAN_KEY and
    $OLLIE_SESSION_ID; None when either is missing or malformed (a run outside a session's stage)."""
    import re

    key, sid = os.environ.get("OLLIE_PLAN_KEY", ""), os.environ.get("OLLIE_SESSION_ID", "")
    if not re.fullmatch(r"[0-9a-f]{64}", key) or not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", sid):
        return None
    return bytes.fromhex(key), sid


def plan_signer(real, before):
    """(key, stem, session) when the file `real` is a plan this session signed, as `before` (its
    bytes) holds it: its revision is signed anew. A string saying why not when it claims this
    session but its signature does not verify; else None (no plan, or not this session's)."""
    name = os.path.basename(real)
    if before is None or not name.endswith(".md") or "__" not in name:
        return None
    import hmac
    import re

    found = re.fullmatch(PLAN_NAME, name)
    session = plan_session()
    if found is None or session is None:
        return None
    key, sid = session
    lines = before.decode("utf-8", "surrogateescape").split("\n")
    head = re.fullmatch(PLAN_SIGNATURE, lines[1]) if len(lines) > 2 and lines[0].startswith("# ") else None
    if head is None or head["sid"] != sid:
        return None
    steps = ["- [ ] " + line[6:] for line in lines[2:] if plan_step(line)]
    mac = plan_mac(key, found["stem"], sid, head["deps"], lines[0], steps)
    if not hmac.compare_digest(mac, head["mac"]):
        return "it claims this session, but its signature did not verify before this edit (other code changed it)"
    return key, found["stem"], sid


def plan_after(named, earlier):
    """The indexes of the earlier steps `named` lists (their titles joined by ", ", any case), in
    its order; None when it is no such list. `earlier` maps each earlier title, casefolded, to its
    index."""
    if not named:
        return []
    for title in sorted(earlier, key=len, reverse=True):  # the longest first: titles may hold ", "
        if named == title:
            return [earlier[title]]
        if named.startswith(title + ", "):
            rest = plan_after(named[len(title) + 2 :], earlier)
            if rest is not None:
                return [earlier[title], *rest]
    return None


def plan_signed(signer, text):
    """The revision `text` of the plan `signer` names, signed anew (a step's dependencies written
    with the titles as they are), and its number of steps; (None, why) when the session could not
    take it as a plan."""
    import re

    key, stem, sid = signer
    lines = [line for line in text.split("\n") if not re.fullmatch(PLAN_SIGNATURE, line)]
    goal = lines[0][2:].strip() if lines[0].startswith("# ") else ""
    if not goal or len(goal) > PLAN_MAX_GOAL:
        return None, f"its first line must be '# GOAL', a goal of 1 to {PLAN_MAX_GOAL} characters"
    titles: list[str] = []
    earlier: dict[str, int] = {}  # each title so far, casefolded: its index
    deps: list[str] = []
    for n, line in enumerate(lines[1:], 1):
        if not plan_step(line):
            continue
        body, after = line[6:], []
        cut = body.rfind(" (after: ")
        if cut >= 0 and body.endswith(")"):
            named = body[cut + len(" (after: ") : -1]
            found = plan_after(" ".join(named.split()).casefold(), earlier)
            if found is None:
                known = "; ".join(titles) or "none"
                return None, (
                    f"step {len(titles) + 1} is after {named!r}, which is no earlier step's title (nor several, "
                    f"joined by ', '); the steps before it: {known}"
                )
            after, body = list(dict.fromkeys(found)), body[:cut]
            lines[n] = line[:6] + body + " (after: " + ", ".join(titles[j] for j in after) + ")"
        title, _, description = body.partition(" — ")
        title, description = title.strip(), description.strip()
        if not title or len(title) > PLAN_MAX_TITLE or len(description) > PLAN_MAX_DESCRIPTION:
            return None, (
                f"step {len(titles) + 1} needs a title of 1 to {PLAN_MAX_TITLE} characters, and a description of "
                f"at most {PLAN_MAX_DESCRIPTION} (- [ ] title — description (after: title, …))"
            )
        if title.casefold() in earlier:
            return None, f"two steps are titled {title!r}: titles name steps (in '(after: …)', in task_complete)"
        earlier[title.casefold()] = len(titles)
        titles.append(title)
        deps.append(",".join(map(str, after)))
    if not 1 <= len(titles) <= PLAN_MAX_STEPS:
        return None, f"it has {len(titles)} steps ('- [ ] title' lines); a plan has 1 to {PLAN_MAX_STEPS}"
    steps = ["- [ ] " + line[6:] for line in lines[1:] if plan_step(line)]
    head = plan_signature(key, stem, sid, ";".join(deps), lines[0], steps)
    return "\n".join([lines[0], head, *lines[1:]]), len(titles)


def plan_revised(real, before, after):
    """`after`, the new text of the file `real` (`before` its bytes, None when new), signed anew
    when it is a plan of this session, and a note saying so; fails, writing nothing, when the
    revision of such a plan is no plan."""
    signer = plan_signer(real, before)
    if signer is None:
        return after, ""
    if isinstance(signer, str):
        return after, f"[{signer}: not signed anew, so the session does not take it]\n"
    signed, steps = plan_signed(signer, after)
    if signed is None:
        fail(f"{real} is a plan of this session, and this revision would not be one: {steps}; nothing written")
    return signed, f"[plan signed anew for this session: {steps} step{'s' if steps != 1 else ''}]\n"


# ---- shared dirs: memory_remember, memory_recall, memory_forget, task_plan, task_complete --------
# The memory ($OLLIE_MEMORY_DIR, m/ on the mount) and the plans ($OLLIE_PLANS_DIR, pl/) are
# directories every session of the user shares; execute_code names them in each stage's
# environment. A name a caller gives is a plain file name in one of them: it never leads out.


def shared_dir(var):
    path = os.environ.get(var, "")
    if not path:
        fail(f"{var} is not set: run this as a tool stage of execute_code, which sets it")
    if not os.path.isabs(path):
        fail(f"{var} must be an absolute path, got {path!r}")
    return path


def plain_name(name, what, var):
    """`name`, checked to be a file directly in $`var` (no /, no .., no NUL, no dotfile)."""
    if not name or "/" in name or "\0" in name or name.startswith("."):
        fail(f"{what} must be a file name in ${var} (no '/', no NUL, not starting with '.'), got {name!r}")
    return name


def slug(text, max_bytes=60):
    """`text` lowercased, each run of other than letters and digits one "-", at most `max_bytes`
    bytes of UTF-8 (so a name stays well under the 255 a file system allows)."""
    out = "".join(c if c.isalnum() else " " for c in text.lower())
    out = "-".join(out.split())
    while len(out.encode()) > max_bytes:
        out = out[:-1]
    return out.strip("-")


def utc_stamp():
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def write_new(directory, name, data):
    """Create directory/name holding `data`, all at once (written to a dotfile, synced, then
    linked to its name): False, and nothing written, when the name is taken."""
    path = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: rename, after a last look
            if os.path.lexists(path):
                return False
            os.rename(tmp, path)
        return True
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def replace_file(path, data):
    """Replace the file at `path` by `data` all at once, keeping its mode."""
    # A fresh name, made here or not at all: another session can write this directory too.
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.urandom(6).hex()}.tmp")
    mode = os.stat(path, follow_symlinks=False).st_mode & 0o666  # data: never executable
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# ---- memory files: memory_recall, memory_forget --------------------------------------------------
# memory_remember writes "# TITLE", "tags: a, b", a blank line and the body. A file edited by hand
# may lack either line: the title then comes from the file name's slug, the tags from its __part.
# memory_recall's index of them is MEMORY_INDEX in their directory (its schema memory_recall's, its
# version in PRAGMA user_version), from which memory_forget takes out what it removes.

MEMORY_INDEX = ".index.sqlite"
MEMORY_INDEX_VERSION = 2  # of the index's schema; memory_recall rebuilds an index of another version


def parse_memory(name, text):
    """(title, tags, body) of the memory file `name` holding `text`."""
    stem = name[:-3] if name.endswith(".md") else name
    rest = stem.split("--", 1)[-1]
    title = rest.split("__", 1)[0].replace("-", " ").strip()
    tags = rest.split("__", 1)[1].replace("-", ", ").replace("_", "-") if "__" in rest else ""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i < len(lines) and lines[i].startswith("# "):
        title = lines[i][2:].strip() or title
        i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
    if i < len(lines) and lines[i].lower().startswith("tags:"):
        tags = lines[i][5:].strip()
        i += 1
    return title, tags, "\n".join(lines[i:]).strip()


def memory_date(name, mtime_ns):
    """When the memory was made, from its name (<YYYYmmddTHHMMSSZ>--…), else its file's mtime."""
    s = name[:16]
    if len(s) == 16 and s[8] == "T" and s[15] == "Z" and (s[:8] + s[9:15]).isdigit():
        return f"{s[:4]}-{s[4:6]}-{s[6:8]} {s[9:11]}:{s[11:13]} UTC"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(mtime_ns // 1_000_000_000))


if __name__ == "__main__":
    NAME = "_toolkit.py"
    fail("a module the tool scripts import, not a tool; t/idx lists the tools", 2)
