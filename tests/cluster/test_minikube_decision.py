"""Every probed state of a minikube profile and what the role does about it."""

from __future__ import annotations

import json

import pytest
import yaml

from dinops_testing import REPO

DESIRED = {
    "profile": "dinops",
    "driver": "docker",
    "container_runtime": "docker",
    "gpus": "all",
    "cpus": 6,
    "memory_mb": 24576,
    "disk_mb": 102400,
    "ports": ["30000:30000"],
    "kubernetes_version": "v1.33.1",
    "allow_recreate": False,
}
RUNNING = {"Name": "dinops", "Host": "Running", "Kubelet": "Running", "APIServer": "Running"}


def config(**changes):
    """A profile config.json as minikube writes it for DESIRED, with some fields changed."""
    kubernetes = {"KubernetesVersion": "v1.33.1", "ContainerRuntime": "docker", "ClusterName": "dinops"}
    kubernetes.update(changes.pop("kubernetes", {}))
    data = {
        "Name": "dinops",
        "Driver": "docker",
        "GPUs": "all",
        "CPUs": 6,
        "Memory": 24576,
        "DiskSize": 102400,
        "ExposedPorts": ["30000:30000"],
        "KubernetesConfig": kubernetes,
    }
    data.update(changes)
    return json.dumps(data)


def status(**states):
    return json.dumps({**RUNNING, **states})


def decide(module, config_text, status_text, **desired):
    return module.minikube_action(config_text, status_text, {**DESIRED, **desired})


@pytest.mark.parametrize("absent", [None, "", "  \n"])
def test_no_profile_is_created(minikube_decision, absent):
    assert decide(minikube_decision, absent, "") == {"action": "create", "reasons": ["no minikube profile yet"]}


def test_running_with_the_wanted_settings_does_nothing(minikube_decision):
    assert decide(minikube_decision, config(), status())["action"] == "none"


@pytest.mark.parametrize(
    "states",
    [
        {"Host": "Stopped", "Kubelet": "Stopped", "APIServer": "Stopped"},
        {"Kubelet": "Stopped"},
        {"APIServer": "Error"},
        {"Host": "Nonexistent", "Kubelet": "Nonexistent", "APIServer": "Nonexistent"},
    ],
)
def test_stopped_or_broken_components_are_started(minikube_decision, states):
    result = decide(minikube_decision, config(), status(**states))
    assert result["action"] == "start"
    assert result["reasons"][0].startswith("not running (")


@pytest.mark.parametrize("status_text", ["", "not json", "[1, 2]"])
def test_unreadable_status_means_start(minikube_decision, status_text):
    result = decide(minikube_decision, config(), status_text)
    assert result == {"action": "start", "reasons": ["not running (Host unknown, Kubelet unknown, APIServer unknown)"]}


def test_paused_is_unpaused(minikube_decision):
    assert decide(minikube_decision, config(), status(APIServer="Paused", Kubelet="Stopped"))["action"] == "unpause"


def test_newer_kubernetes_is_an_in_place_upgrade(minikube_decision):
    result = decide(minikube_decision, config(kubernetes={"KubernetesVersion": "v1.32.0"}), status())
    assert result == {"action": "start", "reasons": ["Kubernetes v1.32.0 is upgraded in place to v1.33.1"]}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"Driver": "none"}, "driver: created with 'none', wanted 'docker'"),
        ({"kubernetes": {"ContainerRuntime": "containerd"}}, "container runtime: created with 'containerd'"),
        ({"GPUs": ""}, "GPUs: created with '', wanted 'all'"),
        ({"CPUs": 2}, "CPUs: created with 2, wanted 6"),
        ({"Memory": 8192}, "memory (MB): created with 8192, wanted 24576"),
        ({"DiskSize": 20000}, "disk (MB): created with 20000, wanted 102400"),
        ({"ExposedPorts": []}, "published ports: created with [], wanted ['30000:30000']"),
        ({"kubernetes": {"KubernetesVersion": "v1.34.0"}}, "minikube cannot downgrade a cluster"),
        ({"kubernetes": {"KubernetesVersion": "latest"}}, "which is not a version"),
    ],
)
def test_settings_only_a_new_cluster_can_change_need_a_recreate(minikube_decision, changes, reason):
    refused = decide(minikube_decision, config(**changes), status())
    assert refused["action"] == "refuse"
    assert len(refused["reasons"]) == 1 and reason in refused["reasons"][0]
    allowed = decide(minikube_decision, config(**changes), status(), allow_recreate=True)
    assert allowed == {"action": "recreate", "reasons": refused["reasons"]}


# 3 % of the wanted 24576 MB is 737.28 MB.
@pytest.mark.parametrize("memory", [24576 - 4, 24576 + 12, 24576 - 737, 24576 + 737])
def test_memory_taken_from_the_host_tolerates_a_kernel_update(minikube_decision, memory):
    """The role took 3/4 of MemTotal, which moves by a few MB with the kernel: not a reason to delete the cluster."""
    result = decide(minikube_decision, config(Memory=memory), status(), memory_tolerance_percent=3)
    assert result == {"action": "none", "reasons": ["running with the wanted settings"]}


@pytest.mark.parametrize("memory", [24576 - 738, 24576 + 738, 8192])
def test_memory_taken_from_the_host_beyond_the_tolerance_needs_a_recreate(minikube_decision, memory):
    result = decide(minikube_decision, config(Memory=memory), status(), memory_tolerance_percent=3)
    assert result == {
        "action": "refuse",
        "reasons": [f"memory (MB): created with {memory}, wanted 24576 (more than 3% apart)"],
    }


@pytest.mark.parametrize("tolerance", [{}, {"memory_tolerance_percent": 0}])
def test_memory_the_inventory_sets_compares_exactly(minikube_decision, tolerance):
    result = decide(minikube_decision, config(Memory=24576 - 4), status(), **tolerance)
    assert result == {"action": "refuse", "reasons": ["memory (MB): created with 24572, wanted 24576"]}


def test_the_memory_tolerance_leaves_the_cpus_exact(minikube_decision):
    """vCPUs are the instance's: a kernel update does not change them, so the derived count compares exactly."""
    result = decide(minikube_decision, config(CPUs=5, Memory=24570), status(), memory_tolerance_percent=3)
    assert result == {"action": "refuse", "reasons": ["CPUs: created with 5, wanted 6"]}


def test_profile_created_before_the_gpu_runtime_lists_every_difference(minikube_decision):
    """The users' trap: a profile made before --gpus existed, with default resources."""
    old = config(GPUs="", CPUs=2, Memory=2200, ExposedPorts=None)
    result = decide(minikube_decision, old, status(Host="Stopped"), allow_recreate=True)
    assert result["action"] == "recreate"
    assert [r.split(":")[0] for r in result["reasons"]] == ["GPUs", "CPUs", "memory (MB)", "published ports"]


@pytest.mark.parametrize("text", ["{not json", "[]", '"a string"'])
def test_unreadable_profile_needs_a_recreate(minikube_decision, text):
    assert decide(minikube_decision, text, status())["action"] == "refuse"
    assert decide(minikube_decision, text, status(), allow_recreate=True)["action"] == "recreate"


def test_none_driver_ignores_what_the_host_decides(minikube_decision):
    none_config = config(Name="minikube", Driver="none", GPUs="", CPUs=2, Memory=6000, DiskSize=20000, ExposedPorts=[])
    result = decide(minikube_decision, none_config, status(), driver="none", gpus="", profile="minikube")
    assert result["action"] == "none"


@pytest.mark.parametrize("profile", ["dinops", "", None])
def test_none_driver_refuses_any_profile_but_minikube(minikube_decision, profile):
    """minikube v1.37.0 validateBareMetal: "The 'none' driver does not support multiple profiles"."""
    desired = {**DESIRED, "driver": "none", "gpus": "", "profile": profile}
    with pytest.raises(
        minikube_decision.MinikubeDecisionError, match="minikube_profile is .* set minikube_profile: minikube"
    ):
        minikube_decision.minikube_start_args(desired)
    with pytest.raises(minikube_decision.MinikubeDecisionError, match="minikube_profile"):
        minikube_decision.minikube_action("", "", desired)


@pytest.mark.parametrize(
    ("driver", "host_gpus", "addons"),
    [
        ("none", 1, ["nvidia-device-plugin"]),
        ("none", "8", ["nvidia-device-plugin"]),
        ("none", 0, []),
        ("none", None, []),
        # --gpus=all makes minikube enable the device plugin itself (cruntime/docker.go, v1.37.0)
        ("docker", 1, []),
    ],
)
def test_none_driver_enables_the_device_plugin_on_gpu_hosts(minikube_decision, driver, host_gpus, addons):
    assert minikube_decision.minikube_addons(driver, host_gpus) == addons


def test_none_driver_profile_without_the_device_plugin_is_started_again(minikube_decision):
    """A none profile created before the addon was asked for: `minikube start --addons=...` enables it."""
    desired = {"driver": "none", "gpus": "", "profile": "minikube", "addons": ["nvidia-device-plugin"]}
    none_config = config(Name="minikube", Driver="none", GPUs="")
    result = decide(minikube_decision, none_config, status(), **desired)
    assert result == {"action": "start", "reasons": ["addons not enabled: nvidia-device-plugin"]}
    disabled = config(Name="minikube", Driver="none", GPUs="", Addons={"nvidia-device-plugin": False})
    assert decide(minikube_decision, disabled, status(), **desired)["action"] == "start"
    enabled = config(Name="minikube", Driver="none", GPUs="", Addons={"nvidia-device-plugin": True})
    assert decide(minikube_decision, enabled, status(), **desired)["action"] == "none"


def test_a_bad_wanted_version_is_an_input_error(minikube_decision):
    with pytest.raises(minikube_decision.MinikubeDecisionError, match="not a Kubernetes version: 'stable'"):
        decide(minikube_decision, config(), status(), kubernetes_version="stable")


def test_start_arguments_create_what_the_probe_checks(minikube_decision):
    args = minikube_decision.minikube_start_args({**DESIRED, "extra_args": ["--addons=ingress"]})
    assert args == [
        "--profile=dinops",
        "--driver=docker",
        "--container-runtime=docker",
        "--kubernetes-version=v1.33.1",
        "--cpus=6",
        "--memory=24576mb",
        "--disk-size=102400mb",
        "--gpus=all",
        "--ports=30000:30000",
        "--addons=ingress",
    ]
    none_args = minikube_decision.minikube_start_args(
        {**DESIRED, "driver": "none", "gpus": "", "profile": "minikube", "addons": ["nvidia-device-plugin"]}
    )
    assert none_args == [
        "--profile=minikube",
        "--driver=none",
        "--container-runtime=docker",
        "--kubernetes-version=v1.33.1",
        "--addons=nvidia-device-plugin",
    ]


def test_a_profile_published_on_every_address_is_recreated_for_loopback(minikube_decision):
    """The default moved from "30000:30000" (every address) to dinops_publish_address 127.0.0.1 (issue 26): a cluster
    created before needs a recreate, which the role asks for instead of doing (its volumes hold the data)."""
    loopback = ["127.0.0.1:30000:30000"]
    refused = decide(minikube_decision, config(), status(), ports=loopback)
    assert refused["action"] == "refuse"
    assert refused["reasons"] == ["published ports: created with ['30000:30000'], wanted ['127.0.0.1:30000:30000']"]
    assert decide(minikube_decision, config(ExposedPorts=loopback), status(), ports=loopback)["action"] == "none"
    args = minikube_decision.minikube_start_args({**DESIRED, "ports": loopback})
    assert "--ports=127.0.0.1:30000:30000" in args


def test_the_role_publishes_the_client_on_the_publish_address():
    defaults = yaml.safe_load((REPO / "roles/minikube/defaults/main.yml").read_text())
    assert defaults["minikube_published_ports"] == ["{{ dinops_publish_address | default('127.0.0.1') }}:30000:30000"]
