"""The daemon.json merge: user keys survive, managed keys are set, bad input is refused and nothing is lost."""

from __future__ import annotations

import json

import pytest
import yaml
from ansible.errors import AnsibleFilterError

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


def test_managed_keys_for_a_cpu_host_leave_runtimes_alone():
    cpu = dict(GPU_HOST, nvidia_runtime=False, nvidia_default_runtime=False, data_root="/data/docker")
    assert managed_keys(cpu) == {
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


def test_toolkit_and_docker_roles_agree_so_neither_undoes_the_other():
    """The toolkit role merges the runtime before the docker role runs; both use their own defaults."""
    docker = yaml.safe_load((REPO / "roles/docker/defaults/main.yml").read_text())
    toolkit = yaml.safe_load((REPO / "roles/nvidia_container_toolkit/defaults/main.yml").read_text())
    assert docker["docker_nvidia_runtime_path"] == toolkit["nvidia_container_toolkit_runtime_path"]
    common = {
        "nvidia_runtime": True,
        "nvidia_runtime_path": docker["docker_nvidia_runtime_path"],
        "default_shm_size": docker["docker_default_shm_size"],
        "log_max_size": docker["docker_log_max_size"],
        "log_max_file": docker["docker_log_max_file"],
        "data_root": docker["docker_data_root"],
    }
    from_toolkit = managed_keys(
        dict(common, nvidia_default_runtime=toolkit["nvidia_container_toolkit_docker_default_runtime"])
    )
    from_docker = managed_keys(dict(common, nvidia_default_runtime=True))
    first = merge(USER_FILE, from_toolkit)["content"]
    second = merge(first, from_docker)
    assert second["needs_write"] is False
    assert merge(second["content"], from_toolkit)["needs_write"] is False
