"""Round 3 of the sandbox's attacks, each tried from inside a real sandboxed stage or a real
session's view: a sub-agent's cwd decided by path and used later (a race won with
RENAME_EXCHANGE), ollie's hidden directories given as a cwd or a grant, grants that follow a link
the sandbox planted, and metadata (modes, times, extended attributes) changed outside the grants."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from agent_helpers import running
from ollie import sandbox
from ollie.paths import identities
from ollie.sandbox import repository, userconfig
from ollie.tools import CallContext, execute
from sandbox_helpers import API_KEY, SECRET, write_policy
from view_helpers import start_child

pytestmark = pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="needs Landlock ABI 6 (Linux 6.12)")

# A stage's racer: swaps `sub` (a directory) and `link` (a symlink to the target) with
# renameat2(RENAME_EXCHANGE) as fast as it can, for `seconds`.
RACER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(sys.argv[1])
end = time.time() + float(sys.argv[2])
while time.time() < end:
    libc.renameat2(-100, b"sub", -100, b"link", 2)
"""


async def call(
    cwd: Path, code: str, tmpdir: Path, policies: tuple[str, ...] = ("default",), language: str = "bash", **extra
):
    """One stage in a fresh execute server (a fresh sandbox: as after a restart)."""
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), session_id="s", tmpdir=str(tmpdir), policies=policies)
    try:
        steps = [{"code": code, "language": language}]
        return await server.call_tool("execute_code", {"steps": steps, **extra}, ctx)
    finally:
        await server.close()


# ---- 1. a sub-agent's cwd is decided once, by descriptor --------------------------------------------


async def test_a_sub_sessions_cwd_cannot_be_raced_out_of_its_parents(h):
    """The parent's code swaps a directory of its cwd with a link to a secret place while it asks
    for a sub-session there (`new cwd=`, `s/new`, and a sub-session's `ctl cwd`), hundreds of
    times: no sub-session may ever land where the link points."""
    target = h.root / "precious"
    target.mkdir()
    (h.work / "sub").mkdir(exist_ok=True)
    os.symlink(target, h.work / "link")
    (h.work / "racer.py").write_text(RACER)
    parent = await h.new()
    child = await start_child(h, parent, f"cwd={h.work}/sub")
    attempts = textwrap.dedent(f"""\
        python3 racer.py {h.work} 6 & racer=$!
        won=0
        for i in $(seq 150); do
            echo "cwd {h.work}/sub" > $OLLIE/s/{child.id}/ctl 2>/dev/null
            grep -q precious $OLLIE/s/{child.id}/cfg && won=$((won + 1))
            if id=$(python3 -c '
        import os, sys
        fd = os.open(os.environ["OLLIE"] + "/ctl", os.O_RDWR)
        try:
            os.write(fd, b"new cwd={h.work}/sub")
        except OSError:
            sys.exit(1)
        print(os.read(fd, 200).decode().strip())') && [ -n "$id" ]; then
                grep -q precious $OLLIE/s/$id/cfg && won=$((won + 1))
                echo "kill $id" > $OLLIE/ctl
            fi
        done
        kill $racer; wait
        echo won=$won""")
    out = await h.ok(parent, attempts)
    assert out.strip().endswith("won=0"), out
    for session in h.sessions.all():
        cwd = session.settings()["cwd"]
        assert cwd == str(h.work) or cwd.startswith(f"{h.work}/"), cwd
        assert "precious" not in cwd


async def test_a_sub_sessions_cwd_is_never_one_of_ollies_hidden_directories(h, monkeypatch):
    """A parent in $HOME (the threat model's own example) asks for sub-agents whose cwd is ollie's
    configuration or its data, through ctl, s/new, a sub-session's ctl and b/new alike."""
    cfg, data = h.work / ".config" / "ollie", h.work / ".local" / "share" / "ollie"
    for path in (cfg / "agents", data):
        path.mkdir(parents=True)
    (cfg / "env").write_text(f"OPENAI_API_KEY={API_KEY}\n")
    monkeypatch.setenv("OLLIE_CFG_PATH", str(cfg))
    monkeypatch.setenv("OLLIE_DATA_PATH", str(data))
    monkeypatch.setenv("OLLIE_AGENTS_PATH", str(h.cfg / "agents"))
    parent = await h.new()
    child = await start_child(h, parent, f"cwd={h.work}/sub")
    for where in (cfg, cfg / "agents", data):
        out = await h.sh(
            parent,
            f"""echo "new cwd={where}" > $OLLIE/ctl; printf 'cwd={where}\\n' > $OLLIE/s/new
            echo "cwd {where}" > $OLLIE/s/{child.id}/ctl; printf 'cwd={where}\\n---\\nhi\\n' > $OLLIE/b/new
            cat $OLLIE/s/$OLLIE_SESSION_ID/chat""",
        )
        assert out[1].count("ollie's own directory") >= 3, out
    assert [s.settings()["cwd"] for s in h.sessions.all()] == [str(h.work), f"{h.work}/sub"]
    assert not h.jobs.all()


async def test_a_session_never_runs_code_in_a_hidden_directory(home, tmp_path):
    """Set by hand or stored by an older ollie, a cwd that is ollie's configuration runs nothing."""
    cfg = Path(os.environ["OLLIE_CFG_PATH"])
    for cwd in (cfg, cfg / "tools"):
        result = await call(cwd, "cat env ../env; echo ran", tmp_path)
        assert result.is_error and "ollie's own directory" in result.text() and "ran" not in result.text()


# ---- 2. a hidden directory is never granted ----------------------------------------------------------


async def test_no_policy_grants_one_of_ollies_hidden_directories(home, tmp_path):
    cfg = os.environ["OLLIE_CFG_PATH"]
    for grant in ("{OLLIE_CFG_PATH}", "{OLLIE_CFG_PATH}/agents", "{OLLIE_DATA_PATH}", f"{cfg}/../ollie/env"):
        write_policy("wide", f"filesystem:\n  rw: ['{grant}']\n")
        (Path(cfg) / "agents").mkdir(exist_ok=True)
        result = await call(tmp_path, f"cat {cfg}/env; echo ran", tmp_path, ("wide",), sandbox="wide")
        assert result.is_error and "ollie's own directory" in result.text(), (grant, result.text())
        assert API_KEY not in result.text()


async def test_the_jail_itself_refuses_to_show_a_hidden_directory(home, tmp_path):
    """The second layer: a confinement that names a hidden directory (as a bug in the first would)
    is refused by the jail, which mounts nothing from under a hidden directory but ollie's own."""
    cfg = os.environ["OLLIE_CFG_PATH"]
    boxes, jails = sandbox.Sandboxes(), sandbox.Jails()
    box = await boxes.get_async("default", str(tmp_path), "")
    st = os.stat(cfg)
    box.confinement.spec["expose"].append([cfg, True, False, False, st.st_dev, st.st_ino])
    try:
        jail = await jails.get(box.policy)
        with pytest.raises(sandbox.jail.JailError, match="one of ollie's hidden directories"):
            await jail.spawn(
                box.confinement, ["/bin/cat", f"{cfg}/env"], str(tmp_path), {}, stdin=0, stdout=1, stderr=2
            )
    finally:
        await jails.close()


async def test_an_agents_directory_in_the_project_is_hidden_and_cannot_be_moved(home, tmp_path, monkeypatch):
    """OLLIE_AGENTS_PATH inside the cwd: the code could read agent configs, or write one whose
    hooks run unsandboxed. Missing, it is made first, so that the code cannot make it."""
    project = home / "project"
    agents, later = project / "agents", project / "later-agents"
    agents.mkdir(parents=True)
    (agents / "dev.json").write_text('{"prompt": "the private prompt"}')
    monkeypatch.setenv("OLLIE_AGENTS_PATH", f"{agents}:{later}")
    evil = json.dumps({"hookSandbox": False, "hooks": {"preTurn": "touch /var/tmp/pwned"}})
    code = (
        f"cat agents/dev.json; echo '{evil}' > agents/evil.json; echo '{evil}' > later-agents/evil.json; "
        "mv agents agents.old; mv later-agents l2; ln -s /etc agents2; echo done"
    )
    result = await call(project, code, tmp_path)
    assert "private prompt" not in result.text() and "done" in result.text()
    assert result.text().count("Device or resource busy") == 2, result.text()
    assert sorted(p.name for p in agents.iterdir()) == ["dev.json"] and list(later.iterdir()) == []


# ---- 3. grants follow no link the sandbox can plant ---------------------------------------------------


async def test_a_grant_replaced_by_a_link_is_refused_not_followed(home, tmp_path):
    """The docs' own example, `rw: ["{HOME}/.cache/pip"]`, with a session in $HOME: the code
    replaces the cache with a link to ~/.ssh, and the next sandbox would write there."""
    (home / ".cache" / "pip").mkdir(parents=True)
    write_policy("wide", "filesystem:\n  rw: ['{HOME}/.cache/pip']\n")
    swap = "rm -r .cache/pip && ln -s ../.ssh .cache/pip && echo swapped"
    result = await call(home, swap, tmp_path, ("wide",), sandbox="wide")
    assert "Device or resource busy" in result.text()  # granted, it is a mount point in the jail
    result = await call(home, swap, tmp_path)  # but not under another policy, in another jail
    assert result.text() == "swapped\n"
    result = await call(
        home, "echo pwned > .cache/pip/authorized_keys; cat .cache/pip/id_rsa", tmp_path, ("wide",), sandbox="wide"
    )
    assert result.is_error and "through the symlink" in result.text() and "grant the real path" in result.text()
    assert SECRET not in result.text() and not (home / ".ssh" / "authorized_keys").exists()


async def test_a_tool_directory_in_the_project_swapped_for_a_link_grants_nothing(home, tmp_path, monkeypatch):
    project = home / "project"
    (project / "tools").mkdir(parents=True)
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(project / "tools"))
    result = await call(project, "echo x > tools/x; echo written", tmp_path)
    assert "Read-only file system" in result.text()  # read-only in the jail, inside the writable cwd
    (project / "tools").rmdir()
    os.symlink(home / ".ssh", project / "tools")  # as a stage of an earlier jail could have done
    result = await call(project, f"cat {project}/tools/id_rsa", tmp_path)
    assert result.is_error and "through the symlink" in result.text() and SECRET not in result.text()


async def test_a_user_grant_through_a_link_outside_the_sandboxs_reach_is_followed(home, tmp_path):
    """Links the user set up where no session's code writes (outside $HOME, outside every cwd: a
    cache on another disk) still work: refusing them would break ordinary setups."""
    real, links = tmp_path / "real-cache", tmp_path / "links"
    real.mkdir()
    links.mkdir()
    os.symlink(real, links / "pip")
    write_policy("wide", f"filesystem:\n  rw: ['{links}/pip']\n")
    cwd = home / "cwd"
    cwd.mkdir()
    result = await call(cwd, f"echo cached > {links}/pip/f && cat {real}/f", tmp_path, ("wide",), sandbox="wide")
    assert (result.is_error, result.text()) == (False, "cached\n")


# ---- 5. metadata stays as it is outside the grants ----------------------------------------------------


async def test_modes_times_and_attributes_outside_the_grants_cannot_change(home, tmp_path):
    ssh, key = home / ".ssh", home / ".ssh" / "id_rsa"
    key.chmod(0o600)
    before = {p: os.stat(p) for p in (ssh, key, Path("/usr/bin/env"))}
    code = textwrap.dedent(f"""\
        import os
        for what, act in [
            ("chmod .ssh", lambda: os.chmod("{ssh}", 0o777)),
            ("chmod key", lambda: os.chmod("{key}", 0o666)),
            ("setuid env", lambda: os.chmod("/usr/bin/env", 0o4755)),
            ("utime key", lambda: os.utime("{key}", (0, 0))),
            ("setxattr", lambda: os.setxattr("{key}", "user.x", b"1")),
            ("truncate", lambda: os.truncate("{key}", 0)),
        ]:
            try:
                act()
                print(what, "CHANGED")
            except OSError as e:
                print(what, e.strerror)
        """)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = await call(cwd, code, tmp_path, language="python3")
    assert "CHANGED" not in result.text() and result.text().count("Read-only file system") == 6, result.text()
    for path, st in before.items():
        now = os.stat(path)
        assert (now.st_mode, now.st_mtime_ns) == (st.st_mode, st.st_mtime_ns), path
    assert key.read_text() == SECRET


async def test_metadata_inside_the_grants_still_changes(run):
    result = await run("touch f && chmod 0751 f && touch -d 2001-01-01 f && stat -c '%a %Y' f")
    assert result.text() == "751 978307200\n", result.text()


async def test_the_renamed_files_of_a_writable_cwd_stay_within_it(home, tmp_path):
    """Read-only by mount is the first layer; what a cwd's files may become stays Landlock's."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = await call(cwd, f"mv {home}/.ssh/id_rsa ./k; ln {home}/.ssh/id_rsa ./hard; cat k hard", tmp_path)
    assert result.is_error and SECRET not in result.text()
    assert stat.S_ISREG(os.stat(home / ".ssh" / "id_rsa").st_mode)


# ---- 8. what a sub-agent may be ---------------------------------------------------------------------


async def test_a_sub_agent_runs_only_on_models_its_agent_allows(h, monkeypatch):
    """A cheap agent's code must not start a dear model (o1-pro) on the same key."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-unused")  # no request is made
    path = h.cfg / "agents" / "cheap.json"
    path.write_text(json.dumps({"backend": "openai", "model": "gpt-4.1-mini", "models": ["gpt-4.1"]}))
    parent = await h.new(agent="cheap")
    child = await start_child(h, parent, "model=gpt-4.1")  # listed under "models"
    assert child.settings()["model"] == "gpt-4.1"
    out = await h.fails(
        parent,
        f"""echo "new model=o1-pro" > $OLLIE/ctl; echo "model o1-pro" > $OLLIE/s/{child.id}/ctl
        printf 'model=o1-pro\\n---\\nhi\\n' > $OLLIE/b/new; cat $OLLIE/s/$OLLIE_SESSION_ID/chat; false""",
    )
    assert out.count("write error: Permission denied") == 3, out  # new, the sub-session's ctl, b/new's header
    assert out.count('runs on gpt-4.1-mini, gpt-4.1; list more under "models"') == 2, out  # new, and b/new
    assert child.settings()["model"] == "gpt-4.1" and len(h.sessions.all()) == 2 and not h.jobs.all()
    out = await h.fails(parent, f'echo "backend openai" > $OLLIE/s/{child.id}/ctl')  # to its default model?
    assert "write error: Permission denied" in out and child.settings()["model"] == "gpt-4.1"


# ---- found by the internal red team of round 3 -------------------------------------------------------


async def test_a_sub_agents_cwd_is_never_in_a_directory_kept_read_only(h, monkeypatch):
    """A sub-agent whose cwd lay inside a directory every jail keeps read-only (the virtualenv ollie
    runs from, in the project; the skills) got it bound writable: a sitecustomize.py there runs,
    unsandboxed and with the keys, in the user's next ollie command."""
    venv, skills = h.work / ".venv", h.work / "skills"
    (venv / "lib" / "site-packages").mkdir(parents=True)
    (skills / "review").mkdir(parents=True)
    (skills / "review" / "SKILL.md").write_text("be careful\n")
    monkeypatch.setattr(sandbox, "_PROTECTED", (*sandbox._PROTECTED, str(venv)))  # as sys.prefix is
    monkeypatch.setenv("OLLIE_SKILLS_PATH", str(skills))
    parent = await h.new()
    for cwd in (venv / "lib" / "site-packages", skills / "review"):
        out = await h.fails(parent, f'echo "new cwd={cwd}" > $OLLIE/ctl; cat $OLLIE/s/$OLLIE_SESSION_ID/chat; false')
        assert "which every sandbox keeps read-only" in out, out
    assert len(h.sessions.all()) == 1 and (skills / "review" / "SKILL.md").read_text() == "be careful\n"
    write_policy("wide", f"filesystem:\n  rw: ['{skills}/review']\n")  # nor may a policy grant one
    result = await call(h.work, "echo x >> skills/review/SKILL.md", h.root, ("wide",), sandbox="wide")
    assert result.is_error and "every sandbox keeps read-only" in result.text()


async def test_the_jails_mounts_are_made_by_descriptor_whatever_is_swapped_meanwhile(home, tmp_path):
    """The jail checked a grant by descriptor, then made it writable by path: a directory swapped for
    a link to / in between (RENAME_EXCHANGE, by another session's code, while a jail mounted its
    new cwd) made the jail's root mount writable, and a file outside every grant changeable. The
    window was narrow (the red team won once at try 334 through the view); here the swapping runs in
    one session's jail while another's mounts a thousand cwds, each then tried with a chmod."""
    work, outside = home / "work", Path(tempfile.mkdtemp(dir="/var/tmp", prefix="ollie-test-outside-"))
    tries = 1000
    try:
        (outside / "key").write_text("key\n")
        (outside / "key").chmod(0o600)
        for n in range(tries):
            (work / f"d{n}").mkdir(parents=True)
            os.symlink("/", work / f"l{n}")
        (work / "cur").write_text("0")
        # The swapping in one jail (in its own, a directory a jail mounted cannot be renamed).
        racing, server = execute.factory(str(work))(), execute.factory(str(work))()
        ctx = CallContext(cwd=str(work), session_id="s", tmpdir=str(tmp_path))
        swap = {"steps": [{"code": SWAPPER, "language": "python3"}], "timeout": 120}
        racer = asyncio.ensure_future(racing.call_tool("execute_code", swap, ctx))
        await asyncio.sleep(1)
        won = None
        for n in range(tries):
            (work / "cur").write_text(str(n))
            for _ in range(200):  # a sandbox is decided for a directory, never through the link
                if not (work / f"d{n}").is_symlink():
                    attempt = CallContext(cwd=str(work / f"d{n}"), session_id="s", tmpdir=str(tmp_path))
                    chmod = {"steps": [{"code": f"chmod 0666 {outside}/key"}]}
                    if (
                        "reached through a symlink"
                        not in (await server.call_tool("execute_code", chmod, attempt)).text()
                    ):
                        break
            if stat.S_IMODE(os.stat(outside / "key").st_mode) != 0o600:
                won = n
                break
        (work / "stop").touch()
        await racer
        await asyncio.gather(racing.close(), server.close())
        assert won is None, f"the jail's mounts were raced at try {won}"
    finally:
        shutil.rmtree(outside)


# Swaps d<cur> and l<cur> (a link to /) in the cwd, as fast as it can, until `stop` exists.
SWAPPER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
while not os.path.exists("stop"):
    n = open("cur").read().strip()
    a, b = f"d{n}".encode(), f"l{n}".encode()
    for _ in range(500):
        libc.renameat2(-100, a, -100, b, 2)
"""


async def test_a_grant_follows_no_link_another_policy_planted_in_home(h, monkeypatch):
    """A session in $HOME plants ~/.local/bin -> elsewhere (the built-in toolchain grant) and
    ~/.cache/pip -> elsewhere (the docs' own example grant); a sub-session in ~/proj, whose policy
    does not write $HOME, followed both: it read, and wrote, outside everything granted."""
    outside = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="ollie-test-outside-"))
    try:
        (outside / "secret").write_text("TOP-SECRET\n")
        monkeypatch.setenv("HOME", str(h.work))
        (h.work / "proj").mkdir()
        parent = await h.new()
        await h.ok(parent, f"mkdir -p .local .cache && ln -s {outside} .local/bin && ln -s {outside} .cache/pip")
        child = await start_child(h, parent, f"cwd={h.work}/proj")
        out = await h.fails(child, f"cat {outside}/secret")  # the toolchain grant is left out
        assert "TOP-SECRET" not in out
        from ollie.agent import hooks  # and the same session's hooks, which do not write $HOME either

        runner = hooks.Runner("hooks")
        try:
            _, stdout, _ = await hooks.run_command(f"cat {outside}/secret", {}, str(h.work), {}, 20, runner)
        finally:
            await runner.close()
        assert "TOP-SECRET" not in stdout
        write_policy(None, "filesystem:\n  rw: ['{HOME}/.cache/pip']\n")  # the user's grant is refused
        out = await h.fails(child, f"echo planted > {outside}/planted")
        assert "through the symlink" in out and not (outside / "planted").exists(), out
    finally:
        shutil.rmtree(outside)


async def test_a_sub_agents_cwd_on_the_servers_own_mount_is_refused_unlooked(h, monkeypatch):
    """A parent in $HOME asked for sub-agents in ~/mnt/ollie/s/x: each check looked the path up on
    the server's own FUSE mount, from the server's own loop (held 0.1-0.2 s each)."""
    monkeypatch.setenv("OLLIE", str(h.work / "mnt"))
    parent = await h.new()
    await h.fails(parent, f'echo "new cwd={h.work}/mnt/s" > $OLLIE/ctl')
    assert "on ollie's file server's mount" in parent.chat_path.read_text()


# ---- found by the second internal red team of round 3 ------------------------------------------------


async def test_the_view_keeps_its_rule_whatever_its_path_leads_to_later(h):
    """Every spawner's Landlock rule on the view was added by path: code that moved the view's
    directory aside in its jail's /tmp and planted a link there got the next spawner a rule on the
    link's target (read outside every grant)."""
    outside = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="ollie-test-outside-"))
    try:
        (outside / "id_rsa").write_text("PRIVATE-KEY\n")
        parent = await h.new()
        await h.ok(parent, "mkdir -p sub2")
        child = await start_child(h, parent, f"cwd={h.work}/sub")
        await h.sh(
            child, f'V=$OLLIE; mv "$(dirname $V)" /tmp/moved && mkdir -p "$(dirname $V)" && ln -s {outside} "$V"'
        )
        await h.ok(parent, f"echo 'cwd {h.work}/sub2' > $OLLIE/s/{child.id}/ctl")  # a new spawner in its jail
        _, out = await h.sh(child, f"cat {outside}/id_rsa")
        assert "PRIVATE-KEY" not in out
    finally:
        shutil.rmtree(outside)


async def test_the_memory_follows_no_link_even_when_the_cwd_holds_ollies_data(h, monkeypatch, tmp_path):
    """A session in $HOME (data at ~/.local/share/ollie): the memory, hidden again with the data
    and shown again from under it, lost its nosymfollow."""
    monkeypatch.setenv("OLLIE_DATA_PATH", str(h.work / ".local" / "share" / "ollie"))
    session = await h.new()
    out = await h.sh(
        session, "echo in-cwd > target; ln -sfn $PWD/target $OLLIE_MEMORY_DIR/planted; cat $OLLIE_MEMORY_DIR/planted"
    )
    assert "in-cwd" not in out[1], out


async def test_a_tool_or_skill_directory_configured_but_missing_is_made_before_code_runs(h, monkeypatch):
    """OLLIE_TOOLS_PATH and OLLIE_SKILLS_PATH naming directories of the project that did not exist
    yet: the code made them and planted a tool that other sessions ran, and a skill."""
    tools, skills = h.work / ".ollie" / "tools", h.work / ".ollie" / "skills"
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(tools))
    monkeypatch.setenv("OLLIE_SKILLS_PATH", str(skills))
    session = await h.new()
    out = await h.fails(session, f"printf '#!/bin/sh\\necho planted\\n' > {tools}/run_tests && mkdir {skills}/x")
    assert "Read-only file system" in out and tools.is_dir() and not (tools / "run_tests").exists()


async def test_renaming_a_session_keeps_its_jobs_its_own(h):
    """A renamed session's jobs were cut loose: gone from its b/, out of its bounds, never cancelled."""
    parent = await h.new()
    await h.ok(parent, "printf 'name=slow\\n---\\nwork\\n' > $OLLIE/b/new")
    (job,) = h.jobs.all()
    await h.sessions.rename(parent.id, "lead")
    assert job.record.parent == "lead" and h.jobs.of(parent) == [job]
    assert (await h.ok(parent, "ls $OLLIE/b")).split() == [job.id]


def test_a_sub_agents_odd_cwd_is_never_looked_up_by_its_raw_path(fs_server):
    """`cwd=$PWD/l/../x`, l a link to the server's own mount: the check resolved it by descriptor,
    then the server stat'ed the raw path (following l) on its loop: a request to itself."""
    attacker = fs_server.new_session()
    ask = "for i in 1 2 3; do printf 'cwd=%s/l/../x\\n' $PWD > $OLLIE/s/new; done; echo done-asking"
    (fs_server.mnt / "s" / attacker / "prompt").write_text(f"!mkdir -p x; ln -sfn {fs_server.mnt}/s l; {ask}\n")
    chat = fs_server.mnt / "s" / attacker / "chat"
    for _ in range(200):
        if "done-asking" in chat.read_text():
            break
        time.sleep(0.05)
    assert "done-asking" in chat.read_text() and "EDEADLK" not in fs_server.log()


async def test_the_server_reaching_into_a_jails_view_is_refused_not_served(h):
    """A request on a session's view from outside its jail (pid 0 there): the server itself, led
    through /proc/<pid>/root into the view by a link its code planted, would wait on its own loop."""
    session = await h.new()
    # a duration of its own: `sleep 3` also matched a `sleep 30` another test's jail still ran
    running_stage = asyncio.ensure_future(h.sh(session, "sleep 3.25"))
    try:
        for _ in range(100):
            pids = [p for p in running("sleep 3.25") if os.path.exists(f"/proc/{p}/root")]
            if pids:
                break
            await asyncio.sleep(0.05)
        view = f"/proc/{pids[0]}/root{os.environ['OLLIE']}"
        with pytest.raises(PermissionError):
            await asyncio.wait_for(asyncio.to_thread(os.listdir, view + "/s"), 10)
    finally:
        await running_stage


# ---- the work tree above a cwd (`{REPO}`) -----------------------------------------------------------------


def git_repo(root: Path, *tracked: str) -> Path:
    """A git repository at `root` whose index holds `tracked` (files made with their directories)."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for name in tracked:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"{name}\n")
    if tracked:
        subprocess.run(["git", "-C", str(root), "add", *tracked], check=True)
    return root


async def test_a_repository_at_home_or_in_a_shared_directory_grants_nothing_above_the_cwd(home, tmp_path):
    """A dotfiles repository at $HOME would grant all of it (~/.ssh among it); a `.git` another
    user may make (in /tmp, in a directory of theirs or of a group's) is no repository of yours."""
    git_repo(home, "project/README")
    cwd = home / "project" / "sub"
    cwd.mkdir(parents=True)
    result = await call(cwd, "git status 2>&1 | head -1; cat ~/.ssh/id_rsa ../README 2>&1", tmp_path)
    assert "not a git repository" in result.text() and SECRET not in result.text()
    assert sandbox.repository_root(str(cwd), str(home)) == ""
    linked_home = tmp_path / "home-link"  # $HOME through a link, the cwd a real path
    linked_home.symlink_to(home)
    assert sandbox.repository_root(str(cwd), str(linked_home)) == ""
    git_repo(home / ".config", "nvim/init.lua")  # ~/.config kept in git: gh's token is there
    assert sandbox.repository_root(str(home / ".config" / "nvim"), str(home)) == ""
    outside = git_repo(tmp_path / "srv" / "mono", "p/README")  # not below $HOME (as root: /etc in git)
    assert sandbox.repository_root(str(outside / "p"), str(home)) == ""
    shared = git_repo(home / "shared", "p/README")
    assert sandbox.repository_root(str(shared / "p"), str(home)) == str(shared)
    for mode, owner in ((0o1777, None), (0o775, 65534), (0o755, 65534)):
        shared.chmod(mode)
        os.chown(shared, owner if mode == 0o755 else os.geteuid(), owner if owner else os.getegid())
        assert sandbox.repository_root(str(shared / "p"), str(home)) == "", (oct(mode), owner)
    os.chown(shared, os.geteuid(), os.getegid())
    shared.chmod(0o755)
    assert sandbox.repository_root(str(shared / "p"), str(home)) == str(shared)
    # an ACL letting uid 65534 write (its mask is what the group's bits then show: 755 stays 775)
    user_obj, user, group_obj, mask, other = 0x01, 0x02, 0x04, 0x10, 0x20
    entries = [(user_obj, 7, 0xFFFFFFFF), (user, 7, 65534), (group_obj, 5, 0xFFFFFFFF), (mask, 7, 0xFFFFFFFF)]
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in [*entries, (other, 5, 0xFFFFFFFF)])
    os.setxattr(shared, "system.posix_acl_access", acl)
    assert sandbox.repository_root(str(shared / "p"), str(home)) == ""
    os.removexattr(shared, "system.posix_acl_access")
    os.chown(shared / ".git", 65534, 65534)  # a `.git` another user made: not the user's repository
    assert sandbox.repository_root(str(shared / "p"), str(home)) == ""
    assert sandbox.repository_root(str(cwd), "/") == ""  # $HOME=/ (a container's user without one)


def test_a_dotfiles_repository_is_never_granted_whole(home):
    """Kept in git and linked into place (`stow`): ~/.config/gh/hosts.yml, or ollie's own env file,
    lies in the repository. A session in one of its packages gets its cwd, not the repository:
    told by a link from $HOME into it (to it, or through a bind mount of $HOME), or by its name
    or a dotfiles manager's file at its root."""
    conf = git_repo(home / "conf", "gh/.config/gh/hosts.yml", "nvim/.config/nvim/init.lua", "fish/x.fish")
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == str(conf)  # nothing linked yet
    assert sandbox.repository_root(str(conf / "nvim" / ".config" / "nvim"), str(home)) == ""  # a dot-directory
    for link, target in (
        (home / ".config" / "gh" / "hosts.yml", conf / "gh" / ".config" / "gh" / "hosts.yml"),
        (home / ".config" / "fish" / "conf.d" / "x.fish", conf / "fish" / "x.fish"),  # three levels down
        (home / ".confrepo", conf),  # the root itself
    ):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        repository._linked.clear()  # what was seen a moment ago is kept for 5 s
        assert sandbox.repository_root(str(conf / "nvim"), str(home)) == "", link
        link.unlink()
    repository._linked.clear()
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == str(conf)
    (conf / ".stowrc").write_text("--target=~\n")
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == ""
    dotfiles = git_repo(home / "dotfiles", "nvim/init.lua")
    assert sandbox.repository_root(str(dotfiles / "nvim"), str(home)) == ""


def test_the_work_tree_is_the_project_the_repository_tracks_not_a_stray_one_around_it(home):
    """Code writes its cwd: were the cwd's own `.git` looked at, making it a file (or removing it)
    would make its next sandbox, or a sub-agent's there, read the repository around it. What
    decides is what the repository around it tracks (its index, which code below its root cannot
    write): a stray `git init` in ~/work, tracking nothing of a project, grants none of them the
    others' files; a monorepo's package, tracked, gets its root. Index formats 2 to 4 are read."""
    outer = git_repo(home / "work", "vendor/README")
    lib = outer / "vendor" / "lib"
    git_repo(lib)
    assert sandbox.repository_root(str(lib), str(home)) == str(outer)
    shutil.rmtree(lib / ".git")
    (lib / ".git").write_text("gitdir: elsewhere\n")
    assert sandbox.repository_root(str(lib), str(home)) == str(outer)
    stray = git_repo(home / "src")  # nothing added
    client = git_repo(stray / "client-a", "app.py")
    (stray / "client-b").mkdir()
    (stray / "client-b" / ".env").write_text("SECRET=1\n")
    assert sandbox.repository_root(str(client), str(home)) == ""
    (client / "sub").mkdir()
    assert sandbox.repository_root(str(client / "sub"), str(home)) == ""  # nothing of it tracked yet
    git_repo(client, "sub/x.py")
    assert sandbox.repository_root(str(client / "sub"), str(home)) == str(client)
    for version in ("3", "4", "2"):
        subprocess.run(["git", "-C", str(outer), "update-index", "--index-version", version], check=True)
        assert sandbox.repository_root(str(lib), str(home)) == str(outer), version
    index = outer / ".git" / "index"
    index.write_bytes(b"DIRC\0\0\0\x04\0\0\0\x05" + b"\xff" * 80)
    assert sandbox.repository_root(str(lib), str(home)) == ""


def test_an_index_planted_by_code_that_writes_the_root_stalls_and_fills_nothing(home):
    """A parent session's code writes its cwd, and so the `.git` a sub-agent's search reads: a
    FIFO there would hold the sandbox builder's thread (every session's) in its open, a sparse
    file of terabytes would be read into memory."""
    repo = git_repo(home / "parent", "sub/x")
    index = repo / ".git" / "index"
    index.unlink()
    os.mkfifo(index)
    found: list[str] = []
    looking = threading.Thread(target=lambda: found.append(sandbox.repository_root(str(repo / "sub"), str(home))))
    looking.daemon = True
    looking.start()
    looking.join(10)
    assert found == [""]
    index.unlink()
    with open(index, "wb") as f:
        f.truncate(repository.INDEX_LIMIT + 1)
    assert sandbox.repository_root(str(repo / "sub"), str(home)) == ""


def test_no_work_tree_for_tool_servers_nor_one_holding_ollies_configuration(home, monkeypatch):
    """A stdio tool server (the network, its secrets) would run a program planted in the tree (a
    .venv/bin on PATH); a tree holding ollie's configuration (its directory `stow`ed, not linked)
    is left out, for code run without a jail would read it."""
    repo = git_repo(home / "conf", "nvim/init.lua")
    assert str(repo) not in sandbox.load_policy("tools", str(repo / "nvim"), "").paths["rox"]
    policy = sandbox.load_policy("default", str(repo / "nvim"), "")
    assert str(repo) in policy.paths["rox"]
    (repo / "ollie").mkdir()
    decided = sandbox.grants.decide(policy, identities([str(repo / "ollie")]), {})
    try:
        assert [g.path for g in decided if g.given == str(repo)] == []
        assert any(g.given == str(repo / "nvim") for g in decided)  # the cwd granted as ever
    finally:
        sandbox.grants.close(decided)


def test_a_work_tree_swapped_for_a_link_before_its_grant_is_left_out(home, tmp_path):
    """The work tree is found from the cwd by path, then opened as the cwd is, following no
    link: one swapped in meanwhile grants nothing, not the link's target."""
    repo = git_repo(home / "srv" / "mono", "pkg/README")
    policy = sandbox.load_policy("default", str(repo / "pkg"), "")
    assert policy.repo == str(repo) and str(repo) in policy.paths["rox"]
    repo.rename(home / "srv" / "moved")
    repo.symlink_to(home / ".ssh")
    others = dataclasses.replace(policy, paths={**policy.paths, "rwx": ()})  # the cwd moved away with it
    decided = sandbox.grants.decide(others, {}, {})
    try:
        assert [g for g in decided if g.given == str(repo) or ".ssh" in g.path] == []
        assert any(g.given == "/usr" for g in decided)  # the rest decided as ever
    finally:
        sandbox.grants.close(decided)


def test_the_look_for_dotfiles_links_never_waits_on_a_far_file_system(home, fs_server):
    """A link in $HOME into a FUSE or network mount whose server no longer answers (an sshfs whose
    host is gone; here ollie's own mount, its server stopped): following it would hold the
    builder's thread, every session's, for good."""
    conf = git_repo(home / "conf", "nvim/init.lua")
    (home / "remote").symlink_to(fs_server.mnt / f"never-looked-up-{os.getpid()}")
    os.kill(fs_server.pid(), signal.SIGSTOP)
    try:
        found: list[str] = []
        looking = threading.Thread(target=lambda: found.append(sandbox.repository_root(str(conf / "nvim"), str(home))))
        looking.daemon = True
        looking.start()
        looking.join(10)
        assert found == [str(conf)]
    finally:
        os.kill(fs_server.pid(), signal.SIGCONT)


def within_seconds(fn, seconds: float = 10):
    """What `fn()` returns, run in a thread: AssertionError if it has not returned in `seconds`."""
    found: list = []
    worker = threading.Thread(target=lambda: found.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert found, f"still running after {seconds} s"
    return found[0]


def test_a_crafted_index_costs_little_and_tracks_nothing():
    """Who writes a repository's `.git` (a parent session's code, for a sub-agent below it) writes
    its index: the builder thread, every session's, reads it. A format-4 path length of endless
    continuation bytes (quadratic in Python's integers), paths that grow by a byte an entry (their
    set grew quadratically in memory), a path longer than any file's."""
    head = b"DIRC" + struct.pack(">II", 4, 1)
    entry = bytes(40 + 20) + struct.pack(">H", 1)
    endless = head + entry + b"\xff" * 2_000_000 + b"\0"
    assert within_seconds(lambda: repository.index_tracks(endless, 20, b"pkg")) is False
    count = 200_000
    growing = b"DIRC" + struct.pack(">II", 4, count) + (entry + b"\0a\0") * count
    assert within_seconds(lambda: repository.index_tracks(growing, 20, b"pkg")) is False
    long_path = b"DIRC" + struct.pack(">II", 2, 1) + entry + b"a" * 5000 + bytes(8)
    assert repository.index_tracks(long_path, 20, b"a" * 5000) is False
    one = b"DIRC" + struct.pack(">II", 2, 1) + entry + b"pkg/x" + bytes(3)
    assert repository.index_tracks(one, 20, b"pkg") is True  # the same shape, well formed


def test_the_look_for_dotfiles_links_is_bounded_and_reads_no_proc_file(home, tmp_path):
    """A link from $HOME to a directory hundreds of levels deep is not walked up to the root (it
    counts as leading into the tree: granting less is the error to make); an index that is a
    link to a file of /proc (which says it holds nothing, then gives gigabytes) is not read."""
    conf = git_repo(home / "conf", "nvim/init.lua")
    deep, before = tmp_path / "deep", os.getcwd()
    deep.mkdir()
    os.chdir(deep)
    try:
        for _ in range(repository.LEVELS + 10):
            os.mkdir("d")
            os.chdir("d")
        bottom = os.getcwd()
    finally:
        os.chdir(before)
    (home / ".deep").symlink_to(bottom)
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == ""
    (home / ".deep").unlink()
    repository._linked.clear()
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == str(conf)
    (conf / ".git" / "index").unlink()
    (conf / ".git" / "index").symlink_to("/proc/self/pagemap")
    assert within_seconds(lambda: sandbox.repository_root(str(conf / "nvim"), str(home))) == ""


def test_nothing_the_search_reads_waits_on_a_far_file_system_even_through_links(home, fs_server):
    """Its server stopped, ollie's own mount stands for an sshfs whose host is gone: an index that
    is a link there (planted where a parent's code writes), or a link from $HOME that reaches it
    through another link, would hold the builder's thread, every session's, for good."""
    conf = git_repo(home / "conf", "nvim/init.lua")
    (home / "hop").symlink_to(fs_server.mnt / f"never-looked-up-{os.getpid()}")
    (home / ".cfgdir").mkdir()
    (home / ".cfgdir" / "evil").symlink_to(home / "hop")
    parent = git_repo(home / "parent", "sub/x")
    (parent / ".git" / "index").unlink()
    (parent / ".git" / "index").symlink_to(fs_server.mnt / f"index-{os.getpid()}")
    os.kill(fs_server.pid(), signal.SIGSTOP)
    try:
        assert within_seconds(lambda: sandbox.repository_root(str(conf / "nvim"), str(home))) == str(conf)
        assert within_seconds(lambda: sandbox.repository_root(str(parent / "sub"), str(home))) == ""
    finally:
        os.kill(fs_server.pid(), signal.SIGCONT)


def test_the_look_for_dotfiles_links_sees_all_of_home_and_passes_over_odd_links(home, monkeypatch):
    """A $HOME of thousands of files is looked at whole, and on NFS too (its own mount is not one
    to keep away from); a link that loops or leads through a file leads nowhere, and takes the
    work tree from no one."""
    conf = git_repo(home / "conf", "zsh/zshrc", "nvim/init.lua")
    for n in range(3000):
        (home / f"file{n:04}").touch()
    (home / ".zshrc").symlink_to(conf / "zsh" / "zshrc")
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == ""
    (home / ".zshrc").unlink()
    repository._linked.clear()
    (home / ".loop").symlink_to(".loop")
    (home / ".through-a-file").symlink_to(home / "file0001" / "x")
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == str(conf)
    (home / ".zshrc").symlink_to(conf / "zsh" / "zshrc")
    repository._linked.clear()
    monkeypatch.setattr(repository.config, "mounts", lambda: [("/", "ext4"), (str(home), "nfs4")])
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == ""


def test_what_the_search_reads_of_a_repository_costs_little_and_counts_loops_into_it(home):
    """A `.git/config` of blank lines (a regular expression whose spaces spanned lines took an
    hour on a megabyte); a link of $HOME's into the tree that its code made a loop still says
    dotfiles; a link to a project's program in ~/.local/bin says nothing; the deepest mount holding
    a path decides whether it is far (an autofs /home is, the NFS $HOME in it is not)."""
    conf = git_repo(home / "conf", "zsh/zshrc", "nvim/init.lua", "bin/tool")
    with open(conf / ".git" / "config", "a") as f:
        f.write("\n" * 1_000_000)
    assert within_seconds(lambda: sandbox.repository_root(str(conf / "nvim"), str(home))) == str(conf)
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "tool").symlink_to(conf / "bin" / "tool")
    repository._linked.clear()
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == str(conf)
    (conf / "zsh" / "zshrc").unlink()
    (conf / "zsh" / "zshrc").symlink_to("zshrc")  # a loop, made by code in conf/zsh
    (home / ".zshrc").symlink_to(conf / "zsh" / "zshrc")
    repository._linked.clear()
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == ""
    mounts = [("/", "ext4"), ("/autohome", "autofs"), (f"/autohome/{home.name}", "nfs4")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repository.config, "mounts", lambda: mounts)
        near = repository._mounts([f"/autohome/{home.name}"])
    assert repository._is_far(f"/autohome/{home.name}/.config/x", near) is False
    assert repository._is_far("/autohome/someone-else/tools/x", near) is True


def test_the_walk_up_from_the_cwd_follows_no_link_planted_on_its_way(home, fs_server, monkeypatch):
    """A parent's code swaps a directory on its sub-agent's cwd for a link onto a mount that never
    answers (here ollie's own, its server stopped): the walk starts from the cwd opened following
    no link. Also: a look for links that runs out of time says dotfiles (granting less); a stowed
    ~/.m2/settings.xml is seen (a cache's top entries are looked at); a name says dotfiles in any
    case; a far file system mounted over a near one at the same point is far."""
    parent = git_repo(home / "parentcwd", "pkg/sub/x")
    sub = parent / "pkg" / "sub"
    assert sandbox.repository_root(str(sub), str(home)) == str(parent)
    (parent / "pkg").rename(parent / "pkg.old")
    (parent / "pkg").symlink_to(fs_server.mnt / f"never-looked-up-{os.getpid()}")
    os.kill(fs_server.pid(), signal.SIGSTOP)
    try:
        assert within_seconds(lambda: sandbox.repository_root(str(sub), str(home))) == ""
    finally:
        os.kill(fs_server.pid(), signal.SIGCONT)
    conf = git_repo(home / "conf", "m2/settings.xml", "nvim/init.lua")
    repository._linked.clear()
    with monkeypatch.context() as patch:
        patch.setattr(repository, "LOOK_SECONDS", 0.0)
        assert sandbox.repository_root(str(conf / "nvim"), str(home)) == ""
    repository._linked.clear()
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == str(conf)
    (home / ".m2").mkdir()
    (home / ".m2" / "settings.xml").symlink_to(conf / "m2" / "settings.xml")
    repository._linked.clear()
    assert sandbox.repository_root(str(conf / "nvim"), str(home)) == ""
    private = git_repo(home / "Dotfiles-private", "nvim/init.lua")
    assert sandbox.repository_root(str(private / "nvim"), str(home)) == ""
    with monkeypatch.context() as patch:
        patch.setattr(repository.config, "mounts", lambda: [("/", "ext4"), ("/x", "tmpfs"), ("/x", "fuse.sshfs")])
        assert repository._is_far("/x/y", repository._mounts([str(home)])) is True


def test_a_cwd_moved_while_its_way_up_is_walked_grants_nothing(home):
    """A parent's code renames its sub-agent's cwd deeper while the walk goes up by descriptor:
    the names it walks by then say other directories than the descriptors it judges (one too
    many, past $HOME). Played here without the race: the walk's names are the cwd's old ones."""
    deep = home / "proj" / "x1" / "x2" / "sub"
    deep.mkdir(parents=True)
    git_repo(home / "proj" / "x1", "proj/f")  # tracks the top the old names would give
    fd = os.open(deep, os.O_PATH)
    found_fd = [-1]
    try:
        home_id = (os.stat(home).st_dev, os.stat(home).st_ino)
        assert repository._walk(str(home / "proj" / "sub"), fd, home_id, str(home), found_fd) == ""
    finally:
        os.close(fd)
        if found_fd[0] >= 0:
            os.close(found_fd[0])


# ---- 5. a configuration inside a granted tree that holds a secret is masked ---------------------------

NPM_TOKEN = "npm_" + "a1B2c3D4" * 5  # (a token's shape, the prefix the judge knows)


def toolchain_configs(home: Path, npmrc: str) -> tuple[Path, Path]:
    """A node under nvm whose global npmrc reads `npmrc`, a file beside it, and a pyenv Python's
    site pip.conf without a secret: trees the default policy grants whole."""
    etc = home / ".nvm" / "versions" / "node" / "v22.1.0" / "etc"
    etc.mkdir(parents=True)
    (etc / "npmrc").write_text(npmrc)
    (etc / "beside").write_text("beside\n")
    pyenv = home / ".pyenv" / "versions" / "3.12.4"
    pyenv.mkdir(parents=True)
    (pyenv / "pip.conf").write_text("[global]\nindex-url = https://pypi.org/simple\n")
    return etc / "npmrc", pyenv / "pip.conf"


async def test_a_secret_in_a_toolchains_own_configuration_reads_as_nothing(run, home, monkeypatch):
    """nvm's node keeps npm's global npmrc in its tree, granted whole for `npm test` to run: one
    holding a token reads as /dev/null reads, in the first jail and in a later ruleset's (a
    session moved to $HOME, whose writable grant is bound over the tree), while the rest of the
    tree and a configuration without a secret read as they are."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, pip_conf = toolchain_configs(home, f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    code = f"wc -c < {npmrc}; cat {npmrc.parent}/beside {pip_conf}"
    expected = "0\nbeside\n[global]\nindex-url = https://pypi.org/simple\n"
    result = await run(code)
    assert (result.is_error, result.text()) == (False, expected), result.text()
    at_home = dataclasses.replace(run.ctx, cwd=str(home))
    steps = {"steps": [{"code": f"cat {npmrc}; echo x > {home}/written; {code}"}]}
    result = await run.server.call_tool("execute_code", steps, at_home)
    assert (result.is_error, result.text()) == (False, expected), result.text()
    assert (home / "written").read_text() == "x\n"  # (the cwd's grant, bound after the mask)
    assert npmrc.read_text().endswith(f"{NPM_TOKEN}\n")  # the user's own file, untouched


async def test_a_toolchain_configuration_that_takes_a_secret_is_masked_by_the_next_look(run, home, monkeypatch):
    """A configuration judged free of secrets is read; once it holds one, the next look (each
    RECHECK seconds) builds the session's sandbox anew and the running jail masks it."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, "registry=https://registry.npmjs.org/\n")
    result = await run(f"cat {npmrc}")
    assert result.text() == "registry=https://registry.npmjs.org/\n", result.text()
    npmrc.write_text(f"registry=https://registry.npmjs.org/\n//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    monkeypatch.setattr(sandbox, "_next_look", 0.0)  # as RECHECK seconds later
    result = await run(f"wc -c < {npmrc}")
    assert (result.is_error, result.text()) == (False, "0\n"), result.text()


async def test_a_toolchain_configuration_made_while_a_session_runs_is_masked_by_the_next_look(run, home, monkeypatch):
    """`npm config set -g` makes the global npmrc where a node had none: looked for in each
    version's directory, there or not, it is masked from the next look on."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, "")
    npmrc.unlink()
    result = await run(f"cat {npmrc.parent}/beside")
    assert (result.is_error, result.text()) == (False, "beside\n"), result.text()
    npmrc.write_text(f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    monkeypatch.setattr(sandbox, "_next_look", 0.0)  # as RECHECK seconds later
    result = await run(f"wc -c < {npmrc}")
    assert (result.is_error, result.text()) == (False, "0\n"), result.text()


async def test_every_version_in_a_toolchains_tree_is_looked_in_however_many(run, home, monkeypatch):
    """Code working in $HOME could bury a node version's npmrc among thousands of directories of
    its own, for a listing cut short to miss it, or plant tokens in many: every entry is looked
    in, each configuration with a secret masked on its own (the rest of the tree still there),
    and a version linked within its tree is one mask (uv links each minor version to its patch)."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    versions = npmrc.parents[2]
    for n in range(1500):
        (versions / f"v{n}").mkdir()
    for n in range(20):
        (versions / f"v{n}" / "etc").mkdir()
        (versions / f"v{n}" / "etc" / "npmrc").write_text(npmrc.read_text())
    (versions / "v22.1").symlink_to("v22.1.0")
    result = await run(f"cat {versions}/v*/etc/npmrc | wc -c; cat {npmrc.parent}/beside; ls {versions} | wc -l")
    assert (result.is_error, result.text()) == (False, "0\nbeside\n1502\n"), result.text()
    masked = sandbox.load_policy("default", str(home), "").masked
    assert len(masked) == 21 and str(npmrc) in masked and f"{versions}/v22.1/etc/npmrc" not in masked


def test_a_toolchains_tree_ollie_may_not_look_in_is_masked_where_there_is_a_file(home, tmp_path, monkeypatch):
    """`chmod 111` on the versions' directory, or 000 on a version's, by code that may write it,
    keeps its files from ollie's judging while their paths still lead there (the jail's root,
    which overrides modes in its namespace, reaches them): what ollie may not look at is given to
    the jail to mask where it finds a file, unjudged, not passed over. (Looked at as the user,
    without root's override of modes.)"""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    versions = npmrc.parents[2]
    look = "from ollie.sandbox import load_policy; p = load_policy('default', '/', ''); print(p.unlisted, p.masked)"
    without_override = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]
    as_user = without_override if os.getuid() == 0 else []
    for locked, unjudged in ((versions, f"(('{versions}', '*', 'etc/npmrc'),"), (npmrc.parent, f"() ('{npmrc}',")):
        locked.chmod(0o111 if locked == versions else 0)
        try:
            out = subprocess.run([*as_user, sys.executable, "-c", look], capture_output=True, text=True, check=True)
        finally:
            locked.chmod(0o755)
        assert out.stdout.startswith(unjudged), out.stdout + out.stderr


async def test_a_configuration_the_host_replaces_is_masked_again_by_the_next_look(run, home, monkeypatch):
    """A token rotated by writing a new file and renaming it over the masked one (as editors and
    scripts save) takes the mask along in every running jail, and a directory the host makes anew
    the pin on the old one: the next look masks and pins them again, for code working in $HOME,
    which may write the tree."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    at_home = dataclasses.replace(run.ctx, cwd=str(home))

    async def in_home(code: str) -> str:
        monkeypatch.setattr(sandbox, "_next_look", 0.0)  # as RECHECK seconds later
        result = await run.server.call_tool("execute_code", {"steps": [{"code": code}]}, at_home)
        assert not result.is_error, result.text()
        return result.text()

    assert await in_home(f"wc -c < {npmrc}") == "0\n"
    rotated = npmrc.with_name("npmrc.new")
    rotated.write_text(f"//registry.npmjs.org/:_authToken={NPM_TOKEN[::-1]}\n")
    rotated.rename(npmrc)
    assert await in_home(f"wc -c < {npmrc}") == "0\n"
    npmrc.parent.rename(npmrc.parent.with_name("old"))  # (the jail's pin goes along with it)
    npmrc.parent.mkdir()
    npmrc.write_text(f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    assert await in_home(f"wc -c < {npmrc}; mv {npmrc.parent} {npmrc.parent}2 2>&1 | grep -c busy") == "0\n1\n"


async def test_a_secret_with_another_name_is_masked_and_the_other_named_in_the_log(run, home, monkeypatch, caplog):
    """A hard link made while the configuration held no secret keeps its inode when the secret is
    written in place (`npm config set -g`): masked at its path, it is read at the other, which
    ollie cannot find; the log says so, naming the file and how to find the others."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, "registry=https://registry.npmjs.org/\n")
    os.link(npmrc, home / "planted")
    with npmrc.open("a") as f:
        f.write(f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    result = await run(f"wc -c < {npmrc}")
    assert (result.is_error, result.text()) == (False, "0\n"), result.text()
    assert f"{npmrc} holds a secret and has 2 names (hard links)" in caplog.text and "-samefile" in caplog.text


def test_a_link_out_of_a_toolchains_tree_masks_nothing_there(home, tmp_path, monkeypatch):
    """Code that may write a toolchain's tree could link its npmrc to any file ollie reads: to
    have ollie mask the shell every session runs, or to learn from the mask whether a file it may
    not read holds a password. A configuration is judged in its tree only."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, "")
    private = tmp_path / "private"
    private.write_text("password = hunter2\n")
    for target in (private, Path("/bin/bash")):
        npmrc.unlink()
        npmrc.symlink_to(target)
        sandbox.policy.forget_trees()
        assert sandbox.load_policy("default", str(tmp_path), "").masked == (), target


async def test_a_node_installed_while_a_session_runs_is_looked_in_by_the_next_look(run, home, monkeypatch):
    """`nvm install` then `npm config set -g` make a version's directory and its npmrc while a
    session runs: the versions' directory changed, the next look lists it again."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, "")
    assert not (await run("true")).is_error
    later = npmrc.parents[1].with_name("v23.0.0") / "etc" / "npmrc"
    later.parent.mkdir(parents=True)
    later.write_text(f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    monkeypatch.setattr(sandbox, "_next_look", 0.0)  # as RECHECK seconds later
    result = await run(f"wc -c < {later}")
    assert (result.is_error, result.text()) == (False, "0\n"), result.text()


async def test_a_session_whose_rebuild_is_refused_is_not_kept_once_a_configuration_took_a_secret(
    run, home, monkeypatch
):
    """A session whose sandbox a new decision refuses (a link planted on a path its policy names)
    keeps the one it has, which grants no more than before; not once a configuration in its
    trees took a secret, which that one would show unmasked: its calls are refused instead."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, "registry=https://registry.npmjs.org/\n")
    (home / "data").mkdir()
    write_policy(None, "filesystem:\n  ro: ['{HOME}/data']\n")
    assert (await run(f"cat {npmrc}")).text() == "registry=https://registry.npmjs.org/\n"
    (home / "data").rmdir()
    (home / "data").symlink_to(npmrc.parent)  # (code working in $HOME could plant it)
    monkeypatch.setattr(sandbox, "_next_look", 0.0)  # as RECHECK seconds later
    assert not (await run("true")).is_error  # kept: it grants no more than before (a new session is refused)
    with npmrc.open("a") as f:
        f.write(f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    monkeypatch.setattr(sandbox, "_next_look", 0.0)
    result = await run(f"cat {npmrc}")
    assert result.is_error and NPM_TOKEN not in result.text(), result.text()


def test_a_link_in_a_directory_of_versions_is_judged_in_its_own_version_only(tmp_path):
    """/opt/* matches a project deployed under /opt as well as a toolchain: a project's code
    could link its pip.conf to a JDK's binary beside it, for every session to lose `java`. What a
    glob matches is judged within that entry only."""
    jdk, project = tmp_path / "opt" / "jdk" / "bin", tmp_path / "opt" / "project"
    jdk.mkdir(parents=True)
    project.mkdir()
    (jdk / "java").write_bytes(b"\x7fELF" + bytes(range(256)) * 300)  # (no text: judged a secret)
    (project / "pip.conf").symlink_to("../jdk/bin/java")
    watched: dict = {}
    masked: dict = {}
    sandbox.policy._judged_in(f"{tmp_path}/opt/*/pip.conf", watched, masked, {}, {})
    assert masked == {} and f"{project}/pip.conf" in watched


def test_a_configuration_far_down_a_chain_of_links_or_on_ollies_mount_is_not_judged(home, tmp_path, monkeypatch):
    """A project's pip.conf linked down a chain of thousands of its own directories would be as
    many pins in every jail; one linked into ollie's mount (the memory, which every session's code
    writes) lies where a jail shows nothing: what is judged lies a few levels into its tree."""
    project = tmp_path / "opt" / "project"
    deep = project.joinpath(*["a"] * 40)
    deep.mkdir(parents=True)
    (deep / "pip.conf").write_text("[global]\nindex-url = https://u:p4ss@example.com/simple\n")
    (project / "pip.conf").symlink_to(deep / "pip.conf")
    masked: dict = {}
    sandbox.policy._judged_in(f"{tmp_path}/opt/*/pip.conf", {}, masked, {}, {})
    assert masked == {}
    (project / "pip.conf").unlink()
    (project / "pip.conf").write_text((deep / "pip.conf").read_text())
    sandbox.policy._judged_in(f"{tmp_path}/opt/*/pip.conf", {}, masked, {}, {})
    assert list(masked) == [str(project / "pip.conf")]  # (the same file, where a toolchain keeps it)
    monkeypatch.setenv("OLLIE", str(project))  # as though the project were ollie's mount
    masked.clear()
    sandbox.policy._judged_in(f"{tmp_path}/opt/*/pip.conf", {}, masked, {}, {})
    assert masked == {}


def test_a_version_linked_out_of_its_directory_of_versions_is_not_judged(tmp_path, caplog):
    """Code that may write the tree could link a version itself (not its npmrc) anywhere: to
    another project's directory, for ollie's mask to say whether the npmrc there holds a secret;
    down a chain of thousands of directories, or past PATH_MAX, for as many pins in every jail, or
    a path no jail can mask (which failed every session's calls). What a glob matches is judged in
    its own entry of the glob's directory, no deeper than _MASK_DEPTH nor longer than PATH_MAX."""
    token = f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n"
    versions = tmp_path / "versions"
    (versions / "v1" / "etc").mkdir(parents=True)
    (versions / "v1" / "etc" / "npmrc").write_text(token)
    other = tmp_path.joinpath("other", *["d"] * 60)
    (other / "etc").mkdir(parents=True)
    (other / "etc" / "npmrc").write_text(token)
    (versions / "v2").symlink_to(other)
    (versions / "v3").symlink_to(tmp_path / "other")  # (its npmrc not there: nothing to judge either)
    masked: dict = {}
    sandbox.policy._judged_in(f"{versions}/*/etc/npmrc", {}, masked, {}, {})
    assert list(masked) == [f"{versions}/v1/etc/npmrc"]
    deep = tmp_path.joinpath(*["d"] * 50)  # a tree whose own real path is that deep
    (deep / "v1" / "etc").mkdir(parents=True)
    (deep / "v1" / "etc" / "npmrc").write_text(token)
    name, half = "n" * 250, "/".join(["n" * 250] * 9)
    (tmp_path / half).mkdir(parents=True)  # a tree whose real path is past PATH_MAX, by two links
    (tmp_path / "long").symlink_to(half)
    subprocess.run(["mkdir", "-p", half[: -len(name) - 1]], cwd=tmp_path / half, check=True)
    (tmp_path / "long" / "on").symlink_to(half[: -len(name) - 1])
    (tmp_path / "long" / "on" / "v1" / "etc").mkdir(parents=True)
    (tmp_path / "long" / "on" / "v1" / "etc" / "npmrc").write_text(token)
    for where in (deep, tmp_path / "long" / "on"):
        masked.clear()
        sandbox.policy._judged_in(f"{where}/*/etc/npmrc", {}, masked, {}, {})
        assert masked == {}, where
        assert "holds a secret but lies too deep to mask" in caplog.text, where  # said, for the user to act on
        caplog.clear()
    # nor a directory ollie may not list that deep (the jail would pin its every ancestor)
    deep.chmod(0o111)
    look = (
        "from ollie.sandbox import policy; u = {}; "
        f"policy._judged_in('{deep}/*/etc/npmrc', {{}}, {{}}, u, {{}}); print(u)"
    )
    without_override = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]
    try:
        out = subprocess.run([*(without_override if os.getuid() == 0 else []), sys.executable, "-c", look],
                             capture_output=True, text=True, check=True)  # fmt: skip
    finally:
        deep.chmod(0o755)
    assert out.stdout == "{}\n", out.stdout + out.stderr


async def test_thousands_of_planted_configurations_hide_their_directory_not_fail_every_jail(
    run, home, tmp_path, monkeypatch, caplog
):
    """Code working in $HOME could plant a token in tens of thousands of versions' npmrc: each a
    mount or more in every jail, past the kernel's `fs.mount-max` no jail starts. Past
    MASKS_PER_DIR, the versions' directory is hidden whole, one mount, in this call and the next,
    and the log says why; up to it, each is masked alone and the tree reads as it is."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    versions = npmrc.parents[2]
    for n in range(sandbox.policy.MASKS_PER_DIR - 1):  # (with v22.1.0's, as many as are masked alone)
        (versions / f"v{n}" / "etc").mkdir(parents=True)
        (versions / f"v{n}" / "etc" / "npmrc").write_text(npmrc.read_text())
    code = f"cat {versions}/*/etc/npmrc | wc -c; ls {versions} | wc -l; wc -l < /proc/self/mountinfo"
    result = await run(code)
    zero, listed, mounts = result.text().split()
    assert (zero, listed) == ("0", str(sandbox.policy.MASKS_PER_DIR)), result.text()  # each masked alone
    counts = []
    for more in ("v99", "v100"):  # the next look hides the directory; a later ruleset keeps it hidden, once
        (versions / more / "etc").mkdir(parents=True)
        (versions / more / "etc" / "npmrc").write_text(npmrc.read_text())
        monkeypatch.setattr(sandbox, "_next_look", 0.0)  # as RECHECK seconds later
        result = await run(code)
        assert result.text().split()[-3:-1] == ["0", "0"], result.text()  # (cat: no such file, before)
        counts.append(result.text().split()[-1])
    assert counts[0] == counts[1], counts  # not one more mount a call
    (tmp_path / "fresh").mkdir()
    result = await call(tmp_path / "fresh", code, tmp_path)  # a jail that never masked them one by one
    assert result.text().split()[-3:-1] == ["0", "0"], result.text()
    assert int(result.text().split()[-1]) < int(mounts) - sandbox.policy.MASKS_PER_DIR, (result.text(), mounts)
    assert f"{versions} holds {sandbox.policy.MASKS_PER_DIR + 1} configurations with secrets" in caplog.text
    assert f"{versions} holds {sandbox.policy.MASKS_PER_DIR + 2}" not in caplog.text  # said once


async def test_the_jail_hides_a_directory_it_finds_too_many_configurations_in(home, tmp_path):
    """What ollie could not list, the jail lists: past MASKS_PER_DIR files, it hides the directory
    whole too (and not the directory's neighbours)."""
    versions = home / ".nvm" / "versions" / "node"
    for n in range(sandbox.policy.MASKS_PER_DIR + 1):
        (versions / f"v{n}" / "etc").mkdir(parents=True)
        (versions / f"v{n}" / "etc" / "npmrc").write_text("registry=https://registry.npmjs.org/\n")
    (home / ".nvm" / "beside").write_text("beside\n")
    boxes, jails = sandbox.Sandboxes(), sandbox.Jails()
    box = await boxes.get_async("default", str(tmp_path), "")
    spec = {**box.confinement.spec, "mask_matches": [[str(versions), "*", "etc/npmrc"]]}
    code = f"ls {versions} | wc -l; cat {home}/.nvm/beside"
    assert await in_jail(jails, box, spec, code, tmp_path) == b"0\nbeside\n"


def test_a_configuration_is_judged_as_it_was_looked_at_not_as_its_path_leads_now(tmp_path):
    """A link swapped in between the look and the judging (to a file code may not read) would
    have ollie judge that file, and its mask tell whether it holds a secret: the file judged is
    the one the look's descriptor holds."""
    looked, private = tmp_path / "npmrc", tmp_path / "private"
    looked.write_text("registry=https://registry.npmjs.org/\n")
    private.write_text("password = hunter2\n")
    at = os.open(looked, os.O_PATH)
    try:
        looked.unlink()
        looked.symlink_to(private)
        assert userconfig.secret_free(str(looked), at) and not userconfig.secret_free(str(looked))
    finally:
        os.close(at)


def test_every_glob_of_the_configurations_in_trees_is_one_directorys():
    """The jail and the policy split a template at its one glob (a directory, a glob in the next,
    what follows): a template with a glob elsewhere would be taken as a literal path."""
    values = {name: f"/{name.lower()}" for name in ("HOME", "NVM_DIR", "PYENV_ROOT", "SDKMAN_DIR")}
    for template in sandbox.policy._expand_paths(list(userconfig.IN_TREES), values, "test"):
        if "*" in template:
            where, glob_part, rest = sandbox.policy._GLOB.match(template).groups()
            assert where and "*" in glob_part and rest and "*" not in where + rest, template


async def test_a_masked_configuration_cannot_be_reached_around_its_mask(home, tmp_path, monkeypatch):
    """Code working in $HOME, which may write the toolchain's tree, tries every way around the
    mask: a hard link, a copy, renaming the file or a directory above it (so that it lies where
    no later jail looks), unmounting the mask, and reading it by another path; none shows the
    token, and a later jail still masks the file where it was."""
    monkeypatch.delenv("NVM_DIR", raising=False)
    npmrc, _ = toolchain_configs(home, f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    node = npmrc.parent.parent
    attack = f"""
        ln {npmrc} {home}/linked 2>&1 | tail -c 20; cp {npmrc} {home}/copied; wc -c < {home}/copied
        mv {npmrc} {home}/moved || echo file-stays
        mv {npmrc.parent} {node}/etc2 || echo etc-stays
        mv {home}/.nvm {home}/nvm2 || echo nvm-stays
        umount {npmrc} 2>/dev/null || echo mask-stays
        cat {node}/../v22.1.0/./etc/npmrc /proc/self/root{npmrc}
        python3 -c 'import os; d = os.open("{npmrc.parent}", 0); print(os.read(os.open("npmrc", 0, dir_fd=d), 99))'
    """
    result = await call(home, attack, tmp_path)
    out = result.text()
    assert NPM_TOKEN not in out, out
    for stays in ("file-stays", "etc-stays", "nvm-stays", "mask-stays"):
        assert stays in out, out
    assert "0\n" in out and not (home / "linked").exists() and npmrc.read_text().endswith(f"{NPM_TOKEN}\n")
    (tmp_path / "cwd").mkdir()
    result = await call(tmp_path / "cwd", f"wc -c < {npmrc}", tmp_path)
    assert result.text() == "0\n", result.text()


async def test_the_jail_masks_only_files_reached_without_a_link(home, tmp_path):
    """The jail's own checks: a path to mask with a symlink on it now (planted since ollie judged
    the file), one that is gone, one in a hidden directory or on ollie's own mount, one whose name
    holds a glob's star and a directory are passed over (the next look judges
    what is there), never the file a link leads to masked; a pattern's matches (of a directory
    ollie could not list, whose real path holds a star of its own) are masked, the rest of the tree
    read as it is; and the stage runs."""
    real = home / "real"
    real.mkdir()
    (real / "npmrc").write_text(f"//registry.npmjs.org/:_authToken={NPM_TOKEN}\n")
    (home / "link").symlink_to(real)
    (home / "x*y").mkdir()
    (home / "x*y" / "npmrc").symlink_to("../x*y/npmrc")  # (a loop through a starred name)
    etc = home / ".nvm" / "versions" / "n*de" / "v1" / "etc"  # (a tree the policy grants; a star of its own)
    etc.mkdir(parents=True)
    (etc / "npmrc").write_text("registry=https://registry.npmjs.org/\n")  # (no secret: judged, it is read)
    (etc / "beside").write_text("beside\n")
    boxes, jails = sandbox.Sandboxes(), sandbox.Jails()
    box = await boxes.get_async("default", str(tmp_path), "")
    passed_over = [
        str(home / "link/npmrc"),
        str(home / "gone"),
        f"{os.environ['OLLIE_CFG_PATH']}/nothing",
        f"{sandbox.config.mount_point()}/m/npmrc",
        str(home / "x*y/npmrc"),
        str(real),  # (a directory: one swapped in since)
    ]
    spec = {
        **box.confinement.spec,
        "mask": passed_over,
        "mask_matches": [[f"{home}/.nvm/versions/n*de", "*", "etc/npmrc"]],
    }
    code = f"grep -c '{real}/npmrc' /proc/self/mountinfo; cat {etc}/npmrc {etc}/beside"
    assert await in_jail(jails, box, spec, code, tmp_path) == b"0\nbeside\n"


async def in_jail(jails, box, spec: dict, code: str, cwd: Path) -> bytes:
    """What `code` prints in a jail of `box` given `spec` (the jail's instructions, changed by the
    test): the stage must exit 0; the jails are closed after."""
    try:
        jail = await jails.get(box.policy)
        read, write = os.pipe()
        stage = await jail.spawn(
            dataclasses.replace(box.confinement, spec=spec), ["/bin/sh", "-c", code], str(cwd), {},
            stdin=0, stdout=write, stderr=2,
        )  # fmt: skip
        os.close(write)
        assert await stage.wait() and stage.exited.result() == 0
        out = os.read(read, 4096)
        os.close(read)
        return out
    finally:
        await jails.close()
