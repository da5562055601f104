"""Round 3 of the sandbox's attacks, each tried from inside a real sandboxed stage or a real
session's view: a sub-agent's cwd decided by path and used later (a race won with
RENAME_EXCHANGE), ollie's hidden directories given as a cwd or a grant, grants that follow a link
the sandbox planted, and metadata (modes, times, extended attributes) changed outside the grants."""

from __future__ import annotations

import json
import os
import stat
import textwrap
from pathlib import Path

import pytest

from ollie import sandbox
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
    server = execute.Decl(str(cwd))()
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
    box = boxes.get("default", str(tmp_path), "")
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
    """Links the user set up where the code cannot write (a symlinked cache on another disk)
    still work: refusing them would break ordinary setups."""
    real = tmp_path / "real-cache"
    real.mkdir()
    (home / "caches").mkdir()
    os.symlink(real, home / "caches" / "pip")
    write_policy("wide", "filesystem:\n  rw: ['{HOME}/caches/pip']\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = await call(cwd, f"echo cached > {home}/caches/pip/f && cat {real}/f", tmp_path, ("wide",), sandbox="wide")
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
    assert out.count("write error: Permission denied") == 2, out  # new, and the sub-session's ctl
    assert out.count('runs on gpt-4.1-mini, gpt-4.1; list more under "models"') == 2, out  # new, and b/new
    assert child.settings()["model"] == "gpt-4.1" and len(h.sessions.all()) == 2 and not h.jobs.all()
