"""GPU knowledge for preflight: parse `lspci -nn`, look NVIDIA devices up in the contract's GPU table.

Filters:
  dinops_parse_lspci(text, table)        -> list of NVIDIA display devices found in `lspci -nn` output
  dinops_count_nvswitches(text)          -> number of NVIDIA NVSwitch bridges in `lspci -nn` output
  dinops_gpu_lookup(pci_id, name, table) -> {name, memory_gb, compute_capability, architecture, datacenter, known}

The table (``gpus`` of facts/nvidia.yml, the compatibility contract) is keyed by PCI vendor:device id, which is
what `lspci -nn` prints and what cloud VMs expose. Devices missing from the table still get an architecture from
the chip code name in lspci's text (GA102 -> ampere) or their device id (Blackwell), so the driver role can choose
open or proprietary kernel modules for GPUs we have never seen.
"""

from __future__ import annotations

import re

NVIDIA_VENDOR = "10de"
# PCI class codes of display controllers: VGA (0300) and 3D controller (0302, data-centre GPUs).
DISPLAY_CLASSES = {"0300", "0302"}

# PCI class of NVSwitch devices: "Bridge [0680]" (HGX A100/H100 boards: AWS p4d, p5.48xlarge).
NVSWITCH_CLASS = "0680"
# Device ids from 0x2900 on are Blackwell (GB100/GB102: B100, B200 "Device 2901"), which older pci.ids files do not
# name yet (Ubuntu 20.04/22.04 print "Device 2901").
BLACKWELL_FIRST_DEVICE = 0x2900

# Chip code-name prefixes (as lspci prints them: "NVIDIA Corporation GA102 [GeForce RTX 3090]").
CHIP_ARCHITECTURES = (
    ("GK", "kepler"),
    ("GM", "maxwell"),
    ("GP", "pascal"),
    ("GV", "volta"),
    ("TU", "turing"),
    ("GA", "ampere"),
    ("AD", "ada"),
    ("GH", "hopper"),
    ("GB", "blackwell"),
)


_LSPCI_LINE = re.compile(
    r"^(?P<slot>\S+)\s+(?P<class_name>.+?)\s+\[(?P<class>[0-9a-fA-F]{4})\]:\s+(?P<desc>.*?)"
    r"\s+\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\](?:\s+\(rev\s+\w+\))?\s*$"
)
_CHIP = re.compile(r"\b(?P<chip>(?:GK|GM|GP|GV|TU|GA|AD|GH|GB)\d{3}[A-Z]*)\b")


def architecture_from_text(text: str) -> str:
    match = _CHIP.search(text or "")
    if not match:
        return "unknown"
    chip = match.group("chip")
    return next(arch for prefix, arch in CHIP_ARCHITECTURES if chip.startswith(prefix))


def gpu_lookup(pci_id: str, description: str = "", table: dict | None = None) -> dict:
    """What we know of an NVIDIA device: from the table, else the architecture from lspci's text or its id."""
    key = (pci_id or "").strip().lower()
    entry = (table or {}).get(key)
    if entry:
        return {
            "name": entry["name"],
            "memory_gb": entry["memory_gb"],
            "compute_capability": str(entry["compute_capability"]),
            "architecture": entry["generation"],
            "datacenter": bool(entry["datacenter"]),
            "known": True,
        }
    bracketed = re.findall(r"\[([^\]]+)\]", description or "")
    name = bracketed[-1] if bracketed else (description or key or "unknown NVIDIA device")
    architecture = architecture_from_text(description)
    device = key.split(":")[-1]
    if architecture == "unknown" and re.fullmatch(r"[0-9a-f]{4}", device) and int(device, 16) >= BLACKWELL_FIRST_DEVICE:
        architecture = "blackwell"
    return {
        "name": name,
        "memory_gb": None,
        "compute_capability": None,
        "architecture": architecture,
        # Unknown branding: treated as not data-center, so old branches' open modules are not chosen for it.
        "datacenter": not re.search(r"GeForce|RTX|Quadro|TITAN", name) and bool(re.search(r"Tesla|^[ABHLT]\d", name)),
        "known": False,
    }


def _nvidia_devices(text: str):
    for line in (text or "").splitlines():
        match = _LSPCI_LINE.match(line.strip())
        if match and match.group("vendor").lower() == NVIDIA_VENDOR:
            yield match


def parse_lspci(text: str, table: dict | None = None) -> list[dict]:
    """NVIDIA display controllers in `lspci -nn` output, in bus order, with what the table knows of each."""
    gpus = []
    for match in _nvidia_devices(text):
        if match.group("class").lower() not in DISPLAY_CLASSES:
            continue  # NVIDIA audio functions, USB controllers and NVSwitch bridges are not GPUs
        pci_id = f"{NVIDIA_VENDOR}:{match.group('device').lower()}"
        gpus.append(
            {"pci_id": pci_id, "pci_slot": match.group("slot"), **gpu_lookup(pci_id, match.group("desc"), table)}
        )
    return gpus


def count_nvswitches(text: str) -> int:
    """NVSwitch devices (NVIDIA, class Bridge 0680) in `lspci -nn` output: such hosts need Fabric Manager."""
    return sum(1 for match in _nvidia_devices(text) if match.group("class").lower() == NVSWITCH_CLASS)


class FilterModule:
    def filters(self):
        return {
            "dinops_parse_lspci": parse_lspci,
            "dinops_count_nvswitches": count_nvswitches,
            "dinops_gpu_lookup": gpu_lookup,
        }
