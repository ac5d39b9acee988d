"""Sizes of the dinops images and what takes the space, plus the time of a (warm) build.

Builds the images if needed (air-gapped mode by default, as CI; ``--pull-mode`` for python:3.11-slim-bookworm), then
prints one line per image: its size, the size of its own layers above its parent, and the limit it must keep; then the
largest packages inside the shared PyTorch image. The cold build time comes from the last image test run
(build/image-logs/timings.json). Exit 1 when the client or downloader image is over its 150 MB limit.
``make bench`` runs it as ``python apps/bench/bench_images.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMITS_MB = {"client": 150, "download": 150}
# Run inside the PyTorch image: MB per top-level entry of site-packages, and per nvidia/ library.
SPACE_PROBE = r"""
import json, os, sys
site = next(p for p in sys.path if p.endswith("site-packages"))
def size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs
               if not os.path.islink(os.path.join(r, f)))
entries = {name: size(os.path.join(site, name)) for name in os.listdir(site) if not name.endswith(".dist-info")}
nvidia = os.path.join(site, "nvidia")
libs = {f"nvidia/{n}": size(os.path.join(nvidia, n)) for n in os.listdir(nvidia)} if os.path.isdir(nvidia) else {}
print(json.dumps({"site-packages": entries, "nvidia": libs}))
"""


def load_build():
    spec = importlib.util.spec_from_file_location("dinops_images_build", REPO / "apps" / "images" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def docker_json(*args: str) -> dict:
    return json.loads(subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pull-mode", action="store_true", help="python:3.11-slim-bookworm base and the package index")
    parser.add_argument("--top", type=int, default=8, help="largest entries of the PyTorch image to list")
    args = parser.parse_args(argv)
    build = load_build()
    airgap = not args.pull_mode
    base = build.AIRGAP_BASE if airgap else build.DEFAULT_BASE
    wheelhouse = REPO / "build" / "wheelhouse" if airgap else None
    start = time.monotonic()
    build.ensure_base(base, airgap)
    if wheelhouse is not None:
        build.ensure_wheelhouse(wheelhouse)
    steps = build.plan(base)
    timings = build.build(steps, wheelhouse, REPO / "build" / "image-logs")
    warm_s = time.monotonic() - start

    inspected = {s.name: docker_json("image", "inspect", s.image)[0] for s in steps}
    base_mb = docker_json("image", "inspect", base)[0]["Size"] / 1e6
    print(f"{'image':<26} {'size MB':>9} {'own MB':>8}  limit   notes")
    failed = False
    for step in steps:
        size_mb = inspected[step.name]["Size"] / 1e6
        parent = build.CHAIN[step.name][0]
        parent_mb = inspected[parent]["Size"] / 1e6 if parent else base_mb
        limit = LIMITS_MB.get(step.name)
        over = limit is not None and size_mb > limit
        failed |= over
        notes = {"torch": "shared by serve, train, gpu-check", "runtime": "trimmed, flattened copy of the base"}.get(
            step.name, ""
        )
        notes += " OVER LIMIT" if over else ""
        print(
            f"{step.image.split(':')[0]:<26} {size_mb:>9.0f} {size_mb - parent_mb:>8.1f}  "
            f"{(str(limit) + ' MB') if limit else '-':<7} {notes}"
        )
    print(f"(base {base}: {base_mb:.0f} MB)")

    torch_image = next(s.image for s in steps if s.name == "torch")
    probe = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "python3", torch_image, "-c", SPACE_PROBE],
        check=True,
        capture_output=True,
        text=True,
    )
    space = json.loads(probe.stdout)
    print(f"\nlargest entries of site-packages in {torch_image}:")
    for name, size in sorted(space["site-packages"].items(), key=lambda item: -item[1])[: args.top]:
        print(f"  {size / 1e6:8.0f} MB  {name}")
    print("  of which nvidia/:")
    for name, size in sorted(space["nvidia"].items(), key=lambda item: -item[1])[: args.top]:
        print(f"  {size / 1e6:8.0f} MB  {name}")

    built = [name for name, seconds in timings.items() if seconds is not None]
    print(f"\nthis run: {len(built)} image(s) built {built or ''} in {warm_s:.1f} s")
    record = REPO / "build" / "image-logs" / "timings.json"
    if record.is_file():
        cold = json.loads(record.read_text())
        per_image = ", ".join(f"{k} {v:.0f} s" for k, v in cold["images"].items() if v is not None)
        print(f"last image test run: {cold['total_s']:.0f} s ({per_image or 'nothing built'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
