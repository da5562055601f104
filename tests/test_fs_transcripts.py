"""`rm -r s/` loses nothing: killed sessions are kept, read-only in tr/, for $OLLIE_TRANSCRIPT_DAYS
days; expired ones are pruned when the server starts."""

from __future__ import annotations

import json
import os
import time

import pytest

from fs_helpers import FsServer

pytestmark = pytest.mark.timeout(120)

DAY = 86400


@pytest.fixture
def server(tmp_path):
    srv = FsServer(tmp_path)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_rm_r_s_keeps_every_session_in_tr(server):
    ids = [server.new_session() for _ in range(2)]
    for sid in ids:
        (server.mnt / "s" / sid / "prompt").write_text(f"hello from {sid}")
        server.wait_idle(sid)
    chats = {sid: (server.mnt / "s" / sid / "chat").read_text() for sid in ids}
    server.sh("rm -rf s/", check=False)  # s/ itself cannot go: only the sessions do
    assert os.listdir(server.mnt / "s") == []
    assert not any((server.data / "sessions").iterdir())
    assert os.listdir(server.mnt / "tr") == ids
    for sid in ids:
        kept = server.mnt / "tr" / sid
        assert (kept / "chat").read_text() == chats[sid] == f"user: hello from {sid}\nassistant: ok\n\n"
        assert {"chat", "history.jsonl", "meta.json"} <= set(os.listdir(kept))
        assert json.loads((kept / "meta.json").read_text())["id"] == sid
    sid = ids[0]
    for script in (
        f"echo x > tr/{sid}/chat",
        f"rm tr/{sid}/chat",
        f"rm -r tr/{sid}",
        f"mv tr/{sid} tr/other",
        f"touch tr/{sid}/new",
    ):
        assert server.sh(script, check=False).returncode != 0, script
    assert (server.mnt / "tr" / sid / "chat").read_text() == chats[sid]


def test_a_reused_name_is_kept_twice_beside_a_saved_chat(server):
    for n in (1, 2):
        server.sh(f"mkdir s/twice && echo 'round {n}' > s/twice/prompt")
        server.wait_idle("twice")
        if n == 1:
            server.sh("echo save > s/twice/ctl")  # tr/twice: a saved chat, a file
        server.sh("rm -r s/twice")
    tr = server.mnt / "tr"
    assert os.listdir(tr) == ["twice", "twice.2", "twice.3"]
    assert (tr / "twice").read_text() == (tr / "twice.2" / "chat").read_text() == "user: round 1\nassistant: ok\n\n"
    assert (tr / "twice.3" / "chat").read_text() == "user: round 2\nassistant: ok\n\n"


def test_expired_transcripts_are_pruned_at_start(server):
    tr = server.data / "transcripts"
    for name, age in (("old", 8 * DAY), ("recent", 6 * DAY)):
        (tr / name).mkdir(parents=True)
        (tr / name / "chat").write_text(f"user: {name}\n")
        os.utime(tr / name, (time.time() - age, time.time() - age))
    (tr / "saved").write_text("a chat saved with ctl save\n")
    os.utime(tr / "saved", (time.time() - 30 * DAY, time.time() - 30 * DAY))
    server.stop()
    server.start()
    assert sorted(os.listdir(server.mnt / "tr")) == ["recent", "saved"]  # saved chats never expire

    server.stop()
    server.env["OLLIE_TRANSCRIPT_DAYS"] = "5"
    server.start()
    assert os.listdir(server.mnt / "tr") == ["saved"]


def test_transcript_days_zero_deletes_at_once_and_nonsense_is_refused(tmp_path):
    srv = FsServer(tmp_path)
    try:  # stopped even when a start that should have failed did not
        srv.env["OLLIE_TRANSCRIPT_DAYS"] = "a week"
        out = srv.ollie("srv", "start", check=False)
        assert out.returncode == 1 and "OLLIE_TRANSCRIPT_DAYS='a week': expected a number of days" in out.stderr
        srv.env["OLLIE_TRANSCRIPT_DAYS"] = "0"
        srv.start()
        sid = srv.new_session()
        srv.sh(f"rm -r s/{sid}")
        assert os.listdir(srv.mnt / "tr") == [] and not (srv.data / "sessions" / sid).exists()
    finally:
        srv.stop()
