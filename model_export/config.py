"""Encoder architecture as one frozen dataclass, plus the named presets.

The config is the single description of a model: the PyTorch module is built
from it, it is written into the model directory's ``config.json`` and the
service reads it back from there to describe the model and size its limits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

Activation = Literal["gelu", "gelu_tanh", "relu", "silu"]
NormPlacement = Literal["post", "pre"]
Scoring = Literal["dot", "additive"]
Rotary = Literal["interleaved", "half"]
Norm = Literal["layer", "rms", "rms_plus_one"]

ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_tanh", "relu", "silu")
NORM_PLACEMENTS: tuple[str, ...] = ("post", "pre")
SCORINGS: tuple[str, ...] = ("dot", "additive")
ROTARIES: tuple[str, ...] = ("interleaved", "half")
NORMS: tuple[str, ...] = ("layer", "rms", "rms_plus_one")


class ConfigError(ValueError):
    """An encoder configuration that cannot describe a valid model."""


# The sane range of each size: a config.json is untrusted input, and the service sizes
# buffers from these before any graph is run (BERT-large is 1024 wide, 24 layers deep).
SIZE_BOUNDS: dict[str, int] = {
    "d_model": 1 << 16,
    "n_heads": 1 << 10,
    "n_layers": 1 << 10,
    "d_ff": 1 << 18,
    "max_seq_len": 1 << 20,
    "window": 1 << 20,
    "relative_buckets": 1 << 10,
    "relative_max_distance": 1 << 20,
    "global_every": 1 << 10,
    "relative_embeddings": 1 << 16,
    "position_buckets": 1 << 16,
    "score_scale_factor": 1 << 4,
    "lora_tasks": 1 << 8,
    "lora_rank": 1 << 12,
}


def check_size(name: str, value: object, bound: int, error: type[ValueError]) -> None:
    """``value`` is an integer in 1..``bound``, else ``error`` names the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
        raise error(f"{name} must be an integer in 1..{bound}, got {value!r}")


@dataclass(frozen=True)
class EncoderConfig:
    """Hyper-parameters of a multi-head self-attention encoder.

    Defaults follow BERT: post-LN, GELU, LayerNorm eps 1e-12, no dropout at
    inference. ``window`` is the radius r of restricted self-attention (token i
    sees j when |i - j| <= r); ``None`` means full attention.
    ``relative_buckets`` adds MPNet's relative position bias to the scores: one
    learned scalar per head and bucket of j - i (half the buckets for keys after
    the query; exact distances below a quarter of the buckets, log-spaced up to
    ``relative_max_distance``); ``None`` means no such bias.

    ``global_every`` n alternates global and local layers (ModernBERT): layers 0, n,
    2n, … attend to every key, the others within ``window``; ``None`` puts every
    layer in the window. ``rotary`` rotates each head's queries and keys by their
    position (RoFormer's ``"interleaved"`` pairs (x0, x1), (x2, x3)…; ModernBERT's
    ``"half"`` pairs (x_i, x_{i + d_k/2})) with frequencies ``rotary_theta``^(-2i/d_k);
    windowed layers use ``local_rotary_theta`` when set. ``alibi`` adds ALiBi's
    -m_h·|i - j| to the scores (m_h: the geometric slopes of Press et al.).
    ``glu`` makes the feed-forward gated: W_2 (act(W_1 x) ⊙ W_g x) (GeGLU with
    gelu, SwiGLU with silu). ``attention_bias``/``mlp_bias``/``norm_bias`` false drop
    the biases of the attention projections, the feed-forward and the LayerNorms;
    ``first_attn_norm`` false skips layer 0's pre-LN attention norm (ModernBERT,
    whose embeddings end in a norm).

    LLM-style layers: ``norm`` "rms" is RMSNorm, x / √(mean(x²) + eps) · w (no bias),
    "rms_plus_one" Gemma's · (1 + w); ``kv_heads`` < ``n_heads`` is grouped-query
    attention (query head h reads key/value head h // (n_heads / kv_heads)); ``head_size``
    sets d_k when it is not d_model / n_heads (Qwen3, Gemma3); ``qk_norm`` normalises each
    head's query and key (the layer's norm over d_k, before rotary: Qwen3, Gemma3);
    ``out_bias`` sets W_o's bias apart from q, k and v's (Qwen2: false), None as theirs.

    DeBERTa's disentangled attention: ``relative_embeddings`` k gives the encoder a
    table of 2k relative position embeddings shared by every layer (LayerNorm'd when
    ``relative_norm``); query i and key j read row clamp(δ + k, 0, 2k - 1) of it, δ the
    offset i - j, or its log bucket with ``position_buckets`` (exact below half the
    buckets, log-spaced up to ``relative_max_distance``). Each layer then adds
    content-to-position q_i·K_r[row] (``content_to_position``) and position-to-content
    k_j·Q_r[row] (``position_to_content``) to its scores, K_r and Q_r the rows projected
    by the layer's own key and query projections (``share_position_projections``) or by
    separate ones. Every score term is divided by √(d_k · ``score_scale_factor``)
    (DeBERTa: 1 + the number of position terms).
    Gemma3 (EmbeddingGemma): ``sandwich_norms`` adds a norm on each sub-layer's output
    before its residual sum (pre-LN only: x + norm(attn(norm(x))), then the same for the
    feed-forward); ``score_scale`` multiplies the scores instead of dividing them by √d_k
    (Gemma3: ``query_pre_attn_scalar``^-0.5); ``global_layers`` names the layers that see
    every key, the others seeing ``window`` (Gemma3's ``layer_types``; instead of
    ``global_every``); ``rotary_linear_factor`` divides the positions of the global layers'
    rotation (rope_type "linear"), None leaving them as they are.

    ``lora_tasks`` k > 0 gives every projection of every layer (q, k, v, out, up,
    down) and the word embeddings k task adapters of rank ``lora_rank`` (Jina v3's
    LoRA): W x + B_t A_t x for the task t each sequence names (model.TaskLoRA), the
    factors of all tasks stacked in one tensor and gathered by the task id; task 0
    is the base model (zero factors). 0: no adapters, no task input.
    """

    d_model: int = 384
    n_heads: int = 12
    n_layers: int = 6
    d_ff: int = 1536
    activation: Activation = "gelu"
    layer_norm_eps: float = 1e-12
    norm_placement: NormPlacement = "post"
    dropout: float = 0.0
    causal: bool = False
    window: int | None = None
    scoring: Scoring = "dot"
    max_seq_len: int = 512
    relative_buckets: int | None = None
    relative_max_distance: int = 128
    global_every: int | None = None
    rotary: Rotary | None = None
    rotary_theta: float = 10000.0
    local_rotary_theta: float | None = None
    alibi: bool = False
    glu: bool = False
    attention_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True
    first_attn_norm: bool = True
    # LLM-style layers (Llama, Qwen, Mistral, Gemma, EuroBERT):
    norm: Norm = "layer"
    kv_heads: int | None = None
    head_size: int | None = None
    qk_norm: bool = False
    out_bias: bool | None = None
    relative_embeddings: int | None = None
    position_buckets: int | None = None
    content_to_position: bool = False
    position_to_content: bool = False
    share_position_projections: bool = False
    relative_norm: bool = False
    score_scale_factor: int = 1
    # Gemma3 (EmbeddingGemma):
    sandwich_norms: bool = False
    score_scale: float | None = None
    global_layers: tuple[int, ...] | None = None
    rotary_linear_factor: float | None = None
    # Rotary refinements (GTE, NomicBERT), defaults leaving rotation as above: only the
    # first ``rotary_dims`` = int(d_k · rotary_fraction) dims of each head rotate, the rest
    # pass unchanged; ``rotary_inv_freq`` (one per rotated pair) replaces θ^(-2i/d_r) with
    # a scaled RoPE's frequencies (model_export.rope_scaling); ``rotary_scale`` multiplies
    # cos and sin (YaRN's attention factor). ``mlp_in_bias`` sets the feed-forward input
    # projection's bias apart from ``mlp_bias`` (GTE: none in, one out); None: as mlp_bias.
    rotary_fraction: float = 1.0
    rotary_inv_freq: tuple[float, ...] | None = None
    rotary_scale: float = 1.0
    mlp_in_bias: bool | None = None
    # Task adapters (Jina v3):
    lora_tasks: int = 0
    lora_rank: int = 0

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "d_ff", "max_seq_len"):
            check_size(name, getattr(self, name), SIZE_BOUNDS[name], ConfigError)
        if self.head_size is not None:
            check_size("head_size", self.head_size, SIZE_BOUNDS["d_model"], ConfigError)
        elif self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.norm_placement not in NORM_PLACEMENTS:
            raise ConfigError(
                f"norm_placement must be one of {NORM_PLACEMENTS}, got {self.norm_placement!r}"
            )
        if self.scoring not in SCORINGS:
            raise ConfigError(f"scoring must be one of {SCORINGS}, got {self.scoring!r}")
        if not self.layer_norm_eps > 0:
            raise ConfigError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.causal, bool):
            raise ConfigError(f"causal must be true or false, got {self.causal!r}")
        if self.window is not None:
            check_size("window", self.window, SIZE_BOUNDS["window"], ConfigError)
        bound = SIZE_BOUNDS["relative_max_distance"]
        check_size("relative_max_distance", self.relative_max_distance, bound, ConfigError)
        if self.relative_buckets is not None:
            bound = SIZE_BOUNDS["relative_buckets"]
            check_size("relative_buckets", self.relative_buckets, bound, ConfigError)
            # Each direction's half needs exact buckets below the log-spaced ones.
            exact = self.relative_buckets // 4
            if self.relative_buckets % 4 or self.relative_max_distance <= exact:
                raise ConfigError(
                    "relative_buckets must be a multiple of 4 with relative_max_distance > "
                    f"relative_buckets / 4, got {self.relative_buckets} and "
                    f"{self.relative_max_distance}"
                )
        for name in ("alibi", "glu", "attention_bias", "mlp_bias", "norm_bias", "first_attn_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.global_every is not None:
            check_size("global_every", self.global_every, SIZE_BOUNDS["global_every"], ConfigError)
            if self.window is None:
                raise ConfigError("global_every alternates global and windowed layers: set window")
        if self.rotary is not None and self.rotary not in ROTARIES:
            raise ConfigError(f"rotary must be one of {ROTARIES} or null, got {self.rotary!r}")
        if self.rotary is not None and self.head_dim % 2:
            raise ConfigError(f"rotary rotates pairs: head_dim ({self.head_dim}) must be even")
        for name in ("rotary_theta", "local_rotary_theta"):
            theta = getattr(self, name)
            if theta is not None and (
                isinstance(theta, bool) or not isinstance(theta, int | float) or not theta > 1
            ):
                raise ConfigError(f"{name} must be a number > 1, got {theta!r}")
        if self.norm not in NORMS:
            raise ConfigError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.kv_heads is not None:
            check_size("kv_heads", self.kv_heads, SIZE_BOUNDS["n_heads"], ConfigError)
            if self.n_heads % self.kv_heads:
                raise ConfigError(
                    f"n_heads ({self.n_heads}) must be a multiple of kv_heads ({self.kv_heads})"
                )
        if self.out_bias is not None and not isinstance(self.out_bias, bool):
            raise ConfigError(f"out_bias must be true, false or null, got {self.out_bias!r}")
        if not isinstance(self.qk_norm, bool):
            raise ConfigError(f"qk_norm must be true or false, got {self.qk_norm!r}")
        if self.norm != "layer" and self.norm_bias:
            raise ConfigError("RMSNorm has no bias: set norm_bias false")
        if self.norm_placement == "post" and not self.first_attn_norm:
            raise ConfigError("first_attn_norm false only applies to pre-LN (norm_placement pre)")
        if self.lora_tasks or self.lora_rank:  # both set, or neither
            check_size("lora_tasks", self.lora_tasks, SIZE_BOUNDS["lora_tasks"], ConfigError)
            check_size("lora_rank", self.lora_rank, SIZE_BOUNDS["lora_rank"], ConfigError)
        self._check_disentangled()
        self._check_gemma_fields()
        self._check_rotary_refinements()

    def _check_disentangled(self) -> None:
        """DeBERTa's switches: sizes in range, and no position term without its table."""
        for name in ("relative_embeddings", "position_buckets"):
            if getattr(self, name) is not None:
                check_size(name, getattr(self, name), SIZE_BOUNDS[name], ConfigError)
        bound = SIZE_BOUNDS["score_scale_factor"]
        check_size("score_scale_factor", self.score_scale_factor, bound, ConfigError)
        switches = (
            "content_to_position",
            "position_to_content",
            "share_position_projections",
            "relative_norm",
        )
        for name in switches:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.relative_embeddings is None:
            used = [name for name in (*switches, "position_buckets") if getattr(self, name)]
            if used:
                raise ConfigError(f"{', '.join(used)} need relative_embeddings")
            return
        if self.scoring != "dot":
            raise ConfigError("relative_embeddings (disentangled attention) needs dot scoring")
        if self.position_buckets is not None:
            # Log buckets divide by log((max_distance - 1) / (buckets / 2)): it must be > 0.
            half = self.position_buckets // 2
            if half < 1 or self.relative_max_distance - 1 <= half:
                raise ConfigError(
                    "position_buckets must be >= 2 with relative_max_distance - 1 > "
                    f"position_buckets / 2, got {self.position_buckets} and "
                    f"{self.relative_max_distance}"
                )

    def _check_gemma_fields(self) -> None:
        """``sandwich_norms``, ``score_scale``, ``global_layers``, ``rotary_linear_factor``."""
        if not isinstance(self.sandwich_norms, bool):
            raise ConfigError(f"sandwich_norms must be true or false, got {self.sandwich_norms!r}")
        if self.sandwich_norms and self.norm_placement != "pre":
            raise ConfigError("sandwich_norms only applies to pre-LN (norm_placement pre)")
        for name in ("score_scale", "rotary_linear_factor"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value < float("inf")
            ):
                raise ConfigError(f"{name} must be a finite number > 0 or null, got {value!r}")
        if self.rotary_linear_factor is not None and self.rotary is None:
            raise ConfigError("rotary_linear_factor scales the rotation: set rotary")
        if self.global_layers is None:
            return
        layers = self.global_layers
        if not isinstance(layers, list | tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.n_layers
            for i in layers
        ):
            raise ConfigError(
                f"global_layers must list layer indices in 0..{self.n_layers - 1}, got {layers!r}"
            )
        if list(layers) != sorted(set(layers)):
            raise ConfigError(f"global_layers must be increasing, got {list(layers)}")
        if self.window is None:
            raise ConfigError("global_layers sets the layers outside the window: set window")
        if self.global_every is not None:
            raise ConfigError("global_layers and global_every both place global layers: set one")
        object.__setattr__(self, "global_layers", tuple(layers))  # config.json gives a list

    def _check_rotary_refinements(self) -> None:
        fraction = self.rotary_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ConfigError(f"rotary_fraction must be a number in (0, 1], got {fraction!r}")
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(f"rotary_fraction must be a number in (0, 1], got {fraction!r}")
        if self.rotary is not None and (self.rotary_dims < 2 or self.rotary_dims % 2):
            raise ConfigError(
                f"rotary rotates pairs: int(head_dim · rotary_fraction) ({self.rotary_dims}) "
                "must be even and at least 2"
            )
        if isinstance(self.rotary_inv_freq, list):  # read back from JSON
            object.__setattr__(self, "rotary_inv_freq", tuple(self.rotary_inv_freq))
        freqs = self.rotary_inv_freq
        if freqs is not None:
            if self.rotary is None:
                raise ConfigError("rotary_inv_freq needs rotary")
            ok = all(
                isinstance(f, int | float)
                and not isinstance(f, bool)
                and math.isfinite(f)
                and f >= 0
                for f in freqs
            )
            if not isinstance(freqs, tuple) or len(freqs) != self.rotary_dims // 2 or not ok:
                raise ConfigError(
                    f"rotary_inv_freq must hold {self.rotary_dims // 2} finite numbers >= 0 (one "
                    f"per rotated pair), got {freqs!r}"
                )
        scale = self.rotary_scale
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale < 1e3:
            raise ConfigError(f"rotary_scale must be a number in (0, 1000), got {scale!r}")
        if self.mlp_in_bias is not None and not isinstance(self.mlp_in_bias, bool):
            raise ConfigError(f"mlp_in_bias must be true, false or null, got {self.mlp_in_bias!r}")

    @property
    def head_dim(self) -> int:
        """Size d_k of one head: ``head_size``, else d_model / n_heads."""
        return self.head_size if self.head_size is not None else self.d_model // self.n_heads

    @property
    def output_bias(self) -> bool:
        """Whether W_o has a bias: ``out_bias``, else as q, k and v."""
        return self.attention_bias if self.out_bias is None else self.out_bias

    @property
    def key_heads(self) -> int:
        """Key/value heads: ``kv_heads`` (grouped-query attention), else one per query head."""
        return self.kv_heads if self.kv_heads is not None else self.n_heads

    @property
    def rotary_dims(self) -> int:
        """How many of each head's d_k dims rotate (the first ones): int(d_k · rotary_fraction)."""
        return int(self.head_dim * self.rotary_fraction)

    @property
    def up_bias(self) -> bool:
        """Whether the feed-forward's input (and gate) projection has a bias."""
        return self.mlp_bias if self.mlp_in_bias is None else self.mlp_in_bias

    def layer_window(self, layer: int) -> int | None:
        """The window radius of ``layer``: None for a global layer."""
        if self.global_every is not None and layer % self.global_every == 0:
            return None
        if self.global_layers is not None and layer in self.global_layers:
            return None
        return self.window

    def layer_rotary_theta(self, layer: int) -> float:
        """The rotary base of ``layer``: ``local_rotary_theta`` in windowed layers, if set."""
        if self.layer_window(layer) is not None and self.local_rotary_theta is not None:
            return self.local_rotary_theta
        return self.rotary_theta

    def layer_rotary(self, layer: int) -> tuple[float, float | None]:
        """The rotary base of ``layer`` and the linear factor its positions are divided by
        (``rotary_linear_factor``, in global layers only; None: not scaled)."""
        scaled = self.layer_window(layer) is None
        return self.layer_rotary_theta(layer), self.rotary_linear_factor if scaled else None

    def parameters(self) -> int:
        """Weights of the encoder's layers (attention, feed-forward, layer norms) and its
        relative position bias table, without token embeddings: what each encoder graph
        holds."""
        d, ff = self.d_model, self.d_ff
        q, kv = self.n_heads * self.head_dim, self.key_heads * self.head_dim
        attention = 2 * d * q + 2 * d * kv + ((q + 2 * kv) if self.attention_bias else 0)
        attention += d if self.output_bias else 0
        attention += 2 * self.head_dim if self.qk_norm else 0
        up = 2 * ff if self.glu else ff
        feed_forward = d * up + ff * d + (up if self.up_bias else 0) + (d if self.mlp_bias else 0)
        norm = 2 * d if self.norm_bias else d
        per_layer = 4 if self.sandwich_norms else 2
        norms = per_layer * self.n_layers - (0 if self.first_attn_norm else 1)
        norms += 1 if self.norm_placement == "pre" else 0  # the final norm
        relative = (self.relative_buckets or 0) * self.n_heads
        if self.relative_embeddings is not None:  # DeBERTa's table, its norm, projections
            relative += 2 * self.relative_embeddings * d + (norm if self.relative_norm else 0)
            if not self.share_position_projections:
                terms = int(self.content_to_position) + int(self.position_to_content)
                attention += terms * (d * d + d)
        return self.n_layers * (attention + feed_forward + self.lora_parameters()) + (
            norms * norm + relative
        )

    def lora_parameters(self) -> int:
        """One layer's task-adapter factors (A [in, r] and B [r, out] per projection, for
        the base slot 0 and each task): 0 without adapters."""
        d, up = self.d_model, 2 * self.d_ff if self.glu else self.d_ff
        widths = 4 * (d + d) + (d + up) + (self.d_ff + d)  # q, k, v, out; up; down
        return (self.lora_tasks + 1) * self.lora_rank * widths if self.lora_tasks else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderConfig:
        """Build from a dict, rejecting unknown keys so typos do not pass silently."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        return cls(**data)


PRESETS: dict[str, EncoderConfig] = {
    "tiny": EncoderConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=128),
    "small": EncoderConfig(d_model=384, n_heads=12, n_layers=6, d_ff=1536),
    "base": EncoderConfig(d_model=768, n_heads=12, n_layers=12, d_ff=3072),
}


# Presets that import real weights (model_export.hf_import) instead of a random init.
CHECKPOINT_PRESETS: tuple[str, ...] = ("minilm-l6", "mpnet-base")


def preset(name: str, **overrides: Any) -> EncoderConfig:
    """Return the named preset, with any fields replaced by ``overrides``."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
    return EncoderConfig.from_dict({**base.to_dict(), **overrides})
