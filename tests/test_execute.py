"""execute_code: pipelines, parallel stages, languages, tool scripts, process control, bad input.

Everything runs for real under the default Landlock policy."""

from __future__ import annotations

import asyncio
import os
import select
import time
from pathlib import Path

import pytest

from ollie.tools import CallContext, execute
from ollie.tools import Server as ServerProtocol


@pytest.fixture
def work(ollie_dirs, tmp_path):
    cwd, tmpdir = tmp_path / "cwd", tmp_path / "session-tmp"
    cwd.mkdir()
    tmpdir.mkdir()
    return cwd, tmpdir, Path(os.environ["OLLIE_TOOLS_PATH"])


@pytest.fixture
async def run(work):
    cwd, tmpdir, _ = work
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), session_id="sess-1", tmpdir=str(tmpdir), env={"GREETING": "hello"})

    async def call(*steps, **extra):
        return await server.call_tool("execute_code", {"steps": list(steps), **extra}, ctx)

    yield call
    await server.close()


def alive(marker: str) -> list[int]:
    """Processes whose command line contains `marker` that are still running a moment later: a
    killed process may take that moment to finish dying, an escaped one stays."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if marker not in cmdline or state == "Z":
                continue
            pidfd = os.pidfd_open(int(pid))  # readable once the process has exited
        except (OSError, IndexError):
            continue
        try:
            waiting = select.poll()  # not select(): a long suite's descriptors pass its 1024
            waiting.register(pidfd, select.POLLIN)
            if not waiting.poll(2000):
                found.append(int(pid))
        finally:
            os.close(pidfd)
    return found


def script(tools: Path, name: str, text: str, executable: bool = True) -> None:
    path = tools / name
    path.write_text(text)
    path.chmod(0o755 if executable else 0o644)


# ---- the server -------------------------------------------------------------------------------


async def test_decl_builds_a_server_offering_execute_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    server = execute.factory("")()
    assert isinstance(server, ServerProtocol)
    assert server.cwd == str(tmp_path)
    [tool] = await server.list_tools()
    assert tool.name == "execute_code" and not tool.read_only
    assert tool.input_schema["required"] == ["steps"]
    assert set(tool.input_schema["properties"]) == {"steps", "timeout", "sandbox"}
    for word in ("parallel", "tool", "stdin", "timeout", *execute.LANGUAGES):
        assert word in tool.description
    result = await server.call_tool("nope", {}, CallContext())
    assert result.is_error and "execute_code" in result.text()
    await server.close()


async def test_decl_cwd_is_used_when_the_context_has_none(work):
    cwd, _, _ = work
    server = execute.factory(str(cwd))()
    name = f"kept-{os.getpid()}-{time.monotonic_ns()}"  # a name no other program has in the host's /tmp
    result = await server.call_tool(
        "execute_code", {"steps": [{"code": f"pwd; echo $TMPDIR; echo kept > $TMPDIR/{name}"}]}, CallContext()
    )
    pwd, tmp = result.text().split()
    assert not result.is_error and pwd == str(cwd)
    # $TMPDIR is the jail's private /tmp: it lasts across calls and is not the host's.
    assert tmp == "/tmp" and not Path(tmp, name).exists()
    result = await server.call_tool("execute_code", {"steps": [{"code": f"cat $TMPDIR/{name}"}]}, CallContext())
    assert result.text() == "kept\n"
    await server.close()


# ---- pipelines ----------------------------------------------------------------------------------


async def test_single_stage_returns_raw_merged_output(run):
    result = await run({"code": "echo out; echo err >&2"})
    assert not result.is_error
    assert result.text() == "out\nerr\n"


async def test_stages_pipe_output_to_the_next_stdin(run):
    result = await run({"code": "printf 'pear\\napple\\nfig\\n'"}, {"code": "sort"}, {"code": "head -n 2"})
    assert result.text() == "apple\nfig\n"


async def test_large_output_flows_between_stages(run):
    result = await run({"code": "head -c 3000000 /dev/zero"}, {"code": "wc -c"})
    assert result.text().strip() == "3000000"


async def test_a_stage_may_ignore_its_input(run):
    result = await run({"code": "seq 200000"}, {"code": "echo done"})
    assert not result.is_error and result.text() == "done\n"


async def test_parallel_outputs_come_in_submission_order(run):
    result = await run(
        {"parallel": [{"code": "sleep 0.3; echo first"}, {"code": "sleep 0.1; echo second"}, {"code": "echo third"}]}
    )
    assert result.text() == "first\nsecond\nthird\n"


async def test_parallel_stages_really_run_at_once(run):
    # Each branch waits for every other branch's mark: this only finishes if all run together.
    branch = (
        "touch mark{i}; for _ in $(seq 100); do [ -e mark0 ] && [ -e mark1 ] && [ -e mark2 ] && exit 0; sleep 0.05; "
        "done; exit 1"
    )
    result = await run({"parallel": [{"code": branch.format(i=i)} for i in range(3)]})
    assert not result.is_error, result.text()


async def test_fan_out_then_transform(run, work):
    cwd, _, _ = work
    (cwd / "a").write_text("1\n2\n3\n")
    (cwd / "b").write_text("1\n")
    result = await run({"parallel": [{"code": "wc -l < a"}, {"code": "wc -l < b"}]}, {"code": "sort -n"})
    assert result.text().split() == ["1", "3"]


async def test_parallel_stage_reads_the_previous_output(run):
    result = await run({"code": "echo shared"}, {"parallel": [{"code": "tr a-z A-Z"}, {"code": "rev"}]})
    assert result.text() == "SHARED\nderahs\n"


async def test_a_failing_stage_stops_the_pipeline(run, work):
    cwd, _, _ = work
    result = await run({"code": "echo partial; exit 3"}, {"code": "touch ran"})
    assert result.is_error
    assert result.text() == "steps[0]: execution failed: exit status 3\npartial\n"
    assert not (cwd / "ran").exists()


async def test_single_stage_error_carries_status_and_output(run):
    result = await run({"code": "echo oops >&2; exit 7"})
    assert result.is_error and result.text() == "execution failed: exit status 7\noops\n"
    result = await run({"code": "kill -9 $$"})
    assert result.is_error and "killed by SIGKILL" in result.text()


async def test_parallel_failure_names_the_branch_and_keeps_all_output(run):
    result = await run({"parallel": [{"code": "echo ok"}, {"code": "echo bad; exit 2"}]})
    assert result.is_error
    assert result.text() == "steps[0].parallel[1]: execution failed: exit status 2\nok\nbad\n"


# ---- languages ----------------------------------------------------------------------------------

LANGUAGE_CASES = {
    "bash": ("echo $((6*7))", None, "42"),
    "sh": ("echo 42", None, "42"),
    "python3": ("print(6*7)", None, "42"),
    "python": ("import sys; print(sys.version_info[0] * 14)", None, "42"),
    "perl": ("print 6*7, qq(\\n)", None, "42"),
    "lua": ("print(6*7)", None, "42"),
    "awk": ("{ s += $1 } END { print s }", "40\n2\n", "42"),
    "sed": ("s/forty-two/42/", "forty-two\n", "42"),
    "jq": (".a + .b", '{"a": 40, "b": 2}', "42"),
    "ed": ("a\n42\n.\n,p\nQ", None, "42"),
    "expect": ("spawn echo 42\nexpect eof", None, "42"),
    "bc": ("6*7", None, "42"),
}


def test_every_language_has_a_case():
    assert set(LANGUAGE_CASES) == set(execute.LANGUAGES)


@pytest.mark.parametrize("language", sorted(LANGUAGE_CASES))
async def test_language_runs_in_the_sandbox(run, language):
    code, stdin, expected = LANGUAGE_CASES[language]
    steps = [{"code": f"printf %s '{stdin}'"}] if stdin else []
    result = await run(*steps, {"code": code, "language": language})
    assert not result.is_error, result.text()
    assert result.text().strip().splitlines()[-1].strip() == expected


async def test_missing_interpreter_is_named(work):
    cwd, tmpdir, _ = work
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), tmpdir=str(tmpdir), env={"PATH": str(cwd)})  # nothing to find there
    result = await server.call_tool("execute_code", {"steps": [{"code": "print(1)", "language": "lua"}]}, ctx)
    assert result.is_error and result.text() == (  # the PATH searched: a session's env may have set it
        f"steps[0]: language lua needs lua, which is not on the PATH searched ({cwd}; a session's env may set PATH)"
    )
    await server.close()


# ---- tool scripts -------------------------------------------------------------------------------


async def test_tool_scripts_get_args_and_run_by_shebang(run, work):
    _, _, tools = work
    script(tools, "greet", "#!/usr/bin/env python3\nimport sys\nprint('py', *sys.argv[1:])\n")
    script(tools, "shout", '#!/bin/sh\necho sh "$@" | tr a-z A-Z\n', executable=False)
    script(tools, "plain", "echo bash $BASH_VERSION | cut -c1-4\n")
    script(tools, "warn", "#!/usr/bin/env -S perl -w\nprint qq(perl @ARGV\\n);\n")
    result = await run(
        {
            "parallel": [
                {"tool": "greet", "args": ["a b", "c", 3]},
                {"tool": "shout", "args": ["x"]},
                {"tool": "plain"},
                {"tool": "warn", "args": ["z"]},
            ]
        }
    )
    assert not result.is_error, result.text()
    assert result.text() == "py a b c 3\nSH X\nbash\nperl z\n"


async def test_tool_script_reads_piped_input_and_session_env(run, work):
    _, _, tools = work
    script(tools, "upper", '#!/bin/bash\necho "$GREETING $OLLIE_SESSION_ID"; tr a-z A-Z\n')
    result = await run({"code": "echo piped"}, {"tool": "upper"})
    assert result.text() == "hello sess-1\nPIPED\n"


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ""])
async def test_tool_names_that_leave_the_tools_path_are_refused(run, name):
    result = await run({"tool": name})
    assert result.is_error and result.text().startswith("steps[0].tool: invalid tool name")


async def test_unknown_tool_names_the_path(run, work):
    _, _, tools = work
    result = await run({"tool": "missing"})
    assert result.is_error and result.text() == f"steps[0].tool: no tool script 'missing' in OLLIE_TOOLS_PATH ({tools})"


async def test_tool_with_an_uninstalled_interpreter(run, work):
    _, _, tools = work
    script(tools, "odd", "#!/usr/bin/env no-such-lang\n")
    result = await run({"tool": "odd"})
    assert result.is_error and "no-such-lang" in result.text() and "which is not on the PATH searched" in result.text()


async def test_an_unreadable_tool_script_is_an_error_naming_it(work):
    cwd, tmpdir, _ = work
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), tmpdir=str(tmpdir), env={"OLLIE_TOOLS_PATH": "/proc/self"})
    result = await server.call_tool("execute_code", {"steps": [{"tool": "mem"}]}, ctx)  # a file whose read fails
    assert result.is_error and result.text() == "steps[0].tool: cannot read /proc/self/mem: Input/output error"
    await server.close()


def test_read_safe_marks(work):
    _, _, tools = work
    script(tools, "peek", '#!/bin/sh\n# ollie:parallel read\ncat "$1"\n')
    script(tools, "poke", '#!/bin/sh\necho x > "$1"\n')
    assert execute.read_safe({"steps": [{"tool": "peek"}, {"parallel": [{"tool": "peek"}]}]})
    assert not execute.read_safe({"steps": [{"tool": "peek"}, {"tool": "poke"}]})
    assert not execute.read_safe({"steps": [{"code": "cat x"}]})
    assert not execute.read_safe({"steps": [{"tool": "../peek"}]})


# ---- process control ----------------------------------------------------------------------------


async def test_timeout_kills_the_whole_tree(run):
    code = "bash -c 'sleep 3141.1 & sleep 3141.2' & (sleep 3141.3 &); echo started; sleep 3141.4"
    result = await run({"code": code}, timeout=0.5)
    assert result.is_error
    assert result.text() == "execution timeout after 0.5 seconds\nstarted\n"
    assert alive("3141.") == []


async def test_nothing_outlives_its_stage(run):
    code = (
        "sleep 2718.1 & nohup sleep 2718.2 >/dev/null 2>&1 & setsid sleep 2718.3 & "
        "python3 -c 'import os,time\nif os.fork() == 0:\n os.setsid()\n if os.fork() == 0: time.sleep(2718.4)' ; "
        "echo left"
    )
    result = await run({"code": code})
    assert result.text() == "left\n"
    assert alive("2718.") == []


async def test_cancel_kills_the_stage(run, work):
    cwd, _, _ = work
    task = asyncio.create_task(run({"code": "touch started; sleep 1618.1 & sleep 1618.2"}))
    while not (cwd / "started").exists():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert alive("1618.") == []


async def test_output_is_capped_across_the_whole_call(run):
    result = await run({"code": "yes 0123456789abcdef"}, timeout=20)
    assert result.is_error
    text = result.text()
    assert text.startswith("the call's output exceeded 10 MiB (limits.output); the stage was stopped\n")
    assert text.endswith("\n[output truncated]")
    assert len(text.encode()) < (10 << 20) + 200
    # Branches share the budget: eight of 4 MiB each do not keep 32 MiB.
    result = await run({"parallel": [{"code": "head -c 4194304 /dev/zero | tr '\\0' a"}] * 8}, timeout=20)
    assert result.is_error and "limits.output" in result.text()
    assert len(result.text().encode()) < (10 << 20) + 2000


# ---- the environment ----------------------------------------------------------------------------


async def test_environment_is_the_policy_plus_the_session(run, work, monkeypatch):
    cwd, tmpdir, tools = work
    monkeypatch.setenv("UNLISTED_VAR", "server-only")
    result = await run({"code": "env"})
    env = dict(line.split("=", 1) for line in result.text().splitlines() if "=" in line)
    assert env["GREETING"] == "hello"
    assert env["OLLIE_SESSION_ID"] == "sess-1"
    assert env["OLLIE_TOOLS_PATH"] == str(tools)
    assert env["TMPDIR"] == "/tmp"  # the jail's private one; the session's own is readable
    assert "mnt/ollie" not in env["PATH"]  # x/ holds the user's plugins: not the sandbox's to run
    assert "OLLIE" not in env  # no view of ollie's files without a file server (test_view.py)
    assert "UNLISTED_VAR" not in env


# ---- bad input ----------------------------------------------------------------------------------

BAD = [
    ({"steps": []}, "steps: must be a non-empty list of stages"),
    ({"steps": "ls"}, "steps: must be a non-empty list of stages"),
    ({"steps": [{}]}, "steps[0]: needs code or tool"),
    (
        {"steps": [{"code": "touch ran"}, {"parallel": [{"language": "bash"}]}]},
        "steps[1].parallel[0]: needs code or tool",
    ),
    ({"steps": [{"code": "touch ran"}, {"parallel": []}]}, "steps[1].parallel: must be a non-empty list"),
    (
        {"steps": [{"code": "touch ran"}, {"code": "x", "language": "cobol"}]},
        "steps[1].language: unknown language 'cobol'",
    ),
    ({"steps": [{"code": "x", "tool": "y"}]}, "steps[0]: has both code and tool"),
    (
        {"steps": [{"parallel": [{"parallel": [{"code": "x"}]}]}]},
        "steps[0].parallel[0]: parallel stages cannot be nested",
    ),
    ({"steps": [{"cmd": "ls"}]}, "steps[0]: unknown key 'cmd'"),
    ({"steps": [{"code": 5}]}, "steps[0].code: must be a string"),
    ({"steps": [{"tool": "t", "args": "a b"}]}, "steps[0].args: must be a list of strings"),
    ({"steps": [{"code": "touch ran"}], "timeout": 0}, "timeout: must be a positive number of seconds, got 0"),
    ({"steps": [{"code": "touch ran"}], "timeout": "5"}, "timeout: must be a positive number of seconds, got '5'"),
    ({"steps": [{"code": "touch ran"}], "timeout": True}, "timeout: must be a positive number"),
    ({"steps": [{"code": "touch ran"}], "sandbox": "../etc"}, "sandbox: policy '../etc' is not allowed"),
    ({"steps": [{"code": "touch ran"}], "sandbox": "nope"}, "sandbox: policy 'nope' is not allowed for this agent"),
    ({"code": "ls"}, "unknown argument 'code'; execute_code takes steps, timeout and sandbox"),
    (
        {"steps": [{"code": "touch ran"}, {"code": "x", "language": ["bash"]}]},
        "steps[1].language: unknown language ['bash']",
    ),
    ({"steps": [{"code": "touch ran"}, {"code": "echo a\0b"}]}, "steps[1].code: must not contain NUL characters"),
    ({"steps": [{"code": "touch ran"}, {"tool": "t", "args": ["a\0b"]}]}, "steps[1].args: must not contain NUL"),
]


@pytest.mark.parametrize("arguments,message", BAD)
async def test_malformed_calls_fail_before_anything_runs(work, arguments, message):
    cwd, tmpdir, _ = work
    server = execute.factory(str(cwd))()
    result = await server.call_tool("execute_code", arguments, CallContext(cwd=str(cwd), tmpdir=str(tmpdir)))
    assert result.is_error and message in result.text(), result.text()
    assert not (cwd / "ran").exists()
    await server.close()


async def test_null_arguments_count_as_not_given(run):
    # Models filling every schema field send null for the ones they do not use.
    result = await run(
        {"code": "echo hi", "language": None, "tool": None, "args": None},
        {"parallel": [{"code": "cat", "tool": None}], "code": None},
        timeout=None,
        sandbox=None,
    )
    assert not result.is_error and result.text() == "hi\n", result.text()


def test_read_safe_refuses_malformed_steps_without_raising():
    for steps in ([{"parallel": 5}], [{"parallel": None, "tool": "peek"}], [{"parallel": "ab"}], [[]], [5]):
        assert execute.read_safe({"steps": steps}) is False


async def test_missing_cwd_is_reported(work, tmp_path):
    server = execute.factory(str(tmp_path / "gone"))()
    result = await server.call_tool("execute_code", {"steps": [{"code": "ls"}]}, CallContext())
    assert result.is_error and result.text() == f"working directory {tmp_path / 'gone'} does not exist"
    await server.close()
