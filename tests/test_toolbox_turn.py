"""The agent's toolbox end to end: a scripted agent in a session of the real file server reads, edits
and greps a file, thinks, plans and completes a step, and remembers; after the server restarts,
another session recalls what it remembered. Every tool is a default script, run by `execute_code`
in the real sandbox, installed by `ollie init`."""

from __future__ import annotations

import json

from fs_helpers import FsServer


def call(name: str, *args: str) -> dict:
    return {"name": "execute_code", "arguments": {"steps": [{"tool": name, "args": list(args)}]}}


def code(text: str) -> dict:
    return {"name": "execute_code", "arguments": {"steps": [{"code": text}]}}


PLAN_STEPS = json.dumps([{"title": "write tests"}, {"title": "fix the bug", "depends_on": ["write tests"]}])
WORKER = [
    {"tool_calls": [call("file_read", "parser.py")]},
    {
        "tool_calls": [call("file_edit", "parser.py", "items.split(',')", "items.rstrip(',').split(',')")],
        "expect": "2\t    return items.split(',')",
    },
    {"tool_calls": [call("file_grep", "rstrip", ".")]},
    {"tool_calls": [call("reasoning_think", "a trailing comma makes an empty item")], "expect": "parser.py:2:"},
    {"tool_calls": [call("task_plan", "fix the parser", PLAN_STEPS)], "expect": "noted"},
    {
        "tool_calls": [code('cd "$OLLIE_PLANS_DIR" && task_complete *fix-the-parser__todo.md TESTS')],
        "expect": "- [ ] write tests",
    },
    {
        "tool_calls": [call("memory_remember", "parser quirk", "parser,bug", "Trailing commas break it.")],
        "expect": "fix the bug",
    },
    {"text": "Fixed, planned, remembered.", "expect": "parser-quirk"},
]
RECALLER = [
    {"tool_calls": [call("memory_recall", "trailing commas")]},
    {"text": "Trailing commas break the parser.", "expect": "Trailing commas break it."},
]


def test_one_session_works_with_the_toolbox_and_another_recalls_after_a_restart(tmp_path):
    srv = FsServer(tmp_path)
    srv.agent("worker", turns=WORKER)
    srv.agent("recaller", turns=RECALLER)
    (srv.work / "parser.py").write_text("def parse(items):\n    return items.split(',')\n")
    srv.ollie("init")
    srv.env["PATH"] = f"{srv.cfg / 'tools'}:{srv.env['PATH']}"  # task_complete by name in the code stage
    srv.start()
    try:
        sid = srv.new_session(agent="worker")
        (srv.mnt / "s" / sid / "prompt").write_text("fix the parser, plan it and remember what you learn\n")
        srv.wait_idle(sid, timeout=60)
        assert (srv.mnt / "s" / sid / "reply").read_text() == "Fixed, planned, remembered."
        chat = (srv.mnt / "s" / sid / "chat").read_text()
        assert ":: thought: a trailing comma makes an empty item" in chat
        assert (srv.work / "parser.py").read_text() == "def parse(items):\n    return items.rstrip(',').split(',')\n"
        [plan] = (srv.data / "plans").glob("*fix-the-parser__todo.md")
        assert "- [x] write tests" in plan.read_text() and "- [ ] fix the bug" in plan.read_text()
        assert any("parser-quirk" in p.name for p in (srv.mnt / "m").iterdir())

        srv.stop()
        srv.start()
        other = srv.new_session(agent="recaller")
        (srv.mnt / "s" / other / "prompt").write_text("what do we know about the parser?\n")
        srv.wait_idle(other, timeout=60)
        assert (srv.mnt / "s" / other / "reply").read_text() == "Trailing commas break the parser."
        assert (srv.mnt / "s" / sid / "reply").read_text() == "Fixed, planned, remembered."  # restored
    finally:
        srv.stop()
