"""A request kind, declared once: what differs between encode, sparse, rerank, classify,
similarity, multi-vector, tokenize and decode requests.

A kind states how its typed request is checked and priced (``prepare``: every limit
before any work, which may refuse it), the model version that serves it, the working
memory it holds while it runs, its run and finish (``run``), and, for encode, its
response-cache key. What every kind shares is written once, in ``Engine.handle``: a
slot, the deadline, the parse and preparation on or off the event loop
(``admit.Admit.prepared``), the model it is served by, the memory held on its ticket,
the cache, the run, and the deadline again before its answer is written. Models:
TEI's ``Infer``, MLServer's ``DataPlane.infer``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from service.engine.admit import Admit
from service.engine.execute import Executor
from service.engine.registry import Registry
from service.engine.scope import RequestScope
from service.model_info import ModelInfo
from service.settings import Settings

R = TypeVar("R")  # the typed request a protocol parses
P = TypeVar("P")  # what the kind's ``prepare`` makes of it
Res = TypeVar("Res")  # its result, which the protocol writes


@dataclass(frozen=True)
class Serving:
    """What a kind's steps may use: the versions that serve, the settings, the batcher
    and the codec threads. The engine builds it once."""

    registry: Registry
    settings: Settings
    execute: Executor
    admit: Admit


def _never(_request: object, _serving: Serving) -> bool:
    return False


def _nothing(_prepared: object, _serving: Serving) -> int:
    return 0


@dataclass(frozen=True)
class RequestKind(Generic[R, P, Res]):
    """One kind of request. ``name`` labels it (logs, tests); ``prepare`` checks and
    prices a parsed request (a codec thread runs it unless ``inline`` says it is cheap
    enough for the event loop); ``model`` is the version it is served by (None: no
    model's work, e.g. decoding); ``held`` the bytes it holds while it runs, beyond its
    body; ``run`` its work and finish, within the scope (its deadline, its caller);
    ``cache_key`` (encode's): the key of its answer in the response cache (None from it:
    this request's answer is not kept, e.g. the other kind of an ``either``)."""

    name: str
    prepare: Callable[[R, Serving], P]
    model: Callable[[P], ModelInfo | None]
    run: Callable[[P, RequestScope, Serving], Awaitable[Res]]
    held: Callable[[P, Serving], int] = _nothing
    inline: Callable[[R, Serving], bool] = _never
    cache_key: Callable[[P, RequestScope, Serving], bytes | None] | None = None


def either(
    name: str, choose: Callable[[R, Serving], RequestKind[R, Any, Res]]
) -> RequestKind[R, tuple[RequestKind[R, Any, Res], Any], Res]:
    """A kind that is one of several, chosen once its request is parsed (e.g. by what the
    model it names can do, or by the parsed request's type): each step is the chosen
    kind's. ``inline`` asks the kind chosen for the parsed request (``choose`` is cheap:
    a type or a registry look-up), so a kind prepared on the loop stays so when chosen;
    ``cache_key`` is the chosen kind's, None where it keeps no answers."""

    def prepare(request: R, serving: Serving) -> tuple[RequestKind[R, Any, Res], Any]:
        kind = choose(request, serving)
        return kind, kind.prepare(request, serving)

    def model(chosen: tuple[RequestKind[R, Any, Res], Any]) -> ModelInfo | None:
        return chosen[0].model(chosen[1])

    def held(chosen: tuple[RequestKind[R, Any, Res], Any], serving: Serving) -> int:
        return chosen[0].held(chosen[1], serving)

    def run(
        chosen: tuple[RequestKind[R, Any, Res], Any], scope: RequestScope, serving: Serving
    ) -> Awaitable[Res]:
        return chosen[0].run(chosen[1], scope, serving)

    def inline(request: R, serving: Serving) -> bool:
        return choose(request, serving).inline(request, serving)

    def cache_key(
        chosen: tuple[RequestKind[R, Any, Res], Any], scope: RequestScope, serving: Serving
    ) -> bytes | None:
        key = chosen[0].cache_key
        return None if key is None else key(chosen[1], scope, serving)

    return RequestKind(name, prepare, model, run, held=held, inline=inline, cache_key=cache_key)
