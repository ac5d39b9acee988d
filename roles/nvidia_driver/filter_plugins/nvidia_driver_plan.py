"""Decide what the nvidia_driver role installs on a host: kernel module flavour, packages, holds, pins.

One pure function, ``dinops_nvidia_driver_plan``, so that every supported release and GPU generation is tested
with pytest (Ubuntu hosts cannot be built in CI). The per-release facts (which branches a release carries,
Debian's archive components) come from the role's defaults and can be overridden from the inventory.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

# GPU generations from oldest to newest, as the preflight role names them.
GENERATIONS = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
# NVIDIA's open kernel modules support Turing and newer; Blackwell is supported only by them.
OPEN_CAPABLE = frozenset(("turing", "ampere", "ada", "hopper", "blackwell"))
OPEN_ONLY = frozenset(("blackwell",))
# First driver branch that supports a generation, and the last one for those that were dropped.
MIN_BRANCH = {"ampere": 450, "ada": 525, "hopper": 525, "blackwell": 570}
MAX_BRANCH = {"kepler": 470}
# The open modules exist from branch 515 on; since 560 they are NVIDIA's default for capable GPUs.
OPEN_MIN_BRANCH = 515
OPEN_DEFAULT_BRANCH = 560
FLAVOURS = ("auto", "open", "proprietary")


def _flavour(architectures, requested, branch, errors):
    """Return (flavour, reason) for the GPUs' architectures; append problems to errors."""
    known = [a for a in architectures if a in GENERATIONS]
    unknown = sorted({a or "unknown" for a in architectures if a not in GENERATIONS})
    pre_turing = sorted({a for a in known if a not in OPEN_CAPABLE})
    open_only = sorted({a for a in known if a in OPEN_ONLY})
    if pre_turing and open_only:
        errors.append(
            f"this host mixes GPUs that need the proprietary kernel modules ({', '.join(pre_turing)}) with GPUs that"
            f" only the open modules support ({', '.join(open_only)}); no single driver drives both"
        )
    if requested == "open":
        if pre_turing:
            errors.append(
                f"nvidia_driver_kernel_modules is 'open' but the open kernel modules do not support"
                f" {', '.join(pre_turing)} GPUs (Turing or newer only): use 'proprietary' or 'auto'"
            )
        return "open", "requested by nvidia_driver_kernel_modules"
    if requested == "proprietary":
        if open_only:
            errors.append(
                f"nvidia_driver_kernel_modules is 'proprietary' but {', '.join(open_only)} GPUs are supported by the"
                " open kernel modules only: use 'open' or 'auto'"
            )
        return "proprietary", "requested by nvidia_driver_kernel_modules"
    if open_only:
        return "open", f"{', '.join(open_only)} GPUs need the open kernel modules"
    if pre_turing:
        return "proprietary", f"{', '.join(pre_turing)} GPUs need the proprietary kernel modules"
    if unknown:
        return "proprietary", f"GPU generation not known ({', '.join(unknown)}): the proprietary modules support more"
    if known:
        return "open", f"{', '.join(sorted(set(known)))} GPUs: the open kernel modules are NVIDIA's recommendation"
    if branch >= OPEN_DEFAULT_BRANCH:
        return "open", f"no GPU found; branch {branch} defaults to the open kernel modules"
    return "proprietary", f"no GPU found; branch {branch} defaults to the proprietary kernel modules"


def _check_branch(architectures, branch, flavour, release_name, release, errors):
    branches = [str(b) for b in release.get("branches", [])]
    if str(branch) not in branches:
        errors.append(
            f"driver branch {branch} is not available on {release_name} (known: {', '.join(branches) or 'none'});"
            " choose one of those or extend nvidia_driver_releases"
        )
    for arch in sorted(set(architectures)):
        if arch in MIN_BRANCH and branch < MIN_BRANCH[arch]:
            errors.append(f"{arch} GPUs need driver branch {MIN_BRANCH[arch]} or newer, not {branch}")
        if arch in MAX_BRANCH and branch > MAX_BRANCH[arch]:
            errors.append(f"{arch} GPUs are supported up to driver branch {MAX_BRANCH[arch]}, not {branch}")
    if flavour == "open" and branch < OPEN_MIN_BRANCH:
        errors.append(f"the open kernel modules exist from branch {OPEN_MIN_BRANCH} on, not {branch}")


def _ubuntu_packages(branch, flavour, server, headless, prebuilt, kernel):
    variant = ("-server" if server else "") + ("-open" if flavour == "open" else "")
    libs = "-server" if server else ""
    if headless:
        main = f"nvidia-headless-no-dkms-{branch}{variant}" if prebuilt else f"nvidia-headless-{branch}{variant}"
    else:
        main = f"nvidia-driver-{branch}{variant}"
    packages = [main, f"nvidia-utils-{branch}{libs}", f"libnvidia-compute-{branch}{libs}"]
    if prebuilt:
        # Canonical builds and signs these for each kernel: no DKMS build, and they load with Secure Boot.
        packages.append(f"linux-modules-nvidia-{branch}{variant}-{kernel}")
    return packages


def _debian_packages(flavour, headless):
    dkms = "nvidia-open-kernel-dkms" if flavour == "open" else "nvidia-kernel-dkms"
    packages = [dkms, "firmware-nvidia-gsp", "nvidia-smi", "libcuda1", "nvidia-persistenced"]
    if not headless:
        packages.append("nvidia-driver")
    return packages


def _refused(error):
    return {"errors": [error], "notes": []}


def dinops_nvidia_driver_plan(settings):
    """Return the plan for one host.

    ``settings``: os_id ('ubuntu'|'debian'), os_version ('22.04', '12'), kernel (running kernel release),
    gpus (list of dicts with 'architecture'), branch, kernel_modules ('auto'|'open'|'proprietary'), server (bool),
    headless (bool), prebuilt_modules (bool, Ubuntu), secure_boot ('enabled'|'disabled'|'unknown'),
    secure_boot_mok_enrolled (bool), releases (the role's nvidia_driver_releases table).

    The plan: release, flavour, flavour_reason, packages (to install, headers included), hold (packages to hold),
    pin_version ('535.*'), signed_modules (bool), notes (list), errors (list; the role stops when not empty).
    """
    if not isinstance(settings, dict):
        raise AnsibleFilterError("dinops_nvidia_driver_plan expects a dict of settings")
    errors, notes = [], []
    os_id = str(settings.get("os_id", "")).lower()
    release_name = f"{os_id}-{settings.get('os_version', '')}"
    releases = settings.get("releases") or {}
    release = releases.get(release_name)
    if release is None:
        supported = ", ".join(sorted(releases)) or "none"
        return _refused(f"{release_name} is not a supported release (supported: {supported})")
    try:
        branch = int(str(settings.get("branch", "")).split(".")[0])
    except ValueError:
        return _refused(f"nvidia_driver_branch must be a branch number like '535', got {settings.get('branch')!r}")
    requested = settings.get("kernel_modules", "auto")
    if requested not in FLAVOURS:
        errors.append(f"nvidia_driver_kernel_modules must be one of {', '.join(FLAVOURS)}, got {requested!r}")
        requested = "auto"
    architectures = [str(g.get("architecture") or "").lower() for g in settings.get("gpus") or []]
    flavour, reason = _flavour(architectures, requested, branch, errors)
    _check_branch(architectures, branch, flavour, release_name, release, errors)

    kernel = str(settings.get("kernel", ""))
    headless = bool(settings.get("headless", True))
    family = release.get("family", os_id)
    if family == "ubuntu":
        prebuilt = bool(settings.get("prebuilt_modules", True))
        packages = _ubuntu_packages(branch, flavour, bool(settings.get("server", True)), headless, prebuilt, kernel)
        signed = prebuilt
    elif family == "debian":
        prebuilt, signed = False, False
        packages = _debian_packages(flavour, headless)
        if settings.get("server"):
            notes.append("Debian has no -server driver packages: nvidia_driver_server is ignored")
    else:
        return _refused(f"{release_name}: unknown release family {family!r} in nvidia_driver_releases")
    hold = list(packages)
    if not prebuilt:
        packages.append(f"linux-headers-{kernel}")  # DKMS builds the module against the running kernel

    secure_boot = settings.get("secure_boot", "unknown")
    if secure_boot == "enabled" and not signed and not settings.get("secure_boot_mok_enrolled"):
        errors.append(
            "Secure Boot is enabled and the kernel module would be built by DKMS, unsigned: it would not load."
            + (" Keep nvidia_driver_prebuilt_modules true (Canonical's signed modules)," if family == "ubuntu" else "")
            + " Enroll a Machine Owner Key that DKMS signs with (mokutil --import /var/lib/dkms/mok.pub, reboot,"
            " confirm) and set nvidia_driver_secure_boot_mok_enrolled=true, or disable Secure Boot."
        )
    elif secure_boot == "unknown":
        notes.append("Secure Boot state unknown (no EFI variables): assuming it is off")
    return {
        "release": release_name,
        "family": family,
        "branch": str(branch),
        "flavour": flavour,
        "flavour_reason": reason,
        "packages": packages,
        "hold": hold,
        "pin_version": f"{branch}.*",
        "signed_modules": signed,
        "notes": notes,
        "errors": errors,
    }


class FilterModule:
    """NVIDIA driver selection."""

    def filters(self):
        return {"dinops_nvidia_driver_plan": dinops_nvidia_driver_plan}
