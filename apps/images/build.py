#!/usr/bin/env python3
"""Build the dinops images, each only when one of its inputs changed.

    python3 apps/images/build.py [--airgap] [--images serve,client] [--wheelhouse DIR] [--base IMAGE]
    python3 apps/images/build.py plan [--airgap] [--base IMAGE]      # the build plan as JSON, builds nothing
    python3 apps/images/build.py archive FILE                        # the build context as a reproducible tar
    python3 apps/images/build.py prune [--images ...]                # free what older builds left (JSON list)

Images form a chain, so that the multi-GB PyTorch layer is built once and shared:

    base ── dinops-runtime ─┬─ dinops-torch ─┬─ dinops-serve
                            │                ├─ dinops-train
                            │                └─ dinops-gpu-check
                            ├─ dinops-client
                            ├─ dinops-download
                            └─ dinops-prometheus   (Debian's prometheus package, installed in a stage on the base)

Every image is tagged ``<version>-<content hash>``; the hash covers its Dockerfile, the files it copies from the
build context (apps/), the constraints and its parent's tag, which itself covers the base image's ID. An image
whose tag exists is not built again, so a second run builds nothing. The moving tag ``<version>`` follows.
``prune`` (or ``--prune`` after a build) untags the older content-hash tags and deletes the untagged images that
builds left behind (superseded images and build stages, found by their content-hash label); Docker keeps anything
a container still uses. Each change to the sources otherwise leaves about 1.3 GB behind.

One switch selects the mode. Default: ``--base python:3.11-slim-bookworm`` and packages from the index.
``--airgap``: the base is built from Debian's archive by scripts/debian-image.sh and packages come only from the
wheelhouse prepared by scripts/wheelhouse.sh, served to the build over HTTP on 127.0.0.1 for the duration of the build
(``docker build --network host``, ``pip --no-index --find-links``): the wheels never enter a build context or a
layer. Standard library only: the images role runs ``plan`` on build hosts that have nothing but Python.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

IMAGES_DIR = Path(__file__).resolve().parent
CONTEXT = IMAGES_DIR.parent  # apps/: the build context; apps/.dockerignore keeps it to the files below
REPO = CONTEXT.parent
DEFAULT_BASE = "python:3.11-slim-bookworm"
AIRGAP_BASE = "dinops-python:bookworm"
AIRGAP_BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "tini")
PREFIX = "dinops-"
LABEL = "org.dinops.content-hash"  # on every image and build stage that build() makes; prune() finds them by it

# name: (parent, files of the context that the Dockerfile copies, besides the Dockerfile itself)
APP_FILES = ("images/install-app.sh", "pyproject.toml", "README.md", "constraints.txt", "src")
CHAIN: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "runtime": (None, ()),
    "torch": ("runtime", ("constraints.txt",)),
    "serve": ("torch", APP_FILES),
    "train": ("torch", APP_FILES),
    "gpu-check": ("torch", APP_FILES),
    "client": ("runtime", APP_FILES),
    "download": ("runtime", APP_FILES),
    "prometheus": ("runtime", ()),
}
APPLICATIONS = ("serve", "train", "gpu-check", "client", "download", "prometheus")
# What a build host needs of apps/: the inputs of every image, this script and the Dockerfiles.
ARCHIVED = (".dockerignore", "README.md", "constraints.txt", "images", "pyproject.toml", "src")
PARENT_ARG = {"runtime": "RUNTIME_IMAGE", "torch": "TORCH_IMAGE"}
# Images with a build stage on the base image itself (apt, which dinops-runtime no longer has): they get BASE_IMAGE
# as well. Their hash needs nothing more: the parent's tag already covers the base image's ID.
BASE_STAGE = ("prometheus",)
IGNORED = re.compile(r"(^|/)(__pycache__|[^/]*\.egg-info)(/|$)|\.py[co]$")


class BuildError(RuntimeError):
    """A build cannot start or failed; the message says which image and why."""


@dataclass
class Step:
    name: str
    image: str  # repository:tag, the tag being <version>-<hash>
    moving_tag: str  # repository:<version>
    dockerfile: str  # relative to the context
    content_hash: str
    build_args: dict[str, str]


def version() -> str:
    text = (CONTEXT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    if not match:
        raise BuildError("apps/pyproject.toml has no version")
    return match.group(1)


def context_files(paths: tuple[str, ...]) -> list[Path]:
    """The files below ``paths`` (relative to the context) that reach the build, sorted."""
    files: list[Path] = []
    for rel in paths:
        path = CONTEXT / rel
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            found = (p for p in path.rglob("*") if p.is_file())
            files += [p for p in found if not IGNORED.search(p.relative_to(CONTEXT).as_posix())]
        else:
            raise BuildError(f"build input {path} is missing")
    return sorted(files)


def archive(path: Path) -> None:
    """Write the build context as a tar whose bytes depend only on the files' names, contents and modes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for file in context_files(ARCHIVED):
            info = tar.gettarinfo(str(file), arcname=file.relative_to(CONTEXT).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if file.stat().st_mode & 0o100 else 0o644
            with file.open("rb") as f:
                tar.addfile(info, f)


def content_hash(name: str, parent_ref: str) -> str:
    digest = hashlib.sha256()
    _, inputs = CHAIN[name]
    digest.update(f"{name}\0{parent_ref}\0".encode())
    for path in [IMAGES_DIR / f"{name}.Dockerfile", *context_files(inputs)]:
        digest.update(path.relative_to(CONTEXT).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def docker(*args: str, check: bool = True, capture: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["docker", *args], check=check, text=True, capture_output=capture)
    except FileNotFoundError:
        raise BuildError("the docker CLI is not installed") from None


def image_id(ref: str) -> str | None:
    result = docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def plan(base: str, names: tuple[str, ...] = APPLICATIONS) -> list[Step]:
    """The images to have, parents first. The base must exist locally: its ID is part of every hash."""
    base_id = image_id(base)
    if base_id is None:
        raise BuildError(f"base image {base} is not present: pull it, or build it with --airgap")
    wanted: list[str] = []
    for name in names:
        if name not in CHAIN:
            raise BuildError(f"unknown image {name!r}; known: {', '.join(CHAIN)}")
        chain = [name]
        while (parent := CHAIN[chain[-1]][0]) is not None:
            chain.append(parent)
        wanted += [n for n in reversed(chain) if n not in wanted]
    tag_version = version()
    steps: dict[str, Step] = {}
    for name in wanted:
        parent = CHAIN[name][0]
        parent_ref = f"{base}@{base_id}" if parent is None else steps[parent].image
        digest = content_hash(name, parent_ref)
        args = {"BASE_IMAGE": base} if parent is None else {PARENT_ARG[parent]: steps[parent].image}
        if name in BASE_STAGE:
            args["BASE_IMAGE"] = base
        if name in APPLICATIONS:
            args.update(VERSION=tag_version, REVISION=revision(), SOURCE=source_url())
        steps[name] = Step(
            name=name,
            image=f"{PREFIX}{name}:{tag_version}-{digest}",
            moving_tag=f"{PREFIX}{name}:{tag_version}",
            dockerfile=f"images/{name}.Dockerfile",
            content_hash=digest,
            build_args=args,
        )
    return list(steps.values())


def _git(*args: str) -> str:
    try:
        result = subprocess.run(["git", "-C", str(REPO), *args], text=True, capture_output=True, check=False)
    except FileNotFoundError:  # no git on a build host: the labels say so
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


@functools.cache
def revision() -> str:
    """The commit the images are built from; labels only, not part of the hash (a new commit alone rebuilds nothing)."""
    return os.environ.get("DINOPS_REVISION") or _git("rev-parse", "HEAD") or "unknown"


@functools.cache
def source_url() -> str:
    return os.environ.get("DINOPS_SOURCE") or _git("remote", "get-url", "origin") or "https://github.com/dinops/dinops"


@contextlib.contextmanager
def serve_wheelhouse(directory: Path) -> Iterator[str]:
    """Serve ``directory`` read-only on 127.0.0.1 (a free port) while the block runs; yields the --find-links URL."""
    if not any(directory.glob("*.whl")):
        raise BuildError(f"wheelhouse {directory} holds no wheels: run scripts/wheelhouse.sh {directory}")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's signature
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def build_step(step: Step, wheelhouse_url: str | None, log_dir: Path) -> float:
    args = ["build", "--file", str(CONTEXT / step.dockerfile), "--tag", step.image, "--tag", step.moving_tag]
    args += ["--label", f"{LABEL}={step.content_hash}"]
    for key, value in {**step.build_args, **({"WHEELHOUSE_URL": wheelhouse_url} if wheelhouse_url else {})}.items():
        args += ["--build-arg", f"{key}={value}"]
    if wheelhouse_url:
        args += ["--network", "host"]
    log = log_dir / f"{step.name}.log"
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        result = subprocess.run(["docker", *args, str(CONTEXT)], stdout=out, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-30:])
        raise BuildError(f"building {step.image} failed (exit {result.returncode}, full log {log}):\n{tail}")
    return seconds


def ensure_base(base: str, airgap: bool) -> None:
    if airgap:
        script = REPO / "scripts" / "debian-image.sh"
        subprocess.run([str(script), base, *AIRGAP_BASE_PACKAGES], check=True)
    elif image_id(base) is None:
        print(f"pulling {base}")
        docker("pull", base, capture=False)


def ensure_wheelhouse(directory: Path) -> None:
    subprocess.run([str(REPO / "scripts" / "wheelhouse.sh"), str(directory)], check=True)


def build(steps: list[Step], wheelhouse: Path | None, log_dir: Path) -> dict[str, float | None]:
    """Build the steps whose tag is missing (None in the result: already there); the wheelhouse is served on demand."""
    log_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float | None] = {}
    with contextlib.ExitStack() as stack:
        url: str | None = None
        for step in steps:
            if image_id(step.image) is not None:
                docker("tag", step.image, step.moving_tag)
                timings[step.name] = None
                print(f"{step.image}: up to date")
                continue
            if wheelhouse is not None and url is None:
                url = stack.enter_context(serve_wheelhouse(wheelhouse))
            print(f"{step.image}: building ({step.dockerfile})", flush=True)
            timings[step.name] = build_step(step, url, log_dir)
            print(f"{step.image}: built in {timings[step.name]:.0f} s", flush=True)
    return timings


def prune(steps: list[Step]) -> list[str]:
    """Free the disk that older builds hold: untag the older content-hash tags of the images in ``steps``, then
    delete the dangling images carrying our content-hash label (superseded images and build stages). Docker
    refuses to delete what a container still uses; that is left alone. Returns what was removed."""
    candidates = []
    for step in steps:
        repository, current = step.image.split(":")
        tags = docker("image", "ls", "--format", "{{.Tag}}", repository).stdout.split()
        candidates += [f"{repository}:{t}" for t in tags if t != current and re.fullmatch(r".+-[0-9a-f]{16}", t)]
    dangling = docker("image", "ls", "--quiet", "--no-trunc", "--filter", "dangling=true", "--filter", f"label={LABEL}")
    candidates += dict.fromkeys(dangling.stdout.split())
    return [ref for ref in candidates if docker("image", "rm", ref, check=False).returncode == 0]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", choices=("build", "plan", "archive", "prune"), default="build")
    parser.add_argument("file", nargs="?", type=Path, help="archive: the tar file to write")
    parser.add_argument(
        "--airgap",
        action="store_true",
        default=os.environ.get("DINOPS_IMAGE_MODE") == "airgap",
        help="base from Debian's archive and packages only from the wheelhouse (default when DINOPS_IMAGE_MODE=airgap)",
    )
    parser.add_argument("--base", help=f"base image (default {DEFAULT_BASE}, or {AIRGAP_BASE} with --airgap)")
    parser.add_argument(
        "--wheelhouse", type=Path, help="install only from this wheelhouse (default with --airgap: build/wheelhouse)"
    )
    parser.add_argument(
        "--images",
        default=",".join(APPLICATIONS),
        help=f"comma-separated images to have, with their parents (default {','.join(APPLICATIONS)})",
    )
    parser.add_argument(
        "--prune", action="store_true", help="after the build, remove older content-hash tags and leftover stages"
    )
    parser.add_argument("--log-dir", type=Path, default=REPO / "build" / "image-logs", help="docker build logs")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    base = args.base or (AIRGAP_BASE if args.airgap else DEFAULT_BASE)
    wheelhouse = args.wheelhouse or (REPO / "build" / "wheelhouse" if args.airgap else None)
    names = tuple(n for n in args.images.split(",") if n)
    try:
        if args.action == "archive":
            if args.file is None:
                raise BuildError("archive needs the path of the tar file to write")
            archive(args.file)
            return 0
        if args.action == "plan":
            print(json.dumps([asdict(s) for s in plan(base, names)], indent=2))
            return 0
        if args.action == "prune":
            print(json.dumps(prune(plan(base, names))))
            return 0
        start = time.monotonic()
        ensure_base(base, args.airgap)
        if args.airgap and wheelhouse is not None:
            ensure_wheelhouse(wheelhouse)
        steps = plan(base, names)
        timings = build(steps, wheelhouse, args.log_dir)
        if args.prune:
            print("\n".join(f"removed {ref}" for ref in prune(steps)) or "nothing to prune")
    except BuildError as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"build.py: {' '.join(map(str, exc.cmd))} failed with exit {exc.returncode}", file=sys.stderr)
        return 1
    built = {k: v for k, v in timings.items() if v is not None}
    print(f"images: {len(built)} built, {len(timings) - len(built)} up to date, {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
