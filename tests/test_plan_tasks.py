"""Plans committed where the user keeps tasks (ollie.plans): a scripted agent makes a plan
with task_plan in the real sandbox, checks a step, finishes it; the session commits the steps to
an MCP task server written for these tests (tests/mcp_servers/tasks.py, its tasks in a JSON file
read here), to a fallback backend, or nowhere. A task server without the optional tools, one
that fails or dies half-way, and another session's code forging plans."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import ollie
from agent_helpers import children
from ollie.config import AgentConfig
from ollie.plans import KEY_FILE, MAP_FILE, Task, signature
from ollie.plans import backends as plan_backends
from ollie.types import Event
from sandbox_helpers import write_policy
from script_helpers import DEFAULTS

PY = sys.executable
TASKS = Path(__file__).parent / "mcp_servers" / "tasks.py"
STEPS = [
    {"title": "write code", "description": "the parser, tested"},
    {"title": "test it", "depends_on": ["write code"]},
    {"title": "release, then tell", "depends_on": ["write code", "test it"]},
]
TITLES = ["write code", "test it", "release, then tell"]


def task_plan(goal: str, steps: list) -> dict:
    return {"name": "execute_code", "arguments": {"steps": [{"tool": "task_plan", "args": [goal, json.dumps(steps)]}]}}


def code(text: str) -> dict:
    return {"name": "execute_code", "arguments": {"steps": [{"code": text}]}}


COMPLETE_WRITE_CODE = code(
    'cd "$OLLIE_PLANS_DIR" && "${OLLIE_TOOLS_PATH%%:*}/task_complete" *--ship-it__todo.md "write code"'
)
FINISH = code('cd "$OLLIE_PLANS_DIR" && for f in *--ship-it__todo.md; do mv "$f" "${f%__todo.md}__done.md"; done')
SHIP_IT = [  # plan, check the first step, finish the plan, answer
    {"tool_calls": [task_plan("ship it", STEPS)]},
    {"tool_calls": [COMPLETE_WRITE_CODE], "expect": "- [ ] write code"},
    {"tool_calls": [FINISH], "expect": "checked in"},
    {"text": "Shipped."},
]


def tasks_server(file: Path, *flags: str) -> dict[str, Any]:
    """The task server, in its jail, with the one directory it keeps its tasks in writable."""
    write_policy("tasks", f"filesystem:\n  rw: [{file.parent}]\n")
    return {"tasks": {"command": PY, "args": [str(TASKS), str(file), *flags], "sandbox": "tasks"}}


@pytest.fixture(autouse=True)
def setting(monkeypatch, tmp_path):
    before = children()
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(DEFAULTS))
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    yield
    assert children() - before == set(), "a task server outlived its session"


class Session:
    """A session on the scripted backend, its events, and where its plans and tasks are."""

    def __init__(self, core: ollie.Core, events: list[Event], tasks_file: Path | None):
        self.core, self.events, self.tasks_file = core, events, tasks_file

    async def turn(self, prompt: str = "go") -> None:
        await self.core.submit(prompt)
        errors = [e.text for e in self.events if e.kind == "error"]
        assert not errors, errors

    def infos(self, word: str = "plan") -> list[str]:
        return [e.text for e in self.events if e.kind == "info" and word in e.text]

    def tasks(self) -> dict[str, dict]:
        assert self.tasks_file is not None
        return json.loads(self.tasks_file.read_text())["tasks"]

    def calls(self, tool: str | None = None) -> list[list]:
        assert self.tasks_file is not None
        calls = json.loads(self.tasks_file.read_text())["calls"]
        return [c for c in calls if tool is None or c[0] == tool]

    def committed(self) -> dict:
        return json.loads((self.core.session.store.dir / MAP_FILE).read_text())

    async def close(self) -> None:
        await self.core.close()


async def open_session(
    script: list,
    tasks_file: Path | None = None,
    flags: tuple[str, ...] = (),
    session_id: str | None = None,
    **options: Any,
) -> Session:
    servers = tasks_server(tasks_file, *flags) if tasks_file else {}
    events: list[Event] = []
    core = await ollie.open_session(
        agent=AgentConfig(mcp_servers=servers),
        backend="scripted",
        script=script,
        session_id=session_id,
        on_event=events.append,
        **options,
    )
    return Session(core, events, tasks_file)


def plans_dir(ollie_dirs: Path) -> Path:
    return ollie_dirs / "data" / "plans"


def the_plan(ollie_dirs: Path, pattern: str = "*--ship-it__*.md") -> Path:
    [plan] = plans_dir(ollie_dirs).glob(pattern)
    return plan


# ---- a full task server -------------------------------------------------------------------------


class Notebook:
    """A fallback backend of the program's own, recording what it is asked."""

    name = "notebook"

    def __init__(self, links: bool = True, completes: bool = True) -> None:
        self.created: list[Task] = []
        self.linked: list[tuple[str, str]] = []
        self.completed: list[str] = []
        self.links, self.completes = links, completes

    async def create(self, task: Task) -> str:
        self.created.append(task)
        return f"n{len(self.created)}"

    async def link(self, task_id: str, depends_on: str) -> bool:
        if self.links:
            self.linked.append((task_id, depends_on))
        return self.links

    async def complete(self, task_id: str) -> bool:
        if self.completes:
            self.completed.append(task_id)
        return self.completes


async def test_a_plan_is_committed_to_the_task_server_with_its_dependencies_and_progress(ollie_dirs, tmp_path):
    notebook = Notebook()  # a fallback is not used while a tool server has task_create
    s = await open_session(SHIP_IT, tmp_path / "tasks.json", plan_backend=notebook)
    try:
        await s.turn()
        assert s.core.reply == "Shipped."
    finally:
        await s.close()
    tasks = s.tasks()
    assert [t["title"] for t in tasks.values()] == TITLES
    assert tasks["T1"]["description"].startswith("the parser, tested\n\nPlan: ship it (pl/")
    assert "After: write code; test it" in tasks["T3"]["description"]
    assert [t["blocked_by"] for t in tasks.values()] == [[], ["T1"], ["T1", "T2"]]
    assert [t["status"] for t in tasks.values()] == ["done", "done", "done"]
    # in the order the agent worked: created and linked after task_plan, T1 done when checked, the rest at __done
    assert [c[0] for c in s.calls()] == ["task_create"] * 3 + ["task_dep"] * 3 + ["task_update"] * 3
    assert [c[1]["id"] for c in s.calls("task_update")] == ["T1", "T2", "T3"]
    assert not notebook.created
    plan = the_plan(ollie_dirs, "*--ship-it__done.md")
    todo = plan.name.replace("__done", "__todo")
    assert s.infos() == [
        f"plan {todo} → task server tasks: 3 tasks created (T1, T2, T3); 3 dependencies linked",
        f"plan {todo} → task server tasks: done: T1",
        f"plan {plan.name} → task server tasks: done: T2, T3",
    ]
    # the plan file carries its signature on its second line; the session's plan is the file without it
    lines = plan.read_text().splitlines()
    assert re.fullmatch(r"<!-- ollie-plan v1 session=\S+ deps=;0;0,1 mac=[0-9a-f]{64} -->", lines[1])
    assert s.core.session.plan == "\n".join([lines[0], *lines[2:]]) + "\n"
    assert "- [x] write code — the parser, tested" in s.core.session.plan
    # what was committed is kept in the session's store, the key beside it, private
    committed = s.committed()["backends"]["mcp:tasks"][plan.name.split("__")[0]]
    assert [(t["id"], t["done"]) for t in committed["tasks"]] == [("T1", True), ("T2", True), ("T3", True)]
    assert (s.core.session.store.dir / KEY_FILE).stat().st_mode & 0o777 == 0o600


async def test_a_restarted_session_and_task_server_create_no_task_twice(ollie_dirs, tmp_path):
    file = tmp_path / "tasks.json"
    s = await open_session(SHIP_IT[:1] + [{"text": "Planned."}], file)
    try:
        await s.turn()
    finally:
        await s.close()
    assert len(s.calls("task_create")) == 3
    # the session again, a new task server process on the same store: the step is checked now
    again = await open_session(
        [{"tool_calls": [COMPLETE_WRITE_CODE]}, {"text": "One done."}], file, session_id=s.core.session_id
    )
    try:
        await again.turn()
    finally:
        await again.close()
    assert len(again.calls("task_create")) == 3 and len(again.calls("task_dep")) == 3
    assert [t["status"] for t in again.tasks().values()] == ["done", "open", "open"]


# ---- a task server with task_create only ----------------------------------------------------------


async def test_a_server_with_task_create_only_gets_the_dependencies_in_the_descriptions(ollie_dirs, tmp_path):
    s = await open_session(SHIP_IT, tmp_path / "tasks.json", ("--create-only",))
    try:
        await s.turn()
        assert s.core.reply == "Shipped."
    finally:
        await s.close()
    tasks = s.tasks()
    assert [t["title"] for t in tasks.values()] == TITLES
    assert "After: write code\n" in tasks["T2"]["description"]
    assert "After: write code; test it\n" in tasks["T3"]["description"]
    assert [t["status"] for t in tasks.values()] == ["open"] * 3
    assert [c[0] for c in s.calls()] == ["task_create"] * 3
    infos = s.infos("task server tasks")
    assert (
        "task server tasks records no dependencies (no usable task_dep): a step's dependencies are "
        "written into its task's description only"
    ) in infos
    assert (
        "task server tasks cannot mark tasks done (no usable task_update): steps checked in the plan stay open there"
        in infos
    )
    assert len(infos) == 3  # the tasks created, and each missing tool said once


# ---- a task server that fails half-way ---------------------------------------------------------------


async def test_a_server_failing_mid_plan_loses_nothing_and_gets_the_rest_later(ollie_dirs, tmp_path):
    s = await open_session(SHIP_IT, tmp_path / "tasks.json", ("--fail-create", "2"))
    try:
        await s.turn()
        assert s.core.reply == "Shipped."  # the turn went on
    finally:
        await s.close()
    plan = the_plan(ollie_dirs, "*--ship-it__done.md")
    todo = plan.name.replace("__done", "__todo")
    infos = s.infos()
    assert infos[0] == (
        f"plan {todo}: task server tasks failed creating step 2 of 3 ('test it'): task_create answered an "
        "error: Error executing tool task_create: the task store is locked; 1 of 3 tasks exist and are kept "
        "(the session's plan-tasks.json); the rest is committed at a later tool round"
    )
    assert infos[1] == f"plan {todo} → task server tasks: 2 tasks created (T2, T3); 3 dependencies linked; done: T1"
    tasks = s.tasks()
    assert [t["title"] for t in tasks.values()] == ["write code", "test it", "release, then tell"]
    assert [t["blocked_by"] for t in tasks.values()] == [[], ["T1"], ["T1", "T2"]]
    assert [t["status"] for t in tasks.values()] == ["done"] * 3


async def test_a_server_dying_mid_plan_leaves_the_reason_and_a_restart_commits_the_rest(ollie_dirs, tmp_path):
    file = tmp_path / "tasks.json"
    s = await open_session(SHIP_IT[:2] + [{"text": "Half done."}], file, ("--die-create", "2"))
    try:
        await s.turn()
        assert s.core.reply == "Half done."
    finally:
        await s.close()
    todo = the_plan(ollie_dirs).name
    # The server, started again at the next round, got one step further before it died again.
    first, second = s.infos("failed")
    assert first.startswith(
        f"plan {todo}: task server tasks failed creating step 2 of 3 ('test it'): task_create failed: the server "
        "closed the connection"
    )
    assert "1 of 3 tasks exist and are kept" in first
    assert second.startswith(f"plan {todo}: task server tasks failed creating step 3 of 3 ('release, then tell')")
    assert "2 of 3 tasks exist and are kept" in second
    assert (ollie_dirs / "data" / "plans" / todo).is_file()
    committed = s.committed()["backends"]["mcp:tasks"][todo.split("__")[0]]
    assert [t["id"] for t in committed["tasks"]] == ["T1", "T2", None]

    again = await open_session(
        [{"tool_calls": [code("true")]}, {"text": "Resumed."}], file, session_id=s.core.session_id
    )
    try:
        await again.turn()
    finally:
        await again.close()
    tasks = again.tasks()
    assert [t["title"] for t in tasks.values()] == TITLES
    assert [t["status"] for t in tasks.values()] == ["done", "open", "open"]  # "write code" was checked meanwhile
    assert again.infos() == [f"plan {todo} → task server tasks: 1 task created (T3); 3 dependencies linked; done: T1"]


async def test_a_server_that_hangs_costs_one_wait_not_one_per_round(ollie_dirs, tmp_path, monkeypatch):
    monkeypatch.setattr(plan_backends, "CALL_TIMEOUT", 0.5)
    s = await open_session(SHIP_IT, tmp_path / "tasks.json", ("--hang-create", "2"))
    try:
        await s.turn()
        assert s.core.reply == "Shipped."
    finally:
        await s.close()
    todo = the_plan(ollie_dirs, "*__done.md").name.replace("__done", "__todo")
    assert s.infos() == [
        f"plan {todo}: task server tasks failed creating step 2 of 3 ('test it'): task_create gave no answer "
        "within 0.5 s; 1 of 3 tasks exist and are kept (the session's plan-tasks.json); the rest is committed "
        "at a later tool round"
    ]
    assert len(s.calls("task_create")) == 2  # the two rounds after it left the server alone


# ---- a program's own backend, and none -------------------------------------------------------------


async def test_without_a_task_server_the_programs_fallback_backend_gets_the_plan(ollie_dirs):
    notebook = Notebook()
    s = await open_session(SHIP_IT, plan_backend=notebook)
    try:
        await s.turn()
    finally:
        await s.close()
    assert [t.title for t in notebook.created] == TITLES
    stem = the_plan(ollie_dirs, "*__done.md").name.split("__")[0]
    assert {(t.goal, t.plan) for t in notebook.created} == {("ship it", stem)}
    assert notebook.created[2].description == f"After: write code; test it\n\nPlan: ship it (pl/{stem})"
    assert notebook.linked == [("n2", "n1"), ("n3", "n1"), ("n3", "n2")]
    assert notebook.completed == ["n1", "n2", "n3"]
    assert s.infos("notebook")[0].endswith("→ notebook: 3 tasks created (n1, n2, n3); 3 dependencies linked")


async def test_a_fallback_that_cannot_link_or_complete_is_told_once(ollie_dirs):
    notebook = Notebook(links=False, completes=False)
    s = await open_session(SHIP_IT, plan_backend=notebook)
    try:
        await s.turn()
    finally:
        await s.close()
    assert len(notebook.created) == 3 and not notebook.linked and not notebook.completed
    assert len(s.infos("notebook records no dependencies")) == 1
    assert len(s.infos("notebook cannot mark tasks done")) == 1


async def test_without_any_backend_the_plan_lives_in_pl_and_the_sessions_plan(ollie_dirs):
    s = await open_session(SHIP_IT)
    try:
        await s.turn()
        assert s.core.reply == "Shipped."
    finally:
        await s.close()
    plan = the_plan(ollie_dirs, "*--ship-it__done.md")
    assert "- [x] write code" in s.core.session.plan and "<!--" not in s.core.session.plan
    assert s.core.session.plan.startswith("# ship it\n\n- [x] write code — the parser, tested\n")
    assert plan.read_text().startswith("# ship it\n<!-- ollie-plan v1 session=")
    assert not (s.core.session.store.dir / MAP_FILE).exists()
    assert s.infos() == []


async def test_rounds_without_plans_read_nothing_and_a_plan_made_later_is_found(ollie_dirs, monkeypatch):
    """A tool round looks for the session's plans in a thread only when there is something to
    read: a listing of pl/ that still holds and names no plan (and no plan of the session's to
    follow) is answered on the loop. A plan written after such rounds changes pl/ and is found."""
    plans = plans_dir(ollie_dirs)
    plans.mkdir(parents=True, exist_ok=True)
    past = time.time() - 60
    os.utime(plans, (past, past))  # listed long after its last change: the listing holds
    looks = []
    real_to_thread = asyncio.to_thread

    async def counting(fn, *args, **kwargs):
        looks.extend([fn.__name__] if fn.__name__ == "_look" else [])
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    true = code("true")
    s = await open_session([{"tool_calls": [true]}, {"tool_calls": [true]}, *SHIP_IT])
    try:
        await s.turn()
    finally:
        await s.close()
    # the first round lists pl/; the second reads nothing; the plan's three rounds read it
    assert looks == ["_look"] * 4
    assert s.core.session.plan.startswith("# ship it\n\n- [x] write code")
    assert the_plan(ollie_dirs, "*--ship-it__done.md").exists()


async def test_an_agent_switch_chooses_the_backend_again(ollie_dirs, tmp_path):
    file = tmp_path / "tasks.json"
    agents = ollie_dirs / "cfg" / "agents"
    agents.mkdir()
    (agents / "planner.json").write_text(json.dumps({"prompt": "Plan.\n", "mcpServers": tasks_server(file)}))
    s = await open_session(SHIP_IT[:1] + [{"text": "Planned."}, {"tool_calls": [code("true")]}, {"text": "Synced."}])
    try:
        await s.turn()
        assert not file.exists()  # no task server yet
        await s.core.set_agent("planner")
        await s.turn()
    finally:
        await s.close()
    s.tasks_file = file
    assert [t["title"] for t in s.tasks().values()] == TITLES


# ---- another session's code -------------------------------------------------------------------------


async def test_another_sessions_code_cannot_make_a_session_commit_tasks(ollie_dirs, tmp_path):
    file = tmp_path / "tasks.json"
    victim = await open_session(
        [
            {"tool_calls": [task_plan("ship it", STEPS[:2])]},
            {"text": "Planned."},
            {"tool_calls": [code("true")]},
            {"text": "Synced."},
        ],
        file,
    )
    attacker = None
    try:
        await victim.turn()
        assert [t["title"] for t in victim.tasks().values()] == ["write code", "test it"]
        sid = victim.core.session_id
        forge = (
            'cd "$OLLIE_PLANS_DIR" && t="${OLLIE_TOOLS_PATH%%:*}"; '
            # a plan that claims the victim, signed with the attacker's own key
            f'OLLIE_SESSION_ID={sid} "$t/task_plan" "forged" \'["evil step"]\' && '
            # the victim's plan copied under a new name
            "cp *--ship-it__todo.md 20990101T000000Z_abcdef--copied__todo.md && "
            # the victim's plan changed in place: a title, and a step added
            'f=$(ls *--ship-it__todo.md) && sed -i "s/test it/exfiltrate it/" "$f" && echo "- [ ] evil two" >> "$f"'
        )
        attacker = await open_session([{"tool_calls": [code(forge)]}, {"text": "Forged."}])
        await attacker.turn()
        assert len(list(plans_dir(ollie_dirs).glob("*.md"))) == 3
        await victim.turn()
    finally:
        await victim.close()
        if attacker is not None:
            await attacker.close()
    assert [t["title"] for t in victim.tasks().values()] == ["write code", "test it"]
    assert len(victim.calls("task_create")) == 2
    refused = victim.infos("signature does not verify")
    names = sorted(p.name for p in plans_dir(ollie_dirs).glob("*.md"))
    assert sorted(refused) == sorted(
        f"plan {n} is not committed: it claims this session, but its signature does not verify "
        "(written, copied or changed by other code)"
        for n in names
    )
    assert "evil" not in victim.core.session.plan  # nor does it become the session's plan


async def test_a_signed_plan_beyond_the_bounds_is_not_committed(ollie_dirs, tmp_path):
    notebook = Notebook()
    s = await open_session(
        [{"tool_calls": [code("true")]}, {"text": "ok"}, {"tool_calls": [code("true")]}, {"text": "ok"}],
        plan_backend=notebook,
    )
    try:
        await s.turn()  # the session's first stage: its key is made
        # what task_plan refuses (65 steps), signed with the session's own key all the same
        key = bytes.fromhex((s.core.session.store.dir / KEY_FILE).read_text())
        stem = "20250101T000000Z_abcdef--big"
        lines = [f"- [ ] step {i}" for i in range(65)]
        deps = ";" * 64
        mac = signature(key, stem, s.core.session_id, deps, "# big", lines)
        head = f"# big\n<!-- ollie-plan v1 session={s.core.session_id} deps={deps} mac={mac} -->\n\n"
        plans_dir(ollie_dirs).mkdir(exist_ok=True)
        (plans_dir(ollie_dirs) / f"{stem}__todo.md").write_text(head + "\n".join(lines) + "\n")
        await s.turn()
    finally:
        await s.close()
    assert not notebook.created
    assert s.infos() == [
        f"plan {stem}__todo.md is not committed: signed by this session, but it has 65 steps for 65 "
        "dependency lists (1 to 64)"
    ]


async def test_task_plan_refuses_plans_beyond_the_bounds(ollie_dirs):
    too_long = [{"title": "x" * 201}]
    script = [
        {"tool_calls": [task_plan("many", [f"s{i}" for i in range(65)])]},
        {"tool_calls": [task_plan("long", too_long)], "expect": "a plan has at most 64"},
        {"tool_calls": [task_plan("g" * 201, ["a"])], "expect": "a title has at most 200 characters"},
        {"text": "ok", "expect": "GOAL has 201 characters; at most 200"},
    ]
    s = await open_session(script)
    try:
        await s.turn()
    finally:
        await s.close()
    assert not plans_dir(ollie_dirs).exists() or not list(plans_dir(ollie_dirs).iterdir())


# ---- plans revised, started and dropped --------------------------------------------------------------

# The agent revises its plan with the file_* tool scripts, run as its code runs them (in the real
# sandbox, with the session's key in their environment): the plan file read first, as they require.
OPEN_PLAN = (
    'cd "$OLLIE_PLANS_DIR" && t="${OLLIE_TOOLS_PATH%%:*}" && f=$(ls *--ship-it__*.md) && '
    '"$t/file_read" "$f" >/dev/null && '
)
ADD_A_STEP = code(
    OPEN_PLAN + '"$t/file_edit" "$f" \'- [ ] test it (after: write code)\' "$(printf \'%s\\n%s\' '
    "'- [ ] test it — on the CI (after: write code)' '- [ ] document it (after: TEST IT)')\""
)
BAD_DEPENDENCY = code(OPEN_PLAN + "\"$t/file_edit\" \"$f\" '(after: write code)' '(after: lunch)'")
REWRITE = code(  # the whole plan written anew (without its signature line): a step retitled, one dropped
    OPEN_PLAN + "printf '%s\\n' '# ship it' '' '- [ ] write the code — the parser, tested' "
    '\'- [ ] release, then tell (after: write the code)\' | "$t/file_write" "$f"'
)
START = code('cd "$OLLIE_PLANS_DIR" && for f in *--ship-it__todo.md; do mv "$f" "${f%__todo.md}__wip.md"; done')
FINISH_WIP = code('cd "$OLLIE_PLANS_DIR" && for f in *--ship-it__wip.md; do mv "$f" "${f%__wip.md}__done.md"; done')


def stem_of(ollie_dirs: Path) -> str:
    return the_plan(ollie_dirs).name.split("__")[0]


async def test_a_plan_revised_with_file_edit_stays_the_sessions_and_its_new_steps_reach_the_task_server(
    ollie_dirs, tmp_path
):
    s = await open_session(
        [
            {"tool_calls": [task_plan("ship it", STEPS)]},
            {"tool_calls": [BAD_DEPENDENCY], "expect": "[3 steps"},
            {"tool_calls": [ADD_A_STEP], "expect": "'lunch', which is no earlier step's title"},
            {"text": "Revised.", "expect": "[plan signed anew for this session: 4 steps]"},
        ],
        tmp_path / "tasks.json",
    )
    try:
        await s.turn()
    finally:
        await s.close()
    stem = stem_of(ollie_dirs)
    # the session's plan is the revision (the dependency named in another case, written as the step's title)
    assert s.core.session.plan == (
        "# ship it\n\n- [ ] write code — the parser, tested\n- [ ] test it — on the CI (after: write code)\n"
        "- [ ] document it (after: test it)\n- [ ] release, then tell (after: write code, test it)\n"
    )
    assert s.infos("not committed") == []
    tasks = s.tasks()
    assert [t["title"] for t in tasks.values()] == [*TITLES, "document it"]
    assert tasks["T2"]["description"] == f"on the CI\n\nAfter: write code\n\nPlan: ship it (pl/{stem})"
    assert tasks["T4"]["blocked_by"] == ["T2"]
    assert [c[0] for c in s.calls()][6:] == ["task_create", "task_edit", "task_dep"]
    assert s.calls("task_edit") == [
        ["task_edit", {"id": "T2", "title": "test it", "description": tasks["T2"]["description"]}]
    ]
    assert (
        s.infos()[-1]
        == f"plan {stem}__todo.md → task server tasks: 1 task created (T4); revised: T2; 1 dependency linked"
    )
    # the bad edit was refused whole: nothing written
    lines = the_plan(ollie_dirs).read_text().splitlines()
    assert re.fullmatch(r"<!-- ollie-plan v1 session=\S+ deps=;0;1;0,1 mac=[0-9a-f]{64} -->", lines[1])


async def test_a_plan_rewritten_with_file_write_and_worked_claims_revises_and_deletes_its_tasks(ollie_dirs, tmp_path):
    s = await open_session(
        [
            {"tool_calls": [task_plan("ship it", STEPS)]},
            {"tool_calls": [START]},
            {"tool_calls": [REWRITE]},
            {
                "tool_calls": [code(OPEN_PLAN + '"$t/task_complete" "$f" "write the code"')],
                "expect": "[plan signed anew for this session: 2 steps]",
            },
            {"tool_calls": [FINISH_WIP], "expect": "checked in"},
            {"text": "Shipped."},
        ],
        tmp_path / "tasks.json",
    )
    try:
        await s.turn()
    finally:
        await s.close()
    stem = stem_of(ollie_dirs)
    calls = s.calls()[6:]  # after the 3 tasks made and their 3 dependencies linked
    assert calls == [
        ["task_update", {"id": "T1", "status": "in_progress"}],  # the plan went __wip: its first step is claimed
        ["task_delete", {"id": "T2"}],  # "test it" is no step any more
        [
            "task_edit",
            {"id": "T1", "title": "write the code", "description": f"the parser, tested\n\nPlan: ship it (pl/{stem})"},
        ],
        [
            "task_edit",
            {
                "id": "T3",
                "title": "release, then tell",
                "description": f"After: write the code\n\nPlan: ship it (pl/{stem})",
            },
        ],
        ["task_update", {"id": "T1", "status": "done"}],
        ["task_update", {"id": "T3", "status": "in_progress"}],  # the next step, claimed in its turn
        ["task_update", {"id": "T3", "status": "done"}],
    ]
    tasks = s.tasks()
    assert {i: (t["title"], t["status"]) for i, t in tasks.items()} == {
        "T1": ("write the code", "done"),
        "T3": ("release, then tell", "done"),
    }
    wip = f"{stem}__wip.md"
    assert s.infos()[1:] == [
        f"plan {wip} → task server tasks: claimed: T1",
        f"plan {wip} → task server tasks: deleted: T2; revised: T1, T3",
        f"plan {wip} → task server tasks: done: T1; claimed: T3",
        f"plan {stem}__done.md → task server tasks: done: T3",
    ]
    lines = the_plan(ollie_dirs).read_text().splitlines()
    assert re.fullmatch(r"<!-- ollie-plan v1 session=\S+ deps=;0 mac=[0-9a-f]{64} -->", lines[1])
    assert (
        s.core.session.plan
        == "# ship it\n\n- [x] write the code — the parser, tested\n- [ ] release, then tell (after: write the code)\n"
    )


async def test_the_open_tasks_of_a_plan_removed_from_pl_are_deleted(ollie_dirs, tmp_path):
    s = await open_session(
        [
            {"tool_calls": [task_plan("ship it", STEPS)]},
            {"tool_calls": [COMPLETE_WRITE_CODE]},
            {"tool_calls": [code('rm "$OLLIE_PLANS_DIR"/*--ship-it__todo.md')]},
            {"tool_calls": [code("true")]},
            {"text": "Dropped."},
        ],
        tmp_path / "tasks.json",
    )
    try:
        await s.turn()
        stem = next(iter(s.committed()["backends"]["mcp:tasks"]))
    finally:
        await s.close()
    assert s.calls("task_delete") == [["task_delete", {"id": "T2"}], ["task_delete", {"id": "T3"}]]
    assert {i: t["status"] for i, t in s.tasks().items()} == {"T1": "done"}  # what was done stays
    assert s.infos()[-1] == f"plan {stem}: removed from pl/ → task server tasks: deleted: T2, T3"
    assert len(s.calls("task_delete")) == 2  # once: the round after it deleted nothing more


async def test_a_server_without_the_optional_tools_gets_a_revised_plans_new_steps_only(ollie_dirs, tmp_path):
    s = await open_session(
        [
            {"tool_calls": [task_plan("ship it", STEPS)]},
            {"tool_calls": [START]},
            {"tool_calls": [ADD_A_STEP]},
            {"tool_calls": [REWRITE]},
            {"tool_calls": [FINISH_WIP]},
            {"text": "Shipped."},
        ],
        tmp_path / "tasks.json",
        ("--create-only",),
    )
    try:
        await s.turn()
        assert s.core.reply == "Shipped."
    finally:
        await s.close()
    # the retitled step keeps its task as it was; the steps dropped keep theirs
    assert [t["title"] for t in s.tasks().values()] == [*TITLES, "document it"]
    assert [c[0] for c in s.calls()] == ["task_create"] * 4
    assert s.infos("not committed") == []
    infos = s.infos("task server tasks")
    for missing in (
        "task server tasks cannot claim tasks (no usable task_update with an in-progress status): "
        "steps worked on stay open there",
        "task server tasks cannot revise tasks (no usable task_edit): a step's new title or description "
        "is not carried to its task",
        "task server tasks cannot delete tasks (no usable task_delete): the tasks of steps or plans removed stay there",
    ):
        assert infos.count(missing) == 1, infos


async def test_a_plan_changed_by_other_code_is_not_signed_anew_by_an_edit(ollie_dirs, tmp_path):
    victim = await open_session(
        [
            {"tool_calls": [task_plan("ship it", STEPS[:2])]},
            {"text": "Planned."},
            {"tool_calls": [code(OPEN_PLAN + "\"$t/file_edit\" \"$f\" 'the parser, tested' 'the parser, twice'")]},
            {"text": "Revised.", "expect": "not signed anew"},
        ],
        tmp_path / "tasks.json",
    )
    attacker = None
    try:
        await victim.turn()
        # another session's code edits the victim's plan with the same tools: its key is not the victim's
        tamper = code(OPEN_PLAN + "\"$t/file_edit\" \"$f\" 'test it' 'exfiltrate it'")
        attacker = await open_session([{"tool_calls": [tamper]}, {"text": "Tampered.", "expect": "exfiltrate it"}])
        await attacker.turn()
        await victim.turn()  # its own edit of the tampered plan does not adopt it
    finally:
        await victim.close()
        if attacker is not None:
            await attacker.close()
    assert [t["title"] for t in victim.tasks().values()] == ["write code", "test it"]
    assert "exfiltrate" not in victim.core.session.plan and "twice" not in victim.core.session.plan
    assert victim.infos("signature does not verify")


class Tracker(Notebook):
    """A program's backend with the optional methods too."""

    name = "tracker"

    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []
        self.edited: list[tuple[str, str, str]] = []
        self.deleted: list[str] = []

    async def start(self, task_id: str) -> bool:
        self.started.append(task_id)
        return True

    async def edit(self, task_id: str, task: Task) -> bool:
        self.edited.append((task_id, task.title, task.description))
        return True

    async def delete(self, task_id: str) -> bool:
        self.deleted.append(task_id)
        return True


async def test_a_programs_backend_with_start_edit_and_delete_gets_them_too(ollie_dirs):
    tracker = Tracker()
    s = await open_session(
        [
            {"tool_calls": [task_plan("ship it", STEPS)]},
            {"tool_calls": [START]},
            {"tool_calls": [REWRITE]},
            {"text": "ok"},
        ],
        plan_backend=tracker,
    )
    try:
        await s.turn()
    finally:
        await s.close()
    stem = stem_of(ollie_dirs)
    assert tracker.started == ["n1"] and tracker.deleted == ["n2"]
    assert tracker.edited == [
        ("n1", "write the code", f"the parser, tested\n\nPlan: ship it (pl/{stem})"),
        ("n3", "release, then tell", f"After: write the code\n\nPlan: ship it (pl/{stem})"),
    ]
    assert [t.title for t in tracker.created] == TITLES
