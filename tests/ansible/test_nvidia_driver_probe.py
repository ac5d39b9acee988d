"""The driver role's and the validator's readings of /proc/driver/nvidia/version (GPU hosts only, so CI cannot run
them): the regular expressions in the roles' vars against real outputs."""

from __future__ import annotations

import re

import pytest
import yaml

from dinops_testing import REPO

DRIVER_VARS = yaml.safe_load((REPO / "roles/nvidia_driver/vars/main.yml").read_text())
VALIDATE_VARS = yaml.safe_load((REPO / "roles/validate/vars/main.yml").read_text())

PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.183.01  Release Build  (dvs-builder@U16-I3-B03-4-3)"
    "  Sun May 12 19:39:15 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
PROC_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.105.01  Sat Mar 11 05:10:35 UTC 2023\n"
    "GCC version:  gcc version 9.4.0 (Ubuntu 9.4.0-1ubuntu1~20.04.1)\n"
)


@pytest.mark.parametrize(
    ("text", "version"),
    [(PROC_OPEN, "535.183.01"), (PROC_PROPRIETARY, "515.105.01"), ("", None)],
)
@pytest.mark.parametrize(
    "regex", [DRIVER_VARS["__nvidia_driver_proc_version_regex"], VALIDATE_VARS["__validate_driver_regex"]]
)
def test_loaded_driver_version(regex, text, version):
    found = re.findall(regex, text)
    assert (found[0] if found else None) == version
