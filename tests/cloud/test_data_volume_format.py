"""A data disk is formatted only when it is provably new (audit round 2, finding 14).

blkid names only the signatures it knows: an ext4 whose primary superblock is damaged, or data written without any
filesystem, reads as "no signature" (exit 2), and community.general.filesystem then runs `mkfs.ext4 -F`. Here the
roles' own tasks run on disk images (regular files: blkid, cmp and mkfs take them as they take block devices) with
the fstab redirected into the test's folder: a disk that holds anything is refused with a message and left
byte-for-byte as it was; an all-zero disk is formatted once and kept on the next run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dinops_testing import REPO, ansible_playbook

MIB = 1024 * 1024
# The entry points that format a data disk: the data stage's NFS server, and cloud_up on every machine it launches.
ENTRIES = {
    "nfs_server": ("nfs_server", "disk.yml", "nfs_server_data_device"),
    "cloud_aws": ("cloud_aws", "data_volume.yml", "cloud_aws_data_device"),
}


def _tool(name: str) -> str:
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.path.exists(p)), None)
    if path is None:
        pytest.fail(f"{name} is not installed (util-linux, e2fsprogs, diffutils): the disk tests need it")
    return path


def blkid(image: Path) -> int:
    return subprocess.run([_tool("blkid"), "-p", str(image)], capture_output=True, check=False).returncode


def fs_uuid(image: Path) -> str:
    command = [_tool("blkid"), "-p", "-o", "value", "-s", "UUID", str(image)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def damaged_ext4(image: Path) -> None:
    """An ext4 filesystem whose primary superblock (bytes 1024-2047) was overwritten with zeros: fsck -b can still
    recover it from a backup superblock."""
    subprocess.run([_tool("mkfs.ext4"), "-q", "-F", str(image)], check=True)
    with open(image, "r+b") as fh:
        fh.seek(1024)
        fh.write(bytes(1024))


def data_without_signature(image: Path) -> None:
    with open(image, "r+b") as fh:
        fh.write(hashlib.sha256(b"someone's data").digest() * 128)


def play(tmp_path: Path, entry: str, image: Path) -> list:
    role, tasks, device_var = ENTRIES[entry]
    variables = {device_var: str(image)}
    if role == "nfs_server":
        variables |= {
            "nfs_server_root": str(tmp_path / "mnt"),
            "nfs_server_data_mount_state": "present",
            "nfs_server_data_mount_options": ["defaults"],
        }
    else:
        variables |= {
            "cloud_aws_data_mount_path": str(tmp_path / "mnt"),
            "cloud_aws_data_mount_state": "present",
        }
    return [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            # Never this machine's fstab: the mount tasks write into the test's folder.
            "module_defaults": {"ansible.posix.mount": {"fstab": str(tmp_path / "fstab")}},
            # The role's defaults and its task file, without its dependencies (apt_lists would update this
            # machine's package lists); its filters come from the config below.
            "vars_files": [str(REPO / "roles" / role / "defaults" / "main.yml")],
            "tasks": [
                {
                    "name": "Run the tasks that format the data disk",
                    "ansible.builtin.include_tasks": str(REPO / "roles" / role / "tasks" / tasks),
                    "vars": variables,
                }
            ],
        }
    ]


def run(tmp_path: Path, entry: str, image: Path):
    filters = ":".join(str(REPO / "roles" / role / "filter_plugins") for role, _, _ in ENTRIES.values())
    return ansible_playbook(tmp_path, play(tmp_path, entry, image), config=f"filter_plugins = {filters}\n")


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (damaged_ext4, "no signature blkid knows, but its first MiB is not blank"),
        (data_without_signature, "no signature blkid knows, but its first MiB is not blank"),
    ],
    ids=["ext4 with a damaged superblock", "data without a signature"],
)
def test_a_disk_blkid_cannot_name_is_refused_and_left_as_it_was(tmp_path, entry, damage, message):
    image = tmp_path / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate(16 * MIB)
    damage(image)
    assert blkid(image) == 2, "precondition: blkid -p finds no signature"
    before = sha256(image)
    result = run(tmp_path, entry, image)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert message in output and "Nothing was changed" in output, output[-3000:]
    assert ENTRIES[entry][2] in output, output[-3000:]
    assert sha256(image) == before, "the disk was written to"
    assert not (tmp_path / "fstab").exists()


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_blank_disk_is_formatted_once_then_kept(tmp_path, entry):
    image = tmp_path / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate(16 * MIB)
    first = run(tmp_path, entry, image)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    assert blkid(image) == 0
    uuid = fs_uuid(image)
    formatted = sha256(image)
    fstab = (tmp_path / "fstab").read_text()
    assert str(tmp_path / "mnt") in fstab and "ext4" in fstab, fstab
    if entry == "cloud_aws":
        # nofail alone drops the ordering before local-fs.target: the services that keep data there wait for it
        # (finding 15; systemd.mount(5)).
        fields = next(line.split() for line in fstab.splitlines() if str(tmp_path / "mnt") in line)
        assert fields[0] == str(image)
        assert {"nofail", "x-systemd.before=docker.service", "x-systemd.before=nfs-server.service"} <= set(
            fields[3].split(",")
        ), fields
    second = run(tmp_path, entry, image)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert sha256(image) == formatted and (tmp_path / "fstab").read_text() == fstab
    assert fs_uuid(image) == uuid
