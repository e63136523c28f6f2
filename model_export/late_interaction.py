"""Late-interaction (ColBERT-style, multi-vector) checkpoints: import and their graph.

Four layouts are read, each to the same thing: the backbone (imported as any other
checkpoint of its family, model_export.hf_import), a per-token projection, whether
each token's vector is normalised, and the manifest's ``late_interaction`` section
(model_export.manifest_sections.LateInteraction)::

    sentence-transformers MultiVectorEncoder  modules.json: Transformer (query_length,
        document_length, query_expansion), Dense..., MultiVectorMask (skiplist), Normalize
    PyLate (v3, model_type "ColBERT")          [Transformer, Dense]; query_prefix,
        document_prefix, lengths, expansion and skiplist at the top level; a punctuation
        skiplist and normalisation by default (sentence-transformers' legacy fix-ups)
    Stanford ColBERT (architectures HF_ColBERT)  ``linear.weight`` beside ``bert.*``;
        ``artifact.metadata``; markers [unused0]/[unused1]
    bge-m3                                      colbert_linear.pt and sparse_linear.pt
        beside an XLM-RoBERTa checkpoint: the CLS vector dropped (skip_first), MaxSim over
        the query's vector count, relu(sparse_linear(h)) as each token's lexical weight

Each follows what sentence-transformers 6.2's MultiVectorEncoder loads (its
``_parse_model_config``, ``_apply_legacy_fixups``, ``_maybe_load_stanford_metadata``,
``_register_prefix_tokens``) and, for bge-m3, FlagEmbedding's BGEM3FlagModel. What
cannot be expressed is refused by name (CheckpointError).

The graph (graph_io.GRAPH_MULTI_VECTOR) takes token ids, types and mask; a token of type
graph_io.TYPE_SCORED_ONLY is read as type 0 and masked out of attention (ColBERT's
[MASK] expansion of queries with attend false), its own row still computed.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import AddedToken, Tokenizer
from torch import Tensor, nn

from model_export import graph_io
from model_export.dense import DenseWeights, dense_weights
from model_export.manifest import DenseLayer, LateInteraction
from model_export.manifest_sections import MAX_SKIPLIST, SIDES, SIMILARITIES, QueryExpansion
from model_export.model import Encoder, TokenEmbeddings
from model_export.st_folder import CheckpointError, _dense, modules, read_json
from model_export.validate import (
    CheckResult,
    Reference,
    ValidationError,
    differences,
    new_session,
)

Kind = Literal["multi_vector_encoder", "pylate", "stanford", "bge_m3"]
ST_CONFIG: Final = "config_sentence_transformers.json"
STANFORD_METADATA: Final = "artifact.metadata"
BGE_M3_COLBERT: Final = "colbert_linear.pt"
BGE_M3_SPARSE: Final = "sparse_linear.pt"
# sentence-transformers' order of a MultiVectorEncoder's modules (PyLate's v3 folders
# list only Transformer and Dense: the mask and Normalize are the legacy defaults).
MODULE_ORDER: Final = {"Transformer": 0, "Dense": 1, "MultiVectorMask": 2, "Normalize": 2}
# PyLate <= 3 and Stanford ColBERT skip punctuation in documents by default.
PUNCTUATION: Final = tuple(string.punctuation)
DEFAULT_QUERY_LENGTH: Final = 32  # ColBERT's canonical pad target
TOKEN_INPUT: Final = "token_embeddings"  # a per-token module's input (not pooled)
MAX_LENGTH: Final = 1 << 16  # a side's length or the expansion's: the manifest's bound

ReadWeights = Callable[[Path], dict[str, Tensor]]


@dataclass(frozen=True)
class LateInteractionImport:
    """What a late-interaction checkpoint adds to its backbone: the projection, the
    optional sparse head, and the manifest section's fields."""

    kind: Kind
    dense: tuple[DenseWeights, ...]  # per-token projection, in order (may be none)
    sparse: DenseWeights | None  # bge-m3's sparse_linear: relu(w·h + b) per token
    normalize: bool
    similarity: str
    prompts: dict[str, str]  # the checkpoint's prompts, markers prepended
    query_length: int | None = None
    document_length: int | None = None
    expansion: QueryExpansion | None = None
    skiplist_ids: tuple[int, ...] = ()
    skiplist_sides: tuple[str, ...] = ("document",)
    skip_first: bool = False
    unused_ids: tuple[int, ...] = ()
    # The checkpoint's tokenizer with its markers as special tokens (None: as it was).
    tokenizer_json: str | None = None

    @property
    def dim(self) -> int | None:
        """Each token's vector width (None: the hidden size, without a projection)."""
        return self.dense[-1].layer.out_features if self.dense else None

    @property
    def outputs(self) -> tuple[str, ...]:
        sparse = (graph_io.OUTPUT_TOKEN_WEIGHTS,) if self.sparse is not None else ()
        return (*graph_io.MULTI_VECTOR_OUTPUTS[:2], *sparse, graph_io.OUTPUT_ATTENTION_RECEIVED)

    def section(self, sha256: str, d_model: int) -> LateInteraction:
        """The manifest's ``late_interaction`` for a graph of digest ``sha256``."""
        return LateInteraction(
            graph=graph_io.GRAPH_MULTI_VECTOR,
            sha256=sha256,
            outputs=self.outputs,
            dim=self.dim or d_model,
            normalize=self.normalize,
            similarity=self.similarity,
            query_length=self.query_length,
            document_length=self.document_length,
            expansion=self.expansion,
            skiplist_ids=self.skiplist_ids,
            skiplist_sides=self.skiplist_sides,
            skip_first=self.skip_first,
            unused_ids=self.unused_ids,
        )


# ---------------------------------------------------------------------------- the graph


class MultiVectorGraph(nn.Module):
    """Token ids, types and mask -> (last_hidden_state, multi_vectors[, token_weights][,
    attention_received]).

    A token of type TYPE_SCORED_ONLY is embedded as type 0 and no token attends to it;
    its own row is computed, as transformers computes a row of attention_mask 0. Rows of
    real padding (mask 0, another type) are 0 in every output.

    ``attention_received`` (with ``received``): per token j, the mean over layers and
    heads of Σ_i a_ij over the attended query rows i (mask 1: [CLS] and [SEP] rows
    included). A scored-only token's row is not counted: it is a query's expansion,
    which transformers reads as padding, and pruning applies to documents, which have
    none; as a masked key it receives 0. Each layer's weights are reduced as soon as
    they exist (a [B, 1, T] @ [B, h, T, T] product), so no stack of maps is kept."""

    def __init__(
        self,
        embeddings: TokenEmbeddings,
        encoder: Encoder,
        dense: tuple[DenseWeights, ...],
        normalize: bool,
        sparse: DenseWeights | None = None,
        *,
        received: bool = True,
    ) -> None:
        super().__init__()
        self.received = received
        self.embeddings = embeddings
        self.encoder = encoder
        self.dense = nn.ModuleList(_linear(d) for d in dense)
        self.activations = [d.layer.activation for d in dense]
        self.normalize = normalize
        self.sparse = None if sparse is None else _linear(sparse)
        self.eval()

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor
    ) -> tuple[Tensor, ...]:
        scored_only = token_type_ids == graph_io.TYPE_SCORED_ONLY  # (B, T)
        types = torch.where(scored_only, torch.zeros_like(token_type_ids), token_type_ids)
        attended = torch.where(scored_only, torch.zeros_like(attention_mask), attention_mask)
        keep = (attention_mask != 0) | scored_only  # rows with an output
        x = self.embeddings(input_ids, types)  # (B, T, d)
        enc = self.encoder
        # The encoder's layers, as Encoder.forward runs them, without its zeroing of rows
        # outside the (attended) mask: a scored-only row is an output here.
        biases = enc.layer_biases(attended)
        rotations = enc.layer_rotations(input_ids.shape[1])
        relative = enc.relative(input_ids.shape[1])
        queries = (attended != 0).to(x.dtype)[:, None, None, :]  # (B, 1, 1, T): counted rows
        received = torch.zeros_like(x[:, :, 0])  # (B, T)
        for layer, bias, rotation in zip(enc.layers, biases, rotations, strict=True):
            if bias.shape[-2] != 1:  # (B, 1|h, T, T): the structured mask keeps the diagonal
                bias = bias + _no_self(scored_only, bias)
            x, weights, _ = layer(x, bias, rotation, relative=relative)
            if self.received:  # Σ_i over counted rows, then Σ over heads: (B, T)
                received = received + (queries @ weights).sum(dim=(1, 2))
        if enc.final_norm is not None:
            x = enc.final_norm(x)
        rows = keep[:, :, None]  # (B, T, 1)
        hidden = torch.where(rows, x, torch.zeros_like(x))  # (B, T, d)
        vectors = hidden
        for linear, activation in zip(self.dense, self.activations, strict=True):
            vectors = _activate(activation, linear(vectors))  # (B, T, dim)
        if self.normalize:  # torch.nn.functional.normalize: x / max(|x|, 1e-12)
            vectors = F.normalize(vectors, p=2.0, dim=-1)
        vectors = torch.where(rows, vectors, torch.zeros_like(vectors))
        out: tuple[Tensor, ...] = (hidden, vectors)
        if self.sparse is not None:
            weights = torch.relu(self.sparse(hidden)).squeeze(-1)  # (B, T)
            out = (*out, weights * keep.to(weights.dtype))
        if self.received:  # the mean over layers and heads, 0 at keys no row attends to
            cfg = enc.config
            received = received / float(cfg.n_layers * cfg.n_heads)
            out = (*out, torch.where(attended != 0, received, torch.zeros_like(received)))
        return out


def _no_self(scored_only: Tensor, bias: Tensor) -> Tensor:
    """The structured mask (causal, windowed) always allows the diagonal, so that a
    padded row has one finite score; a scored-only row must not attend to itself
    (transformers masks its key for every query): -10000 on its diagonal."""
    pos = torch.arange(scored_only.shape[1], device=scored_only.device)  # (T,)
    diagonal = pos[:, None] == pos[None, :]  # (T, T); no EyeLike: onnxruntime has no bool one
    own = diagonal[None, None] & scored_only[:, None, :, None]  # (B, 1, T, T)
    return torch.where(own, torch.full_like(bias[:, :1], -10000.0), torch.zeros_like(bias[:, :1]))


def _linear(d: DenseWeights) -> nn.Linear:
    layer = nn.Linear(d.layer.in_features, d.layer.out_features, bias=d.bias is not None)
    with torch.no_grad():
        layer.weight.copy_(d.weight)
        if d.bias is not None and layer.bias is not None:
            layer.bias.copy_(d.bias)
    return layer


def _activate(name: str, x: Tensor) -> Tensor:
    if name == "tanh":
        return torch.tanh(x)
    if name == "relu":
        return torch.relu(x)
    return x


# ----------------------------------------------------------------------- validation


def scored_only_types(type_ids: np.ndarray, mask: np.ndarray, count: int = 2) -> np.ndarray | None:
    """``type_ids`` with each row's last ``count`` real tokens (all but the first) made
    TYPE_SCORED_ONLY, as a query's expansion tokens are; None when no row has two."""
    out = type_ids.copy()
    lengths = mask.sum(axis=1)
    for row, n in enumerate(lengths):
        k = min(count, int(n) - 1)
        if k > 0:
            out[row, int(n) - k : int(n)] = graph_io.TYPE_SCORED_ONLY
    return out if (out == graph_io.TYPE_SCORED_ONLY).any() else None


def validate_multi_vector_graph(
    references: list[Reference], graph: MultiVectorGraph, path: Path, atol: float
) -> list[CheckResult]:
    """The multi-vector graph against its PyTorch module on the encoder graphs' cases,
    and on each again with scored-only tokens; raise on a mismatch."""
    session = new_session(path)
    names = [o.name for o in session.get_outputs()]
    results: list[CheckResult] = []
    for ref in references:
        assert ref.tokens is not None, "graphs taking ids are checked on token embeddings"
        ids, type_ids = ref.tokens
        variants = [(ref.case.name, type_ids)]
        scored = scored_only_types(type_ids, ref.mask)
        if scored is not None:
            variants.append((f"{ref.case.name}, scored-only", scored))
        for case, types in variants:
            feeds = {
                graph_io.INPUT_IDS: ids,
                graph_io.INPUT_TOKEN_TYPES: types,
                graph_io.INPUT_MASK: ref.mask,
            }
            with torch.no_grad():
                want = graph(*(torch.from_numpy(feeds[n]) for n in graph_io.TEXT_GRAPH_INPUTS))
            got = session.run(names, feeds)
            for name, value, expected in zip(names, got, want, strict=True):
                diff, excess = differences(value, expected.numpy())
                result = CheckResult(path.name, case, name, list(value.shape), diff, atol, excess)
                results.append(result)
                if not result.passed:
                    raise ValidationError(path.name, name, tuple(value.shape), diff, atol)
    return results


# -------------------------------------------------------------------------- import


def late_interaction_kind(root: Path, hf: dict[str, Any]) -> Kind | None:
    """Which late-interaction layout the folder at ``root`` is in, if any."""
    st = root / ST_CONFIG
    model_type = read_json(st).get("model_type") if st.is_file() else None
    if model_type == "MultiVectorEncoder":
        return "multi_vector_encoder"
    if model_type == "ColBERT":
        return "pylate"
    if "HF_ColBERT" in (hf.get("architectures") or []):
        return "stanford"
    if (root / BGE_M3_COLBERT).is_file():
        return "bge_m3"
    return None


def load_late_interaction(
    root: Path,
    kind: Kind,
    state: dict[str, Tensor],
    d_model: int,
    tokenizer_file: Path,
    prompts: dict[str, str],
    read_weights: ReadWeights,
) -> LateInteractionImport:
    """The late-interaction part of the checkpoint at ``root`` (layout ``kind``), over a
    backbone of width ``d_model``; ``state`` holds the checkpoint's own tensors,
    ``prompts`` its sentence-transformers prompts, ``read_weights`` reads a module
    folder's tensors."""
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    if kind == "bge_m3":
        return _bge_m3(root, d_model, tokenizer, prompts)
    if kind == "stanford":
        return _stanford(root, state, d_model, tokenizer, prompts)
    return _sentence_transformers(root, kind, d_model, tokenizer, prompts, read_weights)


def _sentence_transformers(
    root: Path,
    kind: Kind,
    d_model: int,
    tokenizer: Tokenizer,
    prompts: dict[str, str],
    read_weights: ReadWeights,
) -> LateInteractionImport:
    """A MultiVectorEncoder folder, or a PyLate v3 one (``kind`` pylate)."""
    pylate = kind == "pylate"
    top = read_json(root / ST_CONFIG)
    found = modules(root)  # each type known, the folders inside root
    allowed = ("Transformer", "Dense") if pylate else tuple(MODULE_ORDER)
    order = [MODULE_ORDER.get(name, -1) for name, _ in found]
    if (
        not found
        or not set(n for n, _ in found) <= set(allowed)
        or found[0][0] != "Transformer"
        or order.count(0) != 1
        or order != sorted(order)
    ):
        raise CheckpointError(
            f"modules.json: a {'PyLate' if pylate else 'MultiVectorEncoder'} model is applied "
            f"as {', '.join(allowed)} in this order; found {', '.join(n for n, _ in found)}"
        )
    knobs = _pylate_knobs(top) if pylate else {}
    transformer = found[0][1] / "sentence_bert_config.json"
    saved = read_json(transformer) if transformer.is_file() else {}
    # The Transformer module's own config wins over PyLate's top-level defaults.
    knobs |= {
        k: saved[k] for k in ("query_length", "document_length", "query_expansion") if k in saved
    }
    dense = []
    for name, folder in found:
        if name != "Dense":
            continue
        config = read_json(folder / "config.json", f"{folder.name}/config.json")
        if config.get("module_input_name", TOKEN_INPUT) != TOKEN_INPUT:
            raise CheckpointError(f"{folder.name}: a Dense on pooled vectors is not applied here")
        dense.append(dense_weights(_dense(folder), read_weights(folder)))
    _check_chain(dense, d_model)
    masks = [folder for name, folder in found if name == "MultiVectorMask"]
    if len(masks) > 1:
        raise CheckpointError("modules.json: more than one MultiVectorMask")
    skip_words: list[str] = []
    sides: tuple[str, ...] = ("document",)
    if pylate:  # PyLate <= 3 applied a punctuation skiplist unless its config names one
        words = top.get("skiplist_words")
        skip_words = _words(words, ST_CONFIG) if words is not None else list(PUNCTUATION)
    elif masks:
        skip_words, sides = _mask_config(masks[0])
    expansion_raw = knobs.get("query_expansion")
    if expansion_raw is not None and not masks and not pylate:
        raise CheckpointError(
            "query_expansion without a MultiVectorMask: its expansion tokens are never scored"
        )
    normalize = pylate or any(name == "Normalize" for name, _ in found)
    for name, folder in found:
        if name == "Normalize" and (folder / "config.json").is_file():
            config = read_json(folder / "config.json", f"{folder.name}/config.json")
            if config.get("module_input_name", TOKEN_INPUT) != TOKEN_INPUT:
                raise CheckpointError(f"{folder.name}: a Normalize of pooled vectors")
    if pylate:
        prompts = _prefixed_prompts(top, prompts)
    markers = {
        side: str(top[key])
        for side, key in (("query", "query_prefix"), ("document", "document_prefix"))
        if pylate and top.get(key)
    }
    similarity = top.get("similarity_fn_name")
    return LateInteractionImport(
        kind=kind,
        dense=tuple(dense),
        sparse=None,
        normalize=normalize,
        similarity=similarity if similarity in SIMILARITIES else "maxsim",
        prompts=prompts,
        query_length=_length(knobs.get("query_length"), "query_length"),
        document_length=_length(knobs.get("document_length"), "document_length"),
        expansion=_expansion(root, expansion_raw, tokenizer),
        skiplist_ids=_skiplist_ids(skip_words, root, tokenizer),
        skiplist_sides=sides,
        tokenizer_json=_with_markers(tokenizer, markers),
    )


def _pylate_knobs(top: dict[str, Any]) -> dict[str, Any]:
    """PyLate v3's top-level lengths and expansion, as sentence-transformers'
    ``_parse_model_config`` translates them for the Transformer."""
    keys = ("query_length", "document_length", "query_expansion")
    knobs = {k: top[k] for k in keys if k in top and (top[k] is not None or k == "query_expansion")}
    if "query_expansion" not in knobs:  # every PyLate folder carries some marker key
        if top.get("do_query_expansion") is False:
            knobs["query_expansion"] = None
        else:
            attend = top.get("attend_to_expansion_tokens", top.get("attend_to_mask_tokens"))
            length = (
                knobs.pop("query_length", None) or top.get("query_length") or DEFAULT_QUERY_LENGTH
            )
            knobs["query_expansion"] = {
                "strategy": "fixed",
                "attend": bool(attend),
                "length": length,
            }
    return knobs


def _prefixed_prompts(top: dict[str, Any], prompts: dict[str, str]) -> dict[str, str]:
    """PyLate's query_prefix/document_prefix prepended to the saved prompts."""
    out = dict(prompts)
    for key, side in (("query_prefix", "query"), ("document_prefix", "document")):
        if key in top:
            prefix = str(top[key] or "")
            out[side] = prefix + (out.get(side) or "").removeprefix(prefix)
    return out


def _words(words: object, where: str) -> list[str]:
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise CheckpointError(f"{where}: skiplist_words must be a list of strings")
    return list(words)


def _mask_config(folder: Path) -> tuple[list[str], tuple[str, ...]]:
    """A MultiVectorMask's skiplist words and the sides it applies to."""
    config = read_json(folder / "config.json", f"{folder.name}/config.json")
    where = f"{folder.name}/config.json"
    words = _words(config.get("skiplist_words") or [], where)
    tasks = config.get("skiplist_tasks")
    tasks = ["document"] if tasks is None else [tasks] if isinstance(tasks, str) else tasks
    if not isinstance(tasks, list) or not set(tasks) <= set(SIDES):
        raise CheckpointError(f"{where}: skiplist_tasks must name some of {SIDES}")
    if config.get("keep_only_token_ids"):
        raise CheckpointError(f"{where}: keep_only_token_ids (image documents) is not applied")
    return words, tuple(side for side in SIDES if side in tasks)


def _length(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LENGTH:
        raise CheckpointError(f"{name} must be an integer in 1..{MAX_LENGTH}, got {value!r}")
    return value


def _special(root: Path, name: str) -> str | None:
    """A special token's text (``mask_token``, ``eos_token``...) from the tokenizer's
    config files."""
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        path = root / file
        value = read_json(path).get(name) if path.is_file() else None
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            return value
    return None


def _expansion(root: Path, raw: object, tokenizer: Tokenizer) -> QueryExpansion | None:
    """sentence-transformers' ``query_expansion`` with its token resolved: the named one,
    else the tokenizer's mask token, else its end-of-sequence token."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("strategy") not in ("fixed", "min"):
        raise CheckpointError(f"query_expansion {raw!r}: strategy fixed or min expected")
    unknown = set(raw) - {"strategy", "attend", "token", "length"}
    if unknown:
        raise CheckpointError(f"query_expansion has unknown keys {sorted(unknown)}")
    token = raw.get("token") or _special(root, "mask_token") or _special(root, "eos_token")
    token_id = None if token is None else tokenizer.token_to_id(str(token))
    if token_id is None:
        raise CheckpointError(f"query_expansion: token {token!r} is not in the vocabulary")
    attend = raw.get("attend", False)
    if not isinstance(attend, bool):
        raise CheckpointError("query_expansion.attend must be a boolean")
    length = _length(raw.get("length"), "query_expansion.length")
    if length is None:
        raise CheckpointError("query_expansion needs its length")
    return QueryExpansion(str(raw["strategy"]), length, token_id, attend)


def _skiplist_ids(words: list[str], root: Path, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The skiplist's token ids, as MultiVectorMask.resolve_with_tokenizer finds them: a
    word that is not one token of the vocabulary is dropped (it would map to unk)."""
    if len(words) > MAX_SKIPLIST:
        raise CheckpointError(f"skiplist_words: {len(words)} words, at most {MAX_SKIPLIST}")
    unk = _special(root, "unk_token")
    ids = set()
    for word in words:
        token_id = tokenizer.token_to_id(word)
        if token_id is not None or (word == unk and unk is not None):
            ids.add(token_id if token_id is not None else tokenizer.token_to_id(str(unk)))
    return tuple(sorted(i for i in ids if i is not None))


def _with_markers(tokenizer: Tokenizer, markers: dict[str, str]) -> str | None:
    """The tokenizer with each legacy marker as one special, non-normalised piece, as
    sentence-transformers' ``_register_prefix_tokens`` registers it (a marker the
    tokenizer does not know, or already keeps whole, is left alone); its tokenizer.json
    text, or None when nothing changed."""
    added = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    register = []
    for value in markers.values():
        if not value or not value.split():
            continue
        for prefix in (value, value.split(None, 1)[0]):
            if prefix not in added and prefix not in vocab:
                continue
            if tokenizer.encode(prefix, add_special_tokens=False).tokens != [prefix]:
                register.append(AddedToken(prefix, normalized=False, special=True))
            break
    if not register:
        return None
    tokenizer.add_special_tokens(register)
    text: str = tokenizer.to_str()
    return text


def _check_chain(dense: list[DenseWeights], d_model: int) -> None:
    width = d_model
    for d in dense:
        if d.layer.in_features != width:
            raise CheckpointError(
                f"the projection's in_features {d.layer.in_features} is not {width}, the width "
                "of the vectors before it"
            )
        width = d.layer.out_features


def _stanford(
    root: Path,
    state: dict[str, Tensor],
    d_model: int,
    tokenizer: Tokenizer,
    prompts: dict[str, str],
) -> LateInteractionImport:
    """Stanford ColBERT's HF_ColBERT: ``linear`` (no bias) beside the BERT weights, the
    settings in ``artifact.metadata`` (sentence-transformers'
    ``_maybe_load_stanford_metadata`` and ``_build_stanford_projection``)."""
    path = root / STANFORD_METADATA
    metadata = read_json(path) if path.is_file() else {}
    if "linear.weight" not in state:
        raise CheckpointError("an HF_ColBERT checkpoint without its linear.weight projection")
    weight = state["linear.weight"].float()
    if weight.ndim != 2 or weight.shape[1] != d_model:
        raise CheckpointError(
            f"linear.weight has shape {list(weight.shape)}, expected [dim, {d_model}]"
        )
    dim = int(weight.shape[0])
    if metadata.get("dim") not in (None, dim):
        raise CheckpointError(f"{STANFORD_METADATA}: dim {metadata['dim']} is not linear's {dim}")
    if metadata.get("similarity", "cosine") != "cosine":
        raise CheckpointError(
            f"{STANFORD_METADATA}: similarity {metadata['similarity']!r} is not served (cosine, "
            "MaxSim of normalised vectors, is)"
        )
    markers = {
        "query": str(metadata.get("query_token_id") or "[unused0]") + " ",
        "document": str(metadata.get("doc_token_id") or "[unused1]") + " ",
    }
    prompts = dict(prompts)
    for side, marker in markers.items():
        prompts.setdefault(side, marker)
    attend = bool(metadata.get("attend_to_mask_tokens"))
    length = metadata.get("query_maxlen") or DEFAULT_QUERY_LENGTH
    expansion = {"strategy": "fixed", "attend": attend, "length": length}
    words = list(PUNCTUATION) if metadata.get("mask_punctuation", True) else []
    layer = DenseLayer(d_model, dim, False, "identity")
    return LateInteractionImport(
        kind="stanford",
        dense=(DenseWeights(layer, weight, None),),
        sparse=None,
        normalize=True,
        similarity="maxsim",
        prompts=prompts,
        document_length=_length(metadata.get("doc_maxlen"), "doc_maxlen"),
        expansion=_expansion(root, expansion, tokenizer),
        skiplist_ids=_skiplist_ids(words, root, tokenizer),
        tokenizer_json=_with_markers(tokenizer, markers),
    )


def _torch_linear(path: Path, d_model: int) -> DenseWeights:
    """A saved ``torch.nn.Linear`` state dict (weight [out, d_model], bias [out])."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle that is not plain tensors, a truncated file
        raise CheckpointError(f"{path.name} is not a readable state dict: {exc}") from None
    if not isinstance(state, dict) or set(state) != {"weight", "bias"}:
        raise CheckpointError(f"{path.name} must hold a Linear's weight and bias")
    weight, bias = state["weight"].float(), state["bias"].float()
    if weight.ndim != 2 or weight.shape[1] != d_model or list(bias.shape) != [weight.shape[0]]:
        raise CheckpointError(
            f"{path.name}: weight {list(weight.shape)} and bias {list(bias.shape)} do not "
            f"make a Linear from {d_model}"
        )
    return DenseWeights(DenseLayer(d_model, int(weight.shape[0]), True, "identity"), weight, bias)


def _bge_m3(
    root: Path, d_model: int, tokenizer: Tokenizer, prompts: dict[str, str]
) -> LateInteractionImport:
    """bge-m3 (FlagEmbedding's BGEM3FlagModel): colbert_vecs = normalize(colbert_linear(
    h[:, 1:])), MaxSim over the query's vector count; the lexical weights
    relu(sparse_linear(h)) per token, its special tokens left out."""
    colbert = _torch_linear(root / BGE_M3_COLBERT, d_model)
    sparse_path = root / BGE_M3_SPARSE
    sparse = _torch_linear(sparse_path, d_model) if sparse_path.is_file() else None
    if sparse is not None and sparse.layer.out_features != 1:
        raise CheckpointError(f"{BGE_M3_SPARSE}: one weight per token expected")
    unused = []
    for name in ("cls_token", "eos_token", "pad_token", "unk_token"):
        token = _special(root, name)
        token_id = None if token is None else tokenizer.token_to_id(token)
        if token_id is None:
            raise CheckpointError(f"bge-m3: the tokenizer has no {name}")
        unused.append(token_id)
    return LateInteractionImport(
        kind="bge_m3",
        dense=(colbert,),
        sparse=sparse,
        normalize=True,
        similarity="meanmaxsim",
        prompts=dict(prompts),
        skip_first=True,
        unused_ids=tuple(sorted(set(unused))),
    )
