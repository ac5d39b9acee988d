"""The preflight role's GPU knowledge: lspci parsing, the table of common cloud GPUs, the architecture fallback."""

from __future__ import annotations

import pytest
import yaml

from dinops_testing import REPO, load_plugin

gpu = load_plugin("roles/preflight/filter_plugins/dinops_gpu.py")
CONTRACT = yaml.safe_load((REPO / "facts/nvidia.yml").read_text())
TABLE = CONTRACT["gpus"]

# Real `lspci -nn` lines as cloud VMs print them.
LSPCI_AWS_G4DN = """\
00:00.0 Host bridge [0600]: Intel Corporation 440FX - 82441FX PMC [Natoma] [8086:1237]
00:01.0 ISA bridge [0601]: Intel Corporation 82371SB PIIX3 ISA [Natoma/Triton II] [8086:7000]
00:03.0 VGA compatible controller [0300]: Amazon.com, Inc. Device [1d0f:1111]
00:1e.0 3D controller [0302]: NVIDIA Corporation TU104GL [Tesla T4] [10de:1eb8] (rev a1)
"""
LSPCI_DESKTOP_3090 = """\
01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GA102 [GeForce RTX 3090] [10de:2204] (rev a1)
01:00.1 Audio device [0403]: NVIDIA Corporation GA102 High Definition Audio Controller [10de:1aef] (rev a1)
"""
LSPCI_8X_H100 = "".join(
    f"{bus:02x}:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)\n"
    for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
)


def test_t4_on_aws_is_found_and_the_amazon_vga_is_not():
    (found,) = gpu.parse_lspci(LSPCI_AWS_G4DN, TABLE)
    assert found == {
        "pci_id": "10de:1eb8",
        "pci_slot": "00:1e.0",
        "name": "Tesla T4",
        "memory_gb": 16,
        "compute_capability": "7.5",
        "architecture": "turing",
        "datacenter": True,
        "known": True,
    }


def test_nvidia_audio_function_is_not_a_gpu():
    gpus = gpu.parse_lspci(LSPCI_DESKTOP_3090, TABLE)
    assert [g["pci_id"] for g in gpus] == ["10de:2204"]
    assert gpus[0]["memory_gb"] == 24 and gpus[0]["compute_capability"] == "8.6"


def test_eight_gpus_in_bus_order():
    gpus = gpu.parse_lspci(LSPCI_8X_H100, TABLE)
    assert len(gpus) == 8
    assert [g["pci_slot"] for g in gpus][:2] == ["18:00.0", "2a:00.0"]
    assert {g["architecture"] for g in gpus} == {"hopper"}


def test_no_gpu_and_empty_output():
    assert gpu.parse_lspci("") == []
    assert gpu.parse_lspci("00:00.0 Host bridge [0600]: Intel Corporation 440FX [8086:1237]\n") == []


@pytest.mark.parametrize(
    ("pci_id", "name", "memory_gb", "cc", "arch"),
    [
        ("10de:1eb8", "Tesla T4", 16, "7.5", "turing"),
        ("10de:2237", "A10G", 24, "8.6", "ampere"),
        ("10de:27b8", "L4", 24, "8.9", "ada"),
        ("10de:20b0", "A100 SXM4 40GB", 40, "8.0", "ampere"),
        ("10de:20b2", "A100 SXM4 80GB", 80, "8.0", "ampere"),
        ("10de:2330", "H100 SXM5 80GB", 80, "9.0", "hopper"),
        ("10de:2486", "GeForce RTX 3060 Ti", 8, "8.6", "ampere"),
        ("10de:2204", "GeForce RTX 3090", 24, "8.6", "ampere"),
        ("10de:1db1", "Tesla V100 SXM2 16GB", 16, "7.0", "volta"),
        ("10DE:1EB8", "Tesla T4", 16, "7.5", "turing"),
    ],
)
def test_table_lookup(pci_id, name, memory_gb, cc, arch):
    found = gpu.gpu_lookup(pci_id, "", TABLE)
    assert (found["name"], found["memory_gb"], found["compute_capability"], found["architecture"]) == (
        name,
        memory_gb,
        cc,
        arch,
    )
    assert found["known"] is True


def test_every_table_entry_is_consistent():
    for pci_id, entry in TABLE.items():
        name, memory_gb, cc, arch = entry["name"], entry["memory_gb"], entry["compute_capability"], entry["generation"]
        assert pci_id.startswith("10de:") and len(pci_id) == 9, pci_id
        assert arch in CONTRACT["generations"], (pci_id, arch)
        # GeForce and RTX workstation cards are not data-center parts (the open modules refuse them before 545).
        assert entry["datacenter"] is not any(word in name for word in ("GeForce", "RTX")), (pci_id, name)
        assert memory_gb > 0 and name
        major = int(cc.split(".")[0])
        expected_major = {
            "kepler": 3,
            "maxwell": 5,
            "pascal": 6,
            "volta": 7,
            "turing": 7,
            "ampere": 8,
            "ada": 8,
            "hopper": 9,
            "blackwell": 10,
        }[arch]
        assert major == expected_major, (pci_id, cc, arch)


@pytest.mark.parametrize(
    ("description", "arch"),
    [
        ("NVIDIA Corporation GB202 [GeForce RTX 5090]", "blackwell"),
        ("NVIDIA Corporation AD102GL [L20]", "ada"),
        ("NVIDIA Corporation GP104 [GeForce GTX 1080]", "pascal"),
        ("NVIDIA Corporation GK110BGL [Tesla K40m]", "kepler"),
        ("NVIDIA Corporation Device", "unknown"),
    ],
)
def test_unknown_device_gets_architecture_from_chip_name(description, arch):
    found = gpu.gpu_lookup("10de:1fff", description, TABLE)
    assert found["known"] is False
    assert found["architecture"] == arch
    assert found["memory_gb"] is None and found["compute_capability"] is None


def test_unknown_device_in_lspci_keeps_its_marketing_name():
    line = "65:00.0 3D controller [0302]: NVIDIA Corporation AD102GL [L20] [10de:26ba] (rev a1)\n"
    (found,) = gpu.parse_lspci(line)
    assert found["name"] == "L20" and found["architecture"] == "ada" and found["known"] is False


def test_blackwell_device_ids_that_old_pci_ids_files_do_not_name():
    """Ubuntu 20.04/22.04's pci.ids print "Device 2901" for a B200-class device (finding 19 of the GPU-host audit):
    device ids from 0x2900 on are Blackwell, so the driver role picks the open modules that alone drive it."""
    line = "1b:00.0 3D controller [0302]: NVIDIA Corporation Device [10de:2941] (rev a1)\n"
    (found,) = gpu.parse_lspci(line, TABLE)
    assert (found["architecture"], found["known"]) == ("blackwell", False)
    assert gpu.gpu_lookup("10de:2901", "", TABLE)["architecture"] == "blackwell"


def test_nvswitch_bridges_are_counted_not_taken_for_gpus():
    """HGX boards (p4d.24xlarge: 8 x A100 and 6 NVSwitches) list the NVSwitches as NVIDIA bridges, class 0680."""
    lspci = LSPCI_8X_H100 + "".join(
        f"{bus:02x}:00.0 Bridge [0680]: NVIDIA Corporation GA100 [A100 NVSwitch] [10de:1af1] (rev a1)\n"
        for bus in (0xC7, 0xC8, 0xC9, 0xCA, 0xCB, 0xCC)
    )
    assert len(gpu.parse_lspci(lspci, TABLE)) == 8
    assert gpu.count_nvswitches(lspci) == 6
    assert gpu.count_nvswitches(LSPCI_DESKTOP_3090) == 0


def test_filters_are_registered():
    assert set(gpu.FilterModule().filters()) == {"dinops_parse_lspci", "dinops_gpu_lookup", "dinops_count_nvswitches"}
