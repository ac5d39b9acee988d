"""`dinops eval CHECKPOINT`: COCO bbox evaluation of a checkpoint on a COCO-format split.

Prints pycocotools' standard 12-number table and writes a JSON file with the numbers (by name) and every
detection in the COCO results format. The model configuration comes from the checkpoint (dinops checkpoints
store it; official ones store their training ``args``); only a bare state dict is built from ``--model`` and
``--model-overrides``.

    dinops eval out/r50/checkpoint_best_regular.pth --data-root data/coco --output out/r50/eval.json
    dinops eval checkpoint0011_4scale.pth --data-root data/coco        # official: AP 49.0 on val2017
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from dinops.data.coco import AnnotationError, CocoDetection
from dinops.data.loader import ResumableBatchSampler, collate
from dinops.data.ready import EXTRA_SETTINGS
from dinops.data.transforms import eval_transforms
from dinops.settings import SettingsError, add_arguments, check_unknown_env, resolve
from dinops.train.coco_eval import STAT_NAMES, evaluate
from dinops.train.engine import predict
from dinops.train.logs import metric_lines
from dinops.train.model_setup import model_config
from dinops.train.settings import ENV_PREFIX, MODEL_ENV, SETTINGS

log = logging.getLogger("dinops.eval")

USED = (
    "data_root", "val_images", "val_annotations", "eval_size", "max_size", "batch_size", "num_workers",
    "cache_dir", "model", "model_overrides", "num_classes", "num_select", "device", "amp", "lr_backbone",
    "backbone_weights", "progress",
)  # fmt: skip
EVAL_SETTINGS = tuple(s for s in SETTINGS if s.dest in USED)


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dinops eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", help="official DINO or dinops checkpoint file")
    parser.add_argument("--output", default="eval.json", help="JSON file for the numbers and the detections")
    add_arguments(parser, EVAL_SETTINGS)
    return parser


def warn_on_other_names(trained: list[dict] | None, evaluated: list[dict], annotations: str) -> list[int]:
    """Labels are category ids: a model whose training named an id differently than the evaluation file is scored
    against the wrong classes. Logs one warning listing them; returns those ids."""
    if not trained:
        return []
    theirs = {c["id"]: c["name"] for c in evaluated}
    differ = sorted(c["id"] for c in trained if c["id"] in theirs and theirs[c["id"]] != c["name"])
    if differ:
        shown = ", ".join(
            f"{i}: trained {n!r} vs {theirs[i]!r}" for i, n in ((c["id"], c["name"]) for c in trained) if i in differ
        )
        log.warning(
            "%s names category ids differently than the training data did (%s); the numbers compare other classes",
            annotations,
            shown,
        )
    return differ


def run(args: argparse.Namespace) -> dict:
    from dinops.model import build_dino, load_checkpoint, postprocess
    from dinops.model.checkpoint import checkpoint_config, read_checkpoint
    from dinops.model.inference import optimize_for_inference

    root = Path(args.data_root)
    images = args.val_images or str(root / "val2017")
    annotations = args.val_annotations or str(root / "annotations" / "instances_val2017.json")
    if not Path(args.checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint {args.checkpoint} does not exist")
    dataset = CocoDetection(
        images, annotations, eval_transforms(args.eval_size, args.max_size), cache_dir=args.cache_dir or None
    )
    ckpt = read_checkpoint(args.checkpoint)  # refuses files that would run code when unpickled
    warn_on_other_names(ckpt.get("categories"), dataset.categories, annotations)
    cfg = checkpoint_config(ckpt)
    if cfg is not None:
        log.info("model configuration from the checkpoint (%s, %d classes)", cfg.backbone, cfg.num_classes)
    else:
        num_classes = args.num_classes or dataset.num_classes
        cfg = model_config(args, num_classes, num_classes)
    del ckpt
    device = torch.device(
        "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    )
    model = build_dino(cfg.replace(backbone_weights=None))
    load_checkpoint(model, args.checkpoint, num_classes=cfg.num_classes)
    optimize_for_inference(model).to(device)  # the fast path, as dinops serve (docs/model.md)
    sampler = ResumableBatchSampler(len(dataset), args.batch_size, shuffle=False, drop_last=False)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=args.num_workers)
    detections = predict(model, postprocess, loader, device, args.amp, args.num_select or cfg.num_select, args.progress)
    stats, table = evaluate(dataset.document, detections)
    log.info("bbox evaluation of %s on %s (%d images):\n%s", args.checkpoint, annotations, len(dataset), table)
    report = {
        "checkpoint": str(args.checkpoint),
        "annotations": str(annotations),
        "stats": dict(zip(STAT_NAMES, stats, strict=True)),
        "detections": detections,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, out)
    for line in metric_lines({"bbox_ap": stats[0], "bbox_ap50": stats[1], "bbox_ap75": stats[2]}):
        sys.stdout.write(line + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = get_args_parser().parse_args(argv)
    try:
        check_unknown_env(SETTINGS + EXTRA_SETTINGS + MODEL_ENV, (ENV_PREFIX,))
        resolve(args, EVAL_SETTINGS)
        run(args)
    except (SettingsError, AnnotationError, FileNotFoundError, ValueError) as exc:
        log.error("dinops eval: %s", exc)
        return 2
    return 0
