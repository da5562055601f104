"""Ollama's native API wire format: /api/chat NDJSON lines, /api/show and /api/tags bodies."""

from __future__ import annotations

from typing import Any

from . import Reply, json_reply, ndjson, stream_reply

CHAT = "/api/chat"
SHOW = "/api/show"
TAGS = "/api/tags"
CREATED = "2025-01-01T00:00:00.000000Z"


def chat_line(model: str = "llama3.2", **message: Any) -> dict[str, Any]:
    """One streamed line; `message` fields: content, thinking, tool_calls."""
    return {
        "model": model,
        "created_at": CREATED,
        "message": {"role": "assistant", "content": "", **message},
        "done": False,
    }


def done_line(model: str = "llama3.2", reason: str = "stop", prompt: int = 26, output: int = 12) -> dict[str, Any]:
    return {
        "model": model,
        "created_at": CREATED,
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": reason,
        "total_duration": 1000,
        "load_duration": 10,
        "prompt_eval_count": prompt,
        "prompt_eval_duration": 100,
        "eval_count": output,
        "eval_duration": 800,
    }


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"function": {"name": name, "arguments": arguments}}


def chat(lines: list[dict[str, Any]], **kw: Any) -> Reply:
    return stream_reply(ndjson(lines), content_type="application/x-ndjson", **kw)


def show(context_length: int | None, arch: str = "llama") -> Reply:
    info: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": 3212749888}
    if context_length is not None:
        info[f"{arch}.context_length"] = context_length
    return json_reply(
        {
            "modelfile": "FROM x",
            "parameters": "",
            "template": "{{ .Prompt }}",
            "details": {"format": "gguf", "family": arch},
            "model_info": info,
            "capabilities": ["completion", "tools"],
        }
    )


def tags(names: list[str]) -> Reply:
    return json_reply(
        {
            "models": [
                {
                    "name": n,
                    "model": n,
                    "modified_at": CREATED,
                    "size": 1,
                    "digest": "0" * 64,
                    "details": {"format": "gguf"},
                }
                for n in names
            ]
        }
    )


def error(status: int, message: str) -> Reply:
    return json_reply({"error": message}, status)
