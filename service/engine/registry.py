"""Which models and versions are loaded, which one serves, and what they hold.

A request names a model (or none: the default) and maybe a version; the
registry resolves it to a loaded :class:`ModelRuntime` or says why not (404,
or 503 while the first models load). It also keeps the model memory ledger: a
loaded version is counted from load until the last reference to it goes (a
swapped-out version lives on while runs that started on it finish): at its
estimate from its files, then at what its load and warm-up added to the
process's PSS once measured (``service/resident.py``).
Model control (``control.py``) is the only writer.
"""

from __future__ import annotations

import itertools
import weakref
from pathlib import Path

from service.errors import ModelNotFound, NotReady, quoted
from service.metrics import Metrics
from service.model_info import ModelInfo
from service.repository import latest, model_directories
from service.runtime import ModelRuntime


class Registry:
    """Loaded versions by model, the serving one of each, and why others are not."""

    def __init__(self, repository: Path, metrics: Metrics) -> None:
        self._repository = repository
        self._metrics = metrics
        self.runtimes: dict[str, ModelRuntime] = {}  # the serving version of each model
        # Every loaded version by model and version (ATTNSERVE_VERSION_POLICY=all keeps
        # older ones beside the serving one; latest keeps that one only).
        self.versions: dict[str, dict[str, ModelRuntime]] = {}
        self.default_model = ""
        self.reasons: dict[str, str] = {}  # why a model directory is not serving
        self.loading_now: set[str] = set()
        self._model_bytes: dict[int, int] = {}  # id(runtime) -> bytes held, while alive
        self._load_serial: dict[int, int] = {}  # id(runtime) -> its load's number, while alive
        self._serials = itertools.count()
        self.frees = 0  # versions freed so far: a load measured meanwhile reads low
        # id(runtime.info) -> runtime, while it lives (a swapped-out version still runs
        # the requests resolved to it).
        self._by_info: weakref.WeakValueDictionary[int, ModelRuntime] = (
            weakref.WeakValueDictionary()
        )

    # -- resolution -------------------------------------------------------------------------

    def models(self) -> list[ModelInfo]:
        self._require_started()
        return [rt.info for rt in self.runtimes.values()]

    def model_versions(self, name: str) -> list[str]:
        """The loaded versions of ``name``, lowest first."""
        return sorted(self.versions.get(name, {}), key=int)

    def runtime(self, name: str | None, version: str | None = None) -> ModelRuntime:
        """The loaded version a request asks for (the serving one when ``version`` is None)."""
        serving = self.serving(name)
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

    def runtime_of(self, info: ModelInfo) -> ModelRuntime | None:
        """The loaded version ``info`` describes, while it lives."""
        runtime = self._by_info.get(id(info))
        return runtime if runtime is not None and runtime.info is info else None

    def serving(self, name: str | None) -> ModelRuntime:
        """The serving version of ``name`` (None: the default model)."""
        self._require_started()
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

    def _require_started(self) -> None:
        if not self.runtimes and not self.reasons:
            raise NotReady("models are loading", headers={"Retry-After": "1"})

    def index(self) -> list[dict[str, str]]:
        """Every model directory: its serving version and state, or why it is not serving."""
        entries = []
        for model_dir in model_directories(self._repository):
            name = model_dir.name
            if name in self.runtimes:  # every loaded version (policy all: older ones too)
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
                    "state": "LOADING" if name in self.loading_now else "UNAVAILABLE",
                    "reason": self.reasons.get(name, "not loaded"),
                }
            )
        return entries

    # -- the memory ledger --------------------------------------------------------------------

    def hold(self, runtime: ModelRuntime) -> None:
        """Count a loaded version's memory until the last reference to it goes: its
        estimate from its files until :meth:`measured` says what it really holds."""
        key, name = id(runtime), runtime.info.name
        self._model_bytes[key] = runtime.info.estimated_bytes
        self._load_serial[key] = next(self._serials)
        self._by_info[id(runtime.info)] = runtime
        self._metrics.model_versions.labels(name).inc()
        self._metrics.model_memory.labels(name).inc(runtime.info.estimated_bytes)

        def freed() -> None:
            self.frees += 1
            self._metrics.model_memory.labels(name).dec(self._model_bytes.pop(key, 0))
            self._load_serial.pop(key, None)
            self._metrics.model_versions.labels(name).dec()

        weakref.finalize(runtime, freed)

    def measured(self, runtime: ModelRuntime, resident: int) -> None:
        """Count ``runtime`` at ``resident`` bytes (the PSS its load and warm-up added,
        ``service/resident.py``) instead of its estimate."""
        key = id(runtime)
        if key in self._model_bytes:
            change = resident - self._model_bytes[key]
            self._model_bytes[key] = resident
            self._metrics.model_memory.labels(runtime.info.name).inc(change)

    def held_bytes(self) -> int:
        """Model memory held by every loaded version still alive."""
        return sum(self._model_bytes.values())

    def load_serial(self, runtime: ModelRuntime | None) -> int:
        """Which load made ``runtime`` (a reload of the same version is a new one)."""
        return self._load_serial.get(id(runtime), -1)
