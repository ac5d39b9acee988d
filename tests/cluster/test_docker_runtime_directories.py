"""The Docker runtime's claim directories on a root-squashed NFS export (round2 audit, finding 8).

docs/data.md mounts the data server's exports at workloads_docker_data_dir/<claim>; the nfs_server role creates them
owned 10001:10001, mode 0775, exported root_squash. The workloads role used to set every claim directory to
10001:10001 02775 as root: the mode differs, so the file module called chmod, which the server refuses to the squashed
root (EPERM, chmod(2)), and the Docker runtime never started. The decision is now
filter_plugins/docker_state.py's docker_directory_actions; tasks/docker_host.yml runs it.

The play at the end runs tasks/docker_host.yml for real on this machine, with a directory that root cannot chmod
(chattr +i: EPERM for root too, the errno a root-squashed server answers) standing in for the export.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from k8s.k8s_render import load_workloads_filters

from dinops_testing import REPO

STATE = load_workloads_filters("docker_state")
TASKS = REPO / "roles" / "workloads" / "tasks"
OUTPUT = "/var/lib/dinops/volumes/dinops-output"
DATASET = "/var/lib/dinops/volumes/dinops-dataset"
WANTED = [{"path": DATASET, "owner": 10001, "group": 10001, "mode": "02775"},
          {"path": OUTPUT, "owner": 10001, "group": 10001, "mode": "02775"}]  # fmt: skip
# ansible_facts['mounts'] of a host with the two exports mounted (setup's mount facts, trimmed), and the root disk.
NFS_MOUNTS = [
    {"mount": "/", "device": "/dev/nvme0n1p1", "fstype": "ext4"},
    {"mount": DATASET, "device": "10.0.1.5:/srv/dinops/datasets", "fstype": "nfs4"},
    {"mount": OUTPUT, "device": "10.0.1.5:/srv/dinops/outputs", "fstype": "nfs4"},
]


def _stat(exists=True, uid=10001, gid=10001, mode="0775", isdir=True) -> dict:
    """An ansible.builtin.stat result (its `stat`, trimmed: mode is the octal string the module returns)."""
    return {
        "stat": {"exists": True, "isdir": isdir, "uid": uid, "gid": gid, "mode": mode} if exists else {"exists": False}
    }


def test_an_export_as_nfs_server_creates_it_is_left_alone():
    """10001:10001 0775 (nfs_server's owner and nfs_server_export_mode): no chown, no chmod, nothing to do."""
    actions = STATE.docker_directory_actions(WANTED, [_stat(), _stat(mode="2775")], NFS_MOUNTS)
    assert actions == {"manage": [], "refused": []}


def test_local_directories_missing_or_wrong_are_created_or_corrected():
    actions = STATE.docker_directory_actions(WANTED, [_stat(exists=False), _stat(uid=0, gid=0, mode="0755")],
                                              NFS_MOUNTS[:1])  # fmt: skip
    assert actions == {"manage": WANTED, "refused": []}


@pytest.mark.parametrize(
    ("found", "said"),
    [
        (_stat(exists=False), "does not exist"),
        (_stat(uid=65534, gid=65534, mode="0755"), "is owned 65534:65534 with mode 0755"),
        (_stat(mode="0755"), "is owned 10001:10001 with mode 0755"),
    ],
)
def test_a_wrong_directory_on_nfs_is_refused_with_what_to_run_on_the_data_server(found, said):
    actions = STATE.docker_directory_actions(WANTED[1:], [found], NFS_MOUNTS)
    assert actions["manage"] == []
    (message,) = actions["refused"]
    assert message.startswith(f"{OUTPUT} {said} on the NFS mount 10.0.1.5:/srv/dinops/outputs at {OUTPUT}")
    assert "install -d -o 10001 -g 10001 -m 2775 <the exported directory>" in message


def test_a_claim_below_an_nfs_mount_is_on_nfs_too():
    mounts = [{"mount": "/var/lib/dinops", "device": "nas:/dinops", "fstype": "nfs"}]
    actions = STATE.docker_directory_actions(WANTED[:1], [_stat(exists=False)], mounts)
    assert "on the NFS mount nas:/dinops at /var/lib/dinops" in actions["refused"][0]
    # A neighbour whose name only starts the same is not below it.
    mounts = [{"mount": "/var/lib/dino", "device": "nas:/x", "fstype": "nfs"}]
    assert STATE.docker_directory_actions(WANTED[:1], [_stat(exists=False)], mounts)["manage"] == WANTED[:1]


def test_a_file_where_the_directory_belongs_is_refused():
    actions = STATE.docker_directory_actions(WANTED[:1], [_stat(isdir=False, mode="0644")], NFS_MOUNTS[:1])
    assert actions["refused"] == [f"{DATASET} exists and is not a directory: move it away; the containers mount a "
                                  "directory there"]  # fmt: skip


def test_one_stat_per_directory():
    with pytest.raises(STATE.DockerRuntimeError, match="one stat result per directory"):
        STATE.docker_directory_actions(WANTED, [_stat()], NFS_MOUNTS)


# --- tasks/docker_host.yml for real ---------------------------------------------------------------------------------


def _run_docker_host(tmp: Path, export: Path, mounts: list[dict]) -> subprocess.CompletedProcess:
    """The role's docker_host.yml on this machine (as root), with the mount facts given; the docker role's drop-in
    is left out (service_mgr none: it is tested in a systemd container, test_docker_mount_order.py)."""
    plan = {"directories": [{"path": str(export), "owner": 10001, "group": 10001, "mode": "02775"}],
            "service": {"requires_mounts_for": [str(export)], "timeout_stop_s": 330}}  # fmt: skip
    play = [{"hosts": "localhost", "gather_facts": False,
             "vars": {"ansible_facts": {"service_mgr": "none", "mounts": mounts}, "__workloads_docker": plan},
             "tasks": [{"ansible.builtin.include_tasks": str(TASKS / "docker_host.yml")}]}]  # fmt: skip
    (tmp / "play.yml").write_text(yaml.safe_dump(play))
    plugins = REPO / "roles" / "workloads" / "filter_plugins"
    (tmp / "ansible.cfg").write_text(
        f"[defaults]\nstdout_callback = ansible.builtin.default\nfilter_plugins = {plugins}\n"
    )
    playbook = Path(sys.executable).parent / "ansible-playbook"
    return subprocess.run(
        [str(playbook), "-i", "localhost,", "-c", "local", str(tmp / "play.yml"),
         "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "ANSIBLE_CONFIG": str(tmp / "ansible.cfg")},
    )  # fmt: skip


@pytest.fixture
def squashed_export(tmp_path):
    """A directory as nfs_server creates an export (10001:10001 0775) that root cannot chmod (chattr +i)."""
    if os.geteuid() != 0 or not shutil.which("chattr"):
        pytest.skip("needs root and chattr(1) to make a directory root cannot chmod")
    export = tmp_path / "dinops-output"
    export.mkdir()
    os.chown(export, 10001, 10001)
    export.chmod(0o775)
    made = subprocess.run(["chattr", "+i", str(export)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"this filesystem has no immutable flag: {made.stderr.strip()}")
    probe = subprocess.run(["chmod", "2775", str(export)], capture_output=True, text=True, check=False)
    assert probe.returncode != 0 and "Operation not permitted" in probe.stderr  # root's chmod fails, as on the export
    try:
        yield export
    finally:
        subprocess.run(["chattr", "-i", str(export)], check=False)


def test_the_role_leaves_a_right_export_alone_where_roots_chmod_fails(tmp_path, squashed_export):
    mounts = [{"mount": str(squashed_export), "device": "10.0.1.5:/srv/dinops/outputs", "fstype": "nfs4"}]
    result = _run_docker_host(tmp_path, squashed_export, mounts)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Operation not permitted" not in result.stdout
    assert oct(squashed_export.stat().st_mode & 0o7777) == "0o775"


def test_the_role_stops_with_the_data_servers_command_for_a_wrong_export(tmp_path, squashed_export):
    subprocess.run(["chattr", "-i", str(squashed_export)], check=True)
    os.chown(squashed_export, 65534, 65534)
    subprocess.run(["chattr", "+i", str(squashed_export)], check=True)
    mounts = [{"mount": str(squashed_export), "device": "10.0.1.5:/srv/dinops/outputs", "fstype": "nfs4"}]
    result = _run_docker_host(tmp_path, squashed_export, mounts)
    assert result.returncode != 0
    assert "Stop when a directory on NFS is missing or not the containers'" in result.stdout
    assert "is owned 65534:65534 with mode 0775 on the NFS mount 10.0.1.5:/srv/dinops/outputs" in result.stdout
    assert "Operation not permitted" not in result.stdout  # refused before any chown or chmod was tried
