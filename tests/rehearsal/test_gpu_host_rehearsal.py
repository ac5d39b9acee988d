"""The GPU-host rehearsal: the README's `make up`, twice, on a look-alike of a fresh Ubuntu VM with one NVIDIA A10G
(AWS g5.xlarge), around the reboot the first run asks for; once as Ubuntu 24.04 (noble), once as 22.04 (jammy), each
with its own release files, NVIDIA package graph and expected versions (RELEASES). No GPU needed: it runs in CI.
What the look-alike cannot be: its Python is Debian 12's 3.11, where jammy's is 3.10 (the controller's way on such a
host, uv, is tests/ansible/test_controller_uv.py's), and its real packages are Debian's.

The host: a systemd container (`dinops-rehearsal`) of the Molecule platform image with Docker-in-Docker's
capabilities (rehearsal/instance.py), not --privileged. Ubuntu as molecule/nvidia_driver_ubuntu's prepare.yml
makes it (files/ubuntu_archive.py: os-release, lsb-release, GRUB and initramfs stand-ins, the release's NVIDIA
package graph as a flat repository of empty packages), with a kernel metapackage installed as on every VM (generic:
the captured graph has no -aws modules; a g5.xlarge has linux-aws). Debian 12's own archive stays as a source, for
the real packages the roles install (docker.io, python3-debian, ...); the package lists start empty. On its PCI bus,
by a stand-in lspci (files/lspci), one A10G. A signed stand-in of NVIDIA's libnvidia-container repository
(toolkit_repo.py) is served inside the instance. The user is the cloud image's: `ubuntu`, a sudoer without a
password (Ubuntu's cloud-init default: `sudo: ALL=(ALL) NOPASSWD:ALL`), its home 0750 (Ubuntu's HOME_MODE in
/etc/login.defs since 21.04), not root (round2-hosts-cluster F13). The repository's working tree is copied to
/home/ubuntu/dinops, owned by that user and without .venv: `make up` there, as `ubuntu`, installs the controller's
packages through sudo, builds its own controller venv from PyPI (the machine's proxy CA given to pip in
/etc/pip.conf) and runs site.yml on inventories/local as it is (local connection, /usr/bin/python3, `become` where
root is needed). The only addition is inventories/local/host_vars/localhost.yml (files/host_vars): the stand-in
repository's URLs, a minikube mirror without minikube, and the disk threshold.

1. First `make up`: preflight finds the A10G; nvidia_driver installs the 580-server open driver with the generic
   kernel's prebuilt module; the run stops at `reboot | Stop and tell the user to reboot` with REBOOT REQUIRED.
2. The reboot, simulated: a tmpfs over /proc/driver holds the open kernel module's banner of the installed
   nvidia-kernel-common-580-server version (probe.yml reads it), a stand-in nvidia-smi answers check.yml's query for
   the loaded driver (files/nvidia-smi), and /boot holds the running kernel only (reboot.yml: newest = running).
3. Second `make up`: the driver check passes; the toolkit comes from the signed repository through
   deb822_repository (round2-hosts-cluster F1: this fails on the old inventory interpreter
   `{{ ansible_playbook_python }}`, the venv without python-debian), with its /dev/char links and CDI specification
   for the loaded driver; Docker (docker.io) starts with the nvidia runtime merged into /etc/docker/daemon.json (the
   stand-in toolkit has no nvidia-container-runtime binary: no container is started). The cluster stage then STOPS at
   its first task, minikube role `install | Download minikube, verifying its checksum`: minikube's binary is not on
   this machine and github.com is out of reach, so minikube_url names a mirror path that does not exist and get_url
   fails at once on the checksum file it fetches first (<minikube_url>.sha256). Nothing after it (kubectl, sysctl,
   the minikube user, `minikube start`) can run without the binary, and `minikube start --gpus all` not without a
   GPU.

Marked ``rehearsal`` (`make gpu-rehearsal`). Each run's output is kept in
artifacts/rehearsal-{noble,jammy}-make-up-{1,2}.log; the times are printed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rehearsal.instance import Instance, failures, recap, tar_of
from rehearsal.toolkit_repo import VERSION as TOOLKIT_VERSION
from rehearsal.toolkit_repo import build_toolkit_repo

pytestmark = pytest.mark.rehearsal

REPO = Path(__file__).resolve().parents[2]
FILES = Path(__file__).resolve().parent / "files"
VM = Instance("dinops-rehearsal", hostname="gpu-vm")
USER = "ubuntu"
CLONE = f"/home/{USER}/dinops"
DRIVER = ["nvidia-headless-no-dkms-580-server-open", "nvidia-utils-580-server", "libnvidia-compute-580-server",
          "linux-modules-nvidia-580-server-open-generic"]  # fmt: skip
TOOLKIT = ["libnvidia-container1", "libnvidia-container-tools", "nvidia-container-toolkit-base",
           "nvidia-container-toolkit"]  # fmt: skip
TIMES: dict[str, float] = {}
# Rewrites the kernel in the first run's cached facts (ansible-core 2.19's jsonfile cache: s1_<host>, the facts as a
# JSON string under __payload__) to one of before the reboot.
# The two releases the README names for GPU VMs, each as its fresh cloud VM: os-release and lsb-release as the
# release's own (noble's are molecule/nvidia_driver_ubuntu's overlay), its NVIDIA package graph from the captured
# facts (tests/fixtures/ubuntu_nvidia), the versions the roles must install from it, and the compiler banner its
# prebuilt open module carries. Both releases' cloud images make homes 0750 (HOME_MODE, since Ubuntu 21.04).
RELEASES = {
    "noble": {
        "version": "24.04",
        "description": "24.04.3 LTS (Noble Numbat)",
        "pretty": "Ubuntu 24.04.3 LTS",
        "driver": "580.173.02-0ubuntu0.24.04.1",
        "modules": "6.8.0-142.142+1",
        "gcc": "gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)",
    },
    "jammy": {
        "version": "22.04",
        "description": "22.04.5 LTS (Jammy Jellyfish)",
        "pretty": "Ubuntu 22.04.5 LTS",
        "driver": "580.173.02-0ubuntu0.22.04.1",
        "modules": "5.15.0-194.204+1",
        "gcc": "gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)",
    },
}
STALE_KERNEL = """
import glob, json
(path,) = glob.glob("*localhost")
cached = json.load(open(path))
facts = json.loads(cached["__payload__"])
facts["ansible_kernel"] = "6.8.0-31-generic"
cached["__payload__"] = json.dumps(facts)
json.dump(cached, open(path, "w"))
"""


def _overlay(work: Path, release: str) -> Path:
    """molecule/nvidia_driver_ubuntu's overlay (noble's), with os-release, lsb-release and the apt source's file name
    of ``release``."""
    overlay = work / "overlay"
    shutil.copytree(REPO / "molecule" / "nvidia_driver_ubuntu" / "files" / "overlay", overlay)
    facts = RELEASES[release]
    (overlay / "usr/lib/os-release").write_text(
        f'PRETTY_NAME="{facts["pretty"]}"\nNAME="Ubuntu"\nVERSION_ID="{facts["version"]}"\n'
        f'VERSION="{facts["description"]}"\nVERSION_CODENAME={release}\nID=ubuntu\nID_LIKE=debian\n'
        'HOME_URL="https://www.ubuntu.com/"\nSUPPORT_URL="https://help.ubuntu.com/"\n'
        f'BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"\nUBUNTU_CODENAME={release}\n'
    )
    (overlay / "etc/lsb-release").write_text(
        f"DISTRIB_ID=Ubuntu\nDISTRIB_RELEASE={facts['version']}\nDISTRIB_CODENAME={release}\n"
        f'DISTRIB_DESCRIPTION="{facts["pretty"]}"\n'
    )
    sources = overlay / "etc/apt/sources.list.d"
    (sources / "ubuntu-noble.list").rename(sources / f"ubuntu-{release}.list")
    return overlay


def _ubuntu(work: Path, release: str) -> None:
    """Ubuntu as molecule/nvidia_driver_ubuntu/prepare.yml makes it, for ``release``, Debian's sources kept; the
    generic kernel metapackage and make installed as on a VM, then the package lists emptied again."""
    installed = VM.out("dpkg-query -W -f '${db:Status-Status} ${Package}\\n' | sed -n 's/^installed //p'")
    tarball = work / f"ubuntu-{release}.tar.gz"
    scenario = REPO / "molecule" / "nvidia_driver_ubuntu" / "files"
    subprocess.run([sys.executable, str(scenario / "ubuntu_archive.py"), str(tarball), "--release", release,
                    "--overlay", str(_overlay(work, release))], input=installed, text=True, check=True,
                   capture_output=True)  # fmt: skip
    VM.run("tar -xzf - -C /", data=tarball.read_bytes())
    VM.run(
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends"
        " linux-image-generic make >/dev/null && rm -rf /var/lib/apt/lists/* && touch /boot/vmlinuz-$(uname -r)"
    )


def _nvidia_repository(work: Path) -> None:
    """The signed stand-in for NVIDIA's repository, served on 127.0.0.1:8765 inside the instance."""
    repo = build_toolkit_repo(work / "nvidia")
    VM.run("mkdir -p /srv/nvidia-repo && tar -xf - -C /srv/nvidia-repo", data=tar_of(repo, sorted(repo.rglob("*"))))
    VM.run(
        "systemd-run --unit=dinops-nvidia-repo --property=Restart=always"
        " python3 -m http.server 8765 --bind 127.0.0.1 --directory /srv/nvidia-repo"
    )
    probe = "python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8765/gpgkey\", timeout=2)'"
    VM.run(f"for i in $(seq 50); do {probe} 2>/dev/null && exit 0; sleep 0.2; done; exit 1")


def _clone() -> None:
    """The working tree as `git clone` plus the uncommitted changes gives it, with the rehearsal site's host_vars,
    owned by the user who cloned it."""
    host_vars = (FILES / "host_vars" / "localhost.yml").read_bytes()
    VM.clone(USER, CLONE, {"inventories/local/host_vars/localhost.yml": host_vars})


def _install(name: str, path: str) -> None:
    VM.run(f"install -m 0755 /dev/stdin {path}", data=(FILES / name).read_bytes())


def _make_up(release: str, n: int) -> dict:
    run = VM.make_up(USER, CLONE, f"rehearsal-{release}-make-up-{n}.log", timeout=480)
    TIMES[f"{release} make up #{n}"] = run["seconds"]
    print(f"\nrehearsal: {release}: make up #{n}: exit {run['rc']} in {run['seconds']:.0f} s")
    return run


def _versions(packages: list[str]) -> dict[str, str]:
    out = VM.out(f"dpkg-query -W -f '${{Package}} ${{Version}} ${{db:Status-Want}}\\n' {' '.join(packages)}")
    return {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines()}


@pytest.fixture(scope="module", params=list(RELEASES))
def host(request, tmp_path_factory):
    release = request.param
    began = time.monotonic()
    image = subprocess.run([str(REPO / "scripts" / "molecule-image.sh")], capture_output=True, text=True, check=False)
    assert image.returncode == 0, f"scripts/molecule-image.sh (make molecule-image):\n{image.stdout}{image.stderr}"
    try:
        VM.start()
        work = tmp_path_factory.mktemp(f"rehearsal-{release}")
        _ubuntu(work, release)
        _install("lspci", "/usr/local/bin/lspci")
        _nvidia_repository(work)
        VM.pip_trusts_the_proxy()
        VM.cloud_user(USER, "0750")
        _clone()
        TIMES[f"{release} instance"] = time.monotonic() - began
        print(f"\nrehearsal: {release}: instance ready in {TIMES[f'{release} instance']:.0f} s")
        yield {"release": release, **RELEASES[release], "kernel": VM.out("uname -r").strip()}
    finally:
        VM.remove()
        print("\nrehearsal: " + ", ".join(f"{step} {seconds:.0f} s" for step, seconds in TIMES.items()))


@pytest.fixture(scope="module")
def first_run(host):
    return _make_up(host["release"], 1)


@pytest.fixture(scope="module")
def second_run(host, first_run):
    """The reboot into the installed driver, then `make up` again."""
    version = VM.out("dpkg-query -W -f '${Version}' nvidia-kernel-common-580-server").split("-")[0]
    banner = (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
              "(buildd@lcy02-amd64-080)  Thu Oct 30 10:21:37 UTC 2025\n"
              f"GCC version:  {host['gcc']}\n")  # fmt: skip
    VM.run(
        "mount -t tmpfs -o size=64k,mode=0555 nvidia /proc/driver && mkdir /proc/driver/nvidia"
        " && cat > /proc/driver/nvidia/version",
        data=banner.encode(),
    )
    _install("nvidia-smi", "/usr/local/bin/nvidia-smi")
    # The facts the first run cached (ansible.cfg: gathering smart, a jsonfile cache) name the kernel of before the
    # reboot, as on a VM whose driver install brought a newer kernel: the second run must not believe them.
    VM.run(f"cd {CLONE}/.cache/ansible-facts && python3 -", data=STALE_KERNEL.encode())
    return {**_make_up(host["release"], 2), "driver": version}


def _statuses(run: dict) -> dict[str, str]:
    return {task: status for task, status, _ in run["tasks"]}


def test_preflight_finds_the_a10g_on_the_pci_bus(host, first_run):
    """Through the stand-in lspci (ahead of /usr/bin on sudo's secure_path): the container's real bus has no GPU."""
    fact = json.loads(VM.out("/etc/ansible/facts.d/dinops.fact"))
    os_found = (fact["os"]["id"], fact["os"]["version"], fact["mode"], fact["gpu_count"])
    assert os_found == ("ubuntu", host["version"], "gpu", 1)
    gpu = fact["gpus"][0]
    assert (gpu["pci_id"], gpu["pci_slot"], gpu["name"], gpu["architecture"], gpu["datacenter"]) == (
        "10de:2237", "00:1e.0", "A10G", "ampere", True
    )  # fmt: skip


def test_first_make_up_installs_driver_580_and_stops_with_reboot_required(host, first_run):
    assert _versions(DRIVER) == {
        "nvidia-headless-no-dkms-580-server-open": f"{host['driver']} install",
        "nvidia-utils-580-server": f"{host['driver']} install",
        "libnvidia-compute-580-server": f"{host['driver']} install",
        "linux-modules-nvidia-580-server-open-generic": f"{host['modules']} install",
    }
    kernel = host["kernel"]
    message = (
        f"REBOOT REQUIRED on localhost: NVIDIA driver 580.173.02 (open modules) for kernel {kernel} is installed, but "
        f"no driver is loaded on kernel {kernel}. This run does not reboot a host it reaches through a local "
        "connection (or with nvidia_driver_reboot false): reboot it yourself, then run the playbook again (make up): "
        "it goes on from here."
    )
    assert first_run["rc"] != 0
    assert failures(first_run) == [
        ("nvidia_driver : reboot | Stop and tell the user to reboot (local connection or nvidia_driver_reboot false; "
         "GPU hosts only)", {"changed": False, "msg": message})
    ], first_run["output"][-4000:]  # fmt: skip
    assert recap(first_run["output"])["failed"] == 1


def test_second_make_up_finds_the_driver_loaded_and_changes_nothing_of_it(second_run):
    statuses = _statuses(second_run)
    check = "nvidia_driver : check | Check nvidia-smi reports the wanted branch on every GPU (GPU hosts only)"
    assert statuses[check] == "ok"
    assert "REBOOT REQUIRED" not in second_run["output"]
    changed = [task for task, status in statuses.items() if status == "changed"]
    assert [task for task in changed if task.startswith(("preflight :", "nvidia_driver :"))] == [], changed


def test_the_toolkit_comes_from_the_signed_repository_through_deb822(second_run):
    """round2-hosts-cluster F1: deb822_repository needs python-debian, which only the host's own Python (the local
    inventory's interpreter) gets; under the controller's venv this task fails."""
    statuses = _statuses(second_run)
    deb822 = "nvidia_container_toolkit : repo | Add NVIDIA's libnvidia-container repository with its signing key"
    assert statuses[deb822] == "changed"
    assert VM.out("cat /etc/apt/sources.list.d/nvidia-container-toolkit.sources") == (
        "X-Repolib-Name: nvidia-container-toolkit\nSigned-By: /etc/apt/keyrings/nvidia-container-toolkit.asc\n"
        "Suites: /\nTypes: deb\nURIs: http://127.0.0.1:8765/stable/deb/amd64\n"
    )
    assert VM.out("cat /etc/apt/keyrings/nvidia-container-toolkit.asc") == VM.out("cat /srv/nvidia-repo/gpgkey")
    assert _versions(TOOLKIT) == {name: f"{TOOLKIT_VERSION} hold" for name in TOOLKIT}
    # The GPU-only steps ran for the loaded driver (the stand-in nvidia-ctk reads its banner as the real one its NVML).
    libcuda = f"hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{second_run['driver']}\n"
    assert libcuda in VM.out("cat /etc/cdi/nvidia.yaml")
    assert "195:0 /dev/nvidia0" in VM.out("find /dev/char -maxdepth 1 -lname '*nvidia*' -printf '%f %l\\n'")


def test_docker_runs_with_the_nvidia_runtime_merged_into_daemon_json(second_run):
    assert json.loads(VM.out("cat /etc/docker/daemon.json")) == {
        "runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime", "runtimeArgs": []}},
        "default-runtime": "nvidia",
        "default-shm-size": "1G",
        "log-opts": {"max-size": "100m", "max-file": "3"},
    }
    assert VM.out("systemctl is-active docker").strip() == "active"
    info = json.loads(VM.out("docker info --format '{{json .}}'"))
    assert info["DefaultRuntime"] == "nvidia" and "nvidia" in info["Runtimes"], info["Runtimes"]
    assert _versions(["docker.io"])["docker.io"].endswith(" hold")


def test_second_make_up_stops_at_the_minikube_download(second_run):
    """The cluster stage stops at the minikube role's first task, `install | Download minikube, verifying its
    checksum`: minikube's binary is not on this machine and github.com is out of reach in CI, so the inventory's
    minikube_url names a mirror path that does not exist, and get_url fails at once on the checksum file it fetches
    first (minikube_checksum: sha256:<minikube_url>.sha256). Nothing of the cluster stage runs after it; without
    the binary nothing could (kubectl's download, the minikube user, `minikube start --gpus all`)."""
    download = "minikube : install | Download minikube, verifying its checksum"
    missing = "/srv/dinops-mirror/minikube/v1.37.0/minikube-linux-amd64.sha256"
    assert second_run["rc"] != 0
    assert failures(second_run) == [
        (download, {"changed": False, "dest": "/usr/local/bin/minikube", "elapsed": 0, "url": f"file://{missing}",
                    "msg": f"Request failed: <urlopen error [Errno 2] No such file or directory: '{missing}'>"})
    ]  # fmt: skip
    assert second_run["tasks"][-1][0] == download
    assert recap(second_run["output"])["failed"] == 1


def test_make_up_runs_as_the_cloud_user_and_leaves_the_clone_to_it(second_run):
    """F13: the user's own files stay the user's (the controller venv, the fact cache, the logs), so that `git pull`
    and the next `make up` work without sudo; what needs root was done through `become`."""
    foreign = VM.out(f"find {CLONE} -not -user {USER} -printf '%u %p\\n' | head -n 20")
    assert not foreign, f"files in the clone not owned by {USER}:\n{foreign}"
    assert VM.out(f"stat -c %U {CLONE}/.venv/bin/python").strip() == USER
    assert VM.out("stat -c %U /etc/docker/daemon.json").strip() == "root"
