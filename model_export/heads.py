"""Task heads on the encoder: sequence classification and masked-LM read as SPLADE.

A cross-encoder (reranker) or classifier is the encoder plus a small head on the
first token (or the mean, ModernBERT's option); SPLADE is the encoder plus the
masked-LM head, read as ``max over tokens of log(1 + relu(logits))``. Each head is
exported as one graph from token ids (``graph_io.HEAD_GRAPHS``) whose encoder
weights are the same bytes as every other graph's, so ``weights.bin`` holds them
once; SPLADE's [B, T, vocab] logits never leave onnxruntime (only the [B, vocab]
maximum does). A causal LM read as a reranker (Qwen3-Reranker) is a one-label
classify head too: two rows of its LM head at the last token (``YesNoHead``), its
prompt template recorded beside it (model_export.llm_rerank).

Each family names its head's weights its own way (its module's ``classify`` and
``mlm`` keys, model_export.families); a checkpoint whose head is missing a key, or
of a family with no such head, is refused with the key or family named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model_export.families.base import Family
from model_export.llm_rerank import answer_ids, is_llm_reranker, llm_reranker
from model_export.manifest import LlmReranker
from model_export.model import Encoder, TokenEmbeddings

Task = Literal["classify", "splade"]
Activation = Literal["tanh", "gelu", "gelu_tanh", "relu", "silu"]


class HeadError(ValueError):
    """A checkpoint whose head cannot be imported."""


def activate(name: str, x: Tensor) -> Tensor:
    if name == "tanh":
        return torch.tanh(x)
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "silu":
        return F.silu(x)
    return F.relu(x)


class ClassificationHead(nn.Module):
    """logits = out(norm(act(dense(pooled)))): BERT's pooler + classifier, RoBERTa's
    classification head (dense, tanh, out_proj), DistilBERT's (ReLU), ModernBERT's
    (act, then a LayerNorm; first token or mean), DeBERTa's ContextPooler + classifier
    (first token, dense, pooler_hidden_act)."""

    def __init__(
        self,
        d_model: int,
        labels: int,
        activation: str,
        *,
        pooling: Literal["first", "mean"] = "first",
        norm: nn.LayerNorm | None = None,
        dense_bias: bool = True,
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model, bias=dense_bias)
        self.out = nn.Linear(d_model, labels)
        self.norm = norm
        self.activation = activation
        self.pooling = pooling
        self.eval()

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        if self.pooling == "mean":
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        else:
            pooled = hidden[:, 0]
        x = activate(self.activation, self.dense(pooled))
        if self.norm is not None:
            x = self.norm(x)
        logits: Tensor = self.out(x)  # (B, labels)
        return logits


class SpladeHead(nn.Module):
    """The masked-LM head (dense, act, LayerNorm, decoder over the vocabulary), then
    SPLADE's pooling: max over tokens of log(1 + relu(logits)), padding left out."""

    def __init__(
        self,
        d_model: int,
        vocab: int,
        activation: str,
        eps: float,
        *,
        norm_bias: bool = True,
        dense_bias: bool = True,
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model, bias=dense_bias)
        self.norm = nn.LayerNorm(d_model, eps=eps, bias=norm_bias)
        self.decoder = nn.Linear(d_model, vocab)
        self.activation = activation
        self.eval()

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        x = self.norm(activate(self.activation, self.dense(hidden)))
        # On rows (B*T, d): exported as Gemm with transB, which reads the decoder's
        # [vocab, d] matrix as stored, the same bytes as the tied word embeddings
        # (a MatMul would store its transpose: a second copy in weights.bin).
        flat = self.decoder(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        weights = torch.log1p(torch.relu(flat))  # (B, T, vocab), all >= 0
        # log1p(relu(.)) >= 0, so zeroing padding leaves each maximum over real tokens.
        splade: Tensor = (weights * mask.unsqueeze(-1).to(weights.dtype)).amax(dim=1)
        return splade


class YesNoHead(nn.Module):
    """A causal LM read as a reranker: at each sequence's last real token (right
    padding: position sum(mask) - 1), the logits of only the answer tokens' rows of the
    LM head (``rows``: [answers, d], gathered at export, never the [vocab, d] matrix),
    then logit(yes) - logit(no) (sentence-transformers' LogitScore; its sigmoid is the
    two-way softmax), or logit(yes) for one answer."""

    def __init__(self, rows: Tensor) -> None:
        super().__init__()
        answers, d_model = rows.shape
        self.answers = nn.Linear(d_model, answers, bias=False)
        with torch.no_grad():
            self.answers.weight.copy_(rows)
        self.eval()

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        last = (mask.sum(dim=1) - 1).clamp(min=0)  # (B,)
        index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])  # (B, 1, d)
        at = hidden.gather(1, index).squeeze(1)  # (B, d)
        logits: Tensor = self.answers(at)  # (B, answers)
        if logits.shape[1] == 2:
            return logits[:, :1] - logits[:, 1:]  # (B, 1)
        return logits


class HeadGraph(nn.Module):
    """Token ids, types and mask -> the head's answer: what ``HEAD_GRAPHS`` exports."""

    def __init__(self, embeddings: TokenEmbeddings, encoder: Encoder, head: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.encoder = encoder
        self.head = head

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        embeds = self.embeddings(input_ids, token_type_ids)
        hidden = self.encoder(embeds, attention_mask, weights=False).hidden
        out: Tensor = self.head(hidden, attention_mask)
        return out


@dataclass
class Head:
    """An imported head: its module and what the manifest records of it."""

    task: Task
    module: nn.Module
    labels: tuple[str, ...] = ()
    # The score function the checkpoint defines (manifest.ACTIVATIONS).
    activation: str = "identity"
    llm: LlmReranker | None = None  # a causal LM's yes/no head: how its prompt is built


HEAD_CHOICES = ("auto", "none", "classify", "splade")


def _json(path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text()) if path.is_file() else {}
    return raw if isinstance(raw, dict) else {}


def splade_folder(root: Path) -> bool:
    """A sentence-transformers SparseEncoder folder (MLMTransformer + SpladePooling); its
    pooling must be the one the SPLADE graph computes (max of log(1 + relu))."""
    modules_path = root / "modules.json"
    modules = json.loads(modules_path.read_text()) if modules_path.is_file() else []
    types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules if isinstance(m, dict)]
    if "SpladePooling" not in types:
        return False
    if types != ["MLMTransformer", "SpladePooling"]:
        raise HeadError(
            f"a SparseEncoder of modules {types} is not supported "
            "(MLMTransformer + SpladePooling is)"
        )
    pooling = modules[1].get("path") or ""
    config = _json(root / str(pooling) / "config.json")
    strategy = config.get("pooling_strategy", "max")
    function = config.get("activation_function", "relu")
    if (strategy, function) != ("max", "relu"):
        raise HeadError(
            f"SpladePooling {strategy}/{function} is not supported: the SPLADE graph computes "
            "max over tokens of log(1 + relu(logits))"
        )
    return True


def head_task(
    root: Path, hf: dict[str, Any], wanted: str, keys: set[str], family: Family
) -> Task | None:
    """The head to import: ``wanted`` (one of HEAD_CHOICES); auto takes SPLADE for a
    SparseEncoder folder, else reads config.json's architectures
    (*ForSequenceClassification: classify; *ForMaskedLM: SPLADE when the checkpoint's
    ``keys`` hold the masked-LM head, which many embedding models named so drop)."""
    if wanted not in HEAD_CHOICES:
        raise HeadError(f"head must be one of {HEAD_CHOICES}, got {wanted!r}")
    if wanted == "none":
        return None
    if wanted in ("classify", "splade"):
        return wanted  # type: ignore[return-value]
    if splade_folder(root):
        return "splade"
    if is_llm_reranker(root, hf):
        return "classify"
    names = [str(a) for a in hf.get("architectures") or []]
    if any(a.endswith("ForSequenceClassification") for a in names):
        return "classify"
    if any(a.endswith("ForMaskedLM") for a in names):
        mlm = family.mlm
        return "splade" if mlm is not None and f"{mlm.dense}.weight" in keys else None
    return None


def _pick(state: dict[str, Tensor], names: tuple[str, ...], what: str) -> Tensor:
    for name in names:
        if name in state:
            return state[name].float()
    raise HeadError(f"the checkpoint's {what} is missing: none of {', '.join(names)}")


def _linear(layer: nn.Linear, state: dict[str, Tensor], prefixes: tuple[str, ...]) -> None:
    with torch.no_grad():
        weight = _pick(state, tuple(f"{p}.weight" for p in prefixes), f"{prefixes[0]}.weight")
        if weight.shape != layer.weight.shape:
            raise HeadError(
                f"{prefixes[0]}.weight has shape {list(weight.shape)}, "
                f"expected {list(layer.weight.shape)}"
            )
        layer.weight.copy_(weight)
        if layer.bias is not None:
            layer.bias.copy_(_pick(state, tuple(f"{p}.bias" for p in prefixes), f"{prefixes[0]}"))


def labels_of(hf: dict[str, Any]) -> tuple[str, ...]:
    """``id2label`` in id order (``LABEL_i`` where the config names none)."""
    count = int(hf.get("num_labels") or len(hf.get("id2label") or {}) or 2)
    names = {int(k): str(v) for k, v in (hf.get("id2label") or {}).items()}
    if names and sorted(names) != list(range(len(names))):
        raise HeadError("config.json's id2label must number its labels 0..n-1")
    count = len(names) or count
    return tuple(names.get(i, f"LABEL_{i}") for i in range(count))


# sentence-transformers' CrossEncoder activations (config.json) -> the manifest's names.
_ST_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Softmax": "softmax",
}


def score_activation(root: Path, hf: dict[str, Any], labels: int) -> str:
    """The score function: sentence-transformers' CrossEncoder's when its folder names
    one (``config_sentence_transformers.json`` since 5.x, ``config.json`` before); else
    as transformers' text-classification pipeline applies it (sigmoid for one label or
    multi-label problems, softmax over several)."""
    st = hf.get("sentence_transformers") or {}
    named = _json(root / "config_sentence_transformers.json").get("activation_fn")
    named = named or (st.get("activation_fn") if isinstance(st, dict) else None)
    named = named or hf.get("sbert_ce_default_activation_function")
    if isinstance(named, str):
        if named not in _ST_ACTIVATIONS:
            known = list(_ST_ACTIVATIONS)
            raise HeadError(f"CrossEncoder activation {named!r} is not one of {known}")
        return _ST_ACTIVATIONS[named]
    if labels == 1 or hf.get("problem_type") == "multi_label_classification":
        return "sigmoid"
    return "softmax"


def load_head(
    root: Path,
    task: Task,
    family: Family,
    hf: dict[str, Any],
    state: dict[str, Tensor],
    encoder: Encoder,
) -> Head:
    """The ``task`` head of a ``family`` checkpoint at ``root``, its weights from
    ``state`` (the checkpoint's own keys, prefixes kept)."""
    if task == "classify" and _causal(hf):
        return _yes_no_head(root, family, hf, state, encoder)
    if task == "classify":
        return _classify_head(root, family, hf, state, encoder)
    return _splade_head(family, hf, state, encoder)


# Hugging Face activation names -> ours (model.FeedForward's, and tanh).
_HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
}


def _hf_activation(name: object) -> str:
    if str(name) not in _HF_ACTIVATIONS:
        raise HeadError(f"the head's activation {name!r} is not supported")
    return _HF_ACTIVATIONS[str(name)]


def _classify_head(
    root: Path, family: Family, hf: dict[str, Any], state: dict[str, Tensor], encoder: Encoder
) -> Head:
    keys = family.classify
    if keys is None:
        raise HeadError(f"no sequence-classification head is defined for {family.model_types[0]!r}")
    config = encoder.config
    labels = labels_of(hf)
    norm = None
    if keys.norm is not None:
        norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.norm_bias)
        _norm(norm, state, keys.norm)
    act = keys.activation
    if act == "config":  # ModernBERT's classifier_activation, DeBERTa's pooler_hidden_act
        act = _hf_activation(hf.get(keys.activation_key, "gelu"))
    mean = keys.configurable and hf.get("classifier_pooling") == "mean"
    head = ClassificationHead(
        config.d_model,
        len(labels),
        act,
        pooling="mean" if mean else "first",
        norm=norm,
        dense_bias=bool(hf.get("classifier_bias", False)) if keys.configurable else True,
    )
    _linear(head.dense, state, keys.dense)
    _linear(head.out, state, (keys.out,))
    return Head("classify", head, labels, score_activation(root, hf, len(labels)))


def _causal(hf: dict[str, Any]) -> bool:
    return any(str(a).endswith("ForCausalLM") for a in hf.get("architectures") or [])


def _yes_no_head(
    root: Path, family: Family, hf: dict[str, Any], state: dict[str, Tensor], encoder: Encoder
) -> Head:
    """A ``*ForCausalLM`` reranker: two rows of its LM head (or of the word embeddings
    it is tied to), its prompt template and instruction (model_export.llm_rerank)."""
    keys = family.lm_head
    if keys is None:
        raise HeadError(f"no causal-LM head is defined for {family.model_types[0]!r}")
    tokenizer = root / "tokenizer.json"
    answers = answer_ids(root, tokenizer if tokenizer.is_file() else None)
    tied = bool(hf.get("tie_word_embeddings", False))
    key = keys.tied if tied else keys.weight
    weight = _pick(state, (key,), key)
    vocab, d_model = int(hf["vocab_size"]), encoder.config.d_model
    if weight.shape != (vocab, d_model):
        raise HeadError(f"{key} has shape {list(weight.shape)}, expected {[vocab, d_model]}")
    beyond = [i for i in answers[1] if not 0 <= i < vocab]
    if beyond:
        raise HeadError(f"answer token id {beyond[0]} is beyond the vocabulary of {vocab}")
    rows = weight[list(answers[1])].clone()  # (answers, d): only these rows are exported
    st = _json(root / "config_sentence_transformers.json")
    prompts = st.get("prompts") if isinstance(st.get("prompts"), dict) else {}
    named = st.get("default_prompt_name")
    llm = llm_reranker(
        root,
        answers,
        {str(k): str(v) for k, v in (prompts or {}).items()},
        named if isinstance(named, str) else None,
    )
    return Head("classify", YesNoHead(rows), ("score",), score_activation(root, hf, 1), llm)


def _splade_head(
    family: Family, hf: dict[str, Any], state: dict[str, Tensor], encoder: Encoder
) -> Head:
    keys = family.mlm
    if keys is None:
        raise HeadError(f"no masked-LM (SPLADE) head is defined for {family.model_types[0]!r}")
    config = encoder.config
    configurable = family.classify is not None and family.classify.configurable
    activation = keys.activation or _hf_activation(
        hf.get("classifier_activation" if configurable else "hidden_act")
        or hf.get("activation")
        or "gelu"
    )
    mlm = SpladeHead(
        config.d_model,
        int(hf["vocab_size"]),
        activation,
        config.layer_norm_eps,
        norm_bias=config.norm_bias,
        dense_bias=bool(hf.get("classifier_bias", False)) if configurable else True,
    )
    _linear(mlm.dense, state, (keys.dense,))
    _norm(mlm.norm, state, keys.norm)
    with torch.no_grad():
        # Usually tied to the word embeddings (and then not saved): the same matrix.
        weight = _pick(state, (f"{keys.decoder}.weight", *keys.tied), f"{keys.decoder}.weight")
        if weight.shape != mlm.decoder.weight.shape:
            raise HeadError(f"{keys.decoder}.weight has shape {list(weight.shape)}")
        mlm.decoder.weight.copy_(weight)
        mlm.decoder.bias.copy_(_pick(state, keys.decoder_bias, "decoder bias"))
    return Head("splade", mlm)


def _norm(norm: nn.LayerNorm, state: dict[str, Tensor], key: str) -> None:
    with torch.no_grad():
        norm.weight.copy_(_pick(state, (f"{key}.weight",), f"{key}.weight"))
        if norm.bias is not None:
            norm.bias.copy_(_pick(state, (f"{key}.bias",), f"{key}.bias"))
