"""The backend: the only module that imports onnxruntime.

A :class:`ModelRuntime` owns the sessions of one model directory
(``model.onnx`` for embeddings only, ``model_hidden.onnx`` with per-layer hidden
states, ``model_attn.onnx`` with attention and hidden states, and for text
``embeddings.onnx`` (token ids to input embeddings), ``text_model.onnx`` (token
ids to embeddings in one run) and ``sparse_model.onnx`` (BM42)) and runs padded
batches. A run's sequences are float32 [n, d] input embeddings, or for the
graphs of ``graph_io.ID_GRAPHS`` int64 [n, 2] (token id, token type) pairs.
Only the batcher's inference thread calls :meth:`ModelRuntime.run`: one run at
a time, each with every intra-op thread. :func:`load_repository`
loads every model of a model repository through its manifest, checking each
file's SHA-256 first, and raises :class:`ModelLoadError` with a clear message
on anything wrong.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from model_export.manifest import graph_io
from service.errors import InvalidInput, ModelLoadError
from service.model_info import ModelInfo, read_model_info
from service.repository import ModelVersion, latest, model_directories
from service.settings import Settings

log = logging.getLogger(__name__)


# Tokenized at load (both ways) before a model with a tokenizer may serve: words no
# vocabulary holds, accents, scripts, an emoji, control and zero-width characters.
PROBE_TEXT = (
    "Probe: qzxv-unknownword Xylophonist's naïve café, Größe, ﬁ, 東京 مرحبا 🙂\u200b\t\x00 end."
)
# Inputs and outputs whose last axis is the model's width d_model.
WIDTH_LAST = frozenset({graph_io.INPUT_EMBEDS, graph_io.OUTPUT_HIDDEN})


def _session_options(settings: Settings) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = settings.cpu_mem_arena
    spin = "1" if settings.allow_spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return options


def pad(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Zero-pad [n_i, ...] arrays into one [B, T, ...] batch, with an int64 1/0 mask [B, T]."""
    longest = max(len(s) for s in sequences)
    first = sequences[0]
    batch = np.zeros((len(sequences), longest, *first.shape[1:]), dtype=first.dtype)
    mask = np.zeros((len(sequences), longest), dtype=np.int64)
    for row, seq in enumerate(sequences):
        batch[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return batch, mask


class ModelRuntime:
    """The onnxruntime sessions of one model; ``run`` is blocking (call it off the loop)."""

    def __init__(self, info: ModelInfo, settings: Settings) -> None:
        self.info = info
        self._providers = settings.provider_list
        options = _session_options(settings)
        # The attention graph's buffers grow with seq²: without the arena, a long request's
        # memory goes back to the system afterwards instead of staying reserved for good.
        attention_options = _session_options(settings)
        attention_options.enable_cpu_mem_arena = False
        # Each graph the manifest lists, checked to have the outputs it records.
        self._sessions = {
            graph: self._open(
                attention_options if graph == graph_io.GRAPH_ATTENTION else options,
                graph,
                graph_io.INPUT_NAMES,
                entry.outputs,
            )
            for graph, entry in info.manifest.graphs.items()
        }
        text = info.manifest.text
        if text is not None and text.graph is not None:
            self._sessions[text.graph] = self._open(
                options, text.graph, graph_io.TEXT_GRAPH_INPUTS, graph_io.TEXT_GRAPH_OUTPUTS
            )
        # BM42 (format 4): the [CLS] attention row graph and the words left out.
        self.stopwords: frozenset[str] = frozenset()
        if text is not None and text.sparse_graph is not None:
            self._sessions[text.sparse_graph] = self._open(
                options,
                text.sparse_graph,
                graph_io.TEXT_GRAPH_INPUTS,
                graph_io.SPARSE_GRAPH_OUTPUTS,
            )
        if text is not None and text.stopwords is not None:
            words = info.file(text.stopwords).read_text(encoding="utf-8").split()
            self.stopwords = frozenset(words)
        self.special_tokens: frozenset[str] = frozenset()  # [CLS], [SEP], [PAD], ...
        self._tokenizer: Tokenizer | None = None
        self._truncating_tokenizer: Tokenizer | None = None
        if text is not None:  # run as GRAPH_TOKEN_EMBEDDINGS, whatever its file is named
            self._sessions[graph_io.GRAPH_TOKEN_EMBEDDINGS] = self._open(
                options,
                text.embeddings_graph,
                graph_io.TEXT_INPUT_NAMES,
                graph_io.ID_GRAPHS[graph_io.GRAPH_TOKEN_EMBEDDINGS],
            )
            if text.tokenizer is not None:
                path = info.file(text.tokenizer)
                self._tokenizer = self._load_tokenizer(path, None)
                self.special_tokens = frozenset(
                    token.content
                    for token in self._tokenizer.get_added_tokens_decoder().values()
                    if token.special
                )
                # A second instance, so no request ever flips shared truncation state.
                self._truncating_tokenizer = self._load_tokenizer(path, info.max_seq_len)
                self._probe_tokenizer(text.vocab_size)

    def _open(
        self,
        options: ort.SessionOptions,
        graph: str,
        inputs: tuple[str, ...],
        outputs: tuple[str, ...],
    ) -> ort.InferenceSession:
        path = self.info.file(graph)
        name = self.info.name
        try:
            session = ort.InferenceSession(str(path), options, providers=self._providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors, naming the path
            raise self._cannot_load(path, graph, exc) from exc
        got_inputs = tuple(i.name for i in session.get_inputs())
        got_outputs = tuple(o.name for o in session.get_outputs())
        if got_inputs != inputs or got_outputs != outputs:
            raise ModelLoadError(
                f"model {name!r}: {graph} has inputs {got_inputs} and outputs "
                f"{got_outputs}; expected {inputs} and {outputs}"
            )
        # The manifest's width sizes every buffer made for this graph: it must be the graph's.
        for node in (*session.get_inputs(), *session.get_outputs()):
            width = node.shape[-1] if node.name in WIDTH_LAST else None
            if isinstance(width, int) and width != self.info.config.d_model:
                raise ModelLoadError(
                    f"model {name!r}: {graph}'s {node.name} is {width} wide, but "
                    f"{graph_io.CONFIG_FILE} says d_model {self.info.config.d_model}"
                )
        return session

    def _cannot_load(self, path: Path, shown: str, exc: Exception) -> ModelLoadError:
        """A library's load error naming ``path``, the file ``shown`` by its name in the
        model directory instead: the repository's absolute path stays out of answers."""
        said = str(exc).replace(str(path), shown)
        return ModelLoadError(f"model {self.info.name!r}: cannot load {shown}: {said}")

    def _load_tokenizer(self, path: Path, truncate_at: int | None) -> Tokenizer:
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise self._cannot_load(path, path.name, exc) from exc
        tokenizer.no_padding()
        if truncate_at is None:
            tokenizer.no_truncation()
        else:
            tokenizer.enable_truncation(max_length=truncate_at)
        return tokenizer

    def _probe_tokenizer(self, vocab_size: int) -> None:
        """Encode PROBE_TEXT both ways at load: a tokenizer that loads but cannot encode
        (its unknown-word token missing from its vocabulary) or gives ids beyond the
        embedding table would fail every request; such a model never becomes ready."""
        try:
            for truncate in (False, True):
                for _, ids, _ in self.tokenize([PROBE_TEXT, ""], truncate=truncate):
                    beyond = [i for i in ids if not 0 <= i < vocab_size]
                    if beyond:
                        raise ModelLoadError(
                            f"model {self.info.name!r}: its tokenizer gives token id "
                            f"{beyond[0]}, beyond the vocabulary of {vocab_size}"
                        )
                self.token_spans([PROBE_TEXT], truncate=truncate)
            self.decode([[0]], skip_special_tokens=True)
        except InvalidInput as exc:
            raise ModelLoadError(f"model {self.info.name!r}: {exc.message}") from exc

    def _tokenizer_for(self, truncate: bool) -> Tokenizer:
        tokenizer = self._truncating_tokenizer if truncate else self._tokenizer
        if tokenizer is None:
            raise RuntimeError(f"model {self.info.name!r} has no tokenizer")
        return tokenizer

    def tokenize(
        self, texts: list[str], *, truncate: bool, special_tokens: bool = True
    ) -> list[tuple[list[str], list[int], list[int]]]:
        """Texts -> (tokens, ids, type ids) each, special tokens included unless
        ``special_tokens`` is false."""
        tokenizer = self._tokenizer_for(truncate)
        with self._tokenizer_errors():
            encoded = tokenizer.encode_batch(texts, add_special_tokens=special_tokens)
        return [(e.tokens, e.ids, e.type_ids) for e in encoded]

    def final_tokens(self, prefix: str) -> int:
        """Tokens of ``prefix`` (specials excluded) that no continuation of it can change:
        those of its words before the last, which may be cut. Words are the
        pre-tokenizer's; a tokenizer without one has a single word, so none are final."""
        with self._tokenizer_errors():
            words = self._tokenizer_for(False).encode(prefix, add_special_tokens=False).word_ids
        known = [w for w in words if w is not None]
        if not known:
            return 0
        last = max(known)
        return sum(1 for w in known if w < last)

    def token_spans(
        self, texts: list[str], *, truncate: bool, special_tokens: bool = True
    ) -> list[list[tuple[int, int] | None]]:
        """Each token's [start, stop) characters in its text; None for special tokens.
        The same tokenization as ``tokenize`` (late chunking: which tokens a span
        holds; TEI's /tokenize: where each token came from)."""
        tokenizer = self._tokenizer_for(truncate)
        with self._tokenizer_errors():
            encoded = tokenizer.encode_batch(texts, add_special_tokens=special_tokens)
        return [
            [
                None if special else offsets
                for offsets, special in zip(e.offsets, e.special_tokens_mask, strict=True)
            ]
            for e in encoded
        ]

    def decode(self, ids: list[list[int]], *, skip_special_tokens: bool) -> list[str]:
        """Token ids -> text, one string per sequence."""
        tokenizer = self._tokenizer_for(False)
        with self._tokenizer_errors():
            return list(tokenizer.decode_batch(ids, skip_special_tokens=skip_special_tokens))

    @contextlib.contextmanager
    def _tokenizer_errors(self) -> Iterator[None]:
        """The tokenizers package raises bare Exceptions (e.g. "Missing [UNK] token from
        the vocabulary"): the model cannot take this text, a 422 naming it, never a 500."""
        try:
            yield
        except Exception as exc:
            raise InvalidInput(
                f"the tokenizer of model {self.info.name!r} cannot encode or decode this input: "
                f"{str(exc)[:200]}"
            ) from exc

    @property
    def graphs(self) -> tuple[str, ...]:
        """Every graph a run can use: the manifest's, and the text graph if it has one."""
        return tuple(self._sessions)

    def sample_sequence(self, graph: str, n: int) -> np.ndarray:
        """A sequence of ``n`` tokens in ``graph``'s input form (for warm-up and timing)."""
        if graph in graph_io.ID_GRAPHS:
            return np.zeros((n, 2), dtype=np.int64)  # id 0 and type 0: in every vocabulary
        d = self.info.config.d_model
        return np.linspace(-1.0, 1.0, n * d, dtype=np.float32).reshape(n, d)

    def run(self, batch: np.ndarray, mask: np.ndarray, graph: str) -> dict[str, np.ndarray]:
        """batch (float32 [B, T, d] embeddings, or int64 [B, T, 2] token id and type for
        the text and sparse graphs), mask int64 [B, T] -> the graph's outputs by name.

        ``last_hidden_state`` [B, T, d]; ``attentions`` [B, L, H, T, T] and
        ``hidden_states`` [B, L + 1, T, d] where the graph has them.
        """
        session = self._sessions[graph]
        if graph in graph_io.ID_GRAPHS:
            feeds = {
                graph_io.INPUT_IDS: np.ascontiguousarray(batch[..., 0]),
                graph_io.INPUT_TOKEN_TYPES: np.ascontiguousarray(batch[..., 1]),
            }
            # The token-embedding graph takes no mask: a token's word, position and type
            # embeddings do not depend on later tokens, so padding with id 0 and trimming
            # gives each sequence its own embeddings.
            if graph != graph_io.GRAPH_TOKEN_EMBEDDINGS:
                feeds[graph_io.INPUT_MASK] = mask
            names: tuple[str, ...] = graph_io.ID_GRAPHS[graph]
        else:
            feeds = {graph_io.INPUT_EMBEDS: batch, graph_io.INPUT_MASK: mask}
            names = self.info.manifest.graphs[graph].outputs
        outputs = session.run(None, feeds)
        return dict(zip(names, outputs, strict=True))

    def warmup(self) -> None:
        """One small ragged batch per graph: proves the sessions run before we say ready."""
        for graph in self._sessions:
            batch, mask = pad(
                [self.sample_sequence(graph, n) for n in (min(8, self.info.max_seq_len), 1)]
            )
            outputs = self.run(batch, mask, graph)
            if not all(np.isfinite(value).all() for value in outputs.values()):
                raise ModelLoadError(
                    f"model {self.info.name!r}: warm-up of {graph} produced non-finite output"
                )


def check_providers(providers: list[str]) -> None:
    """Every execution provider asked for must be in this onnxruntime build."""
    available = ort.get_available_providers()
    missing = [p for p in providers if p not in available]
    if not providers or missing:
        raise ModelLoadError(
            f"ATTNSERVE_PROVIDERS asks for {missing or 'no provider'}, which this onnxruntime "
            f"({ort.__version__}) does not have; available: {', '.join(available)} (GPU "
            "providers need the onnxruntime-gpu package in place of onnxruntime)"
        )


def load_version(
    found: ModelVersion,
    settings: Settings,
    *,
    budget: int | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> ModelRuntime:
    """One export, checked (manifest, what it takes against ``budget`` bytes, hashes, the
    name its directory promises) and opened; ``cancelled`` gives up on the hashing."""
    info = read_model_info(found.path, settings, found.version, budget=budget, cancelled=cancelled)
    if info.name != found.name:
        raise ModelLoadError(
            f"directory {found.name!r} holds a model named {info.name!r}: name the "
            "directory after its model (the repository API addresses models by directory)"
        )
    runtime = ModelRuntime(info, settings)
    log.info("loaded model %s version %s from %s", info.name, found.version, found.path)
    return runtime


def load_repository(settings: Settings, names: list[str] | None = None) -> dict[str, ModelRuntime]:
    """Load the highest version of every model directory (or of ``names``); refuse an
    empty or broken one."""
    repo = settings.model_repository
    if not repo.is_dir():
        raise ModelLoadError(f"model repository {repo} does not exist or is not a directory")
    check_providers(settings.provider_list)
    model_dirs = model_directories(repo)
    if names is not None:
        model_dirs = [d for d in model_dirs if d.name in names]
        missing = sorted(set(names) - {d.name for d in model_dirs})
        if missing:
            raise ModelLoadError(f"no model directory {', '.join(missing)} in {repo}")
    if not model_dirs:
        raise ModelLoadError(f"model repository {repo} holds no model directories")
    runtimes: dict[str, ModelRuntime] = {}
    left = settings.model_memory_bytes
    for model_dir in model_dirs:
        found = latest(model_dir)
        if found is None:
            raise ModelLoadError(
                f"{model_dir.name} holds neither an export ({graph_io.CONFIG_FILE}) nor "
                f"numbered versions (<version>/{graph_io.CONFIG_FILE})"
            )
        runtime = load_version(found, settings, budget=left)
        left -= runtime.info.estimated_bytes
        runtimes[runtime.info.name] = runtime
    if settings.default_model is not None and settings.default_model not in runtimes:
        raise ModelLoadError(
            f"default model {settings.default_model!r} is not in {repo} "
            f"(found: {', '.join(sorted(runtimes))})"
        )
    return runtimes
