"""`dinops data-ready`: wait until the dataset's completion marker says the download finished.

The training Job runs it as an init container: it exits 0 (printing what the marker says) as soon as
``<data root>/.dinops-complete.json`` exists and says ``"complete": true``, which `dinops download` writes only
after every file was downloaded, verified and extracted. While waiting it prints a line every 30 s.

When the volume that holds the data root (the nearest mount point above it, from /proc/self/mountinfo) is empty,
each waiting line says so, with the filesystem and the host directory it is: on a fresh volume the download has not
written yet, but a volume that held the dataset before and is empty now is the wrong one (the Docker runtime after
a reboot: a container bound the host's directory before its NFS export was mounted there, docs/docker-runtime.md).

While it waits, the training panel of the web client can say why: given the training run's output folder
(``--output-dir``, ``DINO_OUTPUT_DIR``: the trainer's own setting and variable; empty, the default here, writes
nothing) and a writer (``announce``, which `dinops data-ready` gets from :func:`dinops.train.progress.data_ready`:
the data package stands below training and never imports it), each waiting line also goes to
``OUTPUT_DIR/progress.json`` as state ``waiting_for_data`` with that line as its ``reason``. A folder that is not there
(the output volume not mounted in this container) or cannot be written is said once on stderr and the wait goes on:
the panel is a courtesy, the gate is not.

Exit status: 0 the dataset is complete; 1 still no marker after --wait seconds; 2 a usage error, or a marker that
exists but is broken (not JSON, or not complete=true); 143 stopped by SIGTERM.

Standard library only (plus dinops' own settings modules): it runs in the training image.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from dinops.data.settings import DATA_PATH_SETTINGS
from dinops.download import marker
from dinops.settings import Setting, SettingsError, add_arguments, non_negative_float, positive_float, resolve

SAY_EVERY_S = 30.0
# The kernel's table of this process's mounts (proc(5), /proc/[pid]/mountinfo).
MOUNTINFO = Path("/proc/self/mountinfo")

_DATA_ROOT = next(s for s in DATA_PATH_SETTINGS if s.dest == "data_root")  # the training app's own setting

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
    # The trainer's output folder, under the trainer's variable (dinops.train.settings output_dir), with no default:
    # the gate writes into it only when told where it is.
    Setting(
        "output_dir",
        "",
        "the training run's output folder: while waiting, its progress.json says waiting_for_data and why (the web "
        "client's training panel); empty: nothing written",
        env="DINO_OUTPUT_DIR",
        flag="--output-dir",
    ),
)
# The settings this command reads besides the training ones; `dinops train` and `dinops eval` accept their variables
# in their environment (the init container and the training container may share one ConfigMap). The output folder is
# the trainer's own setting already.
EXTRA_SETTINGS = SETTINGS[1:3]

# What the gate tells the training run's output folder while it waits: (output folder, reason) -> None; raises
# OSError when it cannot write there.
Announce = Callable[[Path, str], object]


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


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040 ...)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def volume_of(path: Path, mountinfo: str) -> dict[str, str] | None:
    """The mount that holds ``path`` (the longest mount point that is it or a parent), from mountinfo's text:
    {mount_point, root (the directory of its filesystem that is mounted there), fstype, source}; None if none."""
    best = None
    target = str(path)
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        point = _unescape(fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best["mount_point"])):
            best = {"mount_point": point, "root": _unescape(fields[3]), "fstype": fields[dash + 1],
                    "source": _unescape(fields[dash + 2]) if len(fields) > dash + 2 else ""}  # fmt: skip
    return best


def empty_volume(root: Path) -> str | None:
    """A sentence when the volume holding ``root`` is a mount point other than / with nothing in it, else None."""
    try:
        volume = volume_of(root, MOUNTINFO.read_text())
    except OSError:  # no /proc (not Linux): nothing to say
        return None
    if volume is None or volume["mount_point"] == "/":
        return None
    try:
        if any(Path(volume["mount_point"]).iterdir()):
            return None
    except OSError:
        return None
    return (
        f"{volume['mount_point']} is an empty mount point ({volume['fstype']} {volume['source']}, directory "
        f"{volume['root']} of it): nothing was downloaded into this volume yet. If the dataset was downloaded before, "
        "this is not the volume that holds it: on the Docker runtime after a reboot, the host's NFS export was not "
        "mounted there when Docker started this container (docs/docker-runtime.md, Reboots)"
    )


def reason(target: Path, empty: str | None) -> str:
    """Why training has not started, for a person: the missing marker, and the empty volume when it is one."""
    return f"waiting for the dataset's download to complete: {target} is not there yet" + (
        f"; {empty}" if empty else ""
    )


def _teller(output_dir: str, announce: Announce | None) -> Callable[[str], None]:
    """The waiting line to ``announce`` into ``output_dir``, if both are given; a failure is said once, never raised."""
    failed: list[str] = []

    def tell(why: str) -> None:
        if not output_dir or announce is None or failed:
            return
        try:
            announce(Path(output_dir), why)
        except (OSError, ValueError) as exc:
            failed.append(str(exc))
            say(f"dinops data-ready: the training panel is not told why training waits ({exc}); waiting anyway",
                err=True)  # fmt: skip

    return tell


def wait_for(root: Path, wait_s: float, poll_s: float, tell: Callable[[str], None] = lambda why: None) -> int:
    """Wait for ``root``'s completion marker; ``tell`` gets each waiting line's reason (every SAY_EVERY_S)."""
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
            empty = empty_volume(root)
            say(
                f"waiting for the dataset: {target} is not there yet (is the download Job running?)"
                + (f"; {empty}" if empty else "")
            )
            tell(reason(target, empty))
            said = now
        pause = poll_s if not wait_s else max(0.0, min(poll_s, wait_s - waited))
        time.sleep(pause)


def main(argv: list[str] | None = None, announce: Announce | None = None) -> int:
    """`dinops data-ready`; ``announce`` writes the waiting state into the output folder (see the module's text)."""
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
        return wait_for(Path(args.data_root), args.wait, args.poll, _teller(args.output_dir, announce))
    except Terminated:
        say("dinops data-ready: stopped (SIGTERM)", err=True)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
