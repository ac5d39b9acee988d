"""Helpers of the image tests: the build script as a module, a Docker CLI wrapper that cleans up, HTTP polling."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "apps" / "images" / "build.py"
APP_UID = 10001
# Held while images are built: the images stage and the CPU-host rehearsal both build what is missing and may run
# side by side in `make test`'s two lanes; the second one waits, then finds every content-hash tag.
BUILD_LOCK = REPO / "build" / ".images.lock"


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dinops_images_build", BUILD_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


@contextmanager
def build_lock() -> Iterator[None]:
    BUILD_LOCK.parent.mkdir(exist_ok=True)
    with BUILD_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_every_image(build: ModuleType, wheelhouse: Path, logs: Path) -> tuple[list, dict, list[str]]:
    """Every image in air-gapped mode (Debian base, wheelhouse over loopback) unless its content-hash tag exists,
    then what earlier builds left pruned; returns the plan's steps, the build times and what was pruned."""
    with build_lock():
        build.ensure_base(build.AIRGAP_BASE, airgap=True)
        build.ensure_wheelhouse(wheelhouse)
        steps = build.plan(build.AIRGAP_BASE)
        timings = build.build(steps, wheelhouse, logs)
        # What earlier builds left (older hash tags, superseded stages) would fill the disk run after run.
        pruned = build.prune(steps)
    return steps, timings, pruned


class Docker:
    """`docker` with a per-session name prefix; everything it names is removed by ``cleanup``."""

    def __init__(self) -> None:
        self.prefix = f"dinops-test-{uuid.uuid4().hex[:8]}"
        self.created: list[tuple[str, str]] = []  # (kind, name) in creation order

    def name(self, kind: str, what: str) -> str:
        name = f"{self.prefix}-{what}"
        self.created.append((kind, name))
        return name

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            output = result.stdout[-3000:] + result.stderr[-3000:]
            raise AssertionError(f"docker {' '.join(args)} -> exit {result.returncode}\n{output}")
        return result

    def inspect(self, ref: str) -> dict:
        return json.loads(self("inspect", ref).stdout)[0]

    def host_port(self, container: str, port: int) -> int:
        # "127.0.0.1:49153", one line per address family
        return int(self("port", container, str(port)).stdout.splitlines()[0].rsplit(":", 1)[1])

    def wait_exit(self, container: str, timeout: float) -> int:
        return int(self("wait", container, timeout=timeout).stdout.strip())

    def logs(self, container: str) -> str:
        result = self("logs", container, check=False)
        return result.stdout + result.stderr

    def cleanup(self) -> None:
        order = {"container": 0, "network": 1, "volume": 2}
        for kind, name in sorted(reversed(self.created), key=lambda item: order[item[0]]):
            args = {"container": ("rm", "-f", "-v"), "network": ("network", "rm"), "volume": ("volume", "rm")}[kind]
            self(*args, name, check=False)


def wait_http(url: str, timeout: float, ok=lambda status: status == 200) -> tuple[int, bytes]:
    """Poll ``url`` until ``ok(status)``; return the last status and body."""
    deadline = time.monotonic() + timeout
    last: tuple[int, bytes] = (0, b"")
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                last = (response.status, response.read())
        except urllib.error.HTTPError as exc:
            last = (exc.code, exc.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            last = (0, b"")
        if ok(last[0]):
            return last
        time.sleep(1)
    raise AssertionError(f"{url} did not answer as expected within {timeout} s; last: {last[0]} {last[1][:500]!r}")


def post(url: str, body: bytes, content_type: str, timeout: float = 60) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
