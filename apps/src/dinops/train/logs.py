"""Where training reports go: the console (and ``console.log``), ``log.txt``, TensorBoard, Katib metric lines.

``log.txt`` holds one JSON object per epoch with the official DINO field names (``train_loss``,
``train_class_error``, ``train_lr``, ``train_loss_bbox``, ..., ``test_coco_eval_bbox`` with the 12 COCO
numbers, ``epoch``, ``n_parameters``, ``epoch_time``), so tools written for DINO's logs read ours.
Katib's stdout collector reads ``name=value`` lines; :func:`metric_lines` writes them.
"""

from __future__ import annotations

import json
import logging
import math
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


def metric_lines(values: dict[str, float]) -> list[str]:
    """``name=value`` lines for Katib's stdout metrics collector (finite numbers only)."""
    return [
        f"{name}={value:.6g}"
        for name, value in values.items()
        if isinstance(value, (int, float)) and math.isfinite(value)
    ]


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
