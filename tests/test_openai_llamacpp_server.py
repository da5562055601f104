"""The OpenAI-compatible backend against a real peer: llama_cpp.server serving the SmolLM2 GGUF."""

import os
import socket
import subprocess
import sys
import threading

import pytest

from ollie import backends
from ollie.backends.local import default_model_path
from ollie.types import Done, GenerationParams, Message, TextDelta, UsageChunk

ALIAS = "smollm2"
N_CTX = 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _watch_log(proc: subprocess.Popen, marker: bytes) -> tuple[threading.Event, list[bytes]]:
    """Drain the server's log for its whole life (a full pipe would block it); the event is
    set when `marker` shows up or the server exits."""
    seen, log = threading.Event(), []

    def read() -> None:
        for line in proc.stderr:
            log.append(line)
            if marker in line:
                seen.set()
        seen.set()

    threading.Thread(target=read, daemon=True).start()
    return seen, log


@pytest.fixture(scope="module")
def server_url():
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(default_model_path()),
            "--model_alias",
            ALIAS,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(N_CTX),
            "--n_threads",
            str(os.cpu_count()),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        seen, log = _watch_log(proc, b"Uvicorn running on")
        if not seen.wait(60) or proc.poll() is not None:
            raise RuntimeError(f"llama_cpp.server did not start:\n{b''.join(log).decode(errors='replace')[-2000:]}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_streams_a_chat_from_llama_cpp_server(server_url):
    backend = backends.create("llamacpp", model=ALIAS, base_url=server_url)
    chunks = [
        c
        async for c in backend.stream(
            [Message("system", "You are brief."), Message("user", "Say hi.")],
            [],
            GenerationParams(temperature=0, max_tokens=24),
        )
    ]
    await backend.aclose()
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)).strip()
    assert isinstance(chunks[-1], Done) and chunks[-1].stop_reason in ("stop", "length")
    usages = [c.usage for c in chunks if isinstance(c, UsageChunk)]
    if usages:  # the server reports usage in the stream only in some versions
        assert usages[-1].input_tokens > 0 and 0 < usages[-1].output_tokens <= 24


async def test_lists_the_served_model(server_url):
    backend = backends.create("llamacpp", base_url=server_url)
    assert ALIAS in await backend.models()
    await backend.aclose()


async def test_a_prompt_beyond_the_window_ends_the_stream_without_done(server_url):
    # llama_cpp.server answers 200 and then closes an empty stream; the backend must not make up a
    # Done, so the Core sees a dropped stream rather than an empty answer.
    backend = backends.create("llamacpp", model=ALIAS, base_url=server_url)
    chunks = [
        c async for c in backend.stream([Message("user", "apple " * (N_CTX * 2))], [], GenerationParams(max_tokens=8))
    ]
    await backend.aclose()
    assert not any(isinstance(c, Done) for c in chunks)
