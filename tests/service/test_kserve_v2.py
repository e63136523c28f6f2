"""The Open Inference Protocol (KServe v2) through tritonclient, sync and aio, and raw HTTP.

Errors keep the engine's statuses (422 invalid content, 413 limits, 400 bad JSON).

The session's tiny server; answers are compared with a direct onnxruntime run
of the same graph on the same padded batch (tolerance 1e-5: the server runs
the rows un-padded and batched by length, which changes float summation order
only).
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from model_export import graph_io
from tests.service.helpers import TIMEOUT
from tests.support.inputs import ragged_batch
from tests.support.tiny import D_MODEL, MODEL, N_HEADS, N_LAYERS

ATOL = 1e-5
HIDDEN, ATTENTIONS, STATES = (
    graph_io.OUTPUT_HIDDEN,
    graph_io.OUTPUT_ATTENTIONS,
    graph_io.OUTPUT_HIDDEN_STATES,
)
INFER = f"/v2/models/{MODEL}/infer"


def reference(
    session: ort.InferenceSession, embeds: np.ndarray, mask: np.ndarray
) -> dict[str, np.ndarray]:
    # value_norms is the graph's own (attention norms are computed from it), not an output
    # of the protocol.
    names = [o.name for o in session.get_outputs() if o.name != graph_io.OUTPUT_VALUE_NORMS]
    feeds = {graph_io.INPUT_EMBEDS: embeds, graph_io.INPUT_MASK: mask}
    return dict(zip(names, session.run(names, feeds), strict=True))


@pytest.fixture(scope="module")
def triton_client(server_url: str) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server_url.removeprefix("http://"))
    yield client
    client.close()


def inputs(
    embeds: np.ndarray, mask: np.ndarray | None, *, binary: bool, mask_type: str = "INT64"
) -> list[triton.InferInput]:
    tensors = [triton.InferInput(graph_io.INPUT_EMBEDS, list(embeds.shape), "FP32")]
    tensors[0].set_data_from_numpy(embeds, binary_data=binary)
    if mask is not None:
        typed = mask.astype({"INT64": np.int64, "INT32": np.int32, "BOOL": np.bool_}[mask_type])
        tensors.append(triton.InferInput(graph_io.INPUT_MASK, list(mask.shape), mask_type))
        tensors[1].set_data_from_numpy(typed, binary_data=binary)
    return tensors


def test_server_and_model_metadata(triton_client: triton.InferenceServerClient) -> None:
    assert triton_client.is_server_live() and triton_client.is_server_ready()
    assert triton_client.is_model_ready(MODEL)
    assert triton_client.is_model_ready(MODEL, model_version="1")
    assert not triton_client.is_model_ready("nope")
    server = triton_client.get_server_metadata()
    assert server["name"] == "attnserve" and "binary_tensor_data" in server["extensions"]
    meta = triton_client.get_model_metadata(MODEL)
    assert (meta["name"], meta["versions"]) == (MODEL, ["1"])
    shapes = {t["name"]: (t["datatype"], t["shape"]) for t in meta["outputs"]}
    assert shapes[HIDDEN] == ("FP32", [-1, -1, D_MODEL])
    assert shapes[ATTENTIONS] == ("FP32", [-1, N_LAYERS, N_HEADS, -1, -1])
    assert shapes[STATES] == ("FP32", [-1, N_LAYERS + 1, -1, D_MODEL])
    assert {t["name"] for t in meta["inputs"]} == {graph_io.INPUT_EMBEDS, graph_io.INPUT_MASK}
    with pytest.raises(InferenceServerException, match="no version '2'"):
        triton_client.get_model_metadata(MODEL, model_version="2")


@pytest.mark.parametrize("binary_in", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["binary-out", "json-out"])
@pytest.mark.parametrize("mask_type", ["INT64", "INT32", "BOOL"])
def test_ragged_infer_equals_onnxruntime(
    triton_client: triton.InferenceServerClient,
    attention_session: ort.InferenceSession,
    binary_in: bool,
    binary_out: bool,
    mask_type: str,
) -> None:
    embeds, mask = ragged_batch()
    want = reference(attention_session, embeds, mask)
    outputs = [triton.InferRequestedOutput(n, binary_data=binary_out) for n in want]
    result = triton_client.infer(
        MODEL,
        inputs(embeds, mask, binary=binary_in, mask_type=mask_type),
        outputs=outputs,
        request_id="req-7",
    )
    assert result.get_response()["id"] == "req-7"
    for name, expected in want.items():
        got = result.as_numpy(name)
        assert got is not None and got.dtype == np.float32 and got.shape == expected.shape, name
        np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL, err_msg=name)


def test_only_the_embeddings_output_and_no_mask(
    triton_client: triton.InferenceServerClient, attention_session: ort.InferenceSession
) -> None:
    embeds, _ = ragged_batch(seed=1)
    want = reference(attention_session, embeds, np.ones(embeds.shape[:2], np.int64))
    result = triton_client.infer(
        MODEL, inputs(embeds, None, binary=True), outputs=[triton.InferRequestedOutput(HIDDEN)]
    )
    assert [o["name"] for o in result.get_response()["outputs"]] == [HIDDEN]
    np.testing.assert_allclose(result.as_numpy(HIDDEN), want[HIDDEN], rtol=0, atol=ATOL)


def test_every_output_when_none_is_named_and_pooled_with_a_parameter(
    triton_client: triton.InferenceServerClient, attention_session: ort.InferenceSession
) -> None:
    embeds, mask = ragged_batch(seed=2)
    want = reference(attention_session, embeds, mask)
    result = triton_client.infer(
        MODEL, inputs(embeds, mask, binary=True), parameters={"pooling": "mean", "normalize": True}
    )
    names = {o["name"] for o in result.get_response()["outputs"]}
    assert names == {HIDDEN, ATTENTIONS, STATES, "pooled", graph_io.INPUT_MASK}
    np.testing.assert_array_equal(result.as_numpy(graph_io.INPUT_MASK), mask)
    for row, n in enumerate(mask.sum(axis=1)):
        mean = want[HIDDEN][row, :n].mean(axis=0)
        np.testing.assert_allclose(
            result.as_numpy("pooled")[row], mean / np.linalg.norm(mean), rtol=0, atol=ATOL
        )


def test_aio_client(server_url: str, attention_session: ort.InferenceSession) -> None:
    embeds, mask = ragged_batch(seed=3)
    want = reference(attention_session, embeds, mask)

    async def main() -> dict[str, np.ndarray]:
        client = triton_aio.InferenceServerClient(server_url.removeprefix("http://"))
        try:
            assert await client.is_server_ready() and await client.is_model_ready(MODEL)
            tensors = [triton_aio.InferInput(graph_io.INPUT_EMBEDS, list(embeds.shape), "FP32")]
            tensors[0].set_data_from_numpy(embeds, binary_data=True)
            tensors.append(triton_aio.InferInput(graph_io.INPUT_MASK, list(mask.shape), "INT64"))
            tensors[1].set_data_from_numpy(mask, binary_data=False)
            result = await client.infer(MODEL, tensors)  # every output, binary
            return {name: result.as_numpy(name) for name in want}
        finally:
            await client.close()

    got = asyncio.run(main())
    for name, expected in want.items():
        np.testing.assert_allclose(got[name], expected, rtol=0, atol=ATOL, err_msg=name)


# -- raw HTTP: every framing mistake is a 4xx {"error": ...}, then a good request works ------


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


def embeds_input(embeds: np.ndarray, *, binary: bool = True, **override: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": graph_io.INPUT_EMBEDS,
        "shape": list(embeds.shape),
        "datatype": "FP32",
    }
    if binary:
        spec["parameters"] = {"binary_data_size": embeds.nbytes}
    else:
        spec["data"] = embeds.ravel().tolist()
    return {**spec, **override}


X = np.ones((1, 2, D_MODEL), dtype=np.float32)
XB = X.astype("<f4").tobytes()


def _case(
    header: dict[str, Any] | None, *blobs: bytes, header_length: str | None = "auto"
) -> tuple[bytes, dict[str, str]]:
    if header is None:
        return b"".join(blobs), {}
    body, headers = binary_body(header, *blobs)
    if header_length is None:
        headers = {}
    elif header_length != "auto":
        headers = {"Inference-Header-Content-Length": header_length}
    return body, headers


BAD: list[tuple[str, tuple[bytes, dict[str, str]], int, str]] = [
    ("not-json", _case(None, b"{nope"), 400, "json"),  # the rest: 422 invalid_input
    ("no-inputs", _case({"inputs": []}), 422, "inputs"),
    ("unknown-input", _case({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
                                         "data": [1.0]}]}), 422, "unknown input 'x'"),
    ("wrong-datatype", _case({"inputs": [embeds_input(X, datatype="FP16")]}, XB), 422,
     "datatype"),
    ("size-mismatch", _case({"inputs": [embeds_input(X, shape=[1, 3, D_MODEL])]}, XB), 422,
     "does not match shape"),
    ("data-count-mismatch", _case({"inputs": [embeds_input(X, binary=False, shape=[1, 3,
                                                                              D_MODEL])]}),
     422, "values"),
    ("header-beyond-body", _case({"inputs": [embeds_input(X)]}, XB, header_length="999999"),
     422, "beyond the body"),
    ("header-length-not-a-number", _case({"inputs": [embeds_input(X)]}, XB,
                                          header_length="12a"), 422, "not a number"),
    ("binary-beyond-body", _case({"inputs": [embeds_input(X)]}, XB[:-4]), 422,
     "beyond the body"),
    ("trailing-bytes", _case({"inputs": [embeds_input(X)]}, XB, b"\0\0\0\0"), 422, "trailing"),
    ("unknown-output", _case({"inputs": [embeds_input(X)], "outputs": [{"name": "logits"}]}, XB),
     422, "unknown output 'logits'"),
    ("nan-binary", _case({"inputs": [embeds_input(X)]}, np.full_like(X, np.nan).tobytes()),
     422, "nan"),
    ("beyond-float32-json", _case({"inputs": [embeds_input(X, binary=False, data=[1e39] * 64)]}),
     422, "float32"),
    ("rank-2-embeds", _case({"inputs": [embeds_input(X[0])]}, X[0].tobytes()), 422,
     "[batch, seq, d_model]"),
    ("wrong-width", _case({"inputs": [embeds_input(np.ones((1, 2, 5), np.float32))]},
                          np.ones((1, 2, 5), "<f4").tobytes()), 422, "width 5"),
    ("left-padded-mask", _case({"inputs": [embeds_input(X), {
        "name": "attention_mask", "shape": [1, 2], "datatype": "INT64", "data": [0, 1]}]}, XB),
     422, "ones then zeros"),
    ("mask-of-twos", _case({"inputs": [embeds_input(X), {
        "name": "attention_mask", "shape": [1, 2], "datatype": "INT64", "data": [2, 0]}]}, XB),
     422, "only 0 and 1"),
    ("all-zero-mask", _case({"inputs": [embeds_input(X), {
        "name": "attention_mask", "shape": [1, 2], "datatype": "INT64", "data": [0, 0]}]}, XB),
     422, "all zeros"),
    ("mask-shape", _case({"inputs": [embeds_input(X), {
        "name": "attention_mask", "shape": [1, 3], "datatype": "INT64", "data": [1, 1, 1]}]},
        XB), 422, "attention_mask"),
    ("pooled-without-pooling", _case({"inputs": [embeds_input(X)],
                                      "outputs": [{"name": "pooled"}]}, XB), 422, "pooling"),
    ("text-without-tokenizer", _case({"inputs": [{"name": "text", "shape": [1],
                                                  "datatype": "BYTES", "data": ["hi"]}]}), 422,
     "unknown input 'text'"),
    ("too-long", _case({"inputs": [embeds_input(np.ones((1, 129, D_MODEL), np.float32))]},
                       np.ones((1, 129, D_MODEL), "<f4").tobytes()), 413, "129 tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "says"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_framing_mistakes_are_4xx_then_a_good_request_works(
    http_client: httpx.Client, body: tuple[bytes, dict[str, str]], status: int, says: str
) -> None:
    content, headers = body
    r = http_client.post(INFER, content=content, headers=headers)
    assert r.status_code == status, r.text
    # tritonclient needs "error"; error_type keeps the SDK's exceptions the same.
    assert set(r.json()) == {"error", "error_type"}, r.json()
    assert says.lower() in r.json()["error"].lower(), r.json()
    good, good_headers = binary_body({"inputs": [embeds_input(X)]}, XB)
    ok = http_client.post(INFER, content=good, headers=good_headers)
    assert ok.status_code == 200, ok.text


def test_unknown_model_and_version_are_404(http_client: httpx.Client) -> None:
    body, headers = binary_body({"inputs": [embeds_input(X)]}, XB)
    for path in ("/v2/models/nope/infer", f"/v2/models/{MODEL}/versions/9/infer"):
        r = http_client.post(path, content=body, headers=headers)
        assert r.status_code == 404 and r.json()["error_type"] == "model_not_found", r.text


def test_content_type_is_never_consulted(http_client: httpx.Client) -> None:
    """tritonclient's sync client sends none; its aio one octet-stream even for JSON."""
    body = json.dumps({"inputs": [embeds_input(X, binary=False)]}).encode()
    for content_type in (None, "application/octet-stream", "text/plain"):
        headers = {} if content_type is None else {"content-type": content_type}
        r = http_client.post(INFER, content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["name"] == HIDDEN


def test_bytes_where_fp32_is_expected_is_refused(http_client: httpx.Client) -> None:
    """The datatype is checked before any BYTES framing is read (MiniLM's tests read it)."""
    blob = struct.pack("<I", 10) + b"abc"
    body, headers = binary_body(
        {
            "inputs": [
                {
                    "name": graph_io.INPUT_EMBEDS,
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        },
        blob,
    )
    r = http_client.post(INFER, content=body, headers=headers)
    assert r.status_code == 422 and "datatype" in r.json()["error"], r.text


def test_answer_framing_of_mixed_outputs(http_client: httpx.Client) -> None:
    """Binary outputs follow the JSON header in the order asked; JSON ones carry data."""
    embeds, _ = ragged_batch(seed=4)
    body, headers = binary_body(
        {
            "inputs": [embeds_input(embeds)],
            "outputs": [
                {"name": ATTENTIONS, "parameters": {"binary_data": True}},
                {"name": HIDDEN},
                {"name": STATES, "parameters": {"binary_data": True}},
            ],
        },
        embeds.tobytes(),
    )
    r = http_client.post(INFER, content=body, headers=headers)
    assert r.status_code == 200, r.text
    head_len = int(r.headers["inference-header-content-length"])
    header = json.loads(r.content[:head_len])
    sizes = [o.get("parameters", {}).get("binary_data_size") for o in header["outputs"]]
    assert [o["name"] for o in header["outputs"]] == [ATTENTIONS, HIDDEN, STATES]
    assert sizes[1] is None and len(header["outputs"][1]["data"]) == 3 * 7 * D_MODEL
    assert head_len + sizes[0] + sizes[2] == len(r.content)  # nothing else in the body
    assert sizes[0] == 3 * N_LAYERS * N_HEADS * 7 * 7 * 4


def test_answer_size_counts_the_padding(server_url: str, model_repository: Any) -> None:
    """A batch padded to 128 answers [B, L, H, 128, 128] attention: refused up front (413)."""
    from tests.conftest import running_server

    embeds = np.zeros((4, 128, D_MODEL), np.float32)
    mask = np.zeros((4, 128), np.int64)
    mask[:, :2] = 1  # 2 real tokens per row: tiny un-padded, huge re-padded
    body, headers = binary_body(
        {
            "inputs": [
                embeds_input(embeds),
                {"name": graph_io.INPUT_MASK, "shape": [4, 128], "datatype": "INT64",
                 "parameters": {"binary_data_size": mask.nbytes}},
            ],
            "outputs": [{"name": ATTENTIONS, "parameters": {"binary_data": True}}],
        },
        embeds.tobytes(),
        mask.tobytes(),
    )  # fmt: skip
    with running_server(model_repository, max_response_bytes="1000000") as url:
        r = httpx.post(f"{url}{INFER}", content=body, headers=headers, timeout=TIMEOUT)
    assert r.status_code == 413, r.text  # 4 x 2 x 4 x 128² x 4 bytes = 2.1 MB
    assert "response" in r.json()["error"]


def test_openapi_documents_the_v2_errors_as_answered(http_client: httpx.Client) -> None:
    """Datatype and shape errors are 422 in {"error", "error_type"}: the schema said 400,
    and its 422 was FastAPI's HTTPValidationError, which any object matched."""
    schema = http_client.get("/openapi.json").json()
    infer = schema["paths"]["/v2/models/{model}/infer"]["post"]["responses"]
    assert "datatype" in infer["422"]["description"]
    assert "datatype" not in infer["400"]["description"]
    ref = infer["422"]["content"]["application/json"]["schema"]["$ref"]
    body = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert body["required"] == ["error", "error_type"]
    assert body["additionalProperties"] is False
    for path, operations in schema["paths"].items():
        if path.startswith("/v2"):
            assert "HTTPValidationError" not in str(operations), path
    # And an answer matches it.
    r = http_client.post(f"/v2/models/{MODEL}/infer", json={"inputs": [{"name": "x"}]})
    assert r.status_code == 422
    assert set(r.json()) == {"error", "error_type"}
