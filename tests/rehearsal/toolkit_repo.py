"""A signed stand-in for NVIDIA's libnvidia-container repository, built on this machine for the GPU-host rehearsal.

    build_toolkit_repo(out) -> out, holding stable/deb/amd64/{*.deb,Packages,Release,InRelease} and gpgkey

The layout is NVIDIA's (a flat repository per architecture, suite ``/``), so the toolkit role's defaults change
only in their host (nvidia_container_toolkit_repo_base_url, _repo_key_url). As in molecule/nvidia_container_toolkit
(prepare.yml): the four packages at the role's pinned version with NVIDIA's dependencies, and
nvidia-container-toolkit-base carrying the Molecule scenario's stand-in nvidia-ctk (files/nvidia-ctk), which here
reads the banner of the loaded driver where the real one finds the driver: /proc/driver/nvidia/version. The index is
clear-signed with a key made for this build only; apt checks InRelease against the key the role downloads.

Needs dpkg-deb and gpg on this machine (Debian: dpkg, gpg).
"""

from __future__ import annotations

import email.utils
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NVIDIA_CTK = REPO / "molecule" / "nvidia_container_toolkit" / "files" / "nvidia-ctk"
BANNER = "/proc/driver/nvidia/version"
VERSION = "1.17.8-1"
# name -> Depends, as NVIDIA's packages of that version declare them.
PACKAGES = {
    "libnvidia-container1": "",
    "libnvidia-container-tools": f"libnvidia-container1 (>= {VERSION})",
    "nvidia-container-toolkit-base": "",
    "nvidia-container-toolkit": (
        f"nvidia-container-toolkit-base (= {VERSION}), libnvidia-container-tools (>= {VERSION})"
    ),
}


def _deb(name: str, depends: str, tree: Path, out: Path) -> Path:
    root = tree / name
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {VERSION}\nArchitecture: amd64\n"
        "Maintainer: dinops tests <tests@dinops.invalid>\n"
        + (f"Depends: {depends}\n" if depends else "")
        + f"Description: stand-in for NVIDIA's {name} in dinops' GPU-host rehearsal\n"
    )
    if name == "nvidia-container-toolkit-base":
        ctk = root / "usr" / "bin" / "nvidia-ctk"
        ctk.parent.mkdir(parents=True)
        ctk.write_text(NVIDIA_CTK.read_text().replace("/srv/fake-nvidia/driver/version", BANNER))
        ctk.chmod(0o755)
    deb = out / f"{name}_{VERSION}_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True)
    return deb


def _packages_entry(deb: Path, control: str) -> str:
    data = deb.read_bytes()
    files = f"Filename: ./{deb.name}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
    return control.replace("Description: ", files + "Description: ", 1)


def _sign(release: Path, key: Path) -> None:
    """Clear-sign Release into InRelease with a new key; the public key goes to key (ASCII armour)."""
    with tempfile.TemporaryDirectory(prefix="dinops-gpg-") as home:
        gpg = ["gpg", "--homedir", home, "--batch", "--quiet"]
        try:
            subprocess.run([*gpg, "--passphrase", "", "--quick-gen-key",
                            "dinops rehearsal repository <tests@dinops.invalid>", "ed25519", "sign", "never"],
                           check=True, capture_output=True)  # fmt: skip
            subprocess.run([*gpg, "--clearsign", "-o", str(release.parent / "InRelease"), str(release)],
                           check=True, capture_output=True)  # fmt: skip
            key.write_bytes(subprocess.run([*gpg, "--armor", "--export"], check=True, capture_output=True).stdout)
        finally:
            subprocess.run(["gpgconf", "--homedir", home, "--kill", "all"], capture_output=True, check=False)


def build_toolkit_repo(out: Path) -> Path:
    missing = [tool for tool in ("dpkg-deb", "gpg", "gpgconf") if not shutil.which(tool)]
    if missing:
        raise RuntimeError(f"the stand-in NVIDIA repository needs {', '.join(missing)}: apt-get install -y dpkg gpg")
    repo = out / "stable" / "deb" / "amd64"
    repo.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="dinops-debs-") as tree:
        entries = []
        for name, depends in PACKAGES.items():
            deb = _deb(name, depends, Path(tree), repo)
            entries.append(_packages_entry(deb, (Path(tree) / name / "DEBIAN" / "control").read_text()))
    packages = "\n".join(entries).encode()
    (repo / "Packages").write_bytes(packages)
    release = repo / "Release"
    release.write_text(
        f"Origin: dinops-rehearsal\nLabel: dinops-rehearsal\nDate: {email.utils.formatdate(usegmt=True)}\n"
        f"SHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
    )
    _sign(release, out / "gpgkey")
    return out
