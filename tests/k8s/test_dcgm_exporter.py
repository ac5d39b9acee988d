"""NVIDIA's DCGM exporter (k8s/components/dcgm-exporter), rendered with `kubectl kustomize` on the GPU overlays as the
generated site layer would include it: the pinned image, no GPU taken from training, the port and Service that the
Prometheus job dcgm-exporter scrapes, Pod Security "restricted", and a NetworkPolicy that admits Prometheus only.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml
from k8s.k8s_render import GPU, K8S, find, kustomize, pod_spec

from dinops_testing import load_plugin

# The one pinned reference. NVIDIA/dcgm-exporter@4.5.3-4.8.2 (tag of 2026-05-06, commit 691c92762eb5): the image that
# dcgm-exporter.yaml, deployment/values.yaml (image.repository + image.tag) and README.md's quick start name. A bump
# changes this string, the DaemonSet and the component's comment (which air-gapped mirrors copy from) together.
PINNED_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless"

# The counters the image collects by default: the uncommented rows of etc/default-counters.csv at that tag (the
# exporter's -f default, /etc/dcgm-exporter/default-counters.csv, pkg/cmd/app.go), the one "label" row
# (DCGM_FI_DRIVER_VERSION) left out since it becomes a label, not a series.
DEFAULT_COUNTERS = frozenset(
    {
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    }
)
# Profiling (DCP) counters need CAP_SYS_ADMIN, which the pod does not get ("Profiling metrics require: root +
# --cap-add SYS_ADMIN", docker/Dockerfile at the tag; internal/pkg/capabilities warns when they are asked without it).
COLLECTED_COUNTERS = frozenset(c for c in DEFAULT_COUNTERS if not c.startswith("DCGM_FI_PROF_"))

COMPONENT = K8S / "components" / "dcgm-exporter"
PROMETHEUS_YML = K8S / "components" / "monitoring" / "prometheus" / "prometheus.yml"
ALERTS_YML = K8S / "components" / "monitoring" / "prometheus" / "alerts.yml"
NAMESPACE = "dinops"
NAME = "dinops-dcgm-exporter"
PROMETHEUS_POD = {"app.kubernetes.io/name": "dinops-prometheus"}
KUBERNETES_VERSIONS = ("1.28", "1.29", "1.30", "1.31", "1.32", "1.33")
# Each GPU overlay with the components its layer lists (k3s: the exporter, then its k3s placement).
LAYERS = {
    "minikube-gpu": ["components/dcgm-exporter"],
    "k3s-gpu": ["components/dcgm-exporter", "components/dcgm-exporter/k3s"],
}
K3S_NODES = load_plugin("roles/k3s/filter_plugins/k3s_nodes.py")


def render_layer(tmp_root, overlay: str, components: list[str]) -> list[dict]:
    """A copy of k8s/ with a top layer as roles/workloads writes one: the overlay, the namespace, the components."""
    tree = tmp_root / overlay / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "site").mkdir()
    layer = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"../overlays/{overlay}"],
        "namespace": NAMESPACE,
        "components": [f"../{c}" for c in components],
    }
    (tree / "site" / "kustomization.yaml").write_text(yaml.safe_dump(layer, sort_keys=False))
    return kustomize(tree / "site")


@pytest.fixture(scope="module")
def layers(tmp_path_factory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("dcgm")
    return {overlay: render_layer(root, overlay, components) for overlay, components in LAYERS.items()}


@pytest.fixture(params=sorted(LAYERS))
def objects(request, layers) -> list[dict]:
    return layers[request.param]


def exporter(objects: list[dict]) -> dict:
    return find(objects, "DaemonSet", NAME)


def dcgm_job() -> tuple[str, str | None, int]:
    """(Service name, namespace or None, port) that prometheus.yml's job dcgm-exporter resolves."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == "dcgm-exporter"]
    assert len(jobs) == 1, "prometheus.yml must have exactly one job dcgm-exporter"
    (sd,) = jobs[0]["dns_sd_configs"]
    assert sd.get("type", "SRV") == "A", "an A lookup of a headless Service lists the exporter pods"
    (dns_name,) = sd["names"]
    # Either the short name (resolved through the pod's search list) or <service>.<namespace>.svc.cluster.local.
    parts = dns_name.split(".")
    assert len(parts) == 1 or parts[2:] == ["svc", "cluster", "local"], dns_name
    return parts[0], (parts[1] if len(parts) > 1 else None), int(sd["port"])


def test_the_daemonset_runs_the_pinned_image_and_serves_metrics_on_9400(objects):
    daemonset = exporter(objects)
    assert daemonset["metadata"]["namespace"] == NAMESPACE
    assert daemonset["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": NAME}
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == NAME and labels["app.kubernetes.io/part-of"] == "dinops"
    spec = pod_spec(daemonset)
    assert [c["name"] for c in spec["containers"]] == ["dcgm-exporter"] and not spec.get("initContainers")
    (container,) = spec["containers"]
    assert container["image"] == PINNED_IMAGE
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["DCGM_EXPORTER_LISTEN"] == ":9400"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "metrics"}


def test_the_exporter_takes_no_gpu_and_sees_every_gpu_through_the_runtime(objects):
    spec = pod_spec(exporter(objects))
    (container,) = spec["containers"]
    resources = container["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} == set(resources[kind]), f"{kind}: cpu and memory only, never {GPU}"
    assert all(GPU not in (c.get("resources") or {}).get(k, {}) for c in spec["containers"] for k in resources)
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_the_exporter_passes_pod_security_restricted(objects):
    """What the namespace enforces (k8s/base/namespace.yaml), per the restricted profile of
    https://kubernetes.io/docs/concepts/security/pod-security-standards/: upstream's root + SYS_ADMIN + hostPath would
    be refused."""
    assert find(objects, "Namespace", NAMESPACE)["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
        "restricted"
    )
    spec = pod_spec(exporter(objects))
    pod_security = spec["securityContext"]
    assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] > 0
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key), key
    assert all(set(volume) == {"name", "emptyDir"} for volume in spec["volumes"]), "no hostPath or other volume"
    assert all(volume["emptyDir"].get("sizeLimit") for volume in spec["volumes"])
    for container in spec["containers"]:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and not security.get("privileged")
        assert security["capabilities"] == {"drop": ["ALL"]}, "no capability: no SYS_ADMIN"
        assert security["readOnlyRootFilesystem"] is True
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
        assert all("hostPort" not in port for port in container["ports"])


def test_placement_follows_the_cluster(layers):
    """minikube: its one node is the GPU node and runs the NVIDIA runtime by default, as the training pods there
    rely on. k3s: only nodes labelled as GPU nodes, with the RuntimeClass the overlay gives training."""
    minikube = pod_spec(exporter(layers["minikube-gpu"]))
    assert "nodeSelector" not in minikube and "runtimeClassName" not in minikube
    k3s = pod_spec(exporter(layers["k3s-gpu"]))
    assert k3s["nodeSelector"] == {K3S_NODES.LABEL_GPU: "true"}
    overlay_patch = yaml.safe_load((K8S / "overlays" / "k3s-gpu" / "runtime-class.yaml").read_text())
    (runtime_class,) = [op["value"] for op in overlay_patch if op["path"] == "/spec/template/spec/runtimeClassName"]
    assert k3s["runtimeClassName"] == runtime_class
    # The training pods of the same layer keep what the overlay gives them.
    assert pod_spec(find(layers["k3s-gpu"], "Job", "dinops-train"))["runtimeClassName"] == runtime_class


def test_the_headless_service_is_what_prometheus_scrapes(objects):
    name, namespace, port = dcgm_job()
    service = find(objects, "Service", name)
    assert namespace in (None, service["metadata"]["namespace"])
    assert service["spec"]["clusterIP"] == "None", "headless: one A record per exporter pod"
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    daemonset = exporter(objects)
    template_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert selector.items() <= template_labels.items()
    # It selects the exporter's pods and nobody else's.
    others = [o for o in objects if o["kind"] in ("Deployment", "Job", "DaemonSet") and o is not daemonset]
    assert not [o["metadata"]["name"] for o in others if selector.items() <= pod_labels(o).items()]
    ports = {p["name"]: p["containerPort"] for p in pod_spec(daemonset)["containers"][0]["ports"]}
    assert [ports[p["targetPort"]] for p in service["spec"]["ports"]] == [port]


def pod_labels(obj: dict) -> dict:
    return obj["spec"]["template"]["metadata"].get("labels") or {}


def test_only_prometheus_reaches_the_exporter_and_the_exporter_reaches_nothing(objects):
    daemonset = exporter(objects)
    policies = [
        o for o in objects if o["kind"] == "NetworkPolicy" and pod_labels(daemonset).items() >= policy_match(o).items()
    ]
    assert [p["metadata"]["name"] for p in policies] == ["dinops-dcgm-exporter-isolation"]
    (policy,) = policies
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": NAME}}
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert not policy["spec"].get("egress"), "Egress listed with no rule: nothing leaves the exporter"
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": PROMETHEUS_POD}}], "this namespace's Prometheus only"
    ports = {p["name"]: p["containerPort"] for p in pod_spec(daemonset)["containers"][0]["ports"]}
    assert [(ports.get(p["port"], p["port"]), p["protocol"]) for p in rule["ports"]] == [(dcgm_job()[2], "TCP")]


def policy_match(policy: dict) -> dict:
    selector = policy["spec"]["podSelector"]
    assert not selector.get("matchExpressions"), "this test reads matchLabels only"
    return selector.get("matchLabels") or {}


def test_prometheus_carries_the_label_the_policy_admits_and_may_reach_the_exporter(layers):
    """The contract with k8s/components/monitoring: its Deployment's pods are labelled dinops-prometheus, and where a
    NetworkPolicy limits their egress, it lets them reach the exporter's pods on 9400."""
    monitoring = K8S / "components" / "monitoring"
    documents = [d for path in sorted(monitoring.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    deployments = [
        d for d in documents if d.get("kind") == "Deployment" and d["metadata"]["name"] == "dinops-prometheus"
    ]
    if not deployments:
        pytest.skip("k8s/components/monitoring has no Deployment dinops-prometheus yet")
    assert PROMETHEUS_POD.items() <= pod_labels(deployments[0]).items()
    exporter_pods = pod_labels(exporter(layers["minikube-gpu"]))
    port = dcgm_job()[2]
    for policy in (d for d in documents if d.get("kind") == "NetworkPolicy"):
        if not PROMETHEUS_POD.items() <= policy_match(policy).items() or "Egress" not in policy["spec"]["policyTypes"]:
            continue
        reaches = [rule for rule in policy["spec"].get("egress") or [] if egress_reaches(rule, exporter_pods, port)]
        assert reaches, f"{policy['metadata']['name']} does not let Prometheus reach the exporter on {port}"


def egress_reaches(rule: dict, pod: dict, port: int) -> bool:
    """Does an egress rule let a pod of this namespace reach one labelled ``pod`` on ``port`` (or its name metrics)?"""
    peers = [peer for peer in rule.get("to") or [] if "podSelector" in peer and "namespaceSelector" not in peer]
    to_pod = any(pod.items() >= (peer["podSelector"].get("matchLabels") or {}).items() for peer in peers)
    ports = rule.get("ports") or []
    on_port = not ports or any(p.get("port") in (port, "metrics") and p.get("protocol", "TCP") == "TCP" for p in ports)
    return to_pod and on_port


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_objects_validate_strictly(layers, version):
    errors = []
    for objects in layers.values():
        for obj in objects:
            if obj["kind"] not in ("DaemonSet", "Service", "NetworkPolicy") or "dcgm" not in obj["metadata"]["name"]:
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert errors == []


def test_the_component_names_the_pinned_image_and_only_collected_counters():
    """The comment air-gapped sites mirror from names the image the DaemonSet runs, and every metric it says we rely
    on is one the image collects by default without profiling rights; so do the alert rules."""
    comment = (COMPONENT / "kustomization.yaml").read_text()
    assert re.findall(r"nvcr\.io/\S+", comment) == [PINNED_IMAGE]
    relied_on = set(re.findall(r"\bDCGM_FI_[A-Z0-9_]+\b", comment)) - {"DCGM_FI_PROF_"}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"} <= relied_on
    assert relied_on <= COLLECTED_COUNTERS, relied_on - COLLECTED_COUNTERS
    in_alerts = set(re.findall(r"\bDCGM_[A-Z0-9_]+\b", ALERTS_YML.read_text()))
    assert in_alerts and in_alerts <= COLLECTED_COUNTERS, in_alerts - COLLECTED_COUNTERS


def test_the_k3s_placement_alone_does_not_render(tmp_path):
    """It patches the exporter, so it only makes sense after it; kustomize says so instead of rendering nothing."""
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "site").mkdir()
    layer = {"resources": ["../overlays/k3s-gpu"], "components": ["../components/dcgm-exporter/k3s"]}
    (tree / "site" / "kustomization.yaml").write_text(yaml.safe_dump(layer))
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not on PATH"
    result = subprocess.run([kubectl, "kustomize", str(tree / "site")], capture_output=True, text=True, check=False)
    assert result.returncode != 0 and NAME in result.stderr, result.stderr


def test_the_role_default_is_the_pinned_image_and_a_mirror_copy_replaces_it(tmp_path):
    """workloads_dcgm_exporter_image: the role's default is the component's pinned image; a mirror's copy given there
    is the image the rendered DaemonSet runs (air-gapped hosts), on the layer the workloads role generates."""
    from k8s.k8s_render import render_site

    defaults = yaml.safe_load((K8S.parent / "roles" / "workloads" / "defaults" / "main.yml").read_text())
    assert defaults["workloads_dcgm_exporter_image"] == PINNED_IMAGE
    mirror = "registry.local:5000/mirror/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless"
    settings = {"overlay": "k3s-gpu", "train": False, "gpu_sharing": "exclusive", "shm_size": "1Gi",
                "monitoring": {"dcgm_exporter_image": mirror}}  # fmt: skip
    rendered = render_site(tmp_path, "mirror", settings)
    assert [c["image"] for c in pod_spec(exporter(rendered))["containers"]] == [mirror]
    pinned = render_site(tmp_path, "pinned", {**settings, "monitoring": {"dcgm_exporter_image": PINNED_IMAGE}})
    assert [c["image"] for c in pod_spec(exporter(pinned))["containers"]] == [PINNED_IMAGE]


@pytest.mark.parametrize("bad", ["nvcr.io/nvidia/k8s/dcgm-exporter", "registry.local:5000/dcgm", "a b:1", "x@sha256:1"])
def test_an_image_that_is_not_repository_and_tag_is_refused(bad):
    monitoring = load_plugin("roles/workloads/filter_plugins/monitoring.py")
    with pytest.raises(Exception, match="workloads_dcgm_exporter_image must be 'repository:tag'"):
        monitoring.monitoring_settings({"monitoring": {"dcgm_exporter_image": bad}})
