"""The default tool scripts (src/ollie/defaults/tools), each driven through execute_code in the real
sandbox, and the listing of tool scripts in execute_code's description."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ollie.plans import files as plan_files
from ollie.tools import CallContext, ToolResult, execute, scripts
from script_helpers import DEFAULTS, TOOLKIT, toolkit

NAMES = ("file_edit", "file_glob", "file_grep", "file_read", "file_write")  # this file's scripts
SHIPPED = sorted(p.name for p in DEFAULTS.iterdir() if p.is_file() and p.name[0] != "." and p != TOOLKIT)
# The scripts that import _toolkit.py, the code they share (the others stand alone).
SHARING = ("file_edit", "file_read", "file_write", "memory_forget", "memory_recall", "memory_remember")
SHARING += ("task_complete", "task_plan")
READ_ONLY = ("file_glob", "file_grep", "file_read")


class Tools:
    """Runs tool scripts as execute_code stages, all in one session (one jail, one $TMPDIR)."""

    def __init__(self, server: execute.Server, ctx: CallContext, cwd: Path):
        self.server, self.ctx, self.cwd = server, ctx, cwd

    async def __call__(self, name: str, *args: str, stdin: str | None = None) -> ToolResult:
        steps = [{"tool": name, "args": list(args)}]
        if stdin is not None:  # a first stage prints it, without a newline of its own
            steps.insert(0, {"code": f"printf %s {_sh_quote(stdin)}"})
        return await self.steps(*steps)

    async def steps(self, *steps: dict) -> ToolResult:
        return await self.server.call_tool("execute_code", {"steps": list(steps)}, self.ctx)

    async def ok(self, name: str, *args: str, stdin: str | None = None) -> str:
        result = await self(name, *args, stdin=stdin)
        assert not result.is_error, result.text()
        return result.text()

    async def fails(self, name: str, *args: str) -> str:
        result = await self(name, *args)
        assert result.is_error, result.text()
        return result.text()


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _tools(cwd: Path, tmpdir: Path, session: str = "s1", **env: str) -> Tools:
    server = execute.factory(str(cwd))()
    ctx = CallContext(
        cwd=str(cwd), session_id=session, tmpdir=str(tmpdir), env={"OLLIE_TOOLS_PATH": str(DEFAULTS), **env}
    )
    return Tools(server, ctx, cwd)


@pytest.fixture
async def tools(ollie_dirs, tmp_path):
    cwd, tmpdir = tmp_path / "cwd", tmp_path / "session-tmp"
    cwd.mkdir()
    tmpdir.mkdir()
    t = _tools(cwd, tmpdir)
    yield t
    await t.server.close()


# ---- the scripts as shipped -------------------------------------------------------------------


def test_each_shipped_script_is_executable_with_a_description_args_and_the_right_marker():
    # memory_recall writes only its index, a cache; reasoning_think only a line of the chat
    read_only = {*READ_ONLY, "memory_recall", "reasoning_think"}
    for name in SHIPPED:
        path = DEFAULTS / name
        assert path.stat().st_mode & 0o777 == 0o755, name
        assert path.read_text().startswith("#!/usr/bin/env python3\n"), name
        fields = scripts.read_header(path)
        assert fields["description"] and fields["args"], name
        assert len(f"{name} {fields['args']} — {fields['description']}") <= scripts.LINE_MAX, name
        assert execute._marked_read_safe(str(path)) == (name in read_only), name


# ---- _toolkit.py: the code the scripts share, beside them ----------------------------------------


def test_the_shared_module_is_no_tool_and_the_scripts_import_it_from_their_own_directory():
    assert TOOLKIT.stat().st_mode & 0o777 == 0o755  # run as a tool, its shebang's python3 runs it
    assert "description" not in scripts.read_header(TOOLKIT)  # so no listing shows it
    idiom = "sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))"
    for name in SHIPPED:
        text = (DEFAULTS / name).read_text()
        if name not in SHARING:
            assert "_toolkit" not in text, name
            continue
        # its own directory first on the path, then the import, and its name for its errors
        assert text.index(idiom) < text.index("\nimport _toolkit\n"), name
        assert f'\n_toolkit.NAME = "{name}"\n' in text, name


async def test_a_toolkit_planted_elsewhere_is_not_the_one_a_shipped_script_runs(ollie_dirs, tmp_path):
    # A project's tools directory earlier on OLLIE_TOOLS_PATH, the cwd and $PYTHONPATH each hold a
    # _toolkit.py; so does a directory whose link to a shipped script is run by name.
    planted = 'import sys\nsys.stdout.write("PLANTED\\n")\nsys.exit(9)\n'
    project, linked = tmp_path / "project-tools", tmp_path / "linked"
    cwd, tmpdir = tmp_path / "cwd", tmp_path / "session-tmp"
    pythonpath = cwd / "lib"  # where the sandbox lets Python read it
    for d in (project, linked, cwd, pythonpath, tmpdir):
        d.mkdir()
    for d in (project, pythonpath, linked, cwd):
        (d / "_toolkit.py").write_text(planted)
    (linked / "read_linked").symlink_to(DEFAULTS / "file_read")
    (cwd / "a.txt").write_text("alpha\n")
    # PYTHONSAFEPATH: Python itself puts no script's directory on sys.path; the script does, first.
    env = {"PYTHONPATH": str(pythonpath), "PYTHONSAFEPATH": "1"}
    t = _tools(cwd, tmpdir, OLLIE_TOOLS_PATH=f"{project}:{linked}:{DEFAULTS}", **env)
    try:
        out = await t.steps({"code": 'echo "$PYTHONPATH"'})
        assert out.text() == f"{pythonpath}\n"  # the stages do get it
        assert await t.ok("file_read", "a.txt") == "     1\talpha\n"
        assert await t.ok("read_linked", "a.txt") == "     1\talpha\n"
        for name in SHARING:  # each one's own usage error, from the shipped fail()
            out = await t.fails(name)
            assert "PLANTED" not in out and f"{name}: usage: {name} " in out, out
        out = await t.steps({"code": f'cd {project} && python3 "{DEFAULTS}/file_write"'})
        assert "PLANTED" not in out.text() and "file_write: usage: file_write " in out.text()
    finally:
        await t.server.close()


async def test_the_shared_module_run_as_a_tool_says_it_is_none(tools):
    out = await tools.fails("_toolkit.py")
    assert "_toolkit.py: a module the tool scripts import, not a tool; t/idx lists the tools" in out
    assert "no tool script '_toolkit'" in await tools.fails("_toolkit")


# ---- file_read --------------------------------------------------------------------------------


async def test_file_read_numbers_lines_like_cat_n(tools):
    (tools.cwd / "a.txt").write_text("alpha\n\tbeta\ngamma")
    assert await tools.ok("file_read", "a.txt") == "     1\talpha\n     2\t\tbeta\n     3\tgamma\n"
    assert await tools.ok("file_read", "a.txt", "2", "1") == "     2\t\tbeta\n[lines 2-2 of 3; read on with OFFSET 3]\n"
    (tools.cwd / "empty").write_text("")
    assert await tools.ok("file_read", "empty") == "[empty is empty]\n"


async def test_file_read_caps_lines_and_their_length_and_says_how_to_read_on(tools):
    (tools.cwd / "big.txt").write_text("".join(f"line {i}\n" for i in range(1, 2501)) + "x" * 2500 + "\n")
    out = await tools.ok("file_read", "big.txt")
    lines = out.splitlines()
    assert len(lines) == 2001 and lines[1999] == "  2000\tline 2000"
    assert lines[2000] == "[lines 1-2000 of 2501; read on with OFFSET 2001]"
    out = await tools.ok("file_read", "big.txt", "2001", "5000")
    lines = out.splitlines()
    assert lines[0] == "  2001\tline 2001" and lines[500] == f"  2501\t{'x' * 2000}… [500 more characters]"
    assert lines[501] == "[lines 2001-2501 of 2501]"
    assert lines[502] == "[LIMIT is at most 2000 lines a call]"
    assert lines[503].startswith("[1 line longer than 2000 characters cut (2501); see line N whole")


async def test_file_read_of_a_slice_of_a_big_file_numbers_its_lines_and_keeps_the_whole_file_hashed(tools):
    # Past 1 MiB the file is hashed (OpenSSL's sha256) and counted a block of 1 MiB at a time, and
    # only the blocks that hold the lines shown are split: a line across two blocks, and one longer
    # than a block, come out whole; file_write still compares the whole file's hash.
    lines = [f"line {i} " + "." * (i % 97) for i in range(1, 40001)]
    lines[20000] = "y" * (3 << 20)  # line 20001: longer than a block
    path = tools.cwd / "big.txt"
    path.write_text("\n".join(lines))  # no newline at the end
    data = path.read_bytes()
    boundary = data[: 1 << 20].count(b"\n") + 1  # the line that crosses the first block's end
    out = await tools.ok("file_read", "big.txt", str(boundary - 1), "3")
    assert out == "".join(f"{n:6}\t{lines[n - 1]}\n" for n in range(boundary - 1, boundary + 2)) + (
        f"[lines {boundary - 1}-{boundary + 1} of 40000; read on with OFFSET {boundary + 2}]\n"
    )
    out = await tools.ok("file_read", "big.txt", "20000", "3")
    assert out.startswith(f" 20000\t{lines[19999]}\n 20001\t{'y' * 2000}… [{(3 << 20) - 2000} more characters]\n")
    assert f" 20002\t{lines[20001]}\n[lines 20000-20002 of 40000;" in out
    assert (await tools.ok("file_read", "big.txt", "39999")).startswith(
        f" 39999\t{lines[39998]}\n 40000\t{lines[39999]}\n"
    )
    stat = path.stat()
    with path.open("r+b") as f:  # a byte changed far from the lines read, the size and mtime kept
        f.seek(len(data) - 10)
        f.write(b"!")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    out = await tools.fails("file_write", "big.txt", "small now\n")
    assert "big.txt changed since it was last read in this session" in out
    await tools.ok("file_read", "big.txt", "1", "1")
    await tools.ok("file_write", "big.txt", "small now\n")
    assert path.read_text() == "small now\n"


async def test_file_read_refuses_binary_files_and_bad_arguments_with_a_reason(tools):
    (tools.cwd / "blob").write_bytes(b"\x7fELF\x00\x01\x02")
    out = await tools.fails("file_read", "blob")
    assert "execution failed: exit status 1" in out
    assert "file_read: blob looks binary (it has NUL bytes; 7 bytes)" in out
    assert "no such file" in await tools.fails("file_read", "missing.txt")
    (tools.cwd / "a.txt").write_text("one\n")
    assert "OFFSET 5 is past the end of a.txt, which has 1 line" in await tools.fails("file_read", "a.txt", "5")
    assert "LIMIT must be a whole number" in await tools.fails("file_read", "a.txt", "1", "ten")
    assert "is a directory" in await tools.fails("file_read", ".")


async def test_read_only_scripts_run_in_parallel_stages_and_calls_of_them_count_as_read_only(tools):
    _files(tools.cwd, "a.txt", "b.txt")
    both = {"parallel": [{"tool": "file_read", "args": [name]} for name in ("a.txt", "b.txt")]}
    result = await tools.steps(both)
    assert result.text() == "     1\ta.txt\n     1\tb.txt\n"
    assert execute.read_safe({"steps": [both, {"tool": "file_glob", "args": ["*"]}]}, tools.ctx)
    assert not execute.read_safe({"steps": [{"tool": "file_write", "args": ["a.txt", "x"]}]}, tools.ctx)
    await tools.ok("file_write", "a.txt", "x")  # both reads were recorded
    await tools.ok("file_edit", "b.txt", "b.txt", "y")


# ---- file_write -------------------------------------------------------------------------------


async def test_file_write_refuses_an_existing_file_not_read_in_this_session(tools):
    (tools.cwd / "notes.txt").write_text("mine\n")
    out = await tools.fails("file_write", "notes.txt", "theirs\n")
    assert "file_write: notes.txt exists and was not read in this session; file_read notes.txt first" in out
    assert (tools.cwd / "notes.txt").read_text() == "mine\n"


async def test_file_write_refuses_a_file_changed_since_it_was_read(tools):
    path = tools.cwd / "notes.txt"
    path.write_text("one\n")
    await tools.ok("file_read", "notes.txt")
    path.write_text("two\n")  # someone else changed it
    out = await tools.fails("file_write", "notes.txt", "three\n")
    assert "notes.txt changed since it was last read in this session; file_read notes.txt again first" in out
    assert path.read_text() == "two\n"
    await tools.ok("file_read", "notes.txt")
    assert await tools.ok("file_write", "notes.txt", "three\n") == (
        "--- notes.txt\n+++ notes.txt\n@@ -1 +1 @@\n-two\n+three\n"
    )


async def test_file_write_goes_by_content_and_a_touch_is_no_change(tools):
    path = tools.cwd / "notes.txt"
    path.write_text("one\n")
    await tools.ok("file_read", "notes.txt")
    os.utime(path, ns=(1, 1))
    assert await tools.ok("file_write", "notes.txt", "one\n") == "notes.txt unchanged: the content was the same\n"


async def test_file_write_creates_a_new_file_and_its_directories_from_an_argument_or_stdin(tools):
    assert await tools.ok("file_write", "new/deep/a.txt", "x\ny\n") == "created new/deep/a.txt (2 lines)\n"
    assert (tools.cwd / "new" / "deep" / "a.txt").read_text() == "x\ny\n"
    assert await tools.ok("file_write", "b.txt", stdin="from\nstdin") == "created b.txt (2 lines)\n"
    assert (tools.cwd / "b.txt").read_text() == "from\nstdin"
    # What it wrote, it knows: writing again needs no read in between.
    out = await tools.ok("file_write", "b.txt", "from\nstdin\n")
    assert out == "--- b.txt\n+++ b.txt\n@@ -1,2 +1,2 @@\n from\n-stdin\n\\ No newline at end of file\n+stdin\n"


async def test_the_record_of_reads_is_the_sessions_own(tools, tmp_path):
    (tools.cwd / "notes.txt").write_text("one\n")
    await tools.ok("file_read", "notes.txt")
    other = _tools(tools.cwd, tmp_path / "other-tmp", session="s2")
    (tmp_path / "other-tmp").mkdir()
    try:
        assert "was not read in this session" in await other.fails("file_write", "notes.txt", "two\n")
    finally:
        await other.server.close()
    await tools.ok("file_write", "notes.txt", "two\n")


# ---- file_edit --------------------------------------------------------------------------------


SOURCE = "def f(x):\n    if x:\n        return 1\n    return 2\n"


@pytest.fixture
async def source(tools):
    (tools.cwd / "f.py").write_text(SOURCE)
    await tools.ok("file_read", "f.py")
    return tools.cwd / "f.py"


async def test_file_edit_replaces_an_exact_match_and_shows_a_diff(tools, source):
    out = await tools.ok("file_edit", "f.py", "return 1", "return 10")
    assert out == (
        "--- f.py\n+++ f.py\n@@ -1,4 +1,4 @@\n"
        " def f(x):\n     if x:\n-        return 1\n+        return 10\n     return 2\n"
    )
    assert source.read_text() == SOURCE.replace("return 1", "return 10")
    # Its own edit keeps the record current: a second edit needs no read.
    await tools.ok("file_edit", "f.py", "return 2", "return 20")


async def test_file_edit_matches_ignoring_indentation_and_reindents_new(tools, source):
    old = "if x:\n    return 1\n"  # the model dropped the function's indentation
    new = "if x > 0:\n    return 1\n# positive\n"
    out = await tools.ok("file_edit", "f.py", old, new)
    assert out.startswith("[matched ignoring whitespace at the ends of lines; NEW re-indented to match]\n")
    assert source.read_text() == "def f(x):\n    if x > 0:\n        return 1\n    # positive\n    return 2\n"


async def test_file_edit_refuses_an_ambiguous_match_unless_all(tools, source):
    out = await tools.fails("file_edit", "f.py", "return", "yield")
    assert "OLD matches 2 times in f.py (lines 3, 4); add surrounding lines" in out
    assert source.read_text() == SOURCE
    out = await tools.ok("file_edit", "f.py", "return", "yield", "--all")
    assert out.startswith("[replaced 2 matches]\n")
    assert source.read_text() == SOURCE.replace("return", "yield")


async def test_file_edit_without_a_match_shows_the_closest_lines(tools, source):
    out = await tools.fails("file_edit", "f.py", "if y:\n    return 1", "if z:\n    return 1")
    assert "file_edit: no match for OLD in f.py, exact or ignoring whitespace" in out
    assert re.search(r"the closest lines \(\d+% alike\):\n     2\t    if x:\n     3\t        return 1\n", out), out
    assert source.read_text() == SOURCE


async def test_file_edit_needs_a_read_first_and_an_unchanged_file(tools):
    path = tools.cwd / "f.py"
    path.write_text(SOURCE)
    assert "file_read f.py first" in await tools.fails("file_edit", "f.py", "return 1", "return 3")
    await tools.ok("file_read", "f.py")
    path.write_text(SOURCE + "# more\n")
    assert "changed since it was last read" in await tools.fails("file_edit", "f.py", "return 1", "return 3")
    assert "create it with file_write" in await tools.fails("file_edit", "nope.py", "a", "b")
    assert path.read_text() == SOURCE + "# more\n"


async def test_file_edit_keeps_crlf_line_ends(tools):
    path = tools.cwd / "dos.txt"
    path.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    await tools.ok("file_read", "dos.txt")
    await tools.ok("file_edit", "dos.txt", "one\ntwo", "uno\ndos")
    assert path.read_bytes() == b"uno\r\ndos\r\nthree\r\n"


# ---- file_edit and file_write on a plan: the session's own plan is signed anew -----------------

PLAN_KEY = "5a" * 32  # the session's key, as its stages get it in $OLLIE_PLAN_KEY
PLAN = "20250101T000000Z_abcdef--ship__wip.md"
PLAN_STEPS = ["- [x] write, then test — both", "- [ ] release (after: write, then test)"]


def signed_plan(steps: list[str], deps: str, sid: str = "s1", key: str = PLAN_KEY) -> str:
    """A plan as task_plan writes it for session `sid`."""
    unchecked = ["- [ ] " + line[6:] for line in steps]
    mac = plan_files.signature(bytes.fromhex(key), PLAN.split("__")[0], sid, deps, "# ship", unchecked)
    return f"# ship\n<!-- ollie-plan v1 session={sid} deps={deps} mac={mac} -->\n\n" + "".join(f"{s}\n" for s in steps)


def taken(text: str) -> list[tuple[str, tuple[int, ...], bool]] | None:
    """The steps of `text` as session s1 takes them (ollie.plans.files' checks), or None: not its plan."""
    signed = plan_files.read_signed(text)
    if signed is None or signed.sid != "s1":
        return None
    stem = PLAN.split("__")[0]
    mac = plan_files.signature(bytes.fromhex(PLAN_KEY), stem, "s1", signed.deps, signed.goal_line, signed.step_lines)
    if mac != signed.mac:
        return None
    return [(s.title, s.after, s.checked) for s in plan_files.steps_of(signed)[1]]


@pytest.fixture
async def planner(ollie_dirs, tmp_path):
    """Tool stages of session s1, which holds its plan key."""
    cwd, tmpdir = tmp_path / "cwd", tmp_path / "session-tmp"
    cwd.mkdir()
    tmpdir.mkdir()
    t = _tools(cwd, tmpdir, OLLIE_PLAN_KEY=PLAN_KEY)
    yield t
    await t.server.close()


async def test_file_edit_signs_a_revision_of_the_sessions_own_plan_anew(planner):
    path = planner.cwd / PLAN
    path.write_text(signed_plan(PLAN_STEPS, ";0"))
    assert taken(path.read_text()) == [("write, then test", (), True), ("release", (0,), False)]
    await planner.ok("file_read", PLAN)
    # a step added, after two others: named in another case, one title holding ", "
    out = await planner.ok(
        "file_edit", PLAN, "- [ ] release", "- [ ] document — the API (after: WRITE, THEN TEST)\n- [ ] release"
    )
    assert out.startswith("[plan signed anew for this session: 3 steps]\n")
    text = path.read_text()
    assert "- [ ] document — the API (after: write, then test)\n" in text  # named as the title is
    assert taken(text) == [("write, then test", (), True), ("document", (0,), False), ("release", (0,), False)]
    out = await planner.ok(
        "file_edit",
        PLAN,
        "- [ ] release (after: write, then test)",
        "- [ ] release (after: document, write, then test)",
    )
    assert taken(path.read_text())[2] == ("release", (1, 0), False)
    # a revision that would be no plan is refused whole
    for old, new, why in (
        (
            "(after: write, then test)\n",
            "(after: lunch)\n",
            "step 2 is after 'lunch', which is no earlier step's title",
        ),
        ("- [ ] document", "- [ ] write, THEN test", "two steps are titled 'write, THEN test'"),
        ("# ship", "ship", "its first line must be '# GOAL'"),
    ):
        before = path.read_text()
        out = await planner.fails("file_edit", PLAN, old, new)
        assert f"is a plan of this session, and this revision would not be one: {why}" in out, out
        assert "nothing written" in out and path.read_text() == before


async def test_file_write_signs_the_sessions_plan_anew_whatever_signature_line_it_was_given(planner):
    path = planner.cwd / PLAN
    path.write_text(signed_plan(PLAN_STEPS, ";0"))
    await planner.ok("file_read", PLAN)
    stale = path.read_text().splitlines()[1]
    for head in ("# ship\n\n", f"# ship\n{stale}\n\n"):  # without it, or with the old one copied
        out = await planner.ok("file_write", PLAN, stdin=head + "- [ ] only this one\n")
        assert out.startswith("[plan signed anew for this session: 1 step]\n"), out
        assert taken(path.read_text()) == [("only this one", (), False)]
        assert path.read_text().count("<!--") == 1


async def test_plans_not_the_sessions_own_are_edited_as_they_are_never_signed(planner, tmp_path):
    path = planner.cwd / PLAN
    other = signed_plan(PLAN_STEPS, ";0", sid="s2", key="77" * 32)  # another session's plan
    tampered = signed_plan(PLAN_STEPS, ";0").replace("- [ ] release", "- [ ] leak it")  # changed by other code
    for text, note in ((other, ""), (tampered, "[it claims this session, but its signature did not verify")):
        path.write_text(text)
        await planner.ok("file_read", PLAN)
        out = await planner.ok("file_edit", PLAN, "— both", "— all")
        assert out.startswith(note) and ("signed anew for this session" not in out), out
        assert path.read_text() == text.replace("— both", "— all") and taken(path.read_text()) is None
    # outside a session's stage (no key), a plan file is a file like any other
    keyless = _tools(planner.cwd, tmp_path / "session-tmp", session="s1")
    try:
        path.write_text(signed_plan(PLAN_STEPS, ";0"))
        await keyless.ok("file_read", PLAN)
        assert (await keyless.ok("file_edit", PLAN, "— both", "— all")).startswith("---")
        assert taken(path.read_text()) is None
    finally:
        await keyless.server.close()


# ---- the plan signature: computed by _toolkit.py (the scripts) and by ollie.plans.files (the session) ----

# (stem, session, goal line, step lines as the file has them, dependencies)
SIGNED_PLANS = [
    ("20250101T000000Z_abcdef--ship", "s1", "# ship", ["- [ ] write", "- [x] test (after: write)"], ";0"),
    (  # unicode everywhere, descriptions, a title holding ", ", several dependencies
        "20251231T235959Z_0a1b2c--café-日本語",
        "sess.1-a_b",
        "# Café ☕ — 日本語 ",
        [
            "- [ ] naïve, first — ünïcödé 🎉",
            "- [X] Ωmega",
            "- [ ] last — zero\u200bwidth (after: naïve, first, Ωmega)",
        ],
        ";;0,1",
    ),
    ("20250101T000000Z_abcdef--x", "s", "# a byte not UTF-8: \udcff", ["- [ ] \udcfe step"], ""),
    ("20250101T000000Z_ffffff--", "s", "# no steps", [], ""),  # no plan to take, but signed the same
    ("20250101T000000Z_abcdef--e", "s", "# empty titles", ["- [ ] ", "- [ ]  — only a description"], ";"),
]


def test_the_scripts_and_the_session_compute_the_same_plan_signatures(monkeypatch):
    import random

    tk = toolkit()
    # What both know of a plan is the same: its bounds, its file name, its signature line, its steps.
    assert (tk.PLAN_MAX_STEPS, tk.PLAN_MAX_TITLE, tk.PLAN_MAX_DESCRIPTION, tk.PLAN_MAX_GOAL) == (
        plan_files.MAX_STEPS,
        plan_files.MAX_TITLE,
        plan_files.MAX_DESCRIPTION,
        plan_files.MAX_GOAL,
    )
    assert (tk.PLAN_NAME, tk.PLAN_SIGNATURE) == (plan_files.NAME.pattern, plan_files.SIGNATURE.pattern)
    for line in ("- [ ] a", "- [x] a", "- [X] a", "- [y] a", "-  [ ] a", " - [ ] a", "- [ ]a", "- [", ""):
        assert tk.plan_step(line) == bool(plan_files.STEP.match(line)), line
    key = bytes(range(32))
    for stem, sid, goal, steps, deps in SIGNED_PLANS:
        unchecked = ["- [ ] " + line[6:] for line in steps]
        mac = plan_files.signature(key, stem, sid, deps, goal, unchecked)
        assert tk.plan_mac(key, stem, sid, deps, goal, unchecked) == mac, stem
        head = plan_files.SIGNATURE.fullmatch(tk.plan_signature(key, stem, sid, deps, goal, unchecked))
        assert head is not None and (head["sid"], head["deps"], head["mac"]) == (sid, deps, mac)
    rng = random.Random(30)
    alphabet = "aZ09 -_,;()—é日🎉\udcff\n\t[]x"
    for _ in range(300):
        words = ["".join(rng.choices(alphabet, k=rng.randrange(12))) for _ in range(rng.randrange(8))]
        stem, sid, deps, goal, *steps = [*words, "", "", "", ""]
        k = rng.randbytes(32)
        assert tk.plan_mac(k, stem, sid, deps, goal, steps) == plan_files.signature(k, stem, sid, deps, goal, steps)


def test_a_plan_the_scripts_sign_anew_is_one_the_session_takes(monkeypatch):
    tk = toolkit()
    key = bytes(range(32))
    for stem, sid, goal, steps, deps in SIGNED_PLANS:
        monkeypatch.setenv("OLLIE_PLAN_KEY", key.hex())
        monkeypatch.setenv("OLLIE_SESSION_ID", sid)
        unchecked = ["- [ ] " + line[6:] for line in steps]
        mac = plan_files.signature(key, stem, sid, deps, goal, unchecked)
        text = "\n".join([goal, f"<!-- ollie-plan v1 session={sid} deps={deps} mac={mac} -->", "", *steps, ""])
        # the scripts verify what the session's key signed ...
        assert tk.plan_signer(f"/pl/{stem}__wip.md", text.encode("utf-8", "surrogateescape")) == (key, stem, sid)
        signed = plan_files.read_signed(text)
        assert signed is not None and signed.mac == mac
        try:
            before = plan_files.steps_of(signed)
        except ValueError:  # not a plan the session takes (no steps, empty titles): nor do the scripts
            assert tk.plan_signed((key, stem, sid), text)[0] is None, stem
            continue
        # ... and the session takes what the scripts sign anew, with the same goal and steps
        again, count = tk.plan_signed((key, stem, sid), text)
        assert count == len(steps), (stem, again, count)
        resigned = plan_files.read_signed(again)
        assert resigned is not None and resigned.sid == sid
        mac = plan_files.signature(key, stem, sid, resigned.deps, resigned.goal_line, resigned.step_lines)
        assert mac == resigned.mac and resigned.deps == deps, stem
        assert plan_files.steps_of(resigned) == before, stem


# ---- file_glob --------------------------------------------------------------------------------


def _files(root: Path, *names: str) -> None:
    for age, name in enumerate(names):  # the first named is the newest
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
        os.utime(path, (1_700_000_000 - age, 1_700_000_000 - age))


async def test_file_glob_matches_at_any_depth_newest_first(tools):
    _files(tools.cwd, "src/b.py", "a.py", "src/deep/c.py", "src/notes.md", "README.md")
    assert await tools.ok("file_glob", "**/*.py") == "src/b.py\na.py\nsrc/deep/c.py\n"
    assert await tools.ok("file_glob", "*.py") == "a.py\n"
    assert await tools.ok("file_glob", "*.py", "src") == "src/b.py\n"
    assert await tools.ok("file_glob", "src/**/*.{py,md}") == "src/b.py\nsrc/deep/c.py\nsrc/notes.md\n"
    assert await tools.ok("file_glob", "c.py") == "no files match c.py in .; at any depth, **/c.py matches\n"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
async def test_file_glob_respects_gitignore_in_a_git_tree_only(tools):
    _files(tools.cwd, "kept.txt", "ignored.txt", "build/out.txt", "sub/tracked.txt")
    assert await tools.ok("file_glob", "**/*.txt") == "kept.txt\nignored.txt\nbuild/out.txt\nsub/tracked.txt\n"
    subprocess.run(["git", "init", "-q", str(tools.cwd)], check=True)
    (tools.cwd / ".gitignore").write_text("ignored.txt\nbuild/\n")
    subprocess.run(["git", "-C", str(tools.cwd), "add", "sub/tracked.txt"], check=True)
    assert await tools.ok("file_glob", "**/*.txt") == "kept.txt\nsub/tracked.txt\n"
    assert await tools.ok("file_glob", "*.txt", "sub") == "sub/tracked.txt\n"


async def test_file_glob_output_is_bounded(tools):
    _files(tools.cwd, *(f"f{i:03}.log" for i in range(130)))
    lines = (await tools.ok("file_glob", "*.log")).splitlines()
    assert len(lines) == 101 and lines[0] == "f000.log" and lines[99] == "f099.log"
    assert lines[100] == "… and 30 more (130 files, newest first; narrow PATTERN or DIR)"


# ---- file_grep --------------------------------------------------------------------------------


async def test_file_grep_lists_path_line_and_text(tools):
    _files(tools.cwd, "src/a.py", "src/b.py")
    (tools.cwd / "src" / "a.py").write_text("import os\nTODO: one\n")
    (tools.cwd / "src" / "b.py").write_text("x = 1\n# todo: two\n")
    assert await tools.ok("file_grep", "TODO") == "src/a.py:2:TODO: one\n"
    assert await tools.ok("file_grep", "todo", "src", "-i") == "src/a.py:2:TODO: one\nsrc/b.py:2:# todo: two\n"
    assert await tools.ok("file_grep", "nothing here") == "no matches for nothing here in the working directory\n"
    assert "file_grep: rg: regex parse error" in await tools.fails("file_grep", "(")


async def test_file_grep_output_is_bounded(tools):
    (tools.cwd / "many.txt").write_text("hit\n" * 250)
    lines = (await tools.ok("file_grep", "hit")).splitlines()
    assert len(lines) == 201 and lines[199] == "many.txt:200:hit"
    assert lines[200].startswith("… 50 more lines: narrow the search")


async def test_file_grep_without_ripgrep_says_so(tools, tmp_path):
    bin_dir = tmp_path / "bin"  # python3 and nothing else, granted to the sandbox as a tools directory
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath("/usr/bin/python3"))
    no_rg = _tools(tools.cwd, tmp_path / "session-tmp", OLLIE_TOOLS_PATH=f"{DEFAULTS}:{bin_dir}", PATH=str(bin_dir))
    try:
        out = await no_rg.fails("file_grep", "x")
    finally:
        await no_rg.server.close()
    assert "execution failed: exit status 127" in out
    assert "file_grep: ripgrep (rg) is not installed" in out


# ---- what the model is told ---------------------------------------------------------------------


async def test_execute_codes_description_lists_the_scripts_from_their_headers(ollie_dirs, monkeypatch):
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(DEFAULTS))
    server = execute.factory("")()
    [tool] = await server.list_tools()
    await server.close()
    assert tool.description.startswith(execute.DESCRIPTION + "\n" + execute.SCRIPTS_HEADING + "\n")
    listing = tool.description.split(execute.SCRIPTS_HEADING + "\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listing] == SHIPPED and set(NAMES) <= set(SHIPPED)
    read = scripts.read_header(DEFAULTS / "file_read")
    assert f"file_read {read['args']} — {read['description']}" in listing
    assert len("\n".join(listing)) <= scripts.SUMMARY_MAX
    # t/idx lists the same scripts from the same headers.
    assert re.findall(r"^## (\S+)", scripts.index_text([DEFAULTS]), re.M) == SHIPPED


async def test_the_listing_is_capped_and_points_at_t_idx(ollie_dirs, tmp_path, monkeypatch):
    many = tmp_path / "many"
    many.mkdir()
    for i in range(40):
        (many / f"tool_{i:02}").write_text(f"#!/bin/sh\n# description: {'does a great many things ' * 3}\n# args: X\n")
    monkeypatch.setenv("OLLIE_TOOLS_PATH", f"{DEFAULTS}:{many}")
    server = execute.factory("")()
    [tool] = await server.list_tools()
    await server.close()
    listing = tool.description.split(execute.SCRIPTS_HEADING + "\n", 1)[1]
    lines = listing.splitlines()
    assert len(listing) <= scripts.SUMMARY_MAX
    shown = len(lines) - 1
    total = 40 + len(SHIPPED)
    assert lines[-1] == f"… and {total - shown} more (see t/idx)"
    assert lines[0].startswith("file_edit ") and 10 < shown < total


async def test_without_scripts_the_description_is_the_plain_one(ollie_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(tmp_path / "none"))
    server = execute.factory("")()
    [tool] = await server.list_tools()
    await server.close()
    assert tool.description == execute.DESCRIPTION


# ---- an agent's turn ----------------------------------------------------------------------------


async def test_a_scripted_agent_reads_edits_and_greps_a_file_through_tool_stages(
    cores, ollie_dirs, tmp_path, monkeypatch
):
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(DEFAULTS))
    work = tmp_path / "project"
    work.mkdir()
    (work / "app.py").write_text("def greet():\n    return 'hi'\n")
    monkeypatch.chdir(work)

    def call(name: str, *args: str) -> dict:
        return {"name": "execute_code", "arguments": {"steps": [{"tool": name, "args": list(args)}]}}

    script = [
        {"tool_calls": [call("file_read", "app.py")]},
        {"tool_calls": [call("file_edit", "app.py", "'hi'", "'hello'")], "expect": "     2\t    return 'hi'"},
        {"tool_calls": [call("file_grep", "hello")], "expect": "+    return 'hello'"},
        {"text": "Changed the greeting.", "expect": "app.py:2:    return 'hello'"},
    ]
    core, backend, _, events = await cores.open(script, extra_servers={"execute": execute.factory(str(work))})
    await core.submit("say hello instead of hi")
    backend.assert_consumed()
    assert not [e for e in events if e.kind == "error"], [e.text for e in events if e.kind == "error"]
    assert core.reply == "Changed the greeting."
    assert (work / "app.py").read_text() == "def greet():\n    return 'hello'\n"


def test_t_idx_lists_every_tools_directory_the_first_one_winning(tmp_path):
    from ollie.tools.scripts import index_text

    for d, name, what in (("a", "x", "x from a"), ("b", "x", "x from b"), ("b", "y", "y from b")):
        (tmp_path / d).mkdir(exist_ok=True)
        (tmp_path / d / name).write_text(f"#!/bin/sh\n# description: {what}\n# args: ARG\n")
    index = index_text([tmp_path / "a", tmp_path / "b"])
    assert index == "## x\ndescription: x from a\nargs: ARG\n\n## y\ndescription: y from b\nargs: ARG\n\n"
