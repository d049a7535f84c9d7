"""The Helm chart (deploy/helm/hunyuan-mt): `helm lint`, `helm template` with the default values
and each CI values file (the opt-in direct exposure of TorchServe among them), every manifest
validated (built-in kinds against the Kubernetes 1.34 schemas of kubernetes-validate, the KServe
InferenceService against deploy/schemas/), and what the manifests must do: the front end is the
pod's one door (TorchServe on loopback, only the front end in the Service and open in the
NetworkPolicy, metrics to the scrapers alone, its probes its own routes, answered by `hymt web`
as the chart starts it), TorchServe's probes and preStop run our commands, GPUs equal workers,
no key material, and config.properties exactly as `hymt start` renders it."""

from __future__ import annotations

import functools
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import requests
import yaml
from referencing import Registry, Resource

from hymt_serve.cli.main import build_parser
from hymt_serve.ops.properties import read_properties, render_config, write_properties

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy/helm/hunyuan-mt"
SCHEMAS = REPO / "deploy/schemas/kserve"
KUBERNETES = "1.34.0"
RUN = "/home/model-server/run"
IMAGE_STORE = Path("/home/model-server/model_store")  # the entrypoint's --model-store
VALUES = {
    "default": None,
    "init-hpa": CHART / "ci/init-container-hpa-values.yaml",
    "kserve": CHART / "ci/kserve-values.yaml",
    "direct": CHART / "ci/direct-values.yaml",
}
TORCHSERVE_PORTS = {"inference": 8080, "management": 8081, "metrics": 8082}


@functools.cache
def helm() -> str:
    """The Helm binary: .venv/bin/helm from scripts/install_helm.sh (run here when missing)."""
    beside = Path(sys.executable).parent / "helm"
    if not beside.exists() and not shutil.which("helm"):
        subprocess.run(["bash", str(REPO / "scripts/install_helm.sh")], check=True, timeout=600)
    found = str(beside) if beside.exists() else shutil.which("helm")
    assert found, "no helm: run scripts/install_helm.sh"
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120)


def values_args(name: str) -> list[str]:
    path = VALUES[name]
    return ["-f", str(path)] if path else []


def values_of(name: str) -> dict[str, Any]:
    """The values a rendering used: the chart's defaults with the CI file merged in."""
    merged: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    path = VALUES[name]
    return _merge(merged, yaml.safe_load(path.read_text()) if path else {})


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _merge(base[key], value) if both else value
    return out


@functools.cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    done = run_helm("template", "hymt", str(CHART), "--namespace", "mt", *values_args(name))
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(name: str, kind: str) -> list[dict[str, Any]]:
    return [doc for doc in rendered(name) if doc["kind"] == kind]


def pod_spec(name: str) -> dict[str, Any]:
    if name == "kserve":
        (isvc,) = of_kind(name, "InferenceService")
        return dict(isvc["spec"]["predictor"])
    (deployment,) = of_kind(name, "Deployment")
    return dict(deployment["spec"]["template"]["spec"])


def containers(name: str) -> list[dict[str, Any]]:
    """The pod's containers: the front end first (KServe's Service takes the first one's
    ports), then TorchServe."""
    found = list(pod_spec(name)["containers"])
    first = "kserve-container" if name == "kserve" else "web"
    assert [c["name"] for c in found] == [first, "torchserve"], [c["name"] for c in found]
    return found


def server_container(name: str) -> dict[str, Any]:
    return dict(containers(name)[1])


def front_end(name: str) -> dict[str, Any]:
    return dict(containers(name)[0])


def addresses(values: dict[str, Any]) -> dict[str, str]:
    """TorchServe's addresses as the values ask: loopback unless opted out, management always."""
    inference = "0.0.0.0" if values["torchserve"]["exposeDirect"] else "127.0.0.1"
    metrics = "0.0.0.0" if values["metrics"]["expose"] else "127.0.0.1"
    return {
        "inference_address": f"http://{inference}:8080",
        "management_address": "http://127.0.0.1:8081",
        "metrics_address": f"http://{metrics}:8082",
    }


def rendered_properties(name: str, tmp_path: Path) -> dict[str, str]:
    (configmap,) = of_kind(name, "ConfigMap")
    (tmp_path / f"{name}.properties").write_text(configmap["data"]["config.properties"])
    return read_properties(tmp_path / f"{name}.properties")


# --- validation -------------------------------------------------------------------------------


def _strict_schema(filename: str) -> jsonschema.protocols.Validator:
    """A validator for one of kubernetes-validate's strict schema files (with its $refs)."""
    folder = files("kubernetes_validate") / "kubernetes-json-schema" / f"v{KUBERNETES}-local-strict"
    schema = json.loads((folder / filename).read_text())
    definitions = json.loads((folder / "_definitions.json").read_text())
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_inference_service(doc: dict[str, Any]) -> None:
    """The vendored CRD's schema, then the predictor: its extension fields against the schema
    transcribed from KServe's Go type, the rest as the core PodSpec the full CRD embeds."""
    crd = yaml.safe_load((SCHEMAS / "serving.kserve.io_inferenceservices.minimal.yaml").read_text())
    group, version = doc["apiVersion"].split("/")
    assert (group, doc["kind"]) == (crd["spec"]["group"], crd["spec"]["names"]["kind"])
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    jsonschema.validate(doc, served["schema"]["openAPIV3Schema"])
    assert set(doc["spec"]) == {"predictor"}, set(doc["spec"])
    extension = json.loads((SCHEMAS / "predictor-extension.schema.json").read_text())
    predictor = doc["spec"]["predictor"]
    own = {key: value for key, value in predictor.items() if key in extension["properties"]}
    jsonschema.validate(own, extension)
    _strict_schema("podspec-v1.json").validate(
        {key: value for key, value in predictor.items() if key not in own}
    )


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] == "InferenceService":
        validate_inference_service(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


@pytest.mark.parametrize("name", VALUES)
def test_helm_lint_passes(name: str) -> None:
    done = run_helm("lint", "--strict", str(CHART), *values_args(name))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", VALUES)
def test_every_rendered_manifest_is_valid(name: str) -> None:
    kinds = [doc["kind"] for doc in rendered(name)]
    assert "ConfigMap" in kinds and ("Deployment" in kinds) != ("InferenceService" in kinds)
    for doc in rendered(name):
        validate(doc)


def test_the_validation_can_fail() -> None:
    deployment = json.loads(json.dumps(of_kind("default", "Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    for breakage in ({"containers": "torchserve"}, {"minReplica": 1}, {"scaleMetric": "gpu"}):
        isvc = json.loads(json.dumps(of_kind("kserve", "InferenceService")[0]))
        isvc["spec"]["predictor"].update(breakage)
        with pytest.raises(jsonschema.ValidationError):
            validate(isvc)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--set", "model.source=s3"], "model.source must be pvc or init"),
        (["--set", "torchserve.config.allowed_urls=file://{model_store}/x"], "{model_store}"),
        (["--set", "torchserve.config.metrics_config=a/m.yaml"], "must be an absolute path"),
        (["--set", "torchserve.config.inference_address=http://0.0.0.0:8080"], "sets TorchServe"),
        (["--set", "torchserve.config.management_address=http://0.0.0.0:8081"], "sets TorchServe"),
        (["--set", "torchserve.config.metrics_address=http://0.0.0.0:8082"], "sets TorchServe"),
        (["--set", "kserve.enabled=true,torchserve.exposeDirect=true"], "is for the Deployment"),
        (
            [
                "--set",
                "autoscaling.enabled=true,metrics.expose=false,web.database.existingSecret=pg",
            ],
            "needs metrics.expose",
        ),
        (["--set", "web.existingSecret="], "web.existingSecret is required"),
        (["--set", "web.enabled=false"], "web.enabled was removed"),
        (["--set", "web.threads=64"], "web.threads was removed"),
        (["--set-json", "networkPolicy.extraMetricsFrom=[]"], "renamed networkPolicy.metricsFrom"),
        (["--set", "replicas=2"], "several replicas need web.database.existingSecret"),
        (
            ["--set", "autoscaling.enabled=true"],
            "several replicas need web.database.existingSecret",
        ),
        (
            ["--set", "replicas=2,web.database.sqliteClaim=db"],
            "several replicas need web.database.existingSecret",
        ),
        (
            ["--set", "web.database.existingSecret=pg,web.database.sqliteClaim=db"],
            "not both",
        ),
    ],
)
def test_bad_values_are_refused(args: list[str], says: str) -> None:
    done = run_helm("template", "hymt", str(CHART), *args)
    assert done.returncode != 0 and says in done.stderr, done.stderr


# --- behaviour ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUES)
def test_probes_run_hymt_health_and_prestop_runs_the_drain(name: str) -> None:
    container, values = server_container(name), values_of(name)
    command = {probe: container[probe]["exec"]["command"] for probe in ("startupProbe",
               "readinessProbe", "livenessProbe")}  # fmt: skip
    assert command["startupProbe"] == ["hymt", "health", "--workdir", RUN]
    assert command["readinessProbe"][:4] == ["hymt", "health", "--workdir", RUN]
    assert (
        "--liveness" in command["livenessProbe"] and "--liveness" not in command["readinessProbe"]
    )
    drain = container["lifecycle"]["preStop"]["exec"]["command"]
    assert drain[:4] == ["hymt", "drain", "--workdir", RUN]
    for argv in [*command.values(), drain]:  # what the CLI really accepts
        assert build_parser().parse_args(argv[1:]).workdir == Path(RUN)
    parsed = build_parser().parse_args(drain[1:])
    assert parsed.endpoint_wait == values["drain"]["endpointWaitSeconds"]
    assert parsed.timeout == values["drain"]["drainTimeoutSeconds"]
    grace = pod_spec(name)["terminationGracePeriodSeconds"]
    assert grace >= parsed.endpoint_wait + parsed.timeout + 30
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # minutes to load
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 120  # looser than ready
    readiness = build_parser().parse_args(command["readinessProbe"][1:])
    assert container["readinessProbe"]["timeoutSeconds"] > readiness.timeout


@pytest.mark.parametrize(
    ("name", "gpus"), [("default", 1), ("init-hpa", 2), ("kserve", 1), ("direct", 1)]
)
def test_the_workers_are_the_gpu_limit_times_workers_per_gpu(name: str, gpus: int) -> None:
    """Three workers per GPU, as the gpu profile (they share the GPU's engine process)."""
    container = server_container(name)
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert env["HYMT_WORKERS"] == str(3 * gpus)
    profile = yaml.safe_load((REPO / "configs/model-config-gpu.yaml").read_text())
    assert profile["minWorkers"] == profile["maxWorkers"] == 3
    assert profile["handler"]["share_engine"] is True


def test_the_entrypoint_builds_the_archive_with_one_worker_per_gpu(tmp_path: Path) -> None:
    """docker/entrypoint.sh with a recording `hymt`: HYMT_WORKERS reaches `hymt archive`."""
    bin_dir, model, calls = tmp_path / "bin", tmp_path / "model", tmp_path / "calls"
    bin_dir.mkdir()
    model.mkdir()
    (model / "config.json").write_text("{}")
    fake = bin_dir / "hymt"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    script = (REPO / "docker/entrypoint.sh").read_text()
    (tmp_path / "entrypoint.sh").write_text(script.replace("/home/model-server", str(tmp_path)))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HYMT_MODEL_PATH": str(model)}
    for workers, expected in (("3", "--set minWorkers=3 --set maxWorkers=3"), (None, "")):
        calls.unlink(missing_ok=True)
        extra = {"HYMT_WORKERS": workers} if workers else {}
        subprocess.run(["sh", str(tmp_path / "entrypoint.sh")], env={**env, **extra}, check=True)
        archive = calls.read_text().splitlines()[0]
        assert archive.startswith("archive ") and archive.endswith(
            f"--export-path {tmp_path}/model_store{' ' + expected if expected else ''}"
        ), archive


@pytest.mark.parametrize("name", VALUES)
def test_config_properties_is_what_hymt_start_renders(name: str, tmp_path: Path) -> None:
    assert (CHART / "files/config.properties").read_bytes() == (
        REPO / "docker/config.properties"
    ).read_bytes(), "the chart's copy must equal docker/config.properties"
    (configmap,) = of_kind(name, "ConfigMap")
    chart_text = configmap["data"]["config.properties"]
    values = values_of(name)
    overrides = {**values["torchserve"]["config"], **addresses(values)}
    ours = render_config(
        REPO / "docker/config.properties",
        {key: str(overrides[key]) for key in sorted(overrides)},
        IMAGE_STORE,
    )
    write_properties(ours, tmp_path / "hymt.properties")
    assert chart_text == (tmp_path / "hymt.properties").read_text()
    # In the pod, `hymt start` renders the mounted ConfigMap once more: nothing changes.
    (tmp_path / "mounted.properties").write_text(chart_text)
    write_properties(
        render_config(tmp_path / "mounted.properties", {}, IMAGE_STORE), tmp_path / "x"
    )
    assert (tmp_path / "x").read_text() == chart_text
    assert read_properties(tmp_path / "x")["disable_token_authorization"] == "false"
    mounts = {m["name"]: m for m in server_container(name)["volumeMounts"]}
    assert mounts["config"]["mountPath"] == "/home/model-server/docker/config.properties"


def test_config_overrides_replace_in_place_and_add_at_the_end() -> None:
    (configmap,) = of_kind("init-hpa", "ConfigMap")
    lines = configmap["data"]["config.properties"].splitlines()
    assert lines[-1] == "number_of_netty_threads=8" and "job_queue_size=500" in lines
    assert lines.index("job_queue_size=500") < lines.index("max_request_size=6553500")


@pytest.mark.parametrize("name", VALUES)
def test_no_key_material_only_secret_references(name: str) -> None:
    references: list[dict[str, Any]] = []  # secretKeyRef: a Secret's name and its key's name
    text = json.dumps(rendered(name), default=str)
    for document in rendered(name):
        references += _secret_key_refs(document)
    for reference in references:
        text = text.replace(json.dumps(reference), "")
    assert [ref["name"] for ref in references] == (
        [values_of(name)["web"]["database"]["existingSecret"]]
        if values_of(name)["web"]["database"]["existingSecret"]
        else []
    )
    assert "Secret" not in [doc["kind"] for doc in rendered(name)]
    for leak in ("key_file.json", "Bearer", '"key":', "disable_token_authorization=true"):
        assert leak not in text, leak
    references = [ref for spec in pod_spec(name).get("initContainers", [])
                  for ref in spec.get("envFrom", [])]  # fmt: skip
    secret = values_of(name)["model"]["init"]["existingSecret"]
    assert references == ([{"secretRef": {"name": secret}}] if secret else [])
    secrets = [v["secret"]["secretName"] for v in pod_spec(name)["volumes"] if "secret" in v]
    assert secrets == [values_of(name)["web"]["existingSecret"]]  # the front end's client keys


def _secret_key_refs(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = [node["secretKeyRef"]] if "secretKeyRef" in node else []
        return found + [ref for value in node.values() for ref in _secret_key_refs(value)]
    if isinstance(node, list):
        return [ref for item in node for ref in _secret_key_refs(item)]
    return []


def test_model_from_a_claim_or_copied_by_an_init_container() -> None:
    default = pod_spec("default")
    volumes = {v["name"]: v for v in default["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {
        "claimName": "hunyuan-mt-model",
        "readOnly": True,
    }
    assert "initContainers" not in default
    copied = pod_spec("init-hpa")
    volumes = {v["name"]: v for v in copied["volumes"]}
    assert volumes["model"]["emptyDir"] == {"sizeLimit": "40Gi"}
    (init,) = copied["initContainers"]
    assert init["command"] == values_of("init-hpa")["model"]["init"]["command"]
    assert {"name": "model", "mountPath": "/models/hunyuan-mt"} in init["volumeMounts"]
    into_claim = pod_spec("kserve")
    volumes = {v["name"]: v for v in into_claim["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"]["readOnly"] is False  # the init writes
    (mount,) = [m for m in server_container("kserve")["volumeMounts"] if m["name"] == "model"]
    assert mount == {
        "name": "model",
        "mountPath": "/models/hunyuan-mt",
        "readOnly": True,
        "subPath": "Hunyuan-MT-7B",
    }


@pytest.mark.parametrize("name", list(VALUES))
def test_the_compile_cache_is_on_its_volume_where_the_engine_looks(name: str) -> None:
    """TorchServe's container mounts the compile-cache volume at $HYMT_COMPILE_CACHE_DIR (the
    engine's compile_cache_dir): an emptyDir by default, the claim when one is named."""
    values = values_of(name)["compileCache"]
    server = server_container(name)
    env = {e["name"]: e.get("value") for e in server["env"]}
    (mount,) = [m for m in server["volumeMounts"] if m["name"] == "compile-cache"]
    assert env["HYMT_COMPILE_CACHE_DIR"] == mount["mountPath"] == values["mountPath"]
    assert mount.get("readOnly", False) is False
    (volume,) = [v for v in pod_spec(name)["volumes"] if v["name"] == "compile-cache"]
    if values["existingClaim"]:
        assert volume["persistentVolumeClaim"] == {"claimName": values["existingClaim"]}
        assert mount["subPath"] == values["subPath"]
    else:
        assert volume["emptyDir"] == {"sizeLimit": values["sizeLimit"]}
        assert "subPath" not in mount
    front = front_end(name)  # the front end neither compiles nor sees the cache
    assert all(m["name"] != "compile-cache" for m in front.get("volumeMounts", []))


@pytest.mark.parametrize("name", list(VALUES))
def test_the_keys_database_is_postgresql_from_a_secret_or_sqlite_on_a_claim(name: str) -> None:
    """The front end's $HYMT_DATABASE_URL (docs/database.md): PostgreSQL's URL from the
    Secret's key (several replicas count together), or SQLite on the claim mounted where the
    URL points; neither: the default SQLite file in the pod's run folder (no variable)."""
    database = values_of(name)["web"]["database"]
    web = front_end(name)
    env = {e["name"]: e for e in web.get("env", [])}
    mounts = {m["name"]: m for m in web["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(name)["volumes"]}
    if database["existingSecret"]:
        assert env["HYMT_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": database["existingSecret"], "key": database["secretKey"],
        }  # fmt: skip
        assert "database" not in mounts and "database" not in volumes
    elif database["sqliteClaim"]:
        url = env["HYMT_DATABASE_URL"]["value"]
        assert url == f"sqlite:///{mounts['database']['mountPath']}/hymt.db"
        assert mounts["database"].get("readOnly", False) is False
        assert volumes["database"]["persistentVolumeClaim"] == {
            "claimName": database["sqliteClaim"]
        }
    else:
        assert "HYMT_DATABASE_URL" not in env and "database" not in mounts
    assert all(
        e["name"] != "HYMT_DATABASE_URL" for e in server_container(name).get("env", [])
    )  # TorchServe's container never sees the URL


def test_hpa_scales_on_requests_in_flight_per_gpu() -> None:
    assert not of_kind("default", "HorizontalPodAutoscaler")
    (hpa,) = of_kind("init-hpa", "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "hymt_requests_in_flight"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "128"}
    (deployment,) = of_kind("init-hpa", "Deployment")
    assert "replicas" not in deployment["spec"]  # the HPA owns it
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]


def test_metrics_annotations_only_where_the_metrics_port_is_bound_beyond_loopback() -> None:
    for name in ("default", "init-hpa", "direct"):
        (deployment,) = of_kind(name, "Deployment")
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        expose = values_of(name)["metrics"]["expose"]
        assert ("prometheus.io/port" in annotations) == expose, name
        if expose:
            assert annotations["prometheus.io/port"] == "8082"


# --- one public door: the front end -----------------------------------------------------------


def test_the_default_is_the_front_end_alone() -> None:
    """Direct TorchServe access is an opt-in: off in values.yaml, on only in its CI file."""
    assert values_of("default")["torchserve"]["exposeDirect"] is False
    assert [n for n in VALUES if values_of(n)["torchserve"]["exposeDirect"]] == ["direct"]


@pytest.mark.parametrize("name", VALUES)
def test_torchserve_listens_on_the_pods_loopback_unless_opted_out(
    name: str, tmp_path: Path
) -> None:
    properties, values = rendered_properties(name, tmp_path), values_of(name)
    assert properties["management_address"] == "http://127.0.0.1:8081"  # never beyond the pod
    assert properties["grpc_inference_address"] == "127.0.0.1"
    assert properties["grpc_management_address"] == "127.0.0.1"
    direct, metrics = values["torchserve"]["exposeDirect"], values["metrics"]["expose"]
    assert properties["inference_address"] == (
        "http://0.0.0.0:8080" if direct else "http://127.0.0.1:8080"
    )
    assert properties["metrics_address"] == (
        "http://0.0.0.0:8082" if metrics else "http://127.0.0.1:8082"
    )
    assert properties["disable_token_authorization"] == "false"


@pytest.mark.parametrize("name", VALUES)
def test_containers_declare_exactly_the_ports_bound_beyond_loopback(name: str) -> None:
    values = values_of(name)
    assert [(p["name"], p["containerPort"]) for p in front_end(name)["ports"]] == [
        ("web", values["web"]["port"])
    ]
    declared = {p["containerPort"] for p in server_container(name).get("ports", [])}
    bound = {
        port
        for port, address in zip((8080, 8081, 8082), addresses(values).values(), strict=True)
        if "0.0.0.0" in address
    }
    assert declared == bound and 8081 not in declared


@pytest.mark.parametrize("name", VALUES)
def test_only_the_front_end_is_in_the_service(name: str) -> None:
    """The chart's Service, or for KServe the one its controller builds from the first
    container's ports (reconcilers/service: containers[0].ports, the first as port 80)."""
    values = values_of(name)
    if name == "kserve":
        assert not of_kind(name, "Service")
        first = front_end(name)
        assert first["name"] == "kserve-container"
        assert [p["containerPort"] for p in first["ports"]] == [values["web"]["port"]]
        return
    (service,) = of_kind(name, "Service")
    ports = [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]]
    expected = [(values["service"]["port"], "web")]
    if values["torchserve"]["exposeDirect"]:
        expected.append((8080, "http"))  # TorchServe's inference port, by name
    assert ports == expected
    named = {p["name"]: p["containerPort"] for c in containers(name) for p in c.get("ports", [])}
    assert {named[target] for _, target in ports} <= {values["web"]["port"], 8080}


@pytest.mark.parametrize("name", VALUES)
def test_network_policy_admits_the_front_end_and_the_scrapers_only(name: str) -> None:
    values = values_of(name)
    (policy,) = of_kind(name, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"] == pod_labels(name)
    rules = policy["spec"]["ingress"]
    open_to_all = [p["port"] for rule in rules if "from" not in rule for p in rule["ports"]]
    expected = [values["web"]["port"]] + [8080] * values["torchserve"]["exposeDirect"]
    assert open_to_all == expected
    restricted = [rule for rule in rules if "from" in rule]
    if values["metrics"]["expose"]:
        (rule,) = restricted
        assert rule["from"] == values["networkPolicy"]["metricsFrom"] and rule["from"]
        assert [p["port"] for p in rule["ports"]] == [8082]
    else:
        assert not restricted
    admitted = {p["port"] for rule in rules for p in rule["ports"]}
    declared = {p["containerPort"] for c in containers(name) for p in c.get("ports", [])}
    assert TORCHSERVE_PORTS["management"] not in admitted and admitted == declared


def pod_labels(name: str) -> dict[str, str]:
    if name == "kserve":
        (isvc,) = of_kind(name, "InferenceService")
        return dict(isvc["spec"]["predictor"]["labels"])
    (deployment,) = of_kind(name, "Deployment")
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize("name", VALUES)
def test_the_front_end_runs_beside_torchserve_with_the_secrets_client_keys(name: str) -> None:
    """`hymt web` on the pod's address, its probes its own routes, TorchServe's addresses from
    the ConfigMap at the path it reads, the shared run/ (TorchServe's keys, the drain marker),
    its client keys from the Secret where it reads them by default; it drains with the pod."""
    web, values = front_end(name), values_of(name)
    args = build_parser().parse_args(web["command"][1:])
    assert web["command"][0] == "hymt"
    assert (args.command, args.host, args.port, args.workdir) == (
        "web", "0.0.0.0", values["web"]["port"], Path(RUN)
    )  # fmt: skip
    assert args.client_keys is None and not args.refine_model  # WORKDIR/web_keys.json
    assert web["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "web"}
    assert web["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "web"}
    mounts = {m["name"]: m for m in web["volumeMounts"]}
    assert mounts["web-keys"] == {
        "name": "web-keys", "mountPath": f"{RUN}/web_keys.json", "subPath": "web_keys.json",
        "readOnly": True,
    }  # fmt: skip
    assert mounts["config"] == {
        "name": "config", "mountPath": f"{RUN}/config.properties",
        "subPath": "config.properties", "readOnly": True,
    }  # fmt: skip
    assert mounts["run"]["mountPath"] == RUN
    assert {"name": "run", "mountPath": RUN} in server_container(name)["volumeMounts"]
    volumes = {v["name"]: v for v in pod_spec(name)["volumes"]}
    assert volumes["web-keys"]["secret"]["secretName"] == values["web"]["existingSecret"]
    assert "configMap" in volumes["config"]
    drain = web["lifecycle"]["preStop"]["exec"]["command"]
    assert drain == server_container(name)["lifecycle"]["preStop"]["exec"]["command"]


def test_kserve_runs_the_same_pod_instead_of_the_deployment() -> None:
    kinds = {doc["kind"] for doc in rendered("kserve")}
    assert not kinds & {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    (isvc,) = of_kind("kserve", "InferenceService")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    ours, theirs = front_end("default"), front_end("kserve")
    # the same front end, but for the keys' database that KServe's replicas share
    assert "env" not in ours and [e["name"] for e in theirs.pop("env")] == ["HYMT_DATABASE_URL"]
    assert {**theirs, "name": "web"} == ours
    ours, theirs = server_container("default"), server_container("kserve")
    for key in ("image", "env", "ports", "startupProbe", "readinessProbe", "livenessProbe",
                "lifecycle"):  # fmt: skip
        assert theirs[key] == ours[key], key
    same_mounts = [m for m in ours["volumeMounts"] if m["name"] != "model"]
    assert [m for m in theirs["volumeMounts"] if m["name"] != "model"] == same_mounts


# --- the front end as the chart starts it -----------------------------------------------------


class _DescribeApi(BaseHTTPRequestHandler):
    """TorchServe's describe API for one model, whose workers have ``status``; 400 without
    the management key, as TorchServe's token authorization answers."""

    status = "LOADING"
    key = "management-key"

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            self._answer(400, {"code": 400, "type": "InvalidKeyException"})
        elif self.path == "/models/hunyuan-mt":
            self._answer(200, [{"modelName": "hunyuan-mt", "workers": [{"status": self.status}]}])
        else:
            self._answer(404, {"code": 404})

    def _answer(self, code: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *_: Any) -> None:  # no request lines in the test output
        pass


@contextmanager
def describe_api() -> Iterator[tuple[str, type[_DescribeApi]]]:
    handler = type("Describe", (_DescribeApi,), {})  # its own status per test
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get_status(url: str) -> int:
    try:
        return requests.get(url, timeout=5).status_code
    except requests.ConnectionError:
        return 0


def test_the_front_end_answers_its_probes_as_the_chart_starts_it(tmp_path: Path) -> None:
    """The web container's command, run here (on 127.0.0.1 and a free port, in a work folder
    of its own) with the ConfigMap's config.properties where the chart mounts it, whose
    management address is pointed at a stand-in describe API: liveness answers from the start
    and whatever TorchServe says; readiness only once every worker is READY, and no longer
    once `hymt drain` has marked the folder."""
    web = front_end("default")
    (configmap,) = of_kind("default", "ConfigMap")
    text = configmap["data"]["config.properties"]
    assert "management_address=http://127.0.0.1:8081\n" in text
    run = tmp_path / "run"
    run.mkdir()
    port = free_port()
    command = list(web["command"])
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(port)), ("--workdir", str(run))):
        command[command.index(flag) + 1] = value
    command[0] = str(Path(sys.executable).parent / "hymt")
    base = f"http://127.0.0.1:{port}"
    live = base + web["livenessProbe"]["httpGet"]["path"]
    ready = base + web["readinessProbe"]["httpGet"]["path"]
    with describe_api() as (management, describe):
        (run / "config.properties").write_text(text.replace("http://127.0.0.1:8081", management))
        (run / "key_file.json").write_text(json.dumps({"management": {"key": describe.key}}))
        with open(tmp_path / "web.log", "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while get_status(live) != 200:
                assert process.poll() is None, (tmp_path / "web.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "web.log").read_text()
                time.sleep(0.2)
            assert get_status(ready) == 503  # the workers are loading
            describe.status = "READY"
            assert get_status(ready) == 200
            (run / "draining").touch()  # what `hymt drain` writes first
            assert get_status(ready) == 503
            assert get_status(live) == 200
        finally:
            process.terminate()
            process.wait(timeout=30)
