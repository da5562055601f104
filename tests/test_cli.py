"""The `ollie` command as a user runs it: a real subprocess with the scripted backend."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

OLLIE = [sys.executable, "-m", "ollie"]


def ollie(*args, input=None, cwd=None):
    return subprocess.run([*OLLIE, *args], capture_output=True, text=True, input=input, cwd=cwd, timeout=120)


@pytest.fixture
def script(tmp_path):
    def write(turns):
        path = tmp_path / "script.json"
        path.write_text(json.dumps(turns))
        return str(path)

    return write


def test_run_streams_the_chat_format_and_exits_zero(script, tmp_path):
    (tmp_path / "a.txt").write_text("alpha\n")
    path = script(
        [
            {
                "text": "Looking.",
                "tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "cat a.txt"}]}}],
            },
            {"text": "It says alpha.", "expect": "alpha"},
        ]
    )
    out = ollie("run", "--backend", "scripted", "--script", path, "--cwd", str(tmp_path), "what is in a.txt?")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        'assistant: Looking.\n-> execute_code({"steps": [{"code": "cat a.txt"}]})\nalpha\nassistant: It says alpha.\n\n'
    )
    assert out.stderr.startswith("session: ")


def test_a_shell_whose_directory_is_gone_is_told_so(script, tmp_path):
    """A shell left in a stopped server's mount, or in a directory since removed: Python's own
    error named no file and no way out."""
    gone = tmp_path / "gone"
    gone.mkdir()
    argv = " ".join([sys.executable, "-P", "-m", "ollie", "run", "--script", script([{"text": "x"}]), "hi"])
    out = subprocess.run(
        ["sh", "-c", f"cd {gone} && rmdir {gone} && exec {argv}"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1 and "this shell's directory is gone" in out.stderr, out.stderr


def test_run_failure_exits_nonzero_with_a_one_line_reason(script):
    path = script([{"error": {"type": "other", "message": "the model is gone", "status": 404}}])
    out = ollie("run", "--backend", "scripted", "--script", path, "hi")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == "ollie: scripted (HTTP 404): the model is gone"


def test_run_json_and_stdin_prompt(script):
    path = script([{"text": "hello", "expect": "from stdin"}])
    out = ollie("run", "--json", "--backend", "scripted", "--script", path, "-", input="from stdin\n")
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert [e["kind"] for e in events if e["kind"] not in ("state", "usage")] == ["user", "assistant", "done"]
    assert next(e for e in events if e["kind"] == "user") == {"kind": "user", "text": "from stdin"}


def test_sessions_list_show_and_continue(script):
    out = ollie("run", "--backend", "scripted", "--script", script([{"text": "first answer"}]), "first question")
    sid = out.stderr.split("session: ")[1].split()[0]
    listing = ollie("sessions").stdout
    assert sid in listing and "first question" in listing
    assert "assistant: first answer" in ollie("sessions", "show", sid).stdout
    again = ollie(
        "run",
        "--session",
        sid,
        "--backend",
        "scripted",
        "--script",
        script([{"text": "second answer", "expect": "follow-up"}]),
        "follow-up",
    )
    assert again.returncode == 0, again.stderr
    shown = ollie("sessions", "show", sid).stdout
    assert shown.index("first answer") < shown.index("user: follow-up") < shown.index("second answer")
    missing = ollie("sessions", "show", "nosuch")
    assert missing.returncode == 1 and "no stored session 'nosuch'" in missing.stderr


def test_sessions_show_finds_a_killed_sessions_transcript(script):
    """`kill <id>` (or `rm -r s/<id>`) moves a session to transcripts/ for a while: `ollie sessions
    show` finds it there too (it said "no stored session")."""
    out = ollie("run", "--backend", "scripted", "--script", script([{"text": "an answer"}]), "a question")
    sid = out.stderr.split("session: ")[1].split()[0]
    data = Path(os.environ["OLLIE_DATA_PATH"])
    (data / "transcripts").mkdir(exist_ok=True)
    (data / "sessions" / sid).rename(data / "transcripts" / sid)  # as the file server's kill does
    shown = ollie("sessions", "show", sid)
    assert shown.returncode == 0 and "assistant: an answer" in shown.stdout, shown.stderr
    assert f"{sid} was killed" in shown.stderr


def test_a_server_that_cannot_be_reached_is_reported_once_on_stderr(monkeypatch):
    """The chat shows the turn's error, stderr the one-line reason: the context length's own
    failure to reach the same server said it a third time."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("OLLIE_OPENAI_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OLLIE_OPENAI_KEY", "k")
    out = ollie("run", "--backend", "openai", "--model", "m", "hi")
    assert out.returncode == 1 and out.stderr.count("cannot reach") == 1, out.stderr
    assert out.stderr.splitlines()[-1].startswith("ollie: openai: cannot reach") and "error: " in out.stdout


def test_unknown_backend_lists_the_known_ones():
    out = ollie("run", "--backend", "nope", "hi")
    assert out.returncode == 1
    assert "unknown backend 'nope'; known backends:" in out.stderr and "openai" in out.stderr


def test_bad_agent_config_names_file_field_and_fix(ollie_dirs):
    agents = ollie_dirs / "cfg" / "agents"
    agents.mkdir()
    (agents / "bad.json").write_text(json.dumps({"maxSteps": "ten"}))
    out = ollie("run", "--agent", "bad", "--backend", "scripted", "--script", "/dev/null", "hi")
    assert out.returncode == 1
    assert f"{agents / 'bad.json'}: field 'maxSteps' must be int" in out.stderr


@pytest.mark.parametrize(
    "field, said",
    [
        ({"temperature": float("nan")}, "field 'temperature': temperature: must be a finite number, got nan"),
        ({"topP": 2}, "field 'topP': top_p: must be at most 1.0, got 2.0"),
        ({"maxTokens": 0}, "field 'maxTokens': max_tokens: must be at least 1, got 0"),
        ({"maxSteps": -4}, "maxSteps and contextWindow are counts"),
    ],
)
def test_an_agent_config_with_a_value_no_provider_takes_is_refused_naming_it(field, said):
    """`"temperature": NaN` (which Python's JSON reads) was taken, and every request of the agent
    failed: NaN is no JSON."""
    from ollie import config
    from ollie.types import ConfigError

    with pytest.raises(ConfigError) as refused:
        config.parse_agent("x", field, "agents/x.json")
    assert str(refused.value).startswith("agents/x.json: ") and said in str(refused.value)


def test_trusted_tools_is_refused_not_ignored(ollie_dirs):
    # Go's agent configs have it; accepted and ignored, it would look like a grant that is not there.
    agents = ollie_dirs / "cfg" / "agents"
    agents.mkdir()
    (agents / "go.json").write_text(json.dumps({"trustedTools": ["execute_code"]}))
    out = ollie("run", "--agent", "go", "--backend", "scripted", "--script", "/dev/null", "hi")
    assert out.returncode == 1
    assert f"{agents / 'go.json'}: field 'trustedTools' is not supported" in out.stderr
    assert '"sandboxes"' in out.stderr and "Remove the field" in out.stderr


def test_backends_marks_the_one_the_default_agent_runs_on(ollie_dirs):
    assert "local  (default)" in ollie("backends").stdout.splitlines()  # no key, no agent: the embedded one
    (ollie_dirs / "cfg" / "agents").mkdir()
    (ollie_dirs / "cfg" / "agents" / "default.json").write_text(json.dumps({"backend": "scripted"}))
    listed = ollie("backends").stdout.splitlines()
    assert "scripted  (default)" in listed and "local" in listed


def test_version():
    version = ollie("--version")
    assert version.returncode == 0 and version.stdout.startswith("ollie ")


# What no command that only prints needs: the agent and its loop, the servers, the frontends, the
# sandbox, the model SDKs. `ollie --help` and `--version` need none of ollie's own types either.
NOT_FOR_PLAIN_COMMANDS = (
    "asyncio", "ssl", "ctypes", "ollie.agent", "ollie.fs", "ollie.vfs", "ollie.tui", "ollie.web",
    "ollie.sandbox", "ollie.tools", "ollie.backends.openai", "ollie.backends.anthropic", "ollie.backends.local",
    "openai", "anthropic", "httpx", "mcp", "llama_cpp", "ray", "prompt_toolkit", "pygments", "markdown_it",
)  # fmt: skip
NOT_FOR_HELP = (*NOT_FOR_PLAIN_COMMANDS, "ollie.types", "ollie.config", "ollie.chatfmt", "dataclasses", "json")
# `ollie sessions` reads the agent's session store, and only it.
NOT_FOR_SESSIONS = (
    *(m for m in NOT_FOR_PLAIN_COMMANDS if m != "ollie.agent"),
    "ollie.agent.core", "ollie.agent.opening", "ollie.agent.loop", "ollie.plans",
)  # fmt: skip


@pytest.mark.parametrize(
    "argv, unneeded",
    [
        (["--help"], NOT_FOR_HELP),
        (["--version"], NOT_FOR_HELP),
        (["run", "--help"], NOT_FOR_HELP),
        (["backends"], NOT_FOR_PLAIN_COMMANDS),
        (["keys", "list"], NOT_FOR_PLAIN_COMMANDS),
        (["completion", "bash"], NOT_FOR_PLAIN_COMMANDS),
        (["sessions"], NOT_FOR_SESSIONS),
    ],
)
def test_commands_that_only_print_import_nothing_heavy(argv, unneeded):
    """Start-up (issue 30: within 5x `python -c pass`) stays fast only while these stay out."""
    code = (
        "import sys; from ollie.cli import main\n"
        f"try: main({argv!r})\n"
        "except SystemExit: pass\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {unneeded!r} or m.startswith({unneeded!r})), "
        "file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stderr.splitlines()[-1] == "[]", out.stderr


def test_env_file_fills_unset_variables(ollie_dirs, script):
    (ollie_dirs / "cfg" / "env").write_text("# comment\nOLLIE_BACKEND=scripted\n")
    out = ollie("run", "--script", script([{"text": "from env file"}]), "hi")
    assert out.returncode == 0, out.stderr
    assert "from env file" in out.stdout


def test_run_on_the_embedded_model_by_default_makes_a_real_tool_call(tmp_path):
    """The README's first command: no backend configured, no key: the local model, offline."""
    for name in ("a.txt", "b.txt", "c.txt"):
        (tmp_path / name).write_text(name)
    out = ollie("run", "How many files are in this directory?", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert '-> execute_code({"steps": [{"code": "ls | wc -l"}]})\n3\n' in out.stdout
    assert out.stdout.startswith("assistant:") or out.stdout.startswith("->")


@pytest.mark.parametrize(
    "sig, said",
    [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "stopped by SIGTERM"), (signal.SIGHUP, "stopped by SIGHUP")],
)
def test_ctrl_c_or_a_stop_ends_the_turn_at_once_keeps_what_it_completed_and_exits_as_signalled(
    script, tmp_path, sig, said
):
    """Ctrl-C, `timeout` or `docker stop` (SIGTERM), a closed terminal (SIGHUP): the turn stops,
    what it completed and its cost are saved, and the session is named (SIGTERM killed the run,
    leaving the session's metadata unsaved and its id unsaid)."""
    path = script(
        [
            {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "echo first"}]}}]},
            {"delay": 60, "text": "too late"},
        ]
    )
    proc = subprocess.Popen(
        [*OLLIE, "run", "--script", path, "--cwd", str(tmp_path), "go"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("-> execute_code(")
        assert proc.stdout.readline() == "first\n"  # the slow second step has begun
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)  # not 60 s: the delay is cut short
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + sig, err
    assert ":: interrupted" in out and "too late" not in out
    sid = err.split("session: ")[1].split()[0]
    assert f"ollie: {said}; the session is saved (continue with --session {sid})" in err
    shown = ollie("sessions", "show", sid).stdout
    assert "user: go\n" in shown and "first\n" in shown
    assert f"{sid}\t" in ollie("sessions").stdout and "\tgo" in ollie("sessions").stdout  # listed with its first prompt


def test_a_script_with_turns_never_requested_fails_the_run(script):
    out = ollie("run", "--script", script([{"text": "one"}, {"text": "two"}]), "hi")
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == "ollie: scripted backend: 1 turn(s) never requested: {'text': 'two'}"


def test_script_implies_the_scripted_backend_and_refuses_another(script):
    path = script([{"text": "scripted answer"}])
    ok = ollie("run", "--script", path, "hi")
    assert ok.returncode == 0 and "scripted answer" in ok.stdout, ok.stderr
    wrong = ollie("run", "--backend", "local", "--script", path, "hi")
    assert wrong.returncode == 1
    assert wrong.stderr == "ollie: --script is for --backend scripted, not --backend local\n"
    missing = ollie("run", "--script", "/nonexistent/turns.yaml", "hi")
    assert missing.returncode == 1
    assert (
        missing.stderr
        == "ollie: scripted backend: cannot read script /nonexistent/turns.yaml: No such file or directory\n"
    )


def test_bad_prompts_and_session_ids_are_refused_before_anything_starts(script, ollie_dirs):
    path = script([{"text": "never"}])
    empty = ollie("run", "--script", path, "  ")
    assert (empty.returncode, empty.stderr) == (2, "ollie run: the prompt is empty\n")
    typo = ollie("run", "--script", path, "--session", "1234-abcdef", "hi")
    assert typo.returncode == 1 and "no stored session '1234-abcdef'" in typo.stderr
    for argv in (["run", "--script", path, "--session", "../x", "hi"], ["sessions", "show", "../x"]):
        bad = ollie(*argv)
        assert bad.returncode == 1 and bad.stderr.startswith("ollie: invalid session id '../x'"), bad.stderr
    assert not (ollie_dirs / "data" / "sessions").exists() or not any((ollie_dirs / "data" / "sessions").iterdir())


def test_json_output_still_names_the_session_on_stderr(script):
    out = ollie("run", "--json", "--script", script([{"text": "hi"}]), "hello")
    assert out.returncode == 0, out.stderr
    sid = out.stderr.split("session: ")[1].split()[0]
    assert "assistant: hi" in ollie("sessions", "show", sid).stdout


def test_a_data_directory_that_cannot_be_created_is_one_line_not_a_traceback(script, monkeypatch):
    monkeypatch.setenv("OLLIE_DATA_PATH", "/proc/ollie-data")
    out = ollie("run", "--script", script([{"text": "hi"}]), "hello")
    assert out.returncode == 1
    assert out.stderr.startswith("ollie: /proc/ollie-data: ") and "Traceback" not in out.stderr


# Each drives a terminal: retitles the window, clears the screen, colours, overwrites what was written
# (CR, BS), an 8-bit CSI, a hyperlink ended by ST.
ESCAPES = "\x1b]0;pwned\x07 \x1b[2J \x1b[31mred\x1b[0m safe\rEVIL abc\x08\x08\x08XYZ \x9b31m \x1b]8;;http://x\x1b\\link"
RAW = [b"\x1b", b"\x07", b"\r", b"\x08", "\x9b".encode()]


def test_run_shows_control_characters_from_the_model_and_tools_escaped(ollie_dirs, tmp_path):
    calc = Path(__file__).parent / "mcp_servers" / "calc.py"
    (ollie_dirs / "cfg" / "agents").mkdir()
    (ollie_dirs / "cfg" / "agents" / "calc.json").write_text(
        json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": [str(calc)]}}})
    )
    path = tmp_path / "turns.json"
    path.write_text(
        json.dumps(
            [
                {
                    "text": "model " + ESCAPES,
                    "tool_calls": [{"name": "echo", "arguments": {"text": "tool " + ESCAPES}}],
                },
                {"text": "end", "expect": "tool " + ESCAPES},
            ]
        )
    )
    run = [*OLLIE, "run", "--agent", "calc", "--script", str(path)]
    out = subprocess.run([*run, "go"], capture_output=True, timeout=120)  # bytes: text mode would eat CRs
    assert out.returncode == 0, out.stderr
    sid = out.stderr.decode().split("session: ")[1].split()[0]
    chat = (ollie_dirs / "data" / "sessions" / sid / "chat").read_bytes()
    for shown in (out.stdout, chat):
        assert [raw for raw in RAW if raw in shown] == []
        text = shown.decode()
        assert "assistant: model \\x1b]0;pwned\\x07 \\x1b[2J \\x1b[31mred\\x1b[0m safe\\x0dEVIL" in text
        assert "\ntool \\x1b]0;pwned\\x07" in text
        assert "abc\\x08\\x08\\x08XYZ \\x9b31m \\x1b]8;;http://x\\x1b\\link" in text

    out = subprocess.run([*run, "--json", "go"], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [raw for raw in RAW if raw in out.stdout] == []
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert next(e["text"] for e in events if e["kind"] == "assistant") == "model " + ESCAPES
    assert next(e["text"] for e in events if e["kind"] == "tool") == "tool " + ESCAPES


def test_tools_call_and_list_show_what_a_tool_says_escaped(ollie_dirs):
    """A tool's output (success or failure), and a tool server's failure in its own words, reach
    the terminal escaped; `--json` carries them intact, as ASCII."""
    calc = Path(__file__).parent / "mcp_servers" / "calc.py"
    evil = f"import sys; sys.stderr.write({ESCAPES!r}); sys.exit(3)"
    (ollie_dirs / "cfg" / "agents").mkdir()
    (ollie_dirs / "cfg" / "agents" / "calc.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "calc": {"command": sys.executable, "args": [str(calc)]},
                    "evil": {"command": sys.executable, "args": ["-c", evil]},
                }
            }
        )
    )
    tools = [*OLLIE, "tools"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*tools, *args, "--agent", "calc"], capture_output=True, timeout=120)

    echoed = run("call", "echo", json.dumps({"text": "tool " + ESCAPES}))
    assert echoed.returncode == 0, echoed.stderr
    assert [raw for raw in RAW if raw in echoed.stdout + echoed.stderr] == []
    assert echoed.stdout.decode().startswith("tool \\x1b]0;pwned\\x07 \\x1b[2J \\x1b[31mred\\x1b[0m safe\\x0dEVIL")
    failed = run("call", "fail", json.dumps({"reason": ESCAPES}))
    assert failed.returncode == 1
    assert [raw for raw in RAW if raw in failed.stderr] == []
    assert "failed on purpose: \\x1b]0;pwned\\x07" in failed.stderr.decode()

    listed = run("list")
    assert listed.returncode == 0, listed.stderr
    assert [raw for raw in RAW if raw in listed.stdout + listed.stderr] == []
    assert "evil: unavailable: " in listed.stdout.decode() and "\\x1b]8;;http://x\\x1b\\link" in listed.stdout.decode()
    assert ":: mcp server evil failed: " in listed.stderr.decode()
    as_json = run("list", "--json")
    assert [raw for raw in RAW if raw in as_json.stdout] == [] and as_json.stdout.isascii()
    assert "\x1b]8;;http://x\x1b\\link" in json.loads(as_json.stdout)["evil"]["error"]


def test_tools_call_runs_execute_code_under_the_policies_its_agent_allows(ollie_dirs, tmp_path):
    """`--agent NAME` is that agent's tools as a session of it has them: its "sandboxes" are the
    policies execute_code may run under, no more and no fewer."""
    (ollie_dirs / "cfg" / "sandbox").mkdir()
    (ollie_dirs / "cfg" / "sandbox" / "wide.yaml").write_text("filesystem:\n  rw: [/var/tmp]\n")
    (ollie_dirs / "cfg" / "agents").mkdir()
    (ollie_dirs / "cfg" / "agents" / "wide.json").write_text(json.dumps({"sandboxes": ["default", "wide"]}))
    call = json.dumps({"steps": [{"code": "touch ran && echo ran"}], "sandbox": "wide"})

    refused = ollie("tools", "call", "execute_code", call, "--cwd", str(tmp_path))  # the default agent
    assert refused.returncode == 1 and not (tmp_path / "ran").exists()
    assert "sandbox: policy 'wide' is not allowed for this agent; it may use default" in refused.stderr

    ran = ollie("tools", "call", "execute_code", call, "--agent", "wide", "--cwd", str(tmp_path))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "ran\n" and (tmp_path / "ran").exists()


def test_a_call_without_a_policy_runs_under_the_first_its_agent_lists_and_a_missing_one_is_named(ollie_dirs, tmp_path):
    """An agent whose "sandboxes" lacked `default` had every call refused ("policy 'default' is
    not allowed"), and one naming no policy there was taken and failed each call alike."""
    (ollie_dirs / "cfg" / "sandbox").mkdir()
    (ollie_dirs / "cfg" / "sandbox" / "wide.yaml").write_text("filesystem:\n  rw: [/var/tmp]\n")
    agents = ollie_dirs / "cfg" / "agents"
    agents.mkdir()
    (agents / "wide.json").write_text(json.dumps({"sandboxes": ["wide"]}))
    (agents / "typo.json").write_text(json.dumps({"sandboxes": ["default", "wdie"]}))
    mark = Path("/var/tmp") / f"ollie-test-{os.getpid()}"
    call = json.dumps({"steps": [{"code": f"touch {mark} && echo ran"}]})
    try:
        ran = ollie("tools", "call", "execute_code", call, "--agent", "wide", "--cwd", str(tmp_path))
        assert ran.returncode == 0 and ran.stdout == "ran\n" and mark.exists(), ran.stderr
    finally:
        mark.unlink(missing_ok=True)
    typo = ollie("tools", "call", "execute_code", call, "--agent", "typo", "--cwd", str(tmp_path))
    assert typo.returncode == 1 and not mark.exists()
    assert f"{agents / 'typo.json'}: sandboxes: no sandbox policy 'wdie': create " in typo.stderr, typo.stderr


def test_a_script_turn_that_is_no_object_is_refused_naming_it(script):
    out = ollie("run", "--script", script([{"text": "one"}, "two"]), "hi")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "ollie: scripted backend: turn 2 (index 1) must be an object with keys such as "
        "text and tool_calls, not str 'two'"
    )


def test_the_top_help_says_what_ollie_alone_does_and_commands_keep_their_own_usage():
    """`ollie` alone, or with `--new`, `--resume`, `--session`, `--addr`, is `ollie chat`: the
    top help listed only COMMAND, so those options were nowhere to be seen."""
    top = ollie("--help").stdout
    assert "ollie [--new | --resume | --session ID]" in top and "ollie chat --help" in top, top
    assert ollie("chat", "--help").stdout.startswith("usage: ollie chat [-h]")
