"""int8 (and bf16) on a CPU with VNNI: speed and agreement of quantised graphs vs fp32.

For each model directory, ``model.onnx`` and ``model_attn.onnx`` are written as:
``dynamic`` (what ``--quantize int8`` exports: ``quantize_dynamic``, per-channel
int8 weights, activations quantised at run time), ``dynamic-keep`` (the same
with the fewest layers' feed-forward output fp32 for cosine 0.99 on the
calibration sentences: ``--int8-keep-cosine 0.99 --int8-recipe dynamic``),
``nbits8`` and ``nbits4`` (every weight MatMul as onnxruntime's block-wise
``MatMulNBits``, 8 bits in blocks of 128 and 4 bits in blocks of 32,
``accuracy_level`` 4: int8 compute with per-block activation scales; a fused
``Attention`` keeps its fp32 Q/K/V weights), ``smooth-dynamic`` (SmoothQuant
on every weight MatMul's activation, then ``dynamic``), ``smooth-blockwise``
(what ``--quantize int8`` exports: SmoothQuant and ``dynamic`` but the
feed-forward outputs as ``nbits8``; ``model_export.int8_recipe``),
``dynamic-blockwise`` (``smooth-blockwise`` without the smoothing), ``qdq`` and
``qoperator`` (``quantize_static``, per-channel int8 weights and uint8
activations whose ranges were calibrated on real sentences, in the two formats
onnxruntime offers). Smoothing scales come from the calibration sentences.
bf16 is only checked: onnxruntime's CPU provider has no bf16 MatMul.
With ``--ov-python`` (a separate venv with ``onnxruntime-openvino``), the
OpenVINO execution provider is timed too, in a worker process of that venv,
against its own CPU-provider fp32 in the same rounds.

Speed: 2 intra-op threads, spinning off (as our server), token-embedding
inputs of shapes ``SHAPES`` and text batches of 32 sentences (the fp32 lookup
``embeddings.onnx`` included, tokenizing not); interleaved rounds, median ms.
Agreement, on held-out sentences (never calibrated on): cosine of mean-pooled
sentence embeddings vs fp32 (min, mean), and the largest absolute difference of
attention weights (``model_attn.onnx``).

    .venv/bin/python -m bench.int8 models/minilm-l6 models/mpnet-base --rounds 3

Writes ``bench/out/int8.json`` and prints a markdown table rendered from it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.models import OUT, ROOT, model_config
from bench.lib.report import table
from bench.lib.results import write_json
from model_export.quantize_sentences import KEEP_SEED, KEEP_SENTENCES, sentences

SHAPES = ((1, 16), (8, 128))
TEXT_BATCH = 32
THREADS = 2
GRAPHS = ("model.onnx", "model_attn.onnx")
ATTENTIONS = 1  # model_attn.onnx's outputs: last_hidden_state, attentions, …
CPU_VARIANTS = (
    "fp32", "dynamic", "dynamic-keep", "nbits8", "nbits4", "smooth-dynamic", "smooth-blockwise"
)  # fmt: skip
# Also accepted by --variants:
OTHER_VARIANTS = ("dynamic-blockwise", "qdq", "qoperator")
# dynamic-keep: the cosine its fp32 layers are chosen for on the calibration sentences,
# as `--int8-keep-cosine 0.99` chooses them.
KEEP_TARGET = 0.99

# Calibration (what --int8-keep-cosine chooses on) and held-out sets: two seeded draws.
CALIBRATION_SENTENCES, CALIBRATION_SEED = KEEP_SENTENCES, KEEP_SEED
HELD_OUT_SENTENCES, HELD_OUT_SEED = 128, 2


# --- inputs ---------------------------------------------------------------------------


class TextInputs:
    """Tokenizer and fp32 lookup graph of a model directory: sentences to graph feeds."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        from bench.lib.reference import ort_session

        config = model_config(model_dir)
        text = config["text"]
        self.tokenizer = Tokenizer.from_file(str(model_dir / text["tokenizer"]))
        self.tokenizer.enable_padding()
        self.tokenizer.enable_truncation(config["architecture"]["max_seq_len"])
        self.embed = ort_session(model_dir / text["embeddings_graph"], THREADS)
        self.vocab = int(text["vocab_size"])

    def ids(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)  # (B, T)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)  # (B, T)
        return ids, mask

    def embeds(self, ids: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids, "token_type_ids": np.zeros_like(ids)}
        embeds: np.ndarray = self.embed.run(None, feeds)[0]  # (B, T, d)
        return embeds

    def feeds(self, texts: list[str]) -> dict[str, np.ndarray]:
        ids, mask = self.ids(texts)
        return {"inputs_embeds": self.embeds(ids), "attention_mask": mask}


# --- variants -------------------------------------------------------------------------


class Calibration:
    """onnxruntime's ``CalibrationDataReader``: the calibration sentences, 16 a batch."""

    def __init__(self, inputs: TextInputs, batch: int = 16) -> None:
        texts = sentences(CALIBRATION_SENTENCES, CALIBRATION_SEED)
        self.batches = [inputs.feeds(texts[i : i + batch]) for i in range(0, len(texts), batch)]
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.position >= len(self.batches):
            return None
        self.position += 1
        return self.batches[self.position - 1]

    def rewind(self) -> None:
        self.position = 0


def build(model_dir: Path, work: Path, variants: list[str], inputs: TextInputs) -> None:
    """Write each variant's ``GRAPHS`` under ``work/<variant>/`` (kept between runs)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat

    from bench import int8_variants
    from model_export.int8_recipe import DYNAMIC
    from model_export.quantize import (
        feed_forward_outputs,
        quantize_graph_dynamic,
        quantize_graph_static,
        sensitive_matmuls,
    )

    for variant in variants:
        if variant == "fp32":
            continue
        layers: list[int] = []
        if variant == "dynamic-keep" and not (work / variant / "keep.json").exists():
            calibration = Calibration(inputs)
            batches = [(b["inputs_embeds"], b["attention_mask"]) for b in calibration.batches]
            (work / variant).mkdir(parents=True, exist_ok=True)
            model = model_dir / "model.onnx"
            kept, reached = sensitive_matmuls(model, batches, KEEP_TARGET, DYNAMIC)
            order = feed_forward_outputs(model_dir / "model.onnx")
            layers = sorted(order.index(node) for node in kept)
            keep = {"fp32_layers": layers, "calibration_cosine_min": reached}
            (work / variant / "keep.json").write_text(json.dumps(keep))
            print(f"{model_dir.name}: {variant} keeps {keep}", flush=True)
        elif variant == "dynamic-keep":
            layers = json.loads((work / variant / "keep.json").read_text())["fp32_layers"]
        for graph in GRAPHS:
            dst = work / variant / graph
            if dst.exists():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            if variant == "dynamic":
                quantize_graph_dynamic(model_dir / graph, dst)
            elif variant == "dynamic-keep":
                order = feed_forward_outputs(model_dir / graph)
                quantize_graph_dynamic(model_dir / graph, dst, [order[i] for i in layers])
            elif variant in int8_variants.BUILDERS:
                build_variant = int8_variants.BUILDERS[variant]
                build_variant(model_dir / graph, dst, Calibration(inputs).batches)
            else:
                quant_format = QuantFormat.QDQ if variant == "qdq" else QuantFormat.QOperator
                quantize_graph_static(
                    model_dir / graph,
                    dst,
                    Calibration(inputs),
                    quant_format=quant_format,
                    method=CalibrationMethod.MinMax,
                )
            took = time.perf_counter() - start
            print(f"{model_dir.name}: {variant} {graph} in {took:.0f} s", flush=True)


def graph_path(model_dir: Path, work: Path, variant: str, graph: str) -> Path:
    return model_dir / graph if variant == "fp32" else work / variant / graph


def bf16_check() -> str:
    """Why there is no bf16 row: what onnxruntime's CPU provider answers for a bf16 MatMul."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    a, b = (helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [2, 2]) for n in "ab")
    c = helper.make_tensor_value_info("c", TensorProto.BFLOAT16, [2, 2])
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "g", [a, b], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # the refusal is the finding
        return f"onnxruntime {ort.__version__} CPU: {exc}"
    return f"onnxruntime {ort.__version__} CPU: bf16 MatMul accepted"


# --- speed ----------------------------------------------------------------------------


def speed_cases(inputs: TextInputs, d_model: int) -> dict[str, dict[str, np.ndarray]]:
    """Feeds per case: token embeddings of seeded random ids per shape, and real text."""
    rng = np.random.default_rng(0)
    cases = {}
    for batch, seq in SHAPES:
        ids = rng.integers(1000, inputs.vocab, size=(batch, seq)).astype(np.int64)
        cases[f"[{batch},{seq}]"] = {
            "inputs_embeds": inputs.embeds(ids),
            "attention_mask": np.ones((batch, seq), dtype=np.int64),
        }
    texts = sentences(TEXT_BATCH, HELD_OUT_SEED + 100)
    ids, mask = inputs.ids(texts)
    cases[f"text {TEXT_BATCH}"] = {"input_ids": ids, "attention_mask": mask}
    return cases


def time_sessions(
    sessions: dict[str, Any],
    cases: dict[str, dict[str, np.ndarray]],
    rounds: int,
    seconds: float,
    embed: Any = None,
) -> dict[str, dict[str, float]]:
    """Median ms per case and session, rounds interleaved (A B C A B C …). A case with
    ``input_ids`` runs the lookup graph ``embed`` first, as serving text does."""
    result: dict[str, dict[str, float]] = {}
    for case, feeds in cases.items():
        times: dict[str, list[float]] = {name: [] for name in sessions}

        def once(session: Any, feeds: dict[str, np.ndarray] = feeds) -> None:
            if "input_ids" in feeds:
                ids = feeds["input_ids"]
                token_types = np.zeros_like(ids)
                embeds = embed.run(None, {"input_ids": ids, "token_type_ids": token_types})[0]
                session.run(
                    None, {"inputs_embeds": embeds, "attention_mask": feeds["attention_mask"]}
                )
            else:
                session.run(None, feeds)

        for _ in range(rounds):
            for name, session in sessions.items():
                once(session)  # warm
                runs, start = 0, time.perf_counter()
                while time.perf_counter() - start < seconds or runs < 2:
                    once(session)
                    runs += 1
                times[name].append((time.perf_counter() - start) / runs * 1000)
        result[case] = {name: statistics.median(t) for name, t in times.items()}
        print(
            f"  {case}: " + ", ".join(f"{n} {m:.2f}" for n, m in result[case].items()), flush=True
        )
    return result


# --- agreement ------------------------------------------------------------------------


def pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(np.float32)  # (B, T, 1)
    out: np.ndarray = (hidden * weights).sum(1) / weights.sum(1)  # (B, d)
    return out


def agreement(
    model_dir: Path, work: Path, variants: list[str], inputs: TextInputs
) -> dict[str, dict[str, float]]:
    """Per variant vs fp32 on the held-out sentences, 16 a batch: cosine (min, mean) of
    mean-pooled embeddings (``model.onnx``), attention max abs diff (``model_attn.onnx``)."""
    from bench.lib.reference import ort_session

    texts = sentences(HELD_OUT_SENTENCES, HELD_OUT_SEED)
    batches = [inputs.feeds(texts[i : i + 16]) for i in range(0, len(texts), 16)]
    reference: dict[str, list[np.ndarray]] = {graph: [] for graph in GRAPHS}
    for graph in GRAPHS:
        session = ort_session(model_dir / graph, THREADS)
        for feeds in batches:
            out = session.run(None, feeds)
            reference[graph].append(out[0] if graph == "model.onnx" else out[ATTENTIONS])
    result = {}
    for variant in variants:
        if variant == "fp32":
            continue
        cosines: list[np.ndarray] = []
        attention = 0.0
        embeddings = ort_session(graph_path(model_dir, work, variant, "model.onnx"), THREADS)
        attn = ort_session(graph_path(model_dir, work, variant, "model_attn.onnx"), THREADS)
        for i, feeds in enumerate(batches):
            a = pooled(reference["model.onnx"][i], feeds["attention_mask"])
            b = pooled(embeddings.run(None, feeds)[0], feeds["attention_mask"])
            cosines.append((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))
            got = attn.run(None, feeds)[ATTENTIONS]  # (B, L, H, T, T)
            attention = max(attention, float(np.abs(got - reference["model_attn.onnx"][i]).max()))
        every = np.concatenate(cosines)
        result[variant] = {
            "sentences": len(every),
            "cosine_min": round(float(every.min()), 5),
            "cosine_mean": round(float(every.mean()), 5),
            "attention_max_abs_diff": round(attention, 4),
        }
        print(f"  {variant}: {result[variant]}", flush=True)
    return result


# --- profile --------------------------------------------------------------------------


def profile(path: Path, feeds: dict[str, np.ndarray], runs: int = 10) -> dict[str, float]:
    """Share of node time per operator type over ``runs`` runs (onnxruntime's profiler)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_profiling = True
    options.profile_file_prefix = str(OUT / "int8-profile")
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        session.run(None, feeds)
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    totals: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            totals[op] = totals.get(op, 0.0) + event["dur"]
    whole = sum(totals.values())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return {op: round(us / whole, 3) for op, us in ranked}


# --- OpenVINO worker ------------------------------------------------------------------


def ov_worker(spec_path: Path) -> int:
    """In the OpenVINO venv: time CPU-provider fp32 against the OpenVINO provider on the
    given graphs, interleaved; agreement of the OpenVINO outputs with CPU fp32."""
    import onnxruntime as ort

    spec = json.loads(spec_path.read_text())
    data = np.load(spec["data"])
    cases = {
        case: {k.split("|", 1)[1]: data[k] for k in data.files if k.startswith(case + "|")}
        for case in spec["cases"]
    }
    held_out = [
        {k.split("|", 1)[1]: data[k] for k in data.files if k.startswith(f"held{i}|")}
        for i in range(spec["held_out_batches"])
    ]

    def session(path: str, provider: str, precision: str | None = None) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = THREADS
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        if provider == "cpu":
            return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        ov = {"device_type": "CPU", "num_of_threads": str(THREADS)}
        if precision:
            ov["precision"] = precision
        return ort.InferenceSession(
            path, options, providers=[("OpenVINOExecutionProvider", ov), "CPUExecutionProvider"]
        )

    sessions = {"cpu-fp32": session(spec["fp32"], "cpu")}
    errors = {}
    for name, path, precision in (
        ("ov-fp32", spec["fp32"], "FP32"),
        ("ov-default", spec["fp32"], None),
        ("ov-int8", spec["qdq"], None),
    ):
        try:
            sessions[name] = session(path, "ov", precision)
        except Exception as exc:  # recorded; the others still run
            errors[name] = str(exc)[:300]
    embed = session(spec["embed"], "cpu")
    timed = time_sessions(sessions, cases, spec["rounds"], spec["seconds"], embed)
    agree = {}
    for name, s in sessions.items():
        if name == "cpu-fp32":
            continue
        cosines = []
        for feeds in held_out:
            a = pooled(sessions["cpu-fp32"].run(None, feeds)[0], feeds["attention_mask"])
            b = pooled(s.run(None, feeds)[0], feeds["attention_mask"])
            cosines.append((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))
        every = np.concatenate(cosines)
        agree[name] = {
            "sentences": len(every),
            "cosine_min": round(float(every.min()), 5),
            "cosine_mean": round(float(every.mean()), 5),
        }
    result = {
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        "median_ms": timed,
        "agreement": agree,
        "errors": errors,
    }
    Path(spec["out"]).write_text(json.dumps(result, indent=2))
    return 0


def run_ov(
    ov_python: str,
    model_dir: Path,
    work: Path,
    inputs: TextInputs,
    cases: dict[str, dict[str, np.ndarray]],
    rounds: int,
    seconds: float,
) -> dict[str, Any]:
    texts = sentences(HELD_OUT_SENTENCES, HELD_OUT_SEED)
    arrays = {f"{case}|{k}": v for case, feeds in cases.items() for k, v in feeds.items()}
    held = [inputs.feeds(texts[i : i + 16]) for i in range(0, len(texts), 16)]
    arrays.update({f"held{i}|{k}": v for i, feeds in enumerate(held) for k, v in feeds.items()})
    np.savez(work / "ov-inputs.npz", **arrays)  # type: ignore[arg-type]
    spec = {
        "data": str(work / "ov-inputs.npz"),
        "cases": list(cases),
        "held_out_batches": len(held),
        "fp32": str(model_dir / "model.onnx"),
        "qdq": str(work / "qdq" / "model.onnx"),
        "embed": str(model_dir / model_config(model_dir)["text"]["embeddings_graph"]),
        "rounds": rounds,
        "seconds": seconds,
        "out": str(work / "ov.json"),
    }
    (work / "ov-spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [ov_python, "-m", "bench.int8", "--ov-worker", str(work / "ov-spec.json")]
    done = subprocess.run(command, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        return {"error": f"worker exited {done.returncode}"}
    result: dict[str, Any] = json.loads((work / "ov.json").read_text())
    return result


# --- report ---------------------------------------------------------------------------


def render(results: dict[str, Any]) -> str:
    """One table: a row per model and variant, each case's speed as a multiple of fp32's
    (same run), and the held-out agreement."""
    cases = list(results["models"][0]["median_ms"]) if results["models"] else []
    header = ["model", "variant", *(f"{c} ×fp32" for c in cases), "cos min", "cos mean",
              "attn Δmax"]  # fmt: skip
    rows = []
    for model in results["models"]:
        name, ms = model["name"], model["median_ms"]
        rows.append([name, "fp32 (ms)", *(f"{ms[c]['fp32']:.2f}" for c in cases), "", "", ""])
        for v in (v for v in model["variants"] if v != "fp32"):
            a = model["agreement"][v]
            rows.append(
                [name, v, *(f"{ms[c]['fp32'] / ms[c][v]:.2f}" for c in cases),
                 f"{a['cosine_min']:.4f}", f"{a['cosine_mean']:.4f}",
                 f"{a['attention_max_abs_diff']:.3f}"]
            )  # fmt: skip
        ov = model.get("openvino")
        if ov and "median_ms" in ov:
            for v, a in ov["agreement"].items():
                speed = [ov["median_ms"][c]["cpu-fp32"] / ov["median_ms"][c][v] for c in cases]
                rows.append(
                    [name, f"{v} (vs its CPU fp32)", *(f"{s:.2f}" for s in speed),
                     f"{a['cosine_min']:.4f}", f"{a['cosine_mean']:.4f}", "–"]
                )  # fmt: skip
    return table(header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dirs", type=Path, nargs="*")
    parser.add_argument("--variants", default=",".join(CPU_VARIANTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.4, help="per case, round, variant")
    parser.add_argument("--work", type=Path, default=OUT / "int8-work", help="quantised graphs")
    parser.add_argument("--ov-python", help="python of a venv with onnxruntime-openvino")
    parser.add_argument("--profile", action="store_true", help="op shares at [8,128]")
    parser.add_argument("--matmul", action="store_true", help="one MatMul's kernels too")
    parser.add_argument("--ov-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=OUT / "int8.json")
    args = parser.parse_args(argv)
    if args.ov_worker:
        return ov_worker(args.ov_worker)
    import onnxruntime as ort

    from bench.lib.reference import ort_session

    variants = args.variants.split(",")
    results: dict[str, Any] = {
        "onnxruntime": ort.__version__,
        "cpu_flags": sorted(_cpu_flags()),
        "bf16": bf16_check(),
        "threads": THREADS,
        "models": [],
    }
    for model_dir in args.model_dirs:
        config = model_config(model_dir)
        work = args.work / config["name"]
        work.mkdir(parents=True, exist_ok=True)
        inputs = TextInputs(model_dir)
        build(model_dir, work, variants, inputs)
        print(f"{config['name']}: agreement", flush=True)
        agree = agreement(model_dir, work, variants, inputs)
        print(f"{config['name']}: speed", flush=True)
        cases = speed_cases(inputs, config["architecture"]["d_model"])
        sessions = {
            v: ort_session(graph_path(model_dir, work, v, "model.onnx"), THREADS) for v in variants
        }
        timed = time_sessions(sessions, cases, args.rounds, args.seconds, inputs.embed)
        model: dict[str, Any] = {
            "name": config["name"],
            "variants": variants,
            "median_ms": timed,
            "agreement": agree,
        }
        if args.profile:
            model["profile"] = {
                v: profile(graph_path(model_dir, work, v, "model.onnx"), cases["[8,128]"])
                for v in variants
            }
        if args.ov_python:
            print(f"{config['name']}: OpenVINO", flush=True)
            model["openvino"] = run_ov(
                args.ov_python, model_dir, work, inputs, cases, args.rounds, args.seconds
            )
        results["models"].append(model)
        write_json(args.out, results)
    if args.matmul:
        from bench.int8_variants import matmul_kernels

        results["matmul"] = matmul_kernels(args.work / "matmul", args.rounds, args.seconds)
        fp32 = results["matmul"]["median_ms"]["fp32"]
        for name, ms in results["matmul"]["median_ms"].items():
            error = results["matmul"]["relative_error"][name]
            print(f"  {name}: {ms:.2f} ms, {fp32 / ms:.2f}x fp32, relative error {error}")
    write_json(args.out, results)
    print(render(results))
    return 0


def _cpu_flags() -> set[str]:
    """The CPU's int8/bf16 features (x86 Linux), as /proc/cpuinfo names them."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return set()
    return {f for f in flags if "vnni" in f or "bf16" in f or f.startswith("amx") or f == "avx2"}


if __name__ == "__main__":
    sys.exit(main())
