"""Where training reports go: the console (and ``console.log``), ``log.txt``, TensorBoard, Katib metric lines.

``log.txt`` holds one JSON object per epoch with the official DINO field names (``train_loss``,
``train_class_error``, ``train_lr``, ``train_loss_bbox``, ..., ``test_coco_eval_bbox`` with the 12 COCO
numbers, ``epoch``, ``n_parameters``, ``epoch_time``), so tools written for DINO's logs read ours.
Katib's StdOut metrics collector reads ``<RFC 3339 timestamp> name=value ...`` lines; :func:`metric_line` writes them.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import numbers
import re
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("dinops.train")

CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def teardown_logging() -> None:
    """Remove (and close) the handlers :func:`setup_logging` added; for callers that run `main()` in-process."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_dinops", False):
            root.removeHandler(handler)
            handler.close()


def setup_logging(output_dir: Path | None, main_process: bool) -> None:
    """Console for every process (warnings only on the others); ``console.log`` from the main one."""
    teardown_logging()
    root = logging.getLogger()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if output_dir is not None and main_process:
        handlers.append(logging.FileHandler(output_dir / "console.log"))
    for handler in handlers:
        handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
        handler._dinops = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.INFO if main_process else logging.WARNING)


def append_log_txt(output_dir: Path, record: dict[str, Any]) -> None:
    with open(output_dir / "log.txt", "a") as fh:
        fh.write(json.dumps(record) + "\n")


def read_log_txt(path: Path) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
    return records


# Katib v0.19.0's default StdOut filter reads a name as ``[\w|-]+`` (ASCII in Go's RE2):
# https://github.com/kubeflow/katib/blob/v0.19.0/pkg/metricscollector/v1beta1/common/const.go#L47
METRIC_NAME = re.compile(r"[A-Za-z0-9_-]+")


def katib_timestamp(when: datetime.datetime | None = None) -> str:
    """UTC with microseconds and ``Z``: a form Go's ``time.Parse(time.RFC3339Nano, ...)`` takes on its fast path.

    Katib takes the first space-separated token of a metric line as its timestamp when it parses so
    (https://github.com/kubeflow/katib/blob/v0.19.0/pkg/metricscollector/v1beta1/file-metricscollector/file-metricscollector.go#L89-L99);
    median-stop early stopping orders the observations by it.
    """
    when = datetime.datetime.now(datetime.timezone.utc) if when is None else when.astimezone(datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _katib_number(value: object) -> str | None:
    """The value as Katib's regex reads it back whole: ``str`` of an integer, ``repr`` of a float (round trip)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral):
        return str(int(value))
    number = float(value)
    return repr(number) if math.isfinite(number) else None  # repr: shortest exact form, e.g. 0.1234, 1e-05


def metric_line(values: dict[str, object], when: datetime.datetime | None = None) -> str:
    r"""One ``<timestamp> name=value name=value`` line for Katib's StdOut collector; finite numbers only.

    Every value is printed in full (``float(text) == value``), in a form the default filter
    ``([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)`` captures entirely. An empty string when no value is
    finite.
    """
    pairs = []
    for name, value in values.items():
        if not METRIC_NAME.fullmatch(name):
            raise ValueError(f"metric name {name!r}: Katib reads only letters, digits, '_' and '-'")
        text = _katib_number(value)
        if text is not None:
            pairs.append(f"{name}={text}")
    return f"{katib_timestamp(when)} {' '.join(pairs)}" if pairs else ""


def metric_lines(values: dict[str, object]) -> list[str]:
    """:func:`metric_line` as a list (empty when no value is finite), for callers that print line by line."""
    line = metric_line(values)
    return [line] if line else []


class TensorBoard:
    """Scalars into ``OUTPUT_DIR/tensorboard`` from the main process; a no-op elsewhere or when disabled."""

    def __init__(self, output_dir: Path, enabled: bool) -> None:
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(output_dir / "tensorboard"))

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
