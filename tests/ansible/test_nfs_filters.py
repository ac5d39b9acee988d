"""The NFS roles' decisions: safe export lines, firewall sources, format-once, and the client's fstab options."""

from __future__ import annotations

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from dinops_testing import REPO, load_plugin

server = load_plugin("roles/nfs_server/filter_plugins/nfs_server.py")
client = load_plugin("roles/nfs_client/filter_plugins/nfs_client.py")

SERVER_DEFAULTS = yaml.safe_load((REPO / "roles/nfs_server/defaults/main.yml").read_text())
CLIENT_DEFAULTS = yaml.safe_load((REPO / "roles/nfs_client/defaults/main.yml").read_text())
SAFE = SERVER_DEFAULTS["nfs_server_export_options"]


def lines(exports=None, clients=("10.0.0.0/24",), options=None, **kwargs):
    return server.dinops_nfs_export_lines(
        SERVER_DEFAULTS["nfs_server_exports"] if exports is None else exports,
        list(clients),
        SAFE if options is None else options,
        **kwargs,
    )


# --- exports ------------------------------------------------------------------------------------------------------


def test_default_exports_are_safe_and_restricted_to_the_clients():
    assert lines(clients=["10.0.0.0/24", "gpu-1.example.internal"]) == [
        "/srv/dinops/datasets 10.0.0.0/24(rw,sync,no_subtree_check,root_squash) "
        "gpu-1.example.internal(rw,sync,no_subtree_check,root_squash)",
        "/srv/dinops/outputs 10.0.0.0/24(rw,sync,no_subtree_check,root_squash) "
        "gpu-1.example.internal(rw,sync,no_subtree_check,root_squash)",
    ]


def test_defaults_are_root_squashed_sync_and_rw():
    assert set(SAFE) == {"rw", "sync", "no_subtree_check", "root_squash"}
    assert SERVER_DEFAULTS["nfs_server_allow_world"] is False
    assert SERVER_DEFAULTS["nfs_server_allow_no_root_squash"] is False
    assert SERVER_DEFAULTS["nfs_server_clients"] == []


def test_a_data_disk_adds_the_mountpoint_guard():
    assert lines(mountpoint="/srv/dinops")[0] == (
        "/srv/dinops/datasets 10.0.0.0/24(rw,sync,no_subtree_check,root_squash,mountpoint=/srv/dinops)"
    )


def test_an_export_may_carry_its_own_options_and_clients():
    exports = [{"path": "/srv/dinops/datasets", "options": ["ro", "sync", "root_squash"], "clients": ["10.1.0.7"]}]
    assert lines(exports) == ["/srv/dinops/datasets 10.1.0.7(ro,sync,root_squash)"]


@pytest.mark.parametrize("world", ["*", "0.0.0.0/0", "::/0", "0.0.0.0/0.0.0.0"])
def test_world_exports_are_refused_unless_asked(world):
    with pytest.raises(AnsibleFilterError, match="nfs_server_allow_world"):
        lines(clients=[world])
    assert lines(clients=[world], allow_world=True)[0].startswith(f"/srv/dinops/datasets {world}(")


def test_no_root_squash_is_refused_unless_asked():
    options = ["rw", "sync", "no_subtree_check", "no_root_squash"]
    with pytest.raises(AnsibleFilterError, match="nfs_server_allow_no_root_squash"):
        lines(options=options)
    assert "no_root_squash" in lines(options=options, allow_no_root_squash=True)[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clients": []}, "nfs_server_clients must list"),
        ({"clients": [""]}, "nfs_server_clients: each client must be a non-empty string"),
        ({"clients": ["10.0.0.0/24(rw)"]}, "neither an address"),
        ({"clients": ["host name"]}, "neither an address"),
        ({"options": []}, "nfs_server_export_options must be a non-empty list"),
        ({"options": ["rw,sync"]}, "one exports.5. option"),
        ({"options": ["rw", "fast"]}, "unknown exports.5. option 'fast'"),
        ({"options": ["rw", "anonuid="]}, "known exports.5. option with a value"),
        ({"options": ["rw", "ro"]}, "rw and ro contradict"),
        ({"options": ["rw", "sync", "async"]}, "sync and async contradict"),
        ({"options": ["sync", "root_squash"]}, "say rw or ro"),
        ({"exports": []}, "nfs_server_exports must be a non-empty list"),
        ({"exports": [{"path": "srv/data"}]}, r"nfs_server_exports\[0\].path must be a normalised absolute path"),
        ({"exports": [{"path": "/srv/a b"}]}, "without spaces"),
        ({"exports": [{"path": "/"}]}, "other than /"),
        ({"exports": [{"path": "/srv/x/../y"}]}, "normalised"),
        ({"exports": [{"path": "/srv/a"}, {"path": "/srv/a"}]}, "exported twice"),
        ({"exports": [{"path": "/srv/a", "mode": "0777"}]}, "unknown keys"),
        ({"exports": [{"path": "/srv/a", "clients": []}]}, r"nfs_server_exports\[0\].clients must list"),
        ({"exports": [{"path": "/data/x"}], "mountpoint": "/srv/dinops"}, "not under nfs_server_root"),
    ],
)
def test_bad_exports_name_the_setting(kwargs, message):
    with pytest.raises(AnsibleFilterError, match=message):
        lines(**kwargs)


# --- ufw ----------------------------------------------------------------------------------------------------------


def test_ufw_sources_are_the_networks_of_every_export():
    exports = [{"path": "/srv/a"}, {"path": "/srv/b", "clients": ["10.1.0.7", "10.0.0.0/24"]}]
    assert server.dinops_nfs_ufw_sources(["10.0.0.0/24", "fd00::/64"], exports) == [
        "10.0.0.0/24",
        "fd00::/64",
        "10.1.0.7/32",
    ]


def test_ufw_refuses_host_names():
    with pytest.raises(AnsibleFilterError, match="'gpu-1.example' is a host name or netgroup.*nfs_server_ufw: false"):
        server.dinops_nfs_ufw_sources(["gpu-1.example"])


# --- data disk: formatted once, never reformatted -----------------------------------------------------------------

EXT4 = "DEVNAME=/dev/vdb\nUUID=129d4a64-4dd2-45d7-9070-6851d8732bbb\nVERSION=1.0\nTYPE=ext4\nUSAGE=filesystem\n"


def test_an_empty_disk_is_formatted():
    assert server.dinops_nfs_disk_plan(2, "", "/dev/vdb", "ext4", True) == {"action": "format", "uuid": ""}


@pytest.mark.parametrize("head_blank", [False, None])
def test_no_signature_but_bytes_in_the_first_mib_is_refused(head_blank):
    """blkid names only what it knows: a damaged superblock reads as no signature (finding 14)."""
    with pytest.raises(AnsibleFilterError, match="first MiB is not blank.*Refusing to format.*Nothing was changed"):
        server.dinops_nfs_disk_plan(2, "", "/dev/vdb", "ext4", head_blank)


def test_a_disk_with_the_asked_filesystem_is_kept_with_its_uuid():
    plan = server.dinops_nfs_disk_plan(0, EXT4, "/dev/vdb", "ext4")
    assert plan == {"action": "keep", "uuid": "129d4a64-4dd2-45d7-9070-6851d8732bbb"}


@pytest.mark.parametrize(
    ("rc", "stdout", "message"),
    [
        (0, EXT4.replace("ext4", "xfs"), "already holds xfs.*refusing to reformat.*nfs_server_data_fstype: xfs"),
        (0, EXT4.replace("ext4", "ext2"), r"already holds ext2.*refusing to reformat it; wipe it yourself \(wipefs"),
        (0, "DEVNAME=/dev/vdb\nPTUUID=ab\nPTTYPE=gpt\n", "holds a gpt partition table"),
        (0, "DEVNAME=/dev/vdb\nTYPE=LVM2_member\nUSAGE=raid\n", "already holds LVM2_member"),
        (0, "DEVNAME=/dev/vdb\nUSAGE=other\n", "already holds an unknown signature"),
        (0, "DEVNAME=/dev/vdb\nTYPE=ext4\n", "no UUID"),
        (8, "", "several colliding signatures"),
        (4, "", "blkid -p failed with exit status 4"),
    ],
)
def test_anything_else_is_refused_and_named(rc, stdout, message):
    with pytest.raises(AnsibleFilterError, match=message) as error:
        server.dinops_nfs_disk_plan(rc, stdout, "/dev/vdb", "ext4")
    assert "nfs_server_data_device /dev/vdb" in str(error.value)


@pytest.mark.parametrize("device", ["/dev/nvme1n1", "/dev/sdb", "/dev/xvdf", "/dev/vdb", "/dev/nvme0n1p2", "/dev/sdc1"])
def test_a_kernel_disk_name_is_refused(device):
    """Finding 16: kernel names follow probe order; on Nitro /dev/nvme1n1 can be a blank instance-store disk."""
    problem = server.dinops_nfs_data_device_problem(device)
    assert f"nfs_server_data_device {device} is a kernel name" in problem and "/dev/disk/by-id/" in problem


@pytest.mark.parametrize(
    "device",
    [
        "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0",
        "/dev/disk/by-uuid/129d4a64-4dd2-45d7-9070-6851d8732bbb",
        "/dev/disk/by-path/pci-0000:00:1f.0-nvme-1",
        "/dev/mapper/data-nfs",
        "/var/lib/dinops-molecule/data.img",
        "",
    ],
)
def test_a_stable_disk_path_is_accepted(device):
    assert server.dinops_nfs_data_device_problem(device) == ""


# --- client mounts ------------------------------------------------------------------------------------------------


def client_plan(mounts, kernel="6.1.0-26-amd64", **overrides):
    settings = {
        "version": CLIENT_DEFAULTS["nfs_client_nfs_version"],
        "options": CLIENT_DEFAULTS["nfs_client_mount_options"],
        "nconnect": CLIENT_DEFAULTS["nfs_client_nconnect"],
        **overrides,
    }
    return client.dinops_nfs_client_mounts(
        mounts, settings["version"], settings["options"], settings["nconnect"], kernel
    )


DATASET = {"server": "10.0.0.5", "remote_path": "/srv/dinops/datasets", "path": "/mnt/dinops/datasets"}


def test_default_mount_options_for_large_sequential_reads():
    assert client_plan([DATASET]) == [
        {
            "server": "10.0.0.5",
            "src": "10.0.0.5:/srv/dinops/datasets",
            "path": "/mnt/dinops/datasets",
            "fstype": "nfs",
            "opts": "nfsvers=4.2,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noatime,_netdev,nconnect=4",
        }
    ]


def test_the_server_paths_the_client_mounts_by_default_are_the_exports():
    exported = {export["path"] for export in SERVER_DEFAULTS["nfs_server_exports"]}
    assert exported == {"/srv/dinops/datasets", "/srv/dinops/outputs"}


def test_extra_options_append_and_options_replace():
    assert client_plan([{**DATASET, "extra_options": ["nofail"]}])[0]["opts"].endswith("nconnect=4,nofail")
    assert client_plan([{**DATASET, "options": ["nfsvers=4.1", "soft"]}])[0]["opts"] == "nfsvers=4.1,soft"


def test_ipv6_servers_are_bracketed_and_nconnect_1_is_left_out():
    plan = client_plan([{**DATASET, "server": "fd00::5"}], nconnect=1, version="4.1")
    assert plan[0]["src"] == "[fd00::5]:/srv/dinops/datasets"
    assert plan[0]["server"] == "fd00::5"
    assert plan[0]["opts"].startswith("nfsvers=4.1,") and "nconnect" not in plan[0]["opts"]


def test_no_mounts_is_nothing_to_do():
    assert client_plan([]) == []


def test_nconnect_needs_linux_5_3():
    assert "nconnect=4" in client_plan([DATASET], kernel="5.3.0")[0]["opts"]
    with pytest.raises(AnsibleFilterError, match="nconnect needs Linux 5.3.*4.19.0-27-amd64.*nfs_client_nconnect: 1"):
        client_plan([DATASET], kernel="4.19.0-27-amd64")
    assert "nconnect" not in client_plan([DATASET], kernel="4.19.0-27-amd64", nconnect=1)[0]["opts"]


@pytest.mark.parametrize(
    ("mounts", "overrides", "message"),
    [
        ("x", {}, "nfs_client_mounts must be a list"),
        ([{**DATASET, "server": ""}], {}, r"nfs_client_mounts\[0\].server must be"),
        ([{**DATASET, "server": "nfs server"}], {}, "neither a host name nor an address"),
        ([{**DATASET, "remote_path": "srv"}], {}, r"nfs_client_mounts\[0\].remote_path must be"),
        ([{**DATASET, "path": "/mnt/a b"}], {}, r"nfs_client_mounts\[0\].path must be"),
        ([DATASET, DATASET], {}, "mounted twice"),
        ([{**DATASET, "opts": "x"}], {}, "unknown keys"),
        ([{**DATASET, "options": ["hard"], "extra_options": ["nofail"]}], {}, "not both"),
        ([{**DATASET, "extra_options": ["hard"]}], {}, "option hard is given twice"),
        ([{**DATASET, "extra_options": ["a,b"]}], {}, "not one mount option"),
        ([DATASET], {"version": "3.5"}, "nfs_client_nfs_version must be one of"),
        ([DATASET], {"nconnect": 17}, "nfs_client_nconnect must be 1 to 16"),
        ([DATASET], {"nconnect": "many"}, "nfs_client_nconnect must be a number"),
    ],
)
def test_bad_mounts_name_the_setting(mounts, overrides, message):
    with pytest.raises(AnsibleFilterError, match=message):
        client_plan(mounts, **overrides)


# --- argument specs and defaults agree ----------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["nfs_server", "nfs_client"])
def test_every_default_is_documented_with_the_same_value(role):
    defaults = yaml.safe_load((REPO / f"roles/{role}/defaults/main.yml").read_text())
    spec = yaml.safe_load((REPO / f"roles/{role}/meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    for name, option in options.items():
        assert option.get("default") == defaults[name], name
        if "choices" in option:
            chosen = defaults[name] if isinstance(defaults[name], list) else [defaults[name]]
            assert set(chosen) <= set(option["choices"]), name


# --- rpcbind and rpc-statd on NFSv4-only hosts (issue 26, item 4) ---------------------------------------------------
RPC_UNITS = ["rpcbind.socket", "rpcbind.service", "rpc-statd.service"]


@pytest.mark.parametrize("versions", [["4.1", "4.2"], ["4"], ["4.0", "4.2"], [4.2]])
def test_nfsv4_only_masks_rpcbind_and_statd(versions):
    assert server.dinops_nfs_rpc_units(versions) == RPC_UNITS


@pytest.mark.parametrize("versions", [["3", "4.2"], ["3"], [3], []])
def test_nfsv3_or_nothing_known_keeps_them(versions):
    assert server.dinops_nfs_rpc_units(versions) == []


def test_the_server_default_is_v4_only():
    assert server.dinops_nfs_rpc_units(SERVER_DEFAULTS["nfs_server_versions"]) == RPC_UNITS


def test_client_versions_are_the_role_version_and_each_mounts_nfsvers():
    mounts = [
        {"options": ["rw", "nfsvers=4.1", "hard"]},
        {"options": ["vers=3", "hard"]},
        {"options": ["hard"]},
    ]
    assert client.dinops_nfs_client_versions(mounts, "4.2") == ["4.2", "4.1", "3"]
    assert server.dinops_nfs_rpc_units(client.dinops_nfs_client_versions(mounts, "4.2")) == []
    assert server.dinops_nfs_rpc_units(client.dinops_nfs_client_versions(mounts[:1], "4.2")) == RPC_UNITS
    assert client.dinops_nfs_client_versions([], CLIENT_DEFAULTS["nfs_client_nfs_version"]) == ["4.2"]
