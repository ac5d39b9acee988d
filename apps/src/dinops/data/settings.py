"""The data settings: where the COCO splits are, and the local decoded-image cache.

`dinops train` and `dinops eval` read them as part of the training table (dinops.train.settings includes these
tuples at their place); `dinops cache` and `dinops data-ready` read them from here, so that the data package never
imports the training one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dinops.settings import Setting, non_negative_float, non_negative_int

ENV_PREFIX = "DINO_"


def setting(dest: str, default, help: str, type=str, choices=None) -> Setting:
    """One setting of the apps' DINO_ table: flag --dest-with-dashes, variable DINO_DEST."""
    return Setting(dest=dest, default=default, help=help, type=type, env=ENV_PREFIX + dest.upper(), choices=choices)


DATA_PATH_SETTINGS: tuple[Setting, ...] = (
    setting("data_root", "data/coco", "COCO 2017 layout root: train2017/, val2017/, annotations/instances_*.json"),
    setting("train_images", "", "training image folder (default DATA_ROOT/train2017)"),
    setting(
        "train_annotations", "", "training annotation file (default DATA_ROOT/annotations/instances_train2017.json)"
    ),
    setting("val_images", "", "validation image folder (default DATA_ROOT/val2017)"),
    setting("val_annotations", "", "validation annotation file (default DATA_ROOT/annotations/instances_val2017.json)"),
)

CACHE_SETTINGS: tuple[Setting, ...] = (
    setting("cache_dir", "", "local folder for decoded images (datasets on slow network storage); empty = off"),
    setting(
        "cache_max_gb",
        0.0,
        "largest size of the cache in GB (10^9 bytes), training split first, smallest images first; 0 = no bound "
        "(1 GB of the disk stays free)",
        non_negative_float,
    ),
    setting(
        "cache_workers", 0, "parallel decoders of `dinops cache` (--workers); 0 = one per CPU core", non_negative_int
    ),
)


def fill_data_paths(args: argparse.Namespace) -> None:
    """The split folders and annotation files that are not set explicitly, from DATA_ROOT's COCO 2017 layout."""
    root = Path(args.data_root)
    args.train_images = args.train_images or str(root / "train2017")
    args.train_annotations = args.train_annotations or str(root / "annotations" / "instances_train2017.json")
    args.val_images = args.val_images or str(root / "val2017")
    args.val_annotations = args.val_annotations or str(root / "annotations" / "instances_val2017.json")
