"""GPU knowledge for preflight: parse `lspci -nn`, look NVIDIA devices up in a table of common cloud GPUs.

Filters:
  dinops_parse_lspci(text)        -> list of NVIDIA display devices found in `lspci -nn` output
  dinops_gpu_lookup(pci_id, name) -> {name, memory_gb, compute_capability, architecture, known}

The table is keyed by PCI vendor:device id, which is what `lspci -nn` prints and what cloud VMs expose. Devices
missing from the table still get an architecture from the chip code name in lspci's text (GA102 -> ampere),
so the driver role can choose open or proprietary kernel modules for GPUs we have never seen.
"""

from __future__ import annotations

import re

NVIDIA_VENDOR = "10de"
# PCI class codes of display controllers: VGA (0300) and 3D controller (0302, data-centre GPUs).
DISPLAY_CLASSES = {"0300", "0302"}

# name, memory (GB), compute capability, architecture
GPU_TABLE: dict[str, tuple[str, int, str, str]] = {
    "10de:102d": ("Tesla K80", 12, "3.7", "kepler"),
    "10de:13f2": ("Tesla M60", 8, "5.2", "maxwell"),
    "10de:15f7": ("Tesla P100 PCIe 12GB", 12, "6.0", "pascal"),
    "10de:15f8": ("Tesla P100 PCIe 16GB", 16, "6.0", "pascal"),
    "10de:15f9": ("Tesla P100 SXM2 16GB", 16, "6.0", "pascal"),
    "10de:1bb3": ("Tesla P4", 8, "6.1", "pascal"),
    "10de:1b38": ("Tesla P40", 24, "6.1", "pascal"),
    "10de:1db1": ("Tesla V100 SXM2 16GB", 16, "7.0", "volta"),
    "10de:1db4": ("Tesla V100 PCIe 16GB", 16, "7.0", "volta"),
    "10de:1db5": ("Tesla V100 SXM2 32GB", 32, "7.0", "volta"),
    "10de:1db6": ("Tesla V100 PCIe 32GB", 32, "7.0", "volta"),
    "10de:1eb8": ("Tesla T4", 16, "7.5", "turing"),
    "10de:1e04": ("GeForce RTX 2080 Ti", 11, "7.5", "turing"),
    "10de:20b0": ("A100 SXM4 40GB", 40, "8.0", "ampere"),
    "10de:20b2": ("A100 SXM4 80GB", 80, "8.0", "ampere"),
    "10de:20b5": ("A100 PCIe 80GB", 80, "8.0", "ampere"),
    "10de:20f1": ("A100 PCIe 40GB", 40, "8.0", "ampere"),
    "10de:2230": ("RTX A6000", 48, "8.6", "ampere"),
    "10de:2235": ("A40", 48, "8.6", "ampere"),
    "10de:2236": ("A10", 24, "8.6", "ampere"),
    "10de:2237": ("A10G", 24, "8.6", "ampere"),
    "10de:2204": ("GeForce RTX 3090", 24, "8.6", "ampere"),
    "10de:2206": ("GeForce RTX 3080", 10, "8.6", "ampere"),
    "10de:2486": ("GeForce RTX 3060 Ti", 8, "8.6", "ampere"),
    "10de:2489": ("GeForce RTX 3060 Ti LHR", 8, "8.6", "ampere"),
    "10de:2684": ("GeForce RTX 4090", 24, "8.9", "ada"),
    "10de:26b5": ("L40", 48, "8.9", "ada"),
    "10de:26b9": ("L40S", 48, "8.9", "ada"),
    "10de:27b8": ("L4", 24, "8.9", "ada"),
    "10de:2330": ("H100 SXM5 80GB", 80, "9.0", "hopper"),
    "10de:2331": ("H100 PCIe 80GB", 80, "9.0", "hopper"),
    "10de:2335": ("H200 SXM 141GB", 141, "9.0", "hopper"),
}

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

# Generations in release order; the driver role compares against this (open kernel modules need >= turing).
ARCHITECTURE_ORDER = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")

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


def gpu_lookup(pci_id: str, description: str = "") -> dict:
    """What we know of an NVIDIA device: from the table, else the architecture from lspci's text."""
    key = (pci_id or "").strip().lower()
    if key in GPU_TABLE:
        name, memory_gb, compute_capability, architecture = GPU_TABLE[key]
        return {
            "name": name,
            "memory_gb": memory_gb,
            "compute_capability": compute_capability,
            "architecture": architecture,
            "known": True,
        }
    bracketed = re.findall(r"\[([^\]]+)\]", description or "")
    return {
        "name": bracketed[-1] if bracketed else (description or key or "unknown NVIDIA device"),
        "memory_gb": None,
        "compute_capability": None,
        "architecture": architecture_from_text(description),
        "known": False,
    }


def parse_lspci(text: str) -> list[dict]:
    """NVIDIA display controllers in `lspci -nn` output, in bus order, with what the table knows of each."""
    gpus = []
    for line in (text or "").splitlines():
        match = _LSPCI_LINE.match(line.strip())
        if not match or match.group("vendor").lower() != NVIDIA_VENDOR:
            continue
        if match.group("class").lower() not in DISPLAY_CLASSES:
            continue  # NVIDIA audio functions, USB controllers and bridges are not GPUs
        pci_id = f"{NVIDIA_VENDOR}:{match.group('device').lower()}"
        gpus.append({"pci_id": pci_id, "pci_slot": match.group("slot"), **gpu_lookup(pci_id, match.group("desc"))})
    return gpus


class FilterModule:
    def filters(self):
        return {
            "dinops_parse_lspci": parse_lspci,
            "dinops_gpu_lookup": gpu_lookup,
        }
