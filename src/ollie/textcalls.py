"""Recovering tool calls that a model wrote as text instead of as structured calls.

Three shapes are recognised: `<tool_call>{…}</tool_call>` tags (Hermes, Qwen), DeepSeek's DSML
markup, and a bare JSON object `{"name": …, "arguments": {…}}` (also fenced in ```json, or in the
OpenAI `{"type": "function", "function": {…}}` shape). A call is recovered only when it names a
known tool, and a bare JSON object only when it has nothing but call keys, so prose that mentions
a tool, or JSON that merely contains a "name", is left alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from typing import Any

from .types import ToolCall

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)

# DSML uses the fullwidth bar "｜"; some hosts turn it into "|".
_BAR = r"\s*[｜|]\s*"
_DSML_BLOCK = re.compile(
    rf"<{_BAR}DSML{_BAR}(function_calls|tool_calls)>(.*?)(?:</{_BAR}DSML{_BAR}\1>|\Z)", re.S
)
_DSML_INVOKE = re.compile(rf'<{_BAR}DSML{_BAR}invoke\s+name="([^"]+)"\s*>(.*?)</{_BAR}DSML{_BAR}invoke>', re.S)
_DSML_PARAM = re.compile(
    rf'<{_BAR}DSML{_BAR}parameter\s+name="([^"]+)"(?:\s+string="(true|false)")?\s*>(.*?)</{_BAR}DSML{_BAR}parameter>',
    re.S,
)

_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)
_CALL_KEYS = {"name", "arguments", "parameters", "id", "type"}


def recover_tool_calls(text: str, known_tool_names: Collection[str], position: int = 0) -> tuple[str, list[ToolCall]]:
    """(the text without the recovered calls, the calls). Returns the text unchanged and no
    calls when nothing in it is a call to a known tool. `position` (the answer's place in the
    history) goes into the ids: providers reject a history where two calls share one."""
    known = set(known_tool_names)
    if not known or not text:
        return text, []
    for recover in (_recover_tagged, _recover_dsml, _recover_json):
        remaining, found = recover(text, known)
        if found:
            calls = [ToolCall(stable_call_id(position, i, name, args), name, args)
                     for i, (name, args) in enumerate(found)]
            return remaining.strip(), calls
    return text, []


def stable_call_id(*parts: object) -> str:
    """An id for a call that came without one, derived from what identifies it (its position,
    name and arguments), so the same call always gets the same id."""
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:16]
    return f"call_{digest}"


def _recover_tagged(text: str, known: set[str]) -> tuple[str, list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []

    def take(m: re.Match[str]) -> str:
        call = _call_from_json(m.group(1), known)
        if call is None:
            return m.group(0)
        calls.append(call)
        return ""

    remaining = _TAGGED.sub(take, text)
    return remaining, calls


def _recover_dsml(text: str, known: set[str]) -> tuple[str, list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []

    def take(block: re.Match[str]) -> str:
        found = []
        for invoke in _DSML_INVOKE.finditer(block.group(2)):
            name = invoke.group(1)
            if name not in known:
                return block.group(0)
            args = {p.group(1): _dsml_value(p.group(3), p.group(2)) for p in _DSML_PARAM.finditer(invoke.group(2))}
            found.append((name, json.dumps(args, ensure_ascii=False)))
        calls.extend(found)
        return "" if found else block.group(0)

    remaining = _DSML_BLOCK.sub(take, text)
    return remaining, calls


def _dsml_value(raw: str, string: str | None) -> Any:
    """string="true" keeps the text; "false" is JSON; no attribute: JSON if it parses."""
    if string == "true":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _recover_json(text: str, known: set[str]) -> tuple[str, list[tuple[str, str]]]:
    """The whole text, or fenced blocks, or objects standing on their own in the text."""
    for m in _FENCE.finditer(text):
        call = _call_from_json(m.group(1), known)
        if call:
            return text[: m.start()] + text[m.end() :], [call]
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        call = _call_from_obj(obj, known)
        if call:
            return text[:start] + text[end:], [call]
        start = text.find("{", end)
    return text, []


def _call_from_json(raw: str, known: set[str]) -> tuple[str, str] | None:
    try:
        return _call_from_obj(json.loads(raw), known)
    except ValueError:
        return None


def _call_from_obj(obj: Any, known: set[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) when `obj` is a call to a known tool and nothing else."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and set(obj) <= {"type", "id", "function"}:
        obj = obj["function"]
    if not set(obj) <= _CALL_KEYS or obj.get("name") not in known:
        return None
    if "arguments" not in obj and "parameters" not in obj:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):  # OpenAI style: arguments already JSON text
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)
