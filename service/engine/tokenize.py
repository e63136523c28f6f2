"""The tokenize and decode request kinds (TEI's ``/tokenize`` and ``/decode``, native
``/v1/tokenize``): a model's tokenizer both ways, its work in ``text.py``. Tokenizing
runs on a codec thread that checks the deadline between parts; input embeddings, if
asked for, are run by the batcher after the answer's size was checked."""

from __future__ import annotations

import numpy as np

from service.engine import text
from service.engine.kind import RequestKind, Serving
from service.engine.scope import RequestScope
from service.engine.types import DecodeRequest, DecodeResult, TokenizeRequest, TokenizeResult
from service.model_info import ModelInfo
from service.runtime import ModelRuntime

# The tokens found, the (id, type) pairs to embed, the version that tokenized them.
Tokenized = tuple[TokenizeResult, list[np.ndarray], ModelRuntime]


def _tokenized(request: TokenizeRequest, serving: Serving) -> Tokenized:
    runtime = serving.registry.runtime(request.model)
    result, pairs = text.tokenize_texts(runtime, request, serving.settings)
    return result, pairs, runtime


async def _embedded(prepared: Tokenized, scope: RequestScope, serving: Serving) -> TokenizeResult:
    result, pairs, runtime = prepared
    if not pairs:
        return result
    return text.with_embeddings(result, await serving.execute.embed(runtime, pairs, scope))


def _tokenizer_of(prepared: Tokenized) -> ModelInfo:
    return prepared[2].info


def _decoded(request: DecodeRequest, serving: Serving) -> DecodeResult:
    return text.decode(serving.registry.runtime(request.model), request, serving.settings)


async def _as_is(prepared: DecodeResult, _scope: RequestScope, _serving: Serving) -> DecodeResult:
    return prepared


def _no_model(_prepared: DecodeResult) -> None:
    return None


# Tokens (and their input embeddings, if asked) of texts.
TOKENIZE: RequestKind[TokenizeRequest, Tokenized, TokenizeResult] = RequestKind(
    "tokenize", _tokenized, _tokenizer_of, _embedded
)
# Token ids back to text.
DECODE: RequestKind[DecodeRequest, DecodeResult, DecodeResult] = RequestKind(
    "decode", _decoded, _no_model, _as_is
)
