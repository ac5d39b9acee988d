"""Policy over the rendered objects: what issue 9 and STYLE.md ask of every manifest, checked on every overlay."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from k8s.k8s_render import (
    GPU,
    GPU_OVERLAYS,
    OVERLAYS,
    container_env,
    find,
    load_workloads_filters,
    pod_spec,
    workloads,
)

from dinops.settings import env_names

NAMESPACE = "dinops"
# Image -> the module whose SETTINGS table the container's environment must come from.
APP_SETTINGS = {
    "dinops-download": "dinops.download.settings",
    "dinops-train": "dinops.train.settings",
    "dinops-serve": "dinops.serve.settings",
    "dinops-client": "dinops.client.settings",
}
filters = load_workloads_filters()
quantities = load_workloads_filters("quantities")
GPU_WORKLOADS = {("Job", "dinops-train"), ("Deployment", "dinops-serve")}


def containers(obj):
    spec = pod_spec(obj)
    return spec.get("initContainers", []) + spec["containers"]


def image_name(image: str) -> str:
    return image.rsplit("/", 1)[-1].split(":", 1)[0]


@pytest.fixture(params=OVERLAYS)
def objects(request, rendered):
    return rendered[request.param]


def test_every_namespaced_object_lives_in_the_dinops_namespace(objects):
    for obj in objects:
        if obj["kind"] in ("Namespace", "PersistentVolume"):
            continue
        assert obj["metadata"].get("namespace") == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"
    labels = find(objects, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_labels_identity_in_selectors_and_part_of_everywhere(objects):
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "dinops", obj["metadata"]["name"]
    for obj in workloads(objects):
        template_labels = obj["spec"]["template"]["metadata"]["labels"]
        assert template_labels["app.kubernetes.io/part-of"] == "dinops"
        assert template_labels["app.kubernetes.io/name"] == obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            # Selectors are immutable: only the stable identity key, never version or part-of.
            assert obj["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": obj["metadata"]["name"]}


def test_every_container_has_requests_limits_and_a_locked_down_security_context(objects):
    for obj in workloads(objects):
        pod_security = pod_spec(obj)["securityContext"]
        assert pod_security["runAsNonRoot"] is True
        assert pod_security["runAsUser"] > 0
        assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in containers(obj):
            where = f"{obj['metadata']['name']}/{container['name']}"
            resources = container["resources"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources[kind]), f"{where} {kind}"
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["capabilities"] == {"drop": ["ALL"]}, where
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert "/tmp" in mounts, f"{where} needs a writable /tmp with a read-only root"


def test_every_empty_dir_has_a_size_limit_and_shm_is_memory(objects):
    for obj in workloads(objects):
        for volume in pod_spec(obj).get("volumes", []):
            if "emptyDir" in volume:
                assert volume["emptyDir"].get("sizeLimit"), f"{obj['metadata']['name']}/{volume['name']}"
    train = find(objects, "Job", "dinops-train")
    shm = next(v for v in pod_spec(train)["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    mount = next(m for m in train["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] if m["name"] == "shm")
    assert mount["mountPath"] == "/dev/shm"


def test_images_are_tagged_and_never_pulled_when_present(objects):
    for obj in workloads(objects):
        for container in containers(obj):
            name, _, tag = container["image"].rpartition(":")
            assert name and tag and tag != "latest", container["image"]
            assert image_name(container["image"]) in APP_SETTINGS
            # Images are loaded into the node without a registry: a pull would fail.
            assert container["imagePullPolicy"] == "IfNotPresent"


def test_deployments_serve_http_with_probes_on_the_health_endpoints(objects):
    for obj in (o for o in objects if o["kind"] == "Deployment"):
        container = pod_spec(obj)["containers"][0]
        assert [p["name"] for p in container["ports"]] == ["http"]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    client = pod_spec(find(objects, "Deployment", "dinops-client"))["containers"][0]
    assert client["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    serve = pod_spec(find(objects, "Deployment", "dinops-serve"))["containers"][0]
    # Serve waits for its checkpoint (DINO_WAIT_FOR_MODEL) and must stay in the Service meanwhile, so that the
    # client can show "waiting": ready on /healthz, which answers 200 with the model's state; /readyz says 503.
    assert container_env(objects, serve)["DINO_WAIT_FOR_MODEL"] == "true"
    assert serve["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    startup = serve["startupProbe"]
    assert startup["httpGet"] == {"path": "/healthz", "port": "http"}
    # The model may take minutes to load on CPU: the start-up budget must cover it before liveness counts.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_services_select_exactly_one_workload_and_name_its_port(objects):
    for service in (o for o in objects if o["kind"] == "Service"):
        selector = service["spec"]["selector"]
        targets = [
            obj
            for obj in workloads(objects)
            if selector.items() <= obj["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert [t["kind"] for t in targets] == ["Deployment"], service["metadata"]["name"]
        port_names = {p["name"] for p in pod_spec(targets[0])["containers"][0]["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names
    client = find(objects, "Service", "dinops-client")
    assert client["spec"]["type"] == "NodePort"
    assert [p["nodePort"] for p in client["spec"]["ports"]] == [30000]


def test_every_claimed_volume_and_config_map_is_defined(objects):
    claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    config_maps = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    for obj in workloads(objects):
        for volume in pod_spec(obj).get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
        for container in containers(obj):
            for source in container.get("envFrom", []):
                # Generated names carry the content hash, so a config change rolls the pods.
                name = source["configMapRef"]["name"]
                assert name in config_maps
                assert re.fullmatch(r"dinops-[a-z]+-config-[a-z0-9]{10}", name), name


def test_gpu_limits_tolerations_and_runtime_class_only_where_they_belong(rendered):
    for overlay, objects in rendered.items():
        for obj in workloads(objects):
            key = (obj["kind"], obj["metadata"]["name"])
            spec = pod_spec(obj)
            limits = spec["containers"][0]["resources"]["limits"]
            wants_gpu = overlay in GPU_OVERLAYS and key in GPU_WORKLOADS
            assert limits.get(GPU) == (1 if wants_gpu else None), f"{overlay} {key}"
            tolerations = spec.get("tolerations", [])
            assert (tolerations == [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]) == wants_gpu
            wants_runtime_class = overlay == "k3s-gpu" and key in GPU_WORKLOADS
            assert spec.get("runtimeClassName") == ("nvidia" if wants_runtime_class else None), f"{overlay} {key}"


@pytest.mark.parametrize(("overlay", "device"), [("cpu", "cpu"), ("minikube-gpu", "cuda"), ("k3s-gpu", "cuda")])
def test_device_follows_the_overlay(rendered, overlay, device):
    for name in ("dinops-train", "dinops-serve"):
        obj = next(o for o in workloads(rendered[overlay]) if o["metadata"]["name"] == name)
        assert container_env(rendered[overlay], pod_spec(obj)["containers"][0])["DINO_DEVICE"] == device


# Read by the process itself, not the app: glibc's malloc arena count (glibc manual, "Memory Allocation Tunables":
# MALLOC_ARENA_MAX sets glibc.malloc.arena_max), for serve's decode threads (docs/api.md).
PROCESS_ENV = {"dinops-serve": {"MALLOC_ARENA_MAX"}}


@pytest.mark.parametrize("image", sorted(APP_SETTINGS))
def test_every_env_name_is_one_the_app_declares(rendered, image):
    """A name the app does not read would be silently ignored (the original's checkpoint variable was)."""
    known = env_names(importlib.import_module(APP_SETTINGS[image]).SETTINGS) | PROCESS_ENV.get(image, set())
    for overlay, objects in rendered.items():
        for obj in workloads(objects):
            for container in containers(obj):
                if image_name(container["image"]) == image:
                    unknown = set(container_env(objects, container)) - known
                    where = f"{overlay} {obj['metadata']['name']}"
                    assert not unknown, f"{where}: {sorted(unknown)} are not in {image}'s settings"


@pytest.mark.parametrize("image", ["dinops-download", "dinops-client", "dinops-serve"])
def test_every_flag_in_args_is_one_the_app_declares(rendered, rendered_sites, image):
    """Images whose entrypoint is the app: their args are the app's own flags."""
    flags = {s.flag_name for s in importlib.import_module(APP_SETTINGS[image]).SETTINGS}
    seen = 0
    for objects in [*rendered.values(), *rendered_sites.values()]:
        for obj in workloads(objects):
            for container in containers(obj):
                if image_name(container["image"]) == image:
                    for arg in container.get("args", []):
                        assert arg.split("=", 1)[0] in flags, f"{obj['metadata']['name']}: {arg}"
                        seen += 1
    assert seen > 0 or image != "dinops-download"


def test_training_runs_the_train_command(objects):
    """The train image's entrypoint is only tini: the command comes from args."""
    container = pod_spec(find(objects, "Job", "dinops-train"))["containers"][0]
    assert container["args"] == ["dinops", "train"]


def _setting_env(module: str, dest: str) -> str:
    return next(s.env for s in importlib.import_module(module).SETTINGS if s.dest == dest)


def test_training_resumes_from_the_output_volume_and_has_time_to_checkpoint(objects):
    train = find(objects, "Job", "dinops-train")
    spec = pod_spec(train)
    container = spec["containers"][0]
    env = container_env(objects, container)
    assert env[_setting_env("dinops.train.settings", "resume")] == "auto"
    output_dir = env[_setting_env("dinops.train.settings", "output_dir")]
    output_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == output_dir)
    volume = next(v for v in spec["volumes"] if v["name"] == output_mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == "dinops-output"
    assert not output_mount.get("readOnly", False)
    assert spec["restartPolicy"] == "Never" and train["spec"]["backoffLimit"] >= 3
    assert spec["terminationGracePeriodSeconds"] >= 120


@pytest.mark.parametrize("job", ["dinops-train", "dinops-download"])
def test_jobs_retry_disruptions_and_fail_fast_on_bad_settings(objects, job):
    """Evictions do not use up retries; exit status 2 (bad settings) ends the Job; other failures are retried."""
    manifest = find(objects, "Job", job)
    rules = manifest["spec"]["podFailurePolicy"]["rules"]
    container = pod_spec(manifest)["containers"][0]["name"]
    ignore = [r for r in rules if r["action"] == "Ignore"]
    assert any(c["type"] == "DisruptionTarget" for r in ignore for c in r.get("onPodConditions", []))
    fail = [r["onExitCodes"] for r in rules if r["action"] == "FailJob"]
    assert fail == [{"containerName": container, "operator": "In", "values": [2]}]
    # 1 (a failed file) and 143 (training stopped after a checkpoint) must stay retryable.
    assert all({1, 143}.isdisjoint(r.get("onExitCodes", {}).get("values", [])) for r in rules)


def test_bad_settings_exit_2_in_the_jobs_commands(monkeypatch):
    """The status that the Jobs' FailJob rule matches is what the apps return for a bad setting."""
    from dinops.download.cli import main as download
    from dinops.train.main import main as train

    monkeypatch.delenv("DINO_EPOCHS", raising=False)
    assert train(["--epochs", "0"]) == 2
    monkeypatch.setenv("DOWNLOAD_NO_SUCH_SETTING", "1")  # an unknown setting is an error
    assert download(["--dest", "/nonexistent"]) == 2


def test_inference_reads_its_checkpoint_from_the_output_volume(objects):
    serve = find(objects, "Deployment", "dinops-serve")
    container = pod_spec(serve)["containers"][0]
    checkpoint = container_env(objects, container)[_setting_env("dinops.serve.settings", "checkpoint")]
    mount = next(m for m in container["volumeMounts"] if checkpoint.startswith(m["mountPath"].rstrip("/") + "/"))
    assert mount["readOnly"] is True
    volume = next(v for v in pod_spec(serve)["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == "dinops-output"
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    bind = container_env(objects, container)[_setting_env("dinops.serve.settings", "bind")]
    assert bind == f"0.0.0.0:{port}"


def test_client_calls_the_inference_service_on_its_port(objects):
    client = find(objects, "Deployment", "dinops-client")
    env = container_env(objects, pod_spec(client)["containers"][0])
    service = find(objects, "Service", "dinops-serve")
    assert env["DINO_API_URL"] == f"http://dinops-serve:{service['spec']['ports'][0]['port']}"


def test_training_waits_for_the_completed_dataset(objects):
    """Training starts only after the download wrote its completion marker (`dinops data-ready`, finding 1); the
    FailJob rule stays on the train container, so a slow download never fails the Job."""
    spec = pod_spec(find(objects, "Job", "dinops-train"))
    train = spec["containers"][0]
    [wait] = spec["initContainers"]
    assert wait["name"] == "wait-for-dataset"
    assert wait["args"] == ["dinops", "data-ready", "--wait=0"]
    assert wait["image"] == train["image"] and wait["envFrom"] == train["envFrom"]
    assert wait["securityContext"] == train["securityContext"]
    data = next(m for m in wait["volumeMounts"] if m["mountPath"] == "/data")
    assert data["readOnly"] is True and data["name"] == "dataset"
    env = container_env(objects, wait)
    from dinops.download import marker

    assert str(marker.path(Path(env["DINO_DATA_ROOT"]))) == "/data/coco/.dinops-complete.json"
    for kind in ("requests", "limits"):
        assert quantities.cpu_m(wait["resources"][kind]["cpu"]) <= quantities.cpu_m(train["resources"][kind]["cpu"])
