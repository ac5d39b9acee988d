"""The classes a served model answers, by label id, with their names: the checkpoint's categories, or COCO's 80.

DINO predicts the annotation file's category id itself, and its class head has max id + 1 outputs: a model trained
on categories 1-3 has an output 0 that is no class, and COCO's 91 outputs hold 11 ids that are none of its 80
categories (0, 12, 26, ...). The table decides which outputs are answered: serving takes its top-k over these
columns only (:class:`dinops.serve.detector.Detector`), so no other id is ever answered, and every answered id has a
name.

Where the table comes from (:func:`resolve`, in this order; the table's ``source`` says which):

1. a file given with ``DINO_CLASS_NAMES`` (source: the file's path): its ids replace the checkpoint's;
2. the checkpoint's ``categories`` (``[{"id", "name"}]``, written by `dinops train` from the training annotations)
   or ``class_names`` (source ``checkpoint``);
3. COCO's 80 categories, only for a model with COCO's class count, 91 (the official DINO checkpoints, which store
   none, and older dinops checkpoints trained on COCO) (source ``coco``);
4. none: the model is refused (:func:`check`), as which of its outputs are classes is unknown.
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
    """The answered class ids (``ids``, ascending), ``names[label] -> str`` for each, and the reverse lookup for the
    ``classes`` filter."""

    def __init__(self, table: Mapping[int, str], source: str) -> None:
        self.table = dict(sorted(table.items()))
        self.source = source
        self.ids = tuple(self.table)
        self._ids = {name.lower(): label for label, name in self.table.items()}

    def __getitem__(self, label: int) -> str:
        return self.table[int(label)]

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


def resolve(names_file: str, checkpoint: Mapping[str, Any], num_classes: int | None) -> ClassNames | None:
    """The classes of a served model, by the precedence of the module docstring; None when nothing says."""
    if names_file:
        return from_file(names_file)
    stored = from_checkpoint(checkpoint)
    if stored is not None:
        return stored
    if num_classes == COCO_NUM_CLASSES:
        return coco()
    return None


def check(names: ClassNames | None, num_classes: int, checkpoint: str) -> ClassNames:
    """``names`` if every id is one of the class head's ``num_classes`` outputs; else the error that says how to fix.

    A checkpoint that stores no categories and has another class count than COCO's is refused rather than answering
    every output: at least output 0 is no class of the training data (the head has max category id + 1 outputs)."""
    if names is None:
        raise ClassNamesError(
            f"checkpoint {checkpoint} stores no categories and its class head has {num_classes} outputs, not COCO's "
            f"{COCO_NUM_CLASSES}, so which of ids 0-{num_classes - 1} are classes is unknown: set DINO_CLASS_NAMES "
            'to the training annotation file (its categories), or to a JSON object {"<id>": "<name>"} of the classes'
        )
    where = "the checkpoint" if names.source == "checkpoint" else names.source
    if not names.ids:
        raise ClassNamesError(f"{where} names no class")
    beyond = [label for label in names.ids if not 0 <= label < num_classes]
    if beyond:
        raise ClassNamesError(
            f"{where} names class ids the model cannot predict: {', '.join(map(str, beyond))} (its class head has "
            f"{num_classes} outputs, ids 0-{num_classes - 1})"
        )
    return names
