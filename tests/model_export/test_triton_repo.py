"""The Triton/KServe model repository: config.pbtxt parses as Triton's ModelConfig and
agrees with each ONNX graph's inputs and outputs.

Triton's ``model_config.proto`` (triton-inference-server/common) is public; the
messages this test needs are rebuilt below with the same names, numbers and
enum values, so ``text_format.Parse`` refuses anything Triton would not read.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from onnx import numpy_helper

from model_export import graph_io
from model_export.triton import write_repository

F = descriptor_pb2.FieldDescriptorProto
DATA_TYPES = ["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32",
              "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16",
              "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"]  # fmt: skip
ONNX_TYPES = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.INT64: "TYPE_INT64"}


def _field(
    name: str, number: int, kind: int, *, repeated: bool = False, type_name: str = ""
) -> Any:
    label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
    return F(name=name, number=number, type=kind, label=label, type_name=type_name or None)


def model_config_class() -> Any:
    """inference.ModelConfig, with the fields of Triton's proto that a repository here uses."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="model_config_subset.proto", package="inference", syntax="proto3"
    )
    data_type = proto.enum_type.add(name="DataType")
    for number, name in enumerate(DATA_TYPES):
        data_type.value.add(name=name, number=number)
    group = proto.message_type.add(name="ModelInstanceGroup")
    kind = group.enum_type.add(name="Kind")
    for number, name in enumerate(["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"]):
        kind.value.add(name=name, number=number)
    group.field.extend(
        [
            _field("name", 1, F.TYPE_STRING),
            _field("kind", 4, F.TYPE_ENUM, type_name=".inference.ModelInstanceGroup.Kind"),
            _field("count", 2, F.TYPE_INT32),
        ]
    )
    for message, dims in (("ModelInput", 4), ("ModelOutput", 3)):
        proto.message_type.add(name=message).field.extend(
            [
                _field("name", 1, F.TYPE_STRING),
                _field("data_type", 2, F.TYPE_ENUM, type_name=".inference.DataType"),
                _field("dims", dims, F.TYPE_INT64, repeated=True),
            ]
        )
    proto.message_type.add(name="ModelDynamicBatching").field.extend(
        [
            _field("preferred_batch_size", 1, F.TYPE_INT32, repeated=True),
            _field("max_queue_delay_microseconds", 2, F.TYPE_UINT64),
        ]
    )
    proto.message_type.add(name="ModelConfig").field.extend([
        _field("name", 1, F.TYPE_STRING),
        _field("platform", 2, F.TYPE_STRING),
        _field("max_batch_size", 4, F.TYPE_INT32),
        _field("input", 5, F.TYPE_MESSAGE, repeated=True, type_name=".inference.ModelInput"),
        _field("output", 6, F.TYPE_MESSAGE, repeated=True, type_name=".inference.ModelOutput"),
        _field("instance_group", 7, F.TYPE_MESSAGE, repeated=True,
               type_name=".inference.ModelInstanceGroup"),
        _field("dynamic_batching", 11, F.TYPE_MESSAGE,
               type_name=".inference.ModelDynamicBatching"),
    ])  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))


ModelConfig = model_config_class()


@pytest.fixture(scope="module")
def triton_repo(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton")
    assert write_repository(tiny_model_dir, repo) == ["tiny", "tiny_hidden", "tiny_attn"]
    return repo


def _onnx_dims(value: onnx.ValueInfoProto) -> list[int]:
    """Non-batch dims as Triton declares them: symbolic (dynamic) axes are -1."""
    dims = value.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else -1 for d in dims][1:]


@pytest.mark.parametrize(
    ("model", "graph"),
    [("tiny", graph_io.GRAPH_EMBEDDINGS), ("tiny_hidden", graph_io.GRAPH_HIDDEN_STATES),
     ("tiny_attn", graph_io.GRAPH_ATTENTION)],
)  # fmt: skip
def test_config_parses_as_triton_model_config_and_matches_the_graph(
    triton_repo: Path, tiny_model_dir: Path, model: str, graph: str
) -> None:
    config = text_format.Parse((triton_repo / model / "config.pbtxt").read_text(), ModelConfig())
    assert (config.name, config.platform) == (model, "onnxruntime_onnx")
    assert config.max_batch_size >= 1 and config.HasField("dynamic_batching")
    assert [g.kind for g in config.instance_group] == [2]  # KIND_CPU
    onnx_file = triton_repo / model / "1" / "model.onnx"
    # The same graph and weights as the model directory's (its own weight file beside it).
    assert (onnx_file.parent / graph_io.WEIGHTS_FILE).is_file()
    served, copied = onnx.load(str(tiny_model_dir / graph)), onnx.load(str(onnx_file))
    assert served.graph.node == copied.graph.node
    assert {t.name: numpy_helper.to_array(t).tobytes() for t in served.graph.initializer} == {
        t.name: numpy_helper.to_array(t).tobytes() for t in copied.graph.initializer
    }
    onnx_graph = onnx.load(str(onnx_file)).graph
    for declared, actual in ((config.input, onnx_graph.input), (config.output, onnx_graph.output)):
        assert [t.name for t in declared] == [v.name for v in actual]
        for tensor, value in zip(declared, actual, strict=True):
            assert DATA_TYPES[tensor.data_type] == ONNX_TYPES[value.type.tensor_type.elem_type]
            assert list(tensor.dims) == _onnx_dims(value), tensor.name


def test_unknown_fields_would_be_refused() -> None:
    """The check above can fail: a field Triton does not know does not parse."""
    with pytest.raises(text_format.ParseError):
        text_format.Parse('name: "m"\nplatfrom: "onnxruntime_onnx"\n', ModelConfig())


def test_cli_writes_the_repository(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "model_export", "--preset", "tiny", "--exporter", "torchscript",
         "--out", str(tmp_path / "models" / "t"), "--triton-repo", str(tmp_path / "triton")],
        capture_output=True, text=True, timeout=900,  # a hung export
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrote Triton models t, t_hidden, t_attn" in done.stdout
    for model in ("t", "t_hidden", "t_attn"):
        assert (tmp_path / "triton" / model / "1" / "model.onnx").is_file()
