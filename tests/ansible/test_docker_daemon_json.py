"""The daemon.json merge: user keys survive, managed keys are set, bad input is refused and nothing is lost."""

from __future__ import annotations

import json

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from dinops_testing import REPO, load_plugin

plugin = load_plugin("roles/docker/filter_plugins/docker_daemon_json.py")
managed_keys = plugin.dinops_daemon_json_managed
merge = plugin.dinops_daemon_json_merge

GPU_HOST = {
    "nvidia_runtime": True,
    "nvidia_runtime_path": "nvidia-container-runtime",
    "nvidia_default_runtime": True,
    "default_shm_size": "2G",
    "log_max_size": "100m",
    "log_max_file": 3,
    "data_root": "",
}
GPU_MANAGED = {
    "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}},
    "default-runtime": "nvidia",
    "default-shm-size": "2G",
    "log-opts": {"max-size": "100m", "max-file": "3"},
}
USER_FILE = json.dumps(
    {
        "log-driver": "local",
        "registry-mirrors": ["https://mirror.example.internal"],
        "data-root": "/srv/docker",
        "bip": "172.31.0.1/24",
    }
)


def test_managed_keys_for_a_gpu_host():
    assert managed_keys(GPU_HOST) == GPU_MANAGED


def test_managed_keys_for_a_cpu_host_leave_runtimes_alone_and_withdraw_the_nvidia_default():
    cpu = dict(GPU_HOST, nvidia_runtime=False, nvidia_default_runtime=False, data_root="/data/docker")
    assert managed_keys(cpu) == {
        "default-runtime": None,
        "default-shm-size": "2G",
        "log-opts": {"max-size": "100m", "max-file": "3"},
        "data-root": "/data/docker",
    }


def test_empty_settings_manage_nothing():
    assert managed_keys({"log_max_size": "", "log_max_file": 0, "default_shm_size": "", "data_root": ""}) == {}


def test_default_runtime_without_the_runtime_entry_is_refused():
    with pytest.raises(AnsibleFilterError, match="docker_nvidia_runtime"):
        managed_keys(dict(GPU_HOST, nvidia_runtime=False))


def test_relative_data_root_is_refused():
    with pytest.raises(AnsibleFilterError, match="absolute path"):
        managed_keys(dict(GPU_HOST, data_root="docker"))


@pytest.mark.parametrize("text", ["", "   \n", None])
def test_missing_or_empty_file_gets_exactly_the_managed_keys(text):
    result = merge(text, GPU_MANAGED)
    assert result["valid"] and result["needs_write"]
    assert json.loads(result["content"]) == GPU_MANAGED
    assert result["content"].endswith("}\n")


def test_user_keys_survive_and_keep_their_order():
    result = merge(USER_FILE, GPU_MANAGED)
    assert result["valid"] and result["needs_write"]
    config = json.loads(result["content"])
    assert list(config) == [
        "log-driver",
        "registry-mirrors",
        "data-root",
        "bip",
        "runtimes",
        "default-runtime",
        "default-shm-size",
        "log-opts",
    ]
    assert config["data-root"] == "/srv/docker"
    assert config["registry-mirrors"] == ["https://mirror.example.internal"]
    assert config["log-opts"] == {"max-size": "100m", "max-file": "3"}


def test_managed_data_root_replaces_the_users():
    result = merge(USER_FILE, {"data-root": "/data/docker"})
    assert json.loads(result["content"])["data-root"] == "/data/docker"


def test_other_runtimes_and_log_options_are_kept():
    text = json.dumps(
        {"runtimes": {"kata": {"path": "/usr/bin/kata-runtime"}}, "log-opts": {"compress": "true", "max-size": "1g"}}
    )
    config = merge(text, GPU_MANAGED)["config"]
    assert config["runtimes"] == {
        "kata": {"path": "/usr/bin/kata-runtime"},
        "nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []},
    }
    assert config["log-opts"] == {"compress": "true", "max-size": "100m", "max-file": "3"}


def test_second_merge_changes_nothing_and_keeps_the_text_byte_for_byte():
    first = merge(USER_FILE, GPU_MANAGED)["content"]
    reformatted = json.dumps(json.loads(first), indent=8)
    second = merge(reformatted, GPU_MANAGED)
    assert second == {
        "valid": True,
        "error": "",
        "needs_write": False,
        "config": json.loads(first),
        "content": reformatted,
        "notes": [],
    }


def test_log_rotation_is_not_forced_onto_a_driver_that_rejects_it():
    text = json.dumps({"log-driver": "journald"})
    result = merge(text, GPU_MANAGED)
    assert "log-opts" not in result["config"]
    assert result["notes"] == [
        "log rotation not applied: log-driver 'journald' does not take max-size/max-file (only json-file, local do)"
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"log-driver": "local",', "/etc/docker/daemon.json is not valid JSON"),
        ("{'single': 'quotes'}", "/etc/docker/daemon.json is not valid JSON"),
        ('["a", "list"]', "holds a JSON list, but dockerd expects a JSON object"),
        ('{"runtimes": ["nvidia"]}', "key 'runtimes' must be a JSON object"),
    ],
)
def test_bad_input_is_reported_and_returned_unchanged(text, message):
    result = merge(text, GPU_MANAGED)
    assert result["valid"] is False
    assert result["needs_write"] is False
    assert message in result["error"]
    assert "left unchanged" in result["error"]
    assert result["content"] == text


def test_non_dict_managed_keys_are_a_programming_error():
    with pytest.raises(AnsibleFilterError, match="expects a dict"):
        merge("{}", ["runtimes"])


@pytest.mark.parametrize(
    ("current", "kept"),
    [("nvidia", None), ("runc", "runc"), ("crun", "crun"), (None, None)],
)
def test_false_default_runtime_withdraws_nvidia_and_only_nvidia(current, kept):
    config = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}}, "bip": "172.31.0.1/24"}
    if current:
        config["default-runtime"] = current
    result = merge(json.dumps(config), managed_keys(dict(GPU_HOST, nvidia_default_runtime=False)))
    assert result["config"].get("default-runtime") == kept
    assert result["config"]["runtimes"] == config["runtimes"]
    assert result["config"]["bip"] == "172.31.0.1/24"


def _trusted(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    return value


def role_values(role, names, **variables):
    """Template a role's defaults and vars the way Ansible does, with ``variables`` (facts, inventory) on top."""
    values = {}
    for layer in ("defaults", "vars"):
        path = REPO / "roles" / role / layer / "main.yml"
        if path.exists():
            values.update(yaml.safe_load(path.read_text()) or {})
    values = _trusted(values) | variables
    templar = Templar(loader=DataLoader(), variables=values)
    return {name: templar.template(values[name]) for name in names}


DOCKER_NVIDIA_KEYS = ("docker_nvidia_runtime", "docker_nvidia_default_runtime", "docker_nvidia_runtime_path")


@pytest.mark.parametrize(
    ("ansible_local", "expected"),
    [
        (None, (False, False, "/usr/bin/nvidia-container-runtime")),
        # A GPU that preflight found is not a toolkit: nothing to point dockerd at yet.
        ({"dinops": {"gpu_count": 2}}, (False, False, "/usr/bin/nvidia-container-runtime")),
        (
            {"dinops_nvidia_runtime": {"path": "/opt/nvidia/runtime", "default": True}},
            (True, True, "/opt/nvidia/runtime"),
        ),
        (
            {"dinops_nvidia_runtime": {"path": "/usr/bin/nvidia-container-runtime", "default": False}},
            (True, False, "/usr/bin/nvidia-container-runtime"),
        ),
    ],
)
def test_docker_nvidia_keys_follow_the_toolkit_roles_fact(ansible_local, expected):
    facts = {} if ansible_local is None else {"ansible_local": ansible_local}
    values = role_values("docker", DOCKER_NVIDIA_KEYS, **facts)
    assert tuple(values[name] for name in DOCKER_NVIDIA_KEYS) == expected


def test_the_toolkit_merges_daemon_json_with_the_docker_roles_own_values():
    """One source of truth: the toolkit's merge passes no nvidia values of its own that docker's could contradict."""
    tasks = yaml.safe_load((REPO / "roles/nvidia_container_toolkit/tasks/runtimes.yml").read_text())
    includes = [task for task in tasks if task.get("ansible.builtin.include_role", {}).get("name") == "docker"]
    assert includes, "the toolkit role no longer merges daemon.json through the docker role"
    for task in includes:
        assert not [name for name in task.get("vars", {}) if name.startswith("docker_nvidia")], task["name"]


@pytest.mark.parametrize("default_runtime", [True, False])
def test_toolkit_then_docker_then_again_writes_once_and_honours_the_default_runtime_choice(default_runtime):
    """Playbook order: the toolkit role records its fact and merges, the docker role merges; then a second run."""
    fact = role_values(
        "nvidia_container_toolkit",
        ["__nvidia_container_toolkit_runtime_fact"],
        nvidia_container_toolkit_docker_default_runtime=default_runtime,
    )["__nvidia_container_toolkit_runtime_fact"]
    docker = role_values(
        "docker", [*DOCKER_NVIDIA_KEYS, "docker_default_shm_size"], ansible_local={"dinops_nvidia_runtime": fact}
    )
    managed = managed_keys(
        {
            "nvidia_runtime": docker["docker_nvidia_runtime"],
            "nvidia_runtime_path": docker["docker_nvidia_runtime_path"],
            "nvidia_default_runtime": docker["docker_nvidia_default_runtime"],
            "default_shm_size": docker["docker_default_shm_size"],
        }
    )
    user_file = json.dumps({"bip": "172.31.0.1/24", "default-runtime": "nvidia"})
    toolkit_run = merge(user_file, managed)
    docker_run = merge(toolkit_run["content"], managed)
    second_toolkit_run = merge(docker_run["content"], managed)
    assert docker_run["needs_write"] is False
    assert second_toolkit_run["needs_write"] is False
    assert toolkit_run["config"]["runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"
    assert ("default-runtime" in toolkit_run["config"]) is default_runtime
