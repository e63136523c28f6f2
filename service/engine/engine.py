"""The protocol-neutral core: every rule of a request, whatever wire format it came in.

Protocols (``service/protocols/<name>/``) turn bytes into an
:class:`~service.engine.types.EncodeRequest` and call :meth:`Engine.encode`;
the engine resolves the model, admits, tokenizes and embeds texts, checks
every limit, submits to the batcher (dropping the work if the caller goes
away), selects and reduces attention, pools and normalises, counts metrics,
and hands back numpy arrays. It never sees JSON or HTTP; only the batcher
below it talks to the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from model_export.manifest import ManifestError, graph_io
from service import repository
from service.batcher import Batcher, RunTiming, SequenceResult
from service.engine import limits, postprocess, sparse
from service.engine.admission import Admission, Ticket
from service.engine.response_cache import ResponseCache, allowed_bytes, request_key
from service.engine.scope import Caller, Disconnected, RequestScope
from service.engine.types import (
    ArrayInput,
    DecodeRequest,
    DecodeResult,
    EncodeRequest,
    EncodeResult,
    InputItem,
    Pooling,
    SequenceOutput,
    SpannedText,
    SparseRequest,
    SparseResult,
    TokenIds,
    TokenizedText,
    TokenizeRequest,
    TokenizeResult,
)
from service.errors import (
    ClientClosedRequest,
    DeadlineExceeded,
    InvalidInput,
    LoadFailed,
    ModelLoadError,
    ModelNotFound,
    NotReady,
    ShuttingDown,
    UnsupportedByModel,
    quoted,
)
from service.fair_queue import Flow
from service.metrics import Metrics
from service.model_info import ModelInfo
from service.repository import ModelVersion, latest, model_directories, versions
from service.runtime import ModelRuntime, load_repository, load_version
from service.settings import Settings
from service.tracing import Tracing

log = logging.getLogger(__name__)
T = TypeVar("T")
P = TypeVar("P")  # what one part of a large request yields, per sequence
W = TypeVar("W")  # what a protocol keeps from parsing to writing its answer

# Answers estimated larger than this are finished on a worker thread, so a big
# answer never stalls the event loop; small ones are cheaper inline.
OFFLOAD_BYTES = 256 * 1024
# A body whose parse the ticket holds at up to this (a JSON body of up to ~64 KiB:
# ~13 bytes per byte plus its values, see wire.JsonCost) is parsed on the event loop,
# and prepared there too when it holds only arrays: that takes well under the ~0.3 ms
# a round trip to a worker thread costs.
INLINE_HELD_BYTES = 64 * 1024 * 16
# Up to this many tokens, an embeddings request on an idle server is not watched for
# its client's disconnect (see Engine.run).
UNWATCHED_TOKENS = 256
# A request of more than ATTNSERVE_MAX_SEQUENCES (pooled vectors only) runs in parts of
# that many sequences, this many queued at once: the batcher always has the next part
# while one runs, and only their outputs are in memory, never the whole request's.
PARTS_IN_FLIGHT = 2
# What a BM42 request holds per token: its ids and types, its weight, its tokens and the
# words, stems and vector built from them (Python objects: generous).
SPARSE_BYTES_PER_TOKEN = 512
# Out-of-vocabulary token ids named in an error, at most.
SHOWN_IDS = 10


# A text's (tokens, ids, type ids), as the tokenizer gives them.
Tokenized = tuple[list[str], list[int], list[int]]
# Poll mode's view of a model directory: its versions (policy all) and highest export's stamp.
DiskMark = tuple[tuple[str, ...], tuple[str, int, int] | None]
# Resolved attention layers and heads, hidden-state layers, and the pooling.
ResolvedOptions = tuple[list[int], list[int], list[int], Pooling]


@dataclass(frozen=True)
class PreparedEncode:
    """A checked encode request: its sequences in the form its graph takes, and every
    resolved option."""

    request: EncodeRequest
    model: ModelInfo
    # float32 [n, d] input embeddings; int64 [n, 2] (token id, type) for the text graph
    sequences: list[np.ndarray]
    tokens: list[list[str] | None]  # the tokens of text items, None for the others
    layers: list[int]
    heads: list[int]
    hidden_layers: list[int]
    pooling: Pooling
    response_bytes: float
    work_bytes: int  # memory it holds from here to its answer (limits.work_bytes)
    by_token_ids: bool = False  # the sequences are token ids, for the text graph
    first_index: int = 0  # of its first sequence in the request (a part of a large one)
    # Late chunking: per sequence, the token indices of each of its spans (None: no spans)
    span_tokens: list[list[list[int]] | None] = dataclasses.field(default_factory=list)
    # The version it was prepared on: it runs there even if another is swapped in meanwhile.
    runtime: ModelRuntime | None = None

    @property
    def graph(self) -> str:
        """The lightest graph that has every output asked for."""
        if self.request.return_attention:
            return graph_io.GRAPH_ATTENTION
        if self.request.return_hidden_states:
            return graph_io.GRAPH_HIDDEN_STATES
        return graph_io.GRAPH_TEXT if self.by_token_ids else graph_io.GRAPH_EMBEDDINGS


def text_of(item: str | SpannedText) -> str:
    return item.text if isinstance(item, SpannedText) else item


class Engine:
    """Models, admission, limits, text front end, batching and post-processing."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.runtimes: dict[str, ModelRuntime] = {}  # the serving version of each model
        # Every loaded version by model and version (ATTNSERVE_VERSION_POLICY=all keeps
        # older ones beside the serving one; latest keeps that one only).
        self.versions: dict[str, dict[str, ModelRuntime]] = {}
        self.default_model = ""
        # Model control: why a model directory is not serving (index), one load or unload
        # at a time per model (others go on beside it), the memory their loads reserve,
        # what each loaded export was (poll mode reloads a changed one), and memory held.
        self.reasons: dict[str, str] = {}
        self._model_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # lock, its users
        self._reserved: dict[str, int] = {}
        # Set when shutdown's grace window ends: a load still hashing gives up (its caller
        # is answered 503 by end_work).
        self._stopping = threading.Event()
        self._loaded_from: dict[str, DiskMark] = {}
        self._model_bytes: dict[int, int] = {}  # id(runtime) -> estimate, while alive
        self._load_serial: dict[int, int] = {}  # id(runtime) -> its load's number, while alive
        self._serials = itertools.count()
        self.cache = ResponseCache(allowed_bytes(settings), metrics, self.off_loop)
        self.tracing = Tracing(settings.otlp_endpoint)
        self._poll: asyncio.Task[None] | None = None
        self._loading_now: set[str] = set()
        self.ready = False
        self.failure: str | None = None  # set when the process can never serve (fails liveness)
        self._batcher: Batcher | None = None
        self._warm_up: asyncio.Task[None] | None = None
        self.shutting_down = False
        self.closing = False  # the drain is over: no body may still arrive
        self._body_reads: set[asyncio.Timeout] = set()
        self.work_ended = False  # the grace window is over: what waits now answers 503
        self._work_waits: set[asyncio.Timeout] = set()
        self._codec_slots = asyncio.Semaphore(settings.max_concurrent_codecs)
        # Small requests' codec work has a lane of its own: a one-text request is never
        # tokenized after the megabyte bodies queued before it (see off_loop).
        self._small_codec_slot = asyncio.Semaphore(1)
        self.admission = Admission(
            settings.max_queued_requests, settings.max_inflight_bytes, metrics, self.retry_after
        )

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the models to serve from the start (every one, or in explicit mode the
        default and ATTNSERVE_LOAD_MODELS; ModelLoadError: refuse to start), then warm up
        in the background."""
        try:
            runtimes = await asyncio.to_thread(
                load_repository, self.settings, self._models_at_start()
            )
            for runtime in runtimes.values():
                self._hold(runtime)
                self.versions[runtime.info.name] = {runtime.info.version: runtime}
                if self.settings.version_policy == "all":
                    await self._load_older_versions(runtime)
        except ModelLoadError as exc:
            log.error("attnserve cannot start: %s", exc)
            raise
        self.runtimes = runtimes
        for model_dir in model_directories(self.settings.model_repository):
            if model_dir.name not in runtimes:
                self.reasons[model_dir.name] = "not loaded"
        self.default_model = self.settings.default_model or sorted(runtimes)[0]
        self._batcher = Batcher(runtimes, self.settings, self.metrics)
        await self._batcher.start()
        if self.settings.warmup:
            self._warm_up = asyncio.create_task(self._warm())
        else:
            self.ready = True
        if self.settings.model_control == "poll":
            self._poll = asyncio.create_task(self._poll_repository(), name="repository-poll")

    async def _load_older_versions(self, serving: ModelRuntime) -> None:
        """ATTNSERVE_VERSION_POLICY=all at start: every version below the serving one."""
        name = serving.info.name
        for older in versions(self.settings.model_repository / name)[:-1]:
            runtime = await asyncio.to_thread(load_version, older, self.settings)
            self._hold(runtime)
            self.versions[name][older.version] = runtime

    def _models_at_start(self) -> list[str] | None:
        """None: every model directory (control none or poll)."""
        settings = self.settings
        if settings.model_control != "explicit":
            return None
        listed = [n.strip() for n in settings.load_models.split(",") if n.strip()]
        if "*" in listed:
            return None
        default = settings.default_model
        if default is None:
            dirs = model_directories(settings.model_repository)
            default = dirs[0].name if dirs else ""
        return sorted({default, *listed})

    async def stop(self) -> None:
        self.ready = False
        if self._poll is not None:
            self._poll.cancel()
        if self._warm_up is not None:
            self._warm_up.cancel()
        if self._batcher is not None:
            await self._batcher.stop()
        self.tracing.shutdown()  # what is still buffered goes to the collector

    async def _warm(self) -> None:
        try:
            for loaded in self.versions.values():
                for runtime in loaded.values():
                    await asyncio.to_thread(runtime.warmup)
            if self._batcher is not None:
                await self._batcher.calibrate()
        except Exception as exc:
            log.exception("warm-up failed: the server will never be ready")
            # Fail liveness too, so an orchestrator restarts it instead of keeping a
            # process that answers health checks but can never serve.
            self.failure = f"warm-up failed: {exc}"
            return
        self.ready = True
        log.info("ready: %s (default %s)", ", ".join(self.runtimes), self.default_model)

    def check_live(self) -> None:
        """Liveness: 503 once the process can never serve (its warm-up failed)."""
        if self.failure is not None:
            raise NotReady(self.failure)

    def require_ready(self) -> Batcher:
        if self.shutting_down:
            raise ShuttingDown(
                "the server is shutting down: send this request to another replica",
                headers={"Retry-After": self.retry_after()},
            )
        if not self.ready or self._batcher is None:
            raise NotReady("models are loading or warming up", headers={"Retry-After": "1"})
        return self._batcher

    def check_ready(self) -> None:
        """Readiness: ready, not shutting down, serving a model (explicit or poll mode can
        unload them all: every inference would be 404), and able to take one more request
        now."""
        self.require_ready()
        if not self.runtimes:
            raise NotReady(
                "no model is loaded: every inference would be 404 (load one with POST "
                "/v2/repository/models/{name}/load)",
                headers={"Retry-After": "1"},
            )
        busy = self.admission.saturated()
        if busy is not None:
            raise NotReady(f"saturated: {busy}", headers={"Retry-After": self.retry_after()})

    def begin_shutdown(self) -> None:
        """SIGTERM: readiness and new work answer 503 from now on; accepted work goes on."""
        self.shutting_down = True
        log.info(
            "shutting down: refusing new work, answering %d requests in progress",
            self.admission.requests,
        )

    @contextlib.asynccontextmanager
    async def body_read(self) -> AsyncIterator[None]:
        """Bound a body read by ATTNSERVE_BODY_TIMEOUT (TimeoutError), or by the end of the
        drain, so a slow upload never holds the shutdown past its timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (0.0 if self.closing else self.settings.body_timeout)
        async with asyncio.timeout_at(deadline) as timeout:
            self._body_reads.add(timeout)
            try:
                yield
            finally:
                self._body_reads.discard(timeout)

    def end_body_reads(self) -> None:
        """The drain is over: bodies still arriving end now (their requests get 503)."""
        self.closing = True
        now = asyncio.get_running_loop().time()
        for timeout in self._body_reads:
            timeout.reschedule(now)

    def end_work(self) -> None:
        """Shutdown's grace window is over: requests still waiting for their runs (or a
        model load) are answered 503 shutting_down now, while the server can still send
        it (uvicorn would cut them with a plain 500); their queued runs are dropped."""
        self.work_ended = True
        self._stopping.set()
        now = asyncio.get_running_loop().time()
        for bound in self._work_waits:
            bound.reschedule(now)
        if self._work_waits:
            log.warning("grace window over: %d requests answered 503", len(self._work_waits))

    @contextlib.contextmanager
    def _until_work_ends(self, bound: asyncio.Timeout) -> Iterator[None]:
        """Let ``end_work`` expire ``bound`` (a timeout around what a request awaits)."""
        if self.work_ended:
            bound.reschedule(asyncio.get_running_loop().time())
        self._work_waits.add(bound)
        try:
            yield
        finally:
            self._work_waits.discard(bound)

    @staticmethod
    def _work_cut() -> ShuttingDown:
        return ShuttingDown(
            "the server is shutting down and this request did not finish within the "
            "shutdown's grace window: send it to another replica",
            headers={"Retry-After": "1"},
        )

    def retry_after(self) -> str:
        """Seconds for a refused client to wait: the measured drain time of the backlog."""
        return self._batcher.retry_after() if self._batcher is not None else "1"

    # -- models -----------------------------------------------------------------------------

    def models(self) -> list[ModelInfo]:
        if not self.runtimes and not self.reasons:
            raise NotReady("models are loading", headers={"Retry-After": "1"})
        return [rt.info for rt in self.runtimes.values()]

    def model(self, name: str | None, version: str | None = None) -> ModelInfo:
        return self._runtime(name, version).info

    def model_versions(self, name: str) -> list[str]:
        """The loaded versions of ``name``, lowest first."""
        return sorted(self.versions.get(name, {}), key=int)

    def _runtime(self, name: str | None, version: str | None = None) -> ModelRuntime:
        serving = self._serving(name)
        if version is None or version == serving.info.version:
            return serving
        loaded = self.versions.get(serving.info.name, {})
        if version not in loaded:
            raise ModelNotFound(
                f"model {serving.info.name!r} has no version {quoted(version)} loaded "
                f"(loaded: {', '.join(self.model_versions(serving.info.name))})",
                field=("model",),
            )
        return loaded[version]

    def _serving(self, name: str | None) -> ModelRuntime:
        if not self.runtimes and not self.reasons:
            raise NotReady("models are loading", headers={"Retry-After": "1"})
        key = self.default_model if name is None else name
        try:
            return self.runtimes[key]
        except KeyError:
            why = f" ({self.reasons[key]})" if key in self.reasons else ""
            raise ModelNotFound(
                f"{quoted(key)} is not served here{why} (available: "
                f"{', '.join(sorted(self.runtimes)) or 'none'})",
                field=("model",),
            ) from None

    # -- model control (ATTNSERVE_MODEL_CONTROL) ----------------------------------------------

    def _hold(self, runtime: ModelRuntime) -> None:
        """Count a loaded version's memory until the last reference to it goes (a swapped
        out version lives on while runs that started on it finish)."""
        key, name = id(runtime), runtime.info.name
        self._model_bytes[key] = runtime.info.estimated_bytes
        self._load_serial[key] = next(self._serials)
        self.metrics.model_versions.labels(name).inc()

        def freed() -> None:
            self._model_bytes.pop(key, None)
            self._load_serial.pop(key, None)
            self.metrics.model_versions.labels(name).dec()

        weakref.finalize(runtime, freed)

    def repository_index(self) -> list[dict[str, str]]:
        """Every model directory: its serving version and state, or why it is not serving."""
        entries = []
        for model_dir in model_directories(self.settings.model_repository):
            name = model_dir.name
            runtime = self.runtimes.get(name)
            if runtime is not None:  # every loaded version (policy all: older ones too)
                entries += [
                    {"name": name, "version": version, "state": "READY", "reason": ""}
                    for version in self.model_versions(name)
                ]
                continue
            found = latest(model_dir)
            entries.append(
                {
                    "name": name,
                    "version": found.version if found else "",
                    "state": "LOADING" if name in self._loading_now else "UNAVAILABLE",
                    "reason": self.reasons.get(name, "not loaded"),
                }
            )
        return entries

    async def load_model(self, name: str) -> ModelInfo:
        """Load ``name``'s highest version beside what serves, check it (manifest, hashes,
        warm-up, memory budget), then swap it in: new requests go to it, requests already
        prepared finish on the version they started on. A failure leaves serving as it
        was and says why (LoadFailed)."""
        self._check_control("load")
        self._model_dir(name)
        self._refuse_load_if_shutting_down()
        try:
            async with asyncio.timeout(None) as bound:
                with self._until_work_ends(bound):
                    async with self._model_lock(name):
                        self._refuse_load_if_shutting_down()  # it waited: start nothing now
                        return await self._locked_load(name)
        except TimeoutError:
            raise self._work_cut() from None
        except LoadFailed:
            if self.work_ended:  # its hashing gave up for the end of the grace window
                raise self._work_cut() from None
            raise

    def _refuse_load_if_shutting_down(self) -> None:
        """A load that has not started by SIGTERM never starts (one that has is answered,
        or cut with 503 at the end of the grace window, its hashing given up)."""
        if self.shutting_down:
            raise ShuttingDown(
                "the server is shutting down: load the model on another replica",
                headers={"Retry-After": self.retry_after()},
            )

    @contextlib.asynccontextmanager
    async def _model_lock(self, name: str) -> AsyncIterator[None]:
        """One load or unload of ``name`` at a time; other models' go on beside it."""
        lock, users = self._model_locks.get(name, (asyncio.Lock(), 0))
        self._model_locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._model_locks[name]
            if users == 1:
                del self._model_locks[name]
            else:
                self._model_locks[name] = (lock, users - 1)

    async def _locked_load(self, name: str) -> ModelInfo:
        self._loading_now.add(name)
        try:
            return await self._load(name)
        except OSError as exc:  # the directory changed under us: said without its path
            return self._load_failed(name, f"its directory cannot be read: {exc.strerror}")
        finally:
            self._loading_now.discard(name)
            self._reserved.pop(name, None)

    def _check_control(self, what: str) -> None:
        if self.settings.model_control == "none":
            raise LoadFailed(
                "models are fixed at start (ATTNSERVE_MODEL_CONTROL=none): set it to "
                f"explicit or poll to {what} models while serving"
            )

    def _held_bytes(self, besides: str) -> int:
        """Model memory held by loaded versions and reserved by loads in progress,
        ``besides``'s own reservation left out."""
        reserved = sum(n for model, n in self._reserved.items() if model != besides)
        return sum(self._model_bytes.values()) + reserved

    def _model_dir(self, name: str) -> Path:
        """A repository API's model name as its directory: 422 for a name no directory
        can have (empty, too long, a path), so the file system never sees it."""
        try:
            return repository.model_dir(self.settings.model_repository, name)
        except ManifestError as exc:
            raise InvalidInput(str(exc), field=("model",)) from None

    async def _load(self, name: str) -> ModelInfo:
        model_dir = self._model_dir(name)
        if not model_dir.is_dir():
            raise ModelNotFound(f"no model directory {quoted(name)} in the repository")
        found = versions(model_dir)
        if not found:
            return self._load_failed(
                name, "it holds neither an export (config.json) nor numbered versions"
            )
        # latest: the highest, always read again; all: it too, and every version not loaded.
        loaded = self.versions.get(name, {})
        wanted = found if self.settings.version_policy == "all" else found[-1:]
        to_load = [v for v in wanted if v is found[-1] or v.version not in loaded]
        need = sum(v.estimated_bytes() for v in to_load)
        held = self._held_bytes(besides=name)
        budget = self.settings.model_memory_bytes
        if held + need > budget:
            self.metrics.model_loads.labels(name, "refused").inc()
            shown = ", ".join(v.version for v in to_load)
            raise LoadFailed(
                f"{name!r} version {shown} needs about {need / 2**20:,.0f} MiB; "
                f"{held / 2**20:,.0f} of the {budget / 2**20:,.0f} MiB budget "
                "(ATTNSERVE_MODEL_MEMORY_BYTES) are held: unload a model first"
            )
        self._reserved[name] = need  # loads of other models see it as held meanwhile
        opened: dict[str, ModelRuntime] = {}
        for version in to_load:
            left = budget - self._held_bytes(besides=name)
            step = "loading"  # said in the reason: which step failed
            try:
                runtime = await asyncio.to_thread(
                    load_version,
                    version,
                    self.settings,
                    budget=left,
                    cancelled=self._stopping.is_set,
                )
                step = "warm-up"
                await asyncio.to_thread(runtime.warmup)
            except ModelLoadError as exc:
                return self._load_failed(name, str(exc))
            except Exception as exc:  # a graph that loads but cannot run, or a bug
                log.exception("loading model %s failed", name)
                return self._load_failed(name, f"version {version.version}: {step} failed: {exc}")
            self._hold(runtime)
            opened[version.version] = runtime
        batcher = self._batcher
        if not self.ready or batcher is None:  # (a load begun before SIGTERM completes)
            raise NotReady("models are loading or warming up", headers={"Retry-After": "1"})
        await batcher.calibrate(list(opened.values()))
        on_disk = {v.version for v in wanted}
        kept = {v: rt for v, rt in loaded.items() if v in on_disk and v not in opened}
        self.versions[name] = {**kept, **opened}
        serving = self.versions[name][found[-1].version]
        batcher.serve(serving)
        self.runtimes[name] = serving  # the swap: one assignment on the event loop
        self.cache.drop_model(name)
        self.reasons.pop(name, None)
        self._loaded_from[name] = self._disk_mark(found)
        self.metrics.model_loads.labels(name, "loaded").inc()
        log.info("serving model %s version %s", name, serving.info.version)
        return serving.info

    def _load_failed(self, name: str, reason: str) -> ModelInfo:
        self.metrics.model_loads.labels(name, "failed").inc()
        serving = self.runtimes.get(name)
        if serving is None:
            self.reasons[name] = f"load failed: {reason}"
        log.warning("loading model %s failed: %s", name, reason)
        still = f"; version {serving.info.version} still serves" if serving else ""
        raise LoadFailed(f"{name!r} was not loaded: {reason}{still}")

    async def unload_model(self, name: str, reason: str = "unloaded") -> None:
        """Stop serving ``name``: new requests get 404, requests already prepared finish
        (its sessions are freed when their last run ends). Other models are untouched."""
        self._check_control("unload")
        self._model_dir(name)
        async with self._model_lock(name):
            if name not in self.runtimes:
                raise ModelNotFound(f"{quoted(name)} is not loaded")
            del self.runtimes[name]
            self.versions.pop(name, None)
            self.cache.drop_model(name)
            if self._batcher is not None:
                self._batcher.retire(name)
            self._loaded_from.pop(name, None)
            self.reasons[name] = reason
            log.info("unloaded model %s", name)

    async def _poll_repository(self) -> None:
        """Poll mode: load new or changed model directories beside what serves and swap
        them in; a failed load leaves the serving version and is retried when it changes;
        a model whose directory two scans in a row did not find is unloaded."""
        for name in self.runtimes:
            self._loaded_from[name] = self._disk_mark(
                versions(self.settings.model_repository / name)
            )
        tried: dict[str, DiskMark] = {}
        missing: set[str] = set()  # loaded models whose directory the last scan did not find
        while True:
            await asyncio.sleep(self.settings.poll_seconds)
            if not self.ready or self.shutting_down:
                continue
            try:
                await self._poll_once(tried, missing)
            except Exception:  # the repository moved under us, or a bug: poll again later
                log.exception("scanning the model repository failed")

    async def _poll_once(self, tried: dict[str, DiskMark], missing: set[str]) -> None:
        on_disk: dict[str, DiskMark] = {}
        for model_dir in model_directories(self.settings.model_repository):
            found = versions(model_dir)
            if found:
                on_disk[model_dir.name] = self._disk_mark(found)
        for name, mark in on_disk.items():
            if mark in (self._loaded_from.get(name), tried.get(name)):
                continue
            tried[name] = mark
            with contextlib.suppress(LoadFailed, ModelNotFound, NotReady):
                await self.load_model(name)
        if not on_disk:
            return  # an empty repository is more likely an unmounted volume: keep serving
        # Unloaded when missing at two scans in a row: a directory replaced by two renames
        # (old out, new in) is missing at one scan at most.
        absent = {n for n in self.runtimes if n not in on_disk}
        for name in sorted(absent & missing):
            log.info("model %s is gone from the repository: unloading it", name)
            with contextlib.suppress(ModelNotFound):  # unloaded meanwhile by a call
                await self.unload_model(name, reason="removed from the repository")
            tried.pop(name, None)
        missing.clear()
        missing.update(n for n in absent if n in self.runtimes)

    def _disk_mark(self, found: list[ModelVersion]) -> DiskMark:
        """What poll mode compares to see a change: the highest export's fingerprint, and
        with ATTNSERVE_VERSION_POLICY=all which versions there are."""
        listed = tuple(v.version for v in found) if self.settings.version_policy == "all" else ()
        return listed, found[-1].fingerprint() if found else None

    # -- requests ---------------------------------------------------------------------------

    def open_scope(self, caller: Caller) -> RequestScope:
        """A request's scope, opened by its protocol at arrival and closed by it once the
        answer is sent (or the request has failed): see ``scope.py``."""
        return RequestScope(self, caller)

    def ticket(self) -> Ticket:
        """A request's share of the node's budget, taken at arrival (503 if not ready or
        shutting down); see ``admission.py`` for what it holds when."""
        self.require_ready()
        return self.admission.ticket()

    def deadline(self, arrival: float, asked: float | None) -> float:
        """The ``time.monotonic()`` by which a request arriving at ``arrival`` must be
        answered: ATTNSERVE_REQUEST_TIMEOUT, or less if the client asks for less."""
        timeout = self.settings.request_timeout
        return arrival + (timeout if asked is None else min(asked, timeout))

    # -- encode -----------------------------------------------------------------------------

    async def encode(
        self, parse: Callable[[], tuple[EncodeRequest, W]], scope: RequestScope
    ) -> tuple[EncodeResult, W]:
        """Admit, parse (the protocol's decoding) and prepare off the event loop in one
        hop, hold the working memory, run.

        The scope's ticket holds the body already; here the request takes its slot and
        then its working memory. ``parse`` returns the request and whatever the protocol
        needs later to write the answer (e.g. its encoding format), handed back beside
        the result. Past the scope's deadline the request fails with DeadlineExceeded
        (504), its queued work dropped; once the scope learns that its caller has gone,
        the queued work is dropped and ClientClosedRequest raised.
        """
        ticket = scope.admitted()
        ticket.take_slot()
        # Cheap facts first: a request already past its deadline costs no parsing.
        self._check_deadline(scope.deadline, "before its work began")

        def prepare() -> tuple[PreparedEncode, W]:
            request, wire = parse()
            return self.prepare(request), wire

        began = time.monotonic()
        if ticket.bytes > INLINE_HELD_BYTES:
            prepared, wire = await self.off_loop(prepare)
        else:
            request, wire = parse()
            # The count first: reading the items of a lazy list may cost per item.
            limits.check_sequence_count(
                len(request.inputs), self.settings, pooled_only=request.pooled_only
            )
            if all(isinstance(item, ArrayInput) for item in request.inputs):
                prepared = self.prepare(request)
            else:  # text and token ids are embedded by onnxruntime: never on the loop
                prepared = await self.off_loop(self.prepare, request, small=True)
        scope.timing.prepare_began, scope.timing.prepare_ended = began, time.monotonic()
        ticket.hold(ticket.bytes + prepared.work_bytes, "this request")
        scope.served(prepared.model.name, prepared.model.version)

        def run() -> Coroutine[Any, Any, EncodeResult]:
            return self.run(
                prepared, deadline=scope.deadline, until=scope.cancelled, timing=scope.timing
            )

        if not self.cache.enabled:
            return await run(), wire
        key = self._cache_key(prepared, scope)

        async def wait(twin: Awaitable[EncodeResult]) -> EncodeResult:
            async def waiting() -> EncodeResult:
                return await twin

            return await self._unless_gone(waiting(), scope.cancelled, scope.deadline)

        result, hit = await self.cache.get_or_run(key, prepared.model.name, run, wait)
        scope.cache = "hit" if hit else "miss"
        return result, wire

    def _cache_key(self, prepared: PreparedEncode, scope: RequestScope) -> bytes:
        """What decides the answer: the loaded model, the graph's inputs, every resolved
        option, the wire's cost, and the caller's key when the server has keys."""
        runtime = prepared.runtime
        serial = self._load_serial.get(id(runtime), -1)
        options = dataclasses.replace(prepared.request, inputs=())
        parts: list[bytes | str] = [
            prepared.model.name,
            prepared.model.version,
            str(serial),
            repr(options),
            repr((prepared.graph, prepared.layers, prepared.heads, prepared.hidden_layers)),
            repr((prepared.pooling, prepared.span_tokens, prepared.by_token_ids)),
        ]
        if self.settings.api_key is not None:
            token = (scope.caller.authorization or "").encode("utf-8", "surrogateescape")
            parts.append(hashlib.sha256(token).digest())
        return request_key(parts, prepared.sequences)

    async def off_loop(self, work: Callable[..., T], *args: Any, small: bool = False) -> T:
        """``work(*args)`` on a worker thread, at most ATTNSERVE_MAX_CONCURRENT_CODECS at once.

        Decoding, tokenizing and serialising hold the GIL or a core; left unbounded, a
        burst of them starves the inference thread of the cores it runs on. ``small``
        work (a body parsed on the loop: tens of ms at most) takes a slot of its own,
        one at a time, so it never waits behind large bodies being parsed.
        """
        async with self._small_codec_slot if small else self._codec_slots:
            return await asyncio.to_thread(work, *args)

    def prepare(self, request: EncodeRequest) -> PreparedEncode:
        """Check everything and decode/embed the inputs; raise a ServiceError on mistakes.

        Cheap checks first: the count, then lengths (declared or tokenized), then the
        options, and only then are arrays decoded and token ids embedded; the answer's
        size and working memory are judged before anything is queued.
        """
        runtime = self._runtime(request.model, request.model_version)
        info = runtime.info
        if not request.inputs:
            raise InvalidInput("is empty: send at least one sequence", field=("inputs",))
        pooled_only = request.pooled_only
        # Before reading them:
        limits.check_sequence_count(len(request.inputs), self.settings, pooled_only=pooled_only)
        inputs = list(request.inputs)
        tokenized, ids = self._token_front_end(runtime, inputs, request.truncate, pooled_only)
        options = self._resolve_options(info, request)
        # Text and ids asking only for embeddings run as ids in one graph (when the model
        # has it): no token-embedding run here, and the batcher sees them at once.
        by_token_ids = (
            info.manifest.text_graph is not None
            and not (request.return_attention or request.return_hidden_states)
            and not any(isinstance(item, ArrayInput) for item in inputs)
        )
        span_tokens = self._span_tokens(runtime, inputs, request.truncate, options[3])
        if by_token_ids:
            arrays = self._token_id_pairs(len(inputs), tokenized, ids)
        else:
            arrays = self._sequences(runtime, inputs, tokenized, ids, pooled_only)
        tokens = [tokenized[i][0] if i in tokenized else None for i in range(len(inputs))]
        size, work = self._answer_cost(request, info, arrays, tokens, options, span_tokens)
        layers, heads, hidden_layers, pooling = options
        return PreparedEncode(
            request,
            info,
            arrays,
            tokens,
            layers,
            heads,
            hidden_layers,
            pooling,
            size,
            work,
            by_token_ids,
            span_tokens=span_tokens,
            runtime=runtime,
        )

    def _token_front_end(
        self, runtime: ModelRuntime, inputs: list[InputItem], truncate: bool, pooled_only: bool
    ) -> tuple[dict[int, Tokenized], dict[int, list[int]]]:
        """Texts tokenized and token ids checked, by input index; every length known
        before decoding (declared rows for arrays) checked against the limits."""
        info = runtime.info
        texts = {
            i: limits.bound_text(text_of(item), info, truncate, ("inputs", i), runtime.final_tokens)
            for i, item in enumerate(inputs)
            if isinstance(item, str | SpannedText)
        }
        tokenized: dict[int, Tokenized] = {}
        if texts:
            found = self._tokenize(runtime, list(texts.values()), truncate)
            tokenized = dict(zip(texts, found, strict=True))
        ids = {i: item.ids for i, item in enumerate(inputs) if isinstance(item, TokenIds)}
        if ids:
            self._check_token_ids(info, ids)
        lengths = [
            len(tokenized[i][0])
            if i in tokenized
            else len(ids[i])
            if i in ids
            else item.rows
            if isinstance(item, ArrayInput)
            else None
            for i, item in enumerate(inputs)
        ]
        limits.check_lengths(lengths, info, self.settings, "inputs", pooled_only=pooled_only)
        return tokenized, ids

    def _resolve_options(self, info: ModelInfo, request: EncodeRequest) -> ResolvedOptions:
        """Attention layers and heads, hidden-state layers and pooling, checked against
        the model (even when not asked for: a wrong index is wrong either way)."""
        cfg = info.config
        spec = request.attention
        layers = postprocess.resolve_indices(
            spec.layers, cfg.n_layers, "layers", ("attention", "layers")
        )
        heads = postprocess.resolve_indices(
            spec.heads, cfg.n_heads, "heads", ("attention", "heads")
        )
        hidden_layers = postprocess.resolve_indices(
            request.hidden_layers, cfg.n_layers + 1, "hidden states", ("hidden_states", "layers")
        )
        if request.return_hidden_states and not info.manifest.has_hidden_states:
            raise UnsupportedByModel(
                f"model {info.name!r} was exported without per-layer hidden states: "
                "re-export it with this version of model_export",
                field=("return_hidden_states",),
            )
        if (
            spec.measure == "norms"
            and request.return_attention
            and not info.manifest.has_value_norms
        ):
            raise UnsupportedByModel(
                f"model {info.name!r} was exported without value norms: re-export it with "
                "this version of model_export",
                field=("attention", "measure"),
            )
        if spec.reduce == "rollout":
            layers = sorted(set(layers))  # rollout multiplies layers bottom-up, each once
        return layers, heads, hidden_layers, self._pooling(info, request)

    def _span_tokens(
        self, runtime: ModelRuntime, inputs: list[InputItem], truncate: bool, pooling: Pooling
    ) -> list[list[list[int]] | None]:
        """Late chunking: per input, the tokens of each span (those whose first character
        lies inside it, special tokens excluded); None for inputs without spans."""
        spanned = {i: item for i, item in enumerate(inputs) if isinstance(item, SpannedText)}
        found: list[list[list[int]] | None] = [None] * len(inputs)
        if not spanned:
            return found
        if pooling not in ("mean", "max"):
            first = next(iter(spanned))
            raise InvalidInput(
                "spans are pooled per chunk: set pooling to mean or max",
                field=("inputs", first, "spans"),
            )
        texts = [
            limits.bound_text(item.text, runtime.info, truncate, (), runtime.final_tokens)
            for item in spanned.values()
        ]
        token_spans = runtime.token_spans(texts, truncate=truncate)
        for (i, item), spans in zip(spanned.items(), token_spans, strict=True):
            starts = [None if span is None else span[0] for span in spans]
            per_span = []
            for k, (begin, end) in enumerate(item.spans):
                held = [t for t, c in enumerate(starts) if c is not None and begin <= c < end]
                if not held:
                    raise InvalidInput(
                        f"span [{begin}, {end}) holds no token (only whitespace, or beyond "
                        "the truncated text)",
                        field=("inputs", i, "spans", k),
                    )
                per_span.append(held)
            found[i] = per_span
        return found

    @staticmethod
    def _token_id_pairs(
        count: int, tokenized: dict[int, Tokenized], ids: dict[int, list[int]]
    ) -> list[np.ndarray]:
        """The text graph's input per sequence: int64 [n, 2] of (token id, token type)."""
        pairs = []
        for i in range(count):
            if i in tokenized:
                _, token_ids, type_ids = tokenized[i]
                pair = np.array([token_ids, type_ids], dtype=np.int64).T
            else:  # bare token ids: type 0, as the two-graph path embeds them
                pair = np.zeros((len(ids[i]), 2), dtype=np.int64)
                pair[:, 0] = ids[i]
            pairs.append(pair)
        return pairs

    def _sequences(
        self,
        runtime: ModelRuntime,
        inputs: list[InputItem],
        tokenized: dict[int, Tokenized],
        ids: dict[int, list[int]],
        pooled_only: bool,
    ) -> list[np.ndarray]:
        """The encoder's input per sequence: arrays decoded, token ids embedded."""
        info = runtime.info
        sequences: dict[int, np.ndarray] = {
            i: limits.check_array(item.decode(), ("inputs", i), info.config.d_model)
            for i, item in enumerate(inputs)
            if isinstance(item, ArrayInput)
        }
        id_lists = {i: tokenized[i][1] for i in tokenized} | ids
        type_lists = {i: tokenized[i][2] for i in tokenized} | {
            i: [0] * len(v) for i, v in ids.items()
        }
        if id_lists:
            order = sorted(id_lists)
            embedded = runtime.embed_tokens(
                [id_lists[i] for i in order], [type_lists[i] for i in order]
            )
            sequences.update(zip(order, embedded, strict=True))
        arrays = [sequences[i] for i in range(len(inputs))]
        # Again on what was decoded: a protocol may not know a length before decoding.
        limits.check_lengths(
            [len(a) for a in arrays], info, self.settings, "inputs", pooled_only=pooled_only
        )
        return arrays

    def _answer_cost(
        self,
        request: EncodeRequest,
        info: ModelInfo,
        arrays: list[np.ndarray],
        tokens: list[list[str] | None],
        options: ResolvedOptions,
        span_tokens: list[list[list[int]] | None],
    ) -> tuple[float, int]:
        """The answer's size (413 beyond ATTNSERVE_MAX_RESPONSE_BYTES) and the working
        memory the request holds until it is sent."""
        layers, heads, hidden_layers, pooling = options
        cfg = info.config
        answer_lengths = [len(a) for a in arrays]
        if request.pad_to is not None:
            answer_lengths = [max(request.pad_to, *answer_lengths)] * len(arrays)
        shape = limits.answer_shape(
            answer_lengths,
            cfg.d_model,
            attention=limits.attention_maps(request.attention, len(layers), len(heads))
            if request.return_attention
            else None,
            embeddings=request.return_embeddings,
            pooled_width=None if pooling == "none" else (request.dimensions or cfg.d_model),
            hidden_states=len(hidden_layers) if request.return_hidden_states else 0,
            tokens=tokens,
            spans=[0 if spans is None else len(spans) for spans in span_tokens],
        )
        size = limits.check_response_size(shape, request.wire_cost, info.name, self.settings)
        lengths = [len(a) for a in arrays]
        inputs_held = 0
        part = self.settings.max_sequences
        if len(lengths) > part:  # it runs in parts, PARTS_IN_FLIGHT at a time
            parts = [lengths[i : i + part] for i in range(0, len(lengths), part)]
            running = sorted(parts, key=sum, reverse=True)[:PARTS_IN_FLIGHT]
            lengths = [n for p in running for n in p]
            inputs_held = sum(a.nbytes for a in arrays)  # each input waits for its part
        work = limits.work_bytes(
            lengths,
            cfg,
            request.return_attention,
            request.return_hidden_states,
            shape,
            size,
            request.wire_cost.copies,
        )
        return size, work + inputs_held

    def _pooling(self, info: ModelInfo, request: EncodeRequest) -> Pooling:
        """The pooling to apply; checks normalize and dimensions against it and the model."""
        manifest = info.manifest
        pooling: Pooling = (
            (manifest.pooling or "mean") if request.pooling == "model" else request.pooling
        )
        if request.normalize and pooling == "none":
            raise InvalidInput(
                "applies to pooled vectors: set pooling (mean, cls, max)", field=("normalize",)
            )
        if request.dimensions is not None:
            allowed = manifest.matryoshka_dimensions
            if not allowed:
                raise InvalidInput(
                    f"model {info.name!r} was not trained for shortened embeddings (its "
                    "manifest declares no Matryoshka dimensions): omit dimensions",
                    field=("dimensions",),
                )
            if request.dimensions not in allowed:
                raise InvalidInput(
                    f"{request.dimensions} is not one of model {info.name!r}'s Matryoshka "
                    f"dimensions {list(allowed)}",
                    field=("dimensions",),
                )
            if pooling == "none":
                raise InvalidInput("applies to pooled vectors", field=("dimensions",))
        return pooling

    def _tokenize(
        self, runtime: ModelRuntime, texts: list[str], truncate: bool, special_tokens: bool = True
    ) -> list[Tokenized]:
        if not runtime.info.has_tokenizer:
            raise UnsupportedByModel(
                f"model {runtime.info.name!r} has no tokenizer: send token embeddings as "
                "arrays, or use a model exported from a checkpoint with a tokenizer "
                "(e.g. minilm-l6)"
            )
        return runtime.tokenize(texts, truncate=truncate, special_tokens=special_tokens)

    def _check_token_ids(
        self, info: ModelInfo, ids: dict[int, list[int]], field: str = "inputs"
    ) -> None:
        """Token ids must be the model's own: it has a tokenizer and each id is in range."""
        text = info.manifest.text
        if text is None or not info.has_tokenizer:
            raise UnsupportedByModel(
                f"model {info.name!r} has no tokenizer, so it has no token ids: send token "
                "embeddings as arrays"
            )
        for i, seq in ids.items():
            if not seq:
                raise InvalidInput("holds no token ids", field=(field, i))
            bad = sorted({t for t in seq if not 0 <= t < text.vocab_size})
            if bad:
                shown = ", ".join(map(str, bad[:SHOWN_IDS])) + (
                    ", ..." if len(bad) > SHOWN_IDS else ""
                )
                raise InvalidInput(
                    f"token ids {shown} are outside the vocabulary of model {info.name!r} "
                    f"(0..{text.vocab_size - 1}): send ids of this model's own tokenizer "
                    "(e.g. from /v1/tokenize), or send text",
                    field=(field, i),
                )

    async def run(
        self,
        prepared: PreparedEncode,
        *,
        deadline: float | None = None,
        until: Disconnected | None = None,
        timing: RunTiming | None = None,
    ) -> EncodeResult:
        """Queue a prepared request, wait for its runs, and post-process the outputs.

        A request of more sequences than ATTNSERVE_MAX_SEQUENCES (only pooled vectors
        asked for) runs in parts of that many, ``PARTS_IN_FLIGHT`` queued at a time,
        each pooled as it finishes; the answer keeps the request's order. Its parts share
        one batcher flow (fair per request; refused up front if sure to be late)."""
        batcher = self._batcher
        if batcher is None:  # stopped under it
            raise NotReady("the engine is not running", headers={"Retry-After": "1"})
        lengths = [len(s) for s in prepared.sequences]
        runtime = prepared.runtime or self._serving(prepared.model.name)
        with batcher.flow(runtime, prepared.graph, lengths, deadline) as flow:
            return await self._run_parts(prepared, deadline, until, timing, flow)

    async def _run_parts(
        self,
        prepared: PreparedEncode,
        deadline: float | None,
        until: Disconnected | None,
        timing: RunTiming | None,
        flow: Flow,
    ) -> EncodeResult:
        part = self.settings.max_sequences
        n = len(prepared.sequences)
        if n <= part:
            return await self._run_part(prepared, deadline, until, timing, flow)

        def part_of(start: int) -> PreparedEncode:
            return dataclasses.replace(
                prepared,
                sequences=prepared.sequences[start : start + part],
                tokens=prepared.tokens[start : start + part],
                span_tokens=prepared.span_tokens[start : start + part],
                first_index=start,
            )

        async def outputs_of(start: int) -> list[SequenceOutput]:
            return (await self._run_part(part_of(start), deadline, until, timing, flow)).outputs

        outputs = await self._in_parts(n, outputs_of)
        return EncodeResult(
            prepared.model.name, outputs, prepared.response_bytes, prepared.model.version
        )

    async def _in_parts(
        self, count: int, run_part: Callable[[int], Coroutine[Any, Any, list[P]]]
    ) -> list[P]:
        """``run_part(start)`` for each part of ATTNSERVE_MAX_SEQUENCES of ``count``
        sequences, ``PARTS_IN_FLIGHT`` queued at a time, results joined in order. A part
        that fails (or a caller gone) cancels the parts not yet awaited."""
        pending: deque[asyncio.Task[list[P]]] = deque()
        results: list[P] = []
        try:
            for start in range(0, count, self.settings.max_sequences):
                pending.append(asyncio.ensure_future(run_part(start)))
                if len(pending) >= PARTS_IN_FLIGHT:
                    results += await pending.popleft()
            while pending:
                results += await pending.popleft()
        finally:
            for task in pending:
                task.cancel()
        return results

    async def _run_part(
        self,
        prepared: PreparedEncode,
        deadline: float | None,
        until: Disconnected | None,
        timing: RunTiming | None,
        flow: Flow | None = None,
    ) -> EncodeResult:
        batcher = self._batcher
        if batcher is None:  # stopped under it
            raise NotReady("the engine is not running", headers={"Retry-After": "1"})
        name = prepared.model.name
        self._check_deadline(deadline, "before it could be queued")
        # A watcher task (a task and a wake-up per request) pays only when there is
        # work to skip: runs queued ahead of this request, or a request big enough to
        # matter. A small embeddings request on an idle server runs at once, for a few
        # ms; computing it for a client that has left costs less than watching it.
        watch = (
            batcher.busy()
            or prepared.graph != graph_io.GRAPH_EMBEDDINGS
            or sum(map(len, prepared.sequences)) > UNWATCHED_TOKENS
        )
        work = batcher.submit(
            name,
            prepared.sequences,
            graph=prepared.graph,
            deadline=deadline,
            timing=timing,
            runtime=prepared.runtime,
            flow=flow,
        )
        try:
            results = await self._unless_gone(work, until if watch else None, deadline)
        except DeadlineExceeded as exc:
            exc.headers = {"Retry-After": self.retry_after()}
            raise
        self.metrics.tokens.labels(name).inc(sum(len(s) for s in prepared.sequences))
        if prepared.response_bytes > OFFLOAD_BYTES:
            return await self.off_loop(self.finish, prepared, results)
        return self.finish(prepared, results)

    async def _unless_gone(
        self, work: Coroutine[Any, Any, T], until: Disconnected | None, deadline: float | None
    ) -> T:
        """Await ``work`` unless the caller goes away or the deadline passes first; then
        cancel it (queued runs skip it).

        uvicorn does not cancel a handler whose client disconnected, so without this a
        burst of abandoned requests would still be computed in full.
        """
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            async with asyncio.timeout(timeout) as bound:  # a timer on this task, no second task
                with self._until_work_ends(bound):
                    if until is None:
                        return await work
                    return await self._first_of(work, until)
        except TimeoutError:
            if self.work_ended:
                raise self._work_cut() from None
            self.metrics.refusals.labels("deadline").inc()  # the batcher counts its own drops
            raise DeadlineExceeded(
                "the request's deadline passed before its answer was ready (its queued "
                "work was dropped)",
                headers={"Retry-After": self.retry_after()},
            ) from None

    @staticmethod
    async def _first_of(work: Coroutine[Any, Any, T], until: Disconnected) -> T:
        """``work``'s result, or ClientClosedRequest once ``until`` returns (work cancelled)."""
        watcher = asyncio.ensure_future(until())
        await asyncio.sleep(0)  # a client already gone is seen before its work is queued
        if watcher.done():
            work.close()
            raise ClientClosedRequest("the client closed the connection before its run")
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            raise ClientClosedRequest("the client closed the connection before the answer")
        finally:
            watcher.cancel()
            task.cancel()  # no-op when done; drops the queued job otherwise

    def finish(self, prepared: PreparedEncode, results: list[SequenceResult]) -> EncodeResult:
        """Per-sequence model outputs -> the answer: attention selected/reduced, pooled."""
        request = prepared.request
        answers = []
        for i, outputs in enumerate(results):
            if not all(np.isfinite(value).all() for value in outputs.values()):
                # Finite inputs can still overflow inside the model (e.g. |x| ~ 1e20 in
                # LayerNorm's variance); never answer with NaN.
                raise InvalidInput(
                    "overflows the model (non-finite outputs): its values are too large "
                    f"(max |x| {float(np.abs(prepared.sequences[i]).max()):.3g})",
                    field=("inputs", prepared.first_index + i),
                )
            hidden = outputs[graph_io.OUTPUT_HIDDEN]
            attention = None
            if request.return_attention:
                attention = postprocess.select_attention(
                    outputs[graph_io.OUTPUT_ATTENTIONS],
                    prepared.layers,
                    prepared.heads,
                    request.attention.reduce,
                    outputs[graph_io.OUTPUT_VALUE_NORMS]
                    if request.attention.measure == "norms"
                    else None,
                )
            hidden_states = None
            if request.return_hidden_states:
                hidden_states = outputs[graph_io.OUTPUT_HIDDEN_STATES][prepared.hidden_layers]
            pooled = None
            if prepared.pooling != "none":
                pooled = postprocess.pool(
                    hidden, prepared.pooling, request.normalize, request.dimensions
                )
            spans = prepared.span_tokens[i] if prepared.span_tokens else None
            span_embeddings = None
            if spans is not None:
                span_embeddings = np.stack(
                    [
                        postprocess.pool(
                            hidden[held], prepared.pooling, request.normalize, request.dimensions
                        )
                        for held in spans
                    ]
                )
            answers.append(
                SequenceOutput(
                    tokens=prepared.tokens[i],
                    length=len(hidden),
                    embeddings=hidden if request.return_embeddings else None,
                    attention=attention,
                    hidden_states=hidden_states,
                    pooled=pooled,
                    span_embeddings=span_embeddings,
                )
            )
        return EncodeResult(
            prepared.model.name, answers, prepared.response_bytes, prepared.model.version
        )

    # -- sparse vectors (BM42) --------------------------------------------------------------

    async def embed_sparse(
        self, parse: Callable[[], tuple[SparseRequest, W]], scope: RequestScope
    ) -> tuple[SparseResult, W]:
        """BM42 vectors: texts tokenized off the loop; documents run the sparse graph (the
        last layer's [CLS] attention row) in parts like a large pooled request, queries
        run nothing. Admission, deadline and disconnects as ``encode``."""
        ticket = scope.admitted()
        ticket.take_slot()
        self._check_deadline(scope.deadline, "before its work began")
        began = time.monotonic()
        request, wire = parse()
        limits.check_sequence_count(len(request.texts), self.settings, pooled_only=True)
        runtime, encoded = await self.off_loop(self._prepare_sparse, request)
        scope.timing.prepare_began, scope.timing.prepare_ended = began, time.monotonic()
        scope.served(runtime.info.name, runtime.info.version)
        tokens = sum(len(t) for t, _, _ in encoded)
        ticket.hold(ticket.bytes + SPARSE_BYTES_PER_TOKEN * tokens, "this request")
        special, stopwords = runtime.special_tokens, runtime.stopwords
        if request.kind == "query":
            vectors = [sparse.query_vector(t, special, stopwords) for t, _, _ in encoded]
        else:
            pairs = self._token_id_pairs(len(encoded), dict(enumerate(encoded)), {})
            graph = graph_io.GRAPH_SPARSE  # _prepare_sparse checked the model has it
            results = await self._results_in_parts(runtime, pairs, graph, scope)
            vectors = [
                sparse.document_vector(
                    t, result[graph_io.OUTPUT_CLS_ATTENTION], special, stopwords, request.alpha
                )
                for (t, _, _), result in zip(encoded, results, strict=True)
            ]
            self.metrics.tokens.labels(runtime.info.name).inc(tokens)
        return SparseResult(runtime.info.name, vectors, tokens), wire

    def _prepare_sparse(self, request: SparseRequest) -> tuple[ModelRuntime, list[Tokenized]]:
        """Check the request against the model and tokenize its texts."""
        runtime = self._runtime(request.model)
        info = runtime.info
        if not request.texts:
            raise InvalidInput("is empty: send at least one string", field=("inputs",))
        if not (math.isfinite(request.alpha) and request.alpha > 0):
            raise InvalidInput(
                f"must be a positive number, got {request.alpha!r}", field=("alpha",)
            )
        text = info.manifest.text
        if request.kind == "document" and (text is None or text.sparse_graph is None):
            raise UnsupportedByModel(
                f"model {info.name!r} has no BM42 graph: re-export it with this version of "
                "model_export (a checkpoint with a tokenizer)",
                field=("model",),
            )
        texts = [
            limits.bound_text(t, info, request.truncate, ("inputs", i), runtime.final_tokens)
            for i, t in enumerate(request.texts)
        ]
        encoded = self._tokenize(runtime, texts, request.truncate)
        lengths: list[int | None] = [len(tokens) for tokens, _, _ in encoded]
        limits.check_lengths(lengths, info, self.settings, "inputs", pooled_only=True)
        return runtime, encoded

    async def _results_in_parts(
        self, runtime: ModelRuntime, sequences: list[np.ndarray], graph: str, scope: RequestScope
    ) -> list[SequenceResult]:
        """Per-sequence outputs of ``graph``, queued in parts of ATTNSERVE_MAX_SEQUENCES,
        ``PARTS_IN_FLIGHT`` at a time, in order; dropped when the caller leaves or the
        deadline passes (504 with Retry-After)."""
        batcher = self._batcher
        if batcher is None:
            raise NotReady("the engine is not running", headers={"Retry-After": "1"})
        part = self.settings.max_sequences
        lengths = [len(s) for s in sequences]
        with batcher.flow(runtime, graph, lengths, scope.deadline) as flow:

            async def run(start: int) -> list[SequenceResult]:
                work = batcher.submit(
                    runtime.info.name,
                    sequences[start : start + part],
                    graph=graph,
                    deadline=scope.deadline,
                    timing=scope.timing,
                    runtime=runtime,
                    flow=flow,
                )
                try:
                    return await self._unless_gone(work, scope.cancelled, scope.deadline)
                except DeadlineExceeded as exc:
                    exc.headers = {"Retry-After": self.retry_after()}
                    raise

            return await self._in_parts(len(sequences), run)

    # -- tokenize ---------------------------------------------------------------------------

    async def tokenize(
        self, parse: Callable[[], tuple[TokenizeRequest, W]], scope: RequestScope
    ) -> tuple[TokenizeResult, W]:
        """Parse and tokenize (and embed, if asked) off the event loop, like ``encode``;
        past the scope's deadline DeadlineExceeded (504), checked before the work too."""
        self.require_ready()
        scope.admitted().take_slot()
        deadline = scope.deadline
        self._check_deadline(deadline, "before it could be tokenized")

        def tokenize() -> tuple[TokenizeResult, W]:
            request, wire = parse()
            return self.tokenize_now(request), wire

        return await self._unless_gone(self.off_loop(tokenize), scope.cancelled, deadline)

    def _check_deadline(self, deadline: float | None, when: str) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            self.metrics.refusals.labels("deadline").inc()
            raise DeadlineExceeded(
                f"the request's deadline passed {when}",
                headers={"Retry-After": self.retry_after()},
            )

    def tokenize_now(self, request: TokenizeRequest) -> TokenizeResult:
        runtime = self._runtime(request.model)
        info = runtime.info
        if not request.texts:
            raise InvalidInput("is empty: send at least one string", field=("texts",))
        # Tokens alone are a small answer (like pooled vectors): the larger limits apply.
        small = not request.return_embeddings
        limits.check_sequence_count(len(request.texts), self.settings, pooled_only=small)
        texts = [
            limits.bound_text(text, info, request.truncate, ("texts", i), runtime.final_tokens)
            for i, text in enumerate(request.texts)
        ]
        encoded = self._tokenize(runtime, texts, request.truncate, request.special_tokens)
        lengths = [len(tokens) for tokens, _, _ in encoded]
        limits.check_lengths(list(lengths), info, self.settings, "texts", pooled_only=small)
        embeddings: list[np.ndarray | None] = [None] * len(encoded)
        if request.return_embeddings:
            shape = limits.answer_shape(
                lengths,
                info.config.d_model,
                attention=None,
                embeddings=True,
                pooled_width=None,
                tokens=[tokens for tokens, _, _ in encoded],
            )
            limits.check_response_size(shape, request.wire_cost, info.name, self.settings)
            embeddings = list(
                runtime.embed_tokens([ids for _, ids, _ in encoded], [t for _, _, t in encoded])
            )
        spans: list[list[tuple[int, int] | None] | None] = [None] * len(encoded)
        if request.spans:
            spans = list(
                runtime.token_spans(
                    texts, truncate=request.truncate, special_tokens=request.special_tokens
                )
            )
        return TokenizeResult(
            info.name,
            [
                TokenizedText(tokens, ids, emb, span)
                for (tokens, ids, _), emb, span in zip(encoded, embeddings, spans, strict=True)
            ],
        )

    # -- decode -----------------------------------------------------------------------------

    async def decode(
        self, parse: Callable[[], tuple[DecodeRequest, W]], scope: RequestScope
    ) -> tuple[DecodeResult, W]:
        """Token ids back to text, off the event loop, within the scope's deadline."""
        self.require_ready()
        scope.admitted().take_slot()
        self._check_deadline(scope.deadline, "before it could be decoded")

        def decode() -> tuple[DecodeResult, W]:
            request, wire = parse()
            return self.decode_now(request), wire

        return await self._unless_gone(self.off_loop(decode), scope.cancelled, scope.deadline)

    def decode_now(self, request: DecodeRequest) -> DecodeResult:
        runtime = self._runtime(request.model)
        info = runtime.info
        if not request.ids:
            raise InvalidInput("is empty: send at least one list of ids", field=("ids",))
        limits.check_sequence_count(len(request.ids), self.settings, pooled_only=True)
        limits.check_lengths(
            [len(ids) for ids in request.ids], info, self.settings, "ids", pooled_only=True
        )
        self._check_token_ids(info, dict(enumerate(request.ids)), field="ids")
        texts = runtime.decode(request.ids, skip_special_tokens=request.skip)
        return DecodeResult(info.name, texts)
