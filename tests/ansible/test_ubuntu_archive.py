"""The nvidia_driver role's package plan against Ubuntu's real dependency graph, resolved by the host's real apt.

Each test builds a fake Ubuntu archive from tests/fixtures/ubuntu_nvidia/packages.json (a cut of
../shared/facts/ubuntu-nvidia-packages.json: Canonical's packaging rendered from git, versions and transitional
state read on packages.ubuntu.com; see the fixture's README) and runs ``apt-get -s`` on it (tests/aptarchive.py).
``run_role`` replays what roles/nvidia_driver/tasks/packages.yml does with the plan, step by step, on that archive.

What rests on modelled data, not on a page or a commit (the fixture marks each such stanza):
- every linux-restricted-modules (LRM) stanza of noble and jammy (linux-modules/-objects/-signatures-nvidia-*): names,
  versions and structure are real; the ``nvidia-kernel-common-580-server`` bounds are modelled on the documented
  pattern (facts §4: ``(<= U-1)`` and ``(>= U)`` on the module package, ``(>= U)`` on the metapackage) with U the
  release's newest driver in the snapshot, 580.173.02 (tests/fixtures/ubuntu_nvidia/cut.py, model_lrm_bounds);
  focal has no LRM stanza at all (its LRM versions are not established);
- the kernel packages' relations (versions are real);
- the 535-server LRM package an earlier version of this role installed (``old_lrm_stanzas``): not in the snapshot,
  modelled on the real jammy 515-server stanza quoted in facts §4.
Debian 12 is not resolved here: the snapshot has a few bookworm stanzas and one CUDA-repository quote (facts §7-8),
not a dependency graph.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import pytest
import yaml
from aptarchive import FIXTURE, SimResult, UbuntuArchive, load_stanzas

from dinops_testing import REPO, driver_plan_settings, load_plugin

filters = load_plugin("roles/nvidia_driver/filter_plugins/nvidia_driver_plan.py")
manager = load_plugin("roles/nvidia_driver/filter_plugins/fabric_manager.py")
plan = filters.dinops_nvidia_driver_plan
CONTRACT = yaml.safe_load((REPO / "facts/nvidia.yml").read_text())
BRANCH = "580"
# The newest 580-server upload on noble and jammy in the snapshot (packages.ubuntu.com, late 2026; facts §2).
LATEST_580 = "580.173.02"
VERSIONS = {"focal": "20.04", "jammy": "22.04", "noble": "24.04"}
# Releases whose snapshot has the late-2026 archive state (535-server transitional) and LRM stanzas.
CURRENT = ("noble", "jammy")
DRIVER_SOURCE = "nvidia-graphics-drivers-"
# What the previous default plan installed (git HEAD nvidia_driver_plan.py, branch 535, server, headless,
# prebuilt; 'auto' gave the open modules for Turing and newer): these three, plus the running kernel's
# linux-modules-nvidia-535-server[-open]-<uname -r>, all of them held.
OLD_DEFAULT = ("nvidia-headless-no-dkms-535-server{variant}", "nvidia-utils-535-server", "libnvidia-compute-535-server")


# --- hosts ------------------------------------------------------------------------------------------------------
def kernel_abis(archive: UbuntuArchive) -> dict[str, str]:
    """Kernel ABI (e.g. 6.8.0-142) -> version of the linux-generic metapackages that install it, oldest first."""
    abis = {}
    for s in archive.stanzas:
        if s["package"] == "linux-image-generic":
            abi = re.search(r"linux-image-(\d\S*)-generic", s["depends"]).group(1)
            abis[abi] = s["version"]
    return dict(sorted(abis.items(), key=lambda item: [int(n) for n in re.findall(r"\d+", item[0])]))


def boot_kernel(archive: UbuntuArchive, abi: str) -> str:
    """Install the generic kernel metapackages at the version that brings ``abi`` (as a cloud image has them)."""
    version = kernel_abis(archive)[abi]
    result = archive.simulate(
        "install", [f"{meta}={version}" for meta in ("linux-generic", "linux-image-generic", "linux-headers-generic")]
    )
    assert result.ok, result
    archive.apply(result)
    return f"{abi}-generic"


def host(tmp_path, release: str, running: str = "oldest") -> tuple[UbuntuArchive, str]:
    """A fresh cloud VM: the release's archive and the generic kernel (the oldest or newest ABI the data has)."""
    archive = UbuntuArchive(tmp_path / release, release)
    abis = list(kernel_abis(archive))
    return archive, boot_kernel(archive, abis[0] if running == "oldest" else abis[-1])


def settings(archive: UbuntuArchive, kernel: str, kernel_modules: str = "open", **overrides) -> dict:
    """The role's plan settings (vars/main.yml) for this host: installed and held packages from its dpkg state,
    the kernel flavour the way the role derives it from the installed packages."""
    installed = sorted(archive.state())
    base = driver_plan_settings(
        f"ubuntu-{VERSIONS[archive.release]}",
        kernel,
        filters.dinops_kernel_flavour(installed, kernel, "ubuntu"),
        gpus=[{"architecture": "ampere", "datacenter": True, "name": "A100 SXM4 80GB"}],
        branch=BRANCH,
        kernel_modules=kernel_modules,
        installed=installed,
        held=archive.held(),
    )
    base.update(overrides)
    return base


# --- the role, replayed -------------------------------------------------------------------------------------------
@dataclasses.dataclass
class RoleRun:
    """Where tasks/packages.yml stopped (None: it went through) and what apt said at each step."""

    stopped_at: str | None = None
    message: str = ""
    missing: list[str] = dataclasses.field(default_factory=list)
    transitional: list[str] = dataclasses.field(default_factory=list)
    remove: SimResult | None = None
    install: SimResult | None = None


def run_role(archive: UbuntuArchive, the_plan: dict, pinned: bool = False) -> RoleRun:
    """roles/nvidia_driver/tasks/packages.yml on the fake archive, applying each step's result to the dpkg state:
    release the holds (dpkg_selections: install), read the candidates of not_transitional with
    ``apt-cache show --no-all-versions`` and stop on rc != 0 or a transitional one (dinops_apt_transitional),
    ``apt-get remove --purge`` the remove list (Ansible passes only installed names), then ``apt-get install`` the
    packages not yet installed with --allow-change-held-packages, no recommends and, where pin.yml wrote a pin
    (``pinned``), --allow-downgrades."""
    assert the_plan["errors"] == [], the_plan["errors"]
    run = RoleRun()
    archive.select(the_plan["unhold"], "install")
    if the_plan["not_transitional"]:
        show = archive.apt_cache("show", "--no-all-versions", *the_plan["not_transitional"])
        found = set(re.findall(r"^Package: (\S+)", show.stdout, re.M))
        run.missing = [name for name in the_plan["not_transitional"] if name not in found]
        run.transitional = filters.dinops_apt_transitional(show.stdout)
        if show.returncode != 0 or run.transitional:
            run.stopped_at, run.message = "check", show.stderr + " ".join(run.transitional)
            return run
    remove = [name for name in the_plan["remove"] if name in archive.state()]
    if remove:
        run.remove = archive.simulate("remove", remove, extra_args=["--purge"])
        if not run.remove.ok:
            run.stopped_at, run.message = "remove", run.remove.error
            return run
        archive.apply(run.remove)
    install = [name for name in the_plan["packages"] if name not in archive.state()]
    if install:
        downgrades = ["--allow-downgrades"] if pinned else []
        run.install = archive.simulate("install", install, allow_change_held=True, extra_args=downgrades)
        if not run.install.ok:
            run.stopped_at, run.message = "install", run.install.error
            return run
        archive.apply(run.install)
    return run


# --- what is installed ---------------------------------------------------------------------------------------------
def transitional_installed(archive: UbuntuArchive) -> list[str]:
    return sorted(
        name
        for name in archive.state()
        if archive.installed_stanza(name).get("transitional")
        or archive.installed_stanza(name).get("section", "").endswith("oldlibs")
    )


def real_driver_sources(archive: UbuntuArchive, firmware: bool = True) -> dict[str, set[str]]:
    """Source package -> upstream versions of the installed, non-transitional NVIDIA driver packages (without the
    nvidia-firmware-* GSP firmware packages when firmware is False)."""
    out: dict[str, set[str]] = {}
    for name, version in archive.state().items():
        stanza = archive.installed_stanza(name)
        if not firmware and name.startswith("nvidia-firmware-"):
            continue
        if stanza.get("source_package", "").startswith(DRIVER_SOURCE) and not stanza.get("transitional"):
            out.setdefault(stanza["source_package"], set()).add(version.split("-")[0])
    return out


def module_packages(archive: UbuntuArchive) -> list[str]:
    return sorted(name for name in archive.state() if name.startswith("linux-modules-nvidia-"))


# --- the archive itself --------------------------------------------------------------------------------------------
# Dependencies the snapshot itself leaves dangling (not a fault of the cut): jammy's transitional
# nvidia-fabricmanager-dev-535 points at nvidia-fabricmanager-dev-580, which the jammy snapshot does not list.
KNOWN_DANGLING = {"focal": [], "jammy": ["nvidia-fabricmanager-dev-580"], "noble": []}


@pytest.mark.parametrize("release", sorted(VERSIONS))
def test_every_dependency_of_the_cut_is_in_it_or_a_stub(tmp_path, release):
    """The cut keeps whole dependency closures, and STUBS covers every external name facts §0 lists."""
    assert UbuntuArchive(tmp_path, release).unresolved_names() == KNOWN_DANGLING[release]


def test_the_fixture_keeps_each_stanzas_evidence():
    stanzas = load_stanzas()
    assert len(stanzas) > 300
    assert all(s["evidence"] and s["source"] and s["snapshot"] for s in stanzas)


def test_the_fixture_is_the_cut_of_the_shared_snapshot():
    """Regenerating with cut.py gives the same stanzas, the modelled LRM bounds included (only where the shared
    snapshot is checked out beside the repository)."""
    cut = load_plugin("tests/fixtures/ubuntu_nvidia/cut.py")
    if not cut.DEFAULT_INPUT.exists():
        pytest.skip(f"{cut.DEFAULT_INPUT} is not here")
    raw = cut.DEFAULT_INPUT.read_bytes()
    assert json.loads(FIXTURE.read_text())["input_sha256"] == hashlib.sha256(raw).hexdigest()
    assert cut.same(cut.cut(json.loads(raw)), load_stanzas())


# --- audit finding 1: the old default asks for 535 and gets 580 --------------------------------------------------
@pytest.mark.parametrize("variant", ["-open", ""])
@pytest.mark.parametrize("release", CURRENT)
def test_old_default_packages_install_the_580_driver(tmp_path, release, variant):
    """Finding 1, reproduced: the 535-server packages the old default installed are transitional on 22.04 and 24.04
    (packages.ubuntu.com, source nvidia-graphics-drivers-535-server 535.309.01-0ubuntu0.2x.04.2), so apt installs
    the 580-server driver: a role that asks for 535 gets 580, and its `535.*` check fails every run."""
    archive = UbuntuArchive(tmp_path, release)
    old = [name.format(variant=variant) for name in OLD_DEFAULT]
    result = archive.simulate("install", old)
    assert result.ok, result
    archive.apply(result)
    assert set(old) <= set(transitional_installed(archive))
    assert real_driver_sources(archive) == {"nvidia-graphics-drivers-580-server": {LATEST_580}}
    for template in OLD_DEFAULT:
        name = template.format(variant=variant).replace("535", "580")
        assert result.installed[name].startswith(f"{LATEST_580}-"), result


@pytest.mark.parametrize("release", sorted(VERSIONS))
def test_end_of_life_550_server_chains_through_570_to_580(tmp_path, release):
    """550-server is transitional to 570-server (LP: #2114726), which is transitional to 580-server
    (LP: #2147038) on 20.04, 22.04 and 24.04 (Canonical's packaging git, branches 550-server-* and 570-server-*)."""
    archive = UbuntuArchive(tmp_path, release)
    result = archive.simulate("install", ["nvidia-headless-no-dkms-550-server"])
    assert result.ok, result
    archive.apply(result)
    assert {"nvidia-headless-no-dkms-550-server", "nvidia-headless-no-dkms-570-server"} <= set(
        transitional_installed(archive)
    )
    assert list(real_driver_sources(archive)) == ["nvidia-graphics-drivers-580-server"]


def _transitional_cases():
    for release, version in sorted(VERSIONS.items()):
        offered = CONTRACT["releases"][f"ubuntu-{version}"]
        data = {s["package"] for s in load_stanzas(release)}
        for branch, successor in sorted(offered.get("transitional", {}).items()):
            if f"nvidia-headless-no-dkms-{branch}-server" not in data:
                continue  # a branch the fixture does not cut (565, 575, 590)
            yield pytest.param(release, branch, successor, id=f"{release}-{branch}")


@pytest.mark.parametrize(("release", "branch", "successor"), list(_transitional_cases()))
def test_contract_transitional_table_matches_apt(tmp_path, release, branch, successor):
    """facts/nvidia.yml says which branches are transitional on each release and where they lead; apt agrees:
    installing the branch's headless package ends at the real driver of the branch the contract's chain ends at."""
    table = CONTRACT["releases"][f"ubuntu-{VERSIONS[release]}"]["transitional"]
    final = successor
    while final in table:
        final = table[final]
    archive = UbuntuArchive(tmp_path, release)
    result = archive.simulate("install", [f"nvidia-headless-no-dkms-{branch}-server"])
    assert result.ok, result
    archive.apply(result)
    assert list(real_driver_sources(archive)) == [f"{DRIVER_SOURCE}{final}-server"]


@pytest.mark.parametrize("release", CURRENT)
def test_role_guard_reads_the_old_branch_as_transitional(tmp_path, release):
    """The role's guard (apt-cache show --no-all-versions | dinops_apt_transitional) on apt's real output: the old
    default's packages are flagged, the 580 ones are not."""
    archive = UbuntuArchive(tmp_path, release)
    old = [name.format(variant="-open") for name in OLD_DEFAULT]
    show = archive.apt_cache("show", "--no-all-versions", *old)
    assert show.returncode == 0, show.stderr
    assert filters.dinops_apt_transitional(show.stdout) == sorted(old)
    new = [name.replace("535", BRANCH) for name in old]
    assert filters.dinops_apt_transitional(archive.apt_cache("show", "--no-all-versions", *new).stdout) == []


# --- the new plan ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel_modules", ["open", "proprietary"])
@pytest.mark.parametrize("release", CURRENT)
def test_plan_installs_one_branch_nvidia_smi_and_the_newest_kernels_module(tmp_path, release, kernel_modules):
    """A fresh VM whose kernel is older than the archive's newest (the usual cloud image): the plan resolves, the
    guard passes, and apt installs one real branch (580) of userspace, nvidia-smi's package, the LRM flavour
    metapackage and, through it, the module of the newest kernel ABI (the kernel the reboot boots). No
    transitional package. The LRM stanzas are modelled (module docstring)."""
    archive, kernel = host(tmp_path, release, running="oldest")
    the_plan = plan(settings(archive, kernel, kernel_modules))
    assert the_plan["flavour"] == kernel_modules
    run = run_role(archive, the_plan)
    assert run.stopped_at is None, run.message
    assert run.missing == [] and run.transitional == []
    assert real_driver_sources(archive) == {"nvidia-graphics-drivers-580-server": {LATEST_580}}
    assert "nvidia-utils-580-server" in archive.state()
    assert transitional_installed(archive) == []
    variant = "-server-open" if kernel_modules == "open" else "-server"
    newest = list(kernel_abis(archive))[-1]
    assert module_packages(archive) == sorted(
        [f"linux-modules-nvidia-580{variant}-generic", f"linux-modules-nvidia-580{variant}-{newest}-generic"]
    )
    assert f"linux-image-{newest}-generic" in archive.state()


@pytest.mark.parametrize("kernel_modules", ["open", "proprietary"])
def test_plan_on_focal_resolves_its_userspace_and_names_the_missing_module_package(tmp_path, kernel_modules):
    """focal: the snapshot has the 580-server userspace (git 580-server-focal 580.126.20) but no LRM stanza (facts
    §4, not established), so the plan's module metapackage is not in this archive: the role must stop and name it
    instead of installing a driver without a module. The userspace part resolves to one real branch."""
    archive, kernel = host(tmp_path, "focal")
    the_plan = plan(settings(archive, kernel, kernel_modules))
    variant = "-server-open" if kernel_modules == "open" else "-server"
    meta = f"linux-modules-nvidia-580{variant}-generic"
    assert meta in the_plan["packages"]
    run = run_role(archive, the_plan)
    assert run.stopped_at in ("check", "install")
    assert run.missing == [meta]
    if run.stopped_at == "install":
        assert f"Unable to locate package {meta}" in run.message
    userspace = archive.simulate("install", [p for p in the_plan["packages"] if p != meta])
    assert userspace.ok, userspace
    archive.apply(userspace)
    assert real_driver_sources(archive) == {"nvidia-graphics-drivers-580-server": {"580.126.20"}}
    assert transitional_installed(archive) == []


def test_apt_cache_show_exits_0_when_only_some_names_are_missing(tmp_path):
    """apt's behaviour the role's guard relies on (tasks/packages.yml stops on rc != 0): ``apt-cache show`` exits 100
    ('E: No packages found') only when none of the names exists; a missing name next to found ones is skipped
    silently (exit 0, nothing on stderr). Missing packages then surface at the install step instead."""
    archive = UbuntuArchive(tmp_path, "focal")
    missing = "linux-modules-nvidia-580-server-generic"
    both = archive.apt_cache("show", "--no-all-versions", "nvidia-utils-580-server", missing)
    assert (both.returncode, both.stderr) == (0, "")
    alone = archive.apt_cache("show", "--no-all-versions", missing)
    assert alone.returncode == 100 and "No packages found" in alone.stderr


@pytest.mark.parametrize("release", CURRENT)
def test_newer_kernel_installed_but_not_booted_gets_its_module(tmp_path, release):
    """Finding 3.2: unattended-upgrades or cloud-init installed a newer kernel before the role ran; the VM still runs
    the older one. The module must be there for the newest kernel, which GRUB boots at the reboot. (LRM modelled.)"""
    archive, kernel = host(tmp_path, release, running="oldest")
    newest = list(kernel_abis(archive))[-1]
    boot_kernel(archive, newest)  # installed, not running: `kernel` stays the older ABI
    assert {f"linux-image-{kernel}", f"linux-image-{newest}-generic"} <= set(archive.state())
    run = run_role(archive, plan(settings(archive, kernel)))
    assert run.stopped_at is None, run.message
    assert f"linux-modules-nvidia-580-server-open-{newest}-generic" in archive.state()


# --- branch and flavour changes on a provisioned host ---------------------------------------------------------------
def old_lrm_stanzas(archive: UbuntuArchive, kernel: str, variant: str, upstream: str) -> list[dict]:
    """The running kernel's 535-server LRM packages, as the old role installed (and held) them. Modelled: the snapshot
    has no 535 LRM stanza; relations follow the real jammy 515-server stanza in facts §4 (Depends on the kernel
    image, this ABI's signatures and objects, and nvidia-kernel-common-535-server between <U> and <U>-1), the
    version is this ABI's LRM upload in the snapshot."""
    lrm = archive.state()[f"linux-signatures-nvidia-{kernel}"]
    common = {"version": lrm, "section": "restricted/kernel", "source_package": "linux-restricted-modules"}
    common |= {"evidence": "modelled in tests/ansible/test_ubuntu_archive.py", "snapshot": "none", "source": "facts §4"}
    objects = f"linux-objects-nvidia-535{variant}-{kernel}"
    return [
        {"package": objects, "depends": "binutils", **common},
        {
            "package": f"linux-modules-nvidia-535{variant}-{kernel}",
            "depends": f"debconf (>= 0.5) | debconf-2.0, linux-image-{kernel} | linux-image-unsigned-{kernel},"
            f" linux-signatures-nvidia-{kernel} (= {lrm}), {objects} (= {lrm}),"
            f" nvidia-kernel-common-535-server (<= {upstream}-1), nvidia-kernel-common-535-server (>= {upstream})",
            **common,
        },
    ]


def provisioned_with_535(tmp_path, release: str) -> tuple[UbuntuArchive, str, list[str], str]:
    """A host the old role provisioned while 535-server was real: the real 535.288.01 packages (every package of the
    set at that version: apt keeps the newest candidate otherwise, facts §6.4), the running kernel's 535 LRM module
    (modelled), the old role's holds and its branch pin file."""
    archive, kernel = host(tmp_path, release)
    real = [
        s for s in archive.stanzas if s.get("source_package") == f"{DRIVER_SOURCE}535-server" and not s["transitional"]
    ]
    version = real[0]["version"]
    upstream = version.split("-")[0]
    names = [f"{name.format(variant='-open')}={version}" for name in OLD_DEFAULT]
    deps = ["nvidia-kernel-common", "nvidia-kernel-source", "nvidia-compute-utils", "libnvidia-cfg1"]
    names += [f"{d}-535-server{'-open' if d == 'nvidia-kernel-source' else ''}={version}" for d in deps]
    # What the modelled LRM packages depend on.
    result = archive.simulate("install", [*names, f"linux-signatures-nvidia-{kernel}", "debconf", "binutils"])
    assert result.ok, result
    archive.apply(result)
    lrm = old_lrm_stanzas(archive, kernel, "-server-open", upstream)
    held = [name.format(variant="-open") for name in OLD_DEFAULT] + [lrm[1]["package"]]
    archive.installed(archive.state(), held=held, extra_stanzas=lrm)
    pinned = " ".join(name.format(variant="-open") for name in OLD_DEFAULT)
    archive.preferences(f"Package: {pinned}\nPin: version 535.*\nPin-Priority: 1001\n")
    return archive, kernel, held, version


@pytest.mark.parametrize("release", CURRENT)
def test_branch_change_535_to_580_on_a_host_the_old_role_held(tmp_path, release):
    """Finding 7: the old role held its 535 packages. With the holds kept apt refuses the 580 install, and
    --allow-change-held-packages alone does not help (it only lifts the final "Held packages were changed" check;
    the resolver still may not touch held packages). The plan's unhold list, released first (dpkg_selections:
    install) as tasks/packages.yml does, then remove + install, gets the host onto 580: no real 535 package is left
    but the 535 GSP firmware, and the module follows the newest kernel. (535 LRM packages modelled.)"""
    archive, kernel, held, version_535 = provisioned_with_535(tmp_path, release)
    the_plan = plan(settings(archive, kernel))
    for allow_change_held in (False, True):
        kept = archive.simulate("install", the_plan["packages"], allow_change_held=allow_change_held)
        assert not kept.ok and "held packages" in kept.error, kept

    assert the_plan["unhold"] == sorted(held)
    run = run_role(archive, the_plan)
    assert run.stopped_at is None, run.message
    assert archive.held() == []
    # The 535 GSP firmware stays (not in the remove list; nothing depends on it any more: apt autoremove material);
    # every other 535 package left is an empty transitional that depends on its 580 counterpart.
    firmware = f"nvidia-firmware-535-server-{version_535.split('-')[0]}"
    real_535 = [n for n in archive.state() if "535" in n and n not in transitional_installed(archive)]
    assert real_535 in ([], [firmware])
    assert real_driver_sources(archive, firmware=False) == {"nvidia-graphics-drivers-580-server": {LATEST_580}}
    newest = list(kernel_abis(archive))[-1]
    assert module_packages(archive) == sorted(
        ["linux-modules-nvidia-580-server-open-generic", f"linux-modules-nvidia-580-server-open-{newest}-generic"]
    )


@pytest.mark.parametrize(("old", "new"), [("open", "proprietary"), ("proprietary", "open")])
@pytest.mark.parametrize("release", CURRENT)
def test_kernel_module_flavour_change(tmp_path, release, old, new):
    """Open <-> proprietary on a host the role provisioned: the plan's remove list (apt-get remove --purge) then the
    install resolves, and no package of the old flavour stays: the LRM packages of the two flavours do not
    conflict (modelled stanzas, as far as the snapshot shows), so without the remove list both modules would stay
    installed for the same kernel."""
    archive, kernel = host(tmp_path, release, running="newest")
    first = run_role(archive, plan(settings(archive, kernel, old)))
    assert first.stopped_at is None, first.message
    the_plan = plan(settings(archive, kernel, new))
    old_variant = "-server-open" if old == "open" else "-server"
    new_variant = "-server-open" if new == "open" else "-server"
    assert f"linux-modules-nvidia-580{old_variant}-generic" in the_plan["remove"]
    newest = list(kernel_abis(archive))[-1]
    without_remove = archive.simulate("install", the_plan["packages"], allow_change_held=True)
    assert without_remove.ok, without_remove
    assert f"linux-modules-nvidia-580{old_variant}-{newest}-generic" not in without_remove.removed
    run = run_role(archive, the_plan)
    assert run.stopped_at is None, run.message
    assert module_packages(archive) == sorted(
        [f"linux-modules-nvidia-580{new_variant}-generic", f"linux-modules-nvidia-580{new_variant}-{newest}-generic"]
    )
    flavoured = ("nvidia-headless-no-dkms-", "nvidia-kernel-source-", "linux-modules-nvidia-", "linux-objects-nvidia-")
    left = sorted(
        name for name in archive.state() if name.startswith(flavoured) and ("-server-open" in name) != (new == "open")
    )
    assert left == []
    assert f"nvidia-headless-no-dkms-580{new_variant}" in archive.state()
    assert f"nvidia-kernel-source-580{new_variant}" in archive.state()
    assert real_driver_sources(archive) == {"nvidia-graphics-drivers-580-server": {LATEST_580}}


# --- NVSwitch hosts --------------------------------------------------------------------------------------------------
H100 = [{"architecture": "hopper", "datacenter": True, "name": "H100 SXM5 80GB"}]


def pin_role(archive: UbuntuArchive, the_plan: dict) -> dict:
    """roles/nvidia_driver/tasks/pin.yml on the fake archive: read Fabric Manager's versions (every version, newest
    first) and the prebuilt module's candidate with apt-cache, decide with dinops_fabricmanager_pin, and write the pin
    as templates/apt-preferences.j2 does when the role goes on."""
    fabricmanager = modules = ""
    if the_plan["services"]:
        fabricmanager = archive.apt_cache("show", f"nvidia-fabricmanager-{the_plan['branch']}").stdout
        if the_plan["modules_package"]:
            modules = archive.apt_cache("show", "--no-all-versions", the_plan["modules_package"]).stdout
    decision = manager.dinops_fabricmanager_pin(the_plan, fabricmanager, modules)
    if decision["pin"] and not decision["errors"]:
        pin = decision["pin"]
        archive.preferences(
            f"Package: {' '.join(pin['packages'])}\nPin: version {pin['version']}\nPin-Priority: 1001\n"
        )
    return decision


def test_fabric_manager_and_the_prebuilt_module_need_different_drivers_on_noble(tmp_path):
    """Finding F5 with the snapshot's versions: nvidia-fabricmanager-580 580.159.03-0ubuntu0.24.04.1 depends on the
    exact virtual nvidia-kernel-common-580-server-580.159.03 (packages.ubuntu.com, facts §5), while the newest kernel's
    prebuilt module was built with the archive's driver, 580.173.02, and accepts that one only (both bounds, facts §4;
    modelled, see the module docstring). Unpinned, Fabric Manager cannot be installed; pinned to its version, the
    module cannot. The role reads both with apt-cache and stops before it changes a package, saying what to do."""
    archive, kernel = host(tmp_path, "noble", running="newest")
    the_plan = plan(settings(archive, kernel, gpus=H100, kernel_modules="auto", nvswitch_count=4))
    assert the_plan["packages"][-2:] == ["linux-modules-nvidia-580-server-open-generic", "nvidia-fabricmanager-580"]
    assert not [p for p in the_plan["packages"] if "nscq" in p]  # Ubuntu's fabric-manager source builds no NSCQ
    assert the_plan["services"] == ["nvidia-fabricmanager"]

    as_planned = archive.simulate("install", the_plan["packages"], allow_change_held=True)
    assert not as_planned.ok
    assert "nvidia-fabricmanager-580 : Depends: nvidia-kernel-common-580-server-580.159.03" in as_planned.error
    archive.preferences("Package: nvidia-* libnvidia-*\nPin: version 580.159.03-*\nPin-Priority: 1001\n")
    pinned = archive.simulate("install", the_plan["packages"], allow_change_held=True)
    assert not pinned.ok
    assert "Depends: nvidia-kernel-common-580-server (>= 580.173.02) but 580.159.03-" in pinned.error
    archive.preferences("")

    decision = pin_role(archive, the_plan)
    assert (decision["version"], decision["modules_version"]) == ("580.159.03", "580.173.02")
    assert "nvidia_driver_prebuilt_modules: false" in decision["errors"][0]
    assert "run again once Ubuntu publishes nvidia-fabricmanager-580 580.173.02" in decision["errors"][0]


def test_fabric_manager_with_dkms_installs_the_driver_at_its_version_on_noble(tmp_path):
    """What the stop message offers: with nvidia_driver_prebuilt_modules false the plan takes DKMS and the kernel
    headers, the pin is Fabric Manager's version, and the whole set resolves at 580.159.03."""
    archive, kernel = host(tmp_path, "noble", running="newest")
    the_plan = plan(settings(archive, kernel, gpus=H100, nvswitch_count=4, prebuilt_modules=False))
    assert (the_plan["errors"], the_plan["modules_package"]) == ([], "")

    decision = pin_role(archive, the_plan)
    assert (decision["pin"]["version"], decision["errors"]) == ("580.159.03-*", [])
    run = run_role(archive, the_plan, pinned=True)

    assert run.stopped_at is None, run.message
    assert real_driver_sources(archive) == {"nvidia-graphics-drivers-580-server": {"580.159.03"}}
    assert archive.state()["nvidia-fabricmanager-580"].startswith("580.159.03-")
    assert archive.state()["nvidia-dkms-580-server-open"].startswith("580.159.03-")
    assert module_packages(archive) == []


def test_switching_a_provisioned_host_to_dkms_removes_the_prebuilt_module(tmp_path):
    """A host the role provisioned with the prebuilt module (580.173.02), then found to have NVSwitches (or told to
    use DKMS): the plan's remove list takes the prebuilt module out, and the pinned install moves the driver down to
    Fabric Manager's 580.159.03. The prebuilt module, bound to 580.173.02, could not stay."""
    archive, kernel = host(tmp_path, "noble", running="newest")
    assert run_role(archive, plan(settings(archive, kernel, gpus=H100))).stopped_at is None
    assert module_packages(archive) != []

    the_plan = plan(settings(archive, kernel, gpus=H100, nvswitch_count=4, prebuilt_modules=False))
    assert sorted(the_plan["remove"]) == sorted(
        name for name in archive.state() if name.startswith(("linux-modules-nvidia-", "linux-objects-nvidia-"))
    )
    assert pin_role(archive, the_plan)["errors"] == []
    without_downgrades = archive.simulate("install", ["nvidia-headless-580-server-open", "nvidia-fabricmanager-580"])
    assert "E: Packages were downgraded and -y was used without --allow-downgrades." in without_downgrades.error
    run = run_role(archive, the_plan, pinned=True)

    assert run.stopped_at is None, run.message
    assert module_packages(archive) == []
    # The 580.173.02 GSP firmware stays (its version is in its name; nothing depends on it: apt autoremove material).
    assert real_driver_sources(archive, firmware=False) == {"nvidia-graphics-drivers-580-server": {"580.159.03"}}
    assert archive.state()["nvidia-fabricmanager-580"].startswith("580.159.03-")
    assert archive.state()["nvidia-dkms-580-server-open"].startswith("580.159.03-")


def test_a_newer_fabric_manager_is_seen_through_the_pin_of_an_earlier_run(tmp_path):
    """Once Ubuntu publishes Fabric Manager for the current driver, the host goes back to one version for all: the
    role reads every version (apt-cache show lists them newest first), not the candidate, which its own earlier pin
    (580.159.03) would keep old. Modelled: nvidia-fabricmanager-580 580.173.02, built like the real 580.159.03 one."""
    stanzas = load_stanzas("noble")
    current = next(s for s in stanzas if s["package"] == "nvidia-fabricmanager-580")
    newer = {**current, "version": "580.173.02-0ubuntu0.24.04.1", "evidence": "modelled in this test"}
    newer["depends"] = "nvidia-kernel-common-580-server-580.173.02"
    archive = UbuntuArchive(tmp_path, "noble", stanzas=[*stanzas, newer])
    kernel = boot_kernel(archive, list(kernel_abis(archive))[-1])
    the_plan = plan(settings(archive, kernel, gpus=H100, kernel_modules="auto", nvswitch_count=4))
    archive.preferences("Package: nvidia-* libnvidia-*\nPin: version 580.159.03-*\nPin-Priority: 1001\n")
    candidate = archive.apt_cache("show", "--no-all-versions", "nvidia-fabricmanager-580").stdout
    assert manager.dinops_fabricmanager_version(candidate, "580") == "580.159.03"  # what the old read saw

    decision = pin_role(archive, the_plan)
    assert (decision["version"], decision["modules_version"], decision["errors"]) == ("580.173.02", "580.173.02", [])
    run = run_role(archive, the_plan, pinned=True)

    assert run.stopped_at is None, run.message
    assert archive.state()["nvidia-fabricmanager-580"] == "580.173.02-0ubuntu0.24.04.1"
    assert real_driver_sources(archive) == {"nvidia-graphics-drivers-580-server": {LATEST_580}}
    assert "linux-modules-nvidia-580-server-open-generic" in module_packages(archive)
