"""The root's directories on a real mount: your own scripts served beside the shipped ones (s/, b/,
u/), a refused agent config's reason beside it (a/<name>.json.err), p/ as the system prompts agent
configs name, and no x/."""

from __future__ import annotations

import json
import os
import time

import pytest

from fs_helpers import FsServer
from ollie.fs import tree
from ollie.vfs.fuse import ENTRY_TIMEOUT

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """A server started with a script of yours in each of scripts/s/, scripts/b/ and scripts/u/ (and
    no `ollie init`: the shipped scripts come from the package)."""
    srv = FsServer(tmp_path_factory.mktemp("namespace"))
    for d in ("s", "b", "u"):
        mine = srv.cfg / "scripts" / d / "mine"
        mine.parent.mkdir(parents=True)
        mine.write_text(f'#!/bin/sh\necho "mine, in {d}/: $*"\n')
        mine.chmod(0o755)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_your_scripts_are_served_and_run_beside_the_shipped_ones(srv):
    out = srv.sh("s/mine one && b/mine two && u/mine three")
    assert out.stdout == "mine, in s/: one\nmine, in b/: two\nmine, in u/: three\n"
    assert srv.sh("s/ls").stdout.startswith("ID\tSTATE\t")  # the shipped ones are still there
    assert os.access(srv.mnt / "b" / "q", os.X_OK)
    refused = srv.sh("u/optimize -n 1 x", check=False)  # the package's, not installed: served all the same
    assert refused.returncode == 2 and "at least 2 candidates" in refused.stderr
    # u/ is a directory of files (yours to add to through the mount too); s/ and b/ list only their
    # sessions and jobs, the scripts as the shipped ones are: found by name, not listed
    assert sorted(os.listdir(srv.mnt / "u")) == ["mine", "optimize"]
    srv.sh("printf '#!/bin/sh\\necho added\\n' > u/added")  # made executable: the mount takes no chmod
    assert srv.sh("u/added").stdout == "added\n"
    assert (srv.cfg / "scripts" / "u" / "added").is_file()
    assert "mine" not in os.listdir(srv.mnt / "s") and "mine" not in os.listdir(srv.mnt / "b")
    assert "s/mine" in (srv.mnt / "help").read_text()  # where they are said


def test_a_session_cannot_take_a_scripts_name(srv):
    sid = srv.new_session()
    for how in ("echo 'new name=mine' > ctl", f"mv s/{sid} s/mine", f"echo 'rn mine' > s/{sid}/ctl"):
        assert srv.sh(how, check=False).returncode != 0, how
    assert srv.sh("s/mine").stdout == "mine, in s/: \n"
    assert sid in os.listdir(srv.mnt / "s")


def test_a_refused_agent_config_says_why_in_a_file_beside_it(srv):
    a = srv.mnt / "a"
    srv.sh("""echo '{"backend": "scripted", "maxStep": 3}' > a/dev.json""")  # the close fails: sh says nothing
    assert "dev.json" not in os.listdir(a) and "dev.json.err" in os.listdir(a)
    err = (a / "dev.json.err").read_text()
    assert err.startswith("a/dev.json was not written: unknown field 'maxStep' (did you mean 'maxSteps'?)")
    assert "Fix it and write it again" in err and "rm dev.json.err" in err  # what to do, and when it goes

    time.sleep(ENTRY_TIMEOUT + 0.2)  # the kernel takes the refused new file for there until then
    srv.sh("""echo '{"backend": "scripted", "maxSteps": 3}' > a/dev.json""")  # fixed: the reason goes
    assert "dev.json.err" not in os.listdir(a)
    assert json.loads((a / "dev.json").read_text())["maxSteps"] == 3

    assert srv.sh("sed -i 's/3}/3,,}/' a/dev.json", check=False).returncode != 0  # an editor's rename
    err = (a / "dev.json.err").read_text()
    assert "invalid JSON at line 1 column" in err and "keeps what it held" in err
    assert json.loads((a / "dev.json").read_text())["maxSteps"] == 3  # nothing lost
    assert srv.sh("echo x > a/dev.json.err", check=False).returncode != 0
    srv.sh("rm a/dev.json.err")
    assert "dev.json.err" not in os.listdir(a)
    assert not (srv.cfg / "agents" / "dev.json.err").exists()  # never on disk, among the configs


def test_p_holds_the_system_prompts_agent_configs_name(srv):
    srv.sh("printf 'You review.\\nEnd with LGTM or PTAL.\\n' > p/review.md")
    assert (srv.cfg / "prompts" / "review.md").read_text() == "You review.\nEnd with LGTM or PTAL.\n"
    srv.agent("rev", [{"match": ".", "text": "LGTM"}], prompt="prompts/review.md")
    sid = srv.new_session(agent="rev")
    assert (srv.mnt / "s" / sid / "systemprompt").read_text().startswith("You review.\nEnd with LGTM or PTAL.\n")
    assert os.listdir(srv.mnt / "p") == ["review.md"]


def test_there_is_no_x(srv):
    assert "x" not in os.listdir(srv.mnt)
    assert srv.sh("ls x", check=False).returncode != 0
    assert "plugins" not in tree.HELP and "p/" in tree.HELP
