"""Models loaded, swapped and unloaded while serving (ATTNSERVE_MODEL_CONTROL), through
Triton's repository API with tritonclient (HTTP and gRPC) and raw HTTP, on real servers.

Versions are the tiny model exported with two seeds, so every answer says which
version made it: each is checked against onnxruntime on that version's own graph
(tolerance 1e-5: another batch composition, the same weights).
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from model_export.manifest import Manifest, graph_io
from tests.conftest import free_port, server_process
from tests.service.conftest import VERSION_SEEDS
from tests.support.metrics import metric
from tests.support.onnx_runs import new_session, ort_encode
from tests.support.tiny import D_MODEL
from tests.support.wait import wait_until

ATOL = 1e-5
ADMIN = "admin-key"
SEEDS = VERSION_SEEDS


def repository(tmp_path: Path, exports: Path, versions: tuple[str, ...]) -> Path:
    """A repository whose ``tiny`` holds ``versions`` in Triton's layout."""
    repo = tmp_path / "repo"
    for version in versions:
        shutil.copytree(exports / version, repo / "tiny" / version)
    return repo


def renamed(source: Path, target: Path, name: str) -> None:
    """A copy of an export under another model name (its directory's)."""
    shutil.copytree(source, target)
    manifest = Manifest.read(target)
    dataclasses.replace(manifest, name=name).write(target)


def expected(exports: Path) -> dict[str, np.ndarray]:
    """Each version's last_hidden_state for INPUT, from onnxruntime on its own graph."""
    answers = {}
    for version in SEEDS:
        session = new_session(exports / version / graph_io.GRAPH_EMBEDDINGS)
        answers[version] = ort_encode(session, [INPUT])[0][0]
    return answers


INPUT = np.random.default_rng(7).standard_normal((6, D_MODEL)).astype(np.float32)


def infer(url: str, model: str = "tiny", version: str | None = None) -> httpx.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    body = {
        "inputs": [
            {"name": graph_io.INPUT_EMBEDS, "datatype": "FP32", "shape": [1, 6, D_MODEL],
             "data": INPUT.ravel().tolist()},
        ],
        "outputs": [{"name": graph_io.OUTPUT_HIDDEN}],
    }  # fmt: skip
    return httpx.post(url + path, json=body, timeout=30)


def hidden_of(answer: httpx.Response) -> tuple[str, np.ndarray]:
    body = answer.json()
    (output,) = body["outputs"]
    return body["model_version"], np.asarray(output["data"], np.float32).reshape(6, D_MODEL)


@pytest.fixture
def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


@pytest.mark.slow
def test_a_version_swap_under_load_mixes_nothing(tmp_path: Path, exports: Path) -> None:
    """64 clients for 30 s while version 2 is loaded beside 1 and swapped in: every answer
    is 200 and equals the graph of the version it claims; the old version's memory goes
    once its last run ends."""
    repo = repository(tmp_path, exports, ("1",))
    want = expected(exports)
    with server_process(repo, model_control="explicit") as server:
        url = server.url
        seen: dict[str, int] = {"1": 0, "2": 0}
        errors: list[str] = []
        stop = time.monotonic() + 30

        def client() -> None:
            with httpx.Client(base_url=url, timeout=30) as http:
                while time.monotonic() < stop and not errors:
                    answer = infer(str(http.base_url).rstrip("/"))
                    if answer.status_code != 200:
                        errors.append(f"{answer.status_code}: {answer.text}")
                        return
                    version, hidden = hidden_of(answer)
                    if answer.headers["x-model-version"] != version:
                        errors.append("header and body disagree")
                    if not np.allclose(hidden, want[version], rtol=0, atol=ATOL):
                        errors.append(f"answer of version {version} is not its graph's")
                    seen[version] += 1

        threads = [threading.Thread(target=client) for _ in range(64)]
        for thread in threads:
            thread.start()
        time.sleep(8)
        shutil.copytree(exports / "2", repo / "tiny" / "2")
        loaded = httpx.post(f"{url}/v2/repository/models/tiny/load", timeout=60)
        assert loaded.status_code == 200, loaded.text
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        assert seen["1"] > 0 and seen["2"] > 0, seen
        assert hidden_of(infer(url))[0] == "2"  # new requests go to the new version
        give_up = time.monotonic() + 10
        while metric(url, "attnserve_model_versions_in_memory", model="tiny") != 1:
            assert time.monotonic() < give_up, "version 1 was never freed"
            time.sleep(0.1)


def test_an_idle_swapped_out_version_is_freed_without_another_request(
    tmp_path: Path, exports: Path
) -> None:
    """Version 1 served a few requests, then version 2 was swapped in and nothing more
    was asked of the model: version 1 was kept (two versions in memory) until the
    model's next request, held by its batcher worker's last batch."""
    repo = repository(tmp_path, exports, ("1",))
    with server_process(repo, model_control="explicit") as server:
        for _ in range(3):
            assert hidden_of(infer(server.url))[0] == "1"
        shutil.copytree(exports / "2", repo / "tiny" / "2")
        loaded = httpx.post(f"{server.url}/v2/repository/models/tiny/load", timeout=60)
        assert loaded.status_code == 200, loaded.text
        wait_until(
            lambda: metric(server.url, "attnserve_model_versions_in_memory", model="tiny") == 1,
            "version 1 stayed in memory with no request to free it",
            timeout=10,
        )


@pytest.mark.slow  # MiniLM's export (shared with the other MiniLM tests) and two loads
def test_a_load_does_not_stall_the_model_serving(tmp_path: Path, minilm_repository: Path) -> None:
    """A client sends one-text requests one after another to the default model while a
    copy of it loads: they go on being answered throughout the load. The loaded model's
    calibration took the lanes back to back, so a request queued then waited for all
    of it (12.9 s of a 13.5 s load)."""
    repo = tmp_path / "repo"
    shutil.copytree(minilm_repository / "minilm-l6", repo / "minilm-l6")
    renamed(minilm_repository / "minilm-l6", repo / "other", "other")
    settings = {"model_control": "explicit", "default_model": "minilm-l6"}
    with server_process(repo, intra_op_threads="0", **settings) as server:
        answered: list[tuple[float, float]] = []  # (sent, seconds)
        stop = threading.Event()

        def client() -> None:
            body = {"model": "minilm-l6", "input": "A short sentence to embed."}
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    sent = time.monotonic()
                    answer = http.post(f"{server.url}/v1/embeddings", json=body)
                    assert answer.status_code == 200, answer.text
                    answered.append((sent, time.monotonic() - sent))

        thread = threading.Thread(target=client)
        thread.start()
        try:
            time.sleep(1.0)
            loads = []
            for _ in range(2):  # the first load, and a reload (a new version's swap)
                began = time.monotonic()
                loaded = httpx.post(f"{server.url}/v2/repository/models/other/load", timeout=120)
                assert loaded.status_code == 200, loaded.text
                loads.append((began, time.monotonic()))
        finally:
            stop.set()
            thread.join()
        for began, ended in loads:
            during = [seconds for sent, seconds in answered if began <= sent < ended]
            # Structural, not a timing bound: no request waited out most of the load.
            assert len(during) >= 3 and max(during) < (ended - began) / 2, (
                ended - began,
                sorted(during)[-5:],
                len(during),
            )


def test_repository_api_through_tritonclient(
    tmp_path: Path, exports: Path, admin: dict[str, str]
) -> None:
    """Explicit mode: the default model loads at start, another on a load call (HTTP
    client), is unloaded (gRPC client) while the first keeps serving; keys are
    admin keys, never the inference key."""
    repo = repository(tmp_path, exports, ("1",))
    renamed(exports / "2", repo / "other", "other")
    grpc_port = free_port()
    with server_process(
        repo,
        model_control="explicit",
        default_model="tiny",
        api_key="inference-key",
        admin_keys=f"first-admin, {ADMIN}",
        grpc_port=str(grpc_port),
    ) as server:
        url = server.url
        http = thttp.InferenceServerClient(url.removeprefix("http://"))
        grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        keyed = {"Authorization": "Bearer inference-key"}
        with pytest.raises(InferenceServerException, match="admin key"):
            http.get_model_repository_index(headers=keyed)
        index = http.get_model_repository_index(headers=admin)
        assert {(m["name"], m["state"]) for m in index} == {
            ("tiny", "READY"),
            ("other", "UNAVAILABLE"),
        }
        assert next(m for m in index if m["name"] == "other")["reason"] == "not loaded"
        refused = httpx.post(f"{url}/v1/encode", json={"model": "other",
                             "inputs": [INPUT.tolist()]}, headers=keyed)  # fmt: skip
        assert refused.status_code == 404 and "not loaded" in refused.text

        http.load_model("other", headers=admin)
        assert http.is_model_ready("other", headers=keyed)
        answer = httpx.post(f"{url}/v1/encode", json={"model": "other",
                            "inputs": [INPUT.tolist()]}, headers=keyed)  # fmt: skip
        assert answer.status_code == 200 and answer.headers["x-model-version"] == "1"

        metadata = {"authorization": admin["Authorization"]}  # gRPC keys are lower case
        grpc.unload_model("other", headers=metadata)
        index = grpc.get_model_repository_index(headers=metadata, as_json=True)["models"]
        states = {m["name"]: (m.get("state"), m.get("reason")) for m in index}
        assert states == {"tiny": ("READY", None), "other": ("UNAVAILABLE", "unloaded")}
        assert infer(url).status_code == 401  # the inference key is still needed for work
        with httpx.Client(headers=keyed) as client:
            served = client.post(f"{url}/v1/encode", json={"inputs": [INPUT.tolist()]})
        assert served.status_code == 200  # the default model never stopped
        # Every model unloaded: the list is empty, not "models are loading" (it was 503).
        http.unload_model("tiny", headers=admin)
        listed = httpx.get(f"{url}/v1/models", headers=keyed)
        assert listed.status_code == 200 and listed.json()["data"] == []
        http.close()
        grpc.close()


def test_a_broken_or_oversized_load_leaves_service_unchanged(tmp_path: Path, exports: Path) -> None:
    repo = repository(tmp_path, exports, ("1",))
    want = expected(exports)
    with server_process(repo, model_control="explicit", model_memory_bytes=str(16 * 2**20)) as s:
        url = s.url
        broken = repo / "tiny" / "2"
        shutil.copytree(exports / "2", broken)
        with (broken / graph_io.GRAPH_EMBEDDINGS).open("ab") as graph:
            graph.write(b"not what the manifest hashed")
        answer = httpx.post(f"{url}/v2/repository/models/tiny/load", timeout=60)
        assert answer.status_code == 400, answer.text
        assert "SHA-256" in answer.json()["error"] and "version 1 still serves" in answer.text
        version, hidden = hidden_of(infer(url))
        assert version == "1" and np.allclose(hidden, want["1"], rtol=0, atol=ATOL)

        shutil.rmtree(broken)
        shutil.copytree(exports / "2", broken)
        (broken / "padding.bin").write_bytes(b"\0" * (17 * 2**20))  # counts as model files
        answer = httpx.post(f"{url}/v2/repository/models/tiny/load", timeout=60)
        assert answer.status_code == 400 and "ATTNSERVE_MODEL_MEMORY_BYTES" in answer.text
        assert hidden_of(infer(url))[0] == "1"
        assert infer(url, version="2").status_code == 404
        assert metric(url, "attnserve_model_loads_total", model="tiny", outcome="failed") == 1
        assert metric(url, "attnserve_model_loads_total", model="tiny", outcome="refused") == 1


def test_poll_mode_swaps_in_a_new_version(tmp_path: Path, exports: Path) -> None:
    repo = repository(tmp_path, exports, ("1",))
    with server_process(repo, model_control="poll", poll_seconds="0.2") as server:
        assert hidden_of(infer(server.url))[0] == "1"
        shutil.copytree(exports / "2", repo / "tiny" / "2")
        wait_until(lambda: hidden_of(infer(server.url))[0] == "2", "the new version never served")


def test_without_model_control_the_repository_is_fixed(server_url: str) -> None:
    answer = httpx.post(f"{server_url}/v2/repository/models/tiny/load", timeout=30)
    assert answer.status_code == 400 and "ATTNSERVE_MODEL_CONTROL" in answer.text
    index = httpx.post(f"{server_url}/v2/repository/index", timeout=30).json()
    assert index == [{"name": "tiny", "version": "1", "state": "READY", "reason": ""}]


def test_explicit_mode_loads_the_start_up_list(tmp_path: Path, exports: Path) -> None:
    """ATTNSERVE_LOAD_MODELS, as Triton's --load-model: those and the default at start."""
    repo = repository(tmp_path, exports, ("1",))
    renamed(exports / "2", repo / "other", "other")
    renamed(exports / "2", repo / "third", "third")
    with server_process(repo, model_control="explicit", default_model="tiny",
                        load_models="third") as server:  # fmt: skip
        index = httpx.post(f"{server.url}/v2/repository/index", json={"ready": True}).json()
        assert sorted(m["name"] for m in index) == ["third", "tiny"]
        assert infer(server.url, model="third").status_code == 200
        assert infer(server.url, model="other").status_code == 404


def test_the_poll_survives_a_repository_that_vanishes_for_a_while(
    tmp_path: Path, exports: Path
) -> None:
    """A scan that fails (the volume unmounted, a rename) is logged and tried again; it
    once ended the poll for good."""
    repo = repository(tmp_path, exports, ("1",))
    with server_process(repo, model_control="poll", poll_seconds="0.1") as server:
        away = repo.rename(tmp_path / "away")
        time.sleep(0.5)  # a few failed scans
        assert hidden_of(infer(server.url))[0] == "1"  # serving from memory meanwhile
        shutil.copytree(exports / "2", away / "tiny" / "2")
        away.rename(repo)
        wait_until(lambda: hidden_of(infer(server.url))[0] == "2", "the poll stopped")


def test_poll_mode_unloads_a_model_whose_directory_is_gone(tmp_path: Path, exports: Path) -> None:
    """As Triton's poll mode: a removed directory's model stops serving (404 saying why),
    the others serve on, and it serves again when it comes back. A repository found empty
    is taken for an unmounted volume: nothing is unloaded. The poll used to keep serving
    a removed model for good."""
    repo = repository(tmp_path, exports, ("1",))
    renamed(exports / "2", repo / "other", "other")
    with server_process(
        repo, model_control="poll", poll_seconds="0.1", default_model="tiny"
    ) as server:
        url = server.url
        assert infer(url, model="other").status_code == 200
        shutil.move(repo / "other", tmp_path / "other")
        wait_until(
            lambda: infer(url, model="other").status_code == 404, "the removed model served on"
        )
        assert "removed from the repository" in infer(url, model="other").json()["error"]
        assert hidden_of(infer(url))[0] == "1"  # the other model serves on
        index = httpx.post(f"{url}/v2/repository/index").json()
        assert [m["name"] for m in index] == ["tiny"]
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["tiny"]
        shutil.move(tmp_path / "other", repo / "other")
        wait_until(lambda: infer(url, model="other").status_code == 200, "it never came back")
        # Empty: both directories moved out at once. Nothing is unloaded.
        shutil.move(repo, tmp_path / "away")
        repo.mkdir()
        time.sleep(0.5)  # several scans of the empty repository
        assert infer(url, model="other").status_code == 200 and infer(url).status_code == 200


def test_poll_mode_keeps_serving_a_directory_replaced_by_two_renames(
    tmp_path: Path, exports: Path
) -> None:
    """Replacing a flat model directory is two renames (old out, new in). A scan that falls
    between them finds it missing; unloading then would answer 404 until the next scan.
    A model is unloaded only when missing at two scans in a row.

    A scan is made to land between the renames: just after the first, a new model
    directory (``probe``) appears, and the second rename waits until the server has
    tried to load it. The scan that found ``probe`` listed the repository after ``other``
    had gone, so ``other`` was missing at one scan, and the next finds it back."""
    repo = repository(tmp_path, exports, ("1",))
    renamed(exports / "2", repo / "other", "other")
    renamed(exports / "1", tmp_path / "staging", "other")
    renamed(exports / "1", tmp_path / "probe", "probe")
    want = expected(exports)
    with server_process(
        repo, model_control="poll", poll_seconds="0.5", default_model="tiny"
    ) as server:
        url = server.url
        assert np.allclose(hidden_of(infer(url, model="other"))[1], want["2"], rtol=0, atol=ATOL)
        statuses = set()

        def scanned() -> bool:  # a scan found the probe, whatever its load's outcome
            statuses.add(infer(url, model="other").status_code)
            return metric(url, "attnserve_model_loads_total", model="probe") > 0

        (repo / "other").rename(tmp_path / "old")
        (tmp_path / "probe").rename(repo / "probe")
        wait_until(scanned, "no scan found the probe")
        (tmp_path / "staging").rename(repo / "other")
        deadline = time.monotonic() + 30
        while True:
            answer = infer(url, model="other")
            statuses.add(answer.status_code)
            assert statuses == {200}, "unloaded while its directory was being replaced"
            if np.allclose(hidden_of(answer)[1], want["1"], rtol=0, atol=ATOL):
                break
            assert time.monotonic() < deadline, "the replaced export never served"
        time.sleep(0.6)  # a scan past the swap: still serving, not unloaded late
        statuses.add(infer(url, model="other").status_code)
        assert statuses == {200}
        assert infer(url, model="probe").status_code == 200  # the probe was loaded


def test_poll_mode_with_policy_all_drops_a_removed_version(tmp_path: Path, exports: Path) -> None:
    """Which versions there are is part of what the poll compares: removing version 1 while
    2 serves drops it (before, only a change of the highest was seen)."""
    repo = repository(tmp_path, exports, ("1", "2"))
    with server_process(
        repo, model_control="poll", poll_seconds="0.1", version_policy="all"
    ) as server:
        url = server.url
        assert infer(url, version="1").status_code == 200
        shutil.rmtree(repo / "tiny" / "1")
        wait_until(lambda: infer(url, version="1").status_code == 404, "version 1 served on")
        assert httpx.get(f"{url}/v2/models/tiny").json()["versions"] == ["2"]
        assert hidden_of(infer(url))[0] == "2"


def test_version_policy_all_serves_the_highest_unless_a_request_names_another(
    tmp_path: Path, exports: Path
) -> None:
    repo = repository(tmp_path, exports, ("1", "2"))
    want = expected(exports)
    with server_process(repo, model_control="explicit", version_policy="all") as server:
        url = server.url
        assert hidden_of(infer(url))[0] == "2"
        for version in ("1", "2"):  # each named version answers with its own graph
            answer = infer(url, version=version)
            named, hidden = hidden_of(answer)
            assert named == version == answer.headers["x-model-version"]
            assert np.allclose(hidden, want[version], rtol=0, atol=ATOL)
        metadata = httpx.get(f"{url}/v2/models/tiny").json()
        assert metadata["versions"] == ["1", "2"]
        assert infer(url, version="3").status_code == 404
        # A new version joins on a load; a version gone from disk leaves on the next.
        shutil.copytree(exports / "1", repo / "tiny" / "3")
        shutil.rmtree(repo / "tiny" / "1")
        assert httpx.post(f"{url}/v2/repository/models/tiny/load", timeout=60).status_code == 200
        assert httpx.get(f"{url}/v2/models/tiny").json()["versions"] == ["2", "3"]
        named, hidden = hidden_of(infer(url))
        assert named == "3" and np.allclose(hidden, want["1"], rtol=0, atol=ATOL)
        index = httpx.post(f"{url}/v2/repository/index").json()
        assert [(m["version"], m["state"]) for m in index] == [("2", "READY"), ("3", "READY")]
