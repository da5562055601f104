"""The two examples of the seeds' IDEAS.md, copied verbatim, run against the real mount.

The develop -> review -> test script counts `ls s/` and picks the new sessions by `sort | sed -n`;
spawn_subagents.py diffs `s/` and polls `reply`'s size. Both use `~/mnt/ollie`: HOME is the test's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fs_helpers import FsServer

pytestmark = pytest.mark.timeout(120)

DEVELOP_REVIEW_TEST_SH = r"""#!/bin/sh
cwd=${1:?usage: $0 <cwd>}
cd ~/mnt/ollie

# Count existing sessions so we can identify the newly created ones by offset.
n=$(ls s/ | wc -l)

echo "new agent=developer cwd=$cwd" > ctl
echo "new agent=reviewer  cwd=$cwd" > ctl
echo "new agent=tester    cwd=$cwd" > ctl

dev=$(ls s/ | sort | sed -n "$((n+1))p")
rev=$(ls s/ | sort | sed -n "$((n+2))p")
tst=$(ls s/ | sort | sed -n "$((n+3))p")

wait_reply() {
    while [ "$(wc -c < s/$1/reply)" -eq 0 ]; do sleep 1; done
}

echo "implement a function that parses a JSON config file" > s/$dev/prompt

while true; do
    wait_reply $dev
    code=$(cat s/$dev/reply)

    # review phase
    printf "Review the following code. End your response with LGTM if it is ready, or PTAL if it needs revision.\n\n%s" "$code" > s/$rev/prompt
    wait_reply $rev

    if ! grep -qi "LGTM" s/$rev/reply; then
        { echo "revise this code based on the feedback below."
          echo "--- code ---";     echo "$code"
          echo "--- feedback ---"; cat s/$rev/reply
        } > s/$dev/prompt
        continue
    fi

    # test phase
    printf "Test the following code. End your response with Approved if all tests pass, or Rejected if they do not.\n\n%s" "$code" > s/$tst/prompt
    wait_reply $tst

    if grep -qi "Approved" s/$tst/reply; then
        echo "done."
        echo "$code"
        break
    fi

    { echo "fix the failures reported below."
      echo "--- code ---";        echo "$code"
      echo "--- test report ---"; cat s/$tst/reply
    } > s/$dev/prompt
done
"""

SPAWN_SUBAGENTS_PY = r'''#!/usr/bin/env python3
"""spawn_subagents.py — fan out tasks to ephemeral olliesrv sub-agents.

Input  (stdin):  JSON array of {"task": str, "agent": str, "context": str}
Output (stdout): JSON array of {"agent": str, "reply": str}

Install in ~/.config/ollie/tools/ to make available via execute_tool.
"""

import json, os, sys, threading, time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

BASE         = Path.home() / "mnt" / "ollie"
POLL         = 0.5
_spawn_lock  = threading.Lock()


def session_ids():
    return {e.name for e in (BASE / "s").iterdir() if e.is_dir()}

def spawn_session(agent="default", cwd=""):
    with _spawn_lock:
        before = session_ids()
        (BASE / "ctl").write_text(f"new agent={agent} cwd={cwd}\n")
        while True:
            new = session_ids() - before
            if new:
                return new.pop()
            time.sleep(0.1)

def kill_session(sid):
    (BASE / "ctl").write_text(f"kill {sid}\n")

def wait_reply(sid):
    path = BASE / "s" / sid / "reply"
    while True:
        if path.stat().st_size > 0:
            return path.read_text().strip()
        time.sleep(POLL)

def run_subagent(spec):
    agent   = spec.get("agent", "default")
    cwd     = spec.get("cwd", "")
    context = spec.get("context", "")
    task    = spec.get("task", "")
    sid     = spawn_session(agent, cwd)
    try:
        prompt = f"{context}\n\n{task}".strip() if context else task
        (BASE / "s" / sid / "prompt").write_text(prompt)
        return {"agent": agent, "reply": wait_reply(sid)}
    finally:
        kill_session(sid)

def main():
    specs   = json.load(sys.stdin)
    results = [None] * len(specs)
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = {pool.submit(run_subagent, s): i for i, s in enumerate(specs)}
        for f in as_completed(futures):
            results[futures[f]] = f.result()
    json.dump(results, sys.stdout, indent=2)
    print()

if __name__ == "__main__":
    main()
'''


@pytest.fixture
def server(tmp_path):
    srv = FsServer(tmp_path)
    code_v1 = "def parse_config(path):\n    return json.load(open(path))"
    code_v2 = "# v2\ndef parse_config(path):\n    with open(path) as f:\n        return json.load(f)"
    srv.agent("developer", [{"match": "^(revise|fix)", "text": code_v2}, {"match": ".", "text": code_v1}])
    srv.agent(
        "reviewer",
        [
            {"match": "# v2", "text": "Closes the file now. LGTM"},
            {"match": ".", "text": "The file is never closed. PTAL"},
        ],
    )
    srv.agent("tester", [{"match": ".", "text": "All 3 tests pass. Approved"}])
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("existing", ["unnamed", "renamed", "named", "renamed by ctl"])
def test_develop_review_test_script(server, existing):
    """The script picks its sessions by their offset in `ls s/ | sort`: the sessions there before it
    must sort before the ones it makes. A session you named (`mv`, ctl `rn`, `new name=`) would sort
    after them (letters after digits) and shift every offset: the script would prompt the wrong
    agents and loop for ever. It is not listed (it opens by name), so the script works whatever is
    there."""
    script = server.root / "loop.sh"
    script.write_text(DEVELOP_REVIEW_TEST_SH)
    there = [server.new_session()]  # an existing session: the script must count it and skip it
    if existing == "renamed":
        server.sh(f"mv s/{there[0]} s/review")
        there = ["review"]
    elif existing == "renamed by ctl":
        server.sh(f"echo 'rn zz-old' > s/{there[0]}/ctl")
        there = ["zz-old"]
    elif existing == "named":
        there.append(server.new_session(name="tester-old"))
    try:
        out = subprocess.run(
            ["sh", str(script), str(server.work)], env=server.env, capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the script did not end with a session {existing} there: " + server.sh("cat s/idx").stdout)
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout == "done.\n# v2\ndef parse_config(path):\n    with open(path) as f:\n        return json.load(f)\n"
    )
    sessions = sorted(p.name for p in (server.mnt / "s").iterdir())
    dev, rev, tst = sessions[-3:]
    for sid in there:
        assert (server.mnt / "s" / sid / "chat").read_text() == "", sid  # none was driven
    assert (server.mnt / "s" / dev / "cfg").read_text().count("agent=developer\n") == 1
    rev_chat = (server.mnt / "s" / rev / "chat").read_text()
    assert rev_chat.count("user: Review the following code.") == 2 and "PTAL" in rev_chat and "LGTM" in rev_chat
    dev_chat = (server.mnt / "s" / dev / "chat").read_text()
    assert "user: revise this code based on the feedback below.\n--- code ---\ndef parse_config" in dev_chat
    assert "--- feedback ---\nThe file is never closed. PTAL" in dev_chat
    assert "Approved" in (server.mnt / "s" / tst / "reply").read_text()


def test_the_develop_review_example_of_files_md_as_written(server):
    """docs/files.md's version reads each new session's id back (no offset in `ls s/` to count) and
    stops on a failed turn; run as the docs print it."""
    doc = (Path(__file__).parent.parent / "docs" / "files.md").read_text()
    block = doc[doc.index("```sh\ncd ~/mnt/ollie\nnew() {") + len("```sh\n") :]
    block = block[: block.index("```")]
    server.new_session()  # made before: no offset to count
    script = f'cwd={server.work}\n{block}idle $rev; cat s/$rev/reply; echo; echo "$dev $rev"\n'
    out = subprocess.run(["sh", "-c", script], env=server.env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    answer, ids = out.stdout.rsplit("\n", 2)[:2]
    dev, rev = ids.split()
    assert answer == "The file is never closed. PTAL"
    assert "agent=developer" in (server.mnt / "s" / dev / "cfg").read_text().splitlines()
    assert "agent=reviewer" in (server.mnt / "s" / rev / "cfg").read_text().splitlines()


def test_spawn_subagents(server):
    script = server.root / "spawn_subagents.py"
    script.write_text(SPAWN_SUBAGENTS_PY)
    specs = [
        {"task": "review this code for correctness", "agent": "reviewer", "context": "def f(): pass"},
        {"task": "test this code", "agent": "tester", "context": "def f(): pass"},
        {"task": "write a parser", "agent": "developer"},
    ]
    before = set((server.mnt / "s").iterdir())
    out = subprocess.run(
        [sys.executable, str(script)],
        input=json.dumps(specs),
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [
        {"agent": "reviewer", "reply": "The file is never closed. PTAL"},
        {"agent": "tester", "reply": "All 3 tests pass. Approved"},
        {"agent": "developer", "reply": "def parse_config(path):\n    return json.load(open(path))"},
    ]
    assert set((server.mnt / "s").iterdir()) == before  # every sub-agent was killed
    assert list((server.data / "sessions").iterdir()) == []
