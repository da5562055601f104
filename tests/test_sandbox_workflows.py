"""A developer's workflow runs in the default sandbox: what the project builds or installs runs
from the cwd and $TMPDIR (offline), a toolchain under $HOME is found, and a policy that grants a
TCP port resolves names. Each workflow is run for real through execute_code."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import http.server
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import zipfile
from pathlib import Path

import pytest

from ollie import config, sandbox
from ollie.sandbox import policy as policy_module
from ollie.sandbox import userconfig
from ollie.tools import CallContext, execute
from sandbox_helpers import write_policy

pytestmark = pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="needs Landlock ABI 6 (Linux 6.12)")

CARGO = shutil.which("cargo") or shutil.which(os.path.expanduser("~/.cargo/bin/cargo"))  # before $HOME is faked
RUSTUP_HOME = os.environ.get("RUSTUP_HOME") or os.path.expanduser("~/.rustup")


def cwd_of(run) -> Path:
    return Path(run.ctx.cwd)


async def test_a_script_the_project_holds_runs_from_the_cwd_and_tmpdir(run):
    script = cwd_of(run) / "run.sh"
    script.write_text("#!/bin/sh\necho ran $1\n")
    script.chmod(0o755)
    result = await run(
        './run.sh here && printf "#!/bin/sh\\necho tmp\\n" > $TMPDIR/t.sh && chmod +x $TMPDIR/t.sh && $TMPDIR/t.sh'
    )
    assert (result.is_error, result.text()) == (False, "ran here\ntmp\n")


@pytest.mark.skipif(not shutil.which("cc") or not shutil.which("make"), reason="needs cc and make")
async def test_make_check_builds_and_runs_its_test_program(run):
    (cwd_of(run) / "t.c").write_text('#include <stdio.h>\nint main(void) { puts("all 3 tests passed"); return 0; }\n')
    (cwd_of(run) / "Makefile").write_text("check: t\n\t./t\nt: t.c\n\tcc -o t t.c\n")
    result = await run("make -s check", timeout=60)
    assert (result.is_error, result.text()) == (False, "all 3 tests passed\n")


@pytest.mark.skipif(not os.path.exists("/etc/profile"), reason="no /etc/profile here")
async def test_a_login_shell_starts_without_complaint(run):
    """Some tools run their commands with `bash -lc`: a login shell reads /etc/profile (and an
    interactive one /etc/bash.bashrc), which the sandbox refused, so every such command began with
    "/etc/profile: Permission denied". They are read as the tools' configurations are: when
    nothing in them looks like a secret (an admin's proxy password)."""
    result = await run("bash -lc 'echo ok' 2>&1")
    assert (result.is_error, result.text()) == (False, "ok\n")


async def test_a_command_not_found_names_the_path_directories_the_sandbox_left_out(run, home, monkeypatch):
    """A virtualenv activated outside the project drops off the sandbox's PATH: its `pytest` was
    "command not found", with no word of why."""
    venv = home / ".virtualenvs" / "proj" / "bin"
    venv.mkdir(parents=True)
    (venv / "mytool").write_text("#!/bin/sh\necho ran\n")
    (venv / "mytool").chmod(0o755)
    monkeypatch.setenv("PATH", f"{venv}:{os.environ['PATH']}")
    result = await run("mytool")
    assert result.is_error and "exit status 127" in result.text()
    assert f"the sandbox runs no program from these directories of the PATH: {venv}" in result.text()
    result = await run("false")  # another failure says nothing of it
    assert result.is_error and "PATH" not in result.text()


def activated_env(env: Path, monkeypatch) -> Path:
    """A virtualenv at `env`, as `python -m venv` makes it, activated as its `activate` does."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    (env / "bin" / "mytool").write_text("#!/bin/sh\necho mytool ran\n")
    (env / "bin" / "mytool").chmod(0o755)
    monkeypatch.setenv("VIRTUAL_ENV", str(env))
    monkeypatch.setenv("PATH", f"{env}/bin:{os.environ['PATH']}")
    return env


@pytest.mark.parametrize("store", [".virtualenvs", ".cache/pypoetry/virtualenvs", ".local/share/virtualenvs"])
async def test_the_virtualenv_activated_from_a_store_runs_read_only(run, home, monkeypatch, store):
    """`workon`, `poetry shell` or `pipenv shell`, then ollie: the virtualenv lies in a store
    outside the project, and its `pytest` came first on the PATH code is given, then failed with
    127. It is read and run, not written, and poetry and pipenv are told of it; a secret in its
    pip.conf or in a virtualenvwrapper hook is masked as a toolchain's is."""
    for variable in ("WORKON_HOME", "POETRY_VIRTUALENVS_PATH", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    env = activated_env(home / store / "proj-1a2b", monkeypatch)
    (env / "pip.conf").write_text("[global]\nindex-url = https://ada:s3cr3tpassw0rd@pypi.corp.example/simple\n")
    (env / "bin" / "postactivate").write_text("export OPENAI_API_KEY=sk-proj-0123456789abcdef\n")
    code = 'mytool && python -c "import sys; print(sys.prefix)" && echo "$VIRTUAL_ENV"; cat "$VIRTUAL_ENV/pip.conf"'
    result = await run(code + ' "$VIRTUAL_ENV/bin/postactivate"; touch "$VIRTUAL_ENV/x" 2>/dev/null || echo read-only')
    assert result.text() == f"mytool ran\n{env}\n{env}\nread-only\n", result.text()
    # the tool servers' policy leaves it out: a project's private packages, beside a network
    tools = sandbox.load_policy("tools", cwd_of(run).as_posix(), "")
    assert str(env) not in tools.paths["rox"] and str(env) in tools.optional


@pytest.mark.parametrize("where", ["another project", "a conda env", "home"])
async def test_an_activated_environment_outside_a_store_is_not_granted(run, home, tmp_path, monkeypatch, where):
    """A project's own virtualenv, still activated in a session of another project (or by the
    file server's start), is written by that project's sessions: every other session would run
    the `git` their code planted first on its PATH. A conda base env holds every env and the
    variables each keeps; a stray `python -m venv ~` every secret beside it. None is granted (a
    command not found names the PATH's directory left out)."""
    outside = tmp_path / "cfg"  # ollie's own directories elsewhere: its hidden ones keep none out
    (outside / "tools").mkdir(parents=True)
    monkeypatch.setenv("OLLIE_CFG_PATH", str(outside))
    monkeypatch.setenv("OLLIE_TOOLS_PATH", str(outside / "tools"))
    monkeypatch.delenv("WORKON_HOME", raising=False)
    if where == "another project":
        env = activated_env(home / "projA" / ".venv", monkeypatch)
    elif where == "a conda env":
        env = home / "miniconda3"
        (env / "conda-meta").mkdir(parents=True)
        (env / "conda-meta" / "state").write_text('{"env_vars": {"AWS_SECRET_ACCESS_KEY": "wJalr"}}')
        monkeypatch.setenv("CONDA_PREFIX", str(env))
    else:
        env = home
        (home / "pyvenv.cfg").write_text("home = /usr/bin\n")
        monkeypatch.setenv("VIRTUAL_ENV", str(home))
        monkeypatch.setenv("WORKON_HOME", str(home))  # (a store at $HOME is none)
    result = await run(f"cat ~/.ssh/id_rsa {env}/conda-meta/state; echo ${{VIRTUAL_ENV:-none}}")
    assert "s3cr3t" not in result.text() and "wJalr" not in result.text(), result.text()
    assert result.text().endswith("none\n"), result.text()
    if where == "another project":
        result = await run("mytool")
        assert f"the sandbox runs no program from these directories of the PATH: {env}/bin" in result.text()


def browser(path: Path, says: str) -> Path:
    """A browser's executable as its tool's download lays it out (one that prints `says`)."""
    path.parent.mkdir(parents=True)
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(0o755)
    return path


async def test_what_tests_run_from_your_cache_is_found_and_run(run, home, monkeypatch):
    """Playwright, pre-commit and corepack look under $XDG_CACHE_HOME, the cwd's own cache in a
    sandbox, and Puppeteer under ~/.cache (outside the grants): every end-to-end test failed with
    "Executable doesn't exist", pre-commit (and so `git commit` in its repositories) reinstalled
    every hook, corepack refetched yarn 4, all over a network code has not. Each is read and run
    where you installed it, and told where that is; the rest of ~/.cache stays out."""
    for variable in ("PLAYWRIGHT_BROWSERS_PATH", "PUPPETEER_CACHE_DIR", "PRE_COMMIT_HOME", "COREPACK_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    cache = home / ".cache"
    browser(cache / "ms-playwright" / "chromium-1140" / "chrome-linux" / "chrome", "playwright-chromium")
    browser(cache / "puppeteer" / "chrome" / "linux-131" / "chrome-linux64" / "chrome", "puppeteer-chrome")
    browser(cache / "pre-commit" / "repoab12" / "py_env-python3" / "bin" / "ruff", "pre-commit-ruff")
    browser(cache / "node" / "corepack" / "v1" / "yarn" / "4.9.2" / "yarn.js", "corepack-yarn")
    (cache / "pip").mkdir()
    code = (
        '"$PLAYWRIGHT_BROWSERS_PATH"/chromium-1140/chrome-linux/chrome && '
        '"$PUPPETEER_CACHE_DIR"/chrome/linux-131/chrome-linux64/chrome && '
        "~/.cache/puppeteer/chrome/linux-131/chrome-linux64/chrome && "
        '"$PRE_COMMIT_HOME"/repoab12/py_env-python3/bin/ruff && "$COREPACK_HOME"/v1/yarn/4.9.2/yarn.js && '
        '(touch "$PRE_COMMIT_HOME/planted" 2>/dev/null || echo read-only); '
        "ls ~/.cache/pip 2>&1 | grep -c denied"
    )
    result = await run(code)
    expected = "playwright-chromium\npuppeteer-chrome\npuppeteer-chrome\npre-commit-ruff\ncorepack-yarn\nread-only\n1\n"
    assert result.text() == expected, result.text()
    # a tool server (beside its network) gets the browsers, not the hook repositories cloned
    tools = sandbox.load_policy("tools", cwd_of(run).as_posix(), "")
    assert str(cache / "ms-playwright") in tools.paths["rox"] and str(cache / "pre-commit") not in tools.paths["rox"]


def project_venv(store: Path, name: str) -> Path:
    """A virtualenv as poetry or pipenv makes one in its store, its `pytest` one that says so."""
    browser(store / name / "bin" / "pytest", f"pytest of {name}")
    (store / name / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return store / name


async def test_poetry_and_pipenv_find_the_projects_virtualenv_in_their_store(run, home, monkeypatch):
    """`poetry install` (or `pipenv install`) on the host, then `poetry run pytest` in the
    sandbox: poetry looked under the cwd's own cache, made an empty virtualenv there, and found no
    pytest; pipenv's was refused. The project's own is read and run (by the name each gives it, a
    hash of the project's path), and poetry told where; another project's stays out."""
    for variable in ("POETRY_VIRTUALENVS_PATH", "WORKON_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(variable, raising=False)
    cwd = os.path.realpath(cwd_of(run))
    (cwd_of(run) / "pyproject.toml").write_text('[tool.poetry]\nname = "demo"\n')
    (cwd_of(run) / "Pipfile").write_text("[packages]\n")
    poetry_store, pipenv_store = home / ".cache" / "pypoetry" / "virtualenvs", home / ".local" / "share" / "virtualenvs"
    tag = base64.urlsafe_b64encode(hashlib.sha256(cwd.encode()).digest()).decode()[:8]
    ours = project_venv(poetry_store, f"demo-{tag}-py3.11")
    (ours / "bin" / "postactivate").write_text("export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI\n")
    project_venv(poetry_store, "other-AbCdEfGh-py3.11")
    project_venv(poetry_store, f"x-{tag}-py3.11-other-AbCdEfGh-py3.12")  # (another project's, by its name)
    (poetry_store / "envs.toml").write_text('[demo-x]\nminor = "3.11"\n')
    pipenv_tag = base64.urlsafe_b64encode(hashlib.sha256(f"{cwd}/Pipfile".encode()).digest()[:6]).decode()
    project_venv(pipenv_store, f"demo-{pipenv_tag}")
    code = (
        f'"$POETRY_VIRTUALENVS_PATH"/{ours.name}/bin/pytest && cat "$POETRY_VIRTUALENVS_PATH/envs.toml" && '
        f"{pipenv_store}/demo-{pipenv_tag}/bin/pytest && "
        f"(cat {ours}/bin/postactivate; {poetry_store}/x-{tag}-py3.11-other-AbCdEfGh-py3.12/bin/pytest 2>&1 "
        "| grep -c denied; "
        f"touch {ours}/planted 2>/dev/null || echo read-only)"
    )
    result = await run(code)
    expected = f'pytest of {ours.name}\n[demo-x]\nminor = "3.11"\npytest of demo-{pipenv_tag}\n1\nread-only\n'
    assert result.text() == expected, result.text()


def test_a_store_filled_by_code_is_looked_at_only_so_far(tmp_path, monkeypatch):
    """Code working in $HOME can fill poetry's store with a million entries: each session's build
    of a poetry project (one thread builds every session's) looks at the first few thousand."""
    for n in range(5):
        (tmp_path / f"entry{n}").mkdir()
    monkeypatch.setattr(policy_module, "STORE_LISTED", 3)
    assert len(policy_module._store(str(tmp_path))) == 3


async def test_relative_base_directories_are_ignored(run, monkeypatch):
    """The XDG spec ignores a relative base directory: one had every call fail ("not an absolute
    path"), and a relative store of virtualenvs would have been listed from the server's own
    directory."""
    for variable in ("XDG_CACHE_HOME", "XDG_DATA_HOME", "WORKON_HOME", "POETRY_VIRTUALENVS_PATH", "PRE_COMMIT_HOME"):
        monkeypatch.setenv(variable, "relative/dir")
    (cwd_of(run) / "pyproject.toml").write_text("[project]\n")
    (cwd_of(run) / "Pipfile").write_text("[packages]\n")
    result = await run('echo "$PRE_COMMIT_HOME"')
    assert (result.is_error, result.text()) == (False, "relative/dir\n"), result.text()
    policy = sandbox.load_policy("default", os.path.realpath(cwd_of(run)), "")
    assert all(os.path.isabs(p) for key in policy.paths for p in policy.paths[key])


async def test_what_your_local_installs_lead_to_runs(run, home, monkeypatch):
    """~/.local/bin's programs lead into ~/.local/lib (`pip install --user`'s packages, npm's with
    the prefix ~/.local) or poetry's installer's virtualenv, none granted: `Permission denied`,
    and a test's import of a --user package failed."""
    tool = home / ".local" / "lib" / "node_modules" / "hello" / "cli.sh"
    browser(tool, "hello from local lib")
    poetry = browser(home / ".local" / "share" / "pypoetry" / "venv" / "bin" / "poetry", "poetry ran")
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "hello").symlink_to(tool)
    (home / ".local" / "bin" / "poetry").symlink_to(poetry)
    site = home / ".local" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True)
    (site / "usermod.py").write_text("WHERE = 'user site'\n")
    monkeypatch.setenv("PATH", f"{home}/.local/bin:{os.environ['PATH']}")
    python = f"{sys.base_prefix}/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    # npm's global npmrc under a prefix granted whole (`npm config set -g` writes tokens there)
    (home / ".npm-global" / "etc").mkdir(parents=True)
    (home / ".npm-global" / "etc" / "npmrc").write_text("//registry.npmjs.org/:_authToken=npm_SECRETSECRETSECRET\n")
    (poetry.parent.parent / "pip.conf").write_text("[global]\nindex-url = https://ada:S3cretXyz@pypi.corp.example/\n")
    code = f"hello && poetry && {python} -c 'import usermod; print(usermod.WHERE)'"
    result = await run(f"{code} && cat ~/.npm-global/etc/npmrc {poetry.parent.parent}/pip.conf | wc -c")
    assert result.text() == "hello from local lib\npoetry ran\nuser site\n0\n", result.text()


async def test_poetry_pdm_uv_and_yarn_read_their_configuration_unless_it_holds_a_secret(run, home):
    """poetry and yarn died on a configuration they may not read (`[Errno 13] … config.toml`,
    `EACCES … .yarnrc.yml`), pdm and uv lost their settings. Each is read when nothing in it looks
    like a secret; poetry's auth.toml, its repositories' passwords, reads as none."""
    config = home / ".config"
    (config / "pypoetry").mkdir(parents=True)
    (config / "pypoetry" / "config.toml").write_text("[virtualenvs]\nin-project = true\n")
    (config / "pypoetry" / "auth.toml").write_text('[http-basic.corp]\nusername = "ada"\npassword = "hunter2"\n')
    (config / "uv").mkdir()
    (config / "uv" / "uv.toml").write_text('index-url = "https://ada:s3cr3tpassw0rd@pypi.corp.example/simple"\n')
    (home / ".yarnrc.yml").write_text("enableTelemetry: false\n")
    code = (
        "cat ~/.config/pypoetry/config.toml ~/.yarnrc.yml; wc -c < ~/.config/pypoetry/auth.toml; "
        "cat ~/.config/uv/uv.toml 2>&1 | grep -c denied"
    )
    result = await run(code)
    assert result.text() == "[virtualenvs]\nin-project = true\nenableTelemetry: false\n0\n1\n", result.text()


@pytest.mark.parametrize("given", ["a place of your own", "0"])
async def test_playwright_browsers_path_is_passed_on(run, home, monkeypatch, given):
    """A place of your own is granted too; Playwright's 0 (browsers in the project's
    node_modules) is passed on as it is, and grants nothing."""
    elsewhere = cwd_of(run).parent / "pw-browsers"
    browser(elsewhere / "firefox-1466" / "firefox" / "firefox", "playwright-firefox")
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(elsewhere) if given != "0" else "0")
    result = await run('echo "$PLAYWRIGHT_BROWSERS_PATH"; "$PLAYWRIGHT_BROWSERS_PATH"/firefox-1466/firefox/firefox')
    if given == "0":
        assert result.is_error and "\n0\n" in result.text(), result.text()
        assert "0/firefox-1466/firefox/firefox: No such" in result.text()
    else:
        assert result.text() == f"{elsewhere}\nplaywright-firefox\n", result.text()


@pytest.mark.skipif(not shutil.which("node"), reason="needs node")
async def test_node_lists_the_jails_network_interfaces(run):
    """Vite's and webpack's dev servers, and test runners, ask for the interfaces (getifaddrs,
    over rtnetlink): it threw "Unknown system error 97" under the sandbox."""
    result = await run("node -e \"console.log(Object.keys(require('os').networkInterfaces()).join())\"")
    assert (result.is_error, result.text()) == (False, "lo\n"), result.text()


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium")
async def test_a_headless_browser_renders_a_page(run):
    # A browser test's browser: its processes talk over Unix sockets (the jail's own), and Debian's
    # launcher reads /etc/chromium.d. Its own sandbox needs privileges a jail does not give.
    flags = "--headless --no-sandbox --disable-gpu --user-data-dir=/tmp/profile"
    result = await run(f'chromium {flags} --dump-dom "data:text/html,<p>hi</p>" 2>/dev/null', timeout=60)
    assert "<body><p>hi</p></body>" in result.text(), result.text()


@pytest.mark.skipif(not shutil.which("cc"), reason="needs cc")
async def test_a_sanitizer_build_runs_under_a_policy_without_the_heaps_bound(run):
    """`make test` of a C project built with AddressSanitizer: its shadow memory, terabytes reserved
    and hardly used, counts against RLIMIT_DATA, so the default 4G fails every such program (and
    numbers below a machine's size would too); `memory: unlimited` lifts the bound for a policy."""
    (cwd_of(run) / "t.c").write_text('#include <stdio.h>\nint main(void) { puts("asan ok"); return 0; }\n')
    built = await run("cc -fsanitize=address -o t t.c 2>&1 && echo built", timeout=60)
    if built.is_error or "built" not in built.text():
        pytest.skip(f"this cc cannot build with AddressSanitizer: {built.text()[-200:]}")
    failed = await run("./t")
    assert failed.is_error and "AddressSanitizer failed to allocate" in failed.text()
    write_policy("wide", "limits:\n  memory: unlimited\n")
    result = await run("./t", sandbox="wide")
    assert (result.is_error, result.text()) == (False, "asan ok\n")


async def test_a_virtualenvs_own_scripts_run_and_install_into_it(run):
    pkg = cwd_of(run) / "hello"
    (pkg / "hello").mkdir(parents=True)
    (pkg / "hello" / "__init__.py").write_text("def main():\n    print('hello from the venv')\n")
    (pkg / "setup.py").write_text(
        "from setuptools import setup\n"
        "setup(name='hello', version='1', packages=['hello'], entry_points={'console_scripts': ['hello=hello:main']})\n"
    )
    code = (
        "python3 -m venv .venv && .venv/bin/pip --version >/dev/null && "
        ".venv/bin/pip install -q --no-index --no-build-isolation ./hello 2>&1 | grep -v WARNING; .venv/bin/hello"
    )
    result = await run(code, timeout=120)
    assert not result.is_error and result.text().endswith("hello from the venv\n"), result.text()


@pytest.mark.skipif(not shutil.which("npm"), reason="needs npm")
async def test_npm_test_runs_the_projects_node_modules_bin(run):
    (cwd_of(run) / "package.json").write_text('{"name": "p", "version": "1.0.0", "scripts": {"test": "check-it"}}')
    bin_dir = cwd_of(run) / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "check-it").write_text("#!/bin/sh\necho node tests pass\n")
    (bin_dir / "check-it").chmod(0o755)
    result = await run("npm test --silent 2>/dev/null", timeout=60)
    assert (result.is_error, result.text()) == (False, "node tests pass\n")


@pytest.mark.skipif(not CARGO or not os.path.isdir(RUSTUP_HOME), reason="needs a Rust toolchain")
async def test_cargo_test_finds_a_toolchain_under_home(run, monkeypatch):
    monkeypatch.setenv("RUSTUP_HOME", RUSTUP_HOME)
    monkeypatch.setenv("CARGO_HOME", str(Path(CARGO).parent.parent))
    crate = cwd_of(run)
    (crate / "src").mkdir()
    (crate / "Cargo.toml").write_text('[package]\nname = "t"\nversion = "0.1.0"\nedition = "2021"\n')
    (crate / "src" / "lib.rs").write_text("#[test]\nfn adds() { assert_eq!(1 + 1, 2); }\n")
    result = await run(f"{CARGO} test --offline -q 2>&1 | grep 'test result'", timeout=120)
    assert not result.is_error and "1 passed" in result.text(), result.text()


GITCONFIG = '[user]\n\tname = Ada L\n\temail = ada@example.com\n[url "https://tok-SECRET@x.io/"]\n\tinsteadOf = x\n'


@pytest.mark.skipif(not CARGO or not os.path.isdir(RUSTUP_HOME), reason="needs a Rust toolchain")
async def test_cargo_new_makes_a_crate_where_you_keep_a_gitconfig(run, home, monkeypatch):
    """libgit2 reads ~/.gitconfig whatever GIT_CONFIG_GLOBAL says, and died on the one it may not
    read ("failed open - '~/.gitconfig' is locked"), so `cargo new` failed for anyone with one.
    It reads as empty (its token too); git commits with the identity ollie gives it."""
    monkeypatch.setenv("RUSTUP_HOME", RUSTUP_HOME)
    monkeypatch.setenv("CARGO_HOME", str(Path(CARGO).parent.parent))
    (home / ".gitconfig").write_text(GITCONFIG)
    code = (
        f"{CARGO} new --offline -q hello 2>&1 && cd hello && git add -A && git commit -qm first && "
        "git log --format='%an <%ae>' && (echo '[core]' >> ~/.gitconfig) 2>/dev/null; wc -c < ~/.gitconfig"
    )
    result = await run(code, timeout=120)
    assert result.text() == "Ada L <ada@example.com>\n0\n", result.text()
    assert (cwd_of(run) / "hello" / "Cargo.toml").is_file()
    assert "SECRET" in (text := (home / ".gitconfig").read_text()) and "[core]" not in text  # (written to /dev/null)


async def test_your_gitconfig_stays_masked_when_you_change_it_and_when_a_session_goes_home(run, home, monkeypatch):
    """`git config --global` on the host renames a new file over ~/.gitconfig, which took the
    mask along in running jails: the file was bare there (unreadable, libgit2 died again) until
    the session ended. It is masked again at the next look. And a session that moved to $HOME
    stays in its jail, masks and all: its git commits with the identity it was given."""
    monkeypatch.setattr(sandbox, "RECHECK", 0)  # running sessions' paths looked at at every call
    monkeypatch.setattr(sandbox, "_next_look", 0.0)
    (home / ".gitconfig").write_text(GITCONFIG)
    assert (await run("wc -c < ~/.gitconfig")).text() == "0\n"
    (home / ".gitconfig.lock").write_text(GITCONFIG + "[alias]\n\tst = status\n")
    os.rename(home / ".gitconfig.lock", home / ".gitconfig")
    await run("true")  # (the look that finds it replaced)
    result = await run("wc -c < ~/.gitconfig; grep -c tok-SECRET ~/.gitconfig; true")
    assert result.text() == "0\n0\n", result.text()
    home_ctx = CallContext(cwd=str(home), session_id="s", tmpdir=run.ctx.tmpdir, policies=run.ctx.policies)
    code = "git init -q repoH && cd repoH && git commit -q --allow-empty -m x && git log --format='%an <%ae>'"
    result = await run.server.call_tool("execute_code", {"steps": [{"code": code, "language": "bash"}]}, home_ctx)
    assert result.text() == "Ada L <ada@example.com>\n", result.text()


async def test_a_gitconfig_stow_links_into_home_is_masked_too(run, home):
    """A dotfiles manager (stow) links ~/.gitconfig to the file in your dotfiles: the mask, which
    follows no link, passed over it, and libgit2 died on the file it may not read (`cargo new`
    failed). The file the link leads to is masked; git still commits as you."""
    (home / "dotfiles" / "git").mkdir(parents=True)
    (home / "dotfiles" / "git" / ".gitconfig").write_text(GITCONFIG)
    (home / ".gitconfig").symlink_to("dotfiles/git/.gitconfig")
    code = (
        "wc -c < ~/.gitconfig; grep -c tok-SECRET ~/.gitconfig; "
        "git init -q repoS && cd repoS && git commit -q --allow-empty -m x && git log --format='%an <%ae>'"
    )
    result = await run(code)
    assert result.text() == "0\n0\nAda L <ada@example.com>\n", result.text()
    # a link to a file of another name (which code working in $HOME could have planted) masks nothing
    (home / ".gitconfig").unlink()
    (home / ".gitconfig").symlink_to(cwd_of(run) / "Makefile")
    (cwd_of(run) / "Makefile").write_text("all:\n")
    assert (await run("cat Makefile")).text() == "all:\n"


async def test_a_git_config_in_the_project_is_not_masked(run, home, monkeypatch):
    """A dotfiles project holding $XDG_CONFIG_HOME/git/config: code works on that file, which a
    mask would have shown empty, and had take writes into /dev/null."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(cwd_of(run)))
    (cwd_of(run) / "git").mkdir()
    (cwd_of(run) / "git" / "config").write_text("[user]\n\tname = Ada L\n")
    result = await run("cat git/config && echo '[core]' >> git/config && sed -i 's/Ada/Ada B/' git/config")
    assert result.text() == "[user]\n\tname = Ada L\n", result.text()
    assert (cwd_of(run) / "git" / "config").read_text() == "[user]\n\tname = Ada B L\n[core]\n"


@pytest.mark.skipif(not shutil.which("javac"), reason="needs a JDK")
async def test_javac_compiles_and_java_runs_with_the_jdks_configuration_under_etc(run):
    """Debian's JDK keeps its java.security under /etc/java-<version>: without it javac (and
    Gradle, Maven) died with "Error loading java.security file". Not its management/, where JMX's
    passwords go (jmxremote.password)."""
    (cwd_of(run) / "Hello.java").write_text(
        'public class Hello { public static void main(String[] a) { System.out.println("hello, java"); } }\n'
    )
    result = await run("javac Hello.java 2>&1 && java Hello", timeout=120)
    assert (result.is_error, result.text()) == (False, "hello, java\n")
    management = [p for p in Path("/etc").glob("java-*/management/*") if p.is_file() and os.access(p, os.R_OK)]
    if management:
        result = await run(f"cat {management[0]}")
        assert "Permission denied" in result.text(), result.text()


@pytest.mark.skipif(not shutil.which("fc-match"), reason="needs fontconfig")
@pytest.mark.skipif(not shutil.which("mvn"), reason="needs Maven")
async def test_maven_builds_with_its_settings_unless_they_hold_a_password(run, home, monkeypatch):
    """Debian's Maven reads its launcher's configuration from /etc/maven, and artifacts from
    ~/.m2/repository (read-only, as Go's and Cargo's downloads). Its settings.xml files are read
    when they hold no password (Maven's own, whose comments show placeholders, holds none); Maven
    stops on one it may not read, until a policy grants it (docs/sandbox.md)."""
    (home / ".m2" / "repository").mkdir(parents=True)  # (read-only: Maven would make it, were it missing)
    settings = home / ".m2" / "settings.xml"
    settings.write_text("<settings><offline>true</offline></settings>\n")
    assert "Apache Maven" in (await run("mvn -v")).text()
    (cwd_of(run) / "pom.xml").write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>t</groupId><artifactId>t</artifactId><version>1</version></project>\n"
    )
    mvn = "MAVEN_OPTS=-Duser.home=$HOME mvn -o -q -B validate"  # Java's home is the password file's, not $HOME
    result = await run(f"{mvn} && cat ~/.m2/settings.xml", timeout=120)  # both read: no secret in them
    assert not result.is_error and result.text().endswith("<offline>true</offline></settings>\n"), result.text()
    settings.write_text(
        "<settings><servers><server><id>corp</id><password>hunter2</password></server></servers></settings>\n"
    )
    monkeypatch.setattr(sandbox, "_next_look", 0.0)  # as RECHECK seconds later: judged again
    refused = await run(f"{mvn}; cat ~/.m2/settings.xml", timeout=120)
    assert "Non-readable settings" in refused.text() and "hunter2" not in refused.text(), refused.text()
    write_policy("wide", f"filesystem:\n  ro: [{settings}]\n")
    result = await run(f"{mvn} && echo valid", sandbox="wide", timeout=120)
    assert not result.is_error and result.text().endswith("valid\n"), result.text()


async def test_fontconfig_finds_its_configuration_and_cache(run):
    """Plots and headless browsers find fonts through fontconfig (/etc/fonts, its system cache)."""
    result = await run("fc-match sans 2>&1")
    assert not result.is_error and "Fontconfig error" not in result.text() and ".ttf" in result.text(), result.text()


async def test_git_commit_in_the_project(run):
    code = (
        "git init -q . && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m first && "
        "echo x > f && git add f && git -c user.name=a -c user.email=a@b commit -q -m second && "
        "git log --oneline | wc -l"
    )
    result = await run(code)
    assert (result.is_error, result.text().strip()) == (False, "2")


async def test_git_reads_your_global_ignore_and_attributes(run, home):
    """git's own places for them (~/.config/git/ignore, …/attributes) lie outside the grants, and
    git stops on an ignore file it may not read: every `git status` failed for a user who has one."""
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".config" / "git" / "ignore").write_text("*.log\n")
    (home / ".config" / "git" / "attributes").write_text("*.bin binary\n")
    result = await run("git init -q . && touch a.log b.txt && git status --porcelain 2>&1")
    assert (result.is_error, result.text()) == (False, "?? b.txt\n"), result.text()


async def test_git_runs_without_a_system_configuration_that_holds_a_token(run, home, monkeypatch):
    """/etc/gitconfig is read when it holds no secret, as the tools' configurations are; one with
    a token (`git config --system url."https://$TOKEN@github.com/".insteadOf`, as images are built)
    stays out, and git, which dies on a configuration it may not read, is told not to read it."""
    system = home / "etc-gitconfig"  # (as /etc/gitconfig, which a test may not write)
    monkeypatch.setattr(sandbox, "SYSTEM_GITCONFIG", str(system))
    monkeypatch.setattr(userconfig, "CONFIGS", (*userconfig.CONFIGS, str(system)))
    system.write_text("[core]\n\tpager = cat\n")
    git = f"GIT_CONFIG_SYSTEM={system} git"  # (git's own is this machine's /etc/gitconfig)
    code = f"cat {system}; echo no-system=$GIT_CONFIG_NOSYSTEM; {git} init -q . && {git} status --short | wc -l"
    result = await run(code)
    assert result.text() == "[core]\n\tpager = cat\nno-system=\n0\n", result.text()
    system.write_text('[url "https://x-access-token:ghs_16C7e42F292c6912E@github.com/"]\n\tinsteadOf = gh:\n')
    monkeypatch.setattr(sandbox, "_next_look", 0.0)  # as RECHECK seconds later: judged again
    result = await run(code)
    assert "ghs_" not in result.text() and "no-system=1\n0\n" in result.text(), result.text()


# ---- the toolchains' caches ----------------------------------------------------------------------


async def test_a_cwds_cache_lasts_from_jail_to_jail_and_is_no_other_cwds(home, tmp_path):
    """Sandboxed code caches in a directory of its cwd's own ($XDG_CACHE_HOME), kept from one
    session to the next; a session in another project neither sees nor reaches it (what one
    project's code wrote there would be what the other's build reads); `general.cache: false`
    leaves caching to the policy's grants."""
    one, other = home / "work" / "one", home / "work" / "other"
    one.mkdir(parents=True)
    other.mkdir()
    write = 'mkdir -p "$XDG_CACHE_HOME/tool" && echo built > "$XDG_CACHE_HOME/tool/entry" && echo "$XDG_CACHE_HOME"'
    is_error, cache = await in_cwd(one, tmp_path, write)
    assert not is_error and cache.strip().startswith(str(config.data_path() / "sandbox-cache")), cache
    assert (config.data_path() / "sandbox-cache").stat().st_mode & 0o777 == 0o700  # no other user's to enter
    assert await in_cwd(one, tmp_path, 'cat "$XDG_CACHE_HOME/tool/entry"') == (False, "built\n")
    # tools' state (pdm's logs, which it died on where ~/.local/state may not be written) too
    state = 'mkdir -p "$XDG_STATE_HOME/pdm/log" && echo logged > "$XDG_STATE_HOME/pdm/log/x" && echo "$XDG_STATE_HOME"'
    assert await in_cwd(one, tmp_path, state) == (False, f"{cache.strip()}/state\n")
    peek = f'test "$XDG_CACHE_HOME" != {cache.strip()} && cat {cache.strip()}/tool/entry 2>&1 | grep -c "No such"'
    assert await in_cwd(other, tmp_path, peek) == (False, "1\n")
    write_policy(None, "general:\n  cache: false\n")
    peek = f'echo "[$XDG_CACHE_HOME]"; cat {cache.strip()}/tool/entry 2>&1 | grep -c "No such"'
    assert await in_cwd(one, tmp_path, peek) == (False, "[]\n1\n")


async def test_the_cache_is_granted_when_ollies_data_lies_through_a_symlink_in_home(home, tmp_path, monkeypatch):
    """A linked ~/.local/share (dotfiles set-ups make one) puts ollie's data behind a symlink in
    $HOME, where code may write: the cache is granted by its real path, not refused as a grant
    through a link."""
    real = tmp_path / "elsewhere"
    real.mkdir()
    (home / ".local").mkdir()
    (home / ".local" / "share").symlink_to(real)
    monkeypatch.setenv("OLLIE_DATA_PATH", str(home / ".local" / "share" / "ollie"))
    cwd = home / "work"
    cwd.mkdir()
    is_error, text = await in_cwd(cwd, tmp_path, 'touch "$XDG_CACHE_HOME/entry" && echo "$XDG_CACHE_HOME"')
    assert not is_error and text.startswith(f"{real}/ollie/sandbox-cache/work-"), text


GO = shutil.which("go")


@pytest.mark.skipif(not GO, reason="needs Go")
async def test_go_test_builds_a_module_with_a_dependency_from_the_module_cache(home, tmp_path):
    """`go test` in the default sandbox: its build cache is the cwd's own cache (the real
    ~/.cache/go-build is read-only: "failed to initialize build cache"), the dependencies come
    from the module cache, which code reads and may not change (the user's own builds use it)."""
    proxy = tmp_path / "proxy" / "example.com" / "dep" / "@v"
    proxy.mkdir(parents=True)
    (proxy / "list").write_text("v1.0.0\n")
    (proxy / "v1.0.0.info").write_text('{"Version": "v1.0.0", "Time": "2026-01-01T00:00:00Z"}')
    (proxy / "v1.0.0.mod").write_text("module example.com/dep\n\ngo 1.19\n")
    with zipfile.ZipFile(proxy / "v1.0.0.zip", "w") as z:
        z.writestr("example.com/dep@v1.0.0/go.mod", "module example.com/dep\n\ngo 1.19\n")
        z.writestr("example.com/dep@v1.0.0/dep.go", "package dep\n\nfunc Twice(n int) int { return 2 * n }\n")
    project = home / "work" / "use"
    project.mkdir(parents=True)
    (project / "go.mod").write_text("module example.com/use\n\ngo 1.19\n\nrequire example.com/dep v1.0.0\n")
    (project / "use.go").write_text(
        'package use\n\nimport "example.com/dep"\n\nfunc Four() int { return dep.Twice(2) }\n'
    )
    (project / "use_test.go").write_text(
        'package use\n\nimport "testing"\n\nfunc TestFour(t *testing.T) { if Four() != 4 { t.Fatal(Four()) } }\n'
    )
    fetch = {"GOPROXY": f"file://{tmp_path}/proxy", "GONOSUMDB": "example.com", "GOFLAGS": "-mod=mod -modcacherw"}
    subprocess.run([GO, "mod", "download", "example.com/dep"], cwd=project, env={**os.environ, **fetch}, check=True)
    subprocess.run([GO, "mod", "tidy"], cwd=project, env={**os.environ, **fetch}, check=True, capture_output=True)
    code = (
        "go test ./... 2>&1 | awk '{print $1, $2}'; ls $XDG_CACHE_HOME | grep -x go-build; "
        "{ echo x >> ~/go/pkg/mod/example.com/dep@v1.0.0/dep.go; } 2>&1 | grep -o 'Permission denied'"
    )
    is_error, text = await in_cwd(project, tmp_path, code)
    assert (is_error, text) == (False, "ok example.com/use\ngo-build\nPermission denied\n"), text


CARGO_BIN = Path(RUSTUP_HOME) / "toolchains"


@pytest.mark.skipif(not CARGO or not os.path.isdir(RUSTUP_HOME), reason="needs a Rust toolchain")
async def test_cargo_test_builds_a_crate_with_a_dependency_from_the_registry_cache(home, tmp_path, monkeypatch):
    """A crate's dependencies, downloaded into ~/.cargo/registry (from a sparse registry, as
    crates.io is), build offline in the default sandbox, which reads that cache and not ~/.cargo
    itself (credentials.toml)."""
    monkeypatch.setenv("RUSTUP_HOME", RUSTUP_HOME)
    cargo_home = home / ".cargo"
    (cargo_home).mkdir()
    (cargo_home / "credentials.toml").write_text('[registry]\ntoken = "cio-secret"\n')
    # read (cargo dies on a config it may not read: "failed to read configuration file"), holding no secret
    (cargo_home / "config.toml").write_text("[term]\nverbose = false\n")
    monkeypatch.setenv("CARGO_HOME", str(cargo_home))
    toolchain = next(p for p in sorted(CARGO_BIN.iterdir()) if (p / "bin" / "cargo").exists()) / "bin"
    dep = tmp_path / "dep"
    (dep / "src").mkdir(parents=True)
    (dep / "Cargo.toml").write_text('[package]\nname = "twice"\nversion = "0.1.0"\nedition = "2021"\n')
    (dep / "src" / "lib.rs").write_text("pub fn twice(n: i32) -> i32 { 2 * n }\n")
    plain = {**os.environ, "PATH": f"{toolchain}:{os.environ['PATH']}"}
    package = ["cargo", "package", "-q", "--allow-dirty", "--no-verify", "--offline"]
    subprocess.run(package, cwd=dep, env=plain, check=True)
    served = tmp_path / "served"
    (served / "index" / "tw" / "ic").mkdir(parents=True)
    crate = (dep / "target" / "package" / "twice-0.1.0.crate").read_bytes()
    (served / "twice-0.1.0.crate").write_bytes(crate)
    entry = {"name": "twice", "vers": "0.1.0", "deps": [], "features": {}, "yanked": False}
    entry["cksum"] = hashlib.sha256(crate).hexdigest()
    (served / "index" / "tw" / "ic" / "twice").write_text(json.dumps(entry) + "\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as registry:
        threading.Thread(target=registry.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{registry.server_address[1]}"
        (served / "index" / "config.json").write_text(json.dumps({"dl": url + "/{crate}-{version}.crate"}))
        project = home / "work" / "ruse"
        (project / "src").mkdir(parents=True)
        (project / ".cargo").mkdir()
        (project / ".cargo" / "config.toml").write_text(f'[registries.local]\nindex = "sparse+{url}/index/"\n')
        (project / "Cargo.toml").write_text(
            '[package]\nname = "ruse"\nversion = "0.1.0"\nedition = "2021"\n\n'
            '[dependencies]\ntwice = { version = "0.1", registry = "local" }\n'
        )
        (project / "src" / "lib.rs").write_text("#[test]\nfn four() { assert_eq!(twice::twice(2), 4); }\n")
        subprocess.run(["cargo", "fetch", "-q"], cwd=project, env=plain, check=True)
        registry.shutdown()
    code = (
        f"export PATH={toolchain}:$PATH; cargo test --offline -q 2>&1 | grep -m1 'test result'; "
        "cat $CARGO_HOME/credentials.toml 2>&1 | grep -c denied"
    )
    is_error, text = await in_cwd(project, tmp_path, code)
    assert not is_error and "1 passed" in text and text.endswith("\n1\n") and "cio-secret" not in text, text


@pytest.mark.skipif(not shutil.which("npm"), reason="needs npm")
async def test_your_npmrc_is_read_unless_it_holds_a_token(home, tmp_path, monkeypatch):
    """~/.npmrc unreadable made yarn die and npm warn; npm and yarn read a copy of it when it holds
    no secret, else none (npm_config_userconfig), and the file itself stays out of reach."""
    cwd = home / "work" / "web"
    cwd.mkdir(parents=True)
    (home / ".npmrc").write_text("init-license=MIT\n")
    assert await in_cwd(cwd, tmp_path, "npm config get init-license 2>&1") == (False, "MIT\n")
    (home / ".npmrc").write_text("init-license=MIT\n//registry.example/:_authToken=npm-SECRET\n")
    is_error, text = await in_cwd(cwd, tmp_path, "npm config get init-license 2>&1; cat ~/.npmrc 2>&1; true")
    assert "npm-SECRET" not in text and text.startswith("ISC\n") and "Permission denied" in text, text


@pytest.mark.skipif(not shutil.which("npm"), reason="needs npm")
async def test_a_token_npm_login_writes_while_code_runs_never_shows(home, tmp_path, monkeypatch):
    """`npm login` writes its token into ~/.npmrc in place: what code reads is a copy of the file
    as it was judged, so neither a stage already running nor the calls before the next look at the
    grants see the token; a change without one reaches the session at that look."""
    cwd = home / "work" / "web"
    cwd.mkdir(parents=True)
    (home / ".npmrc").write_text("init-license=MIT\n")
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), session_id="s", tmpdir=str(tmp_path))
    poll = (
        'for i in $(seq 100); do cat ~/.npmrc "$npm_config_userconfig" 2>&1; [ -e ready ] && break; '
        'sleep 0.05; done; sleep 0.3; cat ~/.npmrc "$npm_config_userconfig" 2>&1; true'
    )
    license = {"steps": [{"code": "npm config get init-license 2>&1; cat ~/.npmrc 2>&1; true"}]}
    monkeypatch.setattr(sandbox, "_next_look", float("inf"))  # no look at the grants but those asked for
    try:
        running = asyncio.create_task(server.call_tool("execute_code", {"steps": [{"code": poll}]}, ctx))
        await asyncio.sleep(1.0)
        with open(home / ".npmrc", "a") as npmrc:  # in place, as npm login writes it
            npmrc.write("//registry.example/:_authToken=npm-LATER\n")
        (cwd / "ready").touch()
        polled = (await running).text()
        before_look = (await server.call_tool("execute_code", license, ctx)).text()
        monkeypatch.setattr(sandbox, "_next_look", 0.0)  # the look at the grants, due now (every 5 s)
        after_look = (await server.call_tool("execute_code", license, ctx)).text()
        (home / ".npmrc").write_text("init-license=Apache-2.0\n")  # the token gone again
        monkeypatch.setattr(sandbox, "_next_look", 0.0)
        changed = (await server.call_tool("execute_code", license, ctx)).text()
    finally:
        await server.close()
    assert "init-license=MIT" in polled and "npm-LATER" not in polled, polled
    assert before_look.startswith("MIT\n") and "npm-LATER" not in before_look, before_look
    assert after_look.startswith("ISC\n") and "npm-LATER" not in after_look, after_look
    assert changed.startswith("Apache-2.0\n") and "Permission denied" in changed, changed


@pytest.mark.skipif(not shutil.which("npm"), reason="needs npm")
async def test_an_npmrc_made_while_a_session_runs_reaches_it_at_the_next_look(home, tmp_path, monkeypatch):
    """A session started with no ~/.npmrc: one made later (the user's first `npm config set`) is
    looked at as one changed is, so the calls after the next look read a copy of it, not the file
    they may not read (yarn dies on it)."""
    cwd = home / "work" / "web"
    cwd.mkdir(parents=True)
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), session_id="s", tmpdir=str(tmp_path))
    license = {"steps": [{"code": 'npm config get init-license 2>&1; echo "[$npm_config_userconfig]"'}]}
    monkeypatch.setattr(sandbox, "_next_look", float("inf"))
    try:
        before = (await server.call_tool("execute_code", license, ctx)).text()
        (home / ".npmrc").write_text("init-license=MIT\n")
        monkeypatch.setattr(sandbox, "_next_look", 0.0)  # the look at the grants, due now (every 5 s)
        after = (await server.call_tool("execute_code", license, ctx)).text()
    finally:
        await server.close()
    assert before == "ISC\n[/dev/null]\n", before
    assert after.startswith("MIT\n[") and "sandbox-config" in after, after


async def test_a_linked_npmrc_is_not_copied_from_where_code_could_point_it(home, tmp_path):
    """Code that writes $HOME can make ~/.npmrc a link to a file it may not read (another
    project's notes, secret-free): ollie reads the file to copy it, so a link in a directory code
    may write is not followed, and npm reads none."""
    cwd = home / "work" / "web"
    cwd.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as elsewhere:  # granted to no sandbox
        (Path(elsewhere) / "notes").write_text("plan=MARKER-OUTSIDE\n")
        (home / ".npmrc").symlink_to(Path(elsewhere) / "notes")
        code = 'echo "$npm_config_userconfig"; cat "$npm_config_userconfig" 2>&1; cat ~/.npmrc 2>&1; true'
        is_error, text = await in_cwd(cwd, tmp_path, code)
    assert not is_error and text.startswith("/dev/null\n") and "MARKER-OUTSIDE" not in text, text


async def test_what_cannot_be_written_for_the_sandbox_leaves_it_out_and_the_session_working(home, tmp_path):
    """The ~/.npmrc copy and git's identity file that cannot be written (a full disk; here a file
    where their directory goes) give npm no configuration and git no identity, said in the log,
    rather than failing every session's sandbox build."""
    cwd = home / "work" / "web"
    cwd.mkdir(parents=True)
    (home / ".npmrc").write_text("init-license=MIT\n")
    (home / ".gitconfig").write_text("[user]\n\tname = Ada\n")
    config.data_path().mkdir(parents=True, exist_ok=True)
    for name in ("sandbox-config", "sandbox-git"):
        (config.data_path() / name).write_text("not a directory")
    code = 'echo "$npm_config_userconfig" "$GIT_CONFIG_GLOBAL"'
    assert await in_cwd(cwd, tmp_path, code) == (False, "/dev/null /dev/null\n")


def monorepo(root: Path) -> Path:
    """A git repository with a package below its root and the root's hoisted node_modules/.bin;
    returns the package's directory."""
    package = root / "packages" / "app"
    package.mkdir(parents=True)
    (root / "README").write_text("the monorepo\n")
    tools = root / "node_modules" / ".bin"
    tools.mkdir(parents=True)
    (tools / "check-it").write_text("#!/bin/sh\necho root tests pass\n")
    (tools / "check-it").chmod(0o755)
    git = ["git", "-C", str(root), "-c", "user.name=a", "-c", "user.email=a@b"]
    subprocess.run([*git, "init", "-q"], check=True)
    (package / "index.js").write_text("module.exports = 1\n")
    subprocess.run([*git, "add", "README", "packages/app/index.js"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    return package


async def in_cwd(cwd: Path, tmp_path: Path, code: str) -> tuple[bool, str]:
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), session_id="s", tmpdir=str(tmp_path))
    try:
        result = await server.call_tool("execute_code", {"steps": [{"code": code}]}, ctx)
        return result.is_error, result.text()
    finally:
        await server.close()


async def test_a_package_of_a_monorepo_uses_git_and_the_roots_tools(home, tmp_path):
    """A session in a subdirectory of a repository: git finds the repository above its cwd, the
    root's tools run, the rest of the work tree is read, not written."""
    package = monorepo(home / "work" / "mono")
    code = (
        "git log --format=%s && git status --short . && ../../node_modules/.bin/check-it && cat ../../README && "
        "{ echo x > ../../new; } 2>&1 | grep -o 'Read-only file system'"
    )
    assert await in_cwd(package, tmp_path, code) == (
        False,
        "first\nroot tests pass\nthe monorepo\nRead-only file system\n",
    )
    assert sandbox.repository_root(f"{package}/./", os.environ["HOME"]) == str(package.parent.parent)
    write_policy(None, "general:\n  repository: false\n")  # the user's choice: the cwd alone
    is_error, text = await in_cwd(package, tmp_path, "git log --format=%s 2>&1; cat ../../README 2>&1")
    assert "not a git repository" in text and "Permission denied" in text and "monorepo" not in text
    write_policy(None, "general:\n  repository: sometimes\n")
    is_error, text = await in_cwd(package, tmp_path, "true")
    assert is_error and "general.repository must be true or false, got 'sometimes'" in text


async def test_a_sub_agents_worktree_runs_git_on_the_repository_it_was_made_from(home, tmp_path):
    """ollie makes a `worktree=1` sub-agent's worktree at <root>/.ollie/worktrees/<id>: a cwd in a
    dot-directory of the work tree, whose `.git` file leads to <root>/.git, out of its sandbox, so
    git failed there ("not a git repository"). A worktree the repository has registered brings the
    work tree as {REPO} does; a directory that only looks like one, or whose registration is a
    link, brings nothing."""
    root = home / "work" / "proj"
    root.mkdir(parents=True)
    git = ["git", "-C", str(root), "-c", "user.name=a", "-c", "user.email=a@b"]
    subprocess.run([*git, "init", "-q"], check=True)
    (root / "f.txt").write_text("one\n")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    tree = root / ".ollie" / "worktrees" / "w1"
    subprocess.run([*git, "worktree", "add", "-q", "-b", "ollie/w1", str(tree)], check=True)
    code = "echo two >> f.txt && git log --format=%s && git status --short && git diff --stat | tail -1"
    assert await in_cwd(tree, tmp_path, code) == (False, "first\n M f.txt\n 1 file changed, 1 insertion(+)\n")
    assert sandbox.repository_root(str(tree), os.environ["HOME"]) == str(root)
    fake = root / ".ollie" / "worktrees" / "w2"  # made by hand: no registration
    fake.mkdir()
    (fake / ".git").write_text(f"gitdir: {root}/.git/worktrees/w1\n")
    is_error, text = await in_cwd(fake, tmp_path, "git log --format=%s 2>&1; cat ../../../f.txt 2>&1")
    assert "first" not in text and "Permission denied" in text
    (fake.parent / "w3").mkdir()
    (root / ".git" / "worktrees" / "w3").symlink_to(root / ".git" / "worktrees" / "w1")
    assert sandbox.repository_root(str(fake.parent / "w3"), os.environ["HOME"]) == ""
    assert sandbox.repository_root(str(fake), os.environ["HOME"]) == ""


# ---- name resolution with connect_tcp -------------------------------------------------------------


async def test_udp_on_the_jails_own_loopback_works_where_it_reaches_nothing_else(run):
    """A test that logs to syslog over UDP, or runs a DNS server of its own: without a network
    grant the jail has a network of its own, where UDP reaches its loopback alone (the host's
    services are not there); with the host's network (`connect_tcp`), UDP stays refused."""
    echo = (
        "import socket\n"
        "a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\na.bind(('127.0.0.1', 0))\n"
        "b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nb.sendto(b'ping', a.getsockname())\n"
        "print(a.recvfrom(16)[0].decode())\n"
        "import logging.handlers\nlogging.handlers.SysLogHandler(('127.0.0.1', 514)).emit(logging.makeLogRecord({}))\n"
        "print('logged')\n"
    )
    result = await run(echo, "python3")
    assert (result.is_error, result.text()) == (False, "ping\nlogged\n")
    write_policy("net", "network:\n  connect_tcp: [443]\n")
    refused = await run(echo, "python3", sandbox="net")
    assert refused.is_error and "Permission denied" in refused.text()


async def test_connect_tcp_brings_name_resolution_over_tcp_and_nothing_over_udp(run):
    write_policy("net", "network:\n  connect_tcp: [443]\n")
    probe = (
        "import os, socket\n"
        "print(os.environ.get('RES_OPTIONS'))\n"
        "try:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nexcept OSError as e:\n    print('udp', e.errno)\n"
        "s = socket.socket()\ns.settimeout(2)\n"
        "try:\n    s.connect(('127.0.0.1', 53))\nexcept PermissionError:\n    print('53 refused by the sandbox')\n"
        "except OSError:\n    print('53 allowed')\n"
        "else:\n    print('53 allowed')\n"  # something listens there (another test's resolver)
    )
    result = await run(probe, "python3", sandbox="net")
    assert result.text() == "use-vc\nudp 13\n53 allowed\n", result.text()
    write_policy("net", "network:\n  connect_tcp: [443]\n  dns: false\n")
    result = await run(probe, "python3", sandbox="net")
    assert "53 refused by the sandbox" in result.text() and "use-vc" not in result.text()


def _dns_server(sock: socket.socket, address: str) -> None:
    """Answer DNS queries over TCP: A with `address` (TTL 60), any other type with no record."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn, conn.makefile("rb") as queries:
            while len(size := queries.read(2)) == 2:
                query = queries.read(struct.unpack("!H", size)[0])
                end = query.index(b"\0", 12) + 5  # the question: name, type, class
                is_a = query[end - 4 : end - 2] == b"\x00\x01"
                header = query[:2] + b"\x81\x80" + query[4:6] + (b"\x00\x01" if is_a else b"\x00\x00") + b"\0" * 4
                answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + socket.inet_aton(address)
                reply = header + query[12:end] + (answer if is_a else b"")
                conn.sendall(struct.pack("!H", len(reply)) + reply)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for port 53 and a mount")
def test_a_name_resolves_through_the_systems_resolver_in_a_connect_tcp_policy(home, tmp_path):
    """pip install with connect_tcp: [443] needs the name of its index first: in a mount namespace
    whose resolv.conf names a DNS server on loopback (which answers over TCP only), a sandboxed
    stage resolves a name as pip would (getaddrinfo)."""
    listener = socket.create_server(("127.0.0.1", 53))
    threading.Thread(target=_dns_server, args=(listener, "127.0.0.9"), daemon=True).start()
    write_policy("net", "network:\n  connect_tcp: [443]\n")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:2\n")
    (tmp_path / "cwd").mkdir()
    stage = textwrap.dedent(f"""\
        import asyncio
        from ollie.tools import CallContext, execute
        code = "import socket; print(socket.getaddrinfo('pypi.example.test', 443)[0][4][0])"
        async def main():
            server = execute.factory({str(tmp_path / "cwd")!r})()
            ctx = CallContext(cwd={str(tmp_path / "cwd")!r}, session_id="s", policies=("net",))
            arguments = {{"steps": [{{"code": code, "language": "python3"}}], "sandbox": "net"}}
            print((await server.call_tool("execute_code", arguments, ctx)).text(), end="")
            await server.close()
        asyncio.run(main())
        """)
    try:
        out = subprocess.run(
            [
                "unshare",
                "-m",
                "sh",
                "-c",
                'mount --bind "$0" /etc/resolv.conf && exec "$1" -c "$2"',
                resolv,
                sys.executable,
                stage,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        listener.close()
    assert out.stdout == "127.0.0.9\n", out.stdout + out.stderr


async def test_git_works_with_your_identity_and_without_the_rest_of_your_gitconfig(run, home):
    """~/.gitconfig lies outside the grants, and git dies on a config it may not read: the sandbox
    gets your name and email, not its aliases, includes or the token a URL rewrite may hold."""
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Ada L\n\temail = ada@example.com\n"
        "[init]\n\tdefaultBranch = trunk\n"  # the name `git init` gives, kept too
        '[url "https://tok-SECRET@github.com/"]\n\tinsteadOf = https://github.com/\n'
        f'[includeIf "gitdir:{run.ctx.cwd}/work/"]\n\tpath = .gitconfig-work\n'
    )
    (home / ".gitconfig-work").write_text("[user]\n\temail = ada@corp.example\n[credential]\n\thelper = SECRET\n")
    code = (
        "git init -q . && git commit -q --allow-empty -m first && git log --format='%an <%ae>' && "
        "git branch --show-current && git config --list --show-origin | grep -c SECRET; true"
    )
    result = await run(code)
    assert result.text() == "Ada L <ada@example.com>\ntrunk\n0\n", result.text()
    # a repository's own identity wins over yours, as in git outside the sandbox (it lost to the
    # identity the sandbox passed, at the scope of git's command line)
    code = (
        "git config user.email 'ada@work.example' && git commit -q --allow-empty -m second && "
        "git log -1 --format='%an <%ae>' && git config --global user.name"
    )
    result = await run(code)
    assert result.text() == "Ada L <ada@work.example>\nAda L\n", result.text()
    # the identity an includeIf chooses for a directory of work, and nothing else of its file
    code = (
        "git init -q work && cd work && git commit -q --allow-empty -m first && "
        "git log --format='%an <%ae>' && git config --list --show-origin | grep -c SECRET; true"
    )
    result = await run(code)
    assert result.text() == "Ada L <ada@corp.example>\n0\n", result.text()
    # the identities of another global config (another user's $HOME, an old one) are not shown
    other = Path(sandbox.gitidentity.identity_file({"name": "Someone Else"}))
    result = await run(f"cat {other} 2>&1; ls $(dirname $GIT_CONFIG_GLOBAL)")
    assert "Someone Else" not in result.text() and result.text().endswith("0.gitconfig\nconfig\n"), result.text()
