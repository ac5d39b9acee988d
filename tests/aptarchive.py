"""A fake Ubuntu apt archive built from real package stanzas, and the host's real apt-get run against it.

The stanzas come from tests/fixtures/ubuntu_nvidia/packages.json (a cut of the shared NVIDIA packaging snapshot,
see the README there). ``UbuntuArchive`` writes them as a flat local repository (Packages + Release, no .deb files:
``apt-get -s`` never downloads), a dpkg status file that says what is installed and what is held, and an apt
configuration that points every apt directory into the archive's own folder: the machine's sources, preferences,
apt.conf.d, lists, cache and dpkg state are never read or written. It runs as any user, needs no network and no
container, and one simulation takes a few hundredths of a second.

    archive = UbuntuArchive(tmp_path, release="noble")
    archive.installed({"nvidia-utils-535-server": "535.288.01-0ubuntu0.24.04.3"}, held=["nvidia-utils-535-server"])
    result = archive.simulate("install", ["nvidia-utils-580-server"], allow_change_held=False)
    result.ok, result.installed, result.removed, result.error

Dependencies on packages outside the snapshot (adduser, dkms, kmod, ...) are satisfied by ``STUBS``: empty packages
with a high version, listed in ../shared/facts/ubuntu-nvidia-packaging.md §0 as the snapshot's external dependencies.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ubuntu_nvidia" / "packages.json"
# Ubuntu release number -> the codename the snapshot uses.
UBUNTU_CODENAMES = {"20.04": "focal", "22.04": "jammy", "24.04": "noble"}

# Packages the snapshot depends on but does not describe (facts §0). Empty, and versioned high enough for every
# versioned dependency in the data (debconf (>= 0.5), linux-base (>= 4.5ubuntu1~16.04.1), xserver-xorg-core
# (>= 2:1.19.6-1ubuntu2~), dkms (>= 3.0.3-4~)). Value: what the stub Provides.
STUB_VERSION = "9:99-stub"
STUBS: dict[str, str] = {
    "adduser": "",
    "amd64-microcode": "",
    "binutils": "",
    "debconf": "debconf-2.0",
    "dkms": "",
    "intel-microcode": "",
    "kmod": "",
    "libc6": "",
    "libnvidia-egl-wayland1": "",
    "libx11-6": "",
    "linux-base": "",
    "linux-firmware": "",
    "ocl-icd-libopencl1": "",
    "xserver-xorg-core": "xorg-video-abi-25",
}

# The snapshot's field names -> deb822 field names, in the order a Packages file lists them.
RELATIONS = (
    ("pre_depends", "Pre-Depends"),
    ("depends", "Depends"),
    ("recommends", "Recommends"),
    ("provides", "Provides"),
    ("conflicts", "Conflicts"),
    ("breaks", "Breaks"),
    ("replaces", "Replaces"),
)
# apt-get -s never downloads, so no .deb exists; apt only insists on a non-zero Size and a checksum.
_DEB_SIZE = 1024
_DEB_SHA256 = hashlib.sha256(b"\0" * _DEB_SIZE).hexdigest()


def load_stanzas(release: str | None = None, path: Path = FIXTURE) -> list[dict]:
    """The fixture's stanzas in the snapshot's own form (one dict per binary package version), for one release."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for group in data["groups"]:
        common = {k: v for k, v in group.items() if k != "stanzas"}
        for body in group["stanzas"]:
            stanza = {
                "architecture": "amd64",
                "section": "",
                "multi_arch": "",
                **{field: "" for field, _ in RELATIONS},
                "transitional": False,
                "transitional_to": [],
                **common,
                **body,
            }
            if release is None or stanza["release"] == release:
                out.append(stanza)
    return out


def relation_names(field: str) -> list[str]:
    """Package names in a Depends-style field (every alternative; versions and architecture qualifiers dropped)."""
    return [re.split(r"[\s(:]", alt.strip())[0] for alt in re.split(r"[,|]", field) if alt.strip()]


def is_transitional(fields: Mapping[str, str]) -> bool:
    """What a role can see in ``apt-cache show``: Section oldlibs, or "transitional" in the description."""
    section = fields.get("Section", "")
    return section.split("/")[-1] == "oldlibs" or "transitional" in fields.get("Description", "").lower()


def _description(stanza: dict) -> str:
    if stanza.get("transitional"):
        # Canonical's wording for transitionals (debian/templates/control.in of the transitional sources).
        targets = ", ".join(stanza.get("transitional_to") or relation_names(stanza.get("depends", "")))
        return f"Transitional package for {targets}\n This is a transitional package. It can safely be removed."
    if stanza.get("stub"):
        return f"{stanza['package']} (test stub)\n Empty stand-in for a package the NVIDIA snapshot does not describe."
    return f"{stanza['package']}\n From {stanza.get('source_package') or 'unknown source'}; snapshot data."


def _deb822(stanza: dict, status: str | None = None) -> str:
    """One Packages (status None) or dpkg status stanza."""
    lines = [f"Package: {stanza['package']}"]
    if status:
        lines.append(f"Status: {status}")
    lines.append("Priority: optional")
    lines.append(f"Section: {stanza.get('section') or 'misc'}")
    lines.append("Maintainer: dinops tests <root@localhost>")
    lines.append(f"Architecture: {stanza.get('architecture') or 'amd64'}")
    if stanza.get("multi_arch"):
        lines.append(f"Multi-Arch: {stanza['multi_arch']}")
    source = stanza.get("source_package")
    if source and source != stanza["package"]:
        lines.append(f"Source: {source}")
    lines.append(f"Version: {stanza['version']}")
    for field, name in RELATIONS:
        if stanza.get(field):
            lines.append(f"{name}: {stanza[field]}")
    if status is None:
        version = stanza["version"].split(":", 1)[-1]
        arch = stanza.get("architecture") or "amd64"
        lines.append(f"Filename: pool/{stanza['package']}_{version}_{arch}.deb")
        lines.append(f"Size: {_DEB_SIZE}")
        lines.append(f"SHA256: {_DEB_SHA256}")
    if stanza.get("evidence"):
        lines.append(f"X-Dinops-Evidence: {stanza['evidence']} ({stanza.get('snapshot', '')})")
    lines.append(f"Description: {_description(stanza)}")
    return "\n".join(lines) + "\n"


def stub_stanzas(stubs: Mapping[str, str] = STUBS) -> list[dict]:
    return [
        {"package": name, "version": STUB_VERSION, "section": "stub", "provides": provides, "stub": True}
        for name, provides in sorted(stubs.items())
    ]


@dataclasses.dataclass
class SimResult:
    """What ``apt-get -s`` said: the packages it would install (new or upgraded, name -> new version) and remove
    (name -> installed version), its exit status and output; ``error`` is the E: lines and the unmet-dependency
    report when it failed ('' when it succeeded)."""

    command: list[str]
    returncode: int
    output: str
    installed: dict[str, str]
    removed: dict[str, str]
    upgraded: dict[str, tuple[str, str]]
    error: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def __str__(self) -> str:  # shown by pytest when an assertion on the result fails
        return f"$ {' '.join(self.command)}\n{self.output}"


_INST = re.compile(r"^Inst (\S+) (?:\[(\S+)\] )?\((\S+) ")
_REMV = re.compile(r"^(?:Remv|Purg) (\S+)(?: \[(\S+)\])?")


def _parse(output: str) -> tuple[dict[str, str], dict[str, str], dict[str, tuple[str, str]]]:
    installed, removed, upgraded = {}, {}, {}
    for line in output.splitlines():
        if m := _INST.match(line):
            name, old, new = m.groups()
            installed[name.split(":")[0]] = new
            if old:
                upgraded[name.split(":")[0]] = (old, new)
        elif m := _REMV.match(line):
            removed[m.group(1).split(":")[0]] = m.group(2) or ""
    return installed, removed, upgraded


def _errors(output: str) -> str:
    """The part of apt's output that explains a failure."""
    keep, in_block = [], False
    for line in output.splitlines():
        if line.startswith(("E: ", "W: ")):
            keep.append(line)
            in_block = False
        elif "have unmet dependencies" in line or line.startswith("The following packages have unmet"):
            keep.append(line)
            in_block = True
        elif in_block and line.startswith(" "):
            keep.append(line)
        else:
            in_block = False
    return "\n".join(keep)


class UbuntuArchive:
    """A flat apt repository of one release's stanzas plus a fake dpkg state, all under ``root``."""

    def __init__(
        self,
        root: Path,
        release: str = "noble",
        stanzas: Iterable[dict] | None = None,
        stubs: Mapping[str, str] = STUBS,
    ):
        self.root = Path(root)
        self.release = UBUNTU_CODENAMES.get(release, release)
        data = list(stanzas) if stanzas is not None else load_stanzas(self.release)
        if not data:
            raise ValueError(f"no stanzas for release {release!r}")
        self.stanzas = data + stub_stanzas(stubs)
        self._by_version = {(s["package"], s["version"]): s for s in self.stanzas}
        self.repo = self.root / "repo"
        self._selections: dict[str, str] = {}  # package -> install | hold
        self._state: dict[str, dict] = {}  # package -> installed stanza
        folders = ("repo", "etc/apt.conf.d", "etc/sources.list.d", "etc/preferences.d", "state/lists/partial")
        for folder in (*folders, "cache/archives/partial", "log"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self._write_repo()
        (self.root / "etc" / "sources.list").write_text(f"deb [trusted=yes] file:{self.repo} ./\n")
        (self.root / "etc" / "preferences").write_text("")
        # Read instead of /etc/apt/apt.conf and before apt.conf.d: apt.conf.d is redirected to an empty folder, so
        # nothing of the machine's apt configuration applies.
        (self.root / "apt.conf").write_text(
            f'Dir::Etc::parts "{self.root}/etc/apt.conf.d";\nDir::Etc::main "{self.root}/etc/apt.conf";\n'
        )
        self._write_status()
        self._run(["apt-get", "update"], check=True)

    # --- building ---------------------------------------------------------------------------------------------
    def _write_repo(self) -> None:
        packages = "\n".join(_deb822(s) for s in self.stanzas)
        (self.repo / "Packages").write_text(packages, encoding="utf-8")
        body = packages.encode("utf-8")
        (self.repo / "Release").write_text(
            f"Origin: dinops-tests\nLabel: dinops-tests\nSuite: {self.release}\nCodename: {self.release}\n"
            "Date: Thu, 01 Jan 2026 00:00:00 UTC\nArchitectures: amd64 all\n"
            f"SHA256:\n {hashlib.sha256(body).hexdigest()} {len(body)} Packages\n"
        )

    def _write_status(self) -> None:
        text = "\n".join(
            _deb822(stanza, f"{self._selections.get(name, 'install')} ok installed")
            for name, stanza in sorted(self._state.items())
        )
        (self.root / "status").write_text(text, encoding="utf-8")

    def versions(self, package: str) -> list[str]:
        """The versions the data has for package, in the data's order (ask apt for the candidate)."""
        return [s["version"] for s in self.stanzas if s["package"] == package]

    def stanza(self, package: str, version: str) -> dict:
        return self._by_version[(package, version)]

    # --- dpkg state -------------------------------------------------------------------------------------------
    def installed(
        self,
        packages: Mapping[str, str],
        held: Iterable[str] = (),
        extra_stanzas: Iterable[dict] = (),
    ) -> None:
        """Replace the dpkg state: ``packages`` (name -> version, as in the archive) are installed, ``held`` are on
        hold (``Status: hold ok installed``). ``extra_stanzas`` are installed too although the archive does not
        have them (packages that have left the archive; each a dict in the snapshot's form)."""
        self._state = {name: self._by_version[(name, version)] for name, version in packages.items()}
        for stanza in extra_stanzas:
            self._state[stanza["package"]] = stanza
        held = set(held)
        missing = held - set(self._state)
        if missing:
            raise ValueError(f"cannot hold packages that are not installed: {sorted(missing)}")
        self._selections = {name: "hold" for name in held}
        self._write_status()

    def state(self) -> dict[str, str]:
        """Installed packages, name -> version."""
        return {name: s["version"] for name, s in self._state.items()}

    def installed_stanza(self, package: str) -> dict:
        return self._state[package]

    def held(self) -> list[str]:
        return sorted(name for name, sel in self._selections.items() if sel == "hold" and name in self._state)

    def select(self, packages: Iterable[str], selection: str) -> None:
        """``dpkg --set-selections`` (what Ansible's dpkg_selections does): 'install' releases a hold."""
        if selection not in ("install", "hold"):
            raise ValueError(selection)
        for name in packages:
            if name in self._state:
                self._selections[name] = selection
        self._write_status()

    def apply(self, result: SimResult) -> None:
        """Make a successful simulation's changes the new dpkg state (holds of packages that stay are kept)."""
        if not result.ok:
            raise ValueError(f"cannot apply a failed simulation:\n{result.error}")
        for name in result.removed:
            self._state.pop(name, None)
            self._selections.pop(name, None)
        for name, version in result.installed.items():
            self._state[name] = self._by_version[(name, version)]
        self._write_status()

    def preferences(self, text: str) -> None:
        """The apt preferences file (what /etc/apt/preferences.d holds on the host: pins)."""
        (self.root / "etc" / "preferences").write_text(text)

    # --- apt ----------------------------------------------------------------------------------------------------
    def apt_options(self) -> list[str]:
        r = self.root
        options = {
            "Dir::Etc::SourceList": f"{r}/etc/sources.list",
            "Dir::Etc::SourceParts": f"{r}/etc/sources.list.d",
            "Dir::Etc::Preferences": f"{r}/etc/preferences",
            "Dir::Etc::PreferencesParts": f"{r}/etc/preferences.d",
            "Dir::Etc::Trusted": f"{r}/etc/trusted.gpg",
            "Dir::Etc::TrustedParts": f"{r}/etc/trusted.gpg.d",
            "Dir::State": f"{r}/state",
            "Dir::State::status": f"{r}/status",
            "Dir::Cache": f"{r}/cache",
            "Dir::Log": f"{r}/log",
            "APT::Architecture": "amd64",
            "APT::Architectures": "amd64",
            "APT::Install-Recommends": "0",
            "APT::Install-Suggests": "0",
            "APT::Sandbox::User": getpass.getuser(),
            "Debug::NoLocking": "1",
            "Acquire::Languages": "none",
        }
        return [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]

    def _run(self, argv: list[str], check: bool = False) -> subprocess.CompletedProcess:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "APT_CONFIG": f"{self.root}/apt.conf"}
        command = [argv[0], *self.apt_options(), *argv[1:]]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        if check and (proc.returncode != 0 or "\nW: " in "\n" + proc.stderr or "\nE: " in "\n" + proc.stderr):
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    def simulate(
        self,
        action: str,
        packages: Iterable[str],
        allow_change_held: bool = False,
        extra_args: Iterable[str] = (),
    ) -> SimResult:
        """``apt-get -s -y --no-install-recommends <action> <packages>``, as Ansible's apt module runs it (-y;
        ``--allow-change-held-packages`` for allow_change_held_packages: true). ``name-`` removes in the same run."""
        argv = ["apt-get", "-s", "-y", "--no-install-recommends"]
        if allow_change_held:
            argv.append("--allow-change-held-packages")
        argv += [*extra_args, action, *packages]
        proc = self._run(argv)
        output = proc.stdout + proc.stderr
        installed, removed, upgraded = _parse(proc.stdout)
        return SimResult(
            command=argv,
            returncode=proc.returncode,
            output=output,
            installed=installed,
            removed=removed,
            upgraded=upgraded,
            error="" if proc.returncode == 0 else (_errors(output) or output),
        )

    def apt_cache(self, *args: str) -> subprocess.CompletedProcess:
        """``apt-cache <args>`` against this archive (stdout, stderr, returncode)."""
        return self._run(["apt-cache", *args])

    def candidate(self, package: str) -> str | None:
        """The version apt would install (``apt-cache policy``), None when apt has none."""
        out = self._run(["apt-cache", "policy", package]).stdout
        m = re.search(r"^\s*Candidate: (\S+)", out, re.M)
        return None if m is None or m.group(1) == "(none)" else m.group(1)

    def show(self, package: str, version: str | None = None) -> dict[str, str]:
        """``apt-cache show package=version`` (default: the candidate) as a dict of deb822 fields; {} if none."""
        version = version or self.candidate(package)
        if version is None:
            return {}
        out = self._run(["apt-cache", "show", f"{package}={version}"]).stdout
        fields: dict[str, str] = {}
        key = None
        for line in out.split("\n\n")[0].splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        return fields

    def unresolved_names(self) -> list[str]:
        """Names in Depends/Pre-Depends that no stanza or stub is or Provides, and that no alternative in the same
        dependency covers: a dependency apt can never satisfy in this archive."""
        known = set()
        for s in self.stanzas:
            known.add(s["package"])
            known.update(relation_names(s.get("provides", "")))
        missing = set()
        for s in self.stanzas:
            for field in ("depends", "pre_depends"):
                for dep in filter(None, (d.strip() for d in s.get(field, "").split(","))):
                    names = relation_names(dep)
                    if not any(n in known for n in names):
                        missing.update(names)
        return sorted(missing)
