"""deploy/k8s as far as one host runs it: `podman kube play` of the Deployment.

The pod starts from the same image with the ConfigMap's settings and the
manifest's security context; every probe's endpoint is asked as the kubelet
would ask it, and a request to the pod's port answers like the host. What one
host cannot show (Service load balancing, the HPA, the PDB, KServe) stays with
the schema and consistency tests in tests/deploy/test_k8s_manifests.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve_client import Client
from tests.containers.conftest import EMBEDDING_ATOL, ROOT, SENTENCES, ok, record
from tests.containers.podman import Podman
from tests.support.wait import wait_until

K8S = ROOT / "deploy" / "k8s"
DEPLOYMENT = K8S / "deployment.yaml"
CONFIGMAP = K8S / "configmap.yaml"


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def pod_url(podman: Podman, image: str) -> Iterator[str]:
    """The Deployment's pod, played by podman; yields http://<pod ip>:<containerPort>."""
    claim = next(
        v["persistentVolumeClaim"]["claimName"]
        for v in pod_spec()["volumes"]
        if "persistentVolumeClaim" in v
    )
    podman.run("kube down", "kube", "down", str(DEPLOYMENT), check=False)
    podman.run("kube volume", "volume", "rm", "--force", claim, check=False)
    # The claim holds the models under attnserve/ (the mount's subPath). podman 4.3
    # mounts a claim's volume whole, ignoring subPath, so the check's volume is that
    # attnserve/ folder itself: ./models, which holds minilm-l6/.
    (container,) = pod_spec()["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
    assert (mount["subPath"], mount["mountPath"]) == ("attnserve", "/models")
    models = ROOT / "models"
    podman.run("kube volume", "volume", "create", "--opt", "type=none", "--opt", "o=bind",
               "--opt", f"device={models}", claim)  # fmt: skip
    try:
        podman.run("kube play", "kube", "play", "--configmap", str(CONFIGMAP), str(DEPLOYMENT))
        pod = podman.run("kube pod", "pod", "ps", "--format", "{{.Name}}").stdout.split()[0]
        infra = podman.run("kube pod", "pod", "inspect", pod, "--format", "{{.InfraContainerID}}")
        ip = podman.inspect(infra.stdout.strip(), "{{range .NetworkSettings.Networks}}"
                            "{{.IPAddress}}{{end}}")  # fmt: skip
        url = f"http://{ip}:{container['ports'][0]['containerPort']}"
        seconds = wait_until(
            lambda: ok(f"{url}/health/ready"), "kube: readiness", 150, interval=0.2
        )
        record(kube_ready_seconds=round(seconds, 1))
        yield url
    finally:
        podman.run("kube down", "kube", "down", str(DEPLOYMENT), check=False, timeout=90)
        podman.run("kube volume", "volume", "rm", "--force", claim, check=False)


def test_every_probe_endpoint_answers(pod_url: str) -> None:
    (container,) = pod_spec()["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = ("startupProbe", "livenessProbe", "readinessProbe")
    host = pod_url.removeprefix("http://").rsplit(":", 1)[0]
    for probe in probes:
        timeout = container[probe]["timeoutSeconds"]
        if "grpc" in container[probe]:  # grpc.health.v1 Check, as the kubelet asks it
            with grpc.insecure_channel(f"{host}:{container[probe]['grpc']['port']}") as channel:
                answer = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=timeout
                )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, probe
            continue
        get = container[probe]["httpGet"]
        port = ports.get(get["port"], get["port"])  # a named port, as the kubelet resolves it
        url = f"http://{host}:{port}{get['path']}"
        assert httpx.get(url, timeout=timeout).status_code == 200


def test_pod_runs_as_the_manifest_says(podman: Podman, pod_url: str) -> None:
    (container,) = pod_spec()["containers"]
    name = next(
        n for n in podman.run("kube ps", "ps", "--format", "{{.Names}}").stdout.split()
        if n.endswith(f"-{container['name']}")
    )  # fmt: skip
    assert podman.inspect(name, "{{.Config.User}}").startswith("10001")
    assert podman.inspect(name, "{{.HostConfig.ReadonlyRootfs}}") == "true"
    env = podman.inspect(name, "{{range .Config.Env}}{{println .}}{{end}}").splitlines()
    settings = yaml.safe_load(CONFIGMAP.read_text())["data"]
    for key, value in settings.items():
        assert f"{key}={value}" in env


def test_pod_answers_like_the_host(pod_url: str, reference: np.ndarray) -> None:
    with Client(pod_url) as client:
        got = client.encode(SENTENCES, pooling="mean", normalize=True).stack("pooled")
    np.testing.assert_allclose(got, reference, atol=EMBEDDING_ATOL, rtol=0)
