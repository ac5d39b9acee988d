"""The ingress is public (k3s' Traefik, through ServiceLB, on every node's 80 and 443), so what it publishes carries
TLS and the login (issue 26; docs/security.md, "Behind the ingress"), with or without a public dinops_publish_address;
only k3s runs an ingress controller (its packaged Traefik), so minikube and the Docker runtime refuse the setting:

- the Ingress ends TLS with the client's certificate (the Secret dinops-client-auth, keys tls.crt and tls.key) and is
  served on Traefik's websecure entry point only, never on port 80 in clear;
- the client behind it always asks for the login (the password file from the same Secret), serves plain HTTP to the
  controller inside the cluster and believes one proxy's X-Forwarded-*; its Service has no NodePort, and its
  NetworkPolicy lets only the ingress controller in (the kubelet's probes come from the node, which a NetworkPolicy
  always lets through);
- the API behind /v1 requires its bearer token (DINO_API_TOKEN from the Secret's key api-token), and the client,
  which calls it, sends it;
- the stage's lines name the ingress URL over https and where the password and the token are.
"""

from __future__ import annotations

import pytest
from k8s.k8s_render import find, load_workloads_filters, pod_spec, render_site
from k8s.test_network_policy import NGINX, TRAEFIK, direction_allows
from k8s.test_render_and_schema import KUBERNETES_VERSIONS, _validate_all

from dinops_testing import load_plugin

access = load_plugin("roles/workloads/filter_plugins/client_access.py")

SECRET = "dinops-client-auth"
SECRET_DIR = "/run/secrets/dinops-client"
ENTRYPOINTS = "traefik.ingress.kubernetes.io/router.entrypoints"
ROUTER_TLS = "traefik.ingress.kubernetes.io/router.tls"
CLIENT = {"app.kubernetes.io/name": "dinops-client"}
OUTSIDE_POD = ({"kubernetes.io/metadata.name": "default"}, {"app.kubernetes.io/name": "anything"})


def ingress_settings(cluster: str, public: bool) -> dict:
    """What render.yml passes with workloads_ingress on an inference host with the client (no training)."""
    return {
        "overlay": f"{cluster}-gpu",
        "cluster": cluster,
        "train": False,
        "gpu_sharing": "exclusive",
        "shm_size": "2Gi",
        "ingress": True,
        "client_public": public,
    }


VARIANTS = {f"k3s-{'public' if public else 'loopback'}": ingress_settings("k3s", public) for public in (False, True)}


@pytest.mark.parametrize(("cluster", "overlay"), [("minikube", "cpu"), ("minikube", "minikube-gpu"), ("docker", "cpu")])
def test_without_an_ingress_controller_the_setting_is_refused(cluster, overlay):
    """minikube here enables no ingress addon and Docker has no controller: an Ingress there would publish nothing,
    and the client's Service would lose its NodePort. Refused with what to use instead."""
    settings = {**ingress_settings(cluster, True), "overlay": overlay}
    with pytest.raises(Exception, match=f"workloads_ingress needs an ingress controller.*{cluster} has none"):
        load_workloads_filters().site_kustomization(settings)


@pytest.fixture(scope="module")
def layers(tmp_path_factory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("ingress")
    return {name: render_site(root, name, settings) for name, settings in VARIANTS.items()}


def container(objects: list[dict], app: str) -> dict:
    return next(c for c in pod_spec(find(objects, "Deployment", f"dinops-{app}"))["containers"] if c["name"] == app)


def client_container(objects: list[dict]) -> dict:
    return container(objects, "client")


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env", [])}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_layer_composes_the_ingress_without_the_clients_own_tls(variant):
    components = load_workloads_filters().site_kustomization(VARIANTS[variant])["components"]
    assert any(c.endswith("/components/ingress") for c in components)
    # The client's own TLS (k8s/components/client-auth) would make it answer HTTPS only, where Traefik forwards HTTP.
    assert not any(c.endswith("/components/client-auth") for c in components), components


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_ingress_ends_tls_with_the_clients_certificate_on_websecure_only(layers, variant):
    ingress = find(layers[variant], "Ingress", "dinops")
    assert ingress["spec"]["tls"] == [{"secretName": SECRET}]
    annotations = ingress["metadata"].get("annotations") or {}
    assert annotations.get(ENTRYPOINTS) == "websecure"
    assert annotations.get(ROUTER_TLS) == "true"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_client_behind_the_ingress_logs_in_and_serves_plain_http(layers, variant):
    objects = layers[variant]
    container = client_container(objects)
    env = env_of(container)
    assert env["CLIENT_PASSWORD_FILE"]["value"] == f"{SECRET_DIR}/password"
    assert env["CLIENT_PROXY_HOPS"]["value"] == "1"
    # No TLS of its own: CLIENT_PUBLIC would refuse to start without it, and Traefik speaks HTTP to the Service.
    assert {"CLIENT_TLS_CERT_FILE", "CLIENT_TLS_KEY_FILE", "CLIENT_PUBLIC"}.isdisjoint(env), sorted(env)
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"].get("scheme", "HTTP") == "HTTP", probe
    spec = pod_spec(find(objects, "Deployment", "dinops-client"))
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == SECRET_DIR)
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"] == {"secretName": SECRET, "defaultMode": 0o440}
    assert spec["securityContext"]["fsGroup"] == 10001


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_client_is_reached_through_the_ingress_only(layers, variant):
    objects = layers[variant]
    service = find(objects, "Service", "dinops-client")
    # A NodePort would publish the plain-HTTP login beside the ingress; a NetworkPolicy cannot close it, as the
    # node's own traffic (where kube-proxy sends a NodePort's) always passes.
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert all("nodePort" not in port for port in service["spec"]["ports"])
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for namespace, pod in (TRAEFIK, NGINX):
        assert direction_allows(policies, "Ingress", CLIENT, namespace, pod, None, "dinops-client", 8080, "TCP")
        assert not direction_allows(policies, "Ingress", CLIENT, namespace, pod, None, "dinops-client", 9000, "TCP")
    assert not direction_allows(policies, "Ingress", CLIENT, *OUTSIDE_POD, None, "dinops-client", 8080, "TCP")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_api_behind_v1_requires_its_token_and_the_client_sends_it(layers, variant):
    objects = layers[variant]
    paths = find(objects, "Ingress", "dinops")["spec"]["rules"][0]["http"]["paths"]
    assert {p["path"]: p["backend"]["service"]["name"] for p in paths}["/v1"] == "dinops-serve"
    token = {"secretKeyRef": {"name": SECRET, "key": "api-token"}}
    assert env_of(container(objects, "serve"))["DINO_API_TOKEN"].get("valueFrom") == token
    assert env_of(client_container(objects))["DINO_API_TOKEN"].get("valueFrom") == token


@pytest.mark.parametrize("version", (KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_layers_with_the_ingress_validate_strictly(layers, variant, version):
    assert _validate_all(layers[variant], version) == []


def test_without_the_ingress_a_public_client_keeps_its_own_tls_and_nodeport(tmp_path):
    objects = render_site(tmp_path, "public", {**ingress_settings("k3s", True), "ingress": False})
    env = env_of(client_container(objects))
    assert env["CLIENT_PUBLIC"]["value"] == "true"
    assert env["CLIENT_TLS_CERT_FILE"]["value"] == f"{SECRET_DIR}/tls.crt"
    assert "CLIENT_PROXY_HOPS" not in env
    assert find(objects, "Service", "dinops-client")["spec"]["ports"][0]["nodePort"] == 30000


# --- What the stage prints (filter_plugins/client_access.py) -----------------------------------------------------
STAGE = {"public_address": "10.0.0.5", "port": 30000, "ssh_host": "gpu1.example", "ssh_user": "ubuntu",
         "password_file": "/etc/dinops/client-password", "ingress": True,
         "api_token_file": "/etc/dinops/api-token"}  # fmt: skip


@pytest.mark.parametrize(
    ("publish", "url"),
    [("127.0.0.1", "https://10.0.0.5/"), ("0.0.0.0", "https://10.0.0.5/"), ("192.0.2.7", "https://192.0.2.7/"),
     ("2001:db8::7", "https://[2001:db8::7]/")],
)  # fmt: skip
def test_the_stage_names_the_ingress_url_over_https_and_where_the_password_and_token_are(publish, url):
    lines = access.client_access({**STAGE, "publish_address": publish})
    text = "\n".join(lines)
    assert lines[0].startswith(f"Web client: {url} ")
    assert "sudo cat /etc/dinops/client-password" in lines[0]
    assert f"{url}v1/" in text and "sudo cat /etc/dinops/api-token" in text
    assert "http://" not in text and "ssh -N" not in text and ":30000" not in text


def test_the_stage_names_an_inventory_password_behind_the_ingress_without_printing_it():
    lines = access.client_access({**STAGE, "publish_address": "127.0.0.1", "password_file": ""})
    assert "the inventory's workloads_client_password" in lines[0]
