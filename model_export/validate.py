"""Prove an exported graph equal to the PyTorch encoder, within a stated tolerance.

Export is not done until this passes: the graphs are run by onnxruntime on
several shapes (one token, one sequence, ragged batches with padding, long
sequences) and compared output by output with PyTorch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from model_export import graph_io
from model_export.compact_attention import row_summaries
from model_export.config import EncoderConfig
from model_export.model import Encoder, TokenEmbeddings
from model_export.progress import Progress

log = logging.getLogger(__name__)

DEFAULT_ATOL = graph_io.DEFAULT_ATOL
DEFAULT_RTOL = graph_io.DEFAULT_RTOL
# float16 rounds to nearest: |fp16(x) - x| <= 2^-11 |x| (half its 2^-10 ulp) for normal x.
HALF_RTOL = 2.0**-11
# The step that computes PyTorch's outputs, which every encoder graph is checked against.
PYTORCH_OUTPUTS = "PyTorch's outputs"
# What the service runs for text asking only for embeddings: two graphs, one after the other.
TEXT_PATH = f"{graph_io.GRAPH_TOKEN_EMBEDDINGS} + {graph_io.GRAPH_EMBEDDINGS}"


class ValidationError(AssertionError):
    """An ONNX output differs from PyTorch by more than the tolerance."""

    def __init__(
        self, graph: str, output: str, shape: tuple[int, ...], max_abs_diff: float, atol: float
    ) -> None:
        super().__init__(
            f"{graph}: output {output!r} at shape {list(shape)} differs from PyTorch by "
            f"{max_abs_diff:.3g}, beyond atol {atol:g} + rtol {DEFAULT_RTOL:g} x |PyTorch|"
        )
        self.graph, self.output, self.shape = graph, output, shape
        self.max_abs_diff, self.atol = max_abs_diff, atol


@dataclass(frozen=True)
class CheckResult:
    """One (graph, case, output) comparison."""

    graph: str
    case: str
    output: str
    shape: list[int]
    max_abs_diff: float
    atol: float
    excess: float  # largest |onnx - torch| - rtol * |torch|: passes when <= atol

    @property
    def passed(self) -> bool:
        return self.excess <= self.atol


@dataclass(frozen=True)
class Case:
    """A named input batch: sequence lengths, padded to the longest."""

    name: str
    lengths: tuple[int, ...]


def default_cases(max_seq_len: int) -> list[Case]:
    long = min(max_seq_len, 128)
    return [
        Case("single token", (1,)),
        Case("one sequence", (7,)),
        Case("equal batch", (9, 9, 9)),
        Case("ragged batch with padding", (16, 5, 1, 11)),
        Case("long ragged", (long, long // 3)),
    ]


def make_inputs(lengths: tuple[int, ...], d_model: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random embeddings and a 1/0 mask for sequences of ``lengths``, zero-padded."""
    rng = np.random.default_rng(seed)
    seq = max(lengths)
    embeds = np.zeros((len(lengths), seq, d_model), dtype=np.float32)
    mask = np.zeros((len(lengths), seq), dtype=np.int64)
    for i, n in enumerate(lengths):
        embeds[i, :n] = rng.standard_normal((n, d_model), dtype=np.float32)
        mask[i, :n] = 1
    return embeds, mask


def differences(
    got: np.ndarray, want: np.ndarray, rtol: float = DEFAULT_RTOL
) -> tuple[float, float]:
    """(largest |got - want|, largest |got - want| - rtol * |want|): the second is what
    must be <= atol (numpy.allclose's rule). Both inf when shapes differ or ``got``
    holds NaN/Inf.
    """
    if got.shape != want.shape or not np.isfinite(got).all():
        return float("inf"), float("inf")
    if not got.size:
        return 0.0, 0.0
    diff = np.abs(got - want)
    return float(diff.max()), float(np.max(diff - rtol * np.abs(want)))


def new_session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def token_inputs(
    embeddings: TokenEmbeddings, lengths: tuple[int, ...], seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random token ids and types (0 at padding) for sequences of ``lengths``, and the
    1/0 mask: ([B, T], [B, T], [B, T]) int64."""
    rng = np.random.default_rng(seed)
    _, mask = make_inputs(lengths, 1, seed=seed)
    vocab, types = embeddings.word.num_embeddings, embeddings.token_type.num_embeddings
    ids = rng.integers(0, vocab, size=mask.shape, dtype=np.int64) * mask
    type_ids = rng.integers(0, types, size=mask.shape, dtype=np.int64) * mask
    return ids, type_ids, mask


@dataclass(frozen=True)
class Reference:
    """One case's inputs and PyTorch's outputs on them, which every graph is checked
    against: computed once per export (``pytorch_references``)."""

    case: Case
    embeds: np.ndarray  # float32 [B, T, d]: what the encoder graphs are fed
    mask: np.ndarray  # int64 [B, T]
    tokens: tuple[np.ndarray, np.ndarray] | None  # the ids and types embedded, if any
    outputs: dict[str, np.ndarray]  # hidden state, maps, hidden states, value norms
    task: np.ndarray | None = None  # int64 [B]: each row's task (models with adapters)

    @property
    def task_feeds(self) -> dict[str, np.ndarray]:
        """The task input of a model with task adapters; nothing for the others."""
        return {} if self.task is None else {graph_io.INPUT_TASK: self.task}


def case_tasks(tasks: int, rows: int, case: int) -> np.ndarray | None:
    """Each row's task in validation ``case`` (int64 [rows]): the rows of a batch name
    different tasks, 0 (no adapter) among them, and the cases cycle through all of
    them. None for a model without task adapters."""
    if not tasks:
        return None
    return (np.arange(rows, dtype=np.int64) + case) % (tasks + 1)


def pytorch_references(
    encoder: Encoder, embeddings: TokenEmbeddings | None = None, cases: list[Case] | None = None
) -> list[Reference]:
    """Each case's inputs and PyTorch's outputs (``validate_model_dir`` says which).

    With ``embeddings`` the inputs are what the service feeds: the token embeddings of
    random ids, padding (id 0) included, which the mask leaves out. So the graphs that
    take ids (the text path, BM42's, a head's) are checked against the same outputs."""
    cases = cases if cases is not None else default_cases(encoder.config.max_seq_len)
    if embeddings is not None:  # no longer than its position table
        cases = [
            Case(c.name, tuple(min(n, embeddings.max_tokens) for n in c.lengths)) for c in cases
        ]
    references = []
    for i, case in enumerate(cases):
        tokens = None
        task = case_tasks(encoder.config.lora_tasks, len(case.lengths), i)
        task_t = None if task is None else torch.from_numpy(task)
        if embeddings is None:
            embeds, mask = make_inputs(case.lengths, encoder.config.d_model, seed=i)
        else:
            ids, type_ids, mask = token_inputs(embeddings, case.lengths, seed=i)
            with torch.no_grad():
                looked_up = embeddings(torch.from_numpy(ids), torch.from_numpy(type_ids), task_t)
            embeds, tokens = looked_up.numpy(), (ids, type_ids)
        with torch.no_grad():
            hidden, attn, states, norms = encoder(
                torch.from_numpy(embeds),
                torch.from_numpy(mask),
                hidden_states=True,
                value_norms=True,
                task=task_t,
            )
        assert attn is not None and states is not None and norms is not None
        outputs = {
            graph_io.OUTPUT_HIDDEN: hidden.numpy(),
            graph_io.OUTPUT_ATTENTIONS: attn.numpy(),
            graph_io.OUTPUT_HIDDEN_STATES: states.numpy(),
            graph_io.OUTPUT_VALUE_NORMS: norms.numpy(),
        }
        references.append(Reference(case, embeds, mask, tokens, outputs, task))
    return references


def validate_model_dir(
    encoder: Encoder,
    model_dir: Path,
    *,
    atol: float = DEFAULT_ATOL,
    cases: list[Case] | None = None,
    embeddings: TokenEmbeddings | None = None,
    progress: Progress | None = None,
    references: list[Reference] | None = None,
) -> list[CheckResult]:
    """Compare every graph in ``model_dir`` with ``encoder``; raise on the first failure.

    With ``embeddings`` the graphs are fed what they will be served: token embeddings of
    random ids. Without, N(0, 1) vectors, which a deep, wide model (MPNet-base: 12
    layers, 768-d) turns into attention no text produces, where float32 kernels drift
    apart by ~1e-3 through the layers while real inputs stay within ~1e-6. PyTorch's
    outputs (``references``, else computed here) are computed once per case, then each
    graph is checked on every case (a ``progress`` step each).
    """
    progress = progress or Progress("")
    if references is None:
        with progress.step("validate", PYTORCH_OUTPUTS):
            references = pytorch_references(encoder, embeddings, cases)
    results: list[CheckResult] = []
    for graph in validated_graphs(model_dir):
        with progress.step("validate", graph):
            session = new_session(model_dir / graph)
            for i, ref in enumerate(references):
                results += _check_graph(graph, session, ref, encoder.config, i, atol)
    log.info(
        "validated %d outputs, max abs diff %.3g",
        len(results),
        max(r.max_abs_diff for r in results),
    )
    return results


def validated_graphs(model_dir: Path) -> list[str]:
    """The encoder graphs in ``model_dir``, as ``validate_model_dir`` checks them."""
    # The compact graphs are optional (--no-compact-attention).
    return [name for name in graph_io.GRAPH_OUTPUTS if (model_dir / name).is_file()]


def _check_graph(
    graph: str,
    session: ort.InferenceSession,
    ref: Reference,
    config: EncoderConfig,
    seed: int,
    atol: float,
) -> list[CheckResult]:
    """``graph`` on one case against PyTorch's outputs; raise on a mismatch."""
    names = list(graph_io.GRAPH_OUTPUTS[graph])
    attn, expected = ref.outputs[graph_io.OUTPUT_ATTENTIONS], dict(ref.outputs)
    feeds = {graph_io.INPUT_EMBEDS: ref.embeds, graph_io.INPUT_MASK: ref.mask} | ref.task_feeds
    if graph == graph_io.GRAPH_COMPACT_ATTENTION:
        feeds[graph_io.INPUT_TOP_K] = np.zeros(min(3, ref.mask.shape[1]), dtype=np.int64)
    if graph == graph_io.GRAPH_SELECTED_ATTENTION:
        feeds.update(selection_feeds(config.n_layers, config.n_heads, seed))
        expected.update(selected_as_checked(attn, feeds))
    got = session.run(names, feeds)
    if graph == graph_io.GRAPH_COMPACT_ATTENTION:
        got = compact_as_checked(got, attn, expected)
    results = []
    for name, value in zip(names, got, strict=True):
        # float16 maps: within float16's rounding (half an ulp, 2^-11 relative).
        rtol = HALF_RTOL if value.dtype == np.float16 else DEFAULT_RTOL
        diff, excess = differences(value.astype(np.float32), expected[name], rtol)
        result = CheckResult(graph, ref.case.name, name, list(value.shape), diff, atol, excess)
        results.append(result)
        if not result.passed:
            raise ValidationError(graph, name, tuple(value.shape), diff, atol)
    return results


def selection_feeds(n_layers: int, n_heads: int, case: int) -> dict[str, np.ndarray]:
    """The selected-maps graph's inputs for validation ``case``: each case marks the
    layers differently (float32, float16, none), heads in reversed order, one fewer
    each case (down to one)."""
    cycle = (graph_io.LAYER_FLOAT32, graph_io.LAYER_FLOAT16, graph_io.LAYER_DROPPED)
    marks = [cycle[(i + case) % 3] for i in range(n_layers)]
    heads = list(range(n_heads))[::-1][: max(1, n_heads - case)]
    return {
        graph_io.INPUT_LAYERS: np.array(marks, dtype=np.int64),
        graph_io.INPUT_HEADS: np.array(heads, dtype=np.int64),
    }


def selected_as_checked(attn: np.ndarray, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """PyTorch's full maps (B, L, h, T, T) cut to what the selected-maps graph's outputs
    hold for ``feeds``."""
    marks, heads = feeds[graph_io.INPUT_LAYERS], feeds[graph_io.INPUT_HEADS]
    return {
        name: attn[:, marks == mark][:, :, heads]
        for name, mark in (
            (graph_io.OUTPUT_SELECTED, graph_io.LAYER_FLOAT32),
            (graph_io.OUTPUT_SELECTED_HALF, graph_io.LAYER_FLOAT16),
        )
    }


def compact_as_checked(
    got: list[np.ndarray], attn: np.ndarray, expected: dict[str, np.ndarray]
) -> list[np.ndarray]:
    """The compact graph's outputs in a form PyTorch's full maps check exactly.

    Its top-k weights are checked against PyTorch's sorted top-k values, which two
    near-equal keys swapping places (float rounding) cannot change; its indices are
    checked by the weights they point at in PyTorch's maps, which must be the graph's
    own (the swapped keys' weights are equal to rounding). Summaries are computed by
    ``compact_attention.row_summaries`` from PyTorch's maps, layer by layer.
    """
    hidden, weights, indices, summaries = got
    k = weights.shape[-1]
    full = torch.from_numpy(attn)  # (B, L, h, T, T)
    expected[graph_io.OUTPUT_TOP_WEIGHTS] = torch.topk(full, k, dim=-1).values.numpy()
    expected[graph_io.OUTPUT_TOP_INDICES] = weights  # what the indices point at, below
    pointed = np.take_along_axis(attn, indices.astype(np.int64), axis=-1)
    expected[graph_io.OUTPUT_SUMMARIES] = torch.stack(
        [row_summaries(full[:, layer]) for layer in range(full.shape[1])], dim=1
    ).numpy() * (attn.sum(axis=-1, keepdims=True) > 0)  # padded query rows are 0
    return [hidden, weights, pointed, summaries]


def validate_token_embeddings(
    embeddings: TokenEmbeddings, path: Path, *, atol: float = DEFAULT_ATOL
) -> list[CheckResult]:
    """Compare the token-embedding graph with PyTorch on a few id batches."""
    session = new_session(path)
    rng = np.random.default_rng(0)
    vocab, types = embeddings.word.num_embeddings, embeddings.token_type.num_embeddings
    results: list[CheckResult] = []
    for case, (batch, seq) in (
        ("one token", (1, 1)),
        ("batch", (3, 17)),
        ("long", (2, min(128, embeddings.max_tokens))),
    ):
        ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
        type_ids = rng.integers(0, types, size=(batch, seq), dtype=np.int64)
        tasks = 0 if embeddings.word_lora is None else embeddings.word_lora["a"].shape[0] - 1
        task = case_tasks(tasks, batch, len(results))
        feeds = {graph_io.INPUT_IDS: ids, graph_io.INPUT_TOKEN_TYPES: type_ids}
        with torch.no_grad():
            task_t = None if task is None else torch.from_numpy(task)
            want = embeddings(torch.from_numpy(ids), torch.from_numpy(type_ids), task_t).numpy()
        if task is not None:
            feeds[graph_io.INPUT_TASK] = task
        (got,) = session.run(None, feeds)
        diff, excess = differences(got, want)
        result = CheckResult(
            path.name, case, graph_io.INPUT_EMBEDS, list(got.shape), diff, atol, excess
        )
        results.append(result)
        if not result.passed:
            raise ValidationError(path.name, graph_io.INPUT_EMBEDS, got.shape, diff, atol)
    return results


# Runs a graph (or graphs) on token ids, types, mask (and task feeds) -> its one output.
IdRun = Callable[[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]], np.ndarray]


def _validate_id_graph(
    references: list[Reference],
    name: str,
    run: IdRun,
    output: str,
    expected: Callable[[Reference], np.ndarray],
    atol: float,
) -> list[CheckResult]:
    """Compare a run on token ids (ids, types, mask) with ``expected(reference)`` from
    PyTorch's outputs, on the encoder graphs' cases (random ids, ragged, padded)."""
    results = []
    for ref in references:
        assert ref.tokens is not None, "graphs taking ids are checked on token embeddings"
        got = run(*ref.tokens, ref.mask, ref.task_feeds)
        diff, excess = differences(got, expected(ref))
        result = CheckResult(name, ref.case.name, output, list(got.shape), diff, atol, excess)
        results.append(result)
        if not result.passed:
            raise ValidationError(name, output, got.shape, diff, atol)
    return results


def _id_graph_run(path: Path) -> IdRun:
    """A graph taking ids, types and mask, with one output."""
    session = new_session(path)

    def run(
        ids: np.ndarray, type_ids: np.ndarray, mask: np.ndarray, task: dict[str, np.ndarray]
    ) -> np.ndarray:
        feeds = {graph_io.INPUT_IDS: ids, graph_io.INPUT_TOKEN_TYPES: type_ids}
        (out,) = session.run(None, feeds | {graph_io.INPUT_MASK: mask} | task)
        got: np.ndarray = out
        return got

    return run


def validate_text_path(
    references: list[Reference], model_dir: Path, *, atol: float = DEFAULT_ATOL
) -> list[CheckResult]:
    """Compare what the service runs for text asking only for embeddings (the token
    embedding graph, then the embeddings-only graph) with PyTorch's embeddings then
    encoder."""
    lookup = new_session(model_dir / graph_io.GRAPH_TOKEN_EMBEDDINGS)
    encode = new_session(model_dir / graph_io.GRAPH_EMBEDDINGS)

    def run(
        ids: np.ndarray, type_ids: np.ndarray, mask: np.ndarray, task: dict[str, np.ndarray]
    ) -> np.ndarray:
        feeds = {graph_io.INPUT_IDS: ids, graph_io.INPUT_TOKEN_TYPES: type_ids}
        (embeds,) = lookup.run(None, feeds | task)
        feeds = {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
        (hidden,) = encode.run(None, feeds | task)
        out: np.ndarray = hidden
        return out

    def hidden(ref: Reference) -> np.ndarray:
        return ref.outputs[graph_io.OUTPUT_HIDDEN]

    return _validate_id_graph(references, TEXT_PATH, run, graph_io.OUTPUT_HIDDEN, hidden, atol)


def validate_sparse_graph(
    references: list[Reference], path: Path, *, atol: float = DEFAULT_ATOL
) -> list[CheckResult]:
    """Compare the BM42 graph with the last layer's [CLS] attention row of the PyTorch
    encoder (all weights computed), averaged over heads, zero at padding."""

    def cls_row(ref: Reference) -> np.ndarray:
        attn = ref.outputs[graph_io.OUTPUT_ATTENTIONS]
        row: np.ndarray = attn[:, -1, :, 0, :].mean(axis=1) * ref.mask
        return row

    output = graph_io.OUTPUT_CLS_ATTENTION
    return _validate_id_graph(references, path.name, _id_graph_run(path), output, cls_row, atol)


def validate_head_graph(
    references: list[Reference], head: nn.Module, path: Path, atol: float
) -> list[CheckResult]:
    """Compare a head's graph (model_export.heads) with the PyTorch encoder and head."""

    def expected(ref: Reference) -> np.ndarray:
        hidden = torch.from_numpy(ref.outputs[graph_io.OUTPUT_HIDDEN])
        with torch.no_grad():
            want: np.ndarray = head(hidden, torch.from_numpy(ref.mask)).numpy()
        return want

    (output,) = graph_io.HEAD_GRAPHS[path.name]
    run = _id_graph_run(path)
    return _validate_id_graph(references, path.name, run, output, expected, atol)


def results_table(results: list[CheckResult]) -> str:
    """A plain-text table of the checks, for the CLI."""
    header = f"{'graph':<16} {'case':<26} {'output':<18} {'shape':<22} {'max|diff|':>10}  ok"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.graph:<16} {r.case:<26} {r.output:<18} {r.shape!s:<22} "
            f"{r.max_abs_diff:>10.2e}  {'yes' if r.passed else 'NO'}"
        )
    return "\n".join(lines)


def results_json(results: list[CheckResult]) -> list[dict[str, object]]:
    return [asdict(r) for r in results]
