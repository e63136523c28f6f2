"""The backend: the only module that imports onnxruntime.

A :class:`ModelRuntime` owns the sessions of one model directory
(``model.onnx`` for embeddings only, ``model_hidden.onnx`` with per-layer hidden
states, ``model_attn.onnx`` with attention and hidden states, and for text
``embeddings.onnx`` (token ids to input embeddings), ``sparse_model.onnx`` (BM42)
and, in exports before format 5, ``text_model.onnx`` (token ids to embeddings in
one run; since then the run labelled so is ``embeddings.onnx`` then ``model.onnx``))
and runs padded batches.

Weights are held once where the export stores them once (format 5's shared
``weights.bin``): onnxruntime maps the file, and every session reading a weight
unpacked shares its pages. A pre-packed session holds a private copy of its
encoder weights in the layout its matrix kernels want, which is faster on small
runs, so only the graphs named by ``ATTNSERVE_PREPACKED_GRAPHS`` pre-pack
(measured in docs/benchmarks.md). A graph with weights of its own (older
exports) always pre-packs: it shares nothing either way. With the session cache
on (``ATTNSERVE_SESSION_CACHE_DIR``, service/prepacked_cache.py) a pre-packing
graph opens its optimised form instead, whose pre-packed weights are in blobs
every session maps, of that graph or another with the same weights: held once,
whatever the number of sessions.

A run's sequences are float32 [n, d] input embeddings, or for the graphs of
``graph_io.ID_GRAPHS`` int64 [n, 2] (token id, token type) pairs. Only the
batcher's inference lanes call :meth:`ModelRuntime.run`, up to one run per
lane at once on the same sessions (onnxruntime allows it), or on the lane's own
session of the graph where it has them (service/lane_sessions.py:
``RunOptions.lane_session``).
:func:`load_repository` loads every model of a model repository through its
manifest, checking each file's SHA-256 first, and raises
:class:`ModelLoadError` with a clear message on anything wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from model_export.manifest import graph_io
from service.errors import ModelLoadError
from service.lane_sessions import lane_threads, opens_lane_sessions
from service.model_info import ModelInfo, cannot_load, read_model_info, session_graphs
from service.prepacked_cache import DATA_FILE, SessionCache, entry_key, session_cache
from service.progress import GraphSteps
from service.repository import ModelVersion, latest, model_directories
from service.run_options import PLAIN_RUN as PLAIN_RUN
from service.run_options import RunOptions as RunOptions
from service.run_options import pad as pad
from service.settings import Settings
from service.tokenizer import TextFrontEnd

log = logging.getLogger(__name__)

# The start-up probe of max_seq_len: its arena growth given back (seq² scratch).
PROBE_RUN = RunOptions(shrink_arena=True)


# onnxruntime's run setting that frees what a run grew the session's CPU arena by.
ARENA_SHRINKAGE = ("memory.enable_memory_arena_shrinkage", "cpu:0")


class RunCutShort(Exception):
    """A run stopped by its :class:`RunCut` before it finished (no outputs)."""


class RunCut:
    """Stops one run from another thread: onnxruntime checks ``RunOptions.terminate``
    between two operators, so a run of seconds ends within one operator's time, and
    raises :class:`RunCutShort`. For a run whose requests have all gone, or at shutdown."""

    def __init__(self) -> None:
        self._plain = _quiet(ort.RunOptions())
        self._shrinking: ort.RunOptions | None = None  # made on first use
        self.done = False

    def cut(self) -> None:
        self.done = True
        for options in (self._plain, self._shrinking):
            if options is not None:
                options.terminate = True

    def run_options(self, shrink_arena: bool) -> ort.RunOptions:
        """The onnxruntime options of one session run under this cut (the arena's
        shrinkage only where the session has an arena: onnxruntime refuses it else)."""
        if not shrink_arena:
            return self._plain
        if self._shrinking is None:
            self._shrinking = _quiet(ort.RunOptions())
            self._shrinking.add_run_config_entry(*ARENA_SHRINKAGE)
            self._shrinking.terminate = self.done
        return self._shrinking


# Inputs and outputs whose last axis is the model's width d_model.
WIDTH_LAST = frozenset({graph_io.INPUT_EMBEDS, graph_io.OUTPUT_HIDDEN})


def _session_options(settings: Settings, *, prepack: bool = True) -> ort.SessionOptions:
    options = ort.SessionOptions()
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = settings.cpu_mem_arena
    spin = "1" if settings.allow_spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return options


def _quiet(options: ort.RunOptions) -> ort.RunOptions:
    options.log_severity_level = 3  # a cut run is no error of onnxruntime's to log
    return options


class ModelRuntime:
    """The onnxruntime sessions of one model; ``run`` is blocking (call it off the loop)."""

    def __init__(self, info: ModelInfo, settings: Settings) -> None:
        self.info = info
        self._providers = settings.provider_list
        shared = info.manifest.weights is not None
        prepacked = settings.prepacked_graph_labels

        def prepacks(graph: str) -> bool:
            return not shared or graph_io.GRAPH_LABELS[graph] in prepacked

        def options(graph: str, threads: int = 0) -> ort.SessionOptions:
            chosen = _session_options(settings, prepack=prepacks(graph))
            chosen.intra_op_num_threads = threads or chosen.intra_op_num_threads
            # The attention graph's buffers grow with seq²: without the arena, a long
            # request's memory goes back to the system afterwards, not reserved for good.
            chosen.enable_cpu_mem_arena &= graph not in graph_io.MAP_GRAPHS
            if chosen.enable_cpu_mem_arena:
                self._arenas.add(graph)
            return chosen

        self._arenas: set[str] = set()  # the graphs whose sessions have a CPU arena

        graphs = session_graphs(info)
        steps = GraphSteps(log, f"loading model {info.name}", [file for _, _, file, *_ in graphs])
        self._sessions: dict[str, ort.InferenceSession] = {}
        # The graphs that take each row's task (a model with task adapters: all of them).
        self._tasked = {key for key, _, _, inputs, _ in graphs if graph_io.INPUT_TASK in inputs}
        # Each pre-packed graph's sessions of the inference lanes, one per lane.
        self._lane_sessions: dict[str, list[ort.InferenceSession]] = {}
        cache = session_cache(settings.session_cache_path, settings.session_cache_bytes)
        threads_each = lane_threads(settings)
        for key, label, file, inputs, outputs in graphs:
            steps.start(file)
            made = None
            if cache is not None and prepacks(label):
                made = self._cached(cache, file, partial(options, label))
            self._sessions[key] = self._open(options(label), file, inputs, outputs, made)
            if prepacks(label) and opens_lane_sessions(settings, cached=made is not None):
                lane_options = partial(options, label, threads_each)
                self._lane_sessions[key] = [
                    self._open(lane_options(), file, inputs, outputs, made)
                    for _ in range(settings.inference_lanes)
                ]
        # Format 5 has no text graph: that run is the token embeddings, then model.onnx.
        text = info.manifest.text
        self._composed_text = text is not None and text.graph is None
        # The tokenizer and BM42's stopwords: the model's text front end, no onnxruntime.
        self.text = TextFrontEnd.load(info)

    def _open(
        self,
        options: ort.SessionOptions,
        graph: str,
        inputs: tuple[str, ...],
        outputs: tuple[str, ...],
        optimised: Path | None = None,
    ) -> ort.InferenceSession:
        path = self.info.file(graph)
        name = self.info.name
        try:
            opened = path if optimised is None else optimised
            session = ort.InferenceSession(str(opened), options, providers=self._providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors, naming the path
            raise cannot_load(self.info, path, graph, exc) from exc
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

    def _cached(
        self, cache: SessionCache, graph: str, options: Callable[[], ort.SessionOptions]
    ) -> Path | None:
        """``graph``'s optimised form, its weights and their pre-packed forms in the
        cache's shared blobs, from ``cache`` or made into it (service/prepacked_cache.py,
        prepacked_blobs.py); None: open the original."""
        files = self.info.manifest.files()
        sources = [files[graph], files.get(self.info.manifest.weights or "", "")]
        level = options().graph_optimization_level
        key = entry_key(
            sources=sources,
            runtime=f"onnxruntime {ort.__version__} {','.join(self._providers)}",
            options=f"level={level} prepacked",
        )

        def write(target: Path) -> None:
            chosen = options()
            chosen.optimized_model_filepath = str(target)
            for entry, value in (
                ("session.optimized_model_external_initializers_file_name", DATA_FILE),
                # Small constants (shapes, axes) stay in the graph, where shape inference
                # reads them; every weight matrix is larger.
                ("session.optimized_model_external_initializers_min_size_in_bytes", "1024"),
                ("session.save_external_prepacked_constant_initializers", "1"),
            ):
                chosen.add_session_config_entry(entry, value)
            ort.InferenceSession(str(self.info.file(graph)), chosen, providers=self._providers)

        return cache.graph(key, f"{self.info.name}/{graph}", write)

    @property
    def lane_graphs(self) -> frozenset[str]:
        """The graphs with a session of their own per inference lane (for text: when the
        encoder graph it runs has them)."""
        own = set(self._lane_sessions)
        if self._composed_text and graph_io.GRAPH_EMBEDDINGS in own:
            own.add(graph_io.GRAPH_TEXT)
        return frozenset(own)

    @property
    def graphs(self) -> tuple[str, ...]:
        """Every graph a run can use: the manifest's, and for text the text run."""
        composed = (graph_io.GRAPH_TEXT,) if self._composed_text else ()
        return (*self._sessions, *composed)

    def sample_sequence(self, graph: str, n: int) -> np.ndarray:
        """A sequence of ``n`` tokens in ``graph``'s input form (for warm-up and timing)."""
        if graph in graph_io.ID_GRAPHS:
            return np.zeros((n, 2), dtype=np.int64)  # id 0 and type 0: in every vocabulary
        d = self.info.config.d_model
        return np.linspace(-1.0, 1.0, n * d, dtype=np.float32).reshape(n, d)

    def run(
        self,
        batch: np.ndarray,
        mask: np.ndarray,
        graph: str,
        options: RunOptions = PLAIN_RUN,
        cut: RunCut | None = None,
    ) -> dict[str, np.ndarray]:
        """batch (float32 [B, T, d] embeddings, or int64 [B, T, 2] token id and type for
        the text and sparse graphs), mask int64 [B, T] -> the graph's outputs by name.

        ``last_hidden_state`` [B, T, d]; ``attentions`` [B, L, H, T, T] and
        ``hidden_states`` [B, L + 1, T, d] where the graph has them; the compact
        attention graph's top-k rows (at most T); the selected-maps graph's maps of
        ``options``' layers and heads, in float32 or float16. ``cut``: lets another
        thread stop the run (RunCutShort).
        """
        if graph == graph_io.GRAPH_TEXT and self._composed_text:
            # Padding ids embed to something, which model.onnx masks out as the one-run
            # text graph did: the same answer, from weights held once.
            ids = graph_io.GRAPH_TOKEN_EMBEDDINGS
            embeds = self.run(batch, mask, ids, options, cut)[graph_io.INPUT_EMBEDS]
            return self.run(embeds, mask, graph_io.GRAPH_EMBEDDINGS, options, cut)
        lane, own = options.lane_session, self._lane_sessions.get(graph)
        session = self._sessions[graph] if lane is None or own is None else own[lane]
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
            late = self.info.manifest.late_interaction
            if graph == graph_io.GRAPH_MULTI_VECTOR and late is not None:
                names = late.outputs  # what this model's graph gives
        else:
            feeds = {graph_io.INPUT_EMBEDS: batch, graph_io.INPUT_MASK: mask}
            if graph == graph_io.GRAPH_COMPACT_ATTENTION:  # k is the input's length
                k = min(options.top_k, batch.shape[1])
                feeds[graph_io.INPUT_TOP_K] = np.zeros(k, dtype=np.int64)
            if graph == graph_io.GRAPH_SELECTED_ATTENTION:
                feeds.update(self._selection_feeds(options))
            names = self.info.manifest.graphs[graph].outputs
        if graph in self._tasked:  # one task per run: the batcher groups jobs by it
            feeds[graph_io.INPUT_TASK] = np.full(batch.shape[0], options.task, dtype=np.int64)
        cut = cut or RunCut()
        try:
            outputs = session.run(
                None, feeds, cut.run_options(options.shrink_arena and graph in self._arenas)
            )
        except Exception as exc:  # onnxruntime's own untyped error
            if cut.done:
                raise RunCutShort(f"the run of {graph} was cut short") from exc
            raise
        return dict(zip(names, outputs, strict=True))

    def _selection_feeds(self, options: RunOptions) -> dict[str, np.ndarray]:
        """The selected-maps graph's layer marks and head indices for ``options``."""
        config = self.info.config
        mark = graph_io.LAYER_FLOAT16 if options.half else graph_io.LAYER_FLOAT32
        layers = range(config.n_layers) if options.layers is None else options.layers
        marks = np.zeros(config.n_layers, dtype=np.int64)
        marks[list(layers)] = mark
        heads = range(config.n_heads) if options.heads is None else options.heads
        return {
            graph_io.INPUT_LAYERS: marks,
            graph_io.INPUT_HEADS: np.array(heads, dtype=np.int64),
        }

    def warmup(self) -> None:
        """One small ragged batch per graph: proves the sessions run before we say ready."""
        steps = GraphSteps(log, f"warming up model {self.info.name}", self.graphs)
        for graph in self.graphs:
            steps.start(graph)
            batch, mask = pad(
                [self.sample_sequence(graph, n) for n in (min(8, self.info.max_seq_len), 1)]
            )
            lanes = range(len(self._lane_sessions.get(graph, ())))
            for lane in (None, *lanes):  # the graph's own session, then each lane's
                outputs = self.run(batch, mask, graph, RunOptions(lane_session=lane))
                if not all(np.isfinite(value).all() for value in outputs.values()):
                    raise ModelLoadError(
                        f"model {self.info.name!r}: warm-up of {graph} produced non-finite output"
                    )
        self._probe_tables()

    def _probe_tables(self) -> None:
        """Each graph taking token ids run on the longest sequence served and on the
        highest token id and type the manifest allows: a ``config.json`` promising more
        than the graph's position, word or type tables is refused at load, where each
        request past the tables was a 500."""
        text = self.info.manifest.text
        if text is None:
            return
        n = self.info.max_seq_len
        highest = np.array([[text.vocab_size - 1, text.type_vocab_size - 1]], dtype=np.int64)
        probes = {
            f"{n} tokens (max_seq_len)": np.zeros((n, 2), dtype=np.int64),
            f"token id {text.vocab_size - 1} and token type {text.type_vocab_size - 1} "
            "(text.vocab_size, text.type_vocab_size)": highest,
        }
        for graph in sorted(self._sessions.keys() & graph_io.ID_GRAPHS.keys()):
            for promised, sequence in probes.items():
                batch, mask = pad([sequence])
                try:
                    # Its arena growth given back: a long max_seq_len's probe (seq² scratch)
                    # must not stay reserved for good.
                    self.run(batch, mask, graph, PROBE_RUN)
                except Exception as exc:  # onnxruntime's own error: an index out of a table
                    said = str(exc).splitlines()[0][:300]
                    raise ModelLoadError(
                        f"model {self.info.name!r}: {graph} cannot run {promised}, which "
                        f"{graph_io.CONFIG_FILE} promises: {said}"
                    ) from exc


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


def read_version(
    found: ModelVersion,
    settings: Settings,
    *,
    budget: int | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> ModelInfo:
    """One export's manifest, checked (what it takes against ``budget`` bytes, hashes,
    the name its directory promises); ``cancelled`` gives up on the hashing."""
    info = read_model_info(found.path, settings, found.version, budget=budget, cancelled=cancelled)
    if info.name != found.name:
        raise ModelLoadError(
            f"directory {found.name!r} holds a model named {info.name!r}: name the "
            "directory after its model (the repository API addresses models by directory)"
        )
    return info


def open_version(info: ModelInfo, settings: Settings) -> ModelRuntime:
    """The sessions and tokenizer of an export ``read_version`` checked."""
    runtime = ModelRuntime(info, settings)
    log.info("loaded model %s version %s from %s", info.name, info.version, info.path)
    return runtime


def load_version(
    found: ModelVersion,
    settings: Settings,
    *,
    budget: int | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> ModelRuntime:
    """One export, checked (``read_version``) and opened."""
    info = read_version(found, settings, budget=budget, cancelled=cancelled)
    return open_version(info, settings)


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
