"""Your package caches in the default sandbox: code's $XDG_CACHE_HOME is the cwd's own cache, and
there it finds what your uv, npm, pnpm and Go caches hold, copy-on-write: `uv sync --offline`,
`npm ci --offline` and `pnpm install --offline` in a new project needed the network, and `go build`
compiled again what you had built. Your cache is never written, what code writes stays with the cwd, and each jail of a
cwd running at once has a view of its own (two overlays may not share what they write to)."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from ollie import sandbox
from ollie.sandbox import overlays
from ollie.tools import CallContext, execute
from sandbox_helpers import POLICIES, SECRET

pytestmark = pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="needs Landlock ABI 6 (Linux 6.12)")

GO = shutil.which("go")
NPM = shutil.which("npm")


def your_caches(home: Path) -> dict[str, Path]:
    """A uv cache and an npm one as those tools leave them (the mark each has at its top)."""
    uv = home / ".cache" / "uv"
    (uv / "wheels-v8" / "pkg").mkdir(parents=True)
    (uv / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    (uv / "wheels-v8" / "pkg" / "file").write_text("from your uv cache\n")
    npm = home / ".npm" / "_cacache"
    (npm / "index-v5").mkdir(parents=True)
    (npm / "content-v2").mkdir()
    (npm / "content-v2" / "tarball").write_text("from your npm cache\n")
    store = home / ".local" / "share" / "pnpm" / "store"
    (store / "v10" / "files" / "00").mkdir(parents=True)
    (store / "v10" / "files" / "00" / "abc").write_text("from your pnpm store\n")
    pnpm = home / ".cache" / "pnpm"
    (pnpm / "metadata" / "registry.npmjs.org").mkdir(parents=True)
    (pnpm / "metadata" / "registry.npmjs.org" / "tiny.json").write_text("from your pnpm cache\n")
    return {"uv": uv, "npm": npm, "pnpm-store": store, "pnpm": pnpm}


def listing(top: Path) -> dict[str, tuple[int, int, bytes]]:
    return {
        str(p.relative_to(top)): (p.stat().st_mode, p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
        for p in sorted(top.rglob("*"))
    }


def session(cwd: Path, tmpdir: Path):
    """A session's execute_code in `cwd`: its own server, so its own jail."""
    tmpdir.mkdir(exist_ok=True)
    server = execute.factory(str(cwd))()
    ctx = CallContext(cwd=str(cwd), session_id=tmpdir.name, tmpdir=str(tmpdir), policies=POLICIES)

    async def call(code: str, **extra):
        arguments = {"steps": [{"code": code, "language": "bash"}], **extra}
        return await server.call_tool("execute_code", arguments, ctx)

    return server, call


async def test_your_caches_are_read_where_code_looks_and_never_written(run, home, monkeypatch):
    for variable in ("UV_CACHE_DIR", "npm_config_cache", "npm_config_store_dir", "pnpm_config_store_dir"):
        monkeypatch.delenv(variable, raising=False)
    caches = your_caches(home)
    before = {name: listing(path) for name, path in caches.items()}
    pnpm = await run(
        'cat "$pnpm_config_store_dir"/v10/files/00/abc '
        '"$XDG_CACHE_HOME"/pnpm/metadata/registry.npmjs.org/tiny.json && touch "$pnpm_config_store_dir"/v10/new'
    )
    assert pnpm.text() == "from your pnpm store\nfrom your pnpm cache\n", pnpm.text()
    first = await run(
        'cat "$XDG_CACHE_HOME"/uv/wheels-v8/pkg/file "$npm_config_cache"/_cacache/content-v2/tarball && '
        'echo changed > "$XDG_CACHE_HOME"/uv/wheels-v8/pkg/file && echo made > "$XDG_CACHE_HOME"/uv/made && '
        'rm "$XDG_CACHE_HOME"/uv/CACHEDIR.TAG && echo built > "$npm_config_cache"/_cacache/content-v2/new && '
        "(ls ~/.cache/uv ~/.npm 2>&1 | grep -c 'Permission denied')"
    )
    assert (first.is_error, first.text()) == (False, "from your uv cache\nfrom your npm cache\n2\n"), first.text()
    assert {name: listing(path) for name, path in caches.items()} == before  # yours, untouched
    again = await run(
        'cat "$XDG_CACHE_HOME"/uv/wheels-v8/pkg/file "$XDG_CACHE_HOME"/uv/made; ls "$XDG_CACHE_HOME"/uv; '
        'ls -A "$XDG_CACHE_HOME"/.overlay | wc -l; touch "$XDG_CACHE_HOME"/.overlay/x 2>&1 | grep -c Read-only'
    )
    # (where the overlays write is out of code's reach: changed beneath them, they would misbehave)
    assert again.text() == "changed\nmade\nmade\nwheels-v8\n0\n1\n", again.text()
    # the cwd's: a later session there (another jail) finds what this one's code wrote
    await run.server.close()
    server, later = session(Path(run.ctx.cwd), Path(run.ctx.tmpdir).with_name("later"))
    try:
        result = await later('cat "$XDG_CACHE_HOME"/uv/made "$npm_config_cache"/_cacache/content-v2/new')
        assert result.text() == "made\nbuilt\n", result.text()
    finally:
        await server.close()


async def test_two_sessions_of_one_cwd_at_once_each_write_a_view_of_their_own(run, home, monkeypatch):
    """Two overlays writing to one directory misbehave (a file one made the other may not see, a
    lock one took the other ignores): the second jail of a cwd running at once takes another
    slot. Each sees your cache, and what it writes itself."""
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)
    your_caches(home)
    first = await run('echo first > "$XDG_CACHE_HOME"/uv/mine && cat "$XDG_CACHE_HOME"/uv/wheels-v8/pkg/file')
    assert first.text() == "from your uv cache\n", first.text()
    server, second = session(Path(run.ctx.cwd), Path(run.ctx.tmpdir).with_name("second"))
    try:
        result = await second(
            'cat "$XDG_CACHE_HOME"/uv/wheels-v8/pkg/file; cat "$XDG_CACHE_HOME"/uv/mine 2>&1 | grep -c "No such"; '
            'echo second > "$XDG_CACHE_HOME"/uv/mine'
        )
        assert (result.is_error, result.text()) == (False, "from your uv cache\n1\n"), result.text()
        mine = await run('cat "$XDG_CACHE_HOME"/uv/mine')
        assert mine.text() == "first\n"
    finally:
        await server.close()
    cache = sandbox.load_policy("default", os.path.realpath(run.ctx.cwd), "").cache
    assert sorted(p.name for p in (Path(cache) / ".overlay" / "uv").iterdir()) == ["0", "1"]


async def test_only_a_tools_own_cache_is_shown(run, home, monkeypatch):
    """A variable that names another directory (your $HOME, a directory without the tool's mark)
    shows nothing: an overlay would show all of it, and what lies beneath ollie's hidden mounts."""
    (home / "notes").mkdir()
    (home / "notes" / "key").write_text(SECRET)
    for given in (home, home / "notes"):
        monkeypatch.setenv("UV_CACHE_DIR", str(given))
        result = await run('ls -A "$XDG_CACHE_HOME"/uv 2>/dev/null; cat "$XDG_CACHE_HOME"/uv/.ssh/id_rsa 2>&1 | wc -l')
        assert SECRET not in result.text() and ".ssh" not in result.text(), result.text()
    policy = sandbox.load_policy("default", os.path.realpath(run.ctx.cwd), "")
    assert [o.name for o in policy.overlays] == []
    # a tool's cache holding one of ollie's hidden directories, or reached through a link code could plant
    uv = home / "notes"
    (uv / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")

    xdg = {"XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local" / "share")}

    def decide(given: Path, writable: list[str], kept_out: list[str]) -> list[tuple[str, str]]:
        env = {"UV_CACHE_DIR": str(given)}
        found = overlays.decide(policy.cache, env, str(home), xdg, writable, kept_out)
        return [(o.name, o.lower) for o in found]

    assert decide(uv, [], [str(uv / "x")]) == []
    link = Path(run.ctx.cwd) / "link"
    link.symlink_to(uv)
    writable = [os.path.realpath(run.ctx.cwd)]
    assert decide(link, writable, []) == []
    assert decide(uv, writable, []) == [("uv", os.path.realpath(uv))]
    assert decide(uv, [*writable, os.path.realpath(uv / "sub")], []) == []  # a place code writes in it
    # your link to a place code writes, where code put a link of its own to a directory with the
    # mark (found by a red-team pass: that directory was shown, its .env read)
    (Path(run.ctx.cwd) / "shared").mkdir()
    (Path(run.ctx.cwd) / "shared" / "uv").symlink_to(uv)
    (home / ".uvcache").symlink_to(Path(run.ctx.cwd) / "shared" / "uv")
    assert decide(home / ".uvcache", writable, []) == []
    # ... and followed by another project's jail, for which that project is no place code writes
    # (the second pass: a link of yours, or code's, is never followed)
    assert decide(home / ".uvcache", [], []) == decide(link, [], []) == []
    # $HOME given through a link of yours, as the cache itself (the whole of it was shown)
    (home / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    linked_home = home.with_name(home.name + "-link")
    linked_home.symlink_to(home)
    try:
        env = {"UV_CACHE_DIR": str(linked_home)}
        assert overlays.decide(policy.cache, env, str(linked_home), xdg, [], []) == ()
    finally:
        linked_home.unlink()


async def test_a_jail_without_a_slot_cannot_reach_the_slots(run, home, monkeypatch):
    """Past the slots, a jail sees the cwd's cache alone; the slots stay out of its reach (a
    red-team pass wrote into the upper directory of a running jail's overlay from one)."""
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)
    monkeypatch.setattr(overlays, "SLOTS", 1)
    your_caches(home)
    first = await run('cat "$XDG_CACHE_HOME"/uv/wheels-v8/pkg/file')
    assert first.text() == "from your uv cache\n"
    server, second = session(Path(run.ctx.cwd), Path(run.ctx.tmpdir).with_name("second"))
    try:
        result = await second(
            'ls "$XDG_CACHE_HOME"/uv | wc -l; ls -A "$XDG_CACHE_HOME"/.overlay | wc -l; '
            'mkdir "$XDG_CACHE_HOME"/.overlay/uv 2>&1 | grep -c Read-only'
        )
        assert (result.is_error, result.text()) == (False, "0\n0\n1\n"), result.text()
    finally:
        await server.close()


@pytest.mark.skipif(not GO, reason="needs go")
async def test_go_builds_a_new_project_from_your_build_cache(run, home, monkeypatch):
    """`go build` in the sandbox compiled again what you had built (with Go 1.20 and later, the
    standard library too: seconds a package), as its cache was the cwd's own; it now finds your
    build cache's, and writes none of it."""
    for variable in ("GOCACHE", "GOFLAGS", "GOPATH", "GOTOOLCHAIN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("GOTOOLCHAIN", "local")
    project = Path(run.ctx.cwd)
    (project / "go.mod").write_text("module hello\n\ngo 1.19\n")
    (project / "main.go").write_text('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("ran") }\n')
    yours = home / ".cache" / "go-build"
    env = {**os.environ, "GOCACHE": str(yours)}
    subprocess.run([GO, "build", "-o", os.devnull, "."], cwd=project, env=env, check=True, timeout=300)
    before = listing(yours)
    result = await run('go build -v -o "$TMPDIR"/hello . 2>&1 && "$TMPDIR"/hello', timeout=300)
    assert (result.is_error, result.text()) == (False, "ran\n"), result.text()  # -v names no package compiled
    assert listing(yours) == before


def npm_package(name: str, script: str) -> bytes:
    """A package's tarball as npm publishes it (its files under `package/`)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for path, text in [
            ("package/package.json", json.dumps({"name": name, "version": "1.0.0"})),
            ("package/index.js", script),
        ]:
            info = tarfile.TarInfo(path)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return data.getvalue()


@pytest.mark.skipif(not NPM, reason="needs npm")
async def test_npm_ci_offline_installs_a_new_project_from_your_cache(run, home, tmp_path, monkeypatch):
    """`npm install` of a project on the host, then `npm ci --offline` in a clone of it in the
    sandbox: npm looked in the cwd's own cache, found nothing, and wanted the registry."""
    monkeypatch.delenv("npm_config_cache", raising=False)
    tarball = npm_package("tiny", "module.exports = 'tiny from your cache';\n")
    served = tmp_path / "served"
    (served / "tarballs").mkdir(parents=True)
    (served / "tarballs" / "tiny-1.0.0.tgz").write_bytes(tarball)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as registry:
        threading.Thread(target=registry.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{registry.server_address[1]}"
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
        dist = {"tarball": f"{url}/tarballs/tiny-1.0.0.tgz", "integrity": integrity}
        version = {"name": "tiny", "version": "1.0.0", "dist": dist}
        (served / "tiny").write_text(
            json.dumps({"name": "tiny", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}})
        )
        yours = tmp_path / "yours"
        yours.mkdir()
        (yours / "package.json").write_text(json.dumps({"name": "app", "dependencies": {"tiny": "1.0.0"}}))
        install = [NPM, "install", "--no-audit", "--no-fund", f"--registry={url}/"]
        subprocess.run(install, cwd=yours, check=True, timeout=120, capture_output=True)
        registry.shutdown()
    project = Path(run.ctx.cwd)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(yours / name, project / name)
    before = listing(home / ".npm" / "_cacache")
    code = "npm ci --offline --no-audit --no-fund >/dev/null 2>&1; node -p \"require('tiny')\""
    result = await run(code, timeout=120)
    assert (result.is_error, result.text()) == (False, "tiny from your cache\n"), result.text()
    assert listing(home / ".npm" / "_cacache") == before
