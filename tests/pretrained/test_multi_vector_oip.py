"""Late-interaction models over the Open Inference Protocol, through tritonclient (HTTP
``/v2`` and gRPC), and the rerank routes on them.

Two random tiny checkpoints of tests/support/late_interaction.py (sentence-transformers'
MultiVectorEncoder layout: [Q]/[D] markers, [MASK] expansion, a skiplist, no dense
vector; bge-m3's: dense, sparse and token vectors from one run) are exported and served
by one server. Each ``/v2`` tensor, un-padded by its lengths, equals ``/v1/multi-vector``'s
answer for the same texts and side (tolerance 0: one engine, the same float32 numbers);
every rerank route (``/v1/rerank``, Cohere's ``/v2/rerank``, TEI's ``/rerank``, the
reranker form of ``/v2/models/{m}/infer`` over HTTP and gRPC) answers the MaxSim of
``/v1/multi-vector``'s query and document vectors (1e-5).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.conftest import free_port, server_process
from tests.support.late_interaction import DOCUMENTS, LAYOUTS, QUERIES

MVE, BGE = "multi_vector_encoder", "bge_m3"
# Texts of different lengths: as documents their vector counts differ (padding is used).
TEXTS = [
    DOCUMENTS[0],
    "short",
    *QUERIES,
]
# The outputs each model answers for texts, and the native outputs they come from.
OUTPUTS = {
    MVE: ["multi_vectors", "multi_vector_lengths"],
    BGE: [
        "multi_vectors",
        "multi_vector_lengths",
        "dense",
        "sparse_indices",
        "sparse_values",
        "sparse_lengths",
    ],
}
NATIVE = {MVE: ["multi_vector"], BGE: ["multi_vector", "dense", "sparse"]}
SCORES_ATOL = 1e-5


class Served:
    def __init__(self, url: str, grpc_address: str, repository: Path) -> None:
        self.url, self.grpc, self.repository = url, grpc_address, repository

    def http(self) -> thttp.InferenceServerClient:
        return thttp.InferenceServerClient(self.url.removeprefix("http://"))

    def client(self) -> tgrpc.InferenceServerClient:
        return tgrpc.InferenceServerClient(self.grpc)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from model_export.cli import main

    root = tmp_path_factory.mktemp("late-interaction")
    repository = tmp_path_factory.mktemp("late-interaction-models")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        for name in (MVE, BGE):
            folder = LAYOUTS[name](root / name)
            command = ["--checkpoint", str(folder), "--out", str(repository / name)]
            assert main([*command, "--no-compact-attention"]) == 0
    port = free_port()
    with server_process(repository, grpc_port=str(port), default_model=MVE) as server:
        yield Served(server.url, f"127.0.0.1:{port}", repository)


def native(served: Served, model: str, texts: list[str], side: str, **extra: Any) -> Any:
    body = {"model": model, "input": texts, "input_type": side, "output": NATIVE[model]}
    answer = httpx.post(f"{served.url}/v1/multi-vector", json={**body, **extra}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["data"]


def text_input(module: Any, texts: list[str], binary: bool = True) -> list[Any]:
    tensor = module.InferInput("text", [len(texts)], "BYTES")
    array = np.array([t.encode() for t in texts], dtype=object)
    if module is thttp:
        tensor.set_data_from_numpy(array, binary_data=binary)
    else:
        tensor.set_data_from_numpy(array)
    return [tensor]


def http_infer(
    served: Served,
    model: str,
    inputs: list[Any],
    outputs: list[str] | None,
    binary: bool = True,
    **params: Any,
) -> dict[str, np.ndarray]:
    client = served.http()
    try:
        asked = (
            None if outputs is None else [thttp.InferRequestedOutput(n, binary) for n in outputs]
        )
        result = client.infer(model, inputs, outputs=asked, parameters=params or None)
    finally:
        client.close()
    names = [o["name"] for o in result.get_response()["outputs"]]
    return {name: result.as_numpy(name) for name in names}


def grpc_infer(
    served: Served, model: str, inputs: list[Any], outputs: list[str] | None, **params: Any
) -> dict[str, np.ndarray]:
    client = served.client()
    try:
        asked = None if outputs is None else [tgrpc.InferRequestedOutput(n) for n in outputs]
        result = client.infer(model, inputs, outputs=asked, parameters=params or None)
    finally:
        client.close()
    names = [o.name for o in result.get_response().outputs]
    return {name: result.as_numpy(name) for name in names}


def assert_equals_native(answer: dict[str, np.ndarray], data: list[Any], model: str) -> None:
    """The /v2 tensors, un-padded by their lengths, equal /v1/multi-vector's items."""
    assert list(answer) == OUTPUTS[model]
    lengths = answer["multi_vector_lengths"]
    assert lengths.dtype == np.int32 and lengths.shape == (len(data),)
    vectors = answer["multi_vectors"]
    assert vectors.dtype == np.float32
    assert vectors.shape[:2] == (len(data), int(lengths.max()))
    for i, item in enumerate(data):
        want = np.array(item["embeddings"], dtype=np.float32)
        assert int(lengths[i]) == len(want)
        np.testing.assert_array_equal(vectors[i, : lengths[i]], want)
        assert not vectors[i, lengths[i] :].any()  # zeros beyond its count
    if model == BGE:
        dense = np.array([item["dense"] for item in data], dtype=np.float32)
        np.testing.assert_array_equal(answer["dense"], dense)
        sparse_lengths = answer["sparse_lengths"]
        assert sparse_lengths.dtype == np.int32
        assert list(sparse_lengths) == [len(item["sparse"]["indices"]) for item in data]
        assert answer["sparse_indices"].dtype == np.int64
        flat = [i for item in data for i in item["sparse"]["indices"]]
        assert list(answer["sparse_indices"]) == flat
        values = np.array([v for item in data for v in item["sparse"]["values"]], np.float32)
        np.testing.assert_array_equal(answer["sparse_values"], values)


@pytest.mark.parametrize("model", [MVE, BGE])
def test_metadata_lists_the_tensors(served: Served, model: str) -> None:
    client = served.http()
    try:
        http_meta = client.get_model_metadata(model)
    finally:
        client.close()
    grpc_client = served.client()
    try:
        grpc_meta = grpc_client.get_model_metadata(model, as_json=True)
    finally:
        grpc_client.close()
    for meta in (http_meta, grpc_meta):
        inputs = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]}
        assert inputs == {
            "text": ("BYTES", [-1]),
            "query": ("BYTES", [1]),
            "documents": ("BYTES", [-1]),
        }
        outputs = {
            t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in meta["outputs"]
        }
        assert list(outputs) == [*OUTPUTS[model], "scores"]
        assert outputs["multi_vectors"][0] == "FP32"
        assert outputs["multi_vectors"][1][:2] == [-1, -1]
        assert outputs["multi_vector_lengths"] == ("INT32", [-1])
        assert outputs["scores"] == ("FP32", [-1])
        if model == BGE:
            assert outputs["sparse_indices"] == ("INT64", [-1])
            assert outputs["sparse_values"] == ("FP32", [-1])
            assert outputs["sparse_lengths"] == ("INT32", [-1])


@pytest.mark.parametrize("model", [MVE, BGE])
@pytest.mark.parametrize("side", ["query", "document"])
def test_tensors_equal_native(served: Served, model: str, side: str) -> None:
    data = native(served, model, TEXTS, side)
    answers = {
        "http-binary": http_infer(served, model, text_input(thttp, TEXTS), None, input_type=side),
        "http-json": http_infer(
            served, model, text_input(thttp, TEXTS, False), OUTPUTS[model], False, input_type=side
        ),
        "grpc": grpc_infer(served, model, text_input(tgrpc, TEXTS), None, input_type=side),
    }
    for answer in answers.values():
        assert_equals_native(answer, data, model)
    if side == "document":  # the padding is used: counts differ
        assert len(set(answers["grpc"]["multi_vector_lengths"].tolist())) > 1


def test_default_side_is_document(served: Served) -> None:
    answer = http_infer(served, MVE, text_input(thttp, TEXTS), None)
    assert_equals_native(answer, native(served, MVE, TEXTS, "document"), MVE)


def test_only_the_outputs_asked(served: Served) -> None:
    data = native(served, BGE, TEXTS, "document")
    for infer in (http_infer, grpc_infer):
        module = thttp if infer is http_infer else tgrpc
        answer = infer(served, BGE, text_input(module, TEXTS), ["sparse_lengths", "dense"])
        assert list(answer) == ["sparse_lengths", "dense"]
        want = np.array([x["dense"] for x in data], dtype=np.float32)
        np.testing.assert_array_equal(answer["dense"], want)


def test_float16_vectors(served: Served) -> None:
    data = native(served, BGE, TEXTS, "query", dtype="float16")
    for infer in (http_infer, grpc_infer):
        module = thttp if infer is http_infer else tgrpc
        answer = infer(
            served,
            BGE,
            text_input(module, TEXTS),
            ["multi_vectors", "multi_vector_lengths"],
            input_type="query",
            multi_vector_dtype="FP16",
        )
        vectors, lengths = answer["multi_vectors"], answer["multi_vector_lengths"]
        assert vectors.dtype == np.float16
        for i, item in enumerate(data):
            want = np.array(item["embeddings"], dtype=np.float16)
            np.testing.assert_array_equal(vectors[i, : lengths[i]], want)


def test_refusals_name_the_parameter(served: Served) -> None:
    client = served.http()
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer(MVE, text_input(thttp, TEXTS), parameters={"input_type": "passage"})
    finally:
        client.close()
    assert caught.value.status() == "422"
    client = served.http()
    try:  # a document past its side's length without truncate: 413 (cut with it)
        long = [" ".join(["token"] * 200)]
        with pytest.raises(InferenceServerException) as too_long:
            client.infer(MVE, text_input(thttp, long), parameters={"truncate": False})
        answer = client.infer(MVE, text_input(thttp, long))
    finally:
        client.close()
    assert too_long.value.status() == "413"
    assert "text[0]" in str(too_long.value)
    assert answer.as_numpy("multi_vectors").shape[0] == 1
    assert "parameters.input_type must be one of ['query', 'document'], got 'passage'" in str(
        caught.value
    )
    grpc_client = served.client()
    try:
        with pytest.raises(InferenceServerException) as grpc_caught:
            grpc_client.infer(MVE, text_input(tgrpc, TEXTS), parameters={"input_type": "passage"})
        with pytest.raises(InferenceServerException, match="'dense'"):  # MVE has no dense
            grpc_client.infer(
                MVE, text_input(tgrpc, TEXTS), outputs=[tgrpc.InferRequestedOutput("dense")]
            )
        with pytest.raises(InferenceServerException, match="needs inputs 'query'"):
            grpc_client.infer(
                MVE, text_input(tgrpc, TEXTS), outputs=[tgrpc.InferRequestedOutput("scores")]
            )
    finally:
        grpc_client.close()
    assert grpc_caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "parameters.input_type must be one of" in str(grpc_caught.value)


def maxsim(served: Served, model: str, query: str, documents: list[str]) -> np.ndarray:
    """MaxSim from /v1/multi-vector's query and document vectors (float64), over the
    query's vector count where the model's similarity is meanmaxsim (bge-m3's)."""
    from model_export.manifest import Manifest

    late = Manifest.read(served.repository / model).late_interaction
    assert late is not None
    (q,) = native(served, model, [query], "query")
    docs = native(served, model, documents, "document")
    qv = np.array(q["embeddings"], dtype=np.float64)
    scores = np.array(
        [(qv @ np.array(d["embeddings"], dtype=np.float64).T).max(axis=1).sum() for d in docs]
    )
    assert late.similarity == ("meanmaxsim" if model == BGE else "maxsim")
    return scores / len(qv) if late.similarity == "meanmaxsim" else scores


def rerank_inputs(module: Any, query: str, documents: list[str]) -> list[Any]:
    tensors = [
        module.InferInput("query", [1], "BYTES"),
        module.InferInput("documents", [len(documents)], "BYTES"),
    ]
    tensors[0].set_data_from_numpy(np.array([query.encode()], dtype=object))
    tensors[1].set_data_from_numpy(np.array([d.encode() for d in documents], dtype=object))
    return tensors


@pytest.mark.parametrize("model", [MVE, BGE])
def test_rerank_routes_answer_maxsim(served: Served, model: str) -> None:
    query, documents = QUERIES[0], [*DOCUMENTS, "short", QUERIES[1]]
    want = maxsim(served, model, query, documents)
    body = {"model": model, "query": query, "documents": documents}
    got: dict[str, np.ndarray] = {}
    for route in ("/v1/rerank", "/v2/rerank"):
        answer = httpx.post(served.url + route, json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        scores = np.zeros(len(documents))
        for r in answer.json()["results"]:
            scores[r["index"]] = r["relevance_score"]
        got[route] = scores
    if model == MVE:  # TEI's /rerank: the server's default model
        answer = httpx.post(
            served.url + "/rerank", json={"query": query, "texts": documents}, timeout=60
        )
        assert answer.status_code == 200, answer.text
        scores = np.zeros(len(documents))
        for r in answer.json():
            scores[r["index"]] = r["score"]
        got["tei"] = scores
    got["v2-http"] = http_infer(served, model, rerank_inputs(thttp, query, documents), None)[
        "scores"
    ]
    got["v2-grpc"] = grpc_infer(served, model, rerank_inputs(tgrpc, query, documents), ["scores"])[
        "scores"
    ]
    assert len(set(np.round(want, 4))) == len(documents)  # distinct scores: order matters
    for route, scores in got.items():
        np.testing.assert_allclose(scores, want, rtol=0, atol=SCORES_ATOL, err_msg=route)


def test_reranker_form_answers_scores_only(served: Served) -> None:
    client = served.http()
    try:
        with pytest.raises(InferenceServerException, match="answered 'scores' only"):
            client.infer(
                MVE,
                rerank_inputs(thttp, QUERIES[0], DOCUMENTS),
                outputs=[thttp.InferRequestedOutput("multi_vectors")],
            )
    finally:
        client.close()


def test_the_padded_tensor_is_priced_padded() -> None:
    """The engine prices ``[n, most kept, dim]`` for the Open Inference Protocol's answer
    (each text's vectors padded), and each text's own count for /v1/multi-vector's."""
    from model_export.manifest import LateInteraction, graph_io
    from service.engine import WireCost
    from service.engine.multi_vector import MultiVectorRequest, Sequence, answer_shape
    from service.model_info import ModelInfo

    outputs = graph_io.MULTI_VECTOR_OUTPUTS[:2]
    late = LateInteraction(graph_io.GRAPH_MULTI_VECTOR, "0" * 64, outputs, dim=8)
    info = cast(
        ModelInfo, SimpleNamespace(name="m", manifest=SimpleNamespace(late_interaction=late))
    )
    kept = [np.ones(n, dtype=bool) for n in (3, 10, 1)]
    seqs = [Sequence(["t"] * len(k), [0] * len(k), [0] * len(k), k, len(k)) for k in kept]
    cost = WireCost(per_float=4.0)
    flat = MultiVectorRequest(texts=["a", "b", "c"], wire_cost=cost)
    padded = MultiVectorRequest(texts=["a", "b", "c"], wire_cost=cost, padded=True, half=True)
    assert answer_shape(flat, info, seqs).floats == (3 + 10 + 1) * 8
    shape = answer_shape(padded, info, seqs)
    assert shape.floats == shape.half_floats == 3 * 10 * 8
