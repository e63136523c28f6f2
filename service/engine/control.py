"""The models' life: loaded at start and warmed up; then model control
(ATTNSERVE_MODEL_CONTROL): load, swap, unload and poll.

A load reads a model directory (untrusted: see ``runtime.read_version``) beside
what serves, within the model memory budget, opens and warms it up on the
loader thread, and swaps it in with one assignment on the event loop: new
requests go to it, requests already prepared finish on the version they started
on; it is calibrated afterwards on the inference lanes, one run at a time when no
request has had work there for a moment. One load or unload of a model at a time;
other models' go on beside it, their hashing too, but one model's sessions are
opened and warmed up at a time (the others' wait their turn) and one calibrated
at a time, so serving keeps the lanes and most of the cores. Poll mode repeats
this for every changed directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from model_export.manifest import ManifestError
from service import repository
from service.batcher import Batcher
from service.engine.lifecycle import Lifecycle
from service.engine.registry import Registry
from service.engine.response_cache import ResponseCache
from service.errors import (
    InvalidInput,
    LoadFailed,
    ModelLoadError,
    ModelNotFound,
    NotReady,
    ShuttingDown,
    quoted,
)
from service.metrics import Metrics
from service.repository import ModelVersion, model_directories, versions
from service.resident import measured, pss_bytes
from service.runtime import ModelRuntime, load_repository, load_version, open_version, read_version
from service.settings import Settings

log = logging.getLogger(__name__)

# Poll mode's view of a model directory: its versions (policy all) and highest export's stamp.
DiskMark = tuple[tuple[str, ...], tuple[str, int, int] | None]


class ModelControl:
    """Loads, swaps and unloads models in the registry; polls the repository."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        registry: Registry,
        lifecycle: Lifecycle,
        cache: ResponseCache,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._registry = registry
        self._lifecycle = lifecycle
        self._cache = cache
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # lock, its users
        self._reserved: dict[str, int] = {}  # memory reserved by loads in progress
        self._loaded_from: dict[str, DiskMark] = {}  # what each loaded export was
        self._tasks: list[asyncio.Task[None]] = []  # warm-up and the repository poll
        # Opens and warms up the models loaded while serving, one at a time: session
        # creation and warm-up stay off the event loop and the inference lanes.
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-loader")
        self._calibrating = asyncio.Lock()  # one loaded model's calibration at a time
        self._calibrations: dict[str, asyncio.Task[None]] = {}  # by model, in the background
        self._pss_at_start: int | None = None  # before the first models loaded

    # -- at start ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the models to serve from the start, start the batcher, then warm up in the
        background on the inference lanes (ready after it) and, in poll mode, poll."""
        settings, lifecycle = self._settings, self._lifecycle
        await self._load_at_start()
        batcher = Batcher(self._registry.runtimes, settings, self._metrics)
        await batcher.start()
        lifecycle.batcher = batcher
        if settings.warmup:
            warm = lifecycle.warm(lambda: self._warm_up(batcher))
            self._tasks.append(asyncio.create_task(warm, name="warm-up"))
        else:
            lifecycle.ready = True
        if settings.model_control == "poll":
            self._tasks.append(asyncio.create_task(self._poll(), name="repository-poll"))

    async def _warm_up(self, batcher: Batcher) -> None:
        """Every loaded version run once, then the run planner's cost model timed."""
        registry = self._registry
        for loaded in registry.versions.values():
            for runtime in loaded.values():
                await batcher.warm_up(runtime)
        self._measure_start()
        await batcher.calibrate()
        log.info(
            "ready: serving %s (requests that name no model go to %s)",
            ", ".join(registry.runtimes),
            registry.default_model,
        )

    async def stop(self) -> None:
        self._lifecycle.ready = False
        for task in (*self._tasks, *self._calibrations.values()):
            task.cancel()
        if self._lifecycle.batcher is not None:
            await self._lifecycle.batcher.stop()
        self._loader.shutdown(wait=False, cancel_futures=True)

    async def _load_at_start(self) -> None:
        """The models to serve from the start (every one, or in explicit mode the default
        and ATTNSERVE_LOAD_MODELS); ModelLoadError: the server refuses to start."""
        settings, registry = self._settings, self._registry
        self._pss_at_start = pss_bytes()
        try:
            runtimes = await asyncio.to_thread(load_repository, settings, self._models_at_start())
            for runtime in runtimes.values():
                registry.hold(runtime)
                registry.versions[runtime.info.name] = {runtime.info.version: runtime}
                if settings.version_policy == "all":
                    await self._load_older_versions(runtime)
        except ModelLoadError as exc:
            log.error("attnserve cannot start: %s", exc)
            raise
        registry.runtimes = runtimes
        for model_dir in model_directories(settings.model_repository):
            if model_dir.name not in runtimes:
                registry.reasons[model_dir.name] = "not loaded"
        registry.default_model = settings.default_model or sorted(runtimes)[0]

    def _measure_start(self) -> None:
        """The models loaded at start counted at what loading and warming them up added
        to the process's PSS, shared out by their estimates (exact with one model). Not
        before warm-up: a mapped page is counted once a run has touched it."""
        versions = [rt for loaded in self._registry.versions.values() for rt in loaded.values()]
        added = measured(self._pss_at_start, pss_bytes())
        estimated = sum(rt.info.estimated_bytes for rt in versions)
        if added is None or not estimated:
            return
        for runtime in versions:
            self._registry.measured(runtime, added * runtime.info.estimated_bytes // estimated)
        log.info("models loaded at start hold %.0f MiB (PSS)", added / 2**20)

    async def _load_older_versions(self, serving: ModelRuntime) -> None:
        """ATTNSERVE_VERSION_POLICY=all at start: every version below the serving one."""
        name = serving.info.name
        for older in versions(self._settings.model_repository / name)[:-1]:
            runtime = await asyncio.to_thread(load_version, older, self._settings)
            self._registry.hold(runtime)
            self._registry.versions[name][older.version] = runtime

    def _models_at_start(self) -> list[str] | None:
        """None: every model directory (control none or poll)."""
        settings = self._settings
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

    # -- load and unload -----------------------------------------------------------------------

    async def load(self, name: str) -> ModelRuntime:
        """Load ``name``'s highest version beside what serves, check it (manifest, hashes,
        warm-up, memory budget), then swap it in. A failure leaves serving as it was and
        says why (LoadFailed)."""
        lifecycle = self._lifecycle
        self._check_control("load")
        self._model_dir(name)
        self._refuse_if_shutting_down()
        try:
            async with asyncio.timeout(None) as bound:
                with lifecycle.until_work_ends(bound):
                    async with self._lock(name):
                        self._refuse_if_shutting_down()  # it waited: start nothing now
                        return await self._locked_load(name)
        except TimeoutError:
            raise lifecycle.work_cut() from None
        except LoadFailed:
            if lifecycle.work_ended:  # its hashing gave up for the end of the grace window
                raise lifecycle.work_cut() from None
            raise

    async def unload(self, name: str, reason: str = "unloaded") -> None:
        """Stop serving ``name``: new requests get 404, requests already prepared finish
        (its sessions are freed when their last run ends). Other models are untouched."""
        self._check_control("unload")
        self._model_dir(name)
        registry = self._registry
        async with self._lock(name):
            if name not in registry.runtimes:
                raise ModelNotFound(f"{quoted(name)} is not loaded")
            del registry.runtimes[name]
            registry.versions.pop(name, None)
            self._stop_calibrating(name)
            self._cache.drop_model(name)
            if self._lifecycle.batcher is not None:
                self._lifecycle.batcher.retire(name)
            self._loaded_from.pop(name, None)
            registry.reasons[name] = reason
            log.info("unloaded model %s", name)

    def _refuse_if_shutting_down(self) -> None:
        """A load that has not started by SIGTERM never starts (one that has is answered,
        or cut with 503 at the end of the grace window, its hashing given up)."""
        if self._lifecycle.shutting_down:
            raise ShuttingDown(
                "the server is shutting down: load the model on another replica",
                headers={"Retry-After": self._lifecycle.retry_after()},
            )

    @contextlib.asynccontextmanager
    async def _lock(self, name: str) -> AsyncIterator[None]:
        """One load or unload of ``name`` at a time; other models' go on beside it."""
        lock, users = self._locks.get(name, (asyncio.Lock(), 0))
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    async def _locked_load(self, name: str) -> ModelRuntime:
        self._registry.loading_now.add(name)
        try:
            return await self._load(name)
        except OSError as exc:  # the directory changed under us: said without its path
            return self._load_failed(name, f"its directory cannot be read: {exc.strerror}")
        finally:
            self._registry.loading_now.discard(name)
            self._reserved.pop(name, None)

    def _check_control(self, what: str) -> None:
        if self._settings.model_control == "none":
            raise LoadFailed(
                "models are fixed at start (ATTNSERVE_MODEL_CONTROL=none): set it to "
                f"explicit or poll to {what} models while serving"
            )

    def _held_bytes(self, besides: str) -> int:
        """Model memory held by loaded versions and reserved by loads in progress,
        ``besides``'s own reservation left out."""
        reserved = sum(n for model, n in self._reserved.items() if model != besides)
        return self._registry.held_bytes() + reserved

    def _model_dir(self, name: str) -> Path:
        """A repository API's model name as its directory: 422 for a name no directory
        can have (empty, too long, a path), so the file system never sees it."""
        try:
            return repository.model_dir(self._settings.model_repository, name)
        except ManifestError as exc:
            raise InvalidInput(str(exc), field=("model",)) from None

    async def _load(self, name: str) -> ModelRuntime:
        settings, registry = self._settings, self._registry
        model_dir = self._model_dir(name)
        if not model_dir.is_dir():
            raise ModelNotFound(f"no model directory {quoted(name)} in the repository")
        found = versions(model_dir)
        if not found:
            return self._load_failed(
                name, "it holds neither an export (config.json) nor numbered versions"
            )
        batcher = self._lifecycle.batcher
        if batcher is None:  # still starting: the first models are loading
            raise NotReady("models are loading or warming up", headers={"Retry-After": "1"})
        # latest: the highest, always read again; all: it too, and every version not loaded.
        loaded = registry.versions.get(name, {})
        wanted = found if settings.version_policy == "all" else found[-1:]
        to_load = [v for v in wanted if v is found[-1] or v.version not in loaded]
        need = sum(v.estimated_bytes() for v in to_load)
        held = self._held_bytes(besides=name)
        budget = settings.model_memory_bytes
        if held + need > budget:
            self._metrics.model_loads.labels(name, "refused").inc()
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
            before, frees = pss_bytes(), registry.frees
            try:
                info = await asyncio.to_thread(
                    read_version,
                    version,
                    settings,
                    budget=left,
                    cancelled=self._lifecycle.stopping.is_set,
                )
                loop = asyncio.get_running_loop()
                runtime = await loop.run_in_executor(self._loader, open_version, info, settings)
                step = "warm-up"
                await loop.run_in_executor(self._loader, runtime.warmup)
                added = measured(before, pss_bytes())
            except ModelLoadError as exc:
                return self._load_failed(name, str(exc))
            except Exception as exc:  # a graph that loads but cannot run, or a bug
                log.exception("loading model %s failed", name)
                return self._load_failed(name, f"version {version.version}: {step} failed: {exc}")
            registry.hold(runtime)
            # A version freed meanwhile (an unload beside this load) makes the reading low:
            # then the estimate stays.
            if added is not None and registry.frees == frees:
                registry.measured(runtime, added)
            opened[version.version] = runtime
        if not self._lifecycle.ready:  # (a load begun before SIGTERM completes)
            raise NotReady("models are loading or warming up", headers={"Retry-After": "1"})
        on_disk = {v.version for v in wanted}
        kept = {v: rt for v, rt in loaded.items() if v in on_disk and v not in opened}
        registry.versions[name] = {**kept, **opened}
        serving = registry.versions[name][found[-1].version]
        batcher.serve(serving)
        registry.runtimes[name] = serving  # the swap: one assignment on the event loop
        self._cache.drop_model(name)
        registry.reasons.pop(name, None)
        self._loaded_from[name] = self._disk_mark(found)
        self._metrics.model_loads.labels(name, "loaded").inc()
        log.info("serving model %s version %s", name, serving.info.version)
        self._calibrate_later(name, batcher, list(opened.values()))
        return serving

    def _calibrate_later(self, name: str, batcher: Batcher, runtimes: list[ModelRuntime]) -> None:
        """Time the loaded versions' calibration shapes in the background, between
        requests (``Batcher.calibrate``): until then the run planner packs greedily, runs
        alone and fits the cost model from the live runs, as before any calibration."""
        self._stop_calibrating(name)

        async def calibrate() -> None:
            async with self._calibrating:
                await batcher.calibrate(runtimes, between_requests=True)
            log.info("model %s calibrated", name)

        task = asyncio.create_task(calibrate(), name=f"calibrate-{name}")
        self._calibrations[name] = task
        task.add_done_callback(partial(self._calibrated, name))

    def _calibrated(self, name: str, task: asyncio.Task[None]) -> None:
        if self._calibrations.get(name) is task:
            del self._calibrations[name]
        if not task.cancelled() and task.exception() is not None:
            log.error("calibrating model %s failed", name, exc_info=task.exception())

    def _stop_calibrating(self, name: str) -> None:
        """No more calibration of ``name``'s versions (swapped or unloaded)."""
        task = self._calibrations.pop(name, None)
        if task is not None:
            task.cancel()

    def _load_failed(self, name: str, reason: str) -> ModelRuntime:
        self._metrics.model_loads.labels(name, "failed").inc()
        serving = self._registry.runtimes.get(name)
        if serving is None:
            self._registry.reasons[name] = f"load failed: {reason}"
        log.warning("loading model %s failed: %s", name, reason)
        still = f"; version {serving.info.version} still serves" if serving else ""
        raise LoadFailed(f"{name!r} was not loaded: {reason}{still}")

    # -- poll mode -----------------------------------------------------------------------------

    async def _poll(self) -> None:
        """Load new or changed model directories beside what serves and swap them in; a
        failed load leaves the serving version and is retried when it changes; a model
        whose directory two scans in a row did not find is unloaded."""
        for name in self._registry.runtimes:
            self._loaded_from[name] = self._disk_mark(
                versions(self._settings.model_repository / name)
            )
        tried: dict[str, DiskMark] = {}
        missing: set[str] = set()  # loaded models whose directory the last scan did not find
        while True:
            await asyncio.sleep(self._settings.poll_seconds)
            if not self._lifecycle.ready or self._lifecycle.shutting_down:
                continue
            try:
                await self._poll_once(tried, missing)
            except Exception:  # the repository moved under us, or a bug: poll again later
                log.exception("scanning the model repository failed")

    async def _poll_once(self, tried: dict[str, DiskMark], missing: set[str]) -> None:
        on_disk: dict[str, DiskMark] = {}
        for model_dir in model_directories(self._settings.model_repository):
            found = versions(model_dir)
            if found:
                on_disk[model_dir.name] = self._disk_mark(found)
        for name, mark in on_disk.items():
            if mark in (self._loaded_from.get(name), tried.get(name)):
                continue
            tried[name] = mark
            with contextlib.suppress(LoadFailed, ModelNotFound, NotReady):
                await self.load(name)
        if not on_disk:
            return  # an empty repository is more likely an unmounted volume: keep serving
        # Unloaded when missing at two scans in a row: a directory replaced by two renames
        # (old out, new in) is missing at one scan at most.
        runtimes = self._registry.runtimes
        absent = {n for n in runtimes if n not in on_disk}
        for name in sorted(absent & missing):
            log.info("model %s is gone from the repository: unloading it", name)
            with contextlib.suppress(ModelNotFound):  # unloaded meanwhile by a call
                await self.unload(name, reason="removed from the repository")
            tried.pop(name, None)
        missing.clear()
        missing.update(n for n in absent if n in runtimes)

    def _disk_mark(self, found: list[ModelVersion]) -> DiskMark:
        """What poll mode compares to see a change: the highest export's fingerprint, and
        with ATTNSERVE_VERSION_POLICY=all which versions there are."""
        listed = tuple(v.version for v in found) if self._settings.version_policy == "all" else ()
        return listed, found[-1].fingerprint() if found else None
