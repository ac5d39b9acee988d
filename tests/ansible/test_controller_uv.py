"""The uv path of `make up`'s set-up, end to end with the real tools: on a host whose only python3 is too old for the
controller (Ubuntu 22.04's 3.10; a real interpreter of that version from pyenv or PATH), `make setup-controller`,
the first thing `make up` runs, in a fresh copy of the working tree, installs the pinned uv from PyPI with that
python3, has uv install CPython 3.11, builds the controller venv from it (ansible from PyPI), and that controller runs
Ansible: every playbook's syntax check, and a module on this host under the host's own old Python.

What stands in for the outside world: python-build-standalone's archives live on GitHub, out of reach here, so uv's
download list is replaced by a local one (UV_PYTHON_DOWNLOADS_JSON_URL, uv's documented setting: "URL pointing to
JSON of custom Python installations", `uv help python install`) that names a CPython 3.11 archive built from this
machine's Debian interpreter, laid out as python-build-standalone's install_only archives are (python/bin,
python/lib/python3.11) with its real SHA-256. Everything else is what a user's `make up` runs: uv 0.13.9's wheel from
PyPI, its `python install` and `python find`, our script and Makefile, pip and ansible.

The second test holds the README's way for hosts that reach PyPI only: UV_PYTHON_INSTALL_MIRROR with the file at
`<release>/<file>` as `uv python list --only-downloads --show-urls 3.11` names it. A file there that is not the
release's (this stand-in) is refused on uv's built-in SHA-256, and `make up` stops with what to run.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import urllib.parse
from pathlib import Path

import pytest

from dinops_testing import REPO, working_tree_files

pytestmark = pytest.mark.timeout(900)

UV_VERSION = re.search(r"^uv_version=(\S+)$", (REPO / "scripts/controller-python.sh").read_text(), re.M)[1]
# Debian 12's interpreter: statically linked with libpython, its standard library in /usr/lib/python3.11.
DEBIAN_PYTHON = Path("/usr/bin/python3.11")
DEBIAN_STDLIB = Path("/usr/lib/python3.11")
# Names that would hand the script a Python >= 3.11 from this machine's PATH.
PYTHON_NAMES = re.compile(r"^(python|pip|pydoc|idle|2to3)")


def old_python() -> str | None:
    """A real Python 3.8-3.10 on this machine (Ubuntu 20.04's and 22.04's versions), newest first."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for minor in (10, 9, 8):
        found = sorted(glob.glob(f"{pyenv}/versions/3.{minor}.*/bin/python3.{minor}"))
        for candidate in [shutil.which(f"python3.{minor}"), *found]:
            if not candidate:
                continue
            probe = subprocess.run([candidate, "-c", "import ensurepip, sys; print(sys.version_info[:2])"],
                                   capture_output=True, text=True)  # fmt: skip
            if probe.returncode == 0 and probe.stdout.strip() == f"(3, {minor})":
                return candidate
    return None


def old_python_host(path: Path, python: str) -> str:
    """A PATH with every program of this machine's but its Pythons, and `python3` the old one."""
    bin_dir = path / "bin"
    bin_dir.mkdir(parents=True)
    for directory in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        for program in sorted(Path(directory).iterdir()):
            target = bin_dir / program.name
            if not PYTHON_NAMES.match(program.name) and not target.exists() and os.access(program, os.X_OK):
                target.symlink_to(program)
    (bin_dir / "python3").symlink_to(python)
    return str(bin_dir)


@pytest.fixture(scope="module")
def stand_in_cpython(tmp_path_factory) -> tuple[Path, str, str]:
    """A CPython 3.11 archive in python-build-standalone's install_only layout, built from Debian's interpreter (no
    symbolic links: uv refuses absolute ones), once for both tests; with its version and SHA-256."""
    path = tmp_path_factory.mktemp("stand-in")
    if not (DEBIAN_PYTHON.exists() and (DEBIAN_STDLIB / "os.py").exists()):
        pytest.fail(f"{DEBIAN_PYTHON} and {DEBIAN_STDLIB} (Debian's python3.11) are needed to build the stand-in")
    version = subprocess.run([str(DEBIAN_PYTHON), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    archive = path / f"cpython-{version}-stand-in-x86_64-unknown-linux-gnu-install_only.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(DEBIAN_PYTHON, "python/bin/python3.11")
        for source in sorted(DEBIAN_STDLIB.rglob("*")):
            if source.is_file() and "__pycache__" not in source.parts:
                tar.add(source.resolve(), f"python/lib/python3.11/{source.relative_to(DEBIAN_STDLIB)}")
    return archive, version, hashlib.sha256(archive.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> dict:
    """A fresh copy of the working tree and a newcomer's environment on a host whose python3 is old."""
    python = old_python()
    if python is None:
        pytest.skip("no Python 3.8-3.10 on this machine (PATH or pyenv) to stand for Ubuntu 20.04's or 22.04's")
    path = tmp_path_factory.mktemp("uv-host")
    clone = path / "dinops"
    for relative in working_tree_files():
        (clone / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / relative, clone / relative)
    not_a_newcomers = ("VIRTUAL_ENV", "PYTHON", "PYENV", "ANSIBLE_", "MAKE", "MFLAGS", "UV_", "PYTEST_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(not_a_newcomers)}
    env |= {
        "PATH": old_python_host(path, python),
        "UV_PYTHON_INSTALL_DIR": str(path / "managed"),  # instead of ~/.local/share/uv/python
        "UV_CACHE_DIR": str(path / "uv-cache"),
    }
    return {"path": path, "clone": clone, "env": env, "python": python}


def run(host: dict, argv: list[str], timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=host["clone"], env=host["env"] | env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_make_up_setup_on_an_old_python_host_goes_through_uv(host, stand_in_cpython):
    probe = run(host, ["python3", "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"])
    assert tuple(map(int, probe.stdout.split())) < (3, 11), probe.stdout
    archive, version, sha256 = stand_in_cpython
    downloads = host["path"] / "downloads.json"
    downloads.write_text(json.dumps({f"cpython-{version}-linux-x86_64-gnu": {
        "name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux", "libc": "gnu",
        "major": 3, "minor": 11, "patch": int(version.split(".")[2]), "prerelease": "",
        "url": archive.as_uri(), "sha256": sha256, "variant": None, "build": "stand-in",
    }}))  # fmt: skip

    setup = run(host, ["make", "setup-controller"], UV_PYTHON_DOWNLOADS_JSON_URL=str(downloads))
    output = setup.stdout + setup.stderr
    assert setup.returncode == 0, output[-4000:]
    assert f"installing uv {UV_VERSION} from PyPI with {host['path'] / 'bin' / 'python3'}" in output, output[-4000:]
    assert "installing CPython 3.11 with" in output, output[-4000:]
    assert f"uv {UV_VERSION} " in run(host, [".cache/controller-uv/bin/uv", "--version"]).stdout

    # The controller venv is made from uv's CPython, in uv's Python directory, not from anything of this machine's.
    config = (host["clone"] / ".venv/pyvenv.cfg").read_text()
    home = re.search(r"^home = (.+)$", config, re.M)[1]
    assert Path(home).is_relative_to(host["path"] / "managed"), config
    assert f"version = {version}" in config or f"version_info = {version}" in config, config
    ansible = run(host, [".venv/bin/ansible", "--version"])
    assert ansible.returncode == 0, ansible.stderr
    assert f"python version = {version}" in ansible.stdout, ansible.stdout
    assert "core 2.19" in ansible.stdout, ansible.stdout

    # That controller runs the project: every playbook parses with its roles and the pinned collections ...
    syntax = run(host, ["make", "syntax"])
    assert syntax.returncode == 0, (syntax.stdout + syntax.stderr)[-4000:]
    # ... and a module runs on this host under the host's own Python, as the inventory's interpreter would on 22.04.
    facts = run(host, [".venv/bin/ansible", "-i", "inventories/local", "localhost", "-m", "ansible.builtin.setup",
                       "-a", "gather_subset=!all,min", "-e", f"ansible_python_interpreter={host['python']}"],
                ANSIBLE_CACHE_PLUGIN="ansible.builtin.memory", ANSIBLE_CALLBACK_RESULT_FORMAT="json")  # fmt: skip
    assert facts.returncode == 0, facts.stdout + facts.stderr
    gathered = json.loads(facts.stdout.split(" => ", 1)[1])["ansible_facts"]["ansible_python"]
    assert gathered["executable"] == host["python"], gathered
    assert (gathered["version"]["major"], gathered["version"]["minor"]) < (3, 11), gathered

    # A second `make setup-controller` finds everything in place: no download, no new venv.
    again = run(host, ["make", "setup-controller"])
    assert again.returncode == 0, again.stderr
    assert "installing" not in again.stdout + again.stderr, again.stdout + again.stderr


def test_a_mirror_file_that_is_not_the_release_is_refused(host, stand_in_cpython):
    """The README's mirror layout is the one uv reads, and a wrong file there stops `make up` with what to run."""
    uv = host["clone"] / ".cache/controller-uv/bin/uv"
    if not uv.exists():  # the test above installs it; alone, this one installs it the same way
        proc = run(host, ["scripts/controller-python.sh"], UV_PYTHON_INSTALL_MIRROR="file:///nonexistent")
        assert uv.exists(), proc.stderr
    listed = run(host, [str(uv), "python", "list", "--only-downloads", "--show-urls", "3.11"])
    assert listed.returncode == 0, listed.stderr
    # uv 0.13.9 names Astral's mirror of the releases first (releases.astral.sh/github/python-build-standalone/...,
    # GitHub's URL the fallback); the mirror setting replaces either with the same <release>/<file>.
    pattern = (r"^cpython-3\.11\.\d+-linux-x86_64-gnu\s+https://(?:releases\.astral\.sh/github|github\.com)"
               r"/(?:astral-sh/)?python-build-standalone/releases/download/(\S+)$")  # fmt: skip
    url = re.search(pattern, listed.stdout, re.M)
    assert url, listed.stdout
    release_file = urllib.parse.unquote(url[1])  # "<release>/cpython-3.11.N+<release>-...tar.gz"
    mirror = host["path"] / "mirror"
    (mirror / release_file).parent.mkdir(parents=True)
    shutil.copy(stand_in_cpython[0], mirror / release_file)

    env = {"UV_PYTHON_INSTALL_MIRROR": mirror.as_uri(), "UV_PYTHON_INSTALL_DIR": str(host["path"] / "managed-mirror")}
    proc = run(host, ["scripts/controller-python.sh"], **env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert re.search(r"hash mismatch", proc.stderr, re.I), proc.stderr
    assert f"from {mirror.as_uri()}" in proc.stderr
    assert "make up UV_PYTHON_INSTALL_MIRROR=" in proc.stderr
    assert not list((host["path"] / "managed-mirror").glob("cpython-*")), "a refused archive was installed"
