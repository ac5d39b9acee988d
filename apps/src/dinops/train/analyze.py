"""`dinops analyze OUTPUT_DIR`: plots and a short summary of a training run.

Reads ``OUTPUT_DIR/log.txt`` (one JSON line per epoch; official DINO logs work too) and, when present, the
console log (``OUTPUT_DIR/console.log`` or ``--console-log``, e.g. saved from ``kubectl logs``) for the loss
at every logged step. Writes PNG plots with labelled numeric axes and ``summary.md`` into ``--out``
(default ``OUTPUT_DIR/analysis``)::

    loss.png          total training loss and its main components per epoch (and per logged step)
    class_error.png   training class error per epoch
    lr.png            learning rate per epoch
    ap.png            bbox AP, AP50, AP75 on the validation split per epoch

    dinops analyze out/r50 --log-scale
"""

from __future__ import annotations

import argparse
import logging
import math
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dinops.train.coco_eval import STAT_NAMES  # noqa: E402
from dinops.train.logs import read_log_txt  # noqa: E402

log = logging.getLogger("dinops.analyze")

CONSOLE_LINE = re.compile(r"Epoch: \[(\d+)\]\s+\[\s*(\d+)/(\d+)\].*?\sloss: ([-+\w.]+)")
COMPONENT = re.compile(r"^train_loss_(?:ce|bbox|giou)(?:_dn)?$")  # the last layer's weighted terms


def console_losses(path: Path) -> list[tuple[float, float]]:
    """(fractional epoch, smoothed loss) for every step line of a console log."""
    points = []
    for line in path.read_text(errors="replace").splitlines():
        m = CONSOLE_LINE.search(line)
        if m:
            epoch, step, total, loss = int(m[1]), int(m[2]), int(m[3]), m[4]
            try:
                points.append((epoch + step / max(total, 1), float(loss)))
            except ValueError:
                continue
    return points


def _axes(title: str, ylabel: str, log_scale: bool):
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.set_title(title)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if log_scale:
        ax.set_yscale("log")
    return fig, ax


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        value = r.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            xs.append(int(r.get("epoch", len(xs))))
            ys.append(float(value))
    return xs, ys


def plot_all(records: list[dict[str, Any]], steps: list[tuple[float, float]], out: Path, log_scale: bool) -> list[Path]:
    written = []
    fig, ax = _axes("training loss", "loss (weighted sum)" + (", log scale" if log_scale else ""), log_scale)
    if steps:
        ax.plot([s[0] for s in steps], [s[1] for s in steps], color="0.75", linewidth=1, label="loss, logged steps")
    # an epoch's average belongs to the middle of the epoch, where the per-step losses show it
    middle = 0.5 if steps else 0.0
    xs, ys = _series(records, "train_loss")
    ax.plot([x + middle for x in xs], ys, marker="o", linewidth=2, label="loss, epoch average")
    for key in sorted(k for k in records[-1] if COMPONENT.match(k)):
        xs, ys = _series(records, key)
        ax.plot(
            [x + middle for x in xs], ys, marker=".", linewidth=1, label=key.removeprefix("train_") + " (last layer)"
        )
    ax.legend(fontsize=7, ncol=2)
    written.append(_save(fig, out / "loss.png"))
    for key, name, ylabel in (
        ("train_class_error", "class_error.png", "class error (%)"),
        ("train_lr", "lr.png", "learning rate"),
    ):
        fig, ax = _axes(key.removeprefix("train_").replace("_", " "), ylabel, log_scale and key == "train_lr")
        ax.plot(*_series(records, key), marker="o")
        written.append(_save(fig, out / name))
    fig, ax = _axes("bbox AP on the validation split", "AP", False)
    for i, name in enumerate(STAT_NAMES[:3]):
        xs = [int(r["epoch"]) for r in records if isinstance(r.get("test_coco_eval_bbox"), list)]
        ys = [r["test_coco_eval_bbox"][i] for r in records if isinstance(r.get("test_coco_eval_bbox"), list)]
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_ylim(0, 1)
    ax.legend()
    written.append(_save(fig, out / "ap.png"))
    return written


def summary(records: list[dict[str, Any]], plots: list[Path]) -> str:
    evaluated = [r for r in records if isinstance(r.get("test_coco_eval_bbox"), list)]
    lines = [f"# Training summary ({len(records)} epoch(s))", ""]
    first, last = records[0].get("train_loss"), records[-1].get("train_loss")
    if isinstance(first, (int, float)) and isinstance(last, (int, float)):
        span = f"{first:.4f} (epoch {records[0].get('epoch')}) -> {last:.4f} (epoch {records[-1].get('epoch')})"
        lines.append(f"- training loss: {span}")
    if evaluated:
        best = max(evaluated, key=lambda r: r["test_coco_eval_bbox"][0])
        final = evaluated[-1]["test_coco_eval_bbox"]
        lines.append(f"- best bbox AP: {best['test_coco_eval_bbox'][0]:.4f} at epoch {best.get('epoch')}")
        lines.append(f"- last bbox AP: {final[0]:.4f}, AP50 {final[1]:.4f}, AP75 {final[2]:.4f}")
        lines += ["", "| epoch | loss | AP | AP50 | AP75 |", "|---|---|---|---|---|"]
        for r in evaluated:
            s = r["test_coco_eval_bbox"]
            lines.append(
                f"| {r.get('epoch')} | {r.get('train_loss', float('nan')):.4f} | {s[0]:.4f} | {s[1]:.4f} | {s[2]:.4f} |"
            )
    else:
        lines.append("- no evaluation in the log")
    lines += ["", "Plots: " + ", ".join(f"[{p.name}]({p.name})" for p in plots), ""]
    return "\n".join(lines)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dinops analyze", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("output_dir", help="training output directory (holds log.txt)")
    p.add_argument("--out", default="", help="folder for the plots and summary.md (default OUTPUT_DIR/analysis)")
    p.add_argument(
        "--console-log", default="", help="console log to read per-step losses from (default OUTPUT_DIR/console.log)"
    )
    p.add_argument("--log-scale", action="store_true", help="logarithmic loss and learning-rate axes")
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = get_args_parser().parse_args(argv)
    root = Path(args.output_dir)
    log_txt = root / "log.txt"
    try:
        records = read_log_txt(log_txt) if log_txt.is_file() else []
    except ValueError as exc:
        log.error("dinops analyze: %s", exc)
        return 2
    if not records:
        log.error(
            "dinops analyze: %s has no epochs (missing or empty); has a training run finished an epoch there?", log_txt
        )
        return 2
    console = Path(args.console_log) if args.console_log else root / "console.log"
    if args.console_log and not console.is_file():
        log.error("dinops analyze: --console-log %s: no such file", console)
        return 2
    steps = console_losses(console) if console.is_file() else []
    out = Path(args.out) if args.out else root / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_all(records, steps, out, args.log_scale)
    (out / "summary.md").write_text(summary(records, plots))
    log.info("wrote %s and %s", ", ".join(str(p) for p in plots), out / "summary.md")
    return 0
