"""A look-alike of a fresh VM for the rehearsals: a systemd container of the Molecule platform image with
Docker-in-Docker's capabilities (molecule/docker/molecule.yml), not --privileged, and what the rehearsals do in it.

    vm = Instance("dinops-rehearsal", hostname="gpu-vm"); vm.start(); vm.run("script"); vm.remove()

The README's `make up` runs in it as a user logs in (`make_up`), on a copy of the working tree as `git clone` plus the
uncommitted changes gives it (`clone`); `tasks`, `recap` and `failures` read the default callback's output.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
import time
from pathlib import Path

from dinops_testing import REPO, working_tree_files

IMAGE = os.environ.get("MOLECULE_IMAGE", "dinops-molecule:debian12")
CAPABILITIES = ("SYS_ADMIN", "NET_ADMIN", "NET_RAW", "SYS_PTRACE", "SYS_MODULE", "MKNOD", "SETFCAP", "AUDIT_WRITE",
                "SYS_CHROOT", "DAC_READ_SEARCH", "IPC_LOCK")  # fmt: skip
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
ARTIFACTS = REPO / "artifacts"


class InstanceError(AssertionError):
    """A step of the instance's set-up failed (an AssertionError, so that pytest shows it as a failed check)."""


def tar_of(root: Path, paths: list[Path]) -> bytes:
    """An uncompressed tar of ``paths`` (relative to ``root`` inside), owned by root."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path in paths:
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if not info.isfile():
                tar.addfile(info)
                continue
            with path.open("rb") as data:
                tar.addfile(info, data)
    return raw.getvalue()


class Instance:
    def __init__(self, name: str, hostname: str, mounts: tuple[str, ...] = ()):
        self.name = name
        self.hostname = hostname
        self.mounts = mounts  # extra `docker run -v` arguments

    def start(self) -> None:
        flags = [f"--cap-add={cap}" for cap in CAPABILITIES]
        flags += ["--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined", "--cgroupns",
                  "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock",
                  "--tmpfs", "/tmp", "--stop-signal", "SIGRTMIN+3", "--hostname", self.hostname]  # fmt: skip
        for mount in self.mounts:
            flags += ["-v", mount]
        self.remove()
        subprocess.run(["docker", "run", "-d", "--name", self.name, *flags, IMAGE, "/lib/systemd/systemd"],
                       check=True, capture_output=True)  # fmt: skip
        # systemd's bus first, then `--wait` until the boot is over ("degraded" exits 1).
        booted = "for i in $(seq 100); do [ -S /run/systemd/private ] && break; sleep 0.2; done"
        state = self.out(f"{booted}; systemctl is-system-running --wait || true").split()
        if not state or state[-1] not in ("running", "degraded"):
            raise InstanceError(f"systemd in {self.name}: {state}")

    def remove(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True, check=False)

    def run(self, script: str, *, data: bytes | None = None, check: bool = True,
            timeout: int = 300) -> subprocess.CompletedProcess:  # fmt: skip
        """A bash script run as root in the instance."""
        done = subprocess.run(["docker", "exec", "-i", self.name, "bash", "-euo", "pipefail", "-c", script],
                              input=data, capture_output=True, timeout=timeout, check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise InstanceError(
                f"in {self.name}: {script}\n{done.stdout.decode()[-2000:]}{done.stderr.decode()[-2000:]}"
            )
        return done

    def out(self, script: str) -> str:
        return self.run(script).stdout.decode()

    def pip_trusts_the_proxy(self) -> None:
        """The machine's own setting, not the user's: pip trusts the CA of this network's TLS-intercepting proxy."""
        self.run(
            "cat > /usr/local/share/dinops-proxy-ca.crt && printf '[global]\\ncert = %s\\n' "
            "/usr/local/share/dinops-proxy-ca.crt > /etc/pip.conf",
            data=HOST_CA.read_bytes(),
        )

    def cloud_user(self, user: str, home_mode: str = "") -> None:
        """The default user of a cloud image: in the sudo group, NOPASSWD by cloud-init's sudoers.d file; its home
        as the image's useradd makes it, or ``home_mode``."""
        chmod = f" && chmod {home_mode} /home/{user}" if home_mode else ""
        self.run(
            f"useradd --create-home --shell /bin/bash --groups sudo {user}{chmod}"
            f" && echo '{user} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/90-cloud-init-users"
            " && chmod 0440 /etc/sudoers.d/90-cloud-init-users"
        )

    def clone(self, user: str, clone: str, extra: dict[str, bytes] | None = None) -> None:
        """The working tree as `git clone` plus the uncommitted changes gives it (no .venv, .cache or artifacts),
        with ``extra`` files (path in the clone -> bytes), owned by the user who cloned it."""
        files = [REPO / name for name in working_tree_files()]
        self.run(f"mkdir -p {clone} && tar -xf - -C {clone}", data=tar_of(REPO, files))
        for relative, content in (extra or {}).items():
            self.run(f"mkdir -p $(dirname {clone}/{relative}) && cat > {clone}/{relative}", data=content)
        self.run(f"chown -R {user}: {clone}")
        if self.run(f"test -e {clone}/.venv", check=False).returncode == 0:
            raise InstanceError(f"{clone} has a .venv before make up")

    def make_up(self, user: str, clone: str, log: str, timeout: int) -> dict:
        """`make up` as ``user`` logs in (a login shell: its PATH, HOME and umask), in the clone; the output kept in
        artifacts/``log``."""
        began = time.monotonic()
        done = subprocess.run(["docker", "exec", "-u", user, "-w", clone, self.name, "bash", "-lc", "make up"],
                              capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
        output = done.stdout + done.stderr
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / log).write_text(output)
        seconds = time.monotonic() - began
        return {"rc": done.returncode, "output": output, "tasks": tasks(done.stdout), "seconds": seconds}


def tasks(output: str) -> list[tuple[str, str, dict]]:
    """("role : task", status, result) for each result line of the default callback; the result (its JSON) only for
    failures."""
    found, task = [], ""
    for line in output.splitlines():
        if header := re.match(r"^(?:TASK|RUNNING HANDLER) \[(.*)\] \*+$", line):
            task = header.group(1)
        elif status := re.match(r"^(ok|changed|fatal|failed): \[localhost\](?:.*?FAILED! => (\{.*\}))?", line):
            found.append((task, status.group(1), json.loads(status.group(2)) if status.group(2) else {}))
    return found


def recap(output: str) -> dict[str, int]:
    match = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output)
    if not match:
        raise InstanceError(f"no play recap for localhost:\n{output[-3000:]}")
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups()), strict=True))


def failures(run: dict) -> list[tuple[str, dict]]:
    return [(task, result) for task, status, result in run["tasks"] if status in ("fatal", "failed")]
