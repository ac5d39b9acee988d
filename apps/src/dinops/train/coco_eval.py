"""pycocotools bbox evaluation: detections in, the standard 12 numbers out.

A detection is ``{"image_id", "category_id", "bbox": [x, y, w, h] pixels of the original image, "score"}``,
the COCO results format. :func:`to_coco_detections` turns postprocessed model outputs (XYXY pixels) into it:
the one place where boxes leave the model's formats on the way out.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from typing import Any

import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

log = logging.getLogger(__name__)

STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def to_coco_detections(results: list[dict[str, torch.Tensor]], image_ids: list[int]) -> list[dict[str, Any]]:
    """``results[i]`` = ``{"scores", "labels", "boxes" XYXY pixels}`` for image ``image_ids[i]``."""
    out = []
    for image_id, res in zip(image_ids, results, strict=True):
        boxes = res["boxes"].detach().float().cpu()
        xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
        for box, score, label in zip(xywh, res["scores"].tolist(), res["labels"].tolist(), strict=True):
            out.append(
                {
                    "image_id": int(image_id),
                    "category_id": int(label),
                    "bbox": [round(v, 2) for v in box],
                    "score": round(float(score), 5),
                }
            )
    return out


def ground_truth(document: dict[str, Any]) -> COCO:
    coco = COCO()
    coco.dataset = copy.deepcopy(document)
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def evaluate(
    document: dict[str, Any], detections: list[dict[str, Any]], image_ids: list[int] | None = None
) -> tuple[list[float], str]:
    """Return the 12 COCO bbox numbers and the printed table. Unknown category ids in ``detections`` are ignored."""
    gt = ground_truth(document)
    known = set(gt.getCatIds())
    detections = [d for d in detections if d["category_id"] in known]
    if not detections:
        return [0.0] * len(STAT_NAMES), "no detections: every number is 0"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        dt = gt.loadRes(copy.deepcopy(detections))
        ev = COCOeval(gt, dt, iouType="bbox")
        if image_ids is not None:
            ev.params.imgIds = sorted(image_ids)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    table = "\n".join(line for line in printed.getvalue().splitlines() if line.startswith(" Average"))
    return [float(v) for v in ev.stats], table
