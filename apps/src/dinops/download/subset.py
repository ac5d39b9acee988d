"""Subset mode: N images of a split, chosen reproducibly, and a new annotation file that lists only them.

The original annotation file is never touched; the subset is written beside it as
``instances_<split>_subset<N>_seed<S>.json``.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path, PurePosixPath
from typing import Any


class SubsetError(ValueError):
    pass


def subset_path(annotations: Path, split: str, count: int, seed: int) -> Path:
    return annotations / f"instances_{split}_subset{count}_seed{seed}.json"


def choose(document: dict[str, Any], count: int, seed: int) -> dict[str, Any]:
    """The same ``count`` images for the same document and seed; annotations of other images dropped."""
    images = sorted(document.get("images", []), key=lambda image: image["id"])
    if not images:
        raise SubsetError("the annotation file lists no images")
    chosen = sorted(random.Random(seed).sample(images, min(count, len(images))), key=lambda image: image["id"])
    for image in chosen:
        name = str(image.get("file_name", ""))
        if not name or PurePosixPath(name).name != name:
            raise SubsetError(f"image {image['id']}: file_name {name!r} is not a plain file name")
    ids = {image["id"] for image in chosen}
    annotations = [a for a in document.get("annotations", []) if a["image_id"] in ids]
    return {**document, "images": chosen, "annotations": annotations}


def write_json(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)
