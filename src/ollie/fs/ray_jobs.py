"""The Ray executor (`OLLIE_BATCH_EXECUTOR=ray`): each job of `b/` runs as one Ray task, a headless
session on whichever worker Ray picks, and streams its log back to the server.

The server (the Ray driver) keeps everything `b/` shows: it appends the streamed log to the job's
`chat`, and takes usage, cost and the outcome from the stream. Nothing of a job's spec but its
resolved settings (agent, backend, model, cwd) and its prompt travels; API keys never do. A worker
reads keys from its own environment or its own ollie env file (`$OLLIE_CFG_PATH/env`); of the
server's environment, only the settings in `WORKER_ENV` (paths, backend, model, servers' URLs, none
of them a secret) ride in the task's runtime environment, URLs without their `user:password@`, so
a worker on a shared filesystem sees the same agents.

`ray` is imported only here, and this module only when the executor is `ray`. A task is never
retried (a job's side effects must not happen twice behind the user's back); a worker that dies
fails its job. Cancelling the job (`rm -r b/<id>`, the parent's interrupt, the server's stop)
cancels the task: Ray interrupts the worker's wait, and the session closes its sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as E
import logging
import os
import queue
import re
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from .. import config, sandbox, telemetry
from ..agent.opening import open_session
from ..chatfmt import marked, visible
from ..threads import in_own_thread
from ..types import ConfigError, Cost, OllieError, Usage
from ..vfs.namespace import FsError
from .job import Job, Spec, live_parent, outcome, session_settings

if TYPE_CHECKING:
    from .sessions import Session, Sessions

log = logging.getLogger("ollie.fs.ray_jobs")

CONNECT_TIMEOUT = 5.0  # seconds to reach the cluster's address before saying it cannot be reached
INIT_TIMEOUT = 60.0  # seconds for ray.init once the address answers
CANCEL_LATENCY = 0.2  # seconds a cancelled task may take to notice
# What a worker's session reads that the server's settings decide: listed, so that a credential
# under a name nobody foresaw (`OLLIE_PROXY_AUTH`) stays home. Keys, tokens (`OLLIE_9P_TOKEN`, the
# cluster's) and the server's own settings (`OLLIE_JOBS`, `OLLIE_SUBAGENT_DEPTH`, …) are not here.
URL_ENV = (
    "OLLIE_OPENAI_URL",
    "OPENAI_BASE_URL",
    "OLLIE_ANTHROPIC_URL",
    "ANTHROPIC_BASE_URL",
    "OLLIE_OLLAMA_URL",
    "OLLAMA_HOST",
    "OLLIE_LLAMACPP_URL",
    "OLLIE_VLLM_URL",
    "OLLIE_LMSTUDIO_URL",
)
WORKER_ENV = (
    "OLLIE_CFG_PATH",
    "OLLIE_DATA_PATH",
    "OLLIE_TMP_PATH",
    "OLLIE_AGENTS_PATH",
    "OLLIE_SKILLS_PATH",
    "OLLIE_TOOLS_PATH",
    "OLLIE_BACKEND",
    "OLLIE_MODEL",
    "OLLIE_LOCAL_MODEL",
    "OLLIE_LOCAL_CTX",
    "OLLIE_LOCAL_TOOL_CHOICE",
    "OLLIE_MAX_SESSION_COST",
    "OLLIE_ALLOW_UNPRICED",
    *URL_ENV,
    # Where a worker's traces go (docs/tracing.md); OTEL_EXPORTER_OTLP_HEADERS, which carries a
    # vendor's key, stays home: a worker sets its own.
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
)
# A URL's `user:password@` (an OLLAMA_HOST may be a bare `host:port`, so in the URL variables the
# scheme is optional; elsewhere only a `scheme://` value is a URL, and `model@rev` is no password).
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^/?#]*@")


def forwarded_env(environ: dict[str, str]) -> dict[str, str]:
    """The server's settings a worker gets with each task: those of WORKER_ENV that are set, any
    credentials in a URL's `user:password@` dropped."""
    return {name: _without_credentials(name, environ[name]) for name in WORKER_ENV if name in environ}


def _without_credentials(name: str, value: str) -> str:
    m = _USERINFO.match(value)
    if m is None or not (m[1] or name in URL_ENV):
        return value
    return (m[1] or "") + value[m.end() :]


@dataclass
class Task:
    """What a job's task carries to its worker."""

    job_id: str
    settings: dict[str, str]  # agent, backend, model (as given, "" = default), cwd (absolute)
    prompt: str  # as the model gets it (with the JSON instruction for output=json)
    output: str  # "" or "json"
    # A session's code asked for it: its parent's cwd, where its own must lie (its agent must run
    # nothing outside the sandbox); "" for a job of the user's
    cwd_within: str
    # Traces: the W3C trace context (traceparent) of the parent's tool call that started the job,
    # which the job's turns are children of; {} when the server does not trace
    trace: dict[str, str] = field(default_factory=dict)


def check_address(address: str) -> None:
    """A `host:port` cluster address must answer on TCP before ray.init is let wait on it."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"RAY_ADDRESS={address!r}: give the head node as host:port (or 'auto')")
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT).close()
    except OSError as e:
        raise OllieError(f"the Ray cluster at {address} cannot be reached: {e.strerror or e}") from None


class RayExecutor:
    """Runs jobs as Ray tasks. `address` is RAY_ADDRESS's value: `host:port` of a running cluster's
    head, `auto` (the cluster this machine runs), or "" (Ray's own choice: a running local cluster,
    else a new one in this process, stopped with the server)."""

    slots = 10_000  # jobs handed to the cluster at once, unless OLLIE_JOBS says: its scheduler queues them

    def __init__(self, sessions: Sessions, address: str | None = None):
        self.sessions = sessions
        self.address = os.environ.get("RAY_ADDRESS", "") if address is None else address
        self._ray: Any = None
        self._remote: Any = None
        self._lock = asyncio.Lock()
        self._joining: asyncio.Future[None] | None = None  # ray.init under way, in a thread of its own

    def check(self, spec: Spec, settings: dict[str, str], parent: Session | None, job_id: str) -> None:
        """The session's spec, its cwd not looked at here (a worker checks it where the job runs);
        worktree=1 refused: a worker's node has no checkout of this repository to make a worktree
        of, and the worktree must lie in the parent's cwd on this machine."""
        self.sessions.check_spec(settings, cwd_here=False)
        if spec.worktree:
            raise FsError(
                E.EINVAL,
                "worktree=1: not with OLLIE_BATCH_EXECUTOR=ray (a job runs on another node, where this "
                "repository's worktree is not); run it on a server with the local executor, or without worktree=1",
            )

    async def ready(self) -> None:
        """Connect on first use; a cluster that cannot be reached is an OllieError naming it."""
        async with self._lock:
            if self._ray is not None:
                return
            if self.address and self.address != "auto":
                await asyncio.to_thread(check_address, self.address)
            try:
                import ray
            except ImportError:
                raise ConfigError("OLLIE_BATCH_EXECUTOR=ray needs Ray: pip install 'ollie-agents[ray]'") from None
            if self._joining is None or self._joining.done():
                # In a thread of its own: one that outlasts INIT_TIMEOUT (an address that accepts
                # and never answers: Ray's client waits a minute and more) is waited for again by
                # the next job, and holds none of the loop's pool, which every session's work needs.
                self._joining = in_own_thread(lambda: self._init(ray), "ollie-ray-init")
                self._joining.add_done_callback(_heard)  # its failure, once no one waits, is the next try's
            try:
                await asyncio.wait_for(asyncio.shield(self._joining), INIT_TIMEOUT)
            except TimeoutError:
                raise OllieError(f"the Ray cluster at {self._where} did not answer in {INIT_TIMEOUT:.0f} s") from None
            except Exception as e:  # ray.init raises ConnectionError, RuntimeError, ValueError …
                raise OllieError(f"the Ray cluster at {self._where} cannot be joined: {e}") from None
            self._ray = ray
            self._remote = ray.remote(run_task).options(
                num_returns="streaming",
                max_retries=0,
                num_cpus=1,
                runtime_env={"env_vars": forwarded_env(config.own_environ())},
            )

    @property
    def _where(self) -> str:
        return self.address or "auto"

    def _init(self, ray: Any) -> None:
        ray.init(
            address=self.address or None,
            ignore_reinit_error=True,
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=False,
            include_dashboard=False,
        )

    async def run(self, job: Job, parent: Session | None) -> tuple[str, str]:
        """The job as a task of the cluster: its log, usage and cost stream into its record."""
        settings = session_settings(self.sessions, job.spec, parent)
        settings["cwd"] = os.path.abspath(self.sessions.cwd_of(settings))
        within = parent.settings()["cwd"] if parent is not None else ""
        started_by = parent.core.trace_context() if parent is not None and parent.core is not None else None
        task = Task(job.id, settings, job.prompt, job.spec.output, within, telemetry.inject(started_by))
        job.log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(job.log_path, "ab") as log_file:
            done = await self._stream(task, job, log_file)
        if (alive := live_parent(self.sessions, parent)) is not None:
            self.sessions.add_to_parent(alive, job.usage(), job.record.cost)
        return done["status"], done.get("result", "")

    async def _stream(self, task: Task, job: Job, log_file: BinaryIO) -> dict[str, Any]:
        """Run the task to its end, taking in what it streams; returns its outcome (status, result)."""
        await self.ready()
        stream = self._remote.remote(asdict(task))
        try:
            async for ref in stream:
                item = await ref
                if "started" in item:
                    job.set("running")
                if item.get("log"):
                    log_file.write(item["log"])
                    log_file.flush()
                if "usage" in item:
                    job.spent(item["usage"], Cost(**item["cost"]), item["model"])
                if "status" in item:
                    return item
            return {"status": "failed: its Ray task ended without an outcome", "result": ""}
        except asyncio.CancelledError:
            self._ray.cancel(stream)
            raise
        except self._ray.exceptions.RayError as e:
            return {"status": f"failed: {ray_failure(e)}", "result": str(e)}

    async def close(self) -> None:
        if self._ray is not None:
            await asyncio.to_thread(self._ray.shutdown)
            self._ray = None


def _heard(future: asyncio.Future[None]) -> None:
    """Take a future's outcome, so that a failure no one awaited is not logged as lost."""
    if not future.cancelled():
        future.exception()


def ray_failure(error: Exception) -> str:
    """A Ray error as one line a job's status can carry."""
    name = type(error).__name__
    if "WorkerCrashed" in name:
        return "its Ray worker died while running it"
    if "NodeDied" in name:
        return "the Ray node running it died"
    if "TaskCancelled" in name:
        return "its Ray task was cancelled"
    first = str(error).strip().splitlines()
    return f"{name}: {first[0] if first else 'no detail'}"


# ---- on the worker ---------------------------------------------------------------------------------


def run_task(task: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Ray task: a headless session on its own event loop, in a thread, while this generator
    hands Ray what it streams. Ray's cancel interrupts the wait here; the session is then asked to
    stop, as an interrupt would, and closes (its sandbox with it) before the task ends. It is
    asked, not cancelled: a cancel landing inside its close would leave the sandbox running."""
    items: queue.Queue[dict[str, Any] | None] = queue.Queue()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    job = loop.create_task(_work(Task(**task), items.put, stop))

    def drive() -> None:
        while not job.done():
            try:
                loop.run_until_complete(job)
            except BaseException:  # its outcome went to `items`; an interrupt is the caller's
                pass
        items.put(None)

    thread = threading.Thread(target=drive, name="ollie-job", daemon=True)
    thread.start()
    try:
        while (item := _next(items)) is not None:
            yield item
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join()
        loop.close()


def _next(items: queue.Queue[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The next item. Ray delivers a cancel as an exception raised when this thread next runs
    Python code, which a plain blocking get would not until the job's next item: so wake often."""
    while True:
        try:
            return items.get(timeout=CANCEL_LATENCY)
        except queue.Empty:
            continue


async def _work(task: Task, send: Callable[[dict[str, Any]], None], stop: asyncio.Event) -> None:
    node = _node()
    send({"started": True, "log": f":: running on Ray node {node}, worker pid {os.getpid()}\n".encode()})
    core = None
    try:
        config.load_env_file()
        _check(task, node)
        with tempfile.TemporaryDirectory(prefix="ollie-job-") as root:
            changed = asyncio.Event()
            errors: list[str] = []

            def on_event(ev: Any) -> None:
                changed.set()
                if ev.kind == "error":
                    errors.append(ev.text)

            async with open_session(
                agent=task.settings.get("agent") or None,
                cwd=task.settings["cwd"],
                backend=task.settings.get("backend") or None,
                model=task.settings.get("model") or None,
                session_id=task.job_id,
                create=True,
                store_root=Path(root),
                on_event=on_event,
                cwd_within=task.cwd_within or None,
            ) as core:
                parent = telemetry.extract(task.trace)  # its turns: children of the call that started it
                core.trace_under(lambda: parent)
                with open(Path(root) / task.job_id / "chat", "rb") as chat:
                    await _follow(core, task, chat, changed, errors, send, stop)
    except (OllieError, OSError) as e:
        send(_failed(core, str(e)))
    except Exception as e:  # a bug: the job fails saying so, the worker lives on
        log.exception("job %s failed", task.job_id)
        send(_failed(core, f"{type(e).__name__}: {e}"))
    finally:
        telemetry.flush()  # the worker lives on: its spans leave with the job's end


def _check(task: Task, node: str) -> None:
    """What the server checked, checked again where the job runs (OllieError)."""
    cwd = task.settings["cwd"]
    if not os.path.isdir(cwd):
        raise OllieError(f"cwd {cwd!r} does not exist on Ray node {node}: run jobs where every node shares it")
    if not task.cwd_within:
        return
    try:  # resolved as the server did, beneath the parent's cwd by descriptor: it must still be that path
        real = sandbox.directory_within(cwd, task.cwd_within)
    except sandbox.SandboxError as e:
        raise OllieError(f"cwd {cwd!r} leads elsewhere on Ray node {node} ({e}): refused") from None
    if real != cwd:
        raise OllieError(f"cwd {cwd!r} leads elsewhere on Ray node {node} ({real}): refused")
    agent = task.settings.get("agent")
    if agent and (outside := config.starts_outside_sandbox(config.load_agent(agent))):
        raise OllieError(f"agent {agent!r} runs {'; '.join(outside)} outside the sandbox")


async def _follow(
    core: Any,
    task: Task,
    chat: Any,
    changed: asyncio.Event,
    errors: list[str],
    send: Callable[[dict[str, Any]], None],
    stop: asyncio.Event,
) -> None:
    """Run the turn, sending what the chat log gained at each event; then the outcome. Asked to
    stop, it interrupts the turn and sends nothing more (nobody reads on)."""
    turn = asyncio.ensure_future(core.submit(task.prompt))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while not turn.done():
            waiter = asyncio.ensure_future(changed.wait())
            await asyncio.wait({turn, waiter, stopped}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            changed.clear()
            if stopped.done():
                core.interrupt()
                await asyncio.wait({turn})
                return
            send(_progress(core, chat.read()))
    finally:
        stopped.cancel()
    with contextlib.suppress(OllieError):  # what ended the turn is among the error events
        turn.result()
    status, result = outcome(core.reply, errors, task.output)
    send({**_progress(core, chat.read()), "status": status, "result": result})


def _failed(core: Any, message: str) -> dict[str, Any]:
    return {
        **(_progress(core, b"") if core is not None else {}),
        "log": (visible(marked(":: ", f"error: {message}")) + "\n").encode(),  # whatever the message holds
        "status": f"failed: {message.splitlines()[0] if message else 'no reason given'}",
        "result": message,
    }


def _progress(core: Any, log_bytes: bytes) -> dict[str, Any]:
    cost: Cost = core.cost()
    usage: Usage = core.usage()
    return {
        "log": log_bytes,
        "usage": asdict(usage),
        "cost": asdict(cost),
        "model": core.backend.model,
    }


def _node() -> str:
    """The worker's machine, by the name people know it by (Ray's node IP is its route out)."""
    return socket.gethostname()
