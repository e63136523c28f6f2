"""What a sentence-transformers folder adds to a checkpoint: its modules, pooling,
normalisation, Dense layers and prompts.

A checkpoint folder is untrusted input, as a model directory is: every file read
here is bounded before it is parsed, ``modules.json`` must be a list of module
objects, each module's folder must stay inside the checkpoint folder (symbolic
links resolved; files inside it may still be links, as in Hugging Face's cache),
and the prompts are bounded by the manifest's limits before any weight is read.
Every module is either applied or refused by name: a module the export leaves out
would serve vectors unlike the model's own.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from model_export.manifest import (
    MAX_CONFIG_BYTES,
    MAX_DENSE_FEATURES,
    MAX_DENSE_LAYERS,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_NAME,
    MAX_PROMPTS,
    DenseLayer,
    Pooling,
)


class CheckpointError(ValueError):
    """A checkpoint that does not fit the encoder: missing, extra or misshapen keys."""


# sentence-transformers' pooling modes -> ours: ``pooling_mode`` (a name, since 5.x) or
# the older ``pooling_mode_*`` flags, which folders on the Hub mostly still carry.
POOLING_MODES: Final[dict[str, Pooling]] = {
    "mean": "mean",
    "cls": "cls",
    "max": "max",
    "lasttoken": "last",
}
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# The module types applied, by class name -> their place in the order they must come.
# A SparseEncoder's MLMTransformer + SpladePooling are the SPLADE head's (heads.py); a
# CrossEncoder's LogitScore, an LLM reranker's yes/no head (heads.YesNoHead).
APPLIED: Final = {
    "Transformer": 0,
    "MLMTransformer": 0,
    "Pooling": 1,
    "SpladePooling": 1,
    "LogitScore": 1,
    "Dense": 2,
    "Normalize": 3,
    "MultiVectorMask": 3,  # a MultiVectorEncoder's (model_export.late_interaction)
}
# Module types are sentence-transformers' (PyLate's Dense is read as theirs).
MODULE_PACKAGES: Final = ("sentence_transformers.", "pylate.")
# Dense's activation (the class name in its ``activation_function``) -> ours.
DENSE_ACTIVATIONS: Final = {"Identity": "identity", "Tanh": "tanh", "ReLU": "relu"}
MAX_MODULES: Final = 64


@dataclass(frozen=True)
class DenseModule:
    """sentence-transformers' ``Dense``: activation(x W^T + b) on the pooled vector."""

    path: Path  # its folder (config.json, model.safetensors or pytorch_model.bin)
    layer: DenseLayer


@dataclass(frozen=True)
class SentenceRecipe:
    """How sentence-transformers turns a checkpoint's token vectors into one vector."""

    pooling: Pooling | None  # None: the folder has no 1_Pooling
    normalize: bool  # a Normalize module follows the pooling
    include_prompt: bool  # false: a prompt's tokens ([CLS] with them) are not pooled
    dense: tuple[DenseModule, ...] = ()  # applied in order after pooling, before Normalize


def read_json(path: Path, what: str | None = None) -> dict[str, Any]:
    """A checkpoint's JSON object, at most MAX_CONFIG_BYTES; CheckpointError otherwise."""
    name = what or path.name
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"{name} is not readable: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{name} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{name} is not readable JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{name} is not a JSON object")
    return raw


def module_dir(root: Path, relative: object) -> Path:
    """A module's folder inside ``root``; one that leaves it (``..``, absolute, or a
    symbolic link out) is refused."""
    if not isinstance(relative, str):
        raise CheckpointError(f"modules.json: a module's path must be text, got {relative!r}")
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise CheckpointError(
            f"modules.json: module path {relative!r} leads outside the checkpoint folder"
        )
    return path


def modules(root: Path) -> list[tuple[str, Path]]:
    """``modules.json`` as (class name, folder) in order, each type applied or refused."""
    path = root / "modules.json"
    if not path.is_file():
        return []
    try:
        with path.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        raw = json.loads(data) if len(data) <= MAX_CONFIG_BYTES else None
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"modules.json is not readable JSON: {exc}") from None
    if (
        not isinstance(raw, list)
        or len(raw) > MAX_MODULES
        or not all(isinstance(m, dict) and isinstance(m.get("type"), str) for m in raw)
    ):
        raise CheckpointError(
            f"modules.json must be a list of at most {MAX_MODULES} modules, each an object "
            "with a type"
        )
    found = []
    for m in raw:
        kind = m["type"].rsplit(".", 1)[-1]
        if not m["type"].startswith(MODULE_PACKAGES) or kind not in APPLIED:
            raise CheckpointError(
                f"modules.json: module {m['type']!r} is not applied by this exporter (it "
                f"applies sentence-transformers' {', '.join(APPLIED)}); served without it, "
                "vectors would differ from the model's own"
            )
        found.append((kind, module_dir(root, m.get("path", ""))))
    order = [APPLIED[kind] for kind, _ in found]
    if order != sorted(order) or order.count(0) > 1 or order.count(1) > 1:
        raise CheckpointError(
            "modules.json: modules in the order "
            f"{', '.join(kind for kind, _ in found)} are not applied (the order applied: "
            "Transformer, Pooling, Dense..., Normalize; a SparseEncoder's MLMTransformer, "
            "SpladePooling; a CrossEncoder's Transformer, LogitScore)"
        )
    return found


def _pooling_modes(config: dict[str, Any]) -> list[str]:
    """sentence-transformers' pooling modes of a ``1_Pooling/config.json``, in either form
    (mean when none is on, as sentence-transformers reads it)."""
    mode = config.get("pooling_mode")
    if isinstance(mode, str):
        return [mode]
    if isinstance(mode, list):
        return [str(m) for m in mode]
    return [name for flag, name in _POOLING_FLAGS.items() if config.get(flag)] or ["mean"]


def _dense(folder: Path) -> DenseModule:
    """One Dense module's config, checked; hf_import reads its weights."""
    config = read_json(folder / "config.json", f"{folder.name}/config.json")
    sizes: list[int] = []
    for key in ("in_features", "out_features"):
        size = config.get(key)
        if isinstance(size, bool) or not isinstance(size, int):
            raise CheckpointError(f"{folder.name}: {key} must be an integer, got {size!r}")
        if not 1 <= size <= MAX_DENSE_FEATURES:
            raise CheckpointError(f"{folder.name}: {key} must be in 1..{MAX_DENSE_FEATURES}")
        sizes.append(size)
    activation = str(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
    kind = activation.rsplit(".", 1)[-1]
    if not activation.startswith("torch.") or kind not in DENSE_ACTIVATIONS:
        raise CheckpointError(
            f"{folder.name}: activation_function {activation!r} is not applied (this exporter "
            f"applies {', '.join(DENSE_ACTIVATIONS)})"
        )
    for key, default in (("use_residual", False),):
        if config.get(key, default) != default:
            raise CheckpointError(f"{folder.name}: Dense with {key} is not applied")
    bias = config.get("bias", True) is not False
    return DenseModule(folder, DenseLayer(sizes[0], sizes[1], bias, DENSE_ACTIVATIONS[kind]))


def sentence_recipe(root: Path) -> SentenceRecipe:
    """The sentence-embedding recipe of a sentence-transformers folder (no pooling, no
    normalisation for a plain checkpoint).

    Pooling comes from the Pooling module's ``config.json`` (``1_Pooling`` without a
    ``modules.json``): one of mean, cls, max, lasttoken; anything else is refused
    rather than served as another pooling, which would give vectors unlike the
    model's own; with its ``include_prompt``. Dense layers and normalisation come
    from the ``Dense`` and ``Normalize`` modules in ``modules.json``.
    """
    found = modules(root)
    if any(kind == "MultiVectorMask" for kind, _ in found):
        raise CheckpointError(
            "modules.json: a MultiVectorMask outside a MultiVectorEncoder folder "
            "(config_sentence_transformers.json's model_type) is not applied"
        )
    folders = [folder for kind, folder in found if kind == "Pooling"]
    pooling_dir = folders[0] if folders else module_dir(root, "1_Pooling")
    pooling: Pooling | None = None
    include_prompt = True
    if (pooling_dir / "config.json").is_file():
        config = read_json(pooling_dir / "config.json", f"{pooling_dir.name}/config.json")
        modes = _pooling_modes(config)
        if len(modes) != 1 or modes[0] not in POOLING_MODES:
            raise CheckpointError(
                f"1_Pooling/config.json pools by {' + '.join(modes)}, which this exporter "
                f"does not serve (it serves one of {', '.join(POOLING_MODES)})"
            )
        pooling = POOLING_MODES[modes[0]]
        include_prompt = config.get("include_prompt", True) is not False
    dense = tuple(_dense(folder) for kind, folder in found if kind == "Dense")
    if dense and pooling is None:
        raise CheckpointError("modules.json: Dense without a Pooling module is not applied")
    if len(dense) > MAX_DENSE_LAYERS:
        raise CheckpointError(f"modules.json: at most {MAX_DENSE_LAYERS} Dense modules")
    for before, after in itertools.pairwise(dense):
        if after.layer.in_features != before.layer.out_features:
            raise CheckpointError(
                f"{after.path.name}: in_features {after.layer.in_features} is not "
                f"{before.path.name}'s out_features {before.layer.out_features}"
            )
    normalize = any(kind == "Normalize" for kind, _ in found)
    return SentenceRecipe(pooling, normalize, include_prompt, dense)


def sentence_prompts(root: Path) -> tuple[dict[str, str], str | None]:
    """sentence-transformers' ``prompts`` and ``default_prompt_name``
    (``config_sentence_transformers.json``), within the manifest's bounds."""
    path = root / "config_sentence_transformers.json"
    raw = read_json(path) if path.is_file() else {}
    prompts = raw.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise CheckpointError(f"{path.name}: prompts must map names to texts")
    if len(prompts) > MAX_PROMPTS:
        raise CheckpointError(f"{path.name}: {len(prompts)} prompts, at most {MAX_PROMPTS}")
    for name, text in prompts.items():
        if not 0 < len(name) <= MAX_PROMPT_NAME or len(text) > MAX_PROMPT_CHARS:
            raise CheckpointError(
                f"{path.name}: prompt {name[:MAX_PROMPT_NAME]!r}: names are 1..{MAX_PROMPT_NAME} "
                f"characters and prompts at most {MAX_PROMPT_CHARS}"
            )
    default = raw.get("default_prompt_name")
    return dict(prompts), default if default in prompts else None
