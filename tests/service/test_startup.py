"""The server refuses to start on a corrupt, empty or missing model repository."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from bench.lib.server import READY_TIMEOUT_ENV
from model_export import graph_io
from service.__main__ import CANNOT_START
from tests.client.helpers import poison_model
from tests.conftest import ServerFailed, running_server, server_process


def _corrupt_graph(name: str) -> Callable[[Path, Path], Path]:
    def make(tiny: Path, tmp: Path) -> Path:
        repo = tmp / "repo"
        shutil.copytree(tiny, repo / "tiny")
        with (repo / "tiny" / name).open("ab") as f:
            f.write(b"\0")  # one byte appended: the digest no longer matches config.json
        return repo

    return make


def _missing_file(name: str) -> Callable[[Path, Path], Path]:
    def make(tiny: Path, tmp: Path) -> Path:
        repo = tmp / "repo"
        shutil.copytree(tiny, repo / "tiny")
        (repo / "tiny" / name).unlink()
        return repo

    return make


def _edited_manifest(**changes: object) -> Callable[[Path, Path], Path]:
    def make(tiny: Path, tmp: Path) -> Path:
        repo = tmp / "repo"
        shutil.copytree(tiny, repo / "tiny")
        path = repo / "tiny" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
        return repo

    return make


def _empty(tiny: Path, tmp: Path) -> Path:
    (tmp / "repo").mkdir()
    return tmp / "repo"


def _missing(tiny: Path, tmp: Path) -> Path:
    return tmp / "no-such-repo"


@pytest.mark.parametrize(
    ("make_repo", "says"),
    [
        (_corrupt_graph("model.onnx"), "SHA-256"),
        (_corrupt_graph("model_attn.onnx"), "SHA-256"),
        (_missing_file("config.json"), "config.json"),
        (_empty, "no model"),
        (_missing, "does not exist"),
        (_edited_manifest(format_version=99), "format_version 99 is not supported"),
        (_edited_manifest(pooling="sum"), "pooling must be one of"),
        (_edited_manifest(matryoshka_dimensions=[0]), "matryoshka_dimensions"),
    ],
    ids=[
        "corrupt-model",
        "corrupt-attn",
        "no-config",
        "empty-repo",
        "missing-repo",
        "future-manifest",
        "bad-pooling",
        "bad-matryoshka",
    ],
)
def test_refuses_to_start(
    tiny_model_dir: Path, tmp_path: Path, make_repo: Callable[[Path, Path], Path], says: str
) -> None:
    repo = make_repo(tiny_model_dir, tmp_path)
    with (
        pytest.raises(ServerFailed) as failed,
        running_server(repo),
    ):
        pytest.fail("the server became ready")  # pragma: no cover
    assert failed.value.returncode == CANNOT_START
    assert says in failed.value.log, failed.value.log


def test_a_taken_port_is_the_same_exit_status(model_repository: Path) -> None:
    """Cannot start is one documented status whatever the cause: uvicorn exits 3 itself
    (its STARTUP_FAILURE) for a model and for a taken port alike, where the comment in
    service/__main__.py said it returned normally and the code then returned 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        with (
            pytest.raises(ServerFailed) as failed,
            running_server(model_repository, port=port),
        ):
            pytest.fail("the server became ready")  # pragma: no cover
    assert failed.value.returncode == CANNOT_START, failed.value.log


@pytest.mark.parametrize(
    ("providers", "says"),
    [
        ("CUDAExecutionProvider", "asks for ['CUDAExecutionProvider']"),
        (
            "TensorrtExecutionProvider,CPUExecutionProvider",
            "asks for ['TensorrtExecutionProvider']",
        ),
        (" , ", "asks for no provider"),
    ],
    ids=["cuda", "tensorrt-first", "empty"],
)
def test_refuses_a_missing_execution_provider(
    model_repository: Path, providers: str, says: str
) -> None:
    """This CPU build of onnxruntime has no GPU providers: a clear refusal, not a fallback."""
    with (
        pytest.raises(ServerFailed) as failed,
        running_server(model_repository, providers=providers),
    ):
        pytest.fail("the server became ready")  # pragma: no cover
    assert failed.value.returncode != 0
    assert says in failed.value.log and "onnxruntime-gpu" in failed.value.log, failed.value.log


def test_serves_with_the_cpu_provider_named(model_repository: Path) -> None:
    with running_server(model_repository, providers="CPUExecutionProvider") as url:
        assert httpx.get(f"{url}/health/ready", timeout=10).status_code == 200


def test_loading_warming_up_and_calibrating_log_each_graph(model_repository: Path) -> None:
    """The start's long steps are no silence: a log line as each graph's session opens,
    as it warms up and as it is timed, each saying k/n (JSON logs: the message). The
    tiny model's take well under ``QUIET_FOR``: DEBUG lines, shown at that level."""
    with server_process(model_repository, log_level="debug", log_format="json") as server:
        messages = [json.loads(line)["message"] for line in server.log().splitlines()]
    graphs = list(graph_io.GRAPH_OUTPUTS)  # tiny: the five encoder graphs
    for what in ("loading model tiny", "warming up model tiny", "calibrating model tiny"):
        shown = [m.split(" (")[0] for m in messages if m.startswith(f"{what}: ")]
        assert shown == [f"{what}: graph {k}/5 {graph}" for k, graph in enumerate(graphs, 1)], (
            messages
        )
        first, *rest = (m for m in messages if m.startswith(f"{what}: "))
        assert first.endswith("so far, time left: after the first)")
        assert all(m.endswith(" s left)") for m in rest)


def test_a_taken_grpc_port_stops_the_start(model_repository: Path) -> None:
    """Two servers cannot share the gRPC port. grpc set SO_REUSEPORT on its socket by
    default, so a second server bound the port another process held with SO_REUSEPORT (a
    first grpc server does), logged "gRPC … on 127.0.0.1:<port>" and took turns answering
    its calls. Now the start fails as a taken HTTP port does: one line, exit status 3."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as a grpc server's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        grpc_port = taken.getsockname()[1]
        with (
            pytest.raises(ServerFailed) as failed,
            running_server(model_repository, grpc_port=str(grpc_port), log_level="info"),
        ):
            pytest.fail("the server became ready")  # pragma: no cover
    log = failed.value.log
    assert failed.value.returncode == CANNOT_START, log
    line = f"cannot listen for gRPC on 127.0.0.1:{grpc_port}: the port is taken"
    assert line in log, log
    assert "gRPC (Open Inference Protocol) on" not in log, log
    assert "Traceback" not in log, log


def test_a_server_never_ready_ends_the_wait_with_its_log(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tests' one readiness wait (bench.lib.server.wait_ready) is bounded by
    ATTNSERVE_TEST_READY_TIMEOUT and shows the end of the server's log when it gives up:
    before, each fixture had its own fixed 60 s and said only "not ready"."""
    poison_model(tiny_model_dir, tmp_path / "repo" / "tiny")  # its warm-up fails: never ready
    monkeypatch.setenv(READY_TIMEOUT_ENV, "15")  # the warm-up fails within ~2 s
    with pytest.raises(TimeoutError) as waited, running_server(tmp_path / "repo"):
        pytest.fail("the server became ready")  # pragma: no cover
    said = str(waited.value)
    assert "not ready after 15 s (ATTNSERVE_TEST_READY_TIMEOUT)" in said, said
    assert "warm-up failed: the server will never be ready" in said, said  # from its log


def test_the_start_up_log_speaks_to_its_reader(model_repository: Path) -> None:
    """What `make serve` prints at its default level, in words a user can act on: which
    connections it takes, which models it serves. The run planner's per-graph timings
    ("runs of up to 486.3 ms alone share the lanes") are for whoever tunes it: debug."""
    with server_process(model_repository, log_level="info") as server:
        log = server.log()
    assert "alone share the lanes" not in log, log
    assert "service.calibration" not in log, log
    assert "accepts up to 4096 open connections at once" in log, log
    assert "ready: serving tiny (requests that name no model go to tiny)" in log, log
