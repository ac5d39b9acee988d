from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from dinops.train.coco_eval import STAT_NAMES, evaluate, to_coco_detections


@pytest.fixture(scope="module")
def gt(small_synth):
    path = small_synth / "annotations" / "instances_val2017.json"
    return path, json.loads(path.read_text())


def _perfect(doc):
    return [
        {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": list(a["bbox"]), "score": 0.9}
        for a in doc["annotations"]
    ]


def _shifted(doc, iou):
    """Every box moved right so that its IoU with the ground truth is ``iou``: (w - d) / (w + d) = iou."""
    dets = []
    for a in doc["annotations"]:
        x, y, w, h = a["bbox"]
        d = w * (1 - iou) / (1 + iou)
        dets.append(
            {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": [x + d, y, w, h], "score": 0.8}
        )
    return dets


def _pycocotools_from_files(ann_path, dets, tmp_path):
    res = tmp_path / "res.json"
    res.write_text(json.dumps(dets))
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(ann_path))
        ev = COCOeval(coco, coco.loadRes(str(res)), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return list(ev.stats)


def test_perfect_predictions_give_ap_one(gt):
    stats, table = evaluate(gt[1], _perfect(gt[1]))
    assert len(stats) == len(STAT_NAMES) == 12
    assert stats[0] == pytest.approx(1.0) and stats[1] == pytest.approx(1.0) and stats[2] == pytest.approx(1.0)
    assert stats[8] == pytest.approx(1.0)  # AR@100
    assert table.count("Average") == 12


def test_shifted_boxes_give_the_pycocotools_value(gt, tmp_path):
    dets = _shifted(gt[1], 0.72)
    stats, _ = evaluate(gt[1], dets)
    assert stats == pytest.approx(_pycocotools_from_files(gt[0], dets, tmp_path))
    # IoU 0.72 passes the thresholds 0.50 ... 0.70 (5 of 10) and fails 0.75
    assert stats[0] == pytest.approx(0.5) and stats[1] == pytest.approx(1.0) and stats[2] == pytest.approx(0.0)


def test_no_or_foreign_detections_give_zero(gt):
    assert evaluate(gt[1], [])[0] == [0.0] * 12
    foreign = [dict(d, category_id=99) for d in _perfect(gt[1])]
    assert evaluate(gt[1], foreign)[0] == [0.0] * 12


def test_model_outputs_become_coco_results():
    results = [
        {"scores": torch.tensor([0.5]), "labels": torch.tensor([3]), "boxes": torch.tensor([[10.0, 20.0, 30.0, 60.0]])}
    ]
    assert to_coco_detections(results, [7]) == [
        {"image_id": 7, "category_id": 3, "bbox": [10.0, 20.0, 20.0, 40.0], "score": 0.5}
    ]
