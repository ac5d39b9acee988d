"""Ubuntu's NVIDIA package graph for one release as a real, installable flat apt repository, in one tarball.

    ubuntu_archive.py OUT.tar.gz [--release noble] [--overlay DIR] < installed-package-names

The tarball is unpacked at the instance's root. Every stanza of tests/fixtures/ubuntu_nvidia/packages.json for the
release (loaded with tests/aptarchive.py) becomes an empty .deb with the stanza's control fields (Depends,
Pre-Depends, Provides, Conflicts, Breaks, Replaces, Section, Description) in ``srv/ubuntu/``, indexed by its
Packages and Release files for ``deb [trusted=yes] file:/srv/ubuntu ./``. External dependencies get aptarchive's
empty stand-ins, but only those the instance does not have installed (the names on stdin): a stand-in must never
replace a real package such as libc6, debconf or kmod.

``srv/ubuntu-gone/`` holds what is no longer in the archive: the 535-server open kernel module of the oldest kernel
ABI, as an earlier version of the nvidia_driver role installed it. Modelled (the snapshot has no 535 LRM stanza) the
way tests/ansible/test_ubuntu_archive.py's ``old_lrm_stanzas`` does, on the real jammy 515-server stanza (facts §4).
The files under ``--overlay`` (os-release, apt source, boot tool stand-ins) go in at their relative paths: one
transfer for everything prepare places.

Standard library only; the .deb files (ar archives of debian-binary, control.tar.gz and an empty data.tar.gz) are
written in memory, so a few hundred take well under a second.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from aptarchive import STUBS, _deb822, load_stanzas, relation_names, stub_stanzas  # noqa: E402

# Fields of a Packages entry that describe the .deb file, not the package.
_FILE_FIELDS = re.compile(r"^(Filename|Size|SHA256): .*\n", re.M)
_MTIME = 1767225600  # 2026-01-01: reproducible archives


def _tar_gz(members: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        root = tarfile.TarInfo("./")
        root.type, root.mode, root.mtime = tarfile.DIRTYPE, 0o755, _MTIME
        tar.addfile(root)
        for name, data in members.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, _MTIME
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=_MTIME)


def build_deb(control: str) -> bytes:
    """An empty binary package: dpkg's ar layout (deb(5)) with this control file."""
    out = io.BytesIO()
    out.write(b"!<arch>\n")
    for name, data in (
        ("debian-binary", b"2.0\n"),
        ("control.tar.gz", _tar_gz({"control": control.encode()})),
        ("data.tar.gz", _tar_gz({})),
    ):
        out.write(f"{name:<16}{_MTIME:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode())
        out.write(data + (b"\n" if len(data) % 2 else b""))
    return out.getvalue()


def gone_stanzas(stanzas: list[dict]) -> list[dict]:
    """The oldest kernel ABI's 535-server open module and objects, at the real 535-server version (modelled)."""
    lrm = {s["package"]: s["version"] for s in stanzas if s["package"].startswith("linux-signatures-nvidia-")}
    signatures = min(lrm, key=lambda name: [int(n) for n in re.findall(r"\d+", name)])
    kernel = signatures.removeprefix("linux-signatures-nvidia-")
    driver = min(s["version"] for s in stanzas if s["package"] == "nvidia-kernel-common-535-server")
    upstream = driver.split("-")[0]
    common = {"version": lrm[signatures], "section": "restricted/kernel", "source_package": "linux-restricted-modules"}
    common["evidence"], common["snapshot"] = "modelled in molecule/nvidia_driver_ubuntu", "none"
    objects = f"linux-objects-nvidia-535-server-open-{kernel}"
    module_depends = (
        f"debconf (>= 0.5) | debconf-2.0, linux-image-{kernel} | linux-image-unsigned-{kernel},"
        f" {signatures} (= {lrm[signatures]}), {objects} (= {lrm[signatures]}),"
        f" nvidia-kernel-common-535-server (<= {upstream}-1), nvidia-kernel-common-535-server (>= {upstream})"
    )
    return [
        {"package": objects, "depends": "binutils", **common},
        {"package": f"linux-modules-nvidia-535-server-open-{kernel}", "depends": module_depends, **common},
    ]


def add_debs(tar: tarfile.TarFile, folder: str, stanzas: list[dict]) -> list[str]:
    """Each stanza's .deb under folder/; returns their Packages entries."""
    entries = []
    for stanza in stanzas:
        control = _FILE_FIELDS.sub("", _deb822(stanza))
        deb = build_deb(control)
        version = stanza["version"].split(":", 1)[-1]
        filename = f"{stanza['package']}_{version}_{stanza.get('architecture') or 'amd64'}.deb"
        _add(tar, f"{folder}/{filename}", deb)
        file_fields = f"Filename: ./{filename}\nSize: {len(deb)}\nSHA256: {hashlib.sha256(deb).hexdigest()}\n"
        entries.append(control.replace("\nDescription: ", f"\n{file_fields}Description: ", 1))
    return entries


def add_index(tar: tarfile.TarFile, folder: str, entries: list[str], release: str) -> None:
    """Packages and Release: apt's flat repository format."""
    packages = "\n".join(entries).encode()
    _add(tar, f"{folder}/Packages", packages)
    release_file = (
        f"Origin: dinops-tests\nLabel: dinops-tests\nSuite: {release}\nCodename: {release}\n"
        f"Architectures: amd64 all\nSHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
    )
    _add(tar, f"{folder}/Release", release_file.encode())


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, _MTIME
    tar.addfile(info, io.BytesIO(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the tarball to write, to unpack at the instance's root")
    parser.add_argument("--release", default="noble")
    parser.add_argument("--overlay", type=Path, help="a tree of files to add at their relative paths")
    args = parser.parse_args()
    installed = set(sys.stdin.read().split())
    stanzas = load_stanzas(args.release)
    needed = {n for s in stanzas for f in ("depends", "pre_depends") for n in relation_names(s.get(f, ""))}
    stubs = {name: provides for name, provides in STUBS.items() if name in needed and name not in installed}
    with tarfile.open(args.out, "w:gz") as tar:
        add_index(tar, "srv/ubuntu", add_debs(tar, "srv/ubuntu", stanzas + stub_stanzas(stubs)), args.release)
        add_debs(tar, "srv/ubuntu-gone", gone_stanzas(stanzas))
        for path in sorted(args.overlay.rglob("*")) if args.overlay else []:
            if path.is_file():
                mode = 0o755 if os.access(path, os.X_OK) else 0o644
                _add(tar, str(path.relative_to(args.overlay)), path.read_bytes(), mode)
    print(f"{len(stanzas)} {args.release} packages, stand-ins for {', '.join(sorted(stubs)) or 'nothing'}")


if __name__ == "__main__":
    main()
