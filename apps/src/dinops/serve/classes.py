"""Class names by label id: the model's own table, COCO's 80 names at their category ids, or ``class <id>``.

DINO predicts the annotation file's category id itself, so every table is keyed by id, and ids without a name
(COCO's gaps 12, 26, 29, ... and anything a custom model adds) are named ``class <id>`` rather than failing.

Where the names come from (:func:`resolve`, in this order; the table's ``source`` says which):

1. a file given with ``DINO_CLASS_NAMES`` (source: the file's path);
2. the checkpoint's ``categories`` (``[{"id", "name"}]``, written by `dinops train` from the training annotations)
   or ``class_names`` (source ``checkpoint``);
3. COCO's names, only for a model with COCO's class count, 91 (the official DINO checkpoints, which store no
   names, and older dinops checkpoints trained on COCO) (source ``coco``);
4. none: every label is ``class <id>`` (source ``ids``), so that a model trained on other data is never
   labelled with COCO's names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

COCO_NAMES: dict[int, str] = {
    1: "person", 2: "bicycle", 3: "car", 4: "motorcycle", 5: "airplane", 6: "bus", 7: "train", 8: "truck",
    9: "boat", 10: "traffic light", 11: "fire hydrant", 13: "stop sign", 14: "parking meter", 15: "bench",
    16: "bird", 17: "cat", 18: "dog", 19: "horse", 20: "sheep", 21: "cow", 22: "elephant", 23: "bear",
    24: "zebra", 25: "giraffe", 27: "backpack", 28: "umbrella", 31: "handbag", 32: "tie", 33: "suitcase",
    34: "frisbee", 35: "skis", 36: "snowboard", 37: "sports ball", 38: "kite", 39: "baseball bat",
    40: "baseball glove", 41: "skateboard", 42: "surfboard", 43: "tennis racket", 44: "bottle",
    46: "wine glass", 47: "cup", 48: "fork", 49: "knife", 50: "spoon", 51: "bowl", 52: "banana", 53: "apple",
    54: "sandwich", 55: "orange", 56: "broccoli", 57: "carrot", 58: "hot dog", 59: "pizza", 60: "donut",
    61: "cake", 62: "chair", 63: "couch", 64: "potted plant", 65: "bed", 67: "dining table", 70: "toilet",
    72: "tv", 73: "laptop", 74: "mouse", 75: "remote", 76: "keyboard", 77: "cell phone", 78: "microwave",
    79: "oven", 80: "toaster", 81: "sink", 82: "refrigerator", 84: "book", 85: "clock", 86: "vase",
    87: "scissors", 88: "teddy bear", 89: "hair drier", 90: "toothbrush",
}  # fmt: skip


COCO_NUM_CLASSES = 91  # the official DINO configs: labels are COCO category ids 1..90, plus the unused 0


class ClassNamesError(ValueError):
    """A class-name table that cannot be read; the message names the source."""


class ClassNames:
    """``names[label] -> str`` for any integer label, and the reverse lookup for the ``classes`` filter."""

    def __init__(self, table: Mapping[int, str], source: str) -> None:
        self.table = dict(table)
        self.source = source
        self._ids = {name.lower(): label for label, name in self.table.items()}

    def __getitem__(self, label: int) -> str:
        return self.table.get(int(label), f"class {int(label)}")

    def id_of(self, name: str) -> int | None:
        return self._ids.get(name.strip().lower())


def coco() -> ClassNames:
    return ClassNames(COCO_NAMES, "coco")


def from_value(value: Any, source: str) -> ClassNames:
    """A list (index = id), a dict (id -> name) or a COCO document / category list."""
    if isinstance(value, Mapping) and "categories" in value:
        value = value["categories"]
    if isinstance(value, list) and value and all(isinstance(c, Mapping) for c in value):
        try:
            return ClassNames({int(c["id"]): str(c["name"]) for c in value}, source)
        except (KeyError, TypeError, ValueError) as exc:
            raise ClassNamesError(f"{source}: every category needs an integer 'id' and a 'name' ({exc})") from exc
    if isinstance(value, list):
        return ClassNames({i: str(name) for i, name in enumerate(value) if name is not None}, source)
    if isinstance(value, Mapping):
        try:
            return ClassNames({int(k): str(v) for k, v in value.items()}, source)
        except ValueError as exc:
            raise ClassNamesError(f"{source}: keys must be integer class ids ({exc})") from exc
    raise ClassNamesError(f"{source}: expected a list, a mapping or COCO categories, got {type(value).__name__}")


def from_file(path: str | Path) -> ClassNames:
    """JSON (see :func:`from_value`) or plain text with one name per line, the line number (from 0) being the id."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ClassNamesError(f"cannot read class names from {path}: {exc.strerror}") from exc
    if path.suffix.lower() == ".json":
        try:
            return from_value(json.loads(text), str(path))
        except json.JSONDecodeError as exc:
            raise ClassNamesError(f"{path} is not valid JSON: {exc}") from exc
    return ClassNames({i: line.strip() for i, line in enumerate(text.splitlines()) if line.strip()}, str(path))


def from_checkpoint(checkpoint: Mapping[str, Any]) -> ClassNames | None:
    """Names stored by the trainer: ``class_names`` or ``categories`` at the top level or in ``args``."""
    args = checkpoint.get("args")
    args = vars(args) if hasattr(args, "__dict__") and not isinstance(args, Mapping) else (args or {})
    for holder in (checkpoint, args):
        for key in ("class_names", "categories"):
            if holder.get(key):
                return from_value(holder[key], "checkpoint")
    return None


def resolve(names_file: str, checkpoint: Mapping[str, Any], num_classes: int | None) -> ClassNames:
    """The class names of a served model, by the precedence of the module docstring."""
    if names_file:
        return from_file(names_file)
    stored = from_checkpoint(checkpoint)
    if stored is not None:
        return stored
    if num_classes == COCO_NUM_CLASSES:
        return coco()
    return ClassNames({}, "ids")
