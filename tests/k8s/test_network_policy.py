"""Only the ports a deployment needs, only to its members (issue 26, item 4), on every overlay and site layer:

- NetworkPolicies: the inference API accepts only the web client (and the ingress controller with the ingress
  component); the API and the client reach only the cluster DNS, and the client the API; the API reaches S3 only
  with k8s/components/network-policy-s3;
- no pod mounts a service-account token (none talks to the Kubernetes API), including the pods the Kubeflow and
  KServe kinds are folded into.

The policies are evaluated, not only read: ``allowed`` answers "may this pod reach that one on this port" as the
NetworkPolicy API defines it (https://kubernetes.io/docs/concepts/services-networking/network-policies/: a pod
selected by no policy of a direction is open in that direction; policies are additive).
"""

from __future__ import annotations

import shutil

import pytest
import yaml
from k8s.k8s_render import (
    K8S,
    OVERLAYS,
    SITE_VARIANTS,
    TRAIN_KIND_VARIANTS,
    find,
    kustomize,
    load_workloads_filters,
    pod_spec,
    render_train_kind,
    workloads,
)

NAMESPACE = "dinops"
CLIENT = {"app.kubernetes.io/name": "dinops-client"}
SERVE = {"app.kubernetes.io/name": "dinops-serve"}
DNS_NAMESPACE = {"kubernetes.io/metadata.name": "kube-system"}
DNS = {"k8s-app": "kube-dns"}
TRAEFIK = ({"kubernetes.io/metadata.name": "kube-system"}, {"app.kubernetes.io/name": "traefik"})
NGINX = ({"kubernetes.io/metadata.name": "ingress-nginx"}, {"app.kubernetes.io/name": "ingress-nginx"})
# Pods of the namespace that must stay unreachable from the API and the client.
OTHERS = ({"app.kubernetes.io/name": "dinops-train"}, {"app.kubernetes.io/name": "dinops-download"})
# Named ports, as the pods declare them: the API's http is 8000 (8080 in the KServe predictor), the client's 8080.
# The trainer's metrics (9109), Prometheus' http (9090), the DCGM exporter's metrics (9400): k8s/base/job-train.yaml,
# k8s/components/monitoring, k8s/components/dcgm-exporter.
PORTS = {"dinops-serve": {"http": 8000}, "dinops-client": {"http": 8080}, "dinops-train": {"metrics": 9109},
         "dinops-prometheus": {"http": 9090}, "dinops-dcgm-exporter": {"metrics": 9400}}  # fmt: skip
INGRESS_SITES = sorted(n for n, s in SITE_VARIANTS.items() if s.get("ingress"))


# --- A NetworkPolicy evaluator ---------------------------------------------------------------------------------------
def matches(selector: dict | None, labels: dict) -> bool:
    """A LabelSelector (matchLabels and the In/NotIn/Exists/DoesNotExist expressions) against labels; {} is all."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def peer_matches(peer: dict, namespace_labels: dict, pod_labels: dict | None, address: str | None) -> bool:
    """A NetworkPolicyPeer: podSelector alone means this namespace; with namespaceSelector, those namespaces."""
    if "ipBlock" in peer:
        return address is not None and peer["ipBlock"]["cidr"] in ("0.0.0.0/0", "::/0")
    if pod_labels is None:
        return False
    if "namespaceSelector" in peer:
        in_namespace = matches(peer["namespaceSelector"], namespace_labels)
    else:
        in_namespace = namespace_labels.get("kubernetes.io/metadata.name") == NAMESPACE
    return in_namespace and matches(peer.get("podSelector"), pod_labels)


def port_matches(rule_ports: list | None, pod: str | None, port: int, protocol: str) -> bool:
    if not rule_ports:
        return True
    for item in rule_ports:
        if item.get("protocol", "TCP") != protocol:
            continue
        wanted = item.get("port")
        if wanted is None:
            return True
        if isinstance(wanted, str):
            wanted = PORTS.get(pod or "", {}).get(wanted)
        if wanted == port:
            return True
    return False


def direction_allows(policies, direction, selected, peer_ns, peer_labels, address, dest_pod, port, protocol) -> bool:
    key = "ingress" if direction == "Ingress" else "egress"
    peers_key = "from" if direction == "Ingress" else "to"
    applying = [
        p
        for p in policies
        if matches(p["spec"]["podSelector"], selected) and direction in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not applying:
        return True
    for policy in applying:
        for rule in policy["spec"].get(key) or []:
            peers = rule.get(peers_key)
            if (not peers or any(peer_matches(p, peer_ns, peer_labels, address) for p in peers)) and port_matches(
                rule.get("ports"), dest_pod, port, protocol
            ):
                return True
    return False


def allowed(objects, source: dict, dest: tuple, port: int, protocol: str = "TCP") -> bool:
    """May a pod of the dinops namespace with labels ``source`` reach ``dest`` = (namespace labels, pod labels) or
    an outside address (None, None)? Its egress and, for a dinops pod, that pod's ingress must both allow it."""
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    dest_ns, dest_labels = dest
    own = {"kubernetes.io/metadata.name": NAMESPACE}
    dest_pod = (dest_labels or {}).get("app.kubernetes.io/name")
    address = "198.51.100.7" if dest_labels is None else None
    if not direction_allows(policies, "Egress", source, dest_ns or {}, dest_labels, address, dest_pod, port, protocol):
        return False
    if dest_ns == own:
        return direction_allows(policies, "Ingress", dest_labels, own, source, None, dest_pod, port, protocol)
    return True


OWN = {"kubernetes.io/metadata.name": NAMESPACE}
OUTSIDE = (None, None)


def check_isolation(objects: list[dict], ingress: bool, s3_serve: bool) -> None:
    # The API: only the client (and the ingress controller when there is one) reaches it.
    assert allowed(objects, CLIENT, (OWN, SERVE), 8000)
    for other in OTHERS:
        assert not allowed(objects, other, (OWN, SERVE), 8000), other
    for namespace, pod in (TRAEFIK, NGINX):
        policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
        reaches = direction_allows(policies, "Ingress", SERVE, namespace, pod, None, "dinops-serve", 8000, "TCP")
        assert reaches is ingress, (namespace, ingress)
    # The client: DNS and the API's port, nothing else.
    assert allowed(objects, CLIENT, (DNS_NAMESPACE, DNS), 53, "UDP")
    assert allowed(objects, CLIENT, (DNS_NAMESPACE, DNS), 53, "TCP")
    assert not allowed(objects, CLIENT, (OWN, SERVE), 9000)
    assert not allowed(objects, CLIENT, OUTSIDE, 443)
    for other in OTHERS:
        assert not allowed(objects, CLIENT, (OWN, other), 8080), other
    # The API: DNS, and S3 only when it loads its checkpoint from there.
    assert allowed(objects, SERVE, (DNS_NAMESPACE, DNS), 53, "UDP")
    assert not allowed(objects, SERVE, (OWN, CLIENT), 8080)
    assert allowed(objects, SERVE, OUTSIDE, 443) is s3_serve
    # The client stays reachable: it is the published endpoint; behind the ingress, through the controller only.
    assert allowed(objects, {"app.kubernetes.io/name": "anything"}, (OWN, CLIENT), 8080) is not ingress
    for namespace, pod in (TRAEFIK, NGINX):
        policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
        assert direction_allows(policies, "Ingress", CLIENT, namespace, pod, None, "dinops-client", 8080, "TCP")


def pod_specs(node) -> list[dict]:
    """Every pod spec inside an object (a Deployment's template, a TrainJob's or an Experiment's nested ones)."""
    found = []
    if isinstance(node, dict):
        if "containers" in node and isinstance(node["containers"], list):
            found.append(node)
        for value in node.values():
            found += pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            found += pod_specs(value)
    return found


def assert_no_token(objects: list[dict]) -> None:
    for obj in objects:
        for spec in pod_specs(obj.get("spec")):
            where = f"{obj['kind']}/{obj['metadata']['name']}"
            assert spec.get("automountServiceAccountToken") is False, where


# --- Overlays and the host layers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_let_only_the_client_reach_the_api(rendered, overlay):
    check_isolation(rendered[overlay], ingress=False, s3_serve=False)


@pytest.mark.parametrize("site", sorted(SITE_VARIANTS))
def test_site_layers_let_only_the_client_reach_the_api(rendered_sites, site):
    settings = SITE_VARIANTS[site]
    s3_serve = bool((settings.get("s3") or {}).get("serve"))
    check_isolation(rendered_sites[site], ingress=bool(settings.get("ingress")), s3_serve=s3_serve)


def test_a_site_layer_serving_from_s3_is_among_the_variants():
    """The egress to S3 is checked on a real variant, not only by the absence of one."""
    assert any((s.get("s3") or {}).get("serve") for s in SITE_VARIANTS.values())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_pod_of_an_overlay_mounts_a_service_account_token(rendered, overlay):
    assert workloads(rendered[overlay])
    assert_no_token(rendered[overlay])


@pytest.mark.parametrize("site", sorted(SITE_VARIANTS))
def test_no_pod_of_a_site_layer_mounts_a_service_account_token(rendered_sites, site):
    assert_no_token(rendered_sites[site])


def test_the_checkpoint_job_mounts_no_token_either(rendered_sites):
    site = next(n for n, s in SITE_VARIANTS.items() if s.get("checkpoint_url"))
    assert pod_spec(find(rendered_sites[site], "Job", "dinops-checkpoint"))["automountServiceAccountToken"] is False


def test_policies_are_namespaced_and_select_by_the_stable_identity_key(rendered):
    for overlay, objects in rendered.items():
        policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
        assert {p["metadata"]["name"] for p in policies} == {"dinops-api-isolation", "dinops-client-egress"}, overlay
        for policy in policies:
            assert policy["metadata"]["namespace"] == NAMESPACE, overlay
            assert set(policy["spec"]["podSelector"]["matchLabels"]) == {"app.kubernetes.io/name"}, overlay


# --- Components ------------------------------------------------------------------------------------------------------
def render_layer(tmp_path, name: str, components: list[str]) -> list[dict]:
    tree = tmp_path / name / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "site").mkdir()
    layer = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../overlays/k3s-gpu"],
        "components": [f"../components/{c}" for c in components],
    }
    (tree / "site" / "kustomization.yaml").write_text(yaml.safe_dump(layer))
    return kustomize(tree / "site")


def test_the_s3_component_opens_the_api_to_the_outside_only(tmp_path):
    objects = render_layer(tmp_path, "s3", ["s3-credentials", "network-policy-s3"])
    check_isolation(objects, ingress=False, s3_serve=True)


def test_the_ingress_component_lets_the_controller_in(tmp_path):
    objects = render_layer(tmp_path, "ingress", ["ingress"])
    check_isolation(objects, ingress=True, s3_serve=False)


@pytest.mark.parametrize("site", INGRESS_SITES)
def test_site_layers_with_an_ingress_let_the_controller_in(rendered_sites, site):
    check_isolation(rendered_sites[site], ingress=True, s3_serve=False)


# --- The kinds the pods are folded into ------------------------------------------------------------------------------
KSERVE = load_workloads_filters("inference_service")
CPU_DEMO_KINDS = sorted(n for n in TRAIN_KIND_VARIANTS if n.startswith("kind-cpu-demo-"))


def test_the_inference_service_predictor_keeps_the_labels_the_policies_select_and_no_token(tmp_path):
    site = "rtx3060ti-inference"
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    (tree / "site").mkdir()
    layer = load_workloads_filters().site_kustomization({**SITE_VARIANTS[site], "inference_service": True})
    (tree / "site" / "kustomization.yaml").write_text(yaml.safe_dump(layer, sort_keys=False))
    objects = KSERVE.inference_service(kustomize(tree / "site"), True)
    predictor = find(objects, "InferenceService", "dinops")["spec"]["predictor"]
    assert predictor["labels"]["app.kubernetes.io/name"] == "dinops-serve"
    assert predictor["automountServiceAccountToken"] is False
    assert predictor["containers"][0]["ports"][0]["name"] == "http"
    check_isolation(objects, ingress=True, s3_serve=False)


@pytest.mark.parametrize("variant", CPU_DEMO_KINDS)
def test_training_kinds_mount_no_token(tmp_path, variant):
    objects = render_train_kind(tmp_path, variant, TRAIN_KIND_VARIANTS[variant])
    assert_no_token(objects)
