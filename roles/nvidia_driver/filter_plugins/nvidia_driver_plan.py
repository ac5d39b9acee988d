"""Decide what the nvidia_driver role installs on a host: source, branch, kernel module flavour, packages.

One pure function, ``dinops_nvidia_driver_plan``, so that every supported release, GPU generation and upgrade
path is tested with pytest (Ubuntu hosts cannot be built in CI): tests/ansible/test_nvidia_driver_plan.py for the
decisions and tests/ansible/test_ubuntu_archive.py, which runs the plan's package sets through real apt against
Ubuntu's dependency graph. The facts (which branches drive which GPUs and run which CUDA, which branches each
release really offers) come from the compatibility contract, facts/nvidia.yml, passed in as ``contract``.

Package names, with their sources:
- Ubuntu: Canonical's packaging (canonical/nvidia-graphics-drivers, debian/templates/control.in): the headless
  userspace ``nvidia-headless-no-dkms-<B>-server[-open]`` does not pull nvidia-smi, which is in
  ``nvidia-utils-<B>-server``; the kernel module comes prebuilt and signed from linux-restricted-modules:
  ``linux-modules-nvidia-<B>-server[-open]-<kernel flavour>`` is the metapackage that follows kernel updates (it
  depends on the module of the newest kernel of that flavour), the way ubuntu-drivers installs it
  (canonical/ubuntu-drivers-common UbuntuDrivers/detect.py, get_linux_modules_metapackage).
- Fabric Manager: ``nvidia-fabricmanager-<B>`` (Ubuntu source fabric-manager-<B>, which builds no NSCQ library),
  which depends on the exact -server driver version, ``nvidia-kernel-common-<B>-server-<U>``, and lags the driver
  (noble: fabric manager 580.159.03 while the driver is at 580.173.02), so the role pins the driver to the version
  Fabric Manager needs, and stops where Canonical's prebuilt module was built for another one
  (fabric_manager.py; ../shared/facts/ubuntu-nvidia-packaging.md §4, §5 and §6.4); NVIDIA's CUDA repository names
  it ``nvidia-fabricmanager`` from 580 on (NVIDIA/gpu-driver-container, fabricmanager_install). The plan's ``fabric``
  says which GPUs report their NVSwitch fabric state (Hopper and newer: ``fabric_state_min_generation`` of the
  contract) and which print N/A.
- Debian's archive: ``nvidia-kernel-dkms`` / ``nvidia-open-kernel-dkms``, ``firmware-nvidia-gsp``, ``nvidia-smi``,
  ``libcuda1``, ``nvidia-persistenced`` (bookworm non-free/contrib).
- NVIDIA's CUDA repository for Debian 12: the compute-only set ``nvidia-driver-cuda`` with
  ``nvidia-kernel-open-dkms`` or ``nvidia-kernel-dkms`` (NVIDIA driver installation guide r580, "Compute-only HPC
  Node"). That repository carries every branch under the same names and its metapackages have no upper bound
  (cuda-drivers-580 pulls 590 components: NVIDIA forum thread 353805), so the branch is locked with an apt pin on
  every NVIDIA package name (``pin``): pinning only the named packages fails, apt keeps the newest candidate for
  their dependencies (../shared/facts/ubuntu-nvidia-packaging.md §6.4).
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

FLAVOURS = ("auto", "open", "proprietary")
# Every package of NVIDIA's CUDA repository that carries the driver's version (apt_preferences(5) globs).
NVIDIA_REPO_PACKAGES = [
    "nvidia-*",
    "libnvidia-*",
    "libcuda*",
    "libnvcuvid*",
    "libnvoptix*",
    "firmware-nvidia-*",
    "xserver-xorg-video-nvidia*",
]

# Installed packages that belong to one driver branch (group 2) and maybe the open flavour (group 3): what a branch
# or flavour change has to remove. Userspace libraries follow their headless/DKMS package through Conflicts.
_UBUNTU_DRIVER_PACKAGE = re.compile(
    r"^(nvidia-headless-no-dkms|nvidia-headless|nvidia-driver|nvidia-dkms|nvidia-kernel-source|nvidia-utils"
    r"|nvidia-kernel-common|nvidia-compute-utils|libnvidia-cfg1|nvidia-firmware"
    r"|libnvidia-compute|linux-modules-nvidia|linux-objects-nvidia|nvidia-fabricmanager|libnvidia-nscq)"
    r"-(\d{3})((?:-server)?(-open)?)(?:-|$)"
)
# The kernel module packages of each kind (Ubuntu): Canonical's prebuilt ones, and DKMS with the headless metapackage
# that pulls it. A switch between the kinds removes the other one: both would install a module for the same kernel.
_PREBUILT_MODULES = ("linux-modules-nvidia", "linux-objects-nvidia")
_DKMS_MODULES = ("nvidia-dkms", "nvidia-headless")
# Packages a previous version of this role (or a person) held: released before a branch or flavour change
# (apt refuses to change held packages) and no longer held (see the README: no holds, kernel and module move
# together).
_DRIVER_HOLDS = re.compile(
    r"^(nvidia-|libnvidia-|libcuda|linux-modules-nvidia-|linux-objects-nvidia-|firmware-nvidia-|xserver-xorg-video-nvidia)"
)


def _flavour(gpus, requested, branch, contract, errors):
    """Return (flavour, reason) for the GPUs; append problems to errors."""
    generations = contract["generations"]
    open_modules = contract["open_modules"]
    architectures = [g["architecture"] for g in gpus]
    known = [a for a in architectures if a in generations]
    unknown = sorted({a or "unknown" for a in architectures if a not in generations})
    pre_turing = sorted({a for a in known if not generations[a].get("open")})
    open_only = sorted({a for a in known if generations[a].get("open_only")})
    # Before 545 the open modules refuse GPUs without data-center branding (RmInitAdapter in osinit.c).
    consumer = sorted({g["name"] or g["architecture"] for g in gpus if not g["datacenter"]})
    consumer_gate = branch < open_modules["geforce_min_branch"] and consumer
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
        if consumer_gate:
            errors.append(
                f"nvidia_driver_kernel_modules is 'open' but branch {branch}'s open modules drive data-center GPUs"
                f" only, not {', '.join(consumer)} (GeForce/workstation support starts with branch"
                f" {open_modules['geforce_min_branch']}): use branch {contract['default_branch']} or 'proprietary'"
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
    if consumer_gate:
        return "proprietary", f"branch {branch}'s open modules drive data-center GPUs only, not {', '.join(consumer)}"
    default_open = branch >= open_modules["default_branch"]
    if unknown:
        return (
            ("open", f"GPU generation not known ({', '.join(unknown)}); branch {branch} defaults to the open modules")
            if default_open
            else (
                "proprietary",
                f"GPU generation not known ({', '.join(unknown)}): the proprietary modules support more",
            )
        )
    if known:
        return "open", f"{', '.join(sorted(set(known)))} GPUs: the open kernel modules are NVIDIA's recommendation"
    if default_open:
        return "open", f"no GPU found; branch {branch} defaults to the open kernel modules"
    return "proprietary", f"no GPU found; branch {branch} defaults to the proprietary kernel modules"


def _check_branch(gpus, branch, flavour, release_name, offered, contract, errors):
    if str(branch) not in offered["branches"]:
        successor = offered.get("transitional", {}).get(str(branch))
        errors.append(
            f"driver branch {branch} is not a real package set on {release_name}"
            + (f" (its packages are transitional to {successor})" if successor else "")
            + f"; available: {', '.join(offered['branches']) or 'none'}"
        )
    for arch in sorted({g["architecture"] for g in gpus}):
        generation = contract["generations"].get(arch, {})
        if branch < generation.get("min_branch", 0):
            errors.append(f"{arch} GPUs need driver branch {generation['min_branch']} or newer, not {branch}")
        if branch > generation.get("max_branch", 10**6):
            errors.append(f"{arch} GPUs are supported up to driver branch {generation['max_branch']}, not {branch}")
    if flavour == "open" and branch < contract["open_modules"]["min_branch"]:
        errors.append(
            f"the open kernel modules exist from branch {contract['open_modules']['min_branch']} on, not {branch}"
        )
    cuda = str(contract["images"]["cuda_runtime"])
    needed = contract["cuda_min_branch"][cuda.split(".")[0]]
    if branch < needed:
        errors.append(
            f"driver branch {branch} cannot run the images' CUDA {cuda} runtime (it needs branch {needed} or newer):"
            f" use branch {contract['default_branch']}"
        )


def _offered(release_name, release, source, errors):
    """The branches the chosen package source offers on this release."""
    if "sources" not in release:
        if source not in ("", release["source"]):
            errors.append(
                f"nvidia_driver_source {source!r} is not available on {release_name} (only {release['source']!r})"
            )
        return release["source"], release
    source = source or release["source"]
    if source not in release["sources"]:
        errors.append(f"nvidia_driver_source must be one of {', '.join(sorted(release['sources']))} on {release_name}")
        source = release["source"]
    return source, {"branches": release["sources"][source], "transitional": {}}


def _fabric(gpus, nvswitch_count, contract):
    """{completed: GPUs that must report the fabric state Completed, not_reported: GPUs that print N/A (generations
    before the contract's fabric_state_min_generation; unknown ones may print either)} on an NVSwitch host."""
    if nvswitch_count <= 0:
        return {"completed": 0, "not_reported": 0}
    generations = contract["generations"]
    first = generations[contract["fabric_state_min_generation"]]["order"]
    reporting = [g for g in gpus if generations.get(g["architecture"], {}).get("order", -1) >= first]
    return {"completed": len(reporting), "not_reported": len(gpus) - len(reporting)}


def _ubuntu(settings, branch, flavour, errors):
    server = bool(settings.get("server", True))
    variant = ("-server" if server else "") + ("-open" if flavour == "open" else "")
    libs = "-server" if server else ""
    prebuilt = bool(settings.get("prebuilt_modules", True))
    if settings.get("headless", True):
        main = f"nvidia-headless-no-dkms-{branch}{variant}" if prebuilt else f"nvidia-headless-{branch}{variant}"
    else:
        main = f"nvidia-driver-{branch}{variant}"
    userspace = [main, f"nvidia-utils-{branch}{libs}", f"libnvidia-compute-{branch}{libs}"]
    kflavour = str(settings.get("kernel_flavour") or "")
    if prebuilt:
        # The flavour metapackage moves with kernel updates; without a known flavour, the running kernel's module.
        kernel = f"linux-modules-nvidia-{branch}{variant}-{kflavour or settings['kernel']}"
    else:
        kernel = f"linux-headers-{kflavour or settings['kernel']}"
    fabric = []
    if int(settings.get("nvswitch_count") or 0) > 0:
        if not server:
            errors.append(
                "NVSwitch hosts need Fabric Manager, which requires the -server driver: set nvidia_driver_server true"
            )
        fabric = [f"nvidia-fabricmanager-{branch}"]
    return [*userspace, kernel, *fabric], [*userspace, kernel], prebuilt


def _debian(settings, source, branch, flavour):
    kflavour = str(settings.get("kernel_flavour") or "")
    # The headers metapackage follows kernel updates, so DKMS rebuilds for every new kernel.
    headers = f"linux-headers-{kflavour or settings['kernel']}"
    fabric = int(settings.get("nvswitch_count") or 0) > 0
    if source == "nvidia":
        dkms = "nvidia-kernel-open-dkms" if flavour == "open" else "nvidia-kernel-dkms"
        packages = ["nvidia-driver-cuda", dkms]
        packages += ["nvidia-fabricmanager"] if fabric else []
        return [*packages, headers], "nvidia-driver-cuda"
    dkms = "nvidia-open-kernel-dkms" if flavour == "open" else "nvidia-kernel-dkms"
    packages = [dkms, "firmware-nvidia-gsp", "nvidia-smi", "libcuda1", "nvidia-persistenced"]
    if not settings.get("headless", True):
        packages.append("nvidia-driver")
    return [*packages, headers], "libcuda1"


def _stale(installed, branch, flavour, other_modules):
    """Installed Ubuntu driver packages of another branch or the other flavour, and this branch's kernel module
    packages of the kind the plan does not use (``other_modules``: name prefixes)."""
    stale = []
    for name in installed:
        match = _UBUNTU_DRIVER_PACKAGE.match(name)
        if not match:
            continue
        other_branch = match.group(2) != str(branch)
        flavoured = match.group(1) in (
            "nvidia-headless-no-dkms",
            "nvidia-headless",
            "nvidia-driver",
            "nvidia-dkms",
            "nvidia-kernel-source",
            "linux-modules-nvidia",
            "linux-objects-nvidia",
        )
        other_flavour = flavoured and bool(match.group(4)) != (flavour == "open")
        other_kind = match.group(1) in other_modules
        if other_branch or other_flavour or other_kind:
            stale.append(name)
    return sorted(stale)


def _secure_boot(settings, family, signed, errors, notes):
    secure_boot = settings.get("secure_boot", "unknown")
    if secure_boot == "enabled" and not signed and not settings.get("secure_boot_mok_enrolled"):
        if family == "ubuntu":
            how = (
                "Keep nvidia_driver_prebuilt_modules true (Canonical's signed modules), or enroll the key Ubuntu's"
                " DKMS signs with: update-secureboot-policy --new-key, then update-secureboot-policy --enroll-key"
                " (the key is /var/lib/shim-signed/mok/MOK.der), reboot and confirm in the MOK manager"
            )
        else:
            how = (
                "Enroll the key Debian's DKMS signs with: dkms generate_mok, then mokutil --import"
                " /var/lib/dkms/mok.pub, reboot and confirm in the MOK manager"
            )
        errors.append(
            "Secure Boot is enabled and the kernel module would be built by DKMS and signed with a key the firmware"
            f" does not trust yet, so it would not load. {how}; then set nvidia_driver_secure_boot_mok_enrolled=true."
            " Or disable Secure Boot."
        )
    elif secure_boot == "unknown":
        notes.append("Secure Boot state unknown (no EFI variables): assuming it is off")


def _refused(error):
    return {"errors": [error], "notes": []}


def dinops_nvidia_driver_plan(settings):
    """Return the plan for one host.

    ``settings``: os_id ('ubuntu'|'debian'), os_version ('24.04', '12'), kernel (running kernel release),
    kernel_flavour (the installed kernel metapackage's flavour: 'generic', 'aws', 'cloud-amd64'; '' if unknown),
    gpus (list of dicts with 'architecture', 'datacenter', 'name'), nvswitch_count, branch,
    kernel_modules ('auto'|'open'|'proprietary'), server, headless, prebuilt_modules (Ubuntu), source ('' for the
    release's default, 'debian'|'nvidia' on Debian 12), secure_boot ('enabled'|'disabled'|'unknown'),
    secure_boot_mok_enrolled, contract (facts/nvidia.yml), installed and held (package names).

    The plan: release, family, source, branch, flavour, flavour_reason, packages (apt install set), remove
    (installed packages of another branch, flavour or kind of kernel module), unhold (held driver packages to
    release), not_transitional (packages whose candidate must be a real package), version_package (the package whose
    version is the driver's), modules_package (Canonical's prebuilt module package the plan installs, '' for DKMS),
    services (units to enable), fabric (see ``_fabric``), signed_modules, notes, errors (the role stops when not
    empty).
    """
    if not isinstance(settings, dict) or not isinstance(settings.get("contract"), dict):
        raise AnsibleFilterError("dinops_nvidia_driver_plan expects a dict of settings with the contract")
    contract = settings["contract"]
    errors, notes = [], []
    os_id = str(settings.get("os_id", "")).lower()
    release_name = f"{os_id}-{settings.get('os_version', '')}"
    release = contract["releases"].get(release_name)
    if release is None:
        return _refused(
            f"{release_name} is not a supported release (supported: {', '.join(sorted(contract['releases']))})"
        )
    try:
        branch = int(str(settings.get("branch", "")).split(".")[0])
    except ValueError:
        return _refused(f"nvidia_driver_branch must be a branch number like '580', got {settings.get('branch')!r}")
    requested = settings.get("kernel_modules", "auto")
    if requested not in FLAVOURS:
        errors.append(f"nvidia_driver_kernel_modules must be one of {', '.join(FLAVOURS)}, got {requested!r}")
        requested = "auto"
    source = str(settings.get("source") or "")
    source, offered = _offered(release_name, release, source, errors)
    gpus = [
        {
            "architecture": str(g.get("architecture") or "").lower(),
            "datacenter": bool(g.get("datacenter")),
            "name": str(g.get("name") or ""),
        }
        for g in settings.get("gpus") or []
    ]
    flavour, reason = _flavour(gpus, requested, branch, contract, errors)
    _check_branch(gpus, branch, flavour, release_name, offered, contract, errors)

    nvswitch_count = int(settings.get("nvswitch_count") or 0)
    services = ["nvidia-fabricmanager"] if nvswitch_count > 0 else []
    modules_package = ""
    if release["family"] == "ubuntu":
        packages, not_transitional, signed = _ubuntu(settings, branch, flavour, errors)
        version_package = not_transitional[2]
        modules_package = not_transitional[3] if signed else ""
        if not signed:
            other_modules = _PREBUILT_MODULES
        elif settings.get("headless", True):
            other_modules = _DKMS_MODULES
        else:
            other_modules = ()  # nvidia-driver-<B> depends on nvidia-dkms-<B>: it stays beside the prebuilt module
        remove = _stale(settings.get("installed") or [], branch, flavour, other_modules)
    else:
        packages, version_package = _debian(settings, source, branch, flavour)
        not_transitional, signed, remove = [], False, []
        if settings.get("server"):
            notes.append("Debian has no -server driver packages: nvidia_driver_server is ignored")
    _secure_boot(settings, release["family"], signed, errors, notes)
    unhold = sorted(name for name in settings.get("held") or [] if _DRIVER_HOLDS.match(name))
    return {
        "release": release_name,
        "family": release["family"],
        "source": source,
        "branch": str(branch),
        "flavour": flavour,
        "flavour_reason": reason,
        "packages": packages,
        "remove": [name for name in remove if name not in packages],
        "unhold": unhold,
        "not_transitional": not_transitional,
        "version_package": version_package,
        "modules_package": modules_package,
        "services": services,
        "fabric": _fabric(gpus, nvswitch_count, contract),
        # apt preferences that lock the branch where package names do not carry it (NVIDIA's CUDA repository).
        "pin": {"packages": NVIDIA_REPO_PACKAGES, "version": f"{branch}.*"} if source == "nvidia" else {},
        "signed_modules": signed,
        "notes": notes,
        "errors": errors,
    }


def dinops_apt_transitional(stanzas):
    """Names of the packages whose ``apt-cache show`` stanza is a transitional package (Canonical's EOL uploads:
    Section oldlibs, "transitional package" in the description)."""
    found = []
    for stanza in re.split(r"\n\s*\n", stanzas or ""):
        name = re.search(r"^Package:\s*(\S+)", stanza, re.M)
        if not name:
            continue
        section = re.search(r"^Section:\s*(\S+)", stanza, re.M)
        oldlibs = bool(section) and section.group(1).endswith("oldlibs")
        if oldlibs or re.search(r"transitional (dummy )?package", stanza, re.I):
            found.append(name.group(1))
    return sorted(set(found))


def dinops_apt_missing(stanzas, names):
    """The names that ``apt-cache show`` printed no stanza for. It exits 0 when only some names are missing."""
    shown = set(re.findall(r"^Package:\s*(\S+)", stanzas or "", re.M))
    return [name for name in names or [] if name not in shown]


def dinops_kernel_flavour(packages, kernel, family):
    """The flavour of the kernel metapackage that tracks the running kernel ('generic', 'aws', 'cloud-amd64').

    ``packages``: installed package names; ``kernel``: ``uname -r``. Ubuntu's ``linux-image-virtual`` takes the
    generic modules (ubuntu-drivers does the same). '' when no metapackage is installed.
    """
    metas = sorted(
        name[len("linux-image-") :]
        for name in packages or []
        if re.match(r"^linux-image-[a-z]", name) and not re.match(r"^linux-image-(unsigned|extra|uc)-", name)
    )
    metas = [meta for meta in metas if not meta.endswith("-dbg")]
    if family == "ubuntu":
        metas = ["generic" if meta == "virtual" else meta for meta in metas]
    suffix = re.sub(r"^[0-9.]+-[0-9]+-", "", str(kernel or ""))
    # Several metas (generic and generic-hwe-24.04): the one whose base flavour the running kernel carries.
    matching = [meta for meta in metas if meta.split("-")[0] == suffix.split("-")[0] or meta == suffix]
    chosen = matching or metas
    return chosen[0] if chosen else ""


def dinops_newest_kernel(releases):
    """The newest of these kernel releases (``/boot/vmlinuz-<release>`` names), compared as dpkg compares them."""

    def key(release):
        return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"[.-]", release)]

    candidates = [r for r in releases or [] if re.match(r"^\d", r)]
    return max(candidates, key=key) if candidates else ""


class FilterModule:
    """NVIDIA driver selection."""

    def filters(self):
        return {
            "dinops_nvidia_driver_plan": dinops_nvidia_driver_plan,
            "dinops_apt_transitional": dinops_apt_transitional,
            "dinops_apt_missing": dinops_apt_missing,
            "dinops_kernel_flavour": dinops_kernel_flavour,
            "dinops_newest_kernel": dinops_newest_kernel,
        }
