"""`ollie init` as a user runs it (real subprocesses, an empty HOME), the first-use install of
`ollie run` and `ollie srv start`, and IDEAS.md's develop -> review -> test script on a fresh install."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fs_helpers import FsServer
from test_fs_examples import DEVELOP_REVIEW_TEST_SH

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ROOT / "src" / "ollie" / "defaults"
OLLIE = [sys.executable, "-m", "ollie"]
AGENTS = ("default", "developer", "reviewer", "tester")
UMASK = os.umask(0o022)
os.umask(UMASK)


def fresh_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A user's environment with an empty HOME: no ollie variables (so ~/.config/ollie), no keys."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OLLIE", "OPENAI", "ANTHROPIC", "OPENROUTER", "OLLAMA"))
    }
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), OLLIE_TMP_PATH=str(tmp_path / "tmp"), PYTHONPATH=str(ROOT / "src"), **extra)
    return env


def ollie(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*OLLIE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def shipped() -> dict[str, Path]:
    """Where each file of the package's defaults goes under $OLLIE_CFG_PATH (s/, b/ and u/ go to scripts/)."""
    out = {}
    for path in DEFAULTS.rglob("*"):
        rel = path.relative_to(DEFAULTS).as_posix()
        if path.is_file() and "__pycache__" not in rel and not any(p.startswith(".") for p in rel.split("/")):
            out[re.sub(r"^([sbu])/", r"scripts/\1/", rel)] = path
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def user(tmp_path):
    """A fresh user: the environment, and where their configuration will be."""
    env = fresh_env(tmp_path)
    return env, Path(env["HOME"]) / ".config" / "ollie"


def lines_of(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def manifest(cfg: Path) -> dict[str, str]:
    return json.loads((cfg / ".installed.json").read_text())["files"]


def test_a_fresh_install_installs_every_default_with_its_mode_and_says_so(user):
    env, cfg = user
    files = shipped()
    assert {f"agents/{a}.json" for a in AGENTS} | {"sandbox.yaml", "scripts/s/sh", "scripts/s/ls"} <= set(files)
    tools = {f"tools/{p.name}" for p in (DEFAULTS / "tools").glob("*") if p.is_file() and p.name[0] != "."}
    assert tools <= set(files)  # whatever is shipped, no __pycache__

    lines = lines_of(ollie(env, "init"))
    assert lines[0] == f"ollie init: {cfg}"
    assert sorted(lines[1:]) == sorted(f"installed  {rel}" for rel in files)
    assert len(lines) == len(files) + 1
    for rel, source in files.items():
        installed = cfg / rel
        assert installed.read_bytes() == source.read_bytes(), rel
        executable = bool(source.stat().st_mode & 0o111) or source.read_bytes().startswith(b"#!")
        assert bool(installed.stat().st_mode & 0o111) == executable, rel
        assert installed.stat().st_mode & 0o777 == (0o755 if executable else 0o644) & ~UMASK, rel
    for rel in ("scripts/s/sh", "scripts/s/ls", "scripts/s/kill", *(f for f in files if f.startswith("tools/"))):
        assert os.access(cfg / rel, os.X_OK), rel
    for rel in ("sandbox.yaml", *(f"agents/{a}.json" for a in AGENTS)):
        assert not os.access(cfg / rel, os.X_OK), rel
    assert manifest(cfg) == {rel: sha(p.read_bytes()) for rel, p in files.items()}
    assert cfg.stat().st_mode & 0o777 == 0o700  # it will hold API keys (env)
    assert not [p for p in cfg.rglob("*ollie-init*")]  # no temporary file left


def test_a_second_run_says_every_file_is_unchanged(user):
    env, cfg = user
    ollie(env, "init")
    before = {p: p.stat().st_mtime_ns for p in cfg.rglob("*") if p.is_file() and p.name != ".installed.json"}
    lines = lines_of(ollie(env, "init"))
    assert lines[1:] == [f"unchanged  {rel}" for rel in sorted(shipped(), key=lambda r: r.split("/"))]
    assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing rewritten


def test_a_file_you_changed_is_kept_and_reported_and_force_replaces_it(user):
    env, cfg = user
    ollie(env, "init")
    reviewer = cfg / "agents" / "reviewer.json"
    original = reviewer.read_bytes()
    reviewer.write_text('{"prompt": "Be terse.\\nEnd with LGTM or PTAL."}\n')

    lines = lines_of(ollie(env, "init"))
    assert "kept       agents/reviewer.json (changed by you)" in lines
    assert lines[-1] == "ollie init --force replaces the kept file with ollie's"
    assert sum(line.startswith("unchanged") for line in lines) == len(shipped()) - 1
    assert reviewer.read_text().startswith('{"prompt": "Be terse.')
    assert manifest(cfg)["agents/reviewer.json"] == sha(original)  # still what was installed

    lines = lines_of(ollie(env, "init", "--force"))
    assert "replaced   agents/reviewer.json (changed by you; --force)" in lines
    assert reviewer.read_bytes() == original
    assert "kept" not in ollie(env, "init").stdout


def test_a_file_that_was_there_before_is_kept_and_not_adopted(user):
    env, cfg = user
    cfg.mkdir(parents=True)
    (cfg / "sandbox.yaml").write_text("limits: {cpu: 60}\n")
    (cfg / "agents").mkdir()
    (cfg / "agents" / "default.json").write_bytes((DEFAULTS / "agents" / "default.json").read_bytes())

    lines = lines_of(ollie(env, "init"))
    assert "kept       sandbox.yaml (yours: it was there before ollie init)" in lines
    assert "unchanged  agents/default.json" in lines  # the same as ollie's: ollie's from now on
    assert (cfg / "sandbox.yaml").read_text() == "limits: {cpu: 60}\n"
    assert "sandbox.yaml" not in manifest(cfg) and "agents/default.json" in manifest(cfg)
    assert "kept       sandbox.yaml (yours: it was there before ollie init)" in ollie(env, "init").stdout


def test_a_package_update_updates_the_files_you_did_not_change(user):
    env, cfg = user
    ollie(env, "init")
    # As if an older ollie had installed older versions: the manifest records what it wrote.
    old = b'{"prompt": "an older tester prompt\\n"}\n'
    recorded = manifest(cfg)
    (cfg / "agents" / "tester.json").write_bytes(old)
    recorded["agents/tester.json"] = sha(old)
    (cfg / "sandbox.yaml").write_text("# yours now\n")  # and you changed this one since
    recorded["sandbox.yaml"] = sha(b"# the older sandbox.yaml\n")
    (cfg / ".installed.json").write_text(json.dumps({"files": recorded}))

    lines = lines_of(ollie(env, "init"))
    assert "updated    agents/tester.json" in lines
    assert "kept       sandbox.yaml (changed by you)" in lines
    assert (cfg / "agents" / "tester.json").read_bytes() == (DEFAULTS / "agents" / "tester.json").read_bytes()
    assert (cfg / "sandbox.yaml").read_text() == "# yours now\n"
    assert manifest(cfg)["agents/tester.json"] == sha((DEFAULTS / "agents" / "tester.json").read_bytes())


def test_the_code_the_tool_scripts_share_is_installed_and_updated_with_them(user, tmp_path):
    env, cfg = user
    assert "installed  tools/_toolkit.py" in lines_of(ollie(env, "init"))
    toolkit = cfg / "tools" / "_toolkit.py"
    assert toolkit.read_bytes() == (DEFAULTS / "tools" / "_toolkit.py").read_bytes()
    # an installed script runs with the installed copy beside it
    (tmp_path / "a.txt").write_text("alpha\n")
    read = [sys.executable, str(cfg / "tools" / "file_read"), str(tmp_path / "a.txt")]
    out = subprocess.run(read, env={**env, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "     1\talpha\n", "")
    # As if an older ollie had installed an older one: it is updated like the scripts ...
    old = b"# an older _toolkit.py\n"
    recorded = manifest(cfg)
    toolkit.write_bytes(old)
    recorded["tools/_toolkit.py"] = sha(old)
    (cfg / ".installed.json").write_text(json.dumps({"files": recorded}))
    assert "updated    tools/_toolkit.py" in lines_of(ollie(env, "init"))
    assert toolkit.read_bytes() == (DEFAULTS / "tools" / "_toolkit.py").read_bytes()
    # ... and kept when you changed it
    toolkit.write_bytes(toolkit.read_bytes() + b"# mine\n")
    assert "kept       tools/_toolkit.py (changed by you)" in lines_of(ollie(env, "init"))
    assert toolkit.read_bytes().endswith(b"# mine\n")


def test_removed_files_come_back_and_files_ollie_no_longer_ships_go_unless_changed(user):
    env, cfg = user
    ollie(env, "init")
    (cfg / "scripts" / "s" / "ls").unlink()
    recorded = manifest(cfg)
    for name, data, changed in (("retired", b"#!/bin/sh\necho old\n", False), ("edited", b"#!/bin/sh\n", True)):
        (cfg / "tools" / name).write_bytes(data + (b"# mine\n" if changed else b""))
        recorded[f"tools/{name}"] = sha(data)
    recorded["../outside"] = sha(b"")  # a manifest naming a path outside is not obeyed
    (cfg / ".installed.json").write_text(json.dumps({"files": recorded}))

    lines = lines_of(ollie(env, "init"))
    assert "installed  scripts/s/ls" in lines and os.access(cfg / "scripts" / "s" / "ls", os.X_OK)
    assert "removed    tools/retired (ollie no longer ships it)" in lines
    assert "kept       tools/edited (changed by you; ollie no longer ships it)" in lines
    assert not (cfg / "tools" / "retired").exists() and (cfg / "tools" / "edited").exists()
    assert not {"tools/retired", "tools/edited", "../outside"} & set(manifest(cfg))


def test_ollie_run_on_a_fresh_home_installs_first_with_one_line(user, tmp_path):
    env, cfg = user
    script = tmp_path / "turns.json"
    script.write_text(json.dumps({"rules": [{"match": ".", "text": "hello"}]}))
    out = ollie(env, "run", "--script", str(script), "hi", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    first, session = out.stderr.splitlines()
    n = len(shipped())
    places = ", ".join(sorted({rel.split("/")[0] + ("/" if "/" in rel else "") for rel in shipped()}))
    assert places.startswith("agent.schema.json, agents/, sandbox.yaml, scripts/, ") and "utils/" not in places
    assert first == f"ollie: first run: installed {n} files into {cfg} ({places}); `ollie init` lists them"
    assert session.startswith("session: ") and out.stdout == "assistant: hello\n\n"
    assert (cfg / "agents" / "default.json").is_file() and (cfg / ".installed.json").is_file()

    again = ollie(env, "run", "--script", str(script), "hi", cwd=tmp_path)
    assert again.returncode == 0 and again.stderr.startswith("session: "), again.stderr


def test_first_use_keeps_your_files_and_leaves_a_configuration_you_named_alone(tmp_path):
    script = tmp_path / "turns.json"
    script.write_text(json.dumps({"rules": [{"match": ".", "text": "hello"}]}))

    # Your env file (keys) was there first: the defaults go in beside it, and it is not counted.
    env = fresh_env(tmp_path)
    cfg = Path(env["HOME"]) / ".config" / "ollie"
    cfg.mkdir(parents=True)
    (cfg / "env").write_text("OLLIE_LOCAL_CTX=4096\n")
    (cfg / "sandbox.yaml").write_text("limits: {cpu: 60}\n")
    out = ollie(env, "run", "--script", str(script), "hi", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"installed {len(shipped()) - 1} files into {cfg}" in out.stderr
    assert ", kept 1 of yours; `ollie init` lists them\n" in out.stderr
    assert (cfg / "sandbox.yaml").read_text() == "limits: {cpu: 60}\n"

    # OLLIE_CFG_PATH names a directory you made: yours to fill (with `ollie init`).
    mine = tmp_path / "mine"
    mine.mkdir()
    out = ollie({**env, "OLLIE_CFG_PATH": str(mine)}, "run", "--script", str(script), "hi", cwd=tmp_path)
    assert out.returncode == 0 and out.stderr.startswith("session: "), out.stderr
    assert list(mine.iterdir()) == []
    # ... and one that does not exist yet is set up like the default place.
    new = tmp_path / "new" / "cfg"
    out = ollie({**env, "OLLIE_CFG_PATH": str(new)}, "run", "--script", str(script), "hi", cwd=tmp_path)
    assert out.returncode == 0 and f"installed {len(shipped())} files into {new}" in out.stderr, out.stderr


def test_a_first_use_that_cannot_install_says_why_and_runs_anyway(tmp_path):
    env = fresh_env(tmp_path)
    cfg = Path(env["HOME"]) / ".config" / "ollie"
    cfg.mkdir(parents=True)
    (cfg / "agents").write_text("a file where a directory should be\n")
    script = tmp_path / "turns.json"
    script.write_text(json.dumps([{"text": "hello"}]))
    out = ollie(env, "run", "--script", str(script), "hi", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"ollie: could not set up {cfg}: ")
    assert first.endswith("; `ollie init` tries again") and out.stdout == "assistant: hello\n\n"


def test_the_installed_agent_configs_parse_and_fit_their_roles(user, monkeypatch):
    env, cfg = user
    ollie(env, "init")
    from ollie import config

    monkeypatch.setenv("OLLIE_CFG_PATH", str(cfg))
    assert set(AGENTS) <= set(config.list_agents())
    for path in sorted((cfg / "agents").glob("*.json")):
        agent = config.load_agent(path.stem)
        assert agent.path == str(path)
        assert (agent.backend, agent.model) == ("", ""), "the user's configured backend must be used"
        assert not config.prompt_commands(agent.prompt), path
        prompt = config.prompt_text(agent.prompt)
        assert prompt == agent.prompt and "\n" in prompt  # a literal, not a file name or a command
        assert "execute_code" in prompt and "t/idx" in prompt and "OLLIE_TOOLS_PATH" in prompt, path
    verdicts = {"reviewer": ("LGTM", "PTAL"), "tester": ("Approved", "Rejected")}
    for name, (yes, no) in verdicts.items():
        last = config.load_agent(name).prompt.strip().splitlines()[-1]
        assert "verdict" in last and f"{yes} if" in last and f"{no} if" in last
    assert "developer" in config.load_agent("developer").prompt.split("\n")[0]


def test_the_commented_sandbox_yaml_changes_no_policy_and_shows_every_key(user, tmp_path, monkeypatch):
    env, cfg = user
    ollie(env, "init")
    from ollie import sandbox

    work, tmpdir, empty = tmp_path / "work", tmp_path / "tmpdir", tmp_path / "empty"
    for d in (work, tmpdir, empty / "sandbox"):
        d.mkdir(parents=True)
    (cfg / "sandbox").mkdir()
    for c in (cfg, empty):  # a named policy of your own is overlaid on it too
        (c / "sandbox" / "build.yaml").write_text("network: {connect_tcp: [443]}\n")

    def policies(where: Path) -> list:
        monkeypatch.setenv("OLLIE_CFG_PATH", str(where))
        return [sandbox.load_policy(name, str(work), str(tmpdir)) for name in ("default", "hooks", "build")]

    text = (cfg / "sandbox.yaml").read_text()
    assert policies(cfg) == policies(empty)
    assert yaml.safe_load(text) is None  # nothing but comments

    # Uncommented, it is a valid policy, still changes nothing (it shows the built-in values) ...
    uncommented = "\n".join(line[1:] if re.match(r"#(\w|  \w)", line) else line for line in text.splitlines())
    (cfg / "sandbox.yaml").write_text(uncommented)
    assert policies(cfg) == policies(empty)
    # ... and has every key of the policy format in docs/sandbox.md, each explained on its line.
    shown = yaml.safe_load(uncommented)
    documented = yaml.safe_load(re.search(r"```yaml\n(.*?)```", (ROOT / "docs" / "sandbox.md").read_text(), re.S)[1])
    for section, value in documented.items():
        assert section in shown, section
        if isinstance(value, dict):
            assert set(value) <= set(shown[section]), section
    for line in uncommented.splitlines():
        if re.match(r"\s*\w+:", line) and not line.rstrip().endswith(":"):
            assert re.search(r"\S\s+# \w", line), f"no explanation: {line}"


def test_develop_review_test_runs_verbatim_on_a_fresh_install(tmp_path):
    """An empty HOME: `ollie srv start` installs the agents, whose backend is the user's (here the
    scripted one, through OLLIE_BACKEND and OLLIE_MODEL), and the seed's script runs as written."""
    srv = FsServer(tmp_path)
    for var in ("OLLIE_CFG_PATH", "OLLIE_TOOLS_PATH", "OLLIE_DATA_PATH"):  # the defaults under HOME
        del srv.env[var]
    cfg = srv.home / ".config" / "ollie"
    code_v1 = "def parse_config(path):\n    return json.load(open(path))"
    code_v2 = "# v2\ndef parse_config(path):\n    with open(path) as f:\n        return json.load(f)"
    rules = [
        {"match": "^Review the following code.*# v2", "text": "Closes the file now.\n\nLGTM"},
        {"match": "^Review the following code", "text": "The file is never closed.\n\nPTAL"},
        {"match": "^Test the following code", "text": "All 3 tests pass.\n\nApproved"},
        {"match": "^(revise|fix)", "text": code_v2},
        {"match": ".", "text": code_v1},
    ]
    (tmp_path / "model.json").write_text(json.dumps({"rules": rules}))
    srv.env.update(OLLIE_BACKEND="scripted", OLLIE_MODEL=str(tmp_path / "model.json"))
    script = tmp_path / "loop.sh"
    script.write_text(DEVELOP_REVIEW_TEST_SH)
    assert not cfg.exists()
    try:
        started = srv.ollie("srv", "start", check=False)
        assert started.returncode == 0, started.stderr + srv.log()
        assert started.stderr.startswith(f"ollie: first run: installed {len(shipped())} files into {cfg} ")
        out = subprocess.run(
            ["sh", str(script), str(srv.work)], env=srv.env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr + srv.log()
        assert out.stdout == f"done.\n{code_v2}\n"

        dev, rev, tst = sorted(p.name for p in (srv.mnt / "s").iterdir())
        for sid, agent in ((dev, "developer"), (rev, "reviewer"), (tst, "tester")):
            session = srv.mnt / "s" / sid
            assert f"agent={agent}\n" in (session / "cfg").read_text()
            assert "backend=scripted\n" in (session / "cfg").read_text()
            installed = json.loads((cfg / "agents" / f"{agent}.json").read_text())["prompt"]
            assert installed.strip() in (session / "systemprompt").read_text()
        assert "PTAL" in (srv.mnt / "s" / rev / "chat").read_text()
        assert (srv.mnt / "s" / "sh").read_bytes() == (cfg / "scripts" / "s" / "sh").read_bytes()
        index = (srv.mnt / "t" / "idx").read_text()
        for tool in (cfg / "tools").iterdir():
            if re.search(r"(?m)^# description:", tool.read_text(errors="replace")):
                assert f"## {tool.name}\n" in index
    finally:
        srv.stop()
    assert not os.path.ismount(srv.mnt)


def test_the_server_serves_your_s_scripts_when_installed(tmp_path):
    srv = FsServer(tmp_path)  # a configuration of its own (no first-use install)
    mine = '#!/bin/sh\n# my s/ls\ncat "$(dirname "$0")/idx"\n'
    (srv.cfg / "scripts" / "s").mkdir(parents=True)
    (srv.cfg / "scripts" / "s" / "ls").write_text(mine)
    try:
        srv.start()
        assert (srv.mnt / "s" / "ls").read_text() == mine
        assert (srv.mnt / "s" / "sh").read_bytes() == (DEFAULTS / "s" / "sh").read_bytes()
        sid = srv.new_session()
        assert srv.sh("s/ls").stdout.startswith(f"{sid}\t")  # it runs, without the package's header
        assert not (srv.cfg / ".installed.json").exists()
    finally:
        srv.stop()


def _as_an_earlier_ollie_left_it(env: dict[str, str], cfg: Path, optimize: bytes | None = None) -> None:
    """An install by an ollie that put the u/ scripts in utils/ (recorded there), with a script of
    yours beside them; `optimize`: what you made of u/optimize since."""
    ollie(env, "init")
    if not (cfg / "utils").exists():  # (an ollie that installs them in utils/ is one already)
        (cfg / "scripts" / "u").rename(cfg / "utils")
    recorded = manifest(cfg)
    recorded["utils/optimize"] = recorded.pop("scripts/u/optimize", recorded.get("utils/optimize"))
    (cfg / ".installed.json").write_text(json.dumps({"files": recorded}))
    (cfg / "utils" / "mine").write_text("#!/bin/sh\necho mine\n")
    (cfg / "utils" / "mine").chmod(0o755)
    if optimize is not None:
        (cfg / "utils" / "optimize").write_bytes(optimize)


def test_ollie_init_moves_what_utils_holds_to_scripts_u_with_its_records(user):
    """u/ is served from scripts/u/ now, as s/ and b/ are from theirs: what an earlier install put in
    utils/, and your scripts beside it, move there; the manifest's records move with them, so the
    unchanged optimize is still ollie's."""
    env, cfg = user
    _as_an_earlier_ollie_left_it(env, cfg)
    lines = lines_of(ollie(env, "init"))
    assert "moved      scripts/u/mine (from utils/mine; u/ is served from scripts/u/)" in lines
    assert "moved      scripts/u/optimize (from utils/optimize; u/ is served from scripts/u/)" in lines
    assert "unchanged  scripts/u/optimize" in lines
    assert not (cfg / "utils").exists()
    assert os.access(cfg / "scripts" / "u" / "mine", os.X_OK)
    assert (cfg / "scripts" / "u" / "optimize").read_bytes() == (DEFAULTS / "u" / "optimize").read_bytes()
    assert "utils/optimize" not in manifest(cfg) and "scripts/u/optimize" in manifest(cfg)
    assert lines_of(ollie(env, "init"))[1:] == [
        f"unchanged  {rel}" for rel in sorted(shipped(), key=lambda r: r.split("/"))
    ]


def test_ollie_run_after_an_upgrade_moves_utils_and_your_changes_stay_yours(user, tmp_path):
    env, cfg = user
    _as_an_earlier_ollie_left_it(env, cfg, optimize=b"#!/bin/sh\necho my optimize\n")
    (cfg / "scripts" / "u").mkdir(parents=True)
    (cfg / "scripts" / "u" / "mine").write_text("#!/bin/sh\necho the newer mine\n")  # there already
    script = tmp_path / "turns.json"
    script.write_text(json.dumps({"rules": [{"match": ".", "text": "hello"}]}))
    out = ollie(env, "run", "--script", str(script), "hi", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    first = out.stderr.splitlines()[0]
    assert first == f"ollie: moved 1 file from {cfg / 'utils'} to {cfg / 'scripts' / 'u'}, which u/ serves now"
    assert (cfg / "scripts" / "u" / "optimize").read_text() == "#!/bin/sh\necho my optimize\n"
    assert (cfg / "scripts" / "u" / "mine").read_text() == "#!/bin/sh\necho the newer mine\n"
    assert (cfg / "utils" / "mine").read_text() == "#!/bin/sh\necho mine\n"  # not lost: said, and left

    lines = lines_of(ollie(env, "init"))
    assert "kept       scripts/u/optimize (changed by you)" in lines
    assert "kept       utils/mine (scripts/u/mine exists; u/ serves that one)" in lines
    assert (cfg / "scripts" / "u" / "optimize").read_text() == "#!/bin/sh\necho my optimize\n"


def test_ollie_tools_on_a_fresh_machine_finds_the_default_tool_scripts(user, tmp_path):
    """`ollie tools call` as a first command: it installs the defaults as `ollie run` does (it said
    "no tool script 'file_read'", and `--agent developer` "no agent 'developer'")."""
    env, cfg = user
    (tmp_path / "a.txt").write_text("hello\n")
    listed = ollie(env, "tools", "list", "--agent", "developer", cwd=tmp_path)
    assert listed.returncode == 0 and "execute_code" in listed.stdout, listed.stderr
    steps = json.dumps({"steps": [{"tool": "file_read", "args": ["a.txt"]}]})
    called = ollie(env, "tools", "call", "execute_code", steps, cwd=tmp_path)
    assert called.returncode == 0 and "hello" in called.stdout, called.stdout + called.stderr
    assert (cfg / "tools" / "file_read").exists()


def test_a_command_whose_reader_went_away_ends_quietly(user):
    """`ollie init | head`, `ollie sessions | head`: a reader that has what it wanted is no error
    (it printed "ollie: [Errno 32] Broken pipe" and exited 1); 141, as for a program SIGPIPE ended."""
    env, cfg = user
    p = subprocess.Popen([*OLLIE, "init"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # gone before the first line
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and "Broken pipe" not in err, err
    assert (cfg / ".installed.json").exists()  # the work itself was done
