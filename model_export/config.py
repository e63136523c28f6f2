"""Encoder architecture as one frozen dataclass, plus the named presets.

The config is the single description of a model: the PyTorch module is built
from it, it is written into the model directory's ``config.json`` and the
service reads it back from there to describe the model and size its limits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

Activation = Literal["gelu", "gelu_tanh", "relu", "silu"]
NormPlacement = Literal["post", "pre"]
Scoring = Literal["dot", "additive"]
Rotary = Literal["interleaved", "half"]

ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_tanh", "relu", "silu")
NORM_PLACEMENTS: tuple[str, ...] = ("post", "pre")
SCORINGS: tuple[str, ...] = ("dot", "additive")
ROTARIES: tuple[str, ...] = ("interleaved", "half")


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
    lora_tasks: int = 0
    lora_rank: int = 0

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "d_ff", "max_seq_len"):
            check_size(name, getattr(self, name), SIZE_BOUNDS[name], ConfigError)
        if self.d_model % self.n_heads:
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
        if self.norm_placement == "post" and not self.first_attn_norm:
            raise ConfigError("first_attn_norm false only applies to pre-LN (norm_placement pre)")
        if self.lora_tasks or self.lora_rank:  # both set, or neither
            check_size("lora_tasks", self.lora_tasks, SIZE_BOUNDS["lora_tasks"], ConfigError)
            check_size("lora_rank", self.lora_rank, SIZE_BOUNDS["lora_rank"], ConfigError)

    @property
    def head_dim(self) -> int:
        """Size d_k of one head: d_model / n_heads."""
        return self.d_model // self.n_heads

    def layer_window(self, layer: int) -> int | None:
        """The window radius of ``layer``: None for a global layer."""
        if self.global_every is not None and layer % self.global_every == 0:
            return None
        return self.window

    def layer_rotary_theta(self, layer: int) -> float:
        """The rotary base of ``layer``: ``local_rotary_theta`` in windowed layers, if set."""
        if self.layer_window(layer) is not None and self.local_rotary_theta is not None:
            return self.local_rotary_theta
        return self.rotary_theta

    def parameters(self) -> int:
        """Weights of the encoder's layers (attention, feed-forward, layer norms) and its
        relative position bias table, without token embeddings: what each encoder graph
        holds."""
        d, ff = self.d_model, self.d_ff
        attention = 4 * d * d + (4 * d if self.attention_bias else 0)
        up = 2 * ff if self.glu else ff
        feed_forward = d * up + ff * d + ((up + d) if self.mlp_bias else 0)
        norm = 2 * d if self.norm_bias else d
        norms = 2 * self.n_layers - (0 if self.first_attn_norm else 1)
        norms += 1 if self.norm_placement == "pre" else 0  # the final norm
        relative = (self.relative_buckets or 0) * self.n_heads
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
