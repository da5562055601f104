"""The command line people expect (issue 30): XDG base directories, `ollie run … | head` ending
quietly, `--continue`, shell completion scripts, the env file read with .env rules, and a JSON
Schema for agent configs that the shipped agents validate against."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from ollie import config
from ollie.cli.install import PACKAGE_DEFAULTS
from ollie.types import ConfigError

OLLIE = [sys.executable, "-m", "ollie"]


def _ollie(*args: str, env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*OLLIE, *args], env=env, capture_output=True, text=True, timeout=60, **kw)


@pytest.fixture
def env(ollie_dirs) -> dict[str, str]:
    return {**os.environ}


def test_xdg_base_directories_are_honoured_and_ollies_own_variables_win(monkeypatch, tmp_path):
    for var in ("OLLIE_CFG_PATH", "OLLIE_DATA_PATH"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xc"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xd"))
    assert config.cfg_path() == tmp_path / "xc" / "ollie" and config.data_path() == tmp_path / "xd" / "ollie"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # the specification ignores a relative one
    assert config.cfg_path() == Path(os.path.expanduser("~/.config/ollie"))
    monkeypatch.setenv("OLLIE_CFG_PATH", str(tmp_path / "mine"))
    assert config.cfg_path() == tmp_path / "mine"


def test_run_into_a_closed_pipe_stops_the_turn_quietly(env, tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"text": "one\ntwo\nthree\n" * 50, "chunk": 5, "delay": 0.3}]))
    run = " ".join([*OLLIE, "run", "--json", "--script", str(script), "hi"])
    out = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {run} | head -1; echo status ${{PIPESTATUS[0]}}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.splitlines()[0] == '{"kind": "state", "text": "thinking"}'
    assert out.stdout.splitlines()[-1] == "status 141"  # as a program killed by SIGPIPE
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert out.stderr.startswith("session: "), out.stderr  # as the README says: always, on stderr


def test_continue_picks_the_last_session_of_this_directory(env, tmp_path):
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"rules": [{"match": ".", "text": "ok"}]}))
    refused = _ollie("run", "--continue", "--script", str(script), "hi", env=env, cwd=here)
    assert refused.returncode == 1 and f"--continue: no session has worked in {here} yet" in refused.stderr
    first = _ollie("run", "--script", str(script), "first", env=env, cwd=here).stderr.split("session: ")[1].split()[0]
    _ollie("run", "--script", str(script), "other", env=env, cwd=elsewhere)
    again = _ollie("run", "--continue", "--script", str(script), "second", env=env, cwd=here)
    assert again.returncode == 0, again.stderr
    assert again.stderr.split("session: ")[1].split()[0] == first


def test_completion_scripts_offer_commands_options_and_choices(env):
    script = _ollie("completion", "bash", env=env).stdout
    probe = (
        'complete_line() { COMP_WORDS=($1); [[ "$1" == *" " ]] && COMP_WORDS+=(""); '
        'COMP_CWORD=$((${#COMP_WORDS[@]}-1)); COMPREPLY=(); _ollie; echo "${COMPREPLY[*]}"; }\n'
        'complete_line "ollie ru"; complete_line "ollie run --con"; complete_line "ollie keys "; '
        'complete_line "ollie completion f"'
    )
    out = subprocess.run(["bash", "-c", script + probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["run", "--continue", "set list rm", "fish"]
    fish = _ollie("completion", "fish", env=env).stdout
    assert "complete -c ollie -n '__fish_seen_subcommand_from run' -l agent -r -F" in fish
    zsh = _ollie("completion", "zsh", env=env).stdout
    assert "bashcompinit" in zsh and "complete -o default -F _ollie ollie" in zsh
    for shell, text in (("zsh", zsh), ("fish", fish)):
        if shutil.which(shell):  # not installed here: the syntax check runs where it is
            subprocess.run([shell, "-n"], input=text, text=True, check=True)


def test_the_env_file_is_read_with_dotenv_rules(tmp_path):
    env = tmp_path / "env"
    env.write_text(
        "# a comment\n"
        "export A=plain # a comment after the value\n"
        "B=no#comment\n"
        "C='single # kept' # but not this\n"
        'D="double\\tescaped \\"quoted\\"" \n'
        "E=\n"
    )
    assert config._parse_env(env, env.read_text()) == {
        "A": "plain",
        "B": "no#comment",
        "C": "single # kept",
        "D": 'double\tescaped "quoted"',
        "E": "",
    }
    env.write_text('OPEN="never closed\n')
    with pytest.raises(ConfigError, match=r"env:1: OPEN: the value's \" is never closed"):
        config._parse_env(env, env.read_text())


def test_the_agent_schema_knows_every_field_and_the_shipped_agents_validate():
    schema = json.loads((PACKAGE_DEFAULTS / "agent.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    known = set(config._FIELDS) | set(config._PARAM_KEYS) | set(config.GENERATION_PARAM_TYPES) | {"name", "$schema"}
    assert set(schema["properties"]) == known  # no field the loader takes is missing, none it refuses is offered
    for path in (PACKAGE_DEFAULTS / "agents").glob("*.json"):
        agent = json.loads(path.read_text())
        assert agent["$schema"] == "../agent.schema.json"  # resolved from agents/, where ollie init installs them
        jsonschema.validate(agent, schema)
        config.parse_agent(path.stem, agent, str(path))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"prompt": "x", "maxStep": 3}, schema)  # what the loader refuses, the editor marks
