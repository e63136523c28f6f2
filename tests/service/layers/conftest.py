"""Fixtures of the layer tests: the real runtime and engine on tiny, in-process, no server.

Everything here is the service's own code on the session's exported ``tiny``
model: onnxruntime sessions, the engine's limits and post-processing, the
batcher. Nothing of ours is mocked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from service.engine import (
    Access,
    Caller,
    Engine,
    RequestScope,
    TokenizeRequest,
    TokenizeResult,
    text,
)
from service.metrics import Metrics
from service.model_info import ModelInfo
from service.runtime import ModelRuntime, load_repository
from service.settings import Settings
from tests.support.tiny import MODEL

T = TypeVar("T")


def layer_settings(model_repository: Path, **overrides: Any) -> Settings:
    """Settings on the session's repository: one intra-op thread, no warm-up (ready at once)."""
    return Settings(
        model_repository=model_repository, intra_op_threads=1, warmup=False, **overrides
    )


@pytest.fixture(scope="session")
def settings(model_repository: Path) -> Settings:
    return layer_settings(model_repository)


@pytest.fixture(scope="session")
def runtimes(settings: Settings) -> dict[str, ModelRuntime]:
    """The repository loaded once per session by the service's own loader."""
    return load_repository(settings)


@pytest.fixture(scope="session")
def tiny_runtime(runtimes: dict[str, ModelRuntime]) -> ModelRuntime:
    return runtimes[MODEL]


@pytest.fixture(scope="session")
def tiny_info(tiny_runtime: ModelRuntime) -> ModelInfo:
    return tiny_runtime.info


def loaded_engine(settings: Settings, runtimes: dict[str, ModelRuntime]) -> Engine:
    """An engine with models but no batcher: enough for prepare, finish and model lookups."""
    engine = Engine(settings, Metrics())
    engine.registry.runtimes = runtimes
    engine.registry.default_model = MODEL
    return engine


def tokenize_texts(engine: Engine, request: TokenizeRequest) -> TokenizeResult:
    """The engine's tokenize step on the model the request names (no run)."""
    runtime = engine.registry.runtime(request.model)
    return text.tokenize_texts(runtime, request, engine.settings)[0]


@pytest.fixture
def engine(settings: Settings, runtimes: dict[str, ModelRuntime]) -> Engine:
    return loaded_engine(settings, runtimes)


def with_started_engine(settings: Settings, body: Callable[[Engine], Awaitable[T]]) -> T:
    """Start a real engine (its own runtimes and batcher), await ``body(engine)``, stop it."""

    async def main() -> T:
        engine = Engine(settings, Metrics())
        await engine.start()
        try:
            assert engine.lifecycle.ready  # warmup=False: ready as soon as the batcher runs
            return await body(engine)
        finally:
            await engine.stop()

    return asyncio.run(main())


@contextmanager
def work_scope(engine: Engine) -> Iterator[RequestScope]:
    """A request's scope entered for work, as a protocol's route opens it."""
    with engine.request(Caller("test")) as scope:
        scope.route, scope.status = "test", 200
        scope.enter(Access.WORK)
        yield scope
