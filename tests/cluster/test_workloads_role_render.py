"""The workloads role's render step, run for real by ansible-playbook on this machine (no cluster needed).

It proves the wiring between the inventory's variables, the GPU profile and the filter plugin: the generated
layer on disk, the objects the role would apply, and a second run that changes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dinops_testing import changed_tasks

REPO = Path(__file__).resolve().parents[2]
# The example inventory's shape (inventories/example/group_vars/rtx3090.yml), with values of the test's own.
PROFILE = {
    "train_batch_size": 4,
    "inference_batch_size": 3,
    "amp": True,
    "shm_size": "8G",
    "data_loader_workers": 6,
    "host_vcpus": 16,
    "host_memory_gb": 64,
    "gpu_count": 1,
    "workloads": ["train", "inference", "client"],
}


def run_playbook(tmp: Path, extra: dict) -> subprocess.CompletedProcess:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH; the role renders with `kubectl kustomize`")
    play = [
        {
            "name": "Render the workloads without a cluster",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {
                "ansible_python_interpreter": sys.executable,
                "ansible_local": {"dinops": {"gpu_count": 1}},
                "dinops_cluster": "k3s",
                "gpu_profile": PROFILE,
                "workloads_cluster_enabled": False,
                "workloads_build_dir": str(tmp / "build"),
                "workloads_images_file": str(tmp / "images.json"),
                "workloads_kustomize_command": [kubectl, "kustomize"],
                **extra,
            },
            "roles": ["workloads"],
            "post_tasks": [
                {
                    "name": "Keep the objects the role would apply",
                    "ansible.builtin.copy": {
                        "content": "{{ __workloads_objects | to_json }}",
                        "dest": str(tmp / "objects.json"),
                        "mode": "0644",
                    },
                }
            ],
        }
    ]
    playbook = tmp / "render.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    # A configuration of its own: the repository's adds timing callbacks that would mix with the JSON report.
    config = tmp / "ansible.cfg"
    config.write_text(f"[defaults]\nroles_path = {REPO / 'roles'}\nstdout_callback = ansible.builtin.json\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(config)}
    bin_dir = Path(sys.executable).parent
    return subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", "localhost,", str(playbook)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
        timeout=300,
    )


@pytest.fixture(scope="module")
def rendered_by_the_role(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workloads-role")
    first = run_playbook(tmp, {"dinops_train": True, "dinops_image_tag": "0.2.0-abc"})
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    objects = json.loads((tmp / "objects.json").read_text())
    second = run_playbook(tmp, {"dinops_train": True, "dinops_image_tag": "0.2.0-abc"})
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    return tmp, objects, changed_tasks(second)


def test_the_generated_layer_carries_the_profile(rendered_by_the_role):
    tmp, _, _ = rendered_by_the_role
    layer = yaml.safe_load((tmp / "build" / "kustomization.yaml").read_text())
    k8s_root = os.path.relpath(REPO / "k8s", tmp / "build")
    assert layer["resources"] == [f"{k8s_root}/overlays/k3s-gpu"]
    # Prometheus (workloads_monitoring, on by default) and, on this GPU k3s cluster, NVIDIA's DCGM exporter placed on
    # the GPU nodes.
    assert layer["components"] == [f"{k8s_root}/components/{c}" for c in (
        "serve-on-cpu", "monitoring", "dcgm-exporter", "dcgm-exporter/k3s")]  # fmt: skip
    train = next(g for g in layer["configMapGenerator"] if g["name"] == "dinops-train-config")
    assert train["literals"] == ["DINO_AMP=bf16", "DINO_BATCH_SIZE=4", "DINO_NUM_WORKERS=6"]
    serve = next(g for g in layer["configMapGenerator"] if g["name"] == "dinops-serve-config")
    assert serve["literals"] == ["DINO_BATCH_MAX_SIZE=3"]
    assert {i["name"]: i["newTag"] for i in layer["images"]} == dict.fromkeys(
        ("dinops-download", "dinops-train", "dinops-serve", "dinops-client", "dinops-prometheus"), "0.2.0-abc"
    ) | {"nvcr.io/nvidia/k8s/dcgm-exporter": "4.5.3-4.8.2-distroless"}  # workloads_dcgm_exporter_image's default


def test_the_objects_to_apply_follow_the_profile(rendered_by_the_role):
    _, objects, _ = rendered_by_the_role
    train = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] == "dinops-train")
    shm = next(v for v in train["spec"]["template"]["spec"]["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8G"}
    assert train["metadata"]["annotations"]["dinops.io/template-sha256"]
    assert train["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


def test_a_second_run_changes_nothing(rendered_by_the_role):
    _, _, changed = rendered_by_the_role
    assert changed == []


def test_without_training_the_jobs_follow_the_profile(tmp_path):
    """An inference host (no download in its workloads) that does not train gets no Job at all; the images are
    the ones the images stage recorded on the host."""
    stage = {
        "serve": "dinops-serve:0.1.0-aaaa",
        "client": "dinops-client:0.1.0-bbbb",
        "prometheus": "dinops-prometheus:0.1.0-cccc",
        "gpu-check": "dinops-gpu-check:c",
    }
    (tmp_path / "images.json").write_text(json.dumps(stage))
    result = run_playbook(tmp_path, {"dinops_train": False})
    assert result.returncode == 0, result.stdout[-4000:]
    objects = json.loads((tmp_path / "objects.json").read_text())
    assert [o for o in objects if o["kind"] == "Job"] == []
    images = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]["image"]
        for o in objects
        if o["kind"] == "Deployment"
    }
    assert images == {"dinops-serve": "dinops-serve:0.1.0-aaaa", "dinops-client": "dinops-client:0.1.0-bbbb",
                      "dinops-prometheus": "dinops-prometheus:0.1.0-cccc"}  # fmt: skip


def test_a_bad_profile_value_stops_the_run_with_the_variable_named(tmp_path):
    result = run_playbook(tmp_path, {"workloads_shm_size": "lots"})
    assert result.returncode != 0
    assert "workloads_shm_size must be a quantity like 8Gi, got 'lots'" in result.stdout


def test_training_asked_on_a_profile_that_does_not_train_is_reported_and_not_applied(tmp_path):
    """dinops_train on an inference profile: the role says why nothing trains, and applies serve and client only."""
    profile = {**PROFILE, "name": "infer", "workloads": ["inference", "client"]}
    result = run_playbook(tmp_path, {"dinops_train": True, "gpu_profile": profile})
    assert result.returncode == 0, result.stdout[-4000:]
    assert "dinops_train is true but profile infer lists no train" in result.stdout
    objects = json.loads((tmp_path / "objects.json").read_text())
    names = sorted(o["metadata"]["name"] for o in objects if o["kind"] in ("Job", "Deployment"))
    assert names == ["dinops-client", "dinops-prometheus", "dinops-serve"]


def test_requests_are_sized_from_the_host_and_a_host_too_small_is_refused(tmp_path):
    layer_dir = tmp_path / "fits"
    layer_dir.mkdir()
    result = run_playbook(layer_dir, {"dinops_train": True, "dinops_cluster": "minikube"})
    assert result.returncode == 0, result.stdout[-4000:]
    objects = json.loads((layer_dir / "objects.json").read_text())
    train = next(o for o in objects if o["metadata"]["name"] == "dinops-train")
    # 16 vCPU -> minikube --cpus 15: training gets its whole wish of 2 CPUs for its one GPU.
    assert train["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2000m"
    small = {**PROFILE, "name": "tiny", "host_vcpus": 2, "host_memory_gb": 4}
    refused = run_playbook(tmp_path, {"dinops_train": True, "dinops_cluster": "minikube", "gpu_profile": small})
    assert refused.returncode != 0
    assert "profile tiny: download, client, prometheus, serve, train cannot all fit on its node" in refused.stdout


def test_monitoring_off_renders_no_prometheus_and_a_bad_retention_names_its_variable(tmp_path):
    """workloads_monitoring false: no Prometheus, its Services, claim or policies, no DCGM exporter; a retention that
    is not a Prometheus duration stops the run naming the variable."""
    off = tmp_path / "off"
    off.mkdir()
    result = run_playbook(off, {"dinops_train": True, "workloads_monitoring": False})
    assert result.returncode == 0, result.stdout[-4000:]
    objects = json.loads((off / "objects.json").read_text())
    names = {o["metadata"]["name"] for o in objects}
    assert not {n for n in names if "prometheus" in n or "metrics" in n or "dcgm" in n}, sorted(names)
    assert "dinops-train" in names
    bad = run_playbook(tmp_path, {"workloads_prometheus_retention_time": "two weeks"})
    assert bad.returncode != 0
    assert "workloads_prometheus_retention_time must be a Prometheus duration" in bad.stdout
