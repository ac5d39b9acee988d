"""Prometheus in the deployment (workloads_monitoring, k8s/components/monitoring), on both runtimes.

- With monitoring on (the default) every layer holds the Deployment dinops-prometheus, its Service, the claim of its
  TSDB, the ConfigMap of prometheus.yml and alerts.yml (the repository's files, byte for byte) and the headless
  Services its DNS discovery resolves; with it off none of it, and no request for it in the node's budget.
- The retention and the volume are sized from the profile and bad values are refused naming the variable.
- The NetworkPolicies, evaluated: Prometheus reaches the API's http and the trainer's metrics port; nothing reaches
  Prometheus.
- The real binaries: `promtool check config` accepts the exact rendered ConfigMap, and the real /usr/bin/prometheus
  (Debian's 2.42, the image's) starts and gets ready with the exact rendered arguments.
- The Docker runtime: a dinops-prometheus container published on 127.0.0.1 only (in the client's public mode too),
  the training and API containers answering to the headless Services' names, the same plan on a second render.
"""

from __future__ import annotations

import copy
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from k8s.k8s_render import DOCKER_VARIANTS, K8S, SITE_VARIANTS, find, load_workloads_filters, pod_spec, render_site
from k8s.test_network_policy import OWN, allowed

MONITORING = load_workloads_filters("monitoring")
WORKLOADS = load_workloads_filters()
SIZING = load_workloads_filters("sizing")
DOCKER = load_workloads_filters("docker_runtime")
PROMETHEUS_DIR = K8S / "components" / "monitoring" / "prometheus"
PROMETHEUS = {"app.kubernetes.io/name": "dinops-prometheus"}
SERVE = {"app.kubernetes.io/name": "dinops-serve"}
TRAIN = {"app.kubernetes.io/name": "dinops-train"}
CLIENT = {"app.kubernetes.io/name": "dinops-client"}
# Objects of the component, by kind.
OBJECTS = {
    ("Deployment", "dinops-prometheus"),
    ("Service", "dinops-prometheus"),
    ("Service", "dinops-train-metrics"),
    ("Service", "dinops-serve-metrics"),
    ("PersistentVolumeClaim", "dinops-prometheus-data"),
    ("NetworkPolicy", "dinops-prometheus-isolation"),
    ("NetworkPolicy", "dinops-api-from-prometheus"),
}
DEMO = DOCKER_VARIANTS["docker-cpu-demo"]
DOCKER_SETTINGS = {"data_dir": "/var/lib/dinops/volumes", "network": "dinops"}


def _config_map(objects: list[dict]) -> dict:
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"]
    name = next(n for n in names if n.startswith("dinops-prometheus-config-"))
    return find(objects, "ConfigMap", name)


def _container(objects: list[dict]) -> dict:
    return pod_spec(find(objects, "Deployment", "dinops-prometheus"))["containers"][0]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> list[dict]:
    return render_site(tmp_path_factory.mktemp("monitoring"), "demo", DEMO)


@pytest.mark.parametrize("site", sorted(SITE_VARIANTS))
def test_every_site_layer_runs_prometheus_by_default(rendered_sites, site):
    objects = rendered_sites[site]
    present = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert present >= OBJECTS, sorted(OBJECTS - present)
    config = _config_map(objects)
    assert set(config["data"]) == {"prometheus.yml", "alerts.yml"}
    for key, text in config["data"].items():
        assert text == (PROMETHEUS_DIR / key).read_text(), key
    spec = pod_spec(find(objects, "Deployment", "dinops-prometheus"))
    container = spec["containers"][0]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/etc/prometheus"]]["configMap"]["name"] == config["metadata"]["name"]
    assert volumes[mounts["/prometheus"]]["persistentVolumeClaim"]["claimName"] == "dinops-prometheus-data"
    # The pod's lock-down, as every dinops Deployment's.
    assert spec["securityContext"]["runAsUser"] == 10001 and spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    assert container["readinessProbe"]["httpGet"] == {"path": "/-/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/-/healthy", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 9090, "protocol": "TCP"}]
    assert container["image"].rsplit("/", 1)[-1].startswith("dinops-prometheus:")
    # Prometheus has no login: a ClusterIP Service, never a NodePort or a LoadBalancer.
    assert find(objects, "Service", "dinops-prometheus")["spec"]["type"] == "ClusterIP"
    for name, port in (("dinops-train-metrics", 9109), ("dinops-serve-metrics", 8000)):
        service = find(objects, "Service", name)["spec"]
        assert service["clusterIP"] == "None" and service["ports"][0]["port"] == port, name


def test_the_headless_services_select_the_pods_that_serve_the_metrics(demo):
    train = find(demo, "Job", "dinops-train")
    labels = train["spec"]["template"]["metadata"]["labels"]
    selector = find(demo, "Service", "dinops-train-metrics")["spec"]["selector"]
    assert selector.items() <= labels.items()
    # The port the Service names is the train container's, the trainer's default (DINO_TRAIN_METRICS_PORT).
    ports = pod_spec(train)["containers"][0]["ports"]
    assert ports == [{"name": "metrics", "containerPort": 9109, "protocol": "TCP"}]
    serve = find(demo, "Deployment", "dinops-serve")["spec"]["template"]["metadata"]["labels"]
    assert find(demo, "Service", "dinops-serve-metrics")["spec"]["selector"].items() <= serve.items()
    # prometheus.yml resolves exactly these names (and the DCGM exporter's), on the ports the pods declare.
    config = yaml.safe_load(_config_map(demo)["data"]["prometheus.yml"])
    sd = {job["job_name"]: job["dns_sd_configs"][0] for job in config["scrape_configs"]}
    assert sd["dinops-train"] == {"names": ["dinops-train-metrics"], "type": "A", "port": 9109}
    assert sd["dinops-serve"] == {"names": ["dinops-serve-metrics"], "type": "A", "port": 8000}
    assert sd["dcgm-exporter"] == {"names": ["dcgm-exporter"], "type": "A", "port": 9400}


def test_monitoring_off_renders_nothing_of_it_and_budgets_nothing_for_it(tmp_path):
    off = {**DEMO, "monitoring": {"enabled": False}}
    objects = render_site(tmp_path, "off", off)
    names = {o["metadata"]["name"] for o in objects}
    assert not {n for n in names if "prometheus" in n or n.endswith("-metrics")}, sorted(names)
    assert "prometheus" not in SIZING.site_plan(off)["resources"]
    assert SIZING.site_plan(off)["apps"]["prometheus"] is False
    # The train container keeps its metrics port (the trainer serves it either way); nothing scrapes it.
    assert WORKLOADS.site_kustomization(off)["components"] == [f"../{c}" for c in ("components/demo",)]


def test_the_requests_are_the_budgets_and_the_demo_still_fits_two_cpus(demo):
    plan = SIZING.site_plan(DEMO)
    assert plan["resources"]["prometheus"]["requests"] == _container(demo)["resources"]["requests"]
    assert plan["resources"]["prometheus"]["requests"] == {"cpu": "50m", "memory": "192Mi"}
    # The component's own requests are the budget's (a layer without a node keeps the manifest's).
    component = yaml.safe_load((K8S / "components/monitoring/deployment-prometheus.yaml").read_text())
    requests = component["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    cpu, memory = SIZING.HELPERS["prometheus"]["requests"]
    assert requests == {"cpu": f"{cpu}m", "memory": f"{memory}Mi"}
    # One CPU less on the 2-vCPU host than the demo needs with Prometheus: refused, naming it.
    with pytest.raises(SIZING.WorkloadsError, match=r"prometheus 50m/192Mi"):
        SIZING.site_plan({**DEMO, "node": {**DEMO["node"], "host_vcpus": 1}})


@pytest.mark.parametrize(
    ("overlay", "expected"),
    [
        ("cpu", ["components/monitoring"]),
        ("minikube-gpu", ["components/monitoring", "components/dcgm-exporter"]),
        ("k3s-gpu", ["components/monitoring", "components/dcgm-exporter", "components/dcgm-exporter/k3s"]),
        # The Docker runtime runs no DaemonSet.
        ("docker-gpu", ["components/monitoring"]),
    ],
)
def test_gpu_clusters_take_the_dcgm_exporter_beside_prometheus(overlay, expected):
    settings = {"overlay": overlay, "train": True, "shm_size": "1Gi", "k8s_root": "k"}
    assert [c for c in WORKLOADS.site_kustomization(settings)["components"] if "monitoring" in c or "dcgm" in c] == [
        f"k/{c}" for c in expected
    ]
    off = {**settings, "monitoring": {"enabled": False}}
    assert not [c for c in WORKLOADS.site_kustomization(off).get("components", []) if "monitoring" in c or "dcgm" in c]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"demo": True}, ("15d", "1638MB", "2Gi")),
        ({}, ("15d", "8192MB", "10Gi")),
        ({"monitoring": {"retention_time": "30d", "volume_size": "50Gi"}}, ("30d", "40960MB", "50Gi")),
        ({"monitoring": {"retention_time": "1w3d", "retention_size": "4GB", "volume_size": "10Gi"}},
         ("1w3d", "4GB", "10Gi")),
        ({"monitoring": {"retention_size": "8GB", "volume_size": "10Gi"}}, ("15d", "8GB", "10Gi")),
    ],
)  # fmt: skip
def test_retention_and_volume_are_sized_from_the_profile(settings, expected):
    sized = MONITORING.monitoring_settings(settings)
    assert (sized["retention_time"], sized["retention_size"], sized["volume_size"]) == expected
    layer = MONITORING.monitoring_layer({"overlay": "cpu", **settings})
    patches = [json.loads(p["patch"]) for p in layer["patches"]]
    args = patches[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--storage.tsdb.retention.time={expected[0]}" in args
    assert f"--storage.tsdb.retention.size={expected[1]}" in args
    assert patches[1]["spec"]["resources"]["requests"]["storage"] == expected[2]


def test_the_sized_values_reach_the_rendered_objects(tmp_path):
    settings = {**DEMO, "monitoring": {"retention_time": "7d", "volume_size": "4Gi"}}
    objects = render_site(tmp_path, "sized", settings)
    args = _container(objects)["args"]
    assert "--storage.tsdb.retention.time=7d" in args and "--storage.tsdb.retention.size=3276MB" in args
    claim = find(objects, "PersistentVolumeClaim", "dinops-prometheus-data")
    assert claim["spec"]["resources"]["requests"]["storage"] == "4Gi"


@pytest.mark.parametrize(
    ("monitoring", "message"),
    [
        ({"enabled": "yes"}, "workloads_monitoring must be true or false"),
        ({"retention_time": "15 days"}, "workloads_prometheus_retention_time must be a Prometheus duration"),
        ({"retention_time": "2h1d"}, "workloads_prometheus_retention_time must be a Prometheus duration"),
        ({"retention_time": "0d"}, "workloads_prometheus_retention_time must be a Prometheus duration above 0"),
        ({"retention_size": "8G"}, "workloads_prometheus_retention_size must be a size with a unit"),
        ({"retention_size": "8Gi"}, "workloads_prometheus_retention_size must be a size with a unit"),
        ({"retention_size": "9GB", "volume_size": "10Gi"}, r"is more than 80 % of workloads_prometheus_volume_size"),
        ({"volume_size": "ten"}, "workloads_prometheus_volume_size must be a Kubernetes quantity"),
        ({"volume_size": "256Mi"}, "is under 512Mi"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(monitoring, message):
    with pytest.raises(MONITORING.WorkloadsError, match=message):
        WORKLOADS.site_kustomization({"overlay": "cpu", "train": True, "shm_size": "1Gi", "monitoring": monitoring})


# --- NetworkPolicies, evaluated --------------------------------------------------------------------------------------
@pytest.mark.parametrize("site", sorted(SITE_VARIANTS))
def test_prometheus_reaches_the_targets_and_nothing_reaches_prometheus(rendered_sites, site):
    objects = rendered_sites[site]
    assert allowed(objects, PROMETHEUS, (OWN, SERVE), 8000)
    assert allowed(objects, PROMETHEUS, (OWN, TRAIN), 9109)
    assert allowed(objects, PROMETHEUS, (OWN, {"app.kubernetes.io/name": "dinops-dcgm-exporter"}), 9400)
    assert allowed(objects, PROMETHEUS, ({"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"}), 53,
                   "UDP")  # fmt: skip
    # Nothing else: not the API's other ports, not the client, not the outside.
    assert not allowed(objects, PROMETHEUS, (OWN, SERVE), 9000)
    assert not allowed(objects, PROMETHEUS, (OWN, CLIENT), 8080)
    assert not allowed(objects, PROMETHEUS, (None, None), 443)
    # Prometheus has no login: no pod reaches it (port-forward and exec enter its own network namespace).
    for source in (CLIENT, SERVE, TRAIN, {"app.kubernetes.io/name": "anything"}):
        assert not allowed(objects, source, (OWN, PROMETHEUS), 9090), source


# --- The real binaries ---------------------------------------------------------------------------------------------
def _binary(name: str) -> str:
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not Path(path).exists():
        pytest.fail(f"{name} is not installed; Debian's prometheus package (2.42) provides it")
    return path


def _write_config(objects: list[dict], directory: Path) -> Path:
    directory.mkdir()
    for key, text in _config_map(objects)["data"].items():
        (directory / key).write_text(text)
    return directory


def test_promtool_accepts_the_rendered_config_map(demo, tmp_path):
    config = _write_config(demo, tmp_path / "etc")
    result = subprocess.run([_binary("promtool"), "check", "config", str(config / "prometheus.yml")],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rules found" in result.stdout + result.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_prometheus_starts_and_gets_ready_with_the_rendered_arguments(demo, tmp_path):
    """The exact args of the rendered Deployment, with only the container's paths and listen address moved to this
    machine: Prometheus 2.42 accepts the sized retention flags (a size it cannot parse ends it at once)."""
    config = _write_config(demo, tmp_path / "etc")
    data = tmp_path / "data"
    port = _free_port()
    moved = {"--config.file": str(config / "prometheus.yml"), "--storage.tsdb.path": str(data),
             "--web.listen-address": f"127.0.0.1:{port}"}  # fmt: skip
    args = [f"{a.split('=', 1)[0]}={moved[a.split('=', 1)[0]]}" if a.split("=", 1)[0] in moved else a
            for a in _container(demo)["args"]]  # fmt: skip
    assert any(a.startswith("--storage.tsdb.retention.size=") for a in args)
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen([_binary("prometheus"), *args], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "Prometheus did not get ready within 60 s"
                time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status/flags", timeout=5) as response:
            flags = json.load(response)["data"]
        # 1638 MiB, as Prometheus writes a size back (alecthomas/units Base2Bytes).
        assert flags["storage.tsdb.retention.size"] == "1GiB614MiB"
        assert flags["storage.tsdb.retention.time"] == "15d"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5) as response:
            groups = json.load(response)["data"]["groups"]
        assert [g["name"] for g in groups] == ["dinops-training"]
    finally:
        process.terminate()
        process.wait(timeout=30)


# --- The Docker runtime ----------------------------------------------------------------------------------------------
def _plan(objects: list[dict], **settings) -> dict:
    return DOCKER.docker_plan(copy.deepcopy(objects), {**DOCKER_SETTINGS, **settings})


@pytest.mark.parametrize("publish_address", ["127.0.0.1", "0.0.0.0", "203.0.113.9"])
def test_docker_publishes_prometheus_on_loopback_only(demo, publish_address):
    plan = _plan(demo, publish_address=publish_address)
    containers = {c["name"]: c for c in plan["containers"]}
    assert plan["names"][-1] == "dinops-prometheus"
    assert containers["dinops-prometheus"]["published_ports"] == ["127.0.0.1:9090:9090"]
    assert containers["dinops-client"]["published_ports"] == [f"{publish_address}:30000:8080"]
    # Nothing else is published: the API, training and the download stay on the network.
    published = {n for n, c in containers.items() if c.get("published_ports")}
    assert published == {"dinops-prometheus", "dinops-client"}
    moved = _plan(demo, publish_address=publish_address, loopback_ports={9090: 19090})
    assert {c["name"]: c for c in moved["containers"]}["dinops-prometheus"]["published_ports"] == [
        "127.0.0.1:19090:9090"
    ]


def test_docker_containers_answer_to_the_names_prometheus_resolves(demo):
    plan = _plan(demo)
    aliases = {c["name"]: c["networks"][0]["aliases"] for c in plan["containers"]}
    assert aliases["dinops-train"] == ["dinops-train-metrics"]
    assert aliases["dinops-serve"] == ["dinops-serve-metrics"]
    prometheus = {c["name"]: c for c in plan["containers"]}["dinops-prometheus"]
    assert prometheus["command"] == _container(demo)["args"]
    assert prometheus["user"] == "10001:10001" and prometheus["read_only"] is True
    # The two keys of the ConfigMap as files of one directory, mounted read-only at /etc/prometheus.
    config = _config_map(demo)["metadata"]["name"]
    files = {f["path"]: f["content"] for f in plan["files"]}
    for key in ("prometheus.yml", "alerts.yml"):
        assert files[f"/var/lib/dinops/volumes/.config/{config}/{key}"] == (PROMETHEUS_DIR / key).read_text()
    mounts = {m["target"]: m for m in prometheus["mounts"]}
    assert mounts["/etc/prometheus"] == {"type": "bind", "source": f"/var/lib/dinops/volumes/.config/{config}",
                                         "target": "/etc/prometheus", "read_only": True}  # fmt: skip
    assert mounts["/prometheus"]["source"] == "/var/lib/dinops/volumes/dinops-prometheus-data"
    assert {"path": "/var/lib/dinops/volumes/dinops-prometheus-data", "owner": 10001, "group": 10001,
            "mode": "02775"} in plan["directories"]  # fmt: skip
    # Its health check asks both probes' endpoints on the container's own port.
    code = prometheus["healthcheck"]["test"][-1]
    assert "http://127.0.0.1:9090/-/ready" in code and "http://127.0.0.1:9090/-/healthy" in code


def test_a_second_render_gives_the_same_containers(tmp_path, demo):
    again = render_site(tmp_path, "again", DEMO)
    assert _plan(again, publish_address="0.0.0.0") == _plan(demo, publish_address="0.0.0.0")


@pytest.mark.parametrize(
    ("annotation", "service_changes", "message"),
    [
        ("http", {}, "must be a port number"),
        ("9090", {"type": "NodePort"}, "is for a ClusterIP Service"),
        ("9090", {"clusterIP": "None"}, "is for a ClusterIP Service"),
        ("9090", {"ports": [{"name": "http", "port": 9090, "targetPort": "http"},
                            {"name": "b", "port": 9091, "targetPort": "http"}]}, "publishes one port"),
    ],
)  # fmt: skip
def test_a_loopback_port_docker_cannot_publish_is_refused(demo, annotation, service_changes, message):
    objects = copy.deepcopy(demo)
    service = find(objects, "Service", "dinops-prometheus")
    service["metadata"]["annotations"]["dinops.io/docker-loopback-port"] = annotation
    service["spec"].update(service_changes)
    with pytest.raises(DOCKER.DockerRuntimeError, match=message):
        _plan(objects)


# --- The API served by KServe (workloads_inference_service) -------------------------------------------------------
def _predictor_pod_labels(objects: list[dict]) -> dict:
    """The labels KServe gives the predictor's pod: the InferenceService's, the predictor's over them, then its own
    (kserve@v0.20.0:pkg/controller/v1beta1/inferenceservice/components/predictor.go buildObjectMeta;
    pkg/constants/constants.go InferenceServicePodLabelKey, KServiceComponentLabel)."""
    isvc = find(objects, "InferenceService", "dinops")
    return {**isvc["metadata"]["labels"], **isvc["spec"]["predictor"]["labels"],
            "serving.kserve.io/inferenceservice": "dinops", "component": "predictor"}  # fmt: skip


def _selects(objects: list[dict], service: str, labels: dict) -> bool:
    return find(objects, "Service", service)["spec"]["selector"].items() <= labels.items()


@pytest.fixture(scope="module")
def kserve(tmp_path_factory) -> list[dict]:
    """A GPU inference host's layer with workloads_inference_service, folded as the role does."""
    from k8s.test_inference_service import plugin, render_with_component

    objects = render_with_component(tmp_path_factory.mktemp("kserve-monitoring"), "kserve",
                                    SITE_VARIANTS["rtx3060ti-inference"])  # fmt: skip
    return plugin.inference_service(objects, True)


def test_prometheus_finds_the_api_on_its_port_in_either_form(demo, kserve):
    config = yaml.safe_load(_config_map(demo)["data"]["prometheus.yml"])
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "dinops-serve"]
    ports = {sd["names"][0]: sd["port"] for sd in job["dns_sd_configs"]}
    assert ports == {"dinops-serve-metrics": 8000, "dinops-predictor-metrics": 8080}
    assert all(sd["type"] == "A" and len(sd["names"]) == 1 for sd in job["dns_sd_configs"])
    # The same file in both forms: one ConfigMap, whatever serves.
    assert _config_map(kserve)["data"] == _config_map(demo)["data"]
    # The Deployment: its pod in dinops-serve-metrics, on the port its container declares; no predictor name.
    deployment = find(demo, "Deployment", "dinops-serve")
    assert _selects(demo, "dinops-serve-metrics", deployment["spec"]["template"]["metadata"]["labels"])
    assert pod_spec(deployment)["containers"][0]["ports"] == [{"name": "http", "containerPort": 8000,
                                                               "protocol": "TCP"}]  # fmt: skip
    assert not [o for o in demo if o["metadata"]["name"] == "dinops-predictor-metrics"]
    # KServe: its pod (which carries app.kubernetes.io/name: dinops-serve too) only in dinops-predictor-metrics,
    # whose port is the one kserve-container declares; dinops-serve-metrics selects nothing.
    labels = _predictor_pod_labels(kserve)
    assert labels["app.kubernetes.io/name"] == "dinops-serve"
    assert _selects(kserve, "dinops-predictor-metrics", labels)
    assert not _selects(kserve, "dinops-serve-metrics", labels)
    assert not any(o["kind"] in ("Deployment", "Job", "Pod") and _selects(kserve, "dinops-serve-metrics", o["spec"].get(
        "template", {}).get("metadata", {}).get("labels", {})) for o in kserve)  # fmt: skip
    (port,) = find(kserve, "InferenceService", "dinops")["spec"]["predictor"]["containers"][0]["ports"]
    service = find(kserve, "Service", "dinops-predictor-metrics")["spec"]
    assert service["clusterIP"] == "None"
    assert service["ports"] == [{"name": "http", "port": 8080, "targetPort": port["name"], "protocol": "TCP"}]
    assert port["containerPort"] == 8080


def test_prometheus_reaches_the_predictor_on_its_port(kserve, monkeypatch):
    import k8s.test_network_policy as policies

    # The predictor's port named http is 8080 (the evaluator reads named ports by app.kubernetes.io/name).
    monkeypatch.setitem(policies.PORTS, "dinops-serve", {"http": 8080})
    predictor = _predictor_pod_labels(kserve)
    assert allowed(kserve, PROMETHEUS, (OWN, predictor), 8080)
    assert not allowed(kserve, PROMETHEUS, (OWN, predictor), 8000)
    assert not allowed(kserve, PROMETHEUS, (OWN, CLIENT), 8080)
    for source in (CLIENT, predictor, TRAIN):
        assert not allowed(kserve, source, (OWN, PROMETHEUS), 9090), source


def test_docker_gets_no_predictor_name_and_keeps_its_aliases(demo):
    plan = _plan(demo)
    aliases = {alias for c in plan["containers"] for alias in c["networks"][0]["aliases"]}
    assert "dinops-serve-metrics" in aliases and "dinops-predictor-metrics" not in aliases
