"""docs/api.md: every example runs against a live server, and the page covers the API.

Every ```bash and ```python block runs against a server on MiniLM (the model
`make serve` serves), with only the variables the page's setup block exports.

Each example's answer is checked for its status and its content (shapes,
values, the fields the page promises), not only for the absence of an error:
``BASH_CHECKS`` and ``PYTHON_CHECKS`` hold one check per example, found by a
pattern that must match that example and no other, so a new example fails
here until it has a check.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from model_export import graph_io
from service import errors
from tests.service.helpers import as_array
from tests.support.onnx_runs import new_session, ort_encode

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
TEXT = API_MD.read_text()
BLOCKS = re.findall(r"^```bash\n(.*?)^```", TEXT, flags=re.DOTALL | re.MULTILINE)
PYTHON_BLOCKS = re.findall(r"^```python\n(.*?)^```", TEXT, flags=re.DOTALL | re.MULTILINE)
EXPECT_ERROR = re.compile(r"^# expect error: (\w+)$", re.MULTILINE)
# The page's setup block: the variables every example may read, and nothing else.
SETUP = re.search(r"^```text\n(export ATTNSERVE_URL=.*?)^```", TEXT, flags=re.DOTALL | re.M)
MODEL = "minilm-l6"  # what `make serve` serves, and the examples are written for
MINILM_WIDTH = 384
MINILM_LAYERS = 6
MINILM_HEADS = 12
# Where an example names a model: a path, a JSON body, a client's keyword.
MODEL_NAMED = re.compile(r'models/([\w.-]+)|"model": "([\w.-]+)"|model="([\w.-]+)"')
# Every example has one curl; this wrapper makes it also write its status to stderr.
STATUS_LINE = "attnserve-example-status"
CURL_WITH_STATUS = (
    f"curl() {{ command curl -w '%{{stderr}}{STATUS_LINE} %{{http_code}}\\n' \"$@\"; }}"
)
ROW_SUM_ATOL = 1e-5


@dataclass
class Answer:
    """What one example printed: its HTTP status, stdout, and stderr (headers, if dumped)."""

    status: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


# A check gets the answer and onnxruntime on MiniLM's model.onnx, to compare with.
Check = Callable[[Answer, ort.InferenceSession], None]


def _block_id(block: str) -> str:
    path = re.search(r"\$ATTNSERVE_URL(/[\w/{}.-]*)", block)
    return path.group(1) if path else block[:20]


def path(route: str) -> str:
    """A pattern matching a block that calls exactly ``route`` (not a longer path)."""
    return re.escape("$ATTNSERVE_URL" + route) + r"(?![\w/])"


# --- checks of the answers --------------------------------------------------------------------


def ok(answer: Answer) -> Any:
    assert answer.status == 200, (answer.status, answer.stdout)
    return answer.json()


def rows_sum_to_one(array: np.ndarray) -> None:
    np.testing.assert_allclose(array.sum(axis=-1), 1.0, rtol=0, atol=ROW_SUM_ATOL)


def unit_length(vectors: np.ndarray) -> None:
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, rtol=0, atol=1e-5)


def seeded_sequences(seed: int, lengths: tuple[int, ...]) -> list[np.ndarray]:
    """The inputs an example's ``random.seed(seed)`` one-liner generates, in the same order."""
    rng = random.Random(seed)
    return [
        np.array(
            [[rng.gauss(0, 1) for _ in range(MINILM_WIDTH)] for _ in range(n)], dtype=np.float32
        )
        for n in lengths
    ]


def two_sequences(answer: Answer, session: ort.InferenceSession) -> None:
    body = ok(answer)
    assert body["model"] == MODEL and body["usage"] == {"sequences": 2, "tokens": 8}
    seqs = seeded_sequences(0, (5, 3))
    want = ort_encode(session, seqs)
    for i, (item, (hidden, _)) in enumerate(zip(body["data"], want, strict=True)):
        assert item["index"] == i and item["attention"] is None and item["pooled"] is None
        assert item["span_embeddings"] is None and item["tokens"] is None
        np.testing.assert_allclose(as_array(item["embeddings"]), hidden, rtol=0, atol=1e-5)


def text_tokens_and_pooled(answer: Answer, session: ort.InferenceSession) -> None:
    (item,) = ok(answer)["data"]
    assert item["tokens"] == ["[CLS]", "attention", "is", "all", "you", "need", ".", "[SEP]"]
    assert item["embeddings"] is None and item["span_embeddings"] is None
    pooled = as_array(item["pooled"])
    assert pooled.shape == (MINILM_WIDTH,)
    unit_length(pooled)


def compact_attention(answer: Answer, session: ort.InferenceSession) -> None:
    (item,) = ok(answer)["data"]
    n = len(item["tokens"])
    values, keys = np.asarray(item["attention"]), np.asarray(item["attention_indices"])
    assert values.shape == keys.shape == (1, MINILM_HEADS, n, 3)
    assert (np.diff(values, axis=-1) <= 0).all() and ((keys >= 0) & (keys < n)).all()
    summaries = item["attention_summaries"]
    assert list(summaries) == ["entropy", "first"]
    entropy = np.asarray(summaries["entropy"])
    assert entropy.shape == (1, MINILM_HEADS) and (entropy >= 0).all()
    assert (entropy <= np.log(n) + 1e-5).all()


def attention_maps(layers: int, heads: int, tokens: int) -> Check:
    def check(answer: Answer, session: ort.InferenceSession) -> None:
        (item,) = ok(answer)["data"]
        assert item["embeddings"] is None
        attention = as_array(item["attention"])
        assert attention.shape == (layers, heads, tokens, tokens)
        rows_sum_to_one(attention)

    return check


def pooled_unit_vectors(answer: Answer, session: ort.InferenceSession) -> None:
    data = ok(answer)["data"]
    assert len(data) == 2 and all(item["embeddings"] is None for item in data)
    pooled = np.stack([as_array(item["pooled"]) for item in data])
    assert pooled.shape == (2, MINILM_WIDTH)
    unit_length(pooled)


def base64_both_ways(answer: Answer, session: ort.InferenceSession) -> None:
    (item,) = ok(answer)["data"]
    embeddings = item["embeddings"]
    assert embeddings["shape"] == [2, MINILM_WIDTH] and embeddings["dtype"] == "float32"
    assert np.isfinite(as_array(embeddings)).all()


def deadline_and_request_id(answer: Answer, session: ort.InferenceSession) -> None:
    (item,) = ok(answer)["data"]
    assert item["embeddings"] is None and len(item["pooled"]) == MINILM_WIDTH
    headers = answer.stderr.lower()
    for name in ("x-request-id: order-1234", "x-queue-time:", "x-compute-time:"):
        assert name in headers, answer.stderr


@dataclass(frozen=True)
class Refused:
    """The check of a ``# expect error: <kind>`` example: this status, this kind, and the
    protocol's error body (native ``{"error", "error_type"}``, or OpenAI's with ``param``)."""

    status: int
    kind: str
    openai_param: str | None = None

    def __call__(self, answer: Answer, session: ort.InferenceSession) -> None:
        assert answer.status == self.status, (answer.status, answer.stdout)
        body = answer.json()
        if self.openai_param is None:
            assert set(body) == {"error", "error_type"} and body["error"], body
            assert body["error_type"] == self.kind, body
        else:
            error = body["error"]
            assert (error["code"], error["param"]) == (self.kind, self.openai_param), error
            assert error["message"], error


def openai_embeddings(answer: Answer, session: ort.InferenceSession) -> None:
    body = ok(answer)
    assert body["object"] == "list" and body["model"] == "minilm-l6"
    assert [d["index"] for d in body["data"]] == [0, 1]
    vectors = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert vectors.shape == (2, MINILM_WIDTH)
    unit_length(vectors)
    assert float(vectors[0] @ vectors[1]) > 0.5  # two sentences about one guitar player
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0


def equals(expected: Any) -> Check:
    def check(answer: Answer, session: ort.InferenceSession) -> None:
        assert ok(answer) == expected

    return check


def v2_model_metadata(answer: Answer, session: ort.InferenceSession) -> None:
    body = ok(answer)
    assert (body["name"], body["versions"]) == (MODEL, ["1"])
    inputs = {t["name"]: (t["datatype"], t["shape"]) for t in body["inputs"]}
    assert inputs["inputs_embeds"] == ("FP32", [-1, -1, MINILM_WIDTH])
    assert inputs["text"] == ("BYTES", [-1])
    outputs = {t["name"]: (t["datatype"], t["shape"]) for t in body["outputs"]}
    assert outputs["last_hidden_state"] == ("FP32", [-1, -1, MINILM_WIDTH])
    assert outputs["attentions"] == ("FP32", [-1, MINILM_LAYERS, MINILM_HEADS, -1, -1])


def v2_outputs(answer: Answer) -> dict[str, np.ndarray]:
    return {
        o["name"]: np.asarray(o["data"], dtype=np.float64).reshape(o["shape"])
        for o in ok(answer)["outputs"]
    }


def v2_infer_padded(answer: Answer, session: ort.InferenceSession) -> None:
    assert ok(answer)["id"] == "r1"
    outputs = v2_outputs(answer)
    assert set(outputs) == {"last_hidden_state", "pooled"}
    hidden = outputs["last_hidden_state"]
    assert hidden.shape == (2, 3, MINILM_WIDTH) and outputs["pooled"].shape == (2, MINILM_WIDTH)
    assert not hidden[1, 2].any(), "the padded position answers zeros"
    np.testing.assert_allclose(outputs["pooled"][1], hidden[1, :2].mean(axis=0), atol=1e-5)


def v2_infer_every_output(answer: Answer, session: ort.InferenceSession) -> None:
    outputs = v2_outputs(answer)
    assert outputs["last_hidden_state"].shape == (1, 2, MINILM_WIDTH)
    assert outputs["attentions"].shape == (1, MINILM_LAYERS, MINILM_HEADS, 2, 2)
    rows_sum_to_one(outputs["attentions"])
    assert outputs["hidden_states"].shape == (1, MINILM_LAYERS + 1, 2, MINILM_WIDTH)
    assert "pooled" not in outputs  # it needs parameters.pooling


def model_card(card: dict[str, Any]) -> None:
    assert (card["name"], card["id"], card["object"]) == (MODEL, MODEL, "model")
    assert (card["d_model"], card["heads"], card["layers"]) == (
        MINILM_WIDTH,
        MINILM_HEADS,
        MINILM_LAYERS,
    )
    assert card["tokenizer"] is True and card["default"] is True


def model_list(answer: Answer, session: ort.InferenceSession) -> None:
    body = ok(answer)
    assert body["object"] == "list"
    (card,) = body["data"]
    model_card(card)


def one_model_card(answer: Answer, session: ort.InferenceSession) -> None:
    model_card(ok(answer))


def metrics(answer: Answer, session: ort.InferenceSession) -> None:
    assert answer.status == 200
    counts = re.findall(r'^attnserve_tokens_total\{model="minilm-l6"\} (\S+)$', answer.stdout, re.M)
    assert counts and float(counts[0]) > 0, answer.stdout


def openapi_paths(answer: Answer, session: ort.InferenceSession) -> None:
    assert answer.status == 200
    paths = answer.json()
    assert paths == sorted(paths)
    assert {"/v1/encode", "/v1/embeddings", "/v2/models/{model}/infer", "/health/ready"} <= set(
        paths
    )


def sparse_vector(answer: Answer, session: ort.InferenceSession) -> None:
    (item,) = ok(answer)["data"]
    assert sorted(item["text"]) == ["lighthous", "past", "ran", "run", "runner"], item
    assert len(item["indices"]) == len(item["values"]) == 5 and min(item["values"]) > 0


def tei_vectors(answer: Answer, session: ort.InferenceSession) -> None:
    vectors = np.asarray(ok(answer), dtype=np.float32)
    assert vectors.shape == (2, MINILM_WIDTH)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=0, atol=1e-5)


def tei_tokens(answer: Answer, session: ort.InferenceSession) -> None:
    assert np.asarray(ok(answer), dtype=np.float32).shape == (1, 4, MINILM_WIDTH)


def tei_sparse(answer: Answer, session: ort.InferenceSession) -> None:
    (vector,) = ok(answer)
    assert len(vector) == 5 and all(set(e) == {"index", "value"} for e in vector)


def tei_similarity(answer: Answer, session: ort.InferenceSession) -> None:
    scores = ok(answer)
    assert len(scores) == 2 and scores[0] > scores[1] + 0.3, scores


def similarity_explained(answer: Answer, session: ort.InferenceSession) -> None:
    data = ok(answer)["data"]
    assert [item["index"] for item in data] == [0, 1]
    assert data[0]["score"] > data[1]["score"] + 0.3, data  # the tulip sentence matches
    for item in data:
        matrix = np.asarray(item["contributions"], dtype=np.float64)
        assert matrix.shape == (len(item["query_tokens"]), len(item["document_tokens"]))
        assert abs(matrix.sum() - item["score"]) <= ROW_SUM_ATOL
        assert len(item["top_pairs"]) == 3
        assert item["top_pairs"][0]["contribution"] == pytest.approx(matrix.max(), abs=1e-7)


def tei_tokenize(answer: Answer, session: ort.InferenceSession) -> None:
    (tokens,) = ok(answer)
    assert [t["text"] for t in tokens] == ["[CLS]", "Héllo", ",", "wörld", "!", "[SEP]"]
    assert (tokens[1]["start"], tokens[1]["stop"]) == (0, 5) and tokens[0]["start"] is None


def tei_decode(answer: Answer, session: ort.InferenceSession) -> None:
    assert ok(answer) == ["hello, world!"]


def repository_index(answer: Answer, session: ort.InferenceSession) -> None:
    assert ok(answer) == [{"name": MODEL, "version": "1", "state": "READY", "reason": ""}]


def tokenized(answer: Answer, session: ort.InferenceSession) -> None:
    (item,) = ok(answer)["data"]
    assert item["tokens"] == ["[CLS]", "attention", "is", "all", "you", "need", "[SEP]"]
    assert len(item["ids"]) == 7 and item["ids"][0] == 101 and item["embeddings"] is None


def tei_info(answer: Answer, session: ort.InferenceSession) -> None:
    info = ok(answer)
    assert info["model_id"] == "minilm-l6" and info["max_client_batch_size"] == 2048


def quantized_int8(answer: Answer, session: ort.InferenceSession) -> None:
    """One int8 vector of MiniLM's 384 dimensions, from its recorded ranges."""
    assert answer.status == 200, answer.stdout
    (item,) = answer.json()["data"]
    vector = item["embedding"]
    assert len(vector) == 384 and all(isinstance(v, int) and -128 <= v <= 127 for v in vector)
    assert len(set(vector)) > 50  # spread over the range, not clipped to one end


def tei_health(answer: Answer, session: ort.InferenceSession) -> None:
    assert answer.status == 200 and answer.stdout == "", answer


BASH_CHECKS: dict[str, Check] = {
    path("/embed"): tei_vectors,
    path("/embed_all"): tei_tokens,
    path("/embed_sparse"): tei_sparse,
    path("/similarity"): tei_similarity,
    path("/v2/repository/index"): repository_index,
    path("/tokenize"): tei_tokenize,
    path("/decode"): tei_decode,
    path("/info"): tei_info,
    path("/health"): tei_health,
    path("/v1/embed_sparse"): sparse_vector,
    path("/v1/rerank"): Refused(422, "unsupported_by_model"),
    path("/v1/multi-vector"): Refused(422, "unsupported_by_model"),
    path("/v1/classify"): Refused(422, "unsupported_by_model"),
    path("/v1/explain/similarity"): similarity_explained,
    path("/rerank"): Refused(422, "Validation"),
    path("/predict"): Refused(422, "Validation"),
    r'"embedding_type": "int8"': quantized_int8,
    r"Attention is all you need\.": text_tokens_and_pooled,
    r"random\.seed\(0\)": two_sequences,
    r"random\.seed\(1\)": attention_maps(1, 2, 3),
    r'"top_k": 3': compact_attention,
    r'"reduce": "mean"': attention_maps(MINILM_LAYERS, 1, 4),
    r'"reduce": "rollout"': attention_maps(1, 1, 4),
    r"random\.seed\(3\)": pooled_unit_vectors,
    r"random\.seed\(4\)": base64_both_ways,
    r"order-1234": deadline_and_request_id,
    r"no-such-model": Refused(404, "model_not_found"),
    path("/v2/repository/models/minilm-l6/load"): Refused(400, "load_failed"),
    path("/v2/repository/models/minilm-l6/unload"): Refused(400, "load_failed"),
    path("/v1/tokenize"): tokenized,
    r"Someone plays the guitar": openai_embeddings,
    r'"word " \* 300': Refused(400, "context_length_exceeded", openai_param="input[0]"),
    path("/v2"): equals(
        {
            "name": "attnserve",
            "version": "0.1.0",
            "extensions": ["binary_tensor_data", "model_repository"],
        }
    ),
    path("/v2/health/live"): equals({"live": True}),
    path("/v2/health/ready"): equals({"ready": True}),
    path("/v2/models/minilm-l6"): v2_model_metadata,
    path("/v2/models/minilm-l6/versions/1"): v2_model_metadata,
    path("/v2/models/minilm-l6/ready"): equals({"name": MODEL, "ready": True}),
    path("/v2/models/minilm-l6/versions/1/ready"): equals({"name": MODEL, "ready": True}),
    r'"id": "r1"': v2_infer_padded,
    path("/v2/models/minilm-l6/versions/1/infer"): v2_infer_every_output,
    r'"FP16"': Refused(422, "invalid_input"),
    path("/v1/models"): model_list,
    path("/v1/models/minilm-l6"): one_model_card,
    path("/health/live"): equals({"status": "alive"}),
    path("/health/ready"): equals({"status": "ready"}),
    path("/metrics"): metrics,
    path("/openapi.json"): openapi_paths,
}

# Appended to each Python example and run in its namespace: what it computed is right.
PYTHON_CHECKS: dict[str, str] = {
    r"from openai import OpenAI": """
assert "minilm-l6" in [m.id for m in client.models.list()]
assert vectors.shape == (3, 384), vectors.shape
assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
similar = vectors @ vectors.T
assert similar[0, 1] > similar[0, 2] and similar[0, 1] > similar[1, 2], similar
assert response.usage.prompt_tokens > 0
""",
    r"from langchain_openai import": """
import math
assert len(documents) == 2 and all(len(d) == 384 for d in documents) and len(query) == 384
assert abs(math.fsum(x * x for x in query) - 1) < 1e-4
cosine = [math.fsum(a * b for a, b in zip(d, query)) for d in documents]
assert cosine[0] > cosine[1], cosine  # the guitar sentence is nearer the guitar query
""",
    r"from huggingface_hub import InferenceClient": """
assert vectors.shape == (2, 384), vectors.shape
""",
    r"HuggingFaceAPIDocumentEmbedder\(": """
assert len(documents) == 1 and len(documents[0].embedding) == 384
assert abs(sum(x * x for x in documents[0].embedding) - 1) < 1e-4  # normalize=True honoured
""",
    r"TextEmbeddingsInference\(": """
assert len(batch) == 12 and all(len(v) == 384 for v in batch)
""",
    r"HuggingFaceEndpointEmbeddings\(": """
assert len(passages) == 100 and all(len(v) == 384 for v in passages)
assert passages[0] != passages[1]
""",
    r"late = client\.encode": """
assert late.shape == (2, 384) and naive.shape == (2, 384)
assert float(late[1] @ q) > float(naive[1] @ q), (late @ q, naive @ q)
""",
    r"import tritonclient\.grpc": """
assert ready and vectors.shape == (2, 384), vectors.shape
assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
""",
    r"import tritonclient\.http": """
assert client.is_server_ready()
assert vectors.shape == (2, 384) and vectors.dtype == np.float32, (vectors.shape, vectors.dtype)
assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
""",
}


def matching(patterns: dict[str, Any], block: str) -> list[str]:
    return [p for p in patterns if re.search(p, block)]


def setup_variables() -> dict[str, str]:
    """The variables the page's setup block exports, with their values."""
    assert SETUP is not None, "docs/api.md lost its setup block (export ATTNSERVE_URL=...)"
    return dict(re.findall(r"^export (\w+)=(\S+)", SETUP.group(1), flags=re.M))


def example_env(url: str, grpc_address: str, path_env: str) -> dict[str, str]:
    """The environment an example runs in: the setup block's variables (pointed at the test
    server) and no other ATTNSERVE_* one, so an example reading an undefined one fails."""
    values = {"ATTNSERVE_URL": url, "ATTNSERVE_GRPC": grpc_address}
    assert set(setup_variables()) == set(values), setup_variables()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
    return {**env, **values, "PATH": path_env}


def test_the_setup_block_defines_every_variable_the_examples_read() -> None:
    defined = setup_variables()
    assert defined["ATTNSERVE_URL"] == "http://127.0.0.1:8000"  # `make serve`'s address
    assert defined["ATTNSERVE_GRPC"] == "127.0.0.1:8001"
    read = {name for block in BLOCKS for name in re.findall(r"\$\{?(\w+)", block)}
    for block in PYTHON_BLOCKS:
        read |= set(re.findall(r"os\.(?:environ\[|environ\.get\(|getenv\()\"(\w+)\"", block))
    assert "ATTNSERVE_GRPC" in read and "ATTNSERVE_URL" in read  # the patterns see them
    assert read <= set(defined), read - set(defined)


def test_examples_name_only_the_model_make_serve_serves() -> None:
    makefile = (API_MD.parents[1] / "Makefile").read_text()
    assert re.search(rf"^DEFAULT_MODEL \?= {MODEL}$", makefile, flags=re.M)
    named = {
        name
        for block in BLOCKS + PYTHON_BLOCKS
        for names in MODEL_NAMED.findall(block)
        for name in names
        if name
    }
    assert named == {MODEL, "no-such-model"}, named


def test_page_has_examples() -> None:
    assert len(BLOCKS) >= 10
    for block in BLOCKS:
        assert "$ATTNSERVE_URL" in block and "curl" in block, block
        assert block.count("curl ") == 1, "one request per example, so one status"
        first = next(line for line in block.splitlines() if not line.startswith("#"))
        assert first.startswith(("curl ", "python3 -c ")), block


@pytest.mark.parametrize(
    ("blocks", "checks"), [(BLOCKS, BASH_CHECKS), (PYTHON_BLOCKS, PYTHON_CHECKS)]
)
def test_every_example_has_exactly_one_check(blocks: list[str], checks: dict[str, Any]) -> None:
    for block in blocks:
        assert len(matching(checks, block)) == 1, (matching(checks, block), block)
    for pattern in checks:
        assert sum(bool(re.search(pattern, b)) for b in blocks) == 1, pattern


def test_every_error_example_is_checked_as_one() -> None:
    """A ``# expect error:`` block's check expects that error_type (or OpenAI code)."""
    for block in BLOCKS:
        expected = EXPECT_ERROR.search(block)
        (pattern,) = matching(BASH_CHECKS, block)
        check = BASH_CHECKS[pattern]
        assert isinstance(check, Refused) == bool(expected), block
        if isinstance(check, Refused) and expected:
            assert check.kind == expected.group(1), (check, block)


@pytest.fixture(scope="module")
def python3_on_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH whose ``python3`` is this interpreter, so the examples need no system Python."""
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "python3").symlink_to(sys.executable)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def run_block(block: str, env: dict[str, str]) -> Answer:
    """Run one example as a reader would, with curl also reporting the HTTP status."""
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{CURL_WITH_STATUS}\n{block}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    statuses = re.findall(rf"^{STATUS_LINE} (\d+)$", done.stderr, flags=re.MULTILINE)
    assert len(statuses) == 1, done.stderr
    stderr = re.sub(rf"^{STATUS_LINE} \d+\n", "", done.stderr, flags=re.MULTILINE)
    return Answer(int(statuses[0]), done.stdout, stderr)


@pytest.fixture(scope="module")
def minilm_session(minilm_repository: Path) -> ort.InferenceSession:
    """onnxruntime on MiniLM's model.onnx, run directly (not through the service)."""
    return new_session(str(minilm_repository / MODEL / graph_io.GRAPH_EMBEDDINGS))


@pytest.mark.parametrize("block", BLOCKS, ids=[_block_id(b) for b in BLOCKS])
def test_example_answers_as_documented(
    block: str,
    minilm_server_url: str,
    minilm_grpc_address: str,
    python3_on_path: str,
    minilm_session: ort.InferenceSession,
) -> None:
    if "/metrics" in block:  # the counter the example greps for exists once tokens were encoded
        body = {"inputs": ["Tokens to count."]}
        r = httpx.post(f"{minilm_server_url}/v1/encode", json=body, timeout=30)
        assert r.status_code == 200, r.text
    answer = run_block(block, example_env(minilm_server_url, minilm_grpc_address, python3_on_path))
    (pattern,) = matching(BASH_CHECKS, block)
    BASH_CHECKS[pattern](answer, minilm_session)


# The client libraries the page shows in Python, by top-level module: each must have an
# example that imports it.
PYTHON_CLIENTS = {
    "attnserve_client",
    "openai",
    "langchain_openai",
    "tritonclient",
    "huggingface_hub",
    "haystack_integrations",
    "llama_index",
    "langchain_huggingface",
}


def python_example(block: str) -> tuple[set[str], list[str]]:
    """What a ```python block imports (top-level modules), and why it is not a runnable
    example against the server (empty when it is): it must parse, use a library beyond
    the standard one and numpy, read the server's address from an ``ATTNSERVE_*``
    variable (``test_python_example_runs`` sets them) and print what it shows."""
    try:
        tree = ast.parse(block)
    except SyntaxError as exc:
        return set(), [f"does not parse: {exc}"]
    imported: set[str] = set()
    read: list[ast.expr] = []  # the names read from the environment
    calls: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            read.append(node.slice)
        elif isinstance(node, ast.Call):
            calls.add(ast.unparse(node.func))
            if ast.unparse(node.func) in ("os.environ.get", "os.getenv") and node.args:
                read.append(node.args[0])
    problems = []
    if not imported - set(sys.stdlib_module_names) - {"numpy"}:
        problems.append("imports no client library")
    if not any(isinstance(n, ast.Constant) and str(n.value).startswith("ATTNSERVE_") for n in read):
        problems.append("reads no ATTNSERVE_* variable for the server's address")
    if "print" not in calls:
        problems.append("prints nothing")
    return imported, problems


def test_page_has_python_examples() -> None:
    """Every ```python block is an example (see ``python_example``), and between them
    they show every client of PYTHON_CLIENTS."""
    shown: set[str] = set()
    for block in PYTHON_BLOCKS:
        imported, problems = python_example(block)
        assert not problems, (problems, block)
        shown |= imported
    assert shown >= PYTHON_CLIENTS, PYTHON_CLIENTS - shown


def test_the_python_example_check_can_fail() -> None:
    """Words in a comment (all the old check looked for), a syntax error, a block that
    never reaches the server or shows nothing: none is an example."""
    assert python_example("# openai and langchain\nprint(1)\n")[1] == [
        "imports no client library",
        "reads no ATTNSERVE_* variable for the server's address",
    ]
    assert python_example("import openai\nclient = openai.OpenAI(\n")[1][0].startswith(
        "does not parse"
    )
    local = 'import openai\nclient = openai.OpenAI(base_url="http://127.0.0.1:8000")\nprint(1)'
    assert python_example(local)[1] == ["reads no ATTNSERVE_* variable for the server's address"]
    silent = 'import os\nimport openai\nopenai.OpenAI(base_url=os.environ["ATTNSERVE_URL"])'
    assert python_example(silent)[1] == ["prints nothing"]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.split("\n")[0] for b in PYTHON_BLOCKS])
def test_python_example_runs(
    block: str, minilm_server_url: str, minilm_grpc_address: str, python3_on_path: str
) -> None:
    (pattern,) = matching(PYTHON_CHECKS, block)
    env = example_env(minilm_server_url, minilm_grpc_address, python3_on_path)
    # The pretrained tests set HF_HUB_OFFLINE=1 for this process (no weights from a hub);
    # huggingface_hub applies it to every URL, so the examples' own 127.0.0.1 too.
    env["HF_HUB_OFFLINE"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", block + PYTHON_CHECKS[pattern]],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the example prints what it shows"


def test_checks_can_fail() -> None:
    """The checks refuse a wrong status and wrong content, not only an error body."""
    session: Any = None  # none of these checks runs the model
    right = Answer(200, json.dumps({"live": True}), "")
    BASH_CHECKS[path("/v2/health/live")](right, session)
    for wrong in (
        Answer(503, right.stdout, ""),
        Answer(200, json.dumps({"live": False}), ""),
    ):
        with pytest.raises(AssertionError):
            BASH_CHECKS[path("/v2/health/live")](wrong, session)
    not_found = {"error": "model 'x' is not served here", "error_type": "model_not_found"}
    with pytest.raises(AssertionError):  # the right body with the wrong status
        BASH_CHECKS["no-such-model"](Answer(422, json.dumps(not_found), ""), session)
    maps = np.full((1, 2, 3, 3), 1 / 2, dtype=np.float32)  # rows sum to 1.5
    body = {"data": [{"embeddings": None, "attention": maps.tolist()}]}
    with pytest.raises(AssertionError):
        BASH_CHECKS[r"random\.seed\(1\)"](Answer(200, json.dumps(body), ""), session)


def test_examples_cover_every_endpoint(http_client: httpx.Client) -> None:
    paths = set(http_client.get("/openapi.json").json()["paths"])
    assert paths  # the API describes itself
    for route in paths:
        assert f"`{route}`" in TEXT or f" {route}`" in TEXT, f"{route} is not documented"
        pattern = re.sub(r"\\\{\w+\\\}", r"[\\w-]+", re.escape(route)) + r"(?![\w/])"
        assert any(re.search(r"\$ATTNSERVE_URL" + pattern, b) for b in BLOCKS), (
            f"no example for {route}"
        )


def test_the_error_table_is_the_catalog() -> None:
    """docs/api.md's error table is generated from service/errors.py (one source, like the
    OpenAPI's error responses): regenerate it with `python -m service.errors`."""
    assert errors.markdown_table() in TEXT
    documented = {kind for _, kind, _ in errors.error_rows()}
    assert documented == {cls.error_type for cls in errors.catalog()} | {
        kind for _, kind, _ in errors.HTTP_ERRORS
    }


def test_openapi_documents_each_routes_own_errors(http_client: httpx.Client) -> None:
    """Each route documents the errors its access can raise, in its protocol's shape."""
    paths = http_client.get("/openapi.json").json()["paths"]
    assert set(paths["/health/live"]["get"]["responses"]) == {"200", "503"}
    assert {"401", "404", "503"} <= set(paths["/v1/models/{name}"]["get"]["responses"])
    assert "413" not in paths["/v2/models/{model}"]["get"]["responses"]
    encode = paths["/v1/encode"]["post"]["responses"]
    assert {"400", "401", "404", "408", "413", "415", "422", "429", "503", "504"} <= set(encode)
    embeddings = paths["/v1/embeddings"]["post"]["responses"]
    assert "422" not in embeddings and "invalid_input" in embeddings["400"]["description"]
