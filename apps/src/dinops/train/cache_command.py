"""`dinops cache`, the command: reads the training settings' environment and fills the cache of both splits.

The cache itself (layout, verification, size bound, the fill) is :mod:`dinops.data.cache`, whose docstring is this
command's manual. The command lives on the training floor because it accepts, and checks, every ``DINO_*`` variable
of the training table: the cache Job and the training Job share one ConfigMap.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from dinops.data import cache
from dinops.data.cache import CacheBudget, cache_settings, check_room, fill
from dinops.data.coco import AnnotationError, CocoDetection
from dinops.data.ready import EXTRA_SETTINGS
from dinops.data.settings import fill_data_paths
from dinops.settings import SettingsError, add_arguments, check_unknown_env, resolve, without_service_links
from dinops.train.settings import ENV_PREFIX, MODEL_ENV, SETTINGS


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    table = cache_settings()
    parser = argparse.ArgumentParser(
        prog="dinops cache", description=cache.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, table)
    args = parser.parse_args(argv)
    try:
        environ = without_service_links(os.environ)
        check_unknown_env(SETTINGS + EXTRA_SETTINGS + MODEL_ENV, (ENV_PREFIX,), environ)
        resolve(args, table, environ)
        fill_data_paths(args)
        if not args.cache_dir:
            raise SettingsError("--cache-dir / DINO_CACHE_DIR is empty: no folder to fill")
        workers = args.cache_workers or os.cpu_count() or 1
        budget = CacheBudget(args.cache_max_gb)
        splits = []
        for images, annotations, flag in (
            (args.train_images, args.train_annotations, "--train-annotations / DINO_TRAIN_ANNOTATIONS"),
            (args.val_images, args.val_annotations, "--val-annotations / DINO_VAL_ANNOTATIONS"),
        ):
            if not Path(annotations).is_file():
                raise SettingsError(
                    f"{annotations}: no annotation file (set --data-root / DINO_DATA_ROOT {args.data_root!r} or {flag})"
                )
            splits.append(CocoDetection(images, annotations, cache_dir=args.cache_dir, cache_budget=budget))
        check_room(ds.cache for ds in splits)
    except (SettingsError, AnnotationError) as exc:
        print(f"dinops cache: {exc}", file=sys.stderr)
        return 2
    status = 0
    for dataset in splits:
        report = fill(dataset, workers)
        if report.already_complete:
            print(f"dinops cache: {dataset.cache.describe()}: nothing to do", file=sys.stderr)
            continue
        print(
            f"dinops cache: {dataset.image_dir}: {report.decoded} decoded, {report.kept} already cached, "
            f"{len(report.failed)} failed; {report.bytes / cache.GB:.2f} GB in {dataset.cache.root} "
            f"({report.planned} of {len(dataset)} images fit the bound) in {report.seconds:.1f} s",
            file=sys.stderr,
        )
        for problem in report.failed[:10]:
            print(f"dinops cache: cannot cache {problem}", file=sys.stderr)
        status = 1 if report.failed else status
    return status
