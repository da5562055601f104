"""Provider presets on the OpenAI-compatible backend, against a local Chat Completions server."""

import pytest

from ollie import backends
from ollie.cost import cost_of
from ollie.types import ConfigError, GenerationParams, Message, ToolSpec, UsageChunk
from wire import WireServer, sse, stream_reply
from wire.openai import PATH, chunk, text_stream, usage

TOOLS = [ToolSpec("a", "A", {"type": "object"}), ToolSpec("b", "B", {"type": "object"})]
KEY_VARS = (
    "OLLIE_OPENROUTER_KEY",
    "OPENROUTER_API_KEY",
    "OLLIE_COPILOT_TOKEN",
    "OLLIE_MODEL",
    "OLLIE_LLAMACPP_URL",
    "OLLIE_VLLM_URL",
    "OLLIE_LMSTUDIO_URL",
    "OLLIE_VLLM_KEY",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in KEY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def server():
    with WireServer() as s:
        yield s


async def run(backend, messages, tools=()):
    try:
        return [c async for c in backend.stream(messages, list(tools), GenerationParams())]
    finally:
        await backend.aclose()


async def test_openrouter_asks_for_cost_and_reports_it(server, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "or-key")
    server.reply(
        PATH,
        stream_reply(
            sse(
                [
                    (None, chunk({"content": "hi"})),
                    (None, chunk({}, "stop")),
                    (None, chunk(usage=usage(100, 20, cost=0.00042))),
                    (None, "[DONE]"),
                ]
            )
        ),
    )
    backend = backends.create("openrouter", model="openai/gpt-4o", base_url=server.url + "/v1")
    chunks = await run(backend, [Message("system", "sys"), Message("user", "hi")], TOOLS)

    [u] = [c.usage for c in chunks if isinstance(c, UsageChunk)]
    assert cost_of("openai/gpt-4o", u) == (0.00042, True)
    req = server.requests[0]
    assert req.headers["authorization"] == "Bearer or-key" and req.headers["x-title"] == "ollie"
    body = req.json
    assert body["usage"] == {"include": True}
    assert body["messages"][0] == {"role": "system", "content": "sys"}  # no cache marks for non-Claude
    assert all("cache_control" not in t for t in body["tools"])


async def test_openrouter_marks_system_and_last_tool_for_claude(server, monkeypatch):
    monkeypatch.setenv("OLLIE_OPENROUTER_KEY", "k")
    server.reply(PATH, text_stream("ok"))
    backend = backends.create("openrouter", model="anthropic/claude-sonnet-4.5", base_url=server.url + "/v1")
    await run(backend, [Message("system", "be brief"), Message("user", "hi")], TOOLS)
    body = server.requests[0].json
    assert body["messages"][0] == {
        "role": "system",
        "content": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    }
    assert body["messages"][1] == {"role": "user", "content": "hi"}
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == {"type": "ephemeral"}


def test_openrouter_defaults_and_missing_key():
    with pytest.raises(ConfigError, match="OLLIE_OPENROUTER_KEY or OPENROUTER_API_KEY"):
        backends.create("openrouter")
    backend = backends.create("openrouter", api_key="k")
    assert backend.base_url == "https://openrouter.ai/api/v1" and backend.name == "openrouter"


async def test_copilot_sends_its_token_and_editor_headers(server, monkeypatch):
    monkeypatch.setenv("OLLIE_COPILOT_TOKEN", "gho-token")
    server.reply("/chat/completions", text_stream("ok"))
    await run(backends.create("copilot", base_url=server.url), [Message("user", "hi")])
    req = server.requests[0]
    assert req.headers["authorization"] == "Bearer gho-token"
    assert req.headers["copilot-integration-id"] == "vscode-chat"
    assert req.headers["editor-version"].startswith("vscode/")
    assert req.json["model"] == "gpt-4o"


def test_copilot_without_token_names_the_variable():
    with pytest.raises(ConfigError, match="OLLIE_COPILOT_TOKEN"):
        backends.create("copilot")
    assert backends.create("copilot", api_key="t").base_url == "https://api.githubcopilot.com"


@pytest.mark.parametrize("name, port", [("llamacpp", 8080), ("vllm", 8000), ("lmstudio", 1234)])
def test_local_servers_default_to_their_ports_without_a_key(name, port):
    backend = backends.create(name)
    assert backend.base_url == f"http://127.0.0.1:{port}/v1" and backend.name == name


async def test_local_server_url_and_key_from_env(server, monkeypatch):
    monkeypatch.setenv("OLLIE_VLLM_URL", server.url)
    monkeypatch.setenv("OLLIE_VLLM_KEY", "vllm-secret")
    server.reply(PATH, text_stream("ok"))
    await run(backends.create("vllm", model="Qwen/Qwen3-8B"), [Message("user", "hi")])
    req = server.requests[0]
    assert req.headers["authorization"] == "Bearer vllm-secret" and req.json["model"] == "Qwen/Qwen3-8B"


def test_every_preset_is_registered():
    assert {"anthropic", "ollama", "local", "openrouter", "copilot", "llamacpp", "vllm", "lmstudio"} <= set(
        backends.names()
    )
