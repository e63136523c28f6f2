"""bench.int8's newer variants (block-wise and SmoothQuant builders) and one MatMul's
kernels timed alone (``--matmul``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bench.int8 import THREADS, time_sessions


def _nbits(bits: int, block: int) -> Any:
    def quantize(src: Path, dst: Path, calibration: list[dict[str, np.ndarray]]) -> None:
        from model_export.int8_recipe import blockwise

        blockwise(src, dst, None, bits=bits, block=block)

    return quantize


def _smooth_dynamic(src: Path, dst: Path, calibration: list[dict[str, np.ndarray]]) -> None:
    import tempfile

    from model_export.int8_recipe import SMOOTH_ALPHA
    from model_export.quantize import quantize_graph_dynamic
    from model_export.smooth import smooth_file

    with tempfile.TemporaryDirectory() as tmp:
        smooth_file(src, Path(tmp) / "smoothed.onnx", calibration, SMOOTH_ALPHA)
        quantize_graph_dynamic(Path(tmp) / "smoothed.onnx", dst)


def _smooth_blockwise(src: Path, dst: Path, calibration: list[dict[str, np.ndarray]]) -> None:
    from model_export.int8_recipe import SMOOTH_BLOCKWISE, quantize_graph

    quantize_graph(SMOOTH_BLOCKWISE, src, dst, calibration)


def _dynamic_blockwise(src: Path, dst: Path, calibration: list[dict[str, np.ndarray]]) -> None:
    """``smooth-blockwise`` without the smoothing."""
    import tempfile

    from model_export.int8_recipe import blockwise
    from model_export.quantize import feed_forward_outputs, quantize_graph_dynamic

    outputs = feed_forward_outputs(src)
    with tempfile.TemporaryDirectory() as tmp:
        quantize_graph_dynamic(src, Path(tmp) / "dynamic.onnx", outputs)
        blockwise(Path(tmp) / "dynamic.onnx", dst, outputs)


BUILDERS = {
    "nbits8": _nbits(8, 128),
    "dynamic-blockwise": _dynamic_blockwise,
    "nbits4": _nbits(4, 32),
    "smooth-dynamic": _smooth_dynamic,
    "smooth-blockwise": _smooth_blockwise,
}


MATMUL = (1024, 384, 1536)  # [8,128] tokens through MiniLM's feed-forward up-projection


def matmul_kernels(work: Path, rounds: int, seconds: float) -> dict[str, Any]:
    """One MatMul (M, K, N = ``MATMUL``, seeded weights) as fp32, dynamic int8 and
    ``MatMulNBits`` (8/4 bits, blocks of 32/128, accuracy_level 4 and 0): median ms and
    the largest error relative to fp32's largest output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from bench.lib.reference import ort_session
    from model_export.int8_recipe import blockwise
    from model_export.quantize import quantize_graph_dynamic

    m, k, n = MATMUL
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32) * 0.05, "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])
    node = helper.make_node("MatMul", ["x", "w"], ["y"], "matmul")
    model = helper.make_model(
        helper.make_graph([node], "matmul", [x], [y], [weight]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 9
    work.mkdir(parents=True, exist_ok=True)
    paths = {"fp32": work / "matmul.onnx", "dynamic": work / "matmul-dynamic.onnx"}
    onnx.save(model, str(paths["fp32"]))
    quantize_graph_dynamic(paths["fp32"], paths["dynamic"])
    for bits in (8, 4):
        for block in (32, 128):
            for level in (4, 0):
                name = f"nbits{bits} block {block} level {level}"
                paths[name] = work / f"matmul-{bits}-{block}-{level}.onnx"
                blockwise(paths["fp32"], paths[name], None, bits=bits, block=block, level=level)
    sessions = {name: ort_session(path, THREADS) for name, path in paths.items()}
    feeds = {"x": rng.standard_normal((m, k), dtype=np.float32)}
    timed = time_sessions(sessions, {f"[{m},{k}]x[{k},{n}]": feeds}, rounds, seconds)
    want = sessions["fp32"].run(None, feeds)[0]
    errors = {
        name: round(float(np.abs(s.run(None, feeds)[0] - want).max() / np.abs(want).max()), 4)
        for name, s in sessions.items()
    }
    return {"median_ms": next(iter(timed.values())), "relative_error": errors}
