"""The figure we track for newcomers: wall-clock time from `git clone` to the first correct detection.

Runs the newcomer stage's fixture alone (tests/newcomer: a fresh clone with no .venv, this machine's Docker daemon
stopped, then the README's `make up`, then the web client's API polled until a validation image's shape is found
with its dataset name and IoU >= 0.5), and prints the figures it wrote to artifacts/newcomer.json. Images already
built on this machine's Docker are reused (content-hash tags), as in `make test`; `--cold` removes the dinops images
first, so that the figure includes their build, as on a fresh machine.
``make bench`` runs it as ``python apps/bench/bench_newcomer.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "artifacts/newcomer.json"


def _remove_dinops_images() -> None:
    listed = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "dinops-*"],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    if listed:
        subprocess.run(["docker", "image", "rm", "-f", *listed], capture_output=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="remove the dinops images first (builds included)")
    args = parser.parse_args()
    if args.cold:
        _remove_dinops_images()
    RESULT.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "newcomer", "-s", "-q",
         "tests/newcomer/test_newcomer.py::test_site_yml_runs_the_demo_on_docker"],
        cwd=REPO, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not RESULT.is_file():
        print("newcomer bench: the stage failed; see artifacts/newcomer-make-up.log", file=sys.stderr)
        return 1
    figures = json.loads(RESULT.read_text())
    print(f"newcomer: git clone to the first correct detection {figures['clone_to_first_detection_s']} s "
          f"(make up {figures['make_up_s']} s; images {'built' if args.cold else 'reused'})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
