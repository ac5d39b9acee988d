"""The k3s role's NVIDIA device plugin manifest: valid for Kubernetes 1.28 to 1.33, time-slicing when asked."""

from __future__ import annotations

from pathlib import Path

import jinja2
import kubernetes_validate
import pytest
import yaml

TEMPLATE = Path(__file__).resolve().parents[2] / "roles" / "k3s" / "templates" / "nvidia-device-plugin.yaml.j2"


def render(replicas: int) -> list[dict]:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["comment"] = lambda text: "# " + text
    text = env.from_string(TEMPLATE.read_text()).render(
        ansible_managed="Ansible managed",
        k3s_device_plugin_replicas=replicas,
        k3s_device_plugin_image="nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.parametrize("version", ["1.28", "1.29", "1.30", "1.31", "1.32", "1.33"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_manifest_validates_strictly(version, replicas):
    for obj in render(replicas):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(("replicas", "sharing"), [(1, None), (4, [{"name": "nvidia.com/gpu", "replicas": 4}])])
def test_time_slicing_only_with_more_than_one_replica(replicas, sharing):
    config_map, daemon_set = render(replicas)
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert config.get("sharing", {}).get("timeSlicing", {}).get("resources") == sharing
    assert config["flags"] == {"migStrategy": "none", "failOnInitError": False}
    template = daemon_set["spec"]["template"]
    # A changed replica count must restart the plugin, which reads its configuration only at start.
    assert template["metadata"]["annotations"]["dinops.io/config-replicas"] == str(replicas)
    assert template["spec"]["runtimeClassName"] == "nvidia"
    # Only GPU nodes (labelled by the k3s role) have the nvidia runtime the pod asks for.
    assert template["spec"]["nodeSelector"] == {"dinops.io/gpu": "true"}
    container = template["spec"]["containers"][0]
    assert container["image"].endswith(":v0.17.1")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"device-plugins": "/var/lib/kubelet/device-plugins", "config": "/etc/nvidia-device-plugin"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"CONFIG_FILE": "/etc/nvidia-device-plugin/config.yaml"}
