"""The encode request kind: arrays or texts in; embeddings, pooled vectors, attention and
hidden states out (``prepare.py`` checks and prices it, ``execute.py`` runs it,
``finish.py`` shapes its outputs). The one kind whose answers the response cache keeps.
"""

from __future__ import annotations

from service.engine import prepare
from service.engine.kind import RequestKind, Serving
from service.engine.prepare import PreparedEncode
from service.engine.response_cache import request_key
from service.engine.scope import RequestScope
from service.engine.types import ArrayInput, EncodeRequest, EncodeResult
from service.model_info import ModelInfo


def prepared(request: EncodeRequest, serving: Serving) -> PreparedEncode:
    """Check everything, before any graph runs, on the version the request resolves to."""
    registry = serving.registry
    resolved = request.resolved and registry.runtime_of(request.resolved)
    runtime = resolved or registry.runtime(request.model, request.model_version)
    return prepare.prepare(request, runtime, serving.settings)


def _inline(request: EncodeRequest, serving: Serving) -> bool:
    """Arrays only: their checks are cheap enough for the event loop (the count first:
    reading the items of a lazy list may cost per item)."""
    prepare.check_count(request, serving.settings)
    return all(isinstance(item, ArrayInput) for item in request.inputs)


def _model(prepared: PreparedEncode) -> ModelInfo:
    return prepared.model


def _held(prepared: PreparedEncode, _serving: Serving) -> int:
    return prepared.work_bytes


async def run(prepared: PreparedEncode, scope: RequestScope, serving: Serving) -> EncodeResult:
    """Run on the version it was prepared for (see ``execute.py``)."""
    runtime = prepared.runtime or serving.registry.serving(prepared.model.name)
    return await serving.execute.run(
        prepared, runtime, deadline=scope.deadline, until=scope.cancelled, timing=scope.timing
    )


def _cache_key(prepared: PreparedEncode, scope: RequestScope, serving: Serving) -> bytes:
    """With API keys, answers are kept per caller's key."""
    keys = serving.settings.api_key is not None
    return request_key(
        prepared,
        serving.registry.load_serial(prepared.runtime),
        (scope.caller.authorization or "") if keys else None,
    )


ENCODE: RequestKind[EncodeRequest, PreparedEncode, EncodeResult] = RequestKind(
    "encode", prepared, _model, run, held=_held, inline=_inline, cache_key=_cache_key
)
