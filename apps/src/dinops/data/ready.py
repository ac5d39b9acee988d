"""`dinops data-ready`: wait until the dataset's completion marker says the download finished.

The training Job runs it as an init container: it exits 0 (printing what the marker says) as soon as
``<data root>/.dinops-complete.json`` exists and says ``"complete": true``, which `dinops download` writes only
after every file was downloaded, verified and extracted. While waiting it prints a line every 30 s.

Exit status: 0 the dataset is complete; 1 still no marker after --wait seconds; 2 a usage error, or a marker that
exists but is broken (not JSON, or not complete=true); 143 stopped by SIGTERM.

Standard library only (plus dinops' own settings modules): it runs in the training image.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from dinops.download import marker
from dinops.settings import Setting, SettingsError, add_arguments, non_negative_float, positive_float, resolve
from dinops.train.settings import SETTINGS as TRAIN_SETTINGS

SAY_EVERY_S = 30.0

_DATA_ROOT = next(s for s in TRAIN_SETTINGS if s.dest == "data_root")  # the training app's own setting

SETTINGS: tuple[Setting, ...] = (
    _DATA_ROOT,
    Setting(
        "wait",
        0.0,
        "longest wait for the dataset, in seconds (0: wait forever)",
        type=non_negative_float,
        env="DINO_DATA_WAIT_S",
        flag="--wait",
    ),
    Setting(
        "poll",
        10.0,
        "seconds between two looks for the completion marker",
        type=positive_float,
        env="DINO_DATA_POLL_S",
        flag="--poll",
    ),
)
# The settings this command reads besides the training ones; `dinops train` and `dinops eval` accept their variables
# in their environment (the init container and the training container may share one ConfigMap).
EXTRA_SETTINGS = SETTINGS[1:]


class Terminated(Exception):
    pass


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dinops data-ready", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, SETTINGS)
    return parser


def say(text: str, err: bool = False) -> None:
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def wait_for(root: Path, wait_s: float, poll_s: float) -> int:
    target = marker.path(root)
    started = time.monotonic()
    said = None
    while True:
        try:
            body = marker.read(root)
        except marker.MarkerError as exc:
            say(f"dinops data-ready: {exc}", err=True)
            return 2
        if body is not None:
            say(marker.describe(target, body))
            return 0
        now = time.monotonic()
        waited = now - started
        if wait_s and waited >= wait_s:
            say(
                f"dinops data-ready: gave up after {waited:.0f} s: {target} is not there "
                "(did the download Job run and finish? see `kubectl logs job/<download job>`)",
                err=True,
            )
            return 1
        if said is None or now - said >= SAY_EVERY_S:
            say(f"waiting for the dataset: {target} is not there yet (is the download Job running?)")
            said = now
        pause = poll_s if not wait_s else max(0.0, min(poll_s, wait_s - waited))
        time.sleep(pause)


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        resolve(args, SETTINGS)
    except SettingsError as exc:
        say(f"dinops data-ready: {exc}", err=True)
        return 2
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (an embedding test): no handler
        previous = None
    try:
        return wait_for(Path(args.data_root), args.wait, args.poll)
    except Terminated:
        say("dinops data-ready: stopped (SIGTERM)", err=True)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
