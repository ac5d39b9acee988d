"""Reboots keep the workflow on the Docker runtime: dockerd starts only after the NFS mounts its containers bind.

Round2 audit, finding 7: docker.service is ordered after network-online.target only, so at boot dockerd restores
dinops-train and dinops-serve while the data server's exports (nfs_client_mounts at
workloads_docker_data_dir/<claim>, docs/data.md) are still being mounted; a container bound before its mount lands
sees the empty directory underneath for ever. The fix is the docker role's drop-in, written by the workloads role's
Docker runtime (tasks/docker_host.yml, include_role docker tasks_from dropin).

The host: a systemd container of the Molecule platform image with the capabilities of molecule/docker/molecule.yml
(read from it). Its units are the ones a Docker-runtime host has: Debian 12's docker.io units (docker.service,
docker.socket, containerd.service) and binaries, bind-mounted read-only from this machine, which runs the version the
docker role pins; /etc/fstab written by ansible.posix.mount from the nfs_client role's assembled mounts (as its
mounts.yml does with nfs_client_mount_state: present); the drop-in written by running the workloads role's
docker_host.yml with the plan of the rendered CPU demo layer. Then systemd itself is asked: `systemd-analyze verify`,
the dependencies it resolved, and `systemctl start docker`, which must not start dockerd while the export cannot be
mounted (this container's kernel has no NFS client: the mount fails, as it does at boot while the data server is
down).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from k8s.k8s_render import DOCKER_VARIANTS, load_workloads_filters, render_site

from dinops_testing import REPO, load_plugin

IMAGE = os.environ.get("MOLECULE_IMAGE", "dinops-molecule:debian12")
NAME = f"dinops-mount-order-{os.getpid()}"
# Debian 12's docker.io and containerd: their units and the binaries their ExecStart= names.
DOCKER_IO = ("/lib/systemd/system/docker.service", "/lib/systemd/system/docker.socket",
             "/lib/systemd/system/containerd.service", "/usr/sbin/dockerd", "/usr/bin/containerd")  # fmt: skip
DATA_DIR = "/var/lib/dinops/volumes"
MOUNTS = [
    {"server": "10.0.1.5", "remote_path": "/srv/dinops/datasets", "path": f"{DATA_DIR}/dinops-dataset"},
    {"server": "10.0.1.5", "remote_path": "/srv/dinops/outputs", "path": f"{DATA_DIR}/dinops-output"},
]
DATASET_UNIT = r"var-lib-dinops-volumes-dinops\x2ddataset.mount"
OUTPUT_UNIT = r"var-lib-dinops-volumes-dinops\x2doutput.mount"


def _platform_flags() -> list[str]:
    """docker run flags of molecule/docker/molecule.yml's platform (Docker-in-Docker's capabilities, not privileged)."""
    (platform,) = yaml.safe_load((REPO / "molecule" / "docker" / "molecule.yml").read_text())["platforms"]
    flags = [f"--cap-add={cap}" for cap in platform["capabilities"]]
    flags += [arg for opt in platform["security_opts"] for arg in ("--security-opt", opt)]
    flags += [arg for volume in platform["volumes"] for arg in ("-v", volume)]
    flags += [arg for path in platform["tmpfs"] for arg in ("--tmpfs", path)]
    flags += ["--cgroupns", platform["cgroupns_mode"], "--stop-signal", platform["stop_signal"]]
    return flags


def _in(script: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", "exec", NAME, "bash", "-c", script], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    if check and done.returncode != 0:
        pytest.fail(f"in {NAME}: {script}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


def _show(unit: str, *properties: str) -> dict[str, str]:
    out = _in(f"systemctl show {shlex.quote(unit)} " + " ".join(f"-p {p}" for p in properties)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _names(value: str) -> list[str]:
    """A unit list of `systemctl show`: names with a backslash come double-quoted, the backslash escaped."""
    return shlex.split(value)


def _demo_plan(tmp: Path) -> dict:
    """The Docker runtime's plan of the CPU demo layer (what `make up` runs on a host without a GPU)."""
    sizing, jobs = load_workloads_filters("sizing"), load_workloads_filters("jobs")
    settings = DOCKER_VARIANTS["docker-cpu-demo"]
    plan = sizing.site_plan(settings)
    objects = jobs.prepare_objects(render_site(tmp, "docker-cpu-demo", settings), plan["apps"]["train"],
                                   plan["apps"]["download"])  # fmt: skip
    return load_workloads_filters("docker_runtime").docker_plan(objects, {"data_dir": DATA_DIR, "network": "dinops"})


def _fstab_mounts() -> list[dict]:
    """nfs_client_mounts as the nfs_client role assembles them (its defaults, a Debian 12 kernel)."""
    defaults = yaml.safe_load((REPO / "roles" / "nfs_client" / "defaults" / "main.yml").read_text())
    return load_plugin("roles/nfs_client/filter_plugins/nfs_client.py").dinops_nfs_client_mounts(
        MOUNTS, defaults["nfs_client_nfs_version"], defaults["nfs_client_mount_options"],
        defaults["nfs_client_nconnect"], "6.1.0-28-amd64")  # fmt: skip


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    missing = [path for path in DOCKER_IO if not Path(path).exists()]
    if missing:
        pytest.skip(f"this machine has no Debian docker.io to lend the host its units: {missing} missing")
    subprocess.run(["docker", "rm", "-f", NAME], capture_output=True, check=False)
    binds = [arg for path in DOCKER_IO for arg in ("-v", f"{path}:{path}:ro")]
    started = subprocess.run(["docker", "run", "-d", "--name", NAME, *_platform_flags(), *binds, IMAGE,
                              "/lib/systemd/systemd"], capture_output=True, text=True, check=False)  # fmt: skip
    assert started.returncode == 0, f"docker run {IMAGE} (make molecule-image builds it): {started.stderr}"
    try:
        for _ in range(100):
            if _in("test -S /run/systemd/private", check=False).returncode == 0:
                break
            time.sleep(0.2)
        state = _in("systemctl is-system-running --wait", check=False).stdout.split()
        assert state and state[-1] in ("running", "degraded"), f"systemd in {NAME}: {state}"
        # The roles' apt_lists dependency finds fresh lists and downloads nothing (no network needed); docker.socket's
        # SocketGroup, which docker.io's postinst creates.
        _in("touch /var/lib/apt/lists/dinops-test_Packages && groupadd --system docker")
        tmp = tmp_path_factory.mktemp("mount-order")
        plan = _demo_plan(tmp)
        play = [{
            "hosts": "all", "gather_facts": True,
            "tasks": [
                {"name": "Create the mount points (nfs_client mounts.yml)",
                 "ansible.builtin.file": {"path": "{{ item.path }}", "state": "directory", "mode": "0755"},
                 "loop": _fstab_mounts()},
                {"name": "Write the mounts to fstab (nfs_client mounts.yml, nfs_client_mount_state: present)",
                 "ansible.posix.mount": {"src": "{{ item.src }}", "path": "{{ item.path }}",
                                         "fstype": "{{ item.fstype }}", "opts": "{{ item.opts }}",
                                         "state": "present"},
                 "loop": _fstab_mounts()},
                {"name": "The Docker runtime's host part (workloads tasks/docker_host.yml)",
                 "ansible.builtin.include_role": {"name": "workloads", "tasks_from": "docker_host"},
                 "vars": {"__workloads_docker": plan}},
            ],
        }]  # fmt: skip
        # The container's own python3 runs the modules (dinops_testing.ansible_playbook would hand them this venv's).
        (tmp / "play.yml").write_text(yaml.safe_dump(play))
        (tmp / "ansible.cfg").write_text(f"[defaults]\nroles_path = {REPO / 'roles'}\n"
                                         "interpreter_python = /usr/bin/python3\n")  # fmt: skip
        result = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", f"{NAME},", "-c", "community.docker.docker",
             str(tmp / "play.yml")],
            capture_output=True, text=True, check=False, timeout=600,
            env={**os.environ, "ANSIBLE_CONFIG": str(tmp / "ansible.cfg")},
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        yield plan
    finally:
        subprocess.run(["docker", "rm", "-f", NAME], capture_output=True, check=False)


def test_the_drop_in_names_the_claims_and_the_longest_stop_timeout(host):
    dropin = _in("cat /etc/systemd/system/docker.service.d/dinops-workloads.conf").stdout
    assert (
        f"RequiresMountsFor={DATA_DIR}/dinops-dataset {DATA_DIR}/dinops-output {DATA_DIR}/dinops-prometheus-data\n"
    ) in dropin
    longest = max(c["stop_timeout"] for c in host["containers"])
    assert longest == 300 and "[Service]\nTimeoutStopSec=330\n" in dropin


def test_systemd_analyze_verify_accepts_docker_service_with_the_drop_in(host):
    verified = _in("systemd-analyze verify docker.service", check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "dinops" not in verified.stdout + verified.stderr, verified.stdout + verified.stderr


def test_dockerd_is_ordered_after_and_requires_the_nfs_mounts(host):
    docker = _show("docker.service", "After", "Requires", "TimeoutStopUSec", "DropInPaths")
    for unit in (DATASET_UNIT, OUTPUT_UNIT):
        assert unit in _names(docker["After"]) and unit in _names(docker["Requires"]), json.dumps(docker)
    assert docker["TimeoutStopUSec"] == "5min 30s"
    # The mount units are fstab's (systemd-fstab-generator), network mounts before remote-fs.target.
    dataset = _show(DATASET_UNIT, "What", "Options", "Before", "FragmentPath")
    assert dataset["What"] == "10.0.1.5:/srv/dinops/datasets" and "_netdev" in dataset["Options"]
    assert "remote-fs.target" in _names(dataset["Before"]) and dataset["FragmentPath"].startswith("/run/systemd/")


def test_dockerd_does_not_start_while_an_export_cannot_be_mounted(host):
    _in("systemctl start docker.socket")  # its other requirement, met
    started = _in("systemctl start docker.service", check=False)
    assert started.returncode != 0 and "dependency" in started.stderr.lower(), started.stderr
    # The export's mount was tried first and failed; dockerd was never run.
    assert _show(DATASET_UNIT, "ActiveState")["ActiveState"] == "failed"
    docker = _show("docker.service", "ActiveState", "ExecMainPID")
    assert docker["ExecMainPID"] == "0" and docker["ActiveState"] != "active", json.dumps(docker)
