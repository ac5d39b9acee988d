"""COCO-format detection data: the annotation file checked with clear errors, and a map-style dataset.

Labels are the annotation file's category ids themselves (as in the official DINO code), so the class count
is ``max(category id) + 1`` (91 for COCO 2017) and the denoising label book has the same size.

A sample is ``(image, target)``: ``image`` is a normalised float tensor [3, H, W]; ``target`` holds
``boxes`` [N, 4] float32 normalised (cx, cy, w, h) in [0, 1] relative to the transformed image, ``labels``
[N] int64, ``image_id`` int, ``orig_size`` and ``size`` as (h, w) int64 tensors. Crowd annotations are
dropped from training targets, as DINO does; evaluation uses the annotation file itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import tv_tensors

from dinops.data.cache import CacheBudget, open_cache

MAX_LISTED = 10  # problems listed in one error message; the count of the rest follows
BOX_TOLERANCE = 1.0  # pixels a box may stick out of its image (rounding in exported datasets)


class AnnotationError(ValueError):
    """The annotation file cannot be used; the message names the file and every kind of problem found."""


def _fail(path: Path, problems: list[str]) -> None:
    shown = problems[:MAX_LISTED]
    more = len(problems) - len(shown)
    text = f"{path}: {len(problems)} problem(s):\n  - " + "\n  - ".join(shown)
    if more:
        text += f"\n  ... and {more} more"
    raise AnnotationError(text)


def load_annotations(path: str | os.PathLike, image_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Read and validate a COCO detection annotation file; with ``image_dir``, every image file must exist.

    Raises :class:`AnnotationError` listing unknown category ids, degenerate or out-of-image boxes,
    duplicate ids, missing image files or an empty dataset.
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise AnnotationError(f"{path}: annotation file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AnnotationError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise AnnotationError(f"{path}: expected a JSON object with images, annotations and categories")
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(document.get(k), list)]
    if missing:
        raise AnnotationError(f"{path}: missing or not a list: {', '.join(missing)}")
    problems: list[str] = []
    categories: dict[int, str] = {}
    for cat in document["categories"]:
        cid = cat.get("id") if isinstance(cat, dict) else None
        if not isinstance(cid, int) or isinstance(cid, bool) or cid < 0:
            problems.append(f"category {cat!r}: id must be a non-negative integer")
        elif cid in categories:
            problems.append(f"category id {cid} is defined twice")
        else:
            categories[cid] = str(cat.get("name", cid))
    if not categories:
        problems.append("no categories")
    images: dict[int, dict] = {}
    for img in document["images"]:
        iid = img.get("id") if isinstance(img, dict) else None
        if not isinstance(iid, int) or isinstance(iid, bool):
            problems.append(f"image {img!r}: id must be an integer")
            continue
        if iid in images:
            problems.append(f"image id {iid} appears twice")
            continue
        w, h, name = img.get("width"), img.get("height"), img.get("file_name")
        if not (isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0 and isinstance(name, str) and name):
            problems.append(f"image id {iid}: needs file_name and positive integer width and height")
            continue
        images[iid] = img
    if not images:
        problems.append("empty dataset: no images")
    ann_ids: set[int] = set()
    for ann in document["annotations"]:
        aid = ann.get("id") if isinstance(ann, dict) else None
        if aid is None:
            problems.append(f"annotation {ann!r}: no id")
            continue
        if aid in ann_ids:
            problems.append(f"annotation id {aid} appears twice")
        ann_ids.add(aid)
        img = images.get(ann.get("image_id"))
        if img is None:
            problems.append(f"annotation {aid}: unknown image id {ann.get('image_id')!r}")
            continue
        if ann.get("category_id") not in categories:
            problems.append(
                f"annotation {aid}: unknown category id {ann.get('category_id')!r} (known: {sorted(categories)})"
            )
        bbox = ann.get("bbox")
        if not (
            isinstance(bbox, list)
            and len(bbox) == 4
            and all(isinstance(v, (int, float)) and np.isfinite(v) for v in bbox)
        ):
            problems.append(f"annotation {aid}: bbox must be [x, y, width, height] numbers, got {bbox!r}")
            continue
        x, y, w, h = bbox
        if w <= 0 or h <= 0:
            problems.append(f"annotation {aid}: degenerate box {bbox} (width and height must be > 0)")
        elif (
            x < -BOX_TOLERANCE
            or y < -BOX_TOLERANCE
            or x + w > img["width"] + BOX_TOLERANCE
            or y + h > img["height"] + BOX_TOLERANCE
        ):
            problems.append(
                f"annotation {aid}: box {bbox} lies outside image {img['id']} ({img['width']}x{img['height']})"
            )
    if image_dir is not None:
        root = Path(image_dir)
        if not root.is_dir():
            problems.append(f"image folder {root} does not exist")
        else:
            absent = [img["file_name"] for img in images.values() if not (root / img["file_name"]).is_file()]
            if absent:
                problems.append(f"{len(absent)} image file(s) missing in {root}, e.g. {', '.join(absent[:3])}")
    if problems:
        _fail(path, problems)
    return document


def categories(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's categories as ``[{"id": int, "name": str}]`` by id: what a checkpoint stores as class names."""
    return sorted(
        ({"id": int(c["id"]), "name": str(c.get("name", c["id"]))} for c in document["categories"]),
        key=lambda c: c["id"],
    )


def class_counts(document: dict[str, Any]) -> tuple[int, int]:
    """``(num_classes, dn_labelbook_size)`` for a dataset whose labels are its category ids."""
    num_classes = max(c["id"] for c in document["categories"]) + 1
    return num_classes, num_classes


class CocoDetection(Dataset):
    """Images of one split with their (validated) annotations.

    ``transforms(image, target)`` receives a ``tv_tensors.Image`` (uint8) and a target with ``boxes`` as
    absolute XYXY ``tv_tensors.BoundingBoxes`` and ``labels``; it returns the image as a normalised float tensor
    and the same keys (see :mod:`dinops.data.transforms`). With ``seed`` set, each sample's augmentation is
    drawn from a generator seeded by (seed, epoch, index), so it does not depend on the worker that loads
    it, on how many processes train, or on where a resumed run picks up.
    """

    def __init__(
        self,
        image_dir: str | os.PathLike,
        ann_file: str | os.PathLike,
        transforms: Callable | None = None,
        seed: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_budget: CacheBudget | None = None,
    ) -> None:
        self.image_dir = Path(image_dir)
        self.ann_file = Path(ann_file)
        self.document = load_annotations(self.ann_file, self.image_dir)
        self.transforms = transforms
        self.seed = seed
        self.epoch = 0
        self.images = sorted(self.document["images"], key=lambda img: img["id"])
        self.by_image: dict[int, list[dict]] = {img["id"]: [] for img in self.images}
        for ann in self.document["annotations"]:
            if not ann.get("iscrowd", 0):
                self.by_image[ann["image_id"]].append(ann)
        self.num_classes, self.dn_labelbook_size = class_counts(self.document)
        self.categories = categories(self.document)
        # decoded images on local disk, verified against the source (see dinops.data.cache)
        self.cache = (
            open_cache(cache_dir, self.image_dir, self.ann_file, self.images, cache_budget) if cache_dir else None
        )

    def __len__(self) -> int:
        return len(self.images)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def decode_source(self, img: dict) -> np.ndarray:
        """The image's RGB pixels [H, W, 3] uint8 decoded from the dataset folder (writable)."""
        with Image.open(self.image_dir / img["file_name"]) as image:
            return np.array(image.convert("RGB"))

    def _read(self, img: dict) -> torch.Tensor:
        if self.cache is None:
            array = self.decode_source(img)
        else:
            array = self.cache.load(img["id"], lambda: self.decode_source(img))
        return torch.from_numpy(array).permute(2, 0, 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        img = self.images[index]
        pixels = self._read(img)
        h, w = pixels.shape[-2:]
        anns = self.by_image[img["id"]]
        xywh = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        xyxy = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1)
        xyxy[:, 0::2] = xyxy[:, 0::2].clamp(0, w)
        xyxy[:, 1::2] = xyxy[:, 1::2].clamp(0, h)
        target: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(xyxy, format="XYXY", canvas_size=(h, w)),
            "labels": torch.tensor([a["category_id"] for a in anns], dtype=torch.int64),
            "image_id": img["id"],
            "orig_size": torch.tensor([h, w]),
        }
        image = tv_tensors.Image(pixels)
        if self.transforms is None:
            return image, target
        if self.seed is None:
            return self.transforms(image, target)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((self.seed * 1_000_003 + self.epoch) * 10_000_019 + index)
            return self.transforms(image, target)
