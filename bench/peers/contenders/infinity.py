"""infinity-emb on its ONNX (optimum) engine, in its own venv: with its graph
optimisation step (its default), and without it (the same venv, the before of a fix)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.lib.server import free_port, peer_process
from bench.peers.common import INFINITY_OFF, VENVS, Bench, Server
from bench.peers.wire import Call, openai_call
from bench.peers.workloads import Workload, text_batches


@contextmanager
def infinity(bench: Bench, scratch: Path, hf_dir: Path, optimise: bool = True) -> Iterator[Server]:
    """infinity-emb on its ONNX (optimum) engine, from the optimum export's directory.

    With ``optimise`` it runs its own graph optimisation step at start-up (its default);
    without, it serves the plain export, as it did while that step failed (the same
    venv, ``--onnx-disable-optimize``): the before of the fix, measured in the same run."""
    binary = VENVS / "infinity" / "bin" / "infinity_emb"
    port = free_port()
    cmd = [str(binary), "v2", "--model-id", ".", "--engine", "optimum", "--device", "cpu"]
    cmd += ["--pooling-method", "mean", "--host", "127.0.0.1", "--port", str(port)]
    cmd += [] if optimise else ["--onnx-disable-optimize"]
    tag = "" if optimise else "-unoptimised"
    hf_home = scratch / f"hf-home{tag}"  # where it saves the optimised graph
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "HF_HOME": str(hf_home),
    }
    log = scratch / f"infinity{tag}.log"

    def calls(w: Workload) -> dict[str, list[Call]]:
        if not w.text:
            return {}
        texts = text_batches(bench.inputs, w)
        if not optimise:  # one encoding is enough to show what the optimisation buys
            if w.key != "T1":  # T2: the optimised server alone
                return {}
            return {INFINITY_OFF: [openai_call("/embeddings", ".", t, "base64") for t in texts]}
        encodings = ("float", "base64") if w.key == "T1" else ("float",)  # T2: JSON floats
        return {
            f"infinity-emb OpenAI {'JSON floats' if enc == 'float' else enc}": [
                openai_call("/embeddings", ".", t, enc) for t in texts
            ]
            for enc in encodings
        }

    folder = infinity_folder(bench, hf_dir, scratch / f"infinity-model{tag}")
    with peer_process(cmd, env, port, ["/health"], log, cwd=folder, timeout=300) as pid:
        bench.note(infinity_optimisations(log, hf_home, optimise))
        yield Server(f"infinity-emb{tag}", pid, port, calls)


# Families whose position ids start after the padding id (RoBERTa's padding_idx + 1).
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "mpnet")


def infinity_folder(bench: Bench, hf_dir: Path, folder: Path) -> Path:
    """The optimum export as infinity-emb reads it, with one fix for offset positions.

    infinity-emb 0.0.78's optimum engine truncates at ``config.max_position_embeddings``
    tokens; where positions start after the padding id (MPNet's 514-entry table holds
    512 tokens) its start-up warm-up then indexes past the table and it exits. Its copy
    of ``config.json`` says how many tokens fit; the graph (linked, not copied) is the
    same, and T1's sentences are far shorter than either bound."""
    config = json.loads((hf_dir / "config.json").read_text())
    if config.get("model_type") not in OFFSET_POSITIONS:
        return hf_dir
    folder.mkdir(parents=True, exist_ok=True)
    for item in hf_dir.iterdir():
        if item.name != "config.json" and not (folder / item.name).exists():
            (folder / item.name).symlink_to(item)
    table = config["max_position_embeddings"]
    config["max_position_embeddings"] = table - config.get("pad_token_id", 1) - 1
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    bench.note(
        f"infinity-emb: its folder's config.json says max_position_embeddings "
        f"{config['max_position_embeddings']} (the tokens the {table}-entry position table "
        f"holds after {config['model_type']}'s padding offset): infinity-emb 0.0.78 "
        f"truncates at that value, and at {table} its start-up warm-up indexes past the "
        "table and it exits (the graph is the same; T1's sentences are far shorter)."
    )
    return folder


def infinity_optimisations(log: Path, hf_home: Path, optimise: bool = True) -> str:
    """What infinity-emb's optimisation step did, from its log and the graph it saved."""
    # One line per record: rich wraps them and puts "file.py:NN" at the right edge.
    text = re.sub(r"\s+", " ", log.read_text(errors="replace"))
    text = re.sub(r"\S+\.py:\d+ ", "", text)
    if not optimise:
        ran = "Optimizing model" in text or "Optimized model found" in text
        return f"{INFINITY_OFF}: the same venv with `--onnx-disable-optimize`, " + (
            "yet its log shows an optimisation step."
            if ran
            else "its log shows no "
            "optimisation step: it served the plain export, as before the fix."
        )
    failed = re.search(r"Optimization failed with (.*?)\. Going to use the unoptimized model", text)
    if failed:
        return (
            "infinity-emb: its graph optimisation step (optimum ORTOptimizer, level 99) "
            f"failed ('{failed.group(1).strip()}'), so it served the unoptimised export "
            "(onnxruntime's own session-level optimisations still apply)."
        )
    if "Optimizing model" not in text and "Optimized model found" not in text:
        return "infinity-emb: its log says nothing of its optimisation step (not run?)."
    fusions = [
        f"{name.strip()} ×{n}"
        for name, n in re.findall(r"fusion_base INFO: Fused (.*?): (\d+)", text)
    ]
    graphs = sorted(hf_home.glob("**/*_optimized.onnx"))
    ops = optimised_ops(graphs[-1]) if graphs else "no *_optimized.onnx found"
    optimum = sorted((VENVS / "infinity").glob("lib/python3.*/site-packages/optimum-*.dist-info"))
    version = (
        optimum[-1].name.removeprefix("optimum-").removesuffix(".dist-info") if optimum else "?"
    )
    return (
        f"infinity-emb: its optimisation step ran (optimum {version} ORTOptimizer, "
        "OptimizationConfig(optimization_level=99, optimize_for_gpu=False, fp16=False): "
        "onnxruntime's transformer fusions, then the session's level-99 graph "
        f"optimisations saved with the graph); its log: fused {', '.join(fusions) or 'nothing'}; "
        f"the graph it served holds {ops}."
    )


def optimised_ops(graph: Path) -> str:
    """The fused (com.microsoft) operators of an ONNX graph, counted."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.domain == "com.microsoft":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    fused = ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
    return f"{fused or 'no fused operators'} (of {len(model.graph.node)} nodes)"
