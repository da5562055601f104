"""The memory and plan tool scripts (memory_remember, memory_recall, memory_forget, task_plan,
task_complete), each driven through execute_code in the real sandbox, against the directories
execute_code names in every stage's environment ($OLLIE_MEMORY_DIR, $OLLIE_PLANS_DIR)."""

from __future__ import annotations

import errno
import importlib.machinery
import json
import re
import sqlite3
import types
from pathlib import Path

import pytest

from ollie.tools import CallContext, ToolResult, execute
from script_helpers import DEFAULTS

STAMP = r"\d{8}T\d{6}Z"


class Tools:
    """Tool scripts run as execute_code stages of one session, and the shared directories."""

    def __init__(self, server: execute.Server, ctx: CallContext, cwd: Path, data: Path):
        self.server, self.ctx, self.cwd = server, ctx, cwd
        self.memory, self.plans = data / "memory", data / "plans"

    async def steps(self, *steps: dict) -> ToolResult:
        return await self.server.call_tool("execute_code", {"steps": list(steps)}, self.ctx)

    async def run(self, name: str, *args: str, stdin: str | None = None) -> ToolResult:
        steps: list[dict] = [{"tool": name, "args": list(args)}]
        if stdin is not None:
            steps.insert(0, {"code": "printf %s " + _sh_quote(stdin)})
        return await self.steps(*steps)

    async def ok(self, name: str, *args: str, stdin: str | None = None) -> str:
        result = await self.run(name, *args, stdin=stdin)
        assert not result.is_error, result.text()
        return result.text()

    async def fails(self, name: str, *args: str) -> str:
        result = await self.run(name, *args)
        assert result.is_error, result.text()
        return result.text()

    async def remember(self, title: str, tags: str, body: str) -> str:
        return (await self.ok("memory_remember", title, tags, body)).strip()

    async def recalled_ids(self, query: str, limit: str = "5") -> list[str]:
        return re.findall(r"^## (\S+)$", await self.ok("memory_recall", query, limit), re.M)


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@pytest.fixture
async def tools(ollie_dirs, tmp_path):
    cwd, tmpdir = tmp_path / "cwd", tmp_path / "session-tmp"
    cwd.mkdir()
    tmpdir.mkdir()
    # No OLLIE_MEMORY_DIR or OLLIE_PLANS_DIR here: execute_code sets them, to the user's own.
    ctx = CallContext(cwd=str(cwd), session_id="s1", tmpdir=str(tmpdir), env={"OLLIE_TOOLS_PATH": str(DEFAULTS)})
    t = Tools(execute.factory(str(cwd))(), ctx, cwd, ollie_dirs / "data")
    yield t
    await t.server.close()


def _index(memory: Path) -> sqlite3.Connection:
    return sqlite3.connect(memory / ".index.sqlite")


def _index_is_sound(memory: Path, complete: bool = True) -> None:
    """The index is a sound SQLite and FTS5 database and, `complete`, holds every memory file (a
    recall brings it in step: after one that ran while a remember did, it may lack that memory)."""
    con = _index(memory)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        con.execute("INSERT INTO mem(mem) VALUES('integrity-check')")  # FTS5's own check: raises if not
        names = {n for (n,) in con.execute("SELECT name FROM files")}
        files = {p.name for p in memory.glob("*.md") if not p.is_symlink()}
        assert names == files if complete else names <= files
    finally:
        con.close()


# ---- the scripts as shipped -------------------------------------------------------------------


async def test_stages_find_the_users_memory_and_plans_without_being_told(tools, ollie_dirs):
    out = await tools.steps({"code": 'printf "%s\\n%s\\n" "$OLLIE_MEMORY_DIR" "$OLLIE_PLANS_DIR"'})
    assert out.text() == f"{ollie_dirs / 'data' / 'memory'}\n{ollie_dirs / 'data' / 'plans'}\n"
    memory_id = await tools.remember("Where things are", "setup", "The memory is a directory.")
    assert (tools.memory / f"{memory_id}.md").is_file()
    plan = (await tools.ok("task_plan", "Find the plans", '["look"]')).splitlines()[0]
    assert (tools.plans / plan).is_file()


async def test_without_the_directory_in_the_environment_each_script_says_why(tools):
    for name, var, args in (
        ("memory_remember", "OLLIE_MEMORY_DIR", "t x body"),
        ("memory_recall", "OLLIE_MEMORY_DIR", "x"),
        ("memory_forget", "OLLIE_MEMORY_DIR", "x"),
        ("task_plan", "OLLIE_PLANS_DIR", "goal '[\"a\"]'"),
        ("task_complete", "OLLIE_PLANS_DIR", "plan a"),
    ):
        result = await tools.steps({"code": f'env -u {var} "$OLLIE_TOOLS_PATH/{name}" {args}'})
        assert result.is_error, result.text()
        assert f"{name}: {var} is not set: run this as a tool stage of execute_code, which sets it" in result.text()


# ---- memory_remember --------------------------------------------------------------------------


async def test_remember_writes_a_markdown_file_named_by_time_title_and_tags(tools):
    memory_id = await tools.remember("Use uv, not pip!", "python, Tooling  setup", "Installs go through uv.\n")
    assert re.fullmatch(rf"{STAMP}--use-uv-not-pip__python-tooling-setup", memory_id), memory_id
    path = tools.memory / f"{memory_id}.md"
    assert path.read_text() == "# Use uv, not pip!\ntags: python, tooling, setup\n\nInstalls go through uv.\n"
    assert not [p for p in tools.memory.iterdir() if p.name.endswith(".tmp")]  # the temporary file is gone


async def test_remember_takes_the_body_from_stdin_and_never_overwrites(tools):
    first = (await tools.ok("memory_remember", "Same title", "", stdin="from stdin")).strip()
    second = (await tools.ok("memory_remember", "Same title", "", "-", stdin="again")).strip()
    assert re.fullmatch(rf"{STAMP}--same-title", first)
    # the same name when made within the same second: then -2, never the first one overwritten
    assert second == first + "-2" if second[:16] == first[:16] else re.fullmatch(rf"{STAMP}--same-title", second)
    assert (tools.memory / f"{first}.md").read_text() == "# Same title\ntags: \n\nfrom stdin\n"
    assert (tools.memory / f"{second}.md").read_text().endswith("\nagain\n")


async def test_remember_refuses_an_empty_title_or_body(tools):
    assert "memory_remember: TITLE is empty" in await tools.fails("memory_remember", "  ", "t", "body")
    assert "memory_remember: BODY is empty" in await tools.fails("memory_remember", "title", "t", " \n")
    assert "usage: memory_remember TITLE TAGS [BODY]" in await tools.fails("memory_remember", "title")


# ---- memory_recall ----------------------------------------------------------------------------


async def test_recall_ranks_a_title_match_above_a_body_only_match(tools):
    body_only = await tools.remember("Notes on packaging", "python", "Remember the sandbox policy when installing.")
    in_title = await tools.remember("Sandbox policy", "config", "It lives in sandbox.yaml next to the agents.")
    unrelated = await tools.remember("Lunch", "misc", "Soup on Tuesdays.")
    out = await tools.ok("memory_recall", "sandbox policy")
    assert out.startswith("[2 memories of 3 match 'sandbox policy', best first]\n")
    assert await tools.recalled_ids("sandbox policy") == [in_title, body_only]
    assert f"## {in_title}\ntitle: Sandbox policy\ntags: config\ndate: " in out
    assert out.endswith(
        f"\ntags: python\ndate: {out.rsplit('date: ', 1)[1].split(chr(10))[0]}\n"
        "Remember the sandbox policy when installing.\n"
    )
    assert unrelated not in out
    # Words are stemmed: "policies" finds "policy"; a word* is a prefix.
    assert await tools.recalled_ids("policies") == [in_title, body_only]
    assert await tools.recalled_ids("sandb*") == [in_title, body_only]


async def test_recall_searches_tags_and_puts_memories_with_every_word_first(tools):
    tagged = await tools.remember("Deploy steps", "release, ops", "Run the pipeline.")
    plain = await tools.remember("Release notes", "docs", "Written by hand.")
    assert await tools.recalled_ids("ops") == [tagged]
    assert await tools.recalled_ids("release") == [plain, tagged]  # a title weighs more than tags
    out = await tools.ok("memory_recall", "release pipeline hand")
    assert out.startswith("[no memory of 2 holds every word of 'release pipeline hand'; 2 hold some, best first]")
    out = await tools.ok("memory_recall", "release pipeline")
    assert out.startswith("[2 memories of 2 match 'release pipeline', best first: the first 1 hold every word")
    assert re.findall(r"^## (\S+)$", out, re.M) == [tagged, plain]


async def test_recall_takes_query_syntax_as_words(tools):
    memory_id = await tools.remember("Near misses", "and, or", 'Quote "this" (and that) - or NOT; col:umn ^x')
    for query in ('"', '"unbalanced', "NEAR(a b", "a AND OR NOT", "title:near", "-misses", "^near", "*", "(", "'"):
        result = await tools.run("memory_recall", query)
        assert not result.is_error, (query, result.text())
    assert await tools.recalled_ids("NOT") == [memory_id]  # an FTS keyword is a word like any other
    assert await tools.recalled_ids('"this"') == [memory_id]
    assert await tools.recalled_ids("col:umn") == [memory_id]
    assert await tools.recalled_ids("near(misses") == [memory_id]
    assert (await tools.ok("memory_recall", "((")).startswith("no memory matches '((': it has no words")
    assert (await tools.ok("memory_recall", "absent")).startswith("no memory of 1 matches 'absent'")


async def test_recall_limits_results_and_cuts_long_bodies(tools):
    ids = [await tools.remember(f"Note {i}", "bulk", f"common word number {i}") for i in range(7)]
    assert len(await tools.recalled_ids("common")) == 5
    assert len(await tools.recalled_ids("common", "2")) == 2
    assert len(await tools.recalled_ids("common", "100")) == 7
    assert "[LIMIT is at most 50]" in await tools.ok("memory_recall", "common", "100")
    assert "LIMIT must be a whole number" in await tools.fails("memory_recall", "common", "many")
    newest = await tools.ok("memory_recall", "", "3")
    assert newest.startswith("[the 3 newest of 7 memories]")
    assert re.findall(r"^## (\S+)$", newest, re.M) == sorted(ids, reverse=True)[:3]
    long_id = await tools.remember("Long one", "bulk", "word " * 1000)
    out = await tools.ok("memory_recall", "long one", "1")
    assert f"…\n[body cut: 3500 more characters; file_read {tools.memory / long_id}.md]\n" in out


async def test_recall_follows_the_files_edited_added_and_removed(tools):
    kept = await tools.remember("Editor choice", "tools", "The user prefers vim.")
    gone = await tools.remember("Old fact", "tools", "Deprecated knowledge.")
    assert sorted(await tools.recalled_ids("tools")) == [kept, gone]
    # Edited in place, the same size and at once (within the file system's mtime tick): still seen.
    path = tools.memory / f"{kept}.md"
    path.write_text(path.read_text().replace("vim.", "ed. "))
    assert "The user prefers ed." in await tools.ok("memory_recall", "editor")
    assert await tools.recalled_ids("vim") == []
    (tools.memory / f"{gone}.md").unlink()
    assert await tools.recalled_ids("tools") == [kept]
    # A file written by hand, without the title and tags lines, is a memory too.
    (tools.memory / "20240101T000000Z--hand-written__misc.md").write_text("Kettle descaling every month.\n")
    out = await tools.ok("memory_recall", "kettle")
    assert (
        "## 20240101T000000Z--hand-written__misc\ntitle: hand written\ntags: misc\ndate: 2024-01-01 00:00 UTC\n" in out
    )
    (tools.memory / "notes.txt").write_text("kettle")  # not *.md: not a memory
    (tools.memory / "link.md").symlink_to(tools.memory / f"{kept}.md")  # a symlink is never followed
    assert sorted(await tools.recalled_ids("kettle editor")) == ["20240101T000000Z--hand-written__misc", kept]
    _index_is_sound(tools.memory)


async def _in_step(tools: Tools) -> None:
    """Recalls until the index is in step and stays so (the first calls make the index and its
    journal, which changes the directory once more)."""
    for _ in range(3):
        await tools.ok("memory_recall", "anything")


async def test_a_recall_sees_edits_in_place_additions_and_removals_made_since_the_last(tools):
    # A warm recall skips listing the directory, whose ctime moves only when a name in it does:
    # an edit in place shows in the file's ctime alone, and must be seen too.
    editor = await tools.remember("Editor choice", "tools", "The user prefers vim.")
    lunch = await tools.remember("Lunch", "misc", "Soup on Tuesdays.")
    await _in_step(tools)
    dir_ctime = tools.memory.stat().st_ctime_ns
    out = await tools.steps({"code": f'echo "Kettles too." >> "$OLLIE_MEMORY_DIR/{lunch}.md"'})
    assert not out.is_error, out.text()
    assert tools.memory.stat().st_ctime_ns == dir_ctime  # the directory did not change
    out = await tools.ok("memory_recall", "kettles")
    assert (
        out.startswith("[1 memory of 2 matches 'kettles', best first]") and "Soup on Tuesdays.\nKettles too.\n" in out
    )
    path = tools.memory / f"{editor}.md"
    with path.open("r+") as f:  # the same size, in place, as an editor writing in place does
        f.seek(path.read_text().index("vim."))
        f.write("ed. ")
    assert "The user prefers ed." in await tools.ok("memory_recall", "editor")
    assert await tools.recalled_ids("vim") == []
    await _in_step(tools)
    added = "20240101T000000Z--zebra__animals"
    out = await tools.steps(
        {"code": f'printf "# Zebra\\ntags: animals\\n\\nStripes.\\n" > "$OLLIE_MEMORY_DIR/{added}.md"'}
    )
    assert not out.is_error, out.text()
    out = await tools.ok("memory_recall", "stripes")
    assert out.startswith("[1 memory of 3 matches 'stripes', best first]") and f"## {added}\n" in out
    await _in_step(tools)
    assert not (await tools.steps({"code": f'rm "$OLLIE_MEMORY_DIR/{lunch}.md"'})).is_error
    assert (await tools.ok("memory_recall", "kettles")).startswith("no memory of 2 matches 'kettles'")
    _index_is_sound(tools.memory)


async def test_a_recall_that_finds_nothing_changed_changes_nothing(tools):
    # What lets a warm recall skip the listing: neither the directory nor the index is written,
    # so the next recall finds the directory as this one left it.
    await tools.remember("Steady", "state", "Nothing moves.")
    await _in_step(tools)
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_ctime_ns) for p in [tools.memory, *tools.memory.iterdir()]}
    assert await tools.recalled_ids("steady") != []
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_ctime_ns) for p in [tools.memory, *tools.memory.iterdir()]}
    assert after == before


def _recall_script(monkeypatch, memory: Path):
    """memory_recall loaded as a module, run in this process on `memory`."""
    loader = importlib.machinery.SourceFileLoader("memory_recall_under_test", str(DEFAULTS / "memory_recall"))
    module = types.ModuleType(loader.name)
    module.__file__ = loader.path
    loader.exec_module(module)
    monkeypatch.setenv("OLLIE_MEMORY_DIR", str(memory))
    return module


def test_a_time_no_older_than_the_file_systems_clock_is_not_trusted(tmp_path, monkeypatch):
    # A file changed in the clock's current tick may change again in that tick, after it was read,
    # and keep its ctime: it is read again by the next call. So is the directory listed again.
    memory = tmp_path / "memory"
    memory.mkdir()
    name = "20240101T000000Z--tick__clock.md"
    (memory / name).write_text("# Tick\ntags: clock\n\nThe first version.\n")
    script = _recall_script(monkeypatch, memory)
    fs_now, index_file, read = script.fs_now, script.index_file, []
    monkeypatch.setattr(
        script, "index_file", lambda con, fd, name, now: read.append(name) or index_file(con, fd, name, now)
    )

    def recall(query: str) -> list[str]:
        return [row[0] for row in script.recall(str(memory), query, 5)[0]]

    def meta() -> tuple:
        con = _index(memory)
        try:
            return con.execute("SELECT value FROM meta WHERE key='dir'").fetchone()[0], script.stored(con)[2].tolist()
        finally:
            con.close()

    monkeypatch.setattr(script, "fs_now", lambda path: (memory / name).stat().st_ctime_ns)  # still that tick
    assert recall("version") == [name] and read == [name.encode()]
    assert meta() == ("", [-1])
    monkeypatch.setattr(script, "fs_now", fs_now)
    read.clear()
    assert recall("version") == [name] and read == [name.encode()]  # read again
    dir_stamp, ctimes = meta()
    assert dir_stamp and ctimes == [(memory / name).stat().st_ctime_ns]
    read.clear()
    assert recall("version") == [name] and read == []  # and then trusted


async def test_an_index_of_another_version_is_made_again_from_the_files(tools):
    memory_id = await tools.remember("Versioned", "upgrade", "Survives an old index.")
    for suffix in ("", "-wal", "-shm", "-journal"):
        (tools.memory / f".index.sqlite{suffix}").unlink(missing_ok=True)
    con = _index(tools.memory)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value)")
    con.execute("INSERT INTO meta VALUES('scan', 'stale')")
    con.execute("PRAGMA user_version=1")
    con.close()
    assert await tools.recalled_ids("versioned") == [memory_id]
    con = _index(tools.memory)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 2
        assert con.execute("PRAGMA journal_mode").fetchone()[0] != "wal"
    finally:
        con.close()
    _index_is_sound(tools.memory)


async def test_a_corrupt_index_is_rebuilt_from_the_files(tools):
    memory_id = await tools.remember("Survivor", "resilience", "Outlives its index.")
    assert await tools.recalled_ids("survivor") == [memory_id]
    index = tools.memory / ".index.sqlite"
    for suffix in ("-wal", "-shm"):
        (tools.memory / f".index.sqlite{suffix}").unlink(missing_ok=True)
    index.write_bytes(b"this is not a database" * 100)
    assert await tools.recalled_ids("survivor") == [memory_id]
    _index_is_sound(tools.memory)
    # Damaged pages past the header: SQLite finds them as it reads them.
    data = bytearray(index.read_bytes())
    data[4096:] = b"\xff" * (len(data) - 4096)
    index.write_bytes(bytes(data))
    assert await tools.recalled_ids("survivor") == [memory_id]
    _index_is_sound(tools.memory)


async def test_links_another_session_left_for_the_index_are_removed_not_followed(tools, tmp_path):
    # Any session can write the memory: a link in place of the index's files (here to a database
    # of someone else's) would otherwise break every session's recall, or have it write elsewhere.
    memory_id = await tools.remember("Steady", "links", "Survives a planted link.")
    assert await tools.recalled_ids("steady") == [memory_id]
    elsewhere = tmp_path / "someone-elses.sqlite"
    elsewhere.write_bytes(b"theirs")
    for name in (".index.sqlite", ".index.sqlite-wal", ".index.sqlite-shm", ".index.lock"):
        (tools.memory / name).unlink(missing_ok=True)
        (tools.memory / name).symlink_to(elsewhere)
    assert await tools.recalled_ids("steady") == [memory_id]
    assert elsewhere.read_bytes() == b"theirs"
    assert not (tools.memory / ".index.sqlite").is_symlink()
    assert (
        "forgot" in (await tools.ok("memory_forget", memory_id)).lower()
        or not (tools.memory / f"{memory_id}.md").exists()
    )


def test_a_link_planted_for_the_lock_while_a_corrupt_index_is_discarded_is_not_followed(tmp_path, monkeypatch):
    """Red-team pass, stop 57: code that kept a link at `.index.lock` (after the check that
    removes one) had the web page's recall, which runs unsandboxed, make a file where it led."""
    memory = tmp_path / "memory"
    memory.mkdir()
    script = _recall_script(monkeypatch, memory)
    index = memory / ".index.sqlite"
    index.write_bytes(b"not a database")
    (memory / ".index.lock").symlink_to(tmp_path / "made-by-ollie")
    with pytest.raises(OSError) as refused:
        script.discard_index(str(index), index.stat().st_ino)
    assert refused.value.errno == errno.ELOOP and not (tmp_path / "made-by-ollie").exists()


async def test_concurrent_remembers_and_recalls_keep_the_index_sound(tools):
    await tools.remember("Seed", "concurrency", "The first memory.")
    for round_ in range(3):
        branches = [
            {"tool": "memory_remember", "args": [f"Parallel {round_} {i}", "concurrency", f"branch {i}"]}
            for i in range(4)
        ] + [{"tool": "memory_recall", "args": ["concurrency", "50"]} for _ in range(4)]
        result = await tools.steps({"parallel": branches})
        assert not result.is_error, result.text()
    _index_is_sound(tools.memory, complete=False)  # the last round's recalls may have run before a remember
    assert len(await tools.recalled_ids("concurrency", "50")) == 13
    _index_is_sound(tools.memory)


async def test_two_sessions_share_the_memory(tools, tmp_path):
    memory_id = await tools.remember("Shared", "sessions", "Seen by the other session.")
    (tmp_path / "other-tmp").mkdir()
    ctx = CallContext(cwd=str(tools.cwd), session_id="s2", tmpdir=str(tmp_path / "other-tmp"), env=tools.ctx.env)
    other = Tools(execute.factory(str(tools.cwd))(), ctx, tools.cwd, tools.memory.parent)
    try:
        assert await other.recalled_ids("shared") == [memory_id]
    finally:
        await other.server.close()


# ---- memory_forget ----------------------------------------------------------------------------


async def test_forget_removes_the_file_and_its_index_entry(tools):
    memory_id = await tools.remember("Temporary", "scratch", "Forget me.")
    kept = await tools.remember("Permanent", "scratch", "Keep me.")
    assert len(await tools.recalled_ids("scratch")) == 2
    assert await tools.ok("memory_forget", memory_id) == f"forgot {memory_id}: Temporary\n"
    assert not (tools.memory / f"{memory_id}.md").exists()
    con = _index(tools.memory)
    try:
        assert [n for (n,) in con.execute("SELECT name FROM files")] == [f"{kept}.md"]
    finally:
        con.close()
    assert await tools.recalled_ids("scratch") == [kept]
    assert await tools.ok("memory_forget", f"{kept}.md") == f"forgot {kept}: Permanent\n"  # .md may be given
    _index_is_sound(tools.memory)


async def test_forget_names_an_unknown_id_and_never_leaves_the_memory(tools, ollie_dirs):
    memory_id = await tools.remember("Present", "x", "Here.")
    assert await tools.recalled_ids("here") == [memory_id]  # and the index made
    out = await tools.fails("memory_forget", "20000101T000000Z--absent")
    assert f"memory_forget: no memory 20000101T000000Z--absent in {tools.memory}" in out
    out = await tools.fails("memory_forget", "present")
    assert f"no memory present in {tools.memory}; ids that contain it: {memory_id}" in out
    victim = ollie_dirs / "data" / "victim.md"
    victim.write_text("# not a memory\n")
    for bad in ("../victim", "..", ".index.sqlite", "a/b", ""):
        out = await tools.fails("memory_forget", bad)
        assert "ID must be a file name in $OLLIE_MEMORY_DIR (no '/', no NUL, not starting with '.')" in out
    assert victim.exists() and (tools.memory / ".index.sqlite").exists()


# ---- task_plan --------------------------------------------------------------------------------


STEPS = [
    {"title": "Tag the release", "description": "git tag", "depends_on": ["Build", "Run tests"]},
    {"title": "Build", "description": "make dist"},
    {"title": "Run tests", "description": "pytest\nand the benches", "depends_on": ["build"]},
    {"title": "Write notes"},
    {"title": "Announce", "depends_on": ["Tag the release", "Write notes"]},
]


async def test_plan_sorts_steps_after_their_dependencies_keeping_the_given_order(tools):
    out = await tools.ok("task_plan", "Ship 1.0", json.dumps(STEPS))
    name, *rest = out.splitlines()
    assert re.fullmatch(rf"{STAMP}_[0-9a-f]{{6}}--ship-1-0__todo\.md", name), name
    checklist = [
        "- [ ] Build — make dist",
        "- [ ] Run tests — pytest and the benches (after: Build)",
        "- [ ] Tag the release — git tag (after: Build, Run tests)",
        "- [ ] Write notes",
        "- [ ] Announce (after: Tag the release, Write notes)",
    ]
    assert rest[:6] == ["# Ship 1.0", *checklist]
    assert rest[6].startswith(f"[5 steps, each after its dependencies; when one is done: task_complete {name} STEP")
    assert (tools.plans / name).read_text() == "# Ship 1.0\n\n" + "".join(line + "\n" for line in checklist)
    # Already in order: kept as given.
    out = await tools.ok("task_plan", "Plain", json.dumps(["one", "two", {"title": "three", "depends_on": []}]))
    assert out.splitlines()[2:5] == ["- [ ] one", "- [ ] two", "- [ ] three"]


async def test_plan_refuses_a_cycle_an_unknown_dependency_and_bad_steps(tools):
    cycle = [
        {"title": "a", "depends_on": ["c"]},
        {"title": "b", "depends_on": ["a"]},
        {"title": "c", "depends_on": ["b"]},
        {"title": "free"},
    ]
    out = await tools.fails("task_plan", "g", json.dumps(cycle))
    assert "task_plan: the steps depend on each other in a cycle: 'a' → 'c' → 'b' → 'a' (each needs the next)" in out
    out = await tools.fails("task_plan", "g", json.dumps([{"title": "a", "depends_on": ["a"]}]))
    assert "task_plan: step 'a' depends on itself" in out
    out = await tools.fails("task_plan", "g", json.dumps([{"title": "a"}, {"title": "b", "depends_on": ["zz"]}]))
    assert "task_plan: step 'b' depends on 'zz', which is no step's title (the titles: a; b)" in out
    assert "two steps are titled 'A'" in await tools.fails("task_plan", "g", '["a", "A"]')
    assert "step 1 has the key 'after'" in await tools.fails("task_plan", "g", '[{"title": "a", "after": []}]')
    assert "STEPS_JSON is not JSON" in await tools.fails("task_plan", "g", "[{")
    assert "non-empty JSON list of steps" in await tools.fails("task_plan", "g", "[]")
    assert "GOAL is empty" in await tools.fails("task_plan", " ", '["a"]')
    assert not tools.plans.exists() or not list(tools.plans.iterdir())


async def test_plan_reads_steps_from_stdin(tools):
    out = await tools.ok("task_plan", "From stdin", stdin='[{"title": "only", "description": "one step"}]')
    assert out.splitlines()[1:3] == ["# From stdin", "- [ ] only — one step"]


# ---- task_complete ----------------------------------------------------------------------------


@pytest.fixture
async def plan(tools) -> str:
    return (await tools.ok("task_plan", "Ship 1.0", json.dumps(STEPS))).splitlines()[0]


async def test_complete_checks_the_first_unchecked_step_containing_step_in_any_case(tools, plan):
    out = await tools.ok("task_complete", plan, "TEST")
    assert out == (
        f"checked in {plan}: Run tests\n4 steps left:\n- [ ] Build — make dist\n"
        "- [ ] Tag the release — git tag (after: Build, Run tests)\n- [ ] Write notes\n"
        "- [ ] Announce (after: Tag the release, Write notes)\n"
    )
    text = (tools.plans / plan).read_text()
    assert "- [x] Run tests — pytest and the benches (after: Build)\n" in text
    # "e" is in every title: the first unchecked one is taken.
    assert (await tools.ok("task_complete", plan, "e")).startswith(f"checked in {plan}: Tag the release\n")
    # A title given whole wins over an earlier title that contains it.
    assert (await tools.ok("task_complete", plan, "build")).startswith(f"checked in {plan}: Build\n")


async def test_complete_errors_when_no_unchecked_step_matches(tools, plan):
    out = await tools.fails("task_complete", plan, "deploy")
    assert (
        f"task_complete: no unchecked step of {plan} has a title containing 'deploy'; "
        "the unchecked steps: Build; Run tests; Tag the release; Write notes; Announce"
    ) in out
    await tools.ok("task_complete", plan, "build")
    out = await tools.fails("task_complete", plan, "build")
    assert "has a title containing 'build' ('Build' matched, checked already); the unchecked steps: Run tests;" in out


async def test_complete_finds_a_plan_renamed_to_wip_and_says_when_all_are_done(tools, plan):
    stem = plan.split("__")[0]
    result = await tools.steps({"code": f'mv "$OLLIE_PLANS_DIR/{plan}" "$OLLIE_PLANS_DIR/{stem}__wip.md"'})
    assert not result.is_error, result.text()
    wip = f"{stem}__wip.md"
    assert (await tools.ok("task_complete", plan, "build")).startswith(f"checked in {wip}: Build\n")  # the old name
    assert (await tools.ok("task_complete", stem, "tests")).startswith(f"checked in {wip}: Run tests\n")  # the stem
    assert (await tools.ok("task_complete", wip, "tag")).startswith(f"checked in {wip}: Tag the release\n")
    await tools.ok("task_complete", wip, "notes")
    out = await tools.ok("task_complete", wip, "announce")
    assert out == (
        f"checked in {wip}: Announce\n"
        f'all steps done; when the goal is met: mv "$OLLIE_PLANS_DIR/{wip}" "$OLLIE_PLANS_DIR/{stem}__done.md"\n'
    )
    assert "every step of" in await tools.fails("task_complete", wip, "announce")
    assert (tools.plans / wip).read_text().count("- [x] ") == 5


async def test_complete_names_must_stay_in_the_plans(tools, plan, ollie_dirs):
    outside = ollie_dirs / "data" / "outside__todo.md"
    outside.write_text("# not a plan\n\n- [ ] step\n")
    for bad in ("../outside__todo.md", "..", f"../plans/{plan}", ".hidden"):
        out = await tools.fails("task_complete", bad, "step")
        assert "FILE must be a file name in $OLLIE_PLANS_DIR (no '/', no NUL, not starting with '.')" in out
    assert outside.read_text() == "# not a plan\n\n- [ ] step\n"
    out = await tools.fails("task_complete", "20000101T000000Z_abcdef--nothing__todo.md", "step")
    assert f"no plan 20000101T000000Z_abcdef--nothing__todo.md in {tools.plans}; the newest plans: {plan}" in out


async def test_concurrent_completions_lose_no_check(tools, plan):
    branches = [{"tool": "task_complete", "args": [plan, title]} for title in ("build", "tests", "notes", "announce")]
    result = await tools.steps({"parallel": branches})
    assert not result.is_error, result.text()
    assert (tools.plans / plan).read_text().count("- [x] ") == 4


COMPLETE_FIRST_PLAN = 'cd "$OLLIE_PLANS_DIR" && "${OLLIE_TOOLS_PATH%%:*}/task_complete" *__todo.md TESTS'


async def test_an_agent_plans_completes_and_remembers_and_another_session_recalls(
    cores, ollie_dirs, tmp_path, monkeypatch
):
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(DEFAULTS))
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)

    def call(name: str, *args: str) -> dict:
        return {"name": "execute_code", "arguments": {"steps": [{"tool": name, "args": list(args)}]}}

    steps = json.dumps([{"title": "write tests"}, {"title": "fix the bug", "depends_on": ["write tests"]}])
    first = [
        {"tool_calls": [call("task_plan", "fix the parser", steps)]},
        {  # the model names the plan file task_plan printed
            "tool_calls": [
                {
                    "name": "execute_code",
                    "arguments": {"steps": [{"code": COMPLETE_FIRST_PLAN}]},
                }
            ],
            "expect": "- [ ] write tests",
        },
        {
            "tool_calls": [call("memory_remember", "parser quirk", "parser,bug", "Trailing commas break it.")],
            "expect": "fix the bug",
        },
        {"text": "Planned, one step done, remembered.", "expect": "parser-quirk"},
    ]
    core, backend, _, _ = await cores.open(first, extra_servers={"execute": execute.factory(str(work))})
    await core.submit("plan the fix and remember what you learn")
    backend.assert_consumed()
    assert core.reply == "Planned, one step done, remembered."
    await cores.close(core)
    [plan] = (ollie_dirs / "data" / "plans").glob("*fix-the-parser__todo.md")
    assert "- [x] write tests" in plan.read_text() and "- [ ] fix the bug" in plan.read_text()

    second = [  # another session, another execute server: what the first remembered is on disk
        {"tool_calls": [call("memory_recall", "trailing commas")]},
        {"text": "Recalled it.", "expect": "Trailing commas break it."},
    ]
    core, backend, _, _ = await cores.open(second, extra_servers={"execute": execute.factory(str(work))})
    await core.submit("what do we know about the parser?")
    backend.assert_consumed()
    assert core.reply == "Recalled it."
