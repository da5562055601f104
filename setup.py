"""The wheel carries the jails' native init (src/ollie/sandbox/jailinit.c), built here for the
wheel's platform, so that an ollie installed where no C compiler is (a slim container, a desktop
without build tools) still gets it: without it a jail's PID 1 stays Python (2 MiB a jail, and no Unix
sockets among a jail's programs). The metadata is all in pyproject.toml.

The init is linked statically, so that it runs on any Linux of the wheel's architecture; where no
compiler links it so, the wheel is built without it (pure, as before) and ollie builds the init on
the first jail it starts, as it does from a checkout or an editable install. With the init, the
wheel is tagged py3-none-<platform>: the init depends on no Python, only on the architecture.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

SOURCE = Path("src/ollie/sandbox/jailinit.c")


def init_name() -> str:
    """The init's file name in the package: named by its source's digest, as ollie looks for it
    (`ollie.sandbox.jail._native_init`), so that no init built from other source is ever run."""
    return f"ollie-jail-init-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]}"


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install builds it on first use, from its checkout
            build_init(Path(self.build_lib) / "ollie" / "sandbox" / init_name())


def build_init(target: Path) -> None:
    compiler = shlex.split(os.environ.get("CC") or "cc")
    command = [*compiler, "-std=gnu11", "-O2", "-static", "-s", "-o", str(target), str(SOURCE)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        done = subprocess.CompletedProcess(command, 1, "", str(e))
    if done.returncode != 0:
        target.unlink(missing_ok=True)
        print(
            f"ollie: the jails' native init was not built into the wheel ({shlex.join(command)}: "
            f"{done.stderr.strip()[-500:]}); ollie builds it on the first jail where a compiler is",
            file=sys.stderr,
        )


class BdistWheel(bdist_wheel):
    def run(self) -> None:
        if not self.skip_build:
            self.run_command("build")
        build_lib = Path(self.get_finalized_command("build_py").build_lib)
        self.root_is_pure = not (build_lib / "ollie" / "sandbox" / init_name()).exists()
        if not self.root_is_pure:  # the whole package in the platform's library, not the init alone
            self.distribution.has_ext_modules = lambda: True  # type: ignore[method-assign]
        super().run()

    def get_tag(self) -> tuple[str, str, str]:
        python, abi, platform = super().get_tag()
        return (python, abi, platform) if self.root_is_pure else ("py3", "none", platform)


setup(cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel})
