"""Every file of the namespace, through the real FUSE mount, with ordinary tools."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def agents(fs_server):
    fs_server.agent(
        "tooler",
        turns=[
            {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": "echo hi"}]}}]},
            {"text": "done with the tool", "expect": "hi"},
        ],
    )
    fs_server.agent(
        "default",
        [
            {"match": "slow", "text": "slow answer", "delay": 0.6},
            {"match": ".", "text": "Hello there"},
        ],
    )


def test_root_lists_the_namespace(fs_server):
    names = set(os.listdir(fs_server.mnt))
    assert {"ctl", "backends", "help", "a", "p", "sk", "t", "m", "pl", "tmp", "tr", "u", "s"} <= names
    assert "scripted" in (fs_server.mnt / "backends").read_text().split()
    assert "s/<id>/prompt" in (fs_server.mnt / "help").read_text()


def test_prompt_chat_reply_state(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    assert (s / "state").read_text() == "idle\n"
    assert (s / "reply").read_text() == ""
    fs_server.sh(f"echo 'say hello' > s/{sid}/prompt")
    fs_server.wait_idle(sid)
    assert (s / "reply").read_text() == "Hello there"
    assert os.stat(s / "reply").st_size == len("Hello there")  # spawn_subagents polls st_size
    assert (s / "chat").read_text() == "user: say hello\nassistant: Hello there\n\n"
    assert os.stat(s / "chat").st_size == len((s / "chat").read_bytes())
    assert (s / "prompt.prev").read_text().strip() == "say hello"
    assert "1 requests" in (s / "usage").read_text()
    assert "costSession=$" in (s / "cost").read_text()
    assert "%" in (s / "ctxsz").read_text()
    assert (s / "systemprompt").read_text() == "You are the default.\n"
    context = [json.loads(line) for line in (s / "context").read_text().splitlines()]
    assert [m["role"] for m in context] == ["user", "assistant"]
    offset = int((s / "offset").read_text())
    assert (s / "chat").read_bytes()[offset:].startswith(b"user: say hello")


def test_write_to_prompt_empties_reply_at_once(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    (s / "prompt").write_text("first")
    fs_server.wait_idle(sid)
    assert (s / "reply").read_text() == "Hello there"
    out = fs_server.sh(f"echo slow > s/{sid}/prompt; wc -c < s/{sid}/reply; cat s/{sid}/state")
    assert out.stdout.split() == ["0", "thinking"]
    fs_server.wait_idle(sid)
    assert (s / "reply").read_text() == "slow answer"


def test_a_command_written_to_prompt_returns_once_it_ran_and_reply_holds_what_it_said(fs_server):
    """`s/sh` writes each line to prompt, waits for idle and prints `reply`: after `/cost` or
    `!cmd` it printed the last turn's answer again."""
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    (s / "prompt").write_text("first")
    fs_server.wait_idle(sid)
    out = fs_server.sh(
        f"echo '!echo bang' > s/{sid}/prompt; cat s/{sid}/reply; echo; echo /usage > s/{sid}/prompt; cat s/{sid}/reply"
    )
    assert out.stdout.startswith("!echo bang\nbang\n") and "1 requests" in out.stdout, out.stdout
    assert "Hello there" not in out.stdout
    fs_server.sh(f"echo '/set temperature nan' > s/{sid}/prompt")
    assert (s / "reply").read_text().startswith("/set: temperature: must be a finite number")
    (s / "prompt").write_text("again")
    fs_server.wait_idle(sid)
    assert (s / "reply").read_text() == "Hello there"


def test_s_sh_talks_to_a_new_session_of_its_directory_and_says_why_a_turn_failed(fs_server):
    fs_server.agent("breaks", [{"match": "boom", "error": {"type": "other", "message": "it broke"}}])
    sh = [str(fs_server.mnt / "s" / "sh")]
    new = subprocess.run(
        sh, input="hello\n", cwd=fs_server.work, env=fs_server.env, capture_output=True, text=True, timeout=30
    )
    sid = new.stderr.split("session ")[1].split()[0]  # its own: read back from ctl, not the newest listed
    assert new.stdout == "Hello there\n" and f"\t{fs_server.work}\t" in (fs_server.mnt / "s" / "idx").read_text()
    broken = fs_server.new_session(agent="breaks")
    out = subprocess.run(
        [*sh, broken], input="boom\n", cwd=fs_server.work, env=fs_server.env, capture_output=True, text=True, timeout=30
    )
    assert out.stdout == "" and "error: scripted: it broke" in out.stderr, out
    fs_server.sh(f"rm -r s/{sid} s/{broken}")


def test_an_empty_prompt_is_refused_and_leaves_no_old_reply_to_read(fs_server):
    """A pipeline whose stage gave nothing writes a blank line: its next reader must not take the
    last turn's answer for this one."""
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    (s / "prompt").write_text("first")
    fs_server.wait_idle(sid)
    assert (s / "reply").read_text() == "Hello there"
    with pytest.raises(OSError) as refused:  # a writer that checks its close hears it
        (s / "prompt").write_text("  \n")
    assert refused.value.errno == errno.EINVAL
    assert (s / "reply").read_text() == ""
    assert (s / "chat").read_text().endswith("error: an empty prompt: nothing was sent\n")
    fs_server.sh(f"touch s/{sid}/prompt")  # an open and a close with nothing written: nothing happens


def test_idlewait_returns_once_the_turn_is_over_however_late_it_is_read(fs_server):
    """A script writes `prompt`, then waits: with `state` then `statewait`, a turn that ended
    between the two reads left the wait to its 5 s timeout; `idlewait` has no such window."""
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    started = time.monotonic()
    out = fs_server.sh(f"echo slow > s/{sid}/prompt; cat s/{sid}/idlewait; cat s/{sid}/reply")
    assert out.stdout == "idle\nslow answer" and time.monotonic() - started < 4  # the turn takes 0.6 s
    started = time.monotonic()
    assert (s / "idlewait").read_text() == "idle\n" and time.monotonic() - started < 1  # idle: at once
    assert "idlewait" not in os.listdir(s)  # it acts when read: found by name, not listed
    gone = fs_server.new_session()
    waiting = subprocess.Popen(
        ["sh", "-c", f"echo slow > s/{gone}/prompt; cat s/{gone}/idlewait"], cwd=fs_server.mnt, stderr=subprocess.PIPE
    )
    time.sleep(0.2)
    fs_server.sh(f"rm -r s/{gone}")  # the session goes while it is waited on: the wait ends
    assert waiting.wait(timeout=10) == 0  # its turn ended with it: idle, not a wait for ever


def test_queueing_while_a_turn_runs(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    fs_server.sh(f"echo slow > s/{sid}/prompt; echo second > s/{sid}/prompt")
    fs_server.wait_idle(sid)
    chat = (s / "chat").read_text()
    assert chat.index("user: slow") < chat.index("user: second")
    assert (s / "reply").read_text() == "Hello there"


def test_tool_calls_in_chat(fs_server):
    sid = fs_server.new_session(agent="tooler")
    s = fs_server.mnt / "s" / sid
    (s / "prompt").write_text("use a tool")
    fs_server.wait_idle(sid)
    chat = (s / "chat").read_text()
    assert chat.startswith('user: use a tool\n-> execute_code({"steps": [{"code": "echo hi"}]})\nhi\n')
    assert chat.endswith("assistant: done with the tool\n\n")
    assert (s / "reply").read_text() == "done with the tool"


def test_tail_f_follows_chat(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    tail = subprocess.Popen(["tail", "-f", str(s / "chat")], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        (s / "prompt").write_text("slow please")
        lines = [tail.stdout.readline() for _ in range(2)]
        assert lines == ["user: slow please\n", "assistant: slow answer\n"]
    finally:
        tail.kill()
        tail.wait()


def test_statewait_blocks_until_the_state_changes(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    waiter = subprocess.Popen(["cat", str(s / "statewait")], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    assert waiter.poll() is None
    (s / "prompt").write_text("slow")
    assert waiter.communicate(timeout=5)[0] == "thinking\n"
    fs_server.wait_idle(sid)


def test_a_blocked_statewait_reader_can_be_killed(fs_server):
    sid = fs_server.new_session()
    waiter = subprocess.Popen(["cat", str(fs_server.mnt / "s" / sid / "statewait")])
    time.sleep(0.3)
    t = time.monotonic()
    waiter.send_signal(signal.SIGKILL)
    waiter.wait(timeout=5)
    assert time.monotonic() - t < 2
    assert (fs_server.mnt / "s" / sid / "state").read_text() == "idle\n"  # the server is fine


def test_many_blocked_statewait_readers_stall_nothing(fs_server):
    """Each blocked read holds a FUSE thread: libfuse's default of 10 would stall the mount."""
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    waiters = [subprocess.Popen(["cat", str(s / "statewait")], stdout=subprocess.PIPE) for _ in range(20)]
    try:
        time.sleep(0.5)
        assert (s / "state").read_text() == "idle\n"
        assert all(w.poll() is None for w in waiters)  # answered while all twenty still wait
    finally:
        for w in waiters:
            w.kill()
            w.wait()


def test_bad_ctl_write_fails_the_writer_and_lands_in_chat(fs_server):
    sid = fs_server.new_session()
    out = fs_server.sh(f"echo bogus > s/{sid}/ctl", check=False)
    assert out.returncode != 0 and "error" in out.stderr  # dash says "I/O error", bash "Invalid argument"
    assert "error: unknown command 'bogus'" in (fs_server.mnt / "s" / sid / "chat").read_text()
    for bad in (
        f"echo 'temperature=hot' > s/{sid}/cfg",
        f"echo 'colour=red' > s/{sid}/cfg",
        "echo 'new agent=nosuch' > ctl",
        "echo 'new colour=red' > ctl",
        "echo 'frobnicate' > ctl",
        "echo 'colour=red' > s/new",
        "echo 'new name=a/b' > ctl",
        "echo 'new name=..' > ctl",
        "echo 'new name=idx' > ctl",
    ):
        out = fs_server.sh(bad, check=False)
        assert out.returncode != 0, bad
    assert "idx" not in os.listdir(fs_server.mnt / "s")


def test_a_refused_ctl_command_says_why_when_the_same_open_file_is_read(fs_server):
    """Over the mount a writer gets only the errno: the root ctl kept no word of why (`new
    agent=nosuch`, a worktree asked for outside a repository), where b/new and s/new say it."""
    assert refusal(fs_server.mnt / "ctl", b"new agent=nosuch\n").startswith("error: no agent 'nosuch'")


def refusal(path: Path, line: bytes) -> str:
    """What `path` says when read back on the open file whose write of `line` failed (EINVAL)."""
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(OSError) as refused:
            os.write(fd, line)
        assert refused.value.errno == errno.EINVAL
        return os.pread(fd, 4096, 0).decode()
    finally:
        os.close(fd)


def test_a_shell_reads_the_new_id_back_where_its_write_ended(fs_server):
    """`exec 3<>ctl; echo new … >&3; read -r id <&3` (ctl, s/new, b/new): a shell cannot seek, and
    its read comes at the offset its write left (it read nothing there); from the start still works."""
    work = fs_server.work
    script = f"""
    exec 3<> ctl; echo "new cwd={work} name=by-ctl" >&3; read -r id <&3; echo "ctl $id"; exec 3>&-
    exec 3<> s/new; printf 'cwd={work}\nname=by-new\n' >&3; read -r id <&3; echo "new $id"; exec 3>&-
    exec 3<> b/new; printf 'name=by-job\n---\nhi\n' >&3; read -r id <&3; echo "job $id"; exec 3>&-
    exec 3<> ctl; echo "new agent=nosuch" >&3 2>/dev/null; read -r why <&3; echo "refused $why"
    """
    out = fs_server.sh(script).stdout.splitlines()
    ids = {line.split()[0]: line.split()[1] for line in out if not line.startswith("refused")}
    assert ids == {"ctl": "by-ctl", "new": "by-new", "job": "by-job-0"}, out  # a named session's id is its name
    assert (fs_server.mnt / "s" / "by-ctl" / "cfg").exists() and (fs_server.mnt / "s" / "by-new" / "cfg").exists()
    assert out[-1].startswith("refused error: no agent 'nosuch'"), out
    fd = os.open(fs_server.mnt / "ctl", os.O_RDWR)
    try:  # the same answer from the start, and nothing past it
        os.write(fd, f"new cwd={work}\n".encode())
        answer = os.pread(fd, 4096, 0)
        assert re.fullmatch(rb"\d+-[0-9a-f]{6}\n", answer) and os.read(fd, 4096) == answer
        assert os.read(fd, 4096) == b""
    finally:
        os.close(fd)


def test_cfg_reads_and_writes(fs_server):
    sid = fs_server.new_session()
    cfg = fs_server.mnt / "s" / sid / "cfg"
    text = cfg.read_text()
    assert "state=idle\n" in text and "backend=scripted\n" in text and f"cwd={fs_server.work}\n" in text
    fs_server.sh(f"printf 'temperature=0.3\\nmax_tokens=99\\n' > s/{sid}/cfg")
    text = cfg.read_text()
    assert "temperature=0.3\n" in text and "max_tokens=99\n" in text
    fs_server.sh(f"echo cwd=/tmp > s/{sid}/cfg")
    assert "cwd=/tmp\n" in cfg.read_text()


def test_cfg_written_back_as_read_changes_only_what_differs(fs_server):
    """An editor writes the whole file back: state= and the unchanged keys must pass."""
    sid = fs_server.new_session()
    fs_server.sh(f"""echo 'response_format={{"type": "json_object"}}' > s/{sid}/cfg""")
    edited = fs_server.work / "cfg.edited"
    fs_server.sh(f"sed 's/^top_p=.*/top_p=0.5/' s/{sid}/cfg > {edited} && cat {edited} > s/{sid}/cfg")
    text = (fs_server.mnt / "s" / sid / "cfg").read_text()
    assert "top_p=0.5\n" in text and 'response_format={"type": "json_object"}\n' in text
    assert "error" not in (fs_server.mnt / "s" / sid / "chat").read_text()
    assert fs_server.sh(f"echo state=thinking > s/{sid}/cfg", check=False).returncode != 0
    assert fs_server.sh(f"echo model= > s/{sid}/cfg", check=False).returncode != 0  # not silently ignored


def test_ctl_commands(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    (s / "prompt").write_text("hello")
    fs_server.wait_idle(sid)
    fs_server.sh(f"echo save > s/{sid}/ctl")
    assert (fs_server.mnt / "tr" / sid).read_text() == (s / "chat").read_text()
    fs_server.sh(f"echo clear > s/{sid}/ctl")
    assert (s / "context").read_text() == ""
    fs_server.sh(f"echo 'cwd /tmp' > s/{sid}/ctl")
    assert "cwd=/tmp\n" in (s / "cfg").read_text()


def test_a_sessions_ctl_refuses_kill_with_an_id_rather_than_end_itself(fs_server):
    """`kill <id>` is the root ctl's; written to a session's own ctl it ended that session, not
    the one named (`echo "kill $B" > s/$A/ctl` killed A)."""
    a, b = fs_server.new_session(), fs_server.new_session()
    refused = fs_server.sh(f"echo 'kill {b}' > s/{a}/ctl", check=False)
    assert refused.returncode != 0, refused.stderr  # (dash says "I/O error" for any errno)
    assert (fs_server.mnt / "s" / a / "state").exists() and (fs_server.mnt / "s" / b / "state").exists()
    assert f"write `kill {b}` to the root ctl" in (fs_server.mnt / "s" / a / "chat").read_text()
    fs_server.sh(f"echo kill > s/{a}/ctl")
    assert not (fs_server.mnt / "s" / a).exists() and (fs_server.mnt / "s" / b / "state").exists()


def test_a_cwd_in_ollies_own_directories_is_refused_at_once(fs_server):
    """`new cwd=$OLLIE_CFG_PATH`, or `cwd $OLLIE_DATA_PATH` to a session's ctl, was accepted, and
    every tool call of the session then refused: refused where it is asked for, saying why."""
    cfg = fs_server.env["OLLIE_CFG_PATH"]
    assert "lies in ollie's own directory" in refusal(fs_server.mnt / "ctl", f"new cwd={cfg}/agents\n".encode())
    sid = fs_server.new_session()
    data = fs_server.env["OLLIE_DATA_PATH"]
    assert fs_server.sh(f"echo 'cwd {data}' > s/{sid}/ctl", check=False).returncode != 0
    assert f"cwd: {data} lies in ollie's own directory" in (fs_server.mnt / "s" / sid / "chat").read_text()


def test_s_new_says_why_it_refused_when_read_back(fs_server):
    """As the root ctl does: a refused line fails its write (the errno), and the file read back
    says why (it gave the template); one refused at the read that makes the session says so too."""
    assert refusal(fs_server.mnt / "s" / "new", b"bogus=1\n").startswith("error: unknown key 'bogus'")
    fd = os.open(fs_server.mnt / "s" / "new", os.O_RDWR)
    try:
        os.write(fd, f"cwd={fs_server.work}\nbackend=scripted\nmodel=/nonexistent/script.json".encode())
        said = os.pread(fd, 4096, 0).decode()  # (the last line, unended, is taken at this read)
        assert said.startswith("error: ") and "script" in said, said
    finally:
        os.close(fd)


def test_a_name_that_looks_like_a_made_id_is_refused(fs_server):
    """s/ lists the made ids, in the order they were made, and scripts diff it for new sessions:
    a name of that shape was listed among them (`rn 1796559999999999999-abcdef`)."""
    sid = fs_server.new_session()
    assert fs_server.sh(f"echo 'rn 1796559999999999999-abcdef' > s/{sid}/ctl", check=False).returncode != 0
    assert "looks like an id the server makes" in (fs_server.mnt / "s" / sid / "chat").read_text()
    assert fs_server.sh("echo 'new name=123-abcdef' > ctl", check=False).returncode != 0
    fs_server.sh(f"echo 'rn 123-abcdef-notes' > s/{sid}/ctl")  # (a name of another shape is one)
    assert "123-abcdef-notes" not in os.listdir(fs_server.mnt / "s")


def test_fifo_in_queues_and_starts_when_idle_fifo_out_pops(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    (s / "fifo.in").write_text("hello from the fifo")
    fs_server.wait_idle(sid)
    assert "user: hello from the fifo" in (s / "chat").read_text()
    (s / "prompt").write_text("slow")
    (s / "fifo.in").write_text("later one")
    os.stat(s / "fifo.out")  # stat pops nothing
    assert (s / "fifo.out").read_text() == "later one\n"
    assert (s / "fifo.out").read_text() == ""
    fs_server.wait_idle(sid)
    assert "later one" not in (s / "chat").read_text()


@pytest.mark.parametrize("verb", ["queue", "inject", "irw"])
def test_ctl_queue_and_inject_on_an_idle_session_start_the_turn(fs_server, verb):
    """As fifo.in does: idle means nothing is queued, so these start the turn."""
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    with open(s / "ctl", "r+") as ctl:
        ctl.write(f"{verb} slow, by {verb}\n")  # answered after 0.6 s
        ctl.flush()
        assert (s / "state").read_text() == "thinking\n"  # started before the write returned
        ctl.seek(0)
        assert ctl.read() == "started: the session was idle\n"
    fs_server.wait_idle(sid)
    assert (s / "chat").read_text() == f"user: slow, by {verb}\nassistant: slow answer\n\n"
    assert (s / "fifo.out").read_text() == ""  # nothing left waiting


def test_fifo_in_takes_the_prompt_without_echos_newline(fs_server):
    sid = fs_server.new_session()
    fs_server.sh(f"echo slow > s/{sid}/prompt; echo from the fifo > s/{sid}/fifo.in")  # queued, then run
    fs_server.wait_idle(sid)
    s = fs_server.mnt / "s" / sid
    assert json.loads((s / "context").read_text().splitlines()[2])["content"] == "from the fifo"
    assert (s / "chat").read_text().endswith("\n\nuser: from the fifo\nassistant: Hello there\n\n")


def test_stat_never_reads(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    for name in ("models", "fifo.out", "mcp", "context", "systemprompt"):
        assert os.stat(s / name).st_size == 0
    assert (s / "models").read_text() != ""  # reading does ask the backend


def test_a_walk_over_sessions_neither_blocks_nor_pops_nor_asks_the_backend(fs_server):
    # statewait blocks, fifo.out pops, models and mcp ask the backend and the tool servers: found by
    # name, never listed, so `grep -r`, `find` and `ls` walk past them.
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    fs_server.sh(f"echo slow > s/{sid}/prompt; echo queued-prompt > s/{sid}/fifo.in")
    walked = fs_server.sh(f"find s/{sid} -type f").stdout.split()
    assert not {"statewait", "fifo.out", "models", "mcp"} & {os.path.basename(p) for p in walked}
    assert {"chat", "prompt", "ctl", "state", "cfg", "usage", "ctxsz"} <= {os.path.basename(p) for p in walked}
    grep = fs_server.sh(f"grep -r queued-prompt s/{sid}", check=False)
    assert grep.returncode in (0, 1) and "fifo.out" not in grep.stdout
    assert (s / "fifo.out").read_text() == "queued-prompt\n"  # still queued: the walk popped nothing
    assert (s / "statewait").read_text() in ("thinking\n", "idle\n")  # by name it still answers


def test_plan_env_and_mcp(fs_server):
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    fs_server.sh(f"printf '# goal\\n- [ ] step\\n' > s/{sid}/plan")
    assert (s / "plan").read_text() == "# goal\n- [ ] step\n"
    assert (fs_server.data / "sessions" / sid / "plan").read_text() == "# goal\n- [ ] step\n"
    fs_server.sh(f"echo FOO=bar > s/{sid}/env")
    assert "FOO=bar\n" in (s / "env").read_text()
    assert "execute" in (s / "mcp").read_text()


def test_s_listing_hides_fixed_files_and_is_in_creation_order(fs_server):
    ids = [fs_server.new_session() for _ in range(3)]
    listing = os.listdir(fs_server.mnt / "s")
    assert not {"new", "idx", "sh", "ls", "kill"} & set(listing)
    assert [i for i in listing if i in ids] == ids
    assert sorted(listing) == listing
    template = (fs_server.mnt / "s" / "new").read_text()
    assert template == "name=\ncwd=\nbackend=\nmodel=\nagent=\nworktree=\n"
    # The template filled in and written back whole makes a session: an empty value is the default.
    with open(fs_server.mnt / "s" / "new", "r+") as f:
        f.write(template.replace("cwd=\n", f"cwd={fs_server.work}\n"))
        f.seek(0)
        made = f.read().strip()
    assert f"{made}\tidle\t{fs_server.work}\t" in (fs_server.mnt / "s" / "idx").read_text()
    idx = (fs_server.mnt / "s" / "idx").read_text()
    assert f"{ids[0]}\tidle\t{fs_server.work}\tscripted\t" in idx
    assert os.access(fs_server.mnt / "s" / "ls", os.X_OK)
    assert ids[0] in fs_server.sh("s/ls").stdout


def test_s_new_creates_a_session(fs_server):
    with open(fs_server.mnt / "s" / "new", "r+") as f:
        f.write(f"name=fromnew\ncwd={fs_server.work}\nbackend=\nmodel=\nagent=\n")
        f.flush()
        f.seek(0)
        assert f.read() == "fromnew\n"
    assert (fs_server.mnt / "s" / "fromnew" / "state").read_text() == "idle\n"
    assert "fromnew\tidle\t" in (fs_server.mnt / "s" / "idx").read_text()
    assert "fromnew" not in os.listdir(fs_server.mnt / "s")  # a name: see test_fs_examples
    spaced = fs_server.work / "my project"
    spaced.mkdir()
    for lines in (f"cwd={spaced}\nname=spaced\n", f"name=quoted cwd='{spaced}'\n"):  # a line's rest; k=v words
        with open(fs_server.mnt / "s" / "new", "r+") as f:
            f.write(lines)
            f.flush()
            f.seek(0)
            made = f.read().strip()
        assert f"{made}\tidle\t{spaced}\t" in (fs_server.mnt / "s" / "idx").read_text(), made
        fs_server.sh(f"rm -r s/{made}")


def test_s_new_refuses_at_the_write(fs_server):
    """The session is made at close, whose error a shell ignores: what can be checked is checked as
    each line is written, so `printf … > s/new` exits non-zero."""
    before = os.listdir(fs_server.mnt / "s")
    for bad in ("name=new", "name=a/b", "name=..", "cwd=/no/such/dir", "agent=nosuch", "backend=nosuch", "colour=red"):
        out = fs_server.sh(f"printf '{bad}\\ncwd={fs_server.work}\\n' > s/new", check=False)
        assert out.returncode != 0, bad
    assert os.listdir(fs_server.mnt / "s") == before


def test_rename_and_kill(fs_server):
    sid = fs_server.new_session()
    fs_server.sh(f"mv s/{sid} s/renamed")
    assert (fs_server.mnt / "s" / "renamed").is_dir() and sid not in os.listdir(fs_server.mnt / "s")
    assert "renamed" not in os.listdir(fs_server.mnt / "s")  # named: found by name, listed in idx
    assert "renamed\t" in (fs_server.mnt / "s" / "idx").read_text()
    assert (fs_server.data / "sessions" / "renamed").is_dir()
    out = fs_server.sh("mv s/renamed s/new", check=False)
    assert out.returncode != 0
    busy = fs_server.new_session()
    fs_server.sh(f"echo slow > s/{busy}/prompt")
    out = fs_server.sh(f"mv s/{busy} s/busyname", check=False)
    assert out.returncode != 0 and "busyname" not in os.listdir(fs_server.mnt / "s")
    fs_server.sh("rm -r s/renamed")
    assert "renamed" not in os.listdir(fs_server.mnt / "s")
    assert not (fs_server.data / "sessions" / "renamed").exists()
    assert (fs_server.mnt / "tr" / "renamed" / "chat").exists()  # kept a while: see test_fs_transcripts
    fs_server.sh(f"echo 'kill {busy}' > ctl")
    assert busy not in os.listdir(fs_server.mnt / "s")
    assert fs_server.sh("s/kill nosuch", check=False).returncode != 0


def test_mkdir_makes_a_named_session_whose_cwd_is_then_set(fs_server):
    fs_server.sh(f"mkdir s/made && echo 'cwd {fs_server.work}' > s/made/ctl")
    assert "made" not in os.listdir(fs_server.mnt / "s")  # named: found by name, listed in idx
    assert f"made\tidle\t{fs_server.work}\t" in (fs_server.mnt / "s" / "idx").read_text()
    assert fs_server.sh("mkdir s/made", check=False).returncode != 0  # the name is taken
    assert fs_server.sh("mkdir s/new", check=False).returncode != 0  # a fixed name
    fs_server.sh("rm -r s/made")


def test_agent_configs_read_write_cp_mv_rm(fs_server):
    a = fs_server.mnt / "a"
    assert "default.json" in os.listdir(a)
    fs_server.sh('echo \'{"backend": "scripted", "maxSteps": 3}\' > a/small.json')
    assert json.loads((a / "small.json").read_text())["maxSteps"] == 3
    fs_server.sh("cp a/small.json a/copy.json && mv a/copy.json a/moved.json")
    assert {"small.json", "moved.json"} <= set(os.listdir(a)) and "copy.json" not in os.listdir(a)
    with pytest.raises(OSError):  # a writer that checks close() sees the failure; nothing is lost
        (a / "small.json").write_text('{"maxSteps": "many"}')
    with pytest.raises(OSError):
        (a / "small.json").write_text("{not json")
    with pytest.raises(OSError):  # a backend's name mistyped is heard of now, not at a session's start
        (a / "small.json").write_text('{"backend": "antropic"}')
    assert "unknown backend 'antropic'; backends: " in (a / "small.json.err").read_text()
    assert json.loads((a / "small.json").read_text())["maxSteps"] == 3
    fs_server.sh("rm a/moved.json")
    assert not (fs_server.cfg / "agents" / "moved.json").exists()


def test_agent_configs_edited_in_place(fs_server):
    """sed -i writes a temporary file and renames it over the config; vim opens without O_TRUNC,
    ftruncates and writes. Both must work, and a bad edit must lose nothing."""
    a = fs_server.mnt / "a"
    fs_server.sh('echo \'{"backend": "scripted", "maxSteps": 30, "prompt": "long prompt"}\' > a/ed.json')
    fs_server.sh("sed -i 's/30/4/' a/ed.json")
    assert json.loads((a / "ed.json").read_text())["maxSteps"] == 4
    assert fs_server.sh("sed -i 's/}/,,/' a/ed.json", check=False).returncode != 0
    unknown = fs_server.sh("sed -i 's/maxSteps/maxStepz/' a/ed.json", check=False)  # valid JSON, a field unknown
    assert unknown.returncode != 0 and "Invalid argument" in unknown.stderr, unknown.stderr  # not an I/O error
    assert json.loads((a / "ed.json").read_text())["maxSteps"] == 4
    assert "ed.json.err" in os.listdir(a)  # why it was refused (test_fs_namespace)
    shown = [n for n in os.listdir(a) if not n.endswith(".err")]
    assert sorted(os.listdir(fs_server.cfg / "agents")) == sorted(shown)  # no temporary file left
    fd = os.open(a / "ed.json", os.O_WRONLY)
    os.ftruncate(fd, 0)
    os.write(fd, b'{"maxSteps": 5}')  # shorter than what was there
    os.close(fd)
    assert json.loads((a / "ed.json").read_text()) == {"maxSteps": 5}


def test_disk_directories(fs_server):
    fs_server.sh("echo remember > m/note.md && cat m/note.md && echo scratch > tmp/x && rm tmp/x")
    assert (fs_server.data / "memory" / "note.md").read_text() == "remember\n"
    tool = fs_server.cfg / "tools" / "greet"
    tool.write_text("#!/bin/sh\n# description: say hello\n# args: name\necho hello $1\n")
    tool.chmod(0o755)
    assert (fs_server.mnt / "t" / "idx").read_text() == "## greet\ndescription: say hello\nargs: name\n\n"
    assert fs_server.sh("t/greet you").stdout == "hello you\n"
    fs_server.sh("echo a prompt > p/new.md")  # the system prompts agent configs name (test_fs_namespace)
    assert (fs_server.cfg / "prompts" / "new.md").read_text() == "a prompt\n"


def test_a_setting_is_refused_alike_from_prompt_ctl_and_cfg_during_a_turn(fs_server):
    # One command, one guard: `ctl` used to change the cwd under a running turn.
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    refusal = "cannot change the working directory while a turn is running; interrupt it first"
    out = fs_server.sh(
        f"echo slow > s/{sid}/prompt; echo '/cwd /tmp' > s/{sid}/prompt; "
        f"/bin/echo 'cwd /tmp' > s/{sid}/ctl; echo ctl=$?; /bin/echo 'cwd=/tmp' > s/{sid}/cfg; echo cfg=$?",
        check=False,
    )
    assert "ctl=1" in out.stdout and "cfg=1" in out.stdout
    assert out.stderr.count("Device or resource busy") == 2  # EBUSY from both (coreutils echo names it)
    fs_server.wait_idle(sid)
    chat = (s / "chat").read_text()
    assert chat.count(refusal) == 3 and f"error: /cwd: {refusal}" in chat
    assert f"cwd={fs_server.work}\n" in (s / "cfg").read_text()
    fs_server.sh(f"echo 'cwd /tmp' > s/{sid}/ctl")  # idle: allowed
    assert "cwd=/tmp\n" in (s / "cfg").read_text()


def test_reading_a_restored_session_wakes_it_only_when_asked(fs_server):
    # Waking builds the backend and starts the agent's tool servers; a walk over the tree must not
    # do that for every stored session. The agent's prompt command marks each wake.
    marker = fs_server.root / "woke"
    fs_server.agent(  # as you, not sandboxed: the marker is outside any sandbox's reach
        "waker", [{"match": ".", "text": "ok"}], prompt=f"!touch {marker}; echo You wake.", hookSandbox=False
    )
    sid = fs_server.new_session(agent="waker")
    s = fs_server.mnt / "s" / sid
    fs_server.sh(f"echo 'FOO=bar' > s/{sid}/env; echo 'temperature=0.5' > s/{sid}/cfg; echo hi > s/{sid}/prompt")
    fs_server.wait_idle(sid)
    awake = {name: (s / name).read_text() for name in os.listdir(s) if name not in ("prompt", "fifo.in")}
    fs_server.stop()
    fs_server.start()
    marker.unlink()
    asleep = {name: (s / name).read_text() for name in os.listdir(s) if name not in ("prompt", "fifo.in")}
    fs_server.sh(f"grep -rq nothing-here s/{sid}", check=False)
    assert not marker.exists()
    assert asleep == awake  # the same answers, from what is stored
    assert "temperature=0.5\n" in asleep["cfg"] and asleep["env"] == "FOO=bar\n"
    assert asleep["systemprompt"] == "You wake.\n" and asleep["usage"].endswith("1 requests [estimated]\n")
    assert "execute" in (s / "mcp").read_text()  # asks the servers: wakes
    assert marker.exists()


def test_cfg_written_back_whole_changes_only_what_was_edited_even_the_agent(fs_server):
    # An editor writes every line back; after `agent=` switched, the old agent's values that
    # follow in the file are what the file showed, not edits.
    fs_server.agent("cool", [{"match": ".", "text": "ok"}], temperature=0.1)
    sid = fs_server.new_session()
    s = fs_server.mnt / "s" / sid
    fs_server.sh(f"echo 'temperature=0.9' > s/{sid}/cfg")
    text = (s / "cfg").read_text()
    with open(s / "cfg", "r+") as f:  # as vim does: open, truncate, write it all
        f.truncate()
        f.write(text.replace("agent=default", "agent=cool"))
    after = (s / "cfg").read_text()
    assert "agent=cool\n" in after and "temperature=0.1\n" in after


def test_memory_and_plans_never_follow_a_symlink_sandboxed_code_planted(fs_server):
    # Sandboxed code writes the memory and the plans; a link there could name any of the user's
    # files, which the server (unconfined) would then serve to whoever reads the mount. Dotfiles
    # (memory_recall's index) are not listed.
    secret = fs_server.root / "secret"
    secret.write_text("s3cr3t\n")
    for d in ("memory", "plans"):
        (fs_server.data / d).mkdir(parents=True, exist_ok=True)
        (fs_server.data / d / "note.md").write_text("kept\n")
        (fs_server.data / d / "leak.md").symlink_to(secret)
        (fs_server.data / d / ".index.sqlite").write_text("a cache, not a memory")
    for d in ("m", "pl"):
        assert os.listdir(fs_server.mnt / d) == ["note.md"]
        assert (fs_server.mnt / d / "note.md").read_text() == "kept\n"
        out = fs_server.sh(f"cat {d}/leak.md", check=False)
        assert out.returncode != 0 and "s3cr3t" not in out.stdout


def test_a_cwd_on_the_servers_own_mount_is_refused_and_the_server_goes_on(fs_server):
    """A cwd on a mount of ollie's file server is refused by its name, before any lookup: through
    a 9P mount of the server (`ollie mount`), a lookup there waits on the server itself, which then
    answers no one; on its own FUSE mount it failed as "not a directory", saying nothing of why."""
    inside = fs_server.mnt / "tmp"
    out = fs_server.sh(f"echo 'new cwd={inside}' > ctl", check=False, timeout=20)
    assert out.returncode != 0
    sid = fs_server.new_session()
    out = fs_server.sh(f"echo 'cwd {inside}' > s/{sid}/ctl", check=False, timeout=20)
    assert out.returncode != 0
    assert f"is on ollie's file server's mount {fs_server.mnt}" in (fs_server.mnt / "s" / sid / "chat").read_text()
    assert sid in fs_server.sh("cat s/idx", timeout=20).stdout  # the server answers on


def test_a_cwd_that_a_link_leads_onto_the_servers_own_mount_is_refused_saying_so(fs_server):
    """Through a link, the name check passed and the lookup (which the server refuses itself on
    its own mount) failed as "not a directory", saying nothing of the mount."""
    link = fs_server.work / "into-the-mount"
    link.symlink_to(fs_server.mnt / "s")
    try:
        out = fs_server.sh(f"echo 'new cwd={link}' > ctl", check=False, timeout=20)
        assert out.returncode != 0
        sid = fs_server.new_session()
        out = fs_server.sh(f"echo 'cwd {link}' > s/{sid}/ctl", check=False, timeout=20)
        assert out.returncode != 0
        chat = (fs_server.mnt / "s" / sid / "chat").read_text()
        assert f"{fs_server.mnt}/s is on ollie's file server's mount {fs_server.mnt}" in chat
        assert f"cwd={fs_server.work}\n" in fs_server.sh(f"cat s/{sid}/cfg", timeout=20).stdout
    finally:
        link.unlink()
