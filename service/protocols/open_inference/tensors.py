"""Open Inference Protocol tensors <-> the engine's types, whatever framed them.

The framing (JSON with the binary tensor extension in ``kserve_v2/codec.py``;
protobuf messages in ``kserve_grpc/codec.py``) turns a body into :class:`InputTensor` s, each
holding its elements either as raw little-endian bytes or as (nested) data
values; this module gives them meaning: which inputs a model takes, their
datatypes and shapes, the rows and texts the engine reads, and the output
arrays of an answer.

Inputs: ``inputs_embeds`` FP32 [batch, seq, d_model] with an optional
``attention_mask`` (INT64, INT32 or BOOL [batch, seq], ones then zeros per row;
all ones when absent), or ``text`` BYTES [batch] for models with a tokenizer.
The rows are un-padded here (``padding.py``: the engine sees only sequences,
which batch with other requests by length) and the answer is re-padded to the
request's seq (to the longest text for text input) with zeros. Counts come from
declared shapes and are checked before any element is read: a body of millions
of tiny elements costs its count, not a million objects.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, overload

import numpy as np

from model_export.manifest import graph_io
from service.engine import (
    ArrayInput,
    EncodeRequest,
    EncodeResult,
    InputItem,
    ModelInfo,
    WireCost,
)
from service.errors import InvalidInput, quoted
from service.protocols import wire
from service.protocols.open_inference import attention
from service.protocols.open_inference.attention import AttentionParameters
from service.protocols.open_inference.padding import lengths_of, repad

INPUT_TEXT = "text"
# A reranker's model (rerank.py): a query and its documents in, a score per document out.
RERANK_INPUTS = [("query", "BYTES", [1]), ("documents", "BYTES", [-1])]
OUTPUT_SCORES = "scores"
RERANK_OUTPUTS = [(OUTPUT_SCORES, "FP32", [-1])]
# A classifier's model (classify.py): texts in, a score per label and the labels out.
CLASSIFY_INPUTS = [(INPUT_TEXT, "BYTES", [-1])]
OUTPUT_LABELS = "labels"
# A late-interaction model's (multi_vector.py): texts in, their token vectors (padded to
# the longest, with each one's count), dense and sparse (CSR) vectors out; or, as a
# reranker's, a query and documents in, MaxSim scores out.
OUTPUT_MULTI_VECTORS = "multi_vectors"
OUTPUT_MULTI_VECTOR_LENGTHS = "multi_vector_lengths"
OUTPUT_DENSE = "dense"
OUTPUT_SPARSE_INDICES = "sparse_indices"
OUTPUT_SPARSE_VALUES = "sparse_values"
OUTPUT_SPARSE_LENGTHS = "sparse_lengths"
MULTI_VECTOR_INPUTS = [*CLASSIFY_INPUTS, *RERANK_INPUTS]
OUTPUT_POOLED = "pooled"
OUTPUT_MASK = graph_io.INPUT_MASK  # the mask the answer is padded by (for text input)
NUMERIC = {"FP32": "<f4", "INT64": "<i8", "INT32": "<i4", "BOOL": "|b1"}
# An answer's datatype by its array's dtype (quantized pooled vectors: INT8, UINT8).
DATATYPES = {
    "<f4": "FP32",
    "<f2": "FP16",
    "<i8": "INT64",
    "<i4": "INT32",
    "|i1": "INT8",
    "|u1": "UINT8",
}
MASK_TYPES = ("INT64", "INT32", "BOOL")
POOLINGS = ("mean", "cls", "max", "last")
# Dimensions a tensor may declare (ours have at most 3); data is nested no deeper.
MAX_RANK = 8
# Upper bounds of an answer: raw float32 bytes, or flat JSON data lists; each output's
# header entry; the envelope once. Binary answers exist three times at their peak (the
# re-padded arrays, their bytes, the joined body: measured, a 7 x 256 attention answer
# of 132 MB peaked at +738 MiB RSS with 427 MB counted before this), JSON ones twice.
COST = {
    True: WireCost(
        per_float=4.0, per_half=2.0, per_array=0.0, per_sequence=0.0, fixed=1024.0, copies=3.0
    ),
    False: WireCost(per_float=17.0, per_sequence=20.0 * 8, fixed=1024.0, copies=2.0),
}


@dataclass(frozen=True)
class InputTensor:
    """One input as framed: its elements as ``raw`` bytes or as ``data`` values."""

    name: Any  # as sent: checked against the model's inputs
    datatype: Any
    shape: Any
    raw: memoryview | None = None
    data: Any = None
    has_data: bool = False  # ``data`` was given (it may be JSON null)


@dataclass(frozen=True)
class Options:
    """The request's parameters, typed."""

    pooling: str = "none"
    normalize: bool = False
    truncate: bool = False
    attention: AttentionParameters = field(default_factory=AttentionParameters)
    # ``pooled`` quantized: int8/uint8 (the model's ranges), binary/ubinary (INT8/UINT8)
    embedding_type: str = "float"


@dataclass(frozen=True)
class Reply:
    """What the answer needs from the request: names, framing and padding."""

    model: str
    request_id: str | None
    outputs: dict[str, bool]  # requested output -> as raw bytes
    rows: Rows | None  # the embeds rows, whose lengths pad the answer (None for text)
    pad_to: int  # the request's seq (0 for text: the longest)


class Rows(Sequence[InputItem]):
    """The rows of ``inputs_embeds`` as lazy ArrayInputs, as many as its batch axis says.

    The mask is read (and each row's length found) only when the engine reads a row,
    after it has checked the batch size: a zero-size tensor declaring 2**40 rows is
    refused by that count, never scanned.
    """

    def __init__(self, embeds: np.ndarray, mask: np.ndarray | None) -> None:
        self._embeds, self._mask = embeds, mask

    def __len__(self) -> int:
        return int(self._embeds.shape[0])

    @cached_property
    def lengths(self) -> list[int]:
        if self._mask is None:
            return [int(self._embeds.shape[1])] * len(self)
        return lengths_of(self._mask)

    @overload
    def __getitem__(self, index: int) -> InputItem: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[InputItem]: ...
    def __getitem__(self, index: int | slice) -> InputItem | Sequence[InputItem]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        n = self.lengths[index]
        embeds = self._embeds
        return ArrayInput(rows=n, decode=lambda: embeds[index, :n])


def available_outputs(info: ModelInfo) -> list[tuple[str, str, list[int]]]:
    """(name, datatype, shape) of every output this model can answer; -1: dynamic."""
    if info.manifest.task == "rerank":  # see rerank.py
        return RERANK_OUTPUTS
    if info.manifest.task == "classify" and info.manifest.head is not None:  # classify.py
        labels = len(info.manifest.head.labels)
        return [(OUTPUT_SCORES, "FP32", [-1, labels]), (OUTPUT_LABELS, "BYTES", [labels])]
    if is_multi_vector(info):  # multi_vector.py
        return [*multi_vector_outputs(info), *RERANK_OUTPUTS]
    cfg = info.config
    outputs = [
        (graph_io.OUTPUT_HIDDEN, "FP32", [-1, -1, cfg.d_model]),
        (graph_io.OUTPUT_ATTENTIONS, "FP32", [-1, cfg.n_layers, cfg.n_heads, -1, -1]),
        (attention.OUTPUT_INDICES, "INT32", [-1, cfg.n_layers, cfg.n_heads, -1, -1]),
        (attention.OUTPUT_SUMMARIES, "FP32", [-1, -1, cfg.n_layers, cfg.n_heads]),
    ]
    if info.manifest.has_hidden_states:
        outputs.append(
            (graph_io.OUTPUT_HIDDEN_STATES, "FP32", [-1, cfg.n_layers + 1, -1, cfg.d_model])
        )
    outputs += [
        (OUTPUT_POOLED, "FP32", [-1, info.pooled_width]),
        (OUTPUT_MASK, "INT64", [-1, -1]),
    ]
    return outputs


def is_multi_vector(info: ModelInfo) -> bool:
    """A late-interaction model without a head of its own: its form is multi_vector.py's."""
    return info.manifest.late_interaction is not None and info.manifest.task == "embed"


def multi_vector_outputs(info: ModelInfo) -> list[tuple[str, str, list[int]]]:
    """A late-interaction model's outputs for its texts (multi_vector.py): the token
    vectors and their counts, its dense vector with a pooling of its own, its sparse
    vector with a sparse head (bge-m3)."""
    late = info.manifest.late_interaction
    assert late is not None
    outputs = [
        (OUTPUT_MULTI_VECTORS, "FP32", [-1, -1, late.dim]),
        (OUTPUT_MULTI_VECTOR_LENGTHS, "INT32", [-1]),
    ]
    if info.manifest.pooling is not None:
        outputs.append((OUTPUT_DENSE, "FP32", [-1, info.pooled_width]))
    if late.sparse:
        outputs += [
            (OUTPUT_SPARSE_INDICES, "INT64", [-1]),
            (OUTPUT_SPARSE_VALUES, "FP32", [-1]),
            (OUTPUT_SPARSE_LENGTHS, "INT32", [-1]),
        ]
    return outputs


def asks_scores(input_names: Sequence[Any]) -> bool:
    """A late-interaction model's reranker form: its inputs are a query and documents."""
    return any(name in (n for n, _, _ in RERANK_INPUTS) for name in input_names)


def default_outputs(
    info: ModelInfo, params: dict[str, Any], input_names: Sequence[Any] = ()
) -> list[str]:
    """The outputs answered when a request names none: each one its parameters ask for
    (pooled vectors with a pooling, attention's indices and summaries with theirs); a
    late-interaction model's for the inputs sent (scores for a query and documents,
    else every output it has for texts)."""
    if is_multi_vector(info):
        if asks_scores(input_names):
            return [OUTPUT_SCORES]
        return [name for name, _, _ in multi_vector_outputs(info)]
    asked = {
        OUTPUT_POOLED: params.get("pooling", "none") != "none",
        attention.OUTPUT_INDICES: params.get("attention_top_k") is not None
        or params.get("attention_threshold") is not None,
        attention.OUTPUT_SUMMARIES: bool(params.get("attention_summaries")),
    }
    return [name for name, _, _ in available_outputs(info) if asked.get(name, True)]


def model_inputs(info: ModelInfo) -> list[tuple[str, str, list[int]]]:
    if info.manifest.task == "rerank":  # see rerank.py
        return RERANK_INPUTS
    if info.manifest.task == "classify":  # see classify.py
        return CLASSIFY_INPUTS
    if is_multi_vector(info):  # see multi_vector.py
        return MULTI_VECTOR_INPUTS
    inputs = [
        (graph_io.INPUT_EMBEDS, "FP32", [-1, -1, info.config.d_model]),
        (graph_io.INPUT_MASK, "INT64", [-1, -1]),
    ]
    if info.has_tokenizer:
        inputs.append((INPUT_TEXT, "BYTES", [-1]))
    return inputs


def encode_request(
    inputs: list[InputTensor],
    outputs: dict[str, bool],
    options: Options,
    info: ModelInfo,
    version: str | None,
    request_id: str | None,
) -> tuple[EncodeRequest, Reply]:
    """Decoded input tensors and requested outputs -> (EncodeRequest, what the answer needs)."""
    if not inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    allowed = {name: dtype for name, dtype, _ in model_inputs(info)}
    tensors: dict[str, np.ndarray | Texts] = {}
    for spec in inputs:
        name, tensor = decode_input(spec, allowed)
        if name in tensors:
            raise InvalidInput(f"input {quoted(name)} is given twice")
        tensors[name] = tensor
    if options.pooling != "none" and options.pooling not in POOLINGS:
        raise InvalidInput(
            f"parameters.pooling must be one of {POOLINGS}, got {quoted(options.pooling)}"
        )
    if OUTPUT_POOLED in outputs and options.pooling == "none":
        raise InvalidInput("output 'pooled' needs parameters.pooling (mean, cls, max or last)")
    attention_spec = options.attention.spec(outputs)
    items, rows, pad_to = _items(tensors)
    request = EncodeRequest(
        inputs=items,
        wire_cost=COST[all(outputs.values())],
        model=info.name,
        model_version=version,
        resolved=info,
        return_attention=attention.asks_attention(outputs),
        attention=attention_spec,
        return_hidden_states=graph_io.OUTPUT_HIDDEN_STATES in outputs,
        pooling=options.pooling,  # type: ignore[arg-type]  # checked above
        normalize=options.normalize,
        embedding_type=options.embedding_type,
        return_embeddings=graph_io.OUTPUT_HIDDEN in outputs,
        truncate=options.truncate,
        pad_to=pad_to,
    )
    return request, Reply(info.name, request_id, outputs, rows, pad_to)


def _items(
    tensors: dict[str, np.ndarray | Texts],
) -> tuple[Sequence[InputItem], Rows | None, int]:
    """The engine's input items, the embeds rows (None for text) and the seq to pad to."""
    if INPUT_TEXT in tensors:
        if len(tensors) > 1:
            raise InvalidInput("send either 'text' or 'inputs_embeds' (with attention_mask)")
        texts = tensors[INPUT_TEXT]
        assert isinstance(texts, Texts)
        return texts, None, 0
    embeds = tensors.get(graph_io.INPUT_EMBEDS)
    if not isinstance(embeds, np.ndarray):
        raise InvalidInput(f"input {graph_io.INPUT_EMBEDS!r} (or 'text') is required")
    if embeds.ndim != 3:
        raise InvalidInput(
            f"input {graph_io.INPUT_EMBEDS!r} must be [batch, seq, d_model], got shape "
            f"{list(embeds.shape)}"
        )
    mask = tensors.get(graph_io.INPUT_MASK)
    assert mask is None or isinstance(mask, np.ndarray)
    if mask is not None and mask.shape != embeds.shape[:2]:
        raise InvalidInput(
            f"input {graph_io.INPUT_MASK!r} has shape {list(mask.shape)}; "
            f"{graph_io.INPUT_EMBEDS!r} needs {list(embeds.shape[:2])}"
        )
    rows = Rows(embeds, mask)
    return rows, rows, int(embeds.shape[1])


def decode_input(spec: InputTensor, allowed: dict[str, str]) -> tuple[str, np.ndarray | Texts]:
    """One input -> (name, its tensor): datatype, shape and element count checked first."""
    name = spec.name
    if not isinstance(name, str) or name not in allowed:
        raise InvalidInput(f"unknown input {quoted(name)}: this model takes {sorted(allowed)}")
    datatype = spec.datatype
    wanted = MASK_TYPES if name == graph_io.INPUT_MASK else (allowed[name],)
    if not isinstance(datatype, str) or datatype not in wanted:
        raise InvalidInput(
            f"input {quoted(name)} must have datatype {' or '.join(wanted)}, got {quoted(datatype)}"
        )
    shape = _shape(spec.shape, name)
    count = math.prod(shape)
    if spec.raw is not None:
        raw = spec.raw
        if datatype == "BYTES":
            return name, Texts(count, lambda: _bytes_elements(raw, count, name))
        dtype = np.dtype(NUMERIC[datatype])
        if len(raw) != count * dtype.itemsize:
            raise InvalidInput(
                f"input {quoted(name)}: binary_data_size {len(raw):,} does not match shape "
                f"{shape} of {datatype} ({count * dtype.itemsize:,} bytes)"
            )
        return name, _reshaped(np.frombuffer(raw, dtype=dtype), shape, name)
    if not spec.has_data:
        raise InvalidInput(f"input {quoted(name)} has neither 'data' nor binary_data_size")
    data = spec.data
    if datatype == "BYTES":
        flat = _flatten(data, max(len(shape), 1), count, name)
        if len(flat) != count or not all(isinstance(x, str) for x in flat):
            raise InvalidInput(
                f"input {quoted(name)}: 'data' must hold {count} strings for shape {shape}"
            )
        return name, Texts(count, lambda: [x.encode() for x in flat])
    if datatype == "BOOL":
        try:
            array = np.asarray(data)
        except (ValueError, TypeError):
            array = np.asarray([object()])
    else:
        parsed = wire.numbers(data)
        array = np.asarray([object()]) if parsed is None else parsed
    kinds = "b" if datatype == "BOOL" else "iu" if datatype.startswith("INT") else "fiu"
    if array.dtype.kind not in kinds or array.size != count:
        raise InvalidInput(
            f"input {quoted(name)}: 'data' must be {count} {datatype} values (flat or nested, "
            f"row-major) for shape {shape}"
        )
    with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused as such
        return name, _reshaped(array.astype(NUMERIC[datatype]), shape, name)


def _shape(shape: Any, name: str) -> list[int]:
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise InvalidInput(
            f"input {quoted(name)}: 'shape' must be a list of at most {MAX_RANK} non-negative "
            "integers"
        )
    return shape


def _reshaped(array: np.ndarray, shape: list[int], name: str) -> np.ndarray:
    """``array`` in ``shape``; a zero-size tensor may declare dimensions numpy cannot hold."""
    try:
        return array.reshape(shape)
    except ValueError:
        raise InvalidInput(f"input {quoted(name)}: shape {shape} cannot be represented") from None


def _flatten(data: Any, depth: int, count: int, name: str) -> list[Any]:
    """Row-major elements of ``data`` nested at most ``depth`` deep; stops at the first
    element beyond ``count`` (iterative: a deep nesting must not reach the recursion limit)."""
    flat: list[Any] = []
    stack = [iter(data if isinstance(data, list) else [data])]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= depth:
                    raise InvalidInput(
                        f"input {quoted(name)}: 'data' is nested deeper than its {depth} "
                        "dimension(s)"
                    )
                stack.append(iter(item))
                break
            flat.append(item)
            if len(flat) > count:
                raise InvalidInput(
                    f"input {quoted(name)}: 'data' holds more than the {count} elements of its "
                    "shape"
                )
        else:
            stack.pop()
    return flat


def _bytes_elements(raw: memoryview, count: int, name: str) -> list[bytes]:
    """Triton's BYTES serialisation: each element a 4-byte little-endian length, then bytes.
    Stops at the first element beyond ``count``."""
    elements: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise InvalidInput(f"input {quoted(name)}: a BYTES element's length is cut short")
        if len(elements) == count:
            raise InvalidInput(
                f"input {quoted(name)}: more BYTES elements than the {count} of its shape"
            )
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise InvalidInput(f"input {quoted(name)}: a BYTES element runs past binary_data_size")
        elements.append(bytes(raw[offset : offset + size]))
        offset += size
    if len(elements) != count:
        raise InvalidInput(
            f"input {quoted(name)}: {len(elements)} BYTES elements for {count} in its shape"
        )
    return elements


class Texts(Sequence[InputItem]):
    """The ``text`` tensor's elements as strings, as many as its shape declares.

    Its elements are parsed only when the engine first reads one, after it has
    checked their count: a body of millions of tiny elements is refused by its
    declared shape, not after millions of objects were built.
    """

    def __init__(self, count: int, load: Callable[[], list[bytes]]) -> None:
        self._count, self._load = count, load

    def __len__(self) -> int:
        return self._count

    @cached_property
    def _texts(self) -> list[str]:
        try:
            return [t.decode("utf-8") for t in self._load()]
        except UnicodeDecodeError:
            raise InvalidInput("input 'text': elements must be UTF-8") from None

    @overload
    def __getitem__(self, index: int) -> InputItem: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[InputItem]: ...
    def __getitem__(self, index: int | slice) -> InputItem | Sequence[InputItem]:
        return self._texts[index]


def output_arrays(result: EncodeResult, reply: Reply) -> list[tuple[str, str, np.ndarray]]:
    """(name, datatype, little-endian array) of every requested output, in order."""
    lengths = reply.rows.lengths if reply.rows is not None else [o.length for o in result.outputs]
    length = max(reply.pad_to, *lengths)
    arrays = [(name, _output(result, name, lengths, length)) for name in reply.outputs]
    return [(name, DATATYPES[array.dtype.str], array) for name, array in arrays]


def _output(result: EncodeResult, name: str, lengths: list[int], length: int) -> np.ndarray:
    outs = result.outputs
    if name == OUTPUT_MASK:
        return (np.arange(length)[None, :] < np.array(lengths)[:, None]).astype("<i8")
    if name == OUTPUT_POOLED:
        pooled = np.stack([o.pooled for o in outs if o.pooled is not None])
        return pooled if pooled.dtype.kind in "iu" else wire.float32_le(pooled)  # quantized
    if name in (graph_io.OUTPUT_ATTENTIONS, *attention.OUTPUTS):
        return attention.output(outs, name, length)
    attr = {
        graph_io.OUTPUT_HIDDEN: "embeddings",
        graph_io.OUTPUT_HIDDEN_STATES: "hidden_states",
    }[name]
    arrays = [getattr(o, attr) for o in outs]
    return wire.float32_le(repad(arrays, length, graph_io.TOKEN_AXES[name]))
