"""The first correct detection through the web client's API, as the newcomer stages judge it: a validation image's
shape found with its dataset name, IoU >= 0.5 with the annotation, above the client's default threshold.

Standard library only: the newcomer test imports it, and the systemd-host test runs it as a script inside its
instance (`python3 - DATA CLIENT TIMEOUT < first_detection.py`), where it prints the detection as JSON and exits 0,
or exits 1 after TIMEOUT seconds without one.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

# The client's default score threshold (apps/src/dinops/client: the slider's start value).
THRESHOLD = 0.3


def annotations(data: Path) -> dict[str, list[tuple[str, list[float]]]]:
    """File name -> (category name, [x0, y0, x1, y1]) of each annotated shape of the demo's validation split."""
    coco = json.loads((data / "dinops-dataset/coco/annotations/instances_val2017.json").read_text())
    names = {c["id"]: c["name"] for c in coco["categories"]}
    files = {i["id"]: i["file_name"] for i in coco["images"]}
    boxes: dict[str, list[tuple[str, list[float]]]] = {}
    for a in coco["annotations"]:
        x, y, w, h = a["bbox"]
        boxes.setdefault(files[a["image_id"]], []).append((names[a["category_id"]], [x, y, x + w, y + h]))
    return boxes


def iou(a: list[float], b: list[float]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def correct_detection(client: str, image: Path, truth: list[tuple[str, list[float]]]) -> dict:
    """The client's API on one image: a detection whose name and box match an annotated shape, or {} (no model
    yet, or nothing right yet)."""
    request = urllib.request.Request(f"{client}/api/detect", data=image.read_bytes(),
                                     headers={"Content-Type": "image/jpeg"}, method="POST")  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            body = json.load(answer)
    except (OSError, ValueError):
        return {}
    for found in body.get("detections", []):
        for name, box in truth:
            if found["score"] >= THRESHOLD and found["name"] == name and iou(found["box"], box) >= 0.5:
                return found
    return {}


def first_correct_detection(data: Path, client: str) -> dict:
    """One pass over the first eight validation images: the first correct detection, or {}."""
    images = sorted((data / "dinops-dataset/coco/val2017").glob("*.jpg"))[:8]
    if not images:
        return {}
    truth = annotations(data)
    return next(filter(None, (correct_detection(client, image, truth[image.name]) for image in images)), {})


def main(argv: list[str]) -> int:
    data, client, timeout = Path(argv[0]), argv[1], float(argv[2])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = first_correct_detection(data, client)
        if found:
            print(json.dumps(found))
            return 0
        time.sleep(5)
    print(f"no correct detection from {client} within {timeout:.0f} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
