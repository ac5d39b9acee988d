"""`dinops download`: COCO 2017 (or any list of URLs), resumable, verified, extracted atomically.

Files are fetched with several HTTP Range connections each (several files at once), retried with
exponential backoff, resumed after an interruption, checked against their md5/sha256, and only then
extracted (into a temporary folder renamed into place). A manifest in the destination makes a re-run with
the same inputs a no-op. Only after every file was downloaded, verified and extracted does the run write the
completion marker <dest>/.dinops-complete.json (atomically), which training waits for (`dinops data-ready`); a
run that will change the dataset removes it first, and a failed run leaves none. --subset N fetches the
annotations and N images per split (by coco_url) and writes a new annotation file next to the original.
--s3-source / --s3-dest use S3-compatible storage (MinIO...).

Exit status: 0 done, 1 a file failed (the others are kept), 2 bad arguments or settings.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dinops import logs
from dinops.download import extract, marker, subset
from dinops.download.http import DownloadError, Fetcher, Policy, Progress, file_digests
from dinops.download.manifest import Manifest
from dinops.download.s3 import S3Error, Store, parse_url
from dinops.download.settings import ENV_PREFIXES, SETTINGS
from dinops.download.sources import (
    COCO_BASE,
    Item,
    SourceError,
    coco_items,
    read_checksum_file,
    read_urls,
    with_checksums,
)
from dinops.settings import SettingsError, add_arguments, resolve_from_env

log = logging.getLogger("dinops.download")
ARCHIVES = ".downloads"


class Bar(Progress):
    """A tqdm bar per file, created when the size is known."""

    def __init__(self, name: str, enabled: bool | None, unit: str = "B") -> None:
        self.name, self.enabled, self.unit, self.bar = name, enabled, unit, None

    def start(self, total: int | None) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=self.name,
                disable=self.enabled is False if self.enabled is not None else None,
                leave=True,
            )
        else:
            self.bar.reset(total)

    def update(self, count: int) -> None:
        if self.bar is not None:
            self.bar.update(count)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Downloader:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dest = Path(args.dest)
        self.archives = self.dest / ARCHIVES
        self.progress = {"auto": None, "on": True, "off": False}[args.progress]
        self.fetcher = Fetcher(
            Policy(args.connections, int(args.piece_mb * 2**20), args.retries, args.backoff_s, args.timeout_s)
        )
        self.store = Store(args.s3_endpoint, args.connections) if (args.s3_source or args.s3_dest) else None
        self.manifest: Manifest

    def _done(self, item: Item, entry: dict | None) -> bool:
        if not entry or entry.get("state") != "done":
            return False
        if (entry.get("url"), entry.get("digests")) != (item.url, item.digests):
            return False
        if entry.get("extracted"):
            return all((self.dest / top).exists() for top in entry["extracted"])
        return (self.archives / item.name).is_file()

    def item(self, item: Item) -> str:
        entry = self.manifest.entry("files", item.name)
        if self._done(item, entry):
            log.info("%s: already in place", item.name)
            return "skipped"
        archive = self.archives / item.name
        if not (archive.is_file() and entry and entry.get("url") == item.url and entry.get("digests") == item.digests):
            bar = Bar(item.name, self.progress)
            try:
                if self.args.s3_source:
                    self.store.download(self.args.s3_source, item.name, archive, item.digests, bar)
                else:
                    self.fetcher.fetch(item.url, archive, item.digests, bar)
            finally:
                bar.close()
            if not item.digests:
                log.warning("%s: no checksum known; the file was not verified", item.name)
            self.manifest.record("files", item.name, {"url": item.url, "digests": item.digests, "state": "downloaded"})
        if self.args.s3_dest:
            uploaded = self.store.upload(self.args.s3_dest, archive, item.digests)
            log.info("%s: %s %s", item.name, "uploaded to" if uploaded else "already in", self.args.s3_dest)
        record = {"url": item.url, "digests": item.digests}
        if self.args.extract and item.is_zip:
            previous = entry.get("tops", []) if entry and entry.get("state") == "extracting" else []
            tops = extract.top_level_entries(archive)
            self.manifest.record("files", item.name, {**record, "state": "extracting", "tops": tops})
            extract.extract_zip(archive, self.dest, replace=frozenset(previous))
            self.manifest.record("files", item.name, {**record, "state": "done", "extracted": tops})
            if not self.args.keep_archives:
                archive.unlink()
            log.info("%s: extracted %s", item.name, ", ".join(tops))
        else:
            self.manifest.record("files", item.name, {**record, "state": "done"})
        return "done"

    def _subset_key(self, split: str) -> str:
        return f"{split}/{self.args.subset}/{self.args.subset_seed}"

    def _subset_done(self, split: str) -> bool:
        out = subset.subset_path(self.dest / "annotations", split, self.args.subset, self.args.subset_seed)
        entry = self.manifest.entry("subsets", self._subset_key(split))
        return bool(entry) and out.is_file() and all((self.dest / split / name).is_file() for name in entry["files"])

    def pending(self, items: list[Item], splits: list[str]) -> list[str]:
        """What this run would change: files not yet in place, subsets not yet written (empty: a no-op re-run)."""
        todo = [item.name for item in items if not self._done(item, self.manifest.entry("files", item.name))]
        return todo + [f"subset of {split}" for split in splits if not self._subset_done(split)]

    def subset(self, split: str) -> str:
        count, seed = self.args.subset, self.args.subset_seed
        annotations = self.dest / "annotations"
        source = annotations / f"instances_{split}.json"
        out = subset.subset_path(annotations, split, count, seed)
        key = self._subset_key(split)
        images = self.dest / split
        if self._subset_done(split):
            log.info("%s: subset of %d images already in place", split, count)
            return "skipped"
        if not source.is_file():
            raise subset.SubsetError(f"{source} is missing; the subset needs the annotations")
        document = subset.choose(json.loads(source.read_text()), count, seed)
        images.mkdir(parents=True, exist_ok=True)
        todo = [image for image in document["images"] if not (images / image["file_name"]).is_file()]
        bar = Bar(f"{split} images", self.progress, unit="img")
        bar.start(len(todo))

        def fetch(image: dict) -> None:
            url = image.get("coco_url") or f"{COCO_BASE}/{split}/{image['file_name']}"
            self.fetcher.fetch_small(url, images / image["file_name"])
            bar.update(1)

        workers = self.args.connections * self.args.parallel_files
        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="image") as pool:
                list(pool.map(fetch, todo))
        finally:
            bar.close()
        subset.write_json(out, document)
        files = [image["file_name"] for image in document["images"]]
        self.manifest.record("subsets", key, {"annotation_file": out.name, "files": files})
        log.info("%s: wrote %s (%d images, %d boxes)", split, out, len(files), len(document["annotations"]))
        return "done"

    def run(self, items: list[Item], splits: list[str]) -> int:
        self.dest.mkdir(parents=True, exist_ok=True)
        self.archives.mkdir(exist_ok=True)
        extract.clean_stale(self.dest)
        self.manifest = Manifest(self.dest)
        pending = self.pending(items, splits)
        if pending and marker.remove(self.dest):
            log.info("removed the completion marker %s: this run changes the dataset", marker.path(self.dest))
        failures: list[str] = []
        with ThreadPoolExecutor(self.args.parallel_files, thread_name_prefix="file") as pool:
            futures = {item.name: pool.submit(self.item, item) for item in items}
        for name, future in futures.items():
            error = future.exception()
            if error is not None:
                if not isinstance(error, (DownloadError, S3Error, extract.ExtractError, OSError)):
                    raise error
                failures.append(f"{name}: {error}")
        if not failures:
            for split in splits:
                try:
                    self.subset(split)
                except (subset.SubsetError, DownloadError, OSError, ValueError) as exc:
                    failures.append(f"subset of {split}: {exc}")
        for failure in failures:
            log.error("%s", failure)
        if failures:
            if marker.remove(self.dest):
                log.info("removed the completion marker %s: the run failed", marker.path(self.dest))
            return 1
        self.write_marker(items, splits)
        return 0

    def write_marker(self, items: list[Item], splits: list[str]) -> None:
        """The dataset is complete: every file is downloaded, verified and extracted (and the subsets written)."""
        subset_files = sum(len(self.manifest.entry("subsets", self._subset_key(s))["files"]) for s in splits)
        fields = {
            "sets": [] if self.args.urls_file else self.args.sets.split(","),
            "source": self.args.urls_file or self.args.s3_source or "coco",
            "subset": self.args.subset,
            "subset_seed": self.args.subset_seed,
            "files": len(items) + subset_files,
            "items": [item.name for item in items],
            "extracted": bool(self.args.extract),
        }
        target = marker.write(self.dest, fields)
        log.info("the dataset is complete: wrote %s (%d files)", target, fields["files"])


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dinops download", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, SETTINGS)
    parser.add_argument("--print-checksums", metavar="FILE", help="print the md5 and sha256 of FILE and exit")
    return parser


def plan(args: argparse.Namespace) -> tuple[list[Item], list[str]]:
    """The files to fetch and the splits to subset, from the settings."""
    if args.subset and args.urls_file:
        raise SourceError("--subset works with COCO (it needs instances_<split>.json), not with --urls-file")
    items = read_urls(args.urls_file) if args.urls_file else coco_items(args.sets)
    if args.checksum_file:
        items = with_checksums(items, read_checksum_file(args.checksum_file))
    unverified = [item.name for item in items if not item.digests]
    if unverified and args.require_checksums:
        raise SourceError(f"no checksum for {', '.join(unverified)} (--require-checksums)")
    splits: list[str] = []
    if args.subset:
        splits = [item.image_split for item in items if item.image_split and item.image_split != "test2017"]
        items = [item for item in items if not item.image_split]
        if not any(item.name == coco_items("annotations")[0].name for item in items):
            items.append(coco_items("annotations")[0])
    for url in (args.s3_source, args.s3_dest):
        if url:
            parse_url(url)
    return items, splits


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.print_checksums:
        digests = file_digests(Path(args.print_checksums), ["md5", "sha256"])
        print(f"md5:{digests['md5']} sha256:{digests['sha256']}  {Path(args.print_checksums).name}")
        return 0
    try:
        resolve_from_env(args, SETTINGS, ENV_PREFIXES, "dinops download")
        items, splits = plan(args)
    except (SettingsError, SourceError, S3Error) as exc:
        print(f"dinops download: {exc}", file=sys.stderr)
        return 2
    logs.configure(args.log_level, args.log_format)
    return Downloader(args).run(items, splits)
