"""Task adapters: PEFT LoRA folders beside a checkpoint, stacked into the encoder's
per-task factors (model.TaskLoRALinear, TokenEmbeddings.word_lora).

transformers' Jina v3 (``JinaEmbeddingsV3Model``) keeps each task's LoRA as a PEFT
adapter in a subfolder of the checkpoint (``<task>/adapter_config.json`` and
``adapter_model.safetensors``), applied with ``model.load_adapter(path,
adapter_name=task, adapter_kwargs={"subfolder": task})`` then ``set_adapter``. PEFT's
LoRA adds ``scaling · B (A x)`` to a Linear (A [r, in], B [out, r]) and ``scaling ·
A[:, id]ᵀ Bᵀ`` to an Embedding (``lora_embedding_A`` [r, vocab], ``lora_embedding_B``
[d, r]), ``scaling`` = α / r (α / √r with ``use_rslora``). Here every task's factors
go into one stacked tensor per projection, zero-padded to the largest rank (exact:
the padded columns multiply zeros), slot 0 zero (the base model), the scaling folded
into B. What PEFT can express and this cannot (DoRA, LoRA biases, other modules
trained in full, ranks or alphas per module) is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from model_export.families.base import CheckpointError, Family
from model_export.model import Encoder, TaskLoRALinear, TokenEmbeddings
from model_export.st_folder import read_json

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# Keys of a saved PEFT adapter start so (the adapter's name is left out on save).
PEFT_PREFIX = "base_model.model."
# adapter_config.json options that change the math from plain LoRA: refused when set.
UNSUPPORTED = {
    "use_dora": "DoRA",
    "rank_pattern": "ranks per module",
    "alpha_pattern": "alphas per module",
    "modules_to_save": "modules trained in full",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D) layers",
    "lora_bias": "LoRA biases",
}
MAX_TASKS = 256


@dataclass(frozen=True)
class Adapter:
    """One task's LoRA: its folder, rank, scaling and factors by module path."""

    name: str
    folder: Path
    rank: int
    scaling: float
    weights: dict[str, Tensor] = field(repr=False)


@dataclass(frozen=True)
class TaskAdapters:
    """The checkpoint's task adapters, in task-id order (task t = tasks[t - 1])."""

    adapters: tuple[Adapter, ...]
    default: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.adapters)

    @property
    def rank(self) -> int:
        return max(a.rank for a in self.adapters)


def adapter_folders(root: Path) -> list[Path]:
    """The subfolders of ``root`` that hold a PEFT adapter, by name."""
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / ADAPTER_CONFIG).is_file())


def read_adapter(name: str, folder: Path) -> Adapter:
    """One PEFT LoRA folder; CheckpointError for anything but plain LoRA."""
    config = read_json(folder / ADAPTER_CONFIG)
    where = f"{folder.name}/{ADAPTER_CONFIG}"
    if config.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(f"{where}: peft_type {config.get('peft_type')!r} is not LORA")
    for key, what in UNSUPPORTED.items():
        if config.get(key):
            raise CheckpointError(f"{where}: {what} ({key}) are not supported")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 < rank <= 4096:
        raise CheckpointError(f"{where}: r must be an integer in 1..4096, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise CheckpointError(f"{where}: lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return Adapter(name, folder, rank, float(scaling), _adapter_weights(folder))


def _adapter_weights(folder: Path) -> dict[str, Tensor]:
    for file in ADAPTER_WEIGHTS:
        path = folder / file
        if path.is_file() and file.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(str(path))
        if path.is_file():
            state = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(state, dict):
                return state
    raise CheckpointError(f"{folder.name}: no {' or '.join(ADAPTER_WEIGHTS)}")


def stacked_state(
    adapters: TaskAdapters, family: Family, encoder: Encoder, embeddings: TokenEmbeddings
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The encoder's and the embeddings' adapter parameters (``*.lora_a``/``*.lora_b``,
    ``word_lora.*``) from ``adapters``; every adapter key used, else CheckpointError."""
    # Hugging Face module path -> our TaskLoRALinear(s) it adapts, per layer: a fused
    # q/k/v adapts three, its B's rows stacked q, k, v (A shared).
    linears: dict[str, tuple[TaskLoRALinear, ...]] = {}
    for i in range(encoder.config.n_layers):
        paths = {
            f"{family.layers}.{i}.{theirs}": ours for ours, theirs in family.layer_keys.items()
        }
        paths |= {alias.format(i=i): ours for alias, ours in family.adapter_aliases.items()}
        for path, ours in paths.items():
            module = encoder.get_submodule(f"layers.{i}.{ours}")
            if isinstance(module, TaskLoRALinear):
                linears[path] = (module,)
        if family.fused_qkv is not None:
            qkv = (encoder.get_submodule(f"layers.{i}.attn.{n}_proj") for n in "qkv")
            linears[f"{family.layers}.{i}.{family.fused_qkv}"] = tuple(
                m for m in qkv if isinstance(m, TaskLoRALinear)
            )
    enc = {
        f"{name}.{part}": torch.zeros_like(param)
        for name, module in encoder.named_modules()
        if isinstance(module, TaskLoRALinear)
        for part, param in (("lora_a", module.lora_a), ("lora_b", module.lora_b))
    }
    names = {id(module): name for name, module in encoder.named_modules()}
    assert embeddings.word_lora is not None
    emb = {f"word_lora.{k}": torch.zeros_like(v) for k, v in embeddings.word_lora.items()}
    word = family.embedding_keys["word"]
    problems: list[str] = []
    for t, adapter in enumerate(adapters.adapters, start=1):
        state = {_module_key(k, family): v.float() for k, v in adapter.weights.items()}
        used: set[str] = set()

        def factor(
            key: str,
            shape: tuple[int, int],
            adapter: Adapter = adapter,
            state: dict[str, Tensor] = state,
            used: set[str] = used,
        ) -> Tensor | None:
            tensor = state.get(key)
            if tensor is None:
                return None
            used.add(key)
            if tuple(tensor.shape) != shape:
                problems.append(
                    f"{adapter.name}: {key} has shape {list(tensor.shape)}, expected {list(shape)}"
                )
                return None
            return tensor

        r = adapter.rank
        for path, modules in linears.items():
            width = sum(m.out_features for m in modules)
            a = factor(f"{path}.lora_A.weight", (r, modules[0].in_features))
            b = factor(f"{path}.lora_B.weight", (width, r))
            if (a is None) != (b is None):
                problems.append(f"{adapter.name}: {path} has one LoRA factor of two")
            elif a is not None and b is not None:
                rows = torch.split(b, [m.out_features for m in modules])
                for module, b_rows in zip(modules, rows, strict=True):
                    name = names[id(module)]
                    if enc[f"{name}.lora_b"][t].any():
                        problems.append(f"{adapter.name}: {name} is adapted twice")
                    enc[f"{name}.lora_a"][t, :, :r] = a.t()
                    enc[f"{name}.lora_b"][t, :r] = (b_rows * adapter.scaling).t()
        vocab, width = embeddings.word.weight.shape
        a = factor(f"{word}.lora_embedding_A", (r, vocab))
        b = factor(f"{word}.lora_embedding_B", (width, r))
        if (a is None) != (b is None):
            problems.append(f"{adapter.name}: {word} has one LoRA factor of two")
        elif a is not None and b is not None:
            emb["word_lora.a"][t, :, :r] = a.t()
            emb["word_lora.b"][t, :r] = (b * adapter.scaling).t()
        extra = sorted(set(state) - used)
        if extra:
            problems.append(
                f"{adapter.name}: LoRA on modules this encoder has no adapter for: "
                + ", ".join(extra[:6])
                + (f" (+{len(extra) - 6} more)" if len(extra) > 6 else "")
            )
    if problems:
        raise CheckpointError("task adapters do not fit the encoder: " + "; ".join(problems))
    return enc, emb


def _module_key(key: str, family: Family) -> str:
    """A PEFT adapter key without PEFT's prefix and a task-head model's (``roberta.``)."""
    key = key.removeprefix(PEFT_PREFIX)
    for prefix in family.prefixes:
        if key.startswith(prefix) and not key.startswith(family.layers):
            return key[len(prefix) :]
    return key


def read_task_adapters(
    root: Path, names: dict[str, str], default: str | None
) -> TaskAdapters | None:
    """The PEFT adapters in ``root``'s subfolders, each named ``names.get(folder,
    folder)``, in ``names``' order then the folders'; None without any."""
    folders = adapter_folders(root)
    if not folders:
        return None
    if len(folders) > MAX_TASKS:
        raise CheckpointError(f"{len(folders)} task adapters: at most {MAX_TASKS} are supported")
    order = list(names)
    folders.sort(key=lambda p: (order.index(p.name) if p.name in order else len(order), p.name))
    adapters = tuple(read_adapter(names.get(p.name, p.name), p) for p in folders)
    found = [a.name for a in adapters]
    if default is not None and default not in found:
        raise CheckpointError(f"default task {default!r} is not one of the adapters {found}")
    return TaskAdapters(adapters, default)


def config_lists(hf: dict[str, Any], key: str) -> list[str]:
    """A list of names in ``config.json`` (empty when absent or not a list of strings)."""
    value = hf.get(key)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return []
