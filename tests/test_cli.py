"""The `ollie` command as a user runs it: a real subprocess with the scripted backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
    path = script([
        {"text": "Looking.", "tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "cat a.txt"}]}}]},
        {"text": "It says alpha.", "expect": "alpha"},
    ])
    out = ollie("run", "--backend", "scripted", "--script", path, "--cwd", str(tmp_path), "what is in a.txt?")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ('assistant: Looking.\n-> execute_code({"steps": [{"code": "cat a.txt"}]})\nalpha\n'
                          "assistant: It says alpha.\n\n")
    assert out.stderr.startswith("session: ")


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
    again = ollie("run", "--session", sid, "--backend", "scripted",
                  "--script", script([{"text": "second answer", "expect": "follow-up"}]), "follow-up")
    assert again.returncode == 0, again.stderr
    shown = ollie("sessions", "show", sid).stdout
    assert shown.index("first answer") < shown.index("user: follow-up") < shown.index("second answer")
    missing = ollie("sessions", "show", "nosuch")
    assert missing.returncode == 1 and "no stored session 'nosuch'" in missing.stderr


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


def test_help_and_version_import_no_sdk():
    code = ("import sys; from ollie.cli import build_parser; build_parser().format_help(); "
            "heavy = [m for m in ('openai', 'anthropic', 'mcp', 'llama_cpp', 'mfusepy', 'httpx') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
    version = ollie("--version")
    assert version.returncode == 0 and version.stdout.startswith("ollie ")


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
