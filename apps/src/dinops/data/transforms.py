"""DINO's augmentation with torchvision.transforms.v2, boxes carried as ``tv_tensors.BoundingBoxes``.

Training (as the official DINO recipe): random horizontal flip, then with equal chance either a multi-scale
resize of the shorter side to one of ``scales`` (longer side at most ``max_size``), or a resize to one of
``crop_scales``, a random crop of a side between ``crop_size`` bounds and the multi-scale resize. Evaluation:
resize the shorter side to ``eval_size`` (longer at most ``max_size``). Both end by normalising the image
with the ImageNet mean and standard deviation and turning boxes into normalised (cx, cy, w, h): the one
place where box formats change on the way in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
COCO_SCALES = (480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800)
COCO_CROP_SCALES = (400, 500, 600)
COCO_CROP_SIZE = (384, 600)


class RandomSizeCrop(v2.Transform):
    """Crop a random region whose sides lie in ``[min_size, max_size]`` (and within the image)."""

    def __init__(self, min_size: int, max_size: int) -> None:
        super().__init__()
        self.min_size, self.max_size = min_size, max_size

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = v2.query_size(flat_inputs)
        w = int(torch.randint(min(width, self.min_size), min(width, self.max_size) + 1, ()))
        h = int(torch.randint(min(height, self.min_size), min(height, self.max_size) + 1, ()))
        top = int(torch.randint(0, height - h + 1, ()))
        left = int(torch.randint(0, width - w + 1, ()))
        return {"top": top, "left": left, "height": h, "width": w}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.crop, inpt, **params)


class ToModelInput:
    """uint8 image -> normalised float; absolute XYXY boxes -> normalised CXCYWH plain tensors."""

    def __init__(self) -> None:
        self.image = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])

    def __call__(self, image: tv_tensors.Image, target: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        h, w = image.shape[-2:]
        boxes = F.convert_bounding_box_format(target["boxes"], new_format=tv_tensors.BoundingBoxFormat.CXCYWH)
        out = dict(target)
        out["boxes"] = boxes.as_subclass(torch.Tensor) / torch.tensor([w, h, w, h], dtype=torch.float32)
        out["size"] = torch.tensor([h, w])
        return self.image(image).as_subclass(torch.Tensor), out


class Pipeline:
    """``(image, target) -> (image, target)``: geometric steps, dropping boxes they destroyed, then model input."""

    def __init__(self, geometric: v2.Transform) -> None:
        self.geometric = geometric
        self.sanitize = v2.SanitizeBoundingBoxes(min_size=1.0)  # finds target["labels"] itself
        self.finish = ToModelInput()

    def __call__(self, image: tv_tensors.Image, target: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        image, target = self.sanitize(self.geometric(image, target))
        return self.finish(image, target)


def train_transforms(
    scales: Sequence[int] = COCO_SCALES,
    max_size: int = 1333,
    crop_scales: Sequence[int] = COCO_CROP_SCALES,
    crop_size: tuple[int, int] = COCO_CROP_SIZE,
) -> Pipeline:
    resize = v2.RandomShortestSize(list(scales), max_size=max_size)
    crop_path = v2.Compose(
        [
            v2.RandomShortestSize(list(crop_scales)),
            RandomSizeCrop(*crop_size),
            v2.RandomShortestSize(list(scales), max_size=max_size),
        ]
    )
    return Pipeline(v2.Compose([v2.RandomHorizontalFlip(), v2.RandomChoice([resize, crop_path])]))


def eval_transforms(size: int = 800, max_size: int = 1333) -> Pipeline:
    return Pipeline(v2.RandomShortestSize([size], max_size=max_size))
