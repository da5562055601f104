"""Tool-call arguments read safely, and tool calls that a model wrote as text instead of as
structured calls recovered.

Arguments are JSON text written by a model: `parse_arguments` turns them into the object tools
take, or says what is wrong with them (not JSON, nested too deep, not an object) in words the model
can act on; `arguments_text` writes arguments that an API sent already parsed.

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

from .types import ToolCall, valid_text, valid_value

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)

# DSML uses the fullwidth bar "｜"; some hosts turn it into "|".
_BAR = r"\s*[｜|]\s*"
_DSML_BLOCK = re.compile(rf"<{_BAR}DSML{_BAR}(function_calls|tool_calls)>(.*?)(?:</{_BAR}DSML{_BAR}\1>|\Z)", re.S)
_DSML_INVOKE = re.compile(rf'<{_BAR}DSML{_BAR}invoke\s+name="([^"]+)"\s*>(.*?)</{_BAR}DSML{_BAR}invoke>', re.S)
_DSML_PARAM = re.compile(
    rf'<{_BAR}DSML{_BAR}parameter\s+name="([^"]+)"(?:\s+string="(true|false)")?\s*>(.*?)</{_BAR}DSML{_BAR}parameter>',
    re.S,
)

_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)
_CALL_KEYS = {"name", "arguments", "parameters", "id", "type"}


# Levels of nesting in a call's arguments. No tool needs more, and deeper values exhaust the
# recursion of the JSON encoders they pass through (ours, the SDKs', the servers') on every request.
MAX_DEPTH = 64
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_JSON_TYPES = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


class BadArguments(ValueError):
    """Arguments no tool can take; the message completes "arguments for TOOL ..."."""


def parse_arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the object tools take ({} for none), its strings valid Unicode."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadArguments(f"are not valid JSON: {e.msg} at position {e.pos}") from None
    except RecursionError:
        raise BadArguments(f"are nested more than {MAX_DEPTH} levels deep") from None
    if not isinstance(value, dict):
        raise BadArguments(f"must be a JSON object, not {_JSON_TYPES[type(value)]}")
    if _too_deep(value):
        raise BadArguments(f"are nested more than {MAX_DEPTH} levels deep")
    # A "\ud800" escape decodes to a lone surrogate, which no tool or provider can take.
    return valid_value(value) if _SURROGATE_ESCAPE.search(text) else value


def arguments_text(value: Any) -> str:
    """Arguments that an API sent parsed, as JSON text. Containers nested deeper than MAX_DEPTH
    are cut (shown as "…"): encoding them whole could exhaust the recursion, and the text, still
    too deep, gets the call its error result. Values JSON has no type for are written as text."""
    return valid_text(json.dumps(_cut(value, MAX_DEPTH + 1), ensure_ascii=False, default=str))


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:  # not recursive: the value may be as deep as the JSON decoder goes
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _cut(value: Any, levels: int) -> Any:
    if isinstance(value, (dict, list, tuple)) and levels == 0:
        return "…"
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _cut(v, levels - 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cut(v, levels - 1) for v in value]
    return value


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
            calls = [
                ToolCall(stable_call_id(position, i, name, args), name, args) for i, (name, args) in enumerate(found)
            ]
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
            found.append((name, arguments_text(args)))
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
    except (ValueError, RecursionError):
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
        except RecursionError:  # no call is nested that deep; and trying each inner "{" would take long
            break
        call = _call_from_obj(obj, known)
        if call:
            return text[:start] + text[end:], [call]
        start = text.find("{", end)
    return text, []


def _call_from_json(raw: str, known: set[str]) -> tuple[str, str] | None:
    try:
        return _call_from_obj(json.loads(raw), known)
    except (ValueError, RecursionError):
        return None


def _call_from_obj(obj: Any, known: set[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) when `obj` is a call to a known tool and nothing else."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and set(obj) <= {"type", "id", "function"}:
        obj = obj["function"]
    name = obj.get("name")
    if not set(obj) <= _CALL_KEYS or not isinstance(name, str) or name not in known:
        return None
    if "arguments" not in obj and "parameters" not in obj:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):  # OpenAI style: arguments already JSON text
        try:
            args = parse_arguments(args)
        except BadArguments:
            return None
    if not isinstance(args, dict):
        return None
    return name, arguments_text(args)
