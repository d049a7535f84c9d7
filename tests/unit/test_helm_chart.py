"""The Helm chart (deploy/helm/hunyuan-mt): `helm lint`, `helm template` with the default values
and each CI values file, every manifest validated (built-in kinds against the Kubernetes 1.34
schemas of kubernetes-validate, the KServe InferenceService against deploy/schemas/), and what
the manifests must do: probes and preStop run our commands, GPUs equal workers, only inference
is open to all, no key material, and config.properties exactly as `hymt start` renders it."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
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
}


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


def server_container(name: str) -> dict[str, Any]:
    containers = pod_spec(name)["containers"]
    assert [c["name"] for c in containers][1:] in ([], ["web"]), containers
    return dict(containers[0])


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
    ("setting", "says"),
    [
        ("model.source=s3", "model.source must be pvc or init"),
        ("torchserve.config.allowed_urls=file://{model_store}/x", "{model_store}"),
        ("torchserve.config.metrics_config=configs/metrics.yaml", "must be an absolute path"),
    ],
)
def test_bad_values_are_refused(setting: str, says: str) -> None:
    done = run_helm("template", "hymt", str(CHART), "--set", setting)
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


@pytest.mark.parametrize(("name", "gpus"), [("default", 1), ("init-hpa", 2), ("kserve", 1)])
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
    overrides = values_of(name)["torchserve"]["config"]
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
    text = json.dumps(rendered(name))
    assert "Secret" not in [doc["kind"] for doc in rendered(name)]
    for leak in ("key_file.json", "Bearer", '"key":', "disable_token_authorization=true"):
        assert leak not in text, leak
    references = [ref for spec in pod_spec(name).get("initContainers", [])
                  for ref in spec.get("envFrom", [])]  # fmt: skip
    secret = values_of(name)["model"]["init"]["existingSecret"]
    assert references == ([{"secretRef": {"name": secret}}] if secret else [])
    secrets = [v["secret"]["secretName"] for v in pod_spec(name)["volumes"] if "secret" in v]
    web = values_of(name)["web"]
    assert secrets == ([web["existingSecret"]] if web["enabled"] and name != "kserve" else [])


def test_network_policy_opens_only_inference_to_everyone() -> None:
    (policy,) = of_kind("default", "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    open_to_all = [rule for rule in policy["spec"]["ingress"] if "from" not in rule]
    assert [p["port"] for rule in open_to_all for p in rule["ports"]] == [8080]
    for rule in policy["spec"]["ingress"]:
        if "from" in rule:
            assert rule["from"] == [{"podSelector": {}}]  # this namespace only
            assert {p["port"] for p in rule["ports"]} == {8081, 8082}
    (service,) = of_kind("default", "Service")
    assert [p["port"] for p in service["spec"]["ports"]] == [8080]


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


def test_kserve_runs_the_same_container_instead_of_the_deployment() -> None:
    kinds = {doc["kind"] for doc in rendered("kserve")}
    assert not kinds & {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    (isvc,) = of_kind("kserve", "InferenceService")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    ours, theirs = server_container("default"), server_container("kserve")
    assert theirs["name"] == "kserve-container"
    assert [p["containerPort"] for p in theirs["ports"]] == [8080]
    for key in ("image", "env", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle"):
        assert theirs[key] == ours[key], key
    same_mounts = [m for m in ours["volumeMounts"] if m["name"] != "model"]
    assert [m for m in theirs["volumeMounts"] if m["name"] != "model"] == same_mounts


def test_the_web_front_end_serves_shared_client_keys_from_a_secret() -> None:
    """web.enabled: `hymt web` beside TorchServe on its own port, open to all like 8080, its
    client keys mounted from the Secret where it reads them, draining with the pod."""
    assert [c["name"] for c in pod_spec("default")["containers"]] == ["torchserve"]
    (web,) = [c for c in pod_spec("init-hpa")["containers"] if c["name"] == "web"]
    args = build_parser().parse_args(web["command"][1:])
    assert (args.command, args.host, args.port, args.workdir) == ("web", "0.0.0.0", 8090, Path(RUN))
    assert args.client_keys is None  # the default: WORKDIR/web_keys.json, the Secret's file
    mounts = {m["name"]: m for m in web["volumeMounts"]}
    assert mounts["web-keys"] == {
        "name": "web-keys", "mountPath": f"{RUN}/web_keys.json", "subPath": "web_keys.json",
        "readOnly": True,
    }  # fmt: skip
    assert mounts["run"]["mountPath"] == RUN  # TorchServe's key and the usage file
    assert web["lifecycle"]["preStop"]["exec"]["command"][:2] == ["hymt", "drain"]
    (service,) = of_kind("init-hpa", "Service")
    assert [p["port"] for p in service["spec"]["ports"]] == [8080, 8090]
    (policy,) = of_kind("init-hpa", "NetworkPolicy")
    open_to_all = [rule for rule in policy["spec"]["ingress"] if "from" not in rule]
    assert [p["port"] for rule in open_to_all for p in rule["ports"]] == [8080, 8090]
    missing = run_helm(
        "template", "hymt", str(CHART), "--set", "web.enabled=true", "--set",
        "model.pvc.existingClaim=m",
    )  # fmt: skip
    assert missing.returncode != 0 and "web.existingSecret is required" in missing.stderr
