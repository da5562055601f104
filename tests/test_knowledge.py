"""What the agent knows without being told each time (issue 25): the project's instructions
(AGENTS.md, else CLAUDE.md, from the repository's root down to the cwd, after the user's), the
skills it is offered and reads on demand, the agents it may start, and its own namespace ($OLLIE),
which a scripted session finds its way through from what its prompt and tools tell it alone."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from ollie import open_session, skills
from ollie.agent import commands
from ollie.project import INSTRUCTIONS_MAX
from ollie.types import Event

PACKAGE_DEFAULTS = Path(skills.__file__).parent / "defaults"


def _repo(tmp_path: Path) -> tuple[Path, Path]:
    """A repository with AGENTS.md at its root and in the cwd two directories down."""
    root = tmp_path / "repo"
    cwd = root / "pkg" / "mod"
    cwd.mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "AGENTS.md").write_text("ROOT: run `make check` before you answer.\n")
    (cwd / "AGENTS.md").write_text("LEAF: this module is Python 3.11 only.\n")
    return root, cwd


async def _turn(cwd: Path, script: list[dict] | None = None, **kw):
    """One turn of a scripted session in `cwd`: (the Core, the info notices it emitted)."""
    notices: list[str] = []

    def note(e: Event) -> None:
        if e.kind == "info":
            notices.append(e.text)

    core = await open_session(backend="scripted", script=script or [{"text": "ok"}], cwd=str(cwd), on_event=note, **kw)
    await core.submit("hello")
    return core, notices


def _system(core) -> str:
    """The system prompt the model was sent with the first request."""
    first = core.backend.requests[0][0]
    assert first.role == "system"
    return first.content


# ---- instructions ---------------------------------------------------------------------------------


async def test_agents_md_of_the_user_the_root_and_the_cwd_reach_the_model_in_order(tmp_path, ollie_dirs):
    _, cwd = _repo(tmp_path)
    (ollie_dirs / "cfg" / "AGENTS.md").write_text("USER: answer in English.\n")
    core, notices = await _turn(cwd)
    sent = _system(core)
    assert sent.index("USER:") < sent.index("ROOT:") < sent.index("LEAF:")
    assert f"## {cwd}/AGENTS.md\nLEAF" in sent  # where each came from, as /sp shows it too
    assert sent == core.system_prompt() == await commands.run(core, "sp")
    assert notices == []
    await core.close()


async def test_claude_md_is_read_where_no_agents_md_is(tmp_path):
    root, cwd = _repo(tmp_path)
    (cwd / "AGENTS.md").unlink()
    (cwd / "CLAUDE.md").write_text("CLAUDE-LEAF\n")
    (root / "CLAUDE.md").write_text("CLAUDE-ROOT: not read, AGENTS.md is here\n")
    core, _ = await _turn(cwd)
    sent = _system(core)
    assert "CLAUDE-LEAF" in sent and "ROOT:" in sent and "CLAUDE-ROOT" not in sent
    await core.close()


async def test_outside_a_repository_only_the_cwd_is_read(tmp_path):
    (tmp_path / "AGENTS.md").write_text("ABOVE\n")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "AGENTS.md").write_text("HERE\n")
    core, _ = await _turn(tmp_path / "work")
    assert "HERE" in _system(core) and "ABOVE" not in _system(core)
    await core.close()


async def test_an_agent_config_turns_instructions_and_skills_off(tmp_path, ollie_dirs):
    _, cwd = _repo(tmp_path)
    _skill(ollie_dirs / "cfg" / "skills", "pdf", "Fill in PDF forms")
    (ollie_dirs / "cfg" / "agents").mkdir(exist_ok=True)
    (ollie_dirs / "cfg" / "agents" / "plain.json").write_text(
        json.dumps({"prompt": "You are plain.", "instructions": False, "skills": False})
    )
    core, _ = await _turn(cwd, agent="plain")
    assert _system(core) == "You are plain."  # nothing added
    await core.close()


async def test_instructions_past_the_bound_are_cut_with_a_notice(tmp_path):
    _, cwd = _repo(tmp_path)
    (cwd / "AGENTS.md").write_text("LEAF " + "x" * (INSTRUCTIONS_MAX * 2))
    core, notices = await _turn(cwd)
    sent = _system(core)
    assert "LEAF" in sent and "[cut here: the rest of the file was not read]" in sent
    assert len(sent) < INSTRUCTIONS_MAX + 4096
    assert any(f"{cwd}/AGENTS.md is {INSTRUCTIONS_MAX * 2 + 5} bytes; the model reads its first" in n for n in notices)
    await core.close()


async def test_a_cwd_change_brings_the_other_projects_instructions(tmp_path):
    _, cwd = _repo(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "AGENTS.md").write_text("OTHER PROJECT\n")
    core, _ = await _turn(cwd, script=[{"text": "one"}, {"text": "two"}])
    core.session.set_cwd(str(other))
    await core.submit("again")
    second = core.backend.requests[1][0].content
    assert "OTHER PROJECT" in second and "LEAF" not in second
    await core.close()


# An agent that wants out plants links in its cwd: ollie reads them on the user's behalf, into a
# prompt that goes to the provider and that the session's own view serves back to the code.


async def test_a_planted_link_to_ollies_keys_is_not_read(tmp_path, ollie_dirs):
    _, cwd = _repo(tmp_path)
    keys = ollie_dirs / "cfg" / "env"
    keys.write_text("OLLIE_OPENAI_KEY=sk-SECRET\n")
    (cwd / "AGENTS.md").unlink()
    (cwd / "AGENTS.md").symlink_to(keys)  # absolute
    (cwd.parent / "AGENTS.md").symlink_to(os.path.relpath(keys, cwd.parent))  # relative, out of its directory
    core, notices = await _turn(cwd)
    assert "SECRET" not in _system(core)
    for where in (cwd, cwd.parent):
        assert f"instructions: {where}/AGENTS.md not read: it is a symlink that leads out of its directory" in notices
    await core.close()


async def test_a_link_inside_the_directory_is_read_unless_it_reaches_a_hidden_one(tmp_path, ollie_dirs):
    # A session in the directory that holds ollie's own (as a session in $HOME does): a link that
    # stays in the directory but points into ollie's configuration is refused all the same.
    (ollie_dirs / "cfg" / "env").write_text("OLLIE_OPENAI_KEY=sk-SECRET\n")
    (ollie_dirs / "AGENTS.md").symlink_to("cfg/env")
    core, notices = await _turn(ollie_dirs)
    assert "SECRET" not in _system(core)
    refused = f"instructions: {ollie_dirs}/AGENTS.md not read: it lies in ollie's hidden"
    assert any(n.startswith(refused) for n in notices)
    await core.close()
    # CLAUDE.md -> AGENTS.md, as projects keep one file for both, is followed.
    _, cwd = _repo(tmp_path)
    (cwd / "AGENTS.md").rename(cwd / "RULES.md")
    (cwd / "CLAUDE.md").symlink_to("RULES.md")
    core, notices = await _turn(cwd)
    assert "LEAF" in _system(core) and notices == []
    await core.close()


async def test_a_fifo_for_instructions_is_refused_without_waiting(tmp_path):
    _, cwd = _repo(tmp_path)
    (cwd / "AGENTS.md").unlink()
    os.mkfifo(cwd / "AGENTS.md")
    core, notices = await _turn(cwd)
    assert "ROOT:" in _system(core)
    assert f"instructions: {cwd}/AGENTS.md not read: not a regular file" in notices
    await core.close()


# ---- skills -------------------------------------------------------------------------------------


def _skill(root: Path, name: str, description: str, body: str = "", front: str | None = None) -> Path:
    path = root / name / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = front if front is not None else f"name: {name}\ndescription: {json.dumps(description)}\n"
    path.write_text(f"---\n{head}---\n{body}")
    return path


async def test_a_skill_is_offered_by_description_and_its_body_read_on_demand_in_the_sandbox(tmp_path, ollie_dirs):
    _, cwd = _repo(tmp_path)
    user = _skill(ollie_dirs / "cfg" / "skills", "pdf-forms", "Fill in PDF forms", "STEP 1: use pdftk.\n")
    project = _skill(cwd / ".ollie" / "skills", "release", "Cut a release: tag: vX.Y", "STEP R: bump the version.\n")
    offered = {}

    def cat(path: Path) -> dict:
        return {"name": "execute_code", "arguments": {"steps": [{"code": f"cat {path}"}]}}

    script = [{"tool_calls": [cat(user)]}, {"tool_calls": [cat(project)], "expect": "STEP 1: use pdftk."}]
    script.append({"text": "done", "expect": "STEP R: bump the version."})
    core, notices = await _turn(cwd, script=script)
    sent = _system(core)
    for line in sent.splitlines():
        if m := re.fullmatch(r"- ([\w.-]+): (.*) \((/.*/SKILL\.md)\)", line):
            offered[m[1]] = (m[2], m[3])
    assert offered == {
        "pdf-forms": ("Fill in PDF forms", str(user)),
        "release": ("Cut a release: tag: vX.Y", str(project)),
    }
    assert "STEP 1" not in sent and "STEP R" not in sent  # the bodies only when read
    core.backend.assert_consumed()  # both bodies were read by sandboxed stages, as the model asked
    assert notices == []
    await core.close()


async def test_a_projects_skill_never_hides_the_users_and_bad_ones_are_named(tmp_path, ollie_dirs):
    _, cwd = _repo(tmp_path)
    _skill(ollie_dirs / "cfg" / "skills", "deploy", "The user's deploy")
    project = cwd / ".claude" / "skills"
    _skill(project, "deploy", "A planted deploy")
    _skill(project, "nodesc", "", front="name: nodesc\n")
    _skill(project, "broken", "", front="name: [unclosed\n")
    _skill(project, "listy", "", front="- a\n- b\n")
    found, notices = skills.list_skills(str(cwd))
    assert [(s.name, s.description, s.project) for s in found] == [("deploy", "The user's deploy", False)]
    assert sorted(n.split(" left out: ")[1].split(":")[0] for n in notices) == [
        "its front matter has no description",
        "its front matter is not YAML",
        "its front matter is not a mapping of fields",
    ]
    core = await open_session(backend="scripted", script=[{"text": "x"}], cwd=str(cwd))
    listed = await commands.run(core, "skills")
    user = ollie_dirs / "cfg" / "skills" / "deploy" / "SKILL.md"
    assert listed.startswith(f"## deploy\ndescription: The user's deploy\npath: {user}")
    assert "nodesc" in listed  # and why it was left out
    await core.close()


def test_the_shipped_skill_parses_and_says_when_to_use_it(monkeypatch):
    monkeypatch.setenv("OLLIE_SKILLS_PATH", str(PACKAGE_DEFAULTS / "skills"))
    found, notices = skills.list_skills()
    assert notices == [] and [s.name for s in found] == ["delegate"]
    assert "sub-agents" in found[0].description and "$OLLIE" in found[0].description


# ---- the namespace, through the session's own view -----------------------------------------------


def _install(cfg: Path) -> None:
    """What `ollie init` installs that these tests use: the tool scripts and the skills."""
    shutil.copytree(PACKAGE_DEFAULTS / "tools", cfg / "tools", dirs_exist_ok=True)
    shutil.copytree(PACKAGE_DEFAULTS / "skills", cfg / "skills", dirs_exist_ok=True)


async def test_sk_idx_lists_the_sessions_skills_in_its_view(h):
    _install(h.cfg)
    _skill(h.work / ".ollie" / "skills", "local-one", "A project's own")
    session = await h.new()
    idx = await h.ok(session, "cat $OLLIE/sk/idx")
    assert "## delegate\ndescription: Split a task among sub-agents" in idx
    assert f"## local-one\ndescription: A project's own\npath: {h.work}/.ollie/skills/local-one/SKILL.md\n" in idx
    assert "# Delegating to sub-agents" in await h.ok(session, "cat $OLLIE/sk/delegate/SKILL.md")


async def test_review_three_files_with_sub_agents_from_what_the_prompt_says(h):
    """The only instruction is the task; the scripted model may use only names its system prompt
    or a tool's description mentions (checked below), and gets the reviews back."""
    _install(h.cfg)
    for name in ("a.py", "b.py", "c.py"):
        (h.work / name).write_text(f"print('{name}')\n")
    shipped = json.loads((PACKAGE_DEFAULTS / "agents" / "default.json").read_text())
    reviewer = json.loads((PACKAGE_DEFAULTS / "agents" / "reviewer.json").read_text())
    (h.cfg / "reviewer.script.json").write_text(json.dumps({"rules": [{"match": r"\.py", "text": "fine. LGTM"}]}))
    reviewer.update(backend="scripted", model=str(h.cfg / "reviewer.script.json"))
    (h.cfg / "agents" / "reviewer.json").write_text(json.dumps(reviewer))
    spawn = ["--agent", "reviewer", "Review a.py", "Review b.py", "Review c.py"]
    turns = [
        {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"tool": "subagent_spawn", "args": spawn}]}}]},
        {"text": "All three reviewed: LGTM.", "expect": "## 3: Review c.py\nfine. LGTM"},
    ]
    (h.cfg / "lead.script.json").write_text(json.dumps(turns))
    shipped.update(backend="scripted", model=str(h.cfg / "lead.script.json"))
    (h.cfg / "agents" / "lead.json").write_text(json.dumps(shipped))
    session = await h.new(agent="lead")
    core = await session.wake()
    await core.submit("review these three files with sub-agents: a.py, b.py, c.py")
    core.backend.assert_consumed()
    assert session.messages()[-1].content == "All three reviewed: LGTM."
    told = _system(core) + "\n".join(t.description for t in core.backend.tools_seen[0])
    used = ["execute_code", "subagent_spawn", "--agent", "reviewer"]
    assert [name for name in used if name not in told] == []
    assert "$OLLIE" in told and "sk/idx" in told and "- reviewer: Reviews code" in told


def test_the_mount_shows_each_skill_and_its_files_read_only(fs_server):
    skill = _skill(fs_server.cfg / "skills", "lint", "Lint the project", "Run lint.sh.\n")
    (skill.parent / "lint.sh").write_text("#!/bin/sh\nruff check .\n")
    sk = fs_server.mnt / "sk"
    try:
        assert "## lint\ndescription: Lint the project\npath: " in (sk / "idx").read_text()
        assert "lint" in os.listdir(sk) and (sk / "lint").is_dir()
        assert sorted(os.listdir(sk / "lint")) == ["SKILL.md", "lint.sh"]
        assert (sk / "lint" / "SKILL.md").read_text().endswith("Run lint.sh.\n")
        with pytest.raises(PermissionError):
            (sk / "lint" / "SKILL.md").write_text("changed")
        with pytest.raises(OSError):
            (sk / "new.md").write_text("x")
    finally:
        shutil.rmtree(skill.parent)


def test_a_projects_skills_directory_that_is_a_link_is_not_listed(tmp_path, ollie_dirs):
    """A planted `.claude -> ~/.config/ollie` would list ollie's hidden directories by name (in the
    notices the session's own chat shows); a link there is passed over whole."""
    _, cwd = _repo(tmp_path)
    _skill(ollie_dirs / "cfg" / "skills", "mine", "The user's own")
    (cwd / ".claude").symlink_to(ollie_dirs / "cfg")
    (cwd / ".ollie").mkdir()
    (cwd / ".ollie" / "skills").symlink_to(ollie_dirs / "cfg" / "skills")
    found, notices = skills.list_skills(str(cwd))
    assert [(s.name, s.project) for s in found] == [("mine", False)] and notices == []


def test_a_skill_folder_linked_out_of_the_project_is_left_out_by_name(tmp_path, ollie_dirs):
    """Red-team pass, stop 57: a link planted as a skill folder led the read of its SKILL.md
    anywhere (your `~/.claude/skills`, another project's), and its description into the prompt the
    session's own view serves back; a folder is now reached through no symlink."""
    _, cwd = _repo(tmp_path)
    private = _skill(tmp_path / "home" / ".claude" / "skills", "deploy-prod", "ssh with password SECRET-PW")
    _skill(cwd / ".claude" / "skills", "own", "The project's own")
    (cwd / ".claude" / "skills" / "x").symlink_to(private.parent)
    found, notices = skills.list_skills(str(cwd))
    assert [s.name for s in found] == ["own"]
    assert notices == [f"skill {cwd}/.claude/skills/x/SKILL.md left out: it is reached through a symlink"]


async def test_a_cwd_swapped_for_a_link_gives_no_instructions_from_where_it_leads(tmp_path):
    """Red-team pass, stop 57: a sub-session's cwd, judged a real directory, was swapped by its
    parent's code for a link to `~/.claude` before the instructions were read through it: your
    CLAUDE.md in a prompt the code reads back with `sp`."""
    _, cwd = _repo(tmp_path)
    private = tmp_path / "home" / ".claude"
    private.mkdir(parents=True)
    (private / "CLAUDE.md").write_text("SECRET-NOTES\n")
    core, _ = await _turn(cwd, script=[{"text": "one"}, {"text": "two"}])
    sub = cwd / "sub"
    sub.mkdir()
    core.session.set_cwd(str(sub))
    sub.rmdir()
    sub.symlink_to(private)
    notices: list[str] = []
    core.subscribe(lambda e: notices.append(e.text) if e.kind == "info" else None)
    await core.submit("again")
    assert "SECRET-NOTES" not in core.backend.requests[1][0].content
    assert f"instructions: {sub}/AGENTS.md not read: it is reached through a symlink" in notices
    await core.close()


async def test_the_projects_files_are_read_off_the_event_loop(tmp_path, monkeypatch):
    """Red-team pass, stop 57: links planted as skill folders into ollie's own mount stopped the
    server's loop, which serves that mount (for good once anything else used the mount meanwhile):
    the files code may write are read in a thread, at a session's start, a cwd change and `/skills`."""
    import threading

    from ollie import project

    _, cwd = _repo(tmp_path)
    readers: list[bool] = []
    real = project.read_text

    def watched(*args, **kw):
        readers.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kw)

    monkeypatch.setattr(project, "read_text", watched)
    monkeypatch.setattr(skills, "read_text", watched)
    _skill(cwd / ".claude" / "skills", "own", "The project's own")
    core, _ = await _turn(cwd)
    assert "LEAF" in _system(core)
    assert "own" in (await commands.run(core, "skills") or "")
    other = tmp_path / "other"
    other.mkdir()
    assert await commands.run(core, "cwd", str(other)) == f"cwd: {other}"
    assert readers and not any(readers), readers
    await core.close()
