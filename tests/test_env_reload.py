"""A running server reads `$OLLIE_CFG_PATH/env` again for each new session: a key or backend set
since it started (`ollie keys set`, the terminal's first run) counts without a restart, while a
variable of the server's own environment still wins over the file."""

from __future__ import annotations

import json
import os

import pytest

from fs_helpers import FsServer


def test_a_new_session_sees_the_env_file_as_it_is_now(tmp_path):
    srv = FsServer(tmp_path)
    scripts = {}
    for word in ("one", "two"):
        scripts[word] = tmp_path / f"{word}.json"
        scripts[word].write_text(json.dumps({"rules": [{"match": ".", "text": word}]}))
    (srv.cfg / "agents" / "plain.json").write_text(json.dumps({"prompt": "You are plain.\n"}))  # no backend
    env_file = srv.cfg / "env"
    env_file.write_text(f"OLLIE_BACKEND=scripted\nOLLIE_MODEL={scripts['one']}\n")

    def reply_of_a_new_session() -> str:
        sid = srv.new_session(agent="plain")
        (srv.mnt / "s" / sid / "prompt").write_text("hi\n")
        srv.wait_idle(sid)
        return (srv.mnt / "s" / sid / "reply").read_text()

    srv.start()
    try:
        assert reply_of_a_new_session() == "one"
        env_file.write_text(f"OLLIE_BACKEND=scripted\nOLLIE_MODEL={scripts['two']}\n")
        assert reply_of_a_new_session() == "two"
        env_file.write_text("OLLIE_BACKEND=scripted\nnot a line\n")
        out = srv.sh("echo 'new agent=plain' > ctl", check=False)
        assert out.returncode != 0  # a broken env file fails the new session
        stopped = srv.ollie("srv", "stop", check=False)  # but not the server's stop
        assert stopped.returncode == 0 and "env:2: expected KEY=VALUE" in stopped.stderr, stopped.stderr
        assert not os.path.ismount(srv.mnt)
    finally:
        srv.stop()


def test_loading_the_env_file_again_follows_it_and_leaves_the_environments_own(tmp_path, monkeypatch):
    from ollie import config

    env_file = tmp_path / "env"
    monkeypatch.setenv("OWN_VAR", "from the environment")
    for name in ("FILE_VAR", "GONE_VAR"):
        monkeypatch.delenv(name, raising=False)
    env_file.write_text("OWN_VAR=from the file\nFILE_VAR=1\nGONE_VAR=x\n")
    config.load_env_file(env_file)
    assert (os.environ["OWN_VAR"], os.environ["FILE_VAR"], os.environ["GONE_VAR"]) == ("from the environment", "1", "x")
    env_file.write_text("OWN_VAR=from the file\nFILE_VAR=2\n")
    config.load_env_file(env_file)
    assert (os.environ["OWN_VAR"], os.environ["FILE_VAR"]) == ("from the environment", "2")
    assert "GONE_VAR" not in os.environ
    env_file.write_text("FILE_VAR=3\nnot a line\n")
    with pytest.raises(config.ConfigError, match="env:2: expected KEY=VALUE"):
        config.load_env_file(env_file)
    assert os.environ["FILE_VAR"] == "2"  # a broken file changes nothing
