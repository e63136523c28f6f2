"""TEI bodies <-> the engine's requests and results (no limit or model logic here).

Vectors are the model's own pooling, L2-normalised unless ``normalize: false`` —
the same numbers as ``/v1/encode`` with ``pooling: model``. Answers are JSON arrays
with one row per input, even for a single string (huggingface_hub reads them with
``np.array(..., dtype=float32)`` and expects two dimensions).
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import numpy as np

from service.engine import (
    ClassifyRequest,
    ClassifyResult,
    DecodeRequest,
    DecodeResult,
    EncodeRequest,
    EncodeResult,
    ModelInfo,
    RerankRequest,
    RerankResult,
    ServingLimits,
    SparseRequest,
    SparseResult,
    TokenizeRequest,
    TokenizeResult,
    WireCost,
)
from service.errors import InvalidInput
from service.protocols import wire
from service.protocols.tei import schemas
from service.protocols.tei.schemas import (
    EmbedAllRequest,
    EmbedRequest,
    EmbedSparseRequest,
    SimilarityRequest,
    TextOptions,
    Texts,
)
from service.version import VERSION

Options = TypeVar("Options", bound=TextOptions)
Characters = int  # what a codec keeps for the answer: the inputs' length, for a header

# JSON float lists: one array per input (and per token for embed_all), a few bytes
# of brackets and separators.
COST = WireCost(**wire.JSON_ARRAYS, per_sequence=8.0, fixed=64.0)
# /embed_sparse: per nonzero {"index":N,"value":V}, per vector its list.
SPARSE_COST = WireCost(
    per_float=20.0 + wire.JSON_SPARSE_INDEX + wire.JSON_SPARSE_VALUE, per_array=3.0, fixed=64.0
)
LEFT = ("Left", "left")


def _texts(inputs: Texts) -> list[str]:
    """The texts; TEI refuses an empty one (400 Empty) where the engine would embed its
    special tokens alone."""
    texts = [inputs] if isinstance(inputs, str) else list(inputs)
    for i, text in enumerate(texts):
        if not text:
            raise InvalidInput("is empty: send some text", field=("inputs", i))
    return texts


def _text_request(schema: type[Options], body: bytes) -> tuple[Options, list[str], bool]:
    """A TEI text request's options, its texts and whether to truncate them (this
    server's default is off)."""
    options = wire.parse_options(schema, wire.parse_json_object(body))
    return options, _texts(options.inputs), bool(options.truncate)


def _direction(options: schemas.Truncation) -> str:
    """TEI's truncation_direction (Left/Right, either case) in the engine's terms."""
    return "left" if options.truncation_direction in LEFT else "right"


def _characters(texts: list[str]) -> Characters:
    return sum(len(text) for text in texts)


def _no_prompt(prompt_name: str | None, route: str) -> None:
    """The routes that take no prompt say so (a prompt would change what they answer)."""
    if prompt_name is not None:
        raise InvalidInput(f"is not supported by {route}", field=("prompt_name",))


def embed_request(body: bytes) -> tuple[EncodeRequest, Characters]:
    options, texts, truncate = _text_request(EmbedRequest, body)
    request = EncodeRequest(
        inputs=texts,
        wire_cost=COST,
        pooling="model",
        normalize=options.normalize,
        dimensions=options.dimensions,
        embedding_type=options.embedding_type,
        quantization_ranges=options.ranges(),
        return_embeddings=False,
        truncate=truncate,
        truncation_direction=_direction(options),
        prompt_name=options.prompt_name,
        task=options.task,
    )
    return request, _characters(texts)


def embed_response(result: EncodeResult, _: Characters) -> bytes:
    return wire.dumps([out.pooled for out in result.outputs])


def embed_all_request(body: bytes) -> tuple[EncodeRequest, Characters]:
    options, texts, truncate = _text_request(EmbedAllRequest, body)
    request = EncodeRequest(
        inputs=texts,
        wire_cost=COST,
        return_embeddings=True,
        truncate=truncate,
        truncation_direction=_direction(options),
        prompt_name=options.prompt_name,
        task=options.task,
    )
    return request, _characters(texts)


def embed_all_response(result: EncodeResult, _: Characters) -> bytes:
    return wire.dumps([out.embeddings for out in result.outputs])


def sparse_request(body: bytes) -> tuple[SparseRequest, Characters]:
    options, texts, truncate = _text_request(EmbedSparseRequest, body)
    _no_prompt(options.prompt_name, "/embed_sparse")
    request = SparseRequest(
        texts=texts,
        wire_cost=SPARSE_COST,
        truncate=truncate,
        truncation_direction=_direction(options),
    )
    return request, _characters(texts)


def sparse_response(result: SparseResult, _: Characters) -> bytes:
    return wire.dumps(
        [
            [{"index": i, "value": v} for i, v in zip(vec.indices, vec.values, strict=True)]
            for vec in result.vectors
        ]
    )


def similarity_request(body: bytes) -> tuple[EncodeRequest, Characters]:
    options = wire.parse_options(SimilarityRequest, wire.parse_json_object(body))
    truncate = bool(options.truncate)
    if not options.inputs.sentences:
        raise InvalidInput("is empty: send at least one sentence", field=("inputs", "sentences"))
    # An empty text is 400 Empty, as on TEI's other routes (not its special tokens embedded).
    if not options.inputs.source_sentence:
        raise InvalidInput("is empty: send some text", field=("inputs", "source_sentence"))
    for i, sentence in enumerate(options.inputs.sentences):
        if not sentence:
            raise InvalidInput("is empty: send some text", field=("inputs", "sentences", i))
    texts = [options.inputs.source_sentence, *options.inputs.sentences]
    request = EncodeRequest(
        inputs=texts,
        wire_cost=COST,
        pooling="model",
        normalize=True,
        return_embeddings=False,
        truncate=truncate,
        truncation_direction=_direction(options),
        prompt_name=options.prompt_name,
    )
    return request, _characters(texts)


def similarity_response(result: EncodeResult, _: Characters) -> bytes:
    """Cosine of the source (first) with every other vector (all unit length)."""
    vectors = np.stack([out.pooled for out in result.outputs if out.pooled is not None])
    return wire.dumps([float(x) for x in vectors[1:] @ vectors[0]])


def tokenize_request(body: bytes) -> tuple[TokenizeRequest, list[str]]:
    """The texts are kept: each token's ``text`` is its slice of them."""
    options, texts, truncate = _text_request(schemas.TokenizeRequest, body)
    _no_prompt(options.prompt_name, "/tokenize")
    request = TokenizeRequest(
        texts=texts,
        wire_cost=COST,
        truncate=truncate,
        truncation_direction=_direction(options),
        special_tokens=options.add_special_tokens,
        spans=True,
    )
    return request, texts


def tokenize_response(result: TokenizeResult, texts: list[str]) -> bytes:
    """``[[{id, text, special, start, stop}]]``, always nested; a special token's text is
    the token itself and it has no start or stop (TEI's shape)."""
    answer = []
    for text, item in zip(texts, result.items, strict=True):
        assert item.spans is not None  # asked for in tokenize_request
        answer.append(
            [
                {"id": i, "text": token, "special": True, "start": None, "stop": None}
                if span is None
                else {
                    "id": i,
                    "text": text[span[0] : span[1]],
                    "special": False,
                    "start": span[0],
                    "stop": span[1],
                }
                for i, token, span in zip(item.ids, item.tokens, item.spans, strict=True)
            ]
        )
    return wire.dumps(answer)


def decode_request(body: bytes) -> tuple[DecodeRequest, None]:
    options = wire.parse_options(schemas.DecodeRequest, wire.parse_json_object(body))
    ids = options.ids
    nested = [ids] if not ids or isinstance(ids[0], int) else ids
    return DecodeRequest(ids=cast(list[list[int]], nested), skip=options.skip_special_tokens), None


def decode_response(result: DecodeResult) -> bytes:
    return wire.dumps(result.texts)


# Our pooling names -> TEI's (its ``Pool`` as /info writes it).
TEI_POOLING = {"last": "last_token"}


def rerank_request(body: bytes) -> tuple[RerankRequest, tuple[list[str], bool]]:
    """A /rerank body -> the engine's request, and (texts, return_text) for the answer."""
    options = wire.parse_options(schemas.RerankRequest, wire.parse_json_object(body))
    request = RerankRequest(
        query=options.query,
        documents=options.texts,
        raw_scores=options.raw_scores,
        truncate=bool(options.truncate),
        truncation_direction=_direction(options),
        documents_field="texts",
        instruction=options.instruction,
    )
    return request, (options.texts, options.return_text)


def rerank_response(result: RerankResult, texts: list[str], return_text: bool) -> bytes:
    """TEI's ``[{index, score, text?}]``, best first."""
    return wire.dumps(
        [
            {"index": r.index, "score": r.score} | ({"text": texts[r.index]} if return_text else {})
            for r in result.results
        ]
    )


def predict_request(body: bytes) -> tuple[ClassifyRequest, bool]:
    """A /predict body -> the engine's request, and whether it was one input (TEI then
    answers one list, else a list per input)."""
    options = wire.parse_options(schemas.PredictRequest, wire.parse_json_object(body))
    inputs = options.inputs
    # Two strings are one pair, as TEI reads them; else a list of texts and pairs.
    pair = len(inputs) == 2 and all(isinstance(x, str) for x in inputs)
    single = isinstance(inputs, str) or pair
    listed = [inputs] if single else list(inputs)
    items = [x if isinstance(x, str) else (x[0], x[1]) for x in listed]
    request = ClassifyRequest(
        inputs=items,  # type: ignore[arg-type]
        raw_scores=options.raw_scores,
        truncate=bool(options.truncate),
        truncation_direction=_direction(options),
    )
    return request, single


def predict_response(result: ClassifyResult, single: bool) -> bytes:
    """TEI's ``[{score, label}]`` per input, best first."""
    answers = [
        [
            {"score": float(row[k]), "label": result.labels[k]}
            for k in sorted(range(len(row)), key=lambda k: -row[k])
        ]
        for row in result.scores
    ]
    return wire.dumps(answers[0] if single else answers)


def info(model: ModelInfo, limits: ServingLimits, pooling: str) -> dict[str, Any]:
    """``GET /info`` in TEI's shape, with the limits that really apply here (TEI's
    shape has no prompts: ``GET /v1/models/{name}`` lists them)."""
    pooling = TEI_POOLING.get(pooling, pooling)
    return {
        "model_id": model.name,
        "model_sha": None,
        "model_dtype": "float32",
        "model_type": _model_type(model, pooling),
        "max_concurrent_requests": limits.max_queued_requests,
        "max_input_length": model.max_seq_len,
        "max_batch_tokens": limits.max_batch_tokens,
        "max_batch_requests": None,
        "max_client_batch_size": limits.max_pooled_sequences,
        "auto_truncate": False,
        "tokenization_workers": limits.max_concurrent_codecs,
        "version": f"attnserve {VERSION}",
        "sha": None,
        "docker_label": None,
    }


def _model_type(model: ModelInfo, pooling: str) -> dict[str, Any]:
    """TEI's model type: a reranker or classifier (its labels), else an embedding model."""
    head = model.manifest.head
    if head is None or head.task != "classify":
        return {"embedding": {"pooling": pooling}}
    labels: dict[str, Any] = {"id2label": {str(i): x for i, x in enumerate(head.labels)}}
    labels["label2id"] = {label: i for i, label in enumerate(head.labels)}
    return {"reranker" if head.reranks else "classifier": {"model_id": model.name, **labels}}
