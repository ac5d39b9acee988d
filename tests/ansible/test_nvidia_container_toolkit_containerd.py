"""The containerd drop-in: written only where containerd reads it and merges it key by key (2.0+), with runc's options.

Inputs are real `containerd --version` lines (Docker's containerd.io, upstream 2.x, Ubuntu and Debian packages) and
config.toml files as Docker's containerd.io ships it and as kubeadm guides write it (`containerd config default`
plus SystemdCgroup = true).
"""

from __future__ import annotations

import pytest
import tomllib
from ansible.errors import AnsibleFilterError

from dinops_testing import load_plugin

plugin = load_plugin("roles/nvidia_container_toolkit/filter_plugins/containerd_dropin.py")
dropin = plugin.dinops_containerd_nvidia_dropin
containerd_major = plugin.containerd_major

CONFIG = "/etc/containerd/config.toml"
DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
RUNTIME = "/usr/bin/nvidia-container-runtime"
DOCKER_CONTAINERD_1_7 = "containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da"
UPSTREAM_2_1 = "containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7193e4e490e9fbdc236c0e811ccaba3376"
UPSTREAM_2_0 = "containerd github.com/containerd/containerd/v2 v2.0.3 06b99ca80cdbfbc6cc8bd567021738c9af2b36ce"

# Docker's containerd.io package: the CRI plugin is off (dockerd does not need it).
DOCKER_CONFIG = """#   Copyright 2018-2022 Docker Inc.

#   Licensed under the Apache License, Version 2.0 (the "License");

disabled_plugins = ["cri"]

#root = "/var/lib/containerd"
#state = "/run/containerd"
#subreaper = true
#oom_score = 0
"""

# containerd 2.x, config version 3, the drop-in directory imported, runc with the systemd cgroup driver.
CONFIG_V3 = """version = 3
imports = ['/etc/containerd/conf.d/*.toml']

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

  [plugins.'io.containerd.cri.v1.runtime']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          runtime_path = ''
          pod_annotations = []
          privileged_without_host_devices = false
          sandboxer = 'podsandbox'

          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            BinaryName = ''
            Root = ''
            ShimCgroup = ''
            SystemdCgroup = true
"""

# containerd 1.7 as kubeadm guides set it up (config version 2), with a user-added conf.d import.
CONFIG_V2 = """version = 2
imports = ["/etc/containerd/conf.d/*.toml"]

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
"""


def plan(config_text, version_output=UPSTREAM_2_1, dropin_path=DROPIN):
    return dropin(config_text, version_output, CONFIG, dropin_path, RUNTIME)


@pytest.mark.parametrize(
    ("output", "major"),
    [
        (DOCKER_CONTAINERD_1_7, 1),
        (UPSTREAM_2_1, 2),
        ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1", 1),
        ("containerd github.com/containerd/containerd 1.7.24", 1),
        ("containerd github.com/containerd/containerd/v2 v2.2.0 1c4457e00facac03ce1d75f7b6777a7a851e5c41\n", 2),
        ("", None),
        ("bash: containerd: command not found", None),
    ],
)
def test_containerd_major_version(output, major):
    assert containerd_major(output) == major


def test_no_config_toml_means_no_import_and_no_drop_in():
    result = plan("")
    assert (result["write"], result["imported"]) == (False, False)
    assert result["reason"].startswith("no /etc/containerd/config.toml")


def test_dockers_containerd_has_no_cri_plugin_to_register_with():
    result = plan(DOCKER_CONFIG, DOCKER_CONTAINERD_1_7)
    assert (result["write"], result["imported"]) == (False, False)
    assert "CRI plugin is disabled" in result["reason"]


def test_containerd_1x_would_lose_its_cri_settings_so_no_drop_in():
    result = plan(CONFIG_V2, DOCKER_CONTAINERD_1_7)
    assert (result["write"], result["imported"]) == (False, True)
    assert "containerd#5837" in result["reason"]
    assert "nvidia-ctk runtime configure --runtime=containerd" in result["reason"]


def test_unreadable_version_is_not_taken_for_2x():
    result = plan(CONFIG_V3, "")
    assert (result["write"], result["imported"]) == (False, True)


def test_containerd_2_config_v3_gets_runcs_options_with_systemd_cgroup():
    result = plan(CONFIG_V3)
    assert (result["write"], result["imported"]) == (True, True)
    written = tomllib.loads(result["content"])
    assert written == {
        "version": 3,
        "plugins": {
            "io.containerd.cri.v1.runtime": {
                "containerd": {
                    "runtimes": {
                        "nvidia": {
                            "runtime_type": "io.containerd.runc.v2",
                            "runtime_path": "",
                            "pod_annotations": [],
                            "privileged_without_host_devices": False,
                            "sandboxer": "podsandbox",
                            "options": {"BinaryName": RUNTIME, "Root": "", "ShimCgroup": "", "SystemdCgroup": True},
                        }
                    }
                }
            }
        },
    }
    assert result["content"].startswith(
        'version = 3\n\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
    )


def test_containerd_2_with_a_version_2_config_uses_the_grpc_cri_plugin():
    written = tomllib.loads(plan(CONFIG_V2, UPSTREAM_2_0)["content"])
    assert written["version"] == 2
    assert written["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"SystemdCgroup": True, "BinaryName": RUNTIME},
    }


def test_the_default_runtime_is_copied_before_runc():
    config = CONFIG_V3.replace("default_runtime_name = 'runc'", "default_runtime_name = 'crun'") + (
        "        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crun]\n"
        "          runtime_type = 'io.containerd.runc.v2'\n"
        "          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crun.options]\n"
        "            BinaryName = '/usr/bin/crun'\n"
    )
    result = plan(config)
    runtime = tomllib.loads(result["content"])["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert runtime["nvidia"] == {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": RUNTIME}}
    assert "runtime 'crun'" in result["reason"]


def test_without_any_runtime_table_the_runc_shim_is_used():
    result = plan("version = 3\nimports = ['/etc/containerd/conf.d/*.toml']\n")
    runtime = tomllib.loads(result["content"])["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert runtime == {"nvidia": {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": RUNTIME}}}


@pytest.mark.parametrize(
    ("imports", "imported"),
    [
        ("['conf.d/*.toml']", True),
        ("['/etc/containerd/conf.d/99-nvidia.toml']", True),
        ("['/etc/containerd/other.d/*.toml']", False),
        ("['/etc/containerd/*.toml']", False),
        ("[]", False),
    ],
)
def test_only_an_import_that_names_the_drop_in_counts(imports, imported):
    result = plan(f"version = 3\nimports = {imports}\n")
    assert result["imported"] is imported
    assert result["write"] is imported


def test_a_config_version_the_drop_in_cannot_match_is_left_alone():
    result = plan("imports = ['/etc/containerd/conf.d/*.toml']\n")
    assert (result["write"], result["imported"]) == (False, True)
    assert "config version None" in result["reason"]


def test_invalid_toml_is_reported_not_written_over():
    result = plan("version = 3\n[plugins\n")
    assert (result["write"], result["imported"]) == (False, False)
    assert "is not valid TOML" in result["reason"]


def test_paths_are_required():
    with pytest.raises(AnsibleFilterError, match="paths"):
        dropin(CONFIG_V3, UPSTREAM_2_1, CONFIG, "", RUNTIME)
