"""`dinops cache`: decoded images of the train and val splits on local disk, filled once per node, verified.

Training reads images from the dataset folder, often slow shared storage (NFS); with ``--cache-dir`` it keeps
each decoded image as one file on local disk and reads that instead. `dinops cache` fills the cache ahead of
training, in parallel and with progress lines on stderr; training with the same settings then decodes nothing.
Without it, training fills the cache as it reads (data loader workers each write whole files atomically).

Layout: ``CACHE_DIR/<namespace>/`` per split (the namespace is a hash of the image folder and annotation file
paths), holding

    <image id>.img   a 24-byte header (magic, height, width, channels, CRC-32 of the pixels), then the RGB pixels
    source.json      the source's identity: annotation file sha256 and size, a fingerprint of every image's
                     name, size, mtime, inode number and ctime, the format version; written before any entry
    complete.json    written last (atomically) by `dinops cache`: identity, count, bytes, the planned image set

What is verified: every read checks an entry's header, length and CRC-32 (a truncated or corrupt file, e.g. after a
crash between rename and writeback, is deleted and decoded again from the source); whenever the cache is opened
the source's identity is computed again, and when it differs from ``source.json`` (annotation file or any image
replaced) the split's cache is emptied, so a stale image is never read.

Size bound: ``--cache-max-gb`` (GB = 10^9 bytes) bounds all splits together, the training split first. Entry sizes
are known from the annotations' width and height, so the planned set is fixed before decoding: the smallest
images first (the most images for the space), ties by id; an image whose decoded size differs from its annotation
is never cached. Entries outside the plan (after the bound was lowered) are deleted when the cache is opened.
`dinops cache` refuses to start when the free space cannot hold what it still has to write; training warns and
stops writing entries when a write would leave less than ``MIN_FREE_BYTES`` free.

    dinops cache --data-root /mnt/coco --cache-dir /local/cache --workers 4
    dinops cache --data-root /mnt/coco --cache-dir /local/cache --cache-max-gb 200

Exit status: 0 filled (or already filled), 1 some images could not be read or decoded (named), 2 a setting or
the environment is wrong (missing data, unwritable or too small cache folder).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dinops.data.settings import CACHE_SETTINGS, DATA_PATH_SETTINGS
from dinops.digests import file_sha256
from dinops.settings import SettingsError

if TYPE_CHECKING:
    from dinops.data.coco import CocoDetection

log = logging.getLogger(__name__)

FORMAT = 1
MAGIC = b"DINOIMG1"
HEADER = struct.Struct("<8sIIII")  # magic, height, width, channels, CRC-32 of the pixel bytes
SUFFIX = ".img"
SOURCE, COMPLETE = "source.json", "complete.json"
MIN_FREE_BYTES = 1 << 30  # training leaves at least this much free space on the cache's disk
STALE_TMP_S = 600  # a temporary file this old belongs to a writer that died
STAT_THREADS = 16  # stats of the source images in flight (hides the round trip of network storage)
PROGRESS_EVERY_S = 2.0
GB = 10**9


class CorruptEntry(Exception):
    pass


def entry_bytes(height: int, width: int) -> int:
    return HEADER.size + height * width * 3


def write_entry(path: Path, array: np.ndarray) -> None:
    """Write ``array`` [H, W, 3] uint8 as a whole file: a temporary file renamed over the entry (atomic)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    h, w, c = array.shape
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(HEADER.pack(MAGIC, h, w, c, zlib.crc32(array)))
            fh.write(array.data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_entry(path: Path) -> np.ndarray:
    """The verified pixels [H, W, 3] of an entry (writable); :class:`CorruptEntry` when anything is off."""
    with open(path, "rb") as fh:
        head = fh.read(HEADER.size)
        if len(head) != HEADER.size:
            raise CorruptEntry(f"{path}: truncated header")
        magic, h, w, c, crc = HEADER.unpack(head)
        if magic != MAGIC or c != 3 or not 0 < h * w <= 1 << 30:
            raise CorruptEntry(f"{path}: not a cache entry of format {FORMAT}")
        array = np.empty((h, w, c), np.uint8)
        if fh.readinto(memoryview(array).cast("B")) != array.nbytes or fh.read(1):
            raise CorruptEntry(f"{path}: truncated or too long")
    if zlib.crc32(array) != crc:
        raise CorruptEntry(f"{path}: checksum mismatch")
    return array


def _write_json(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(document, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def namespace(image_dir: Path, ann_file: Path) -> str:
    """The same split maps to the same folder in every run (str hash() is salted per process)."""
    return hashlib.sha256(f"{image_dir.resolve()}\n{ann_file.resolve()}".encode()).hexdigest()[:16]


def source_identity(image_dir: Path, ann_file: Path, images: list[dict]) -> dict[str, Any]:
    """What the cache was decoded from: annotation file sha256, and every image's name, size, mtime, inode number
    and ctime. Tools that rewrite a file keeping its size and mtime (`exiftool -P` in place; `rsync -a`, `cp -p`
    by a new file) cannot keep the ctime, and a new file has a new inode number."""
    with ThreadPoolExecutor(STAT_THREADS) as pool:
        stats = list(pool.map(lambda img: os.stat(image_dir / img["file_name"]), images))
    lines = (
        f"{img['id']}\t{img['file_name']}\t{s.st_size}\t{s.st_mtime_ns}\t{s.st_ino}\t{s.st_ctime_ns}"
        for img, s in zip(images, stats, strict=True)
    )
    return {
        "format": FORMAT,
        "annotations": {
            "path": str(ann_file.resolve()),
            "sha256": file_sha256(ann_file),
            "size": ann_file.stat().st_size,
        },
        "images": {
            "dir": str(image_dir.resolve()),
            "count": len(images),
            "bytes": sum(s.st_size for s in stats),
            "fingerprint": hashlib.sha256("\n".join(lines).encode()).hexdigest(),
        },
    }


class CacheBudget:
    """The size bound shared by the splits of one run; the split planned first (training) is served first."""

    def __init__(self, max_gb: float = 0.0) -> None:
        self.max_bytes = int(max_gb * GB) if max_gb else None
        self.left = self.max_bytes
        self.plans: dict[str, frozenset[int]] = {}

    def plan(self, key: str, sizes: dict[int, int]) -> frozenset[int]:
        """The images of this split that are cached: the smallest first (the most images), ties by id."""
        if key not in self.plans:
            chosen: list[int] = []
            if self.left is None:
                chosen = list(sizes)
            else:
                for image_id, size in sorted(sizes.items(), key=lambda item: (item[1], item[0])):
                    if size > self.left:
                        break
                    chosen.append(image_id)
                    self.left -= size
            self.plans[key] = frozenset(chosen)
        return self.plans[key]


class ImageCache:
    """One split's decoded images on local disk: verified reads, atomic writes, only the planned images."""

    def __init__(
        self,
        root: str | os.PathLike,
        key: str,
        identity: dict[str, Any],
        sizes: dict[int, int],
        budget: CacheBudget | None = None,
    ) -> None:
        self.root = Path(root) / key
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if _read_json(self.root / SOURCE) != identity:  # another source, an older format, or a new folder
                self._empty()
                _write_json(self.root / SOURCE, identity)
        except OSError as exc:
            raise SettingsError(f"--cache-dir / DINO_CACHE_DIR {root}: cannot write there: {exc}") from None
        self.identity = identity
        self.sizes = sizes
        budget = budget or CacheBudget()
        self.max_bytes = budget.max_bytes
        self.plan = budget.plan(key, sizes)
        self.planned_bytes = sum(sizes[i] for i in self.plan)
        self.plan_digest = hashlib.sha256(",".join(map(str, sorted(self.plan))).encode()).hexdigest()
        present = self._tidy()
        self.present_bytes = sum(present.values())
        marker = _read_json(self.root / COMPLETE)
        self.complete = bool(marker) and marker.get("identity") == identity and marker.get("plan") == self.plan_digest
        self.missing_bytes = self.planned_bytes - self.present_bytes
        self._warned: set[str] = set()

    def _empty(self) -> None:
        for path in self.root.iterdir():
            if path.is_file():
                path.unlink(missing_ok=True)

    def _tidy(self) -> dict[int, int]:
        """Delete entries outside the plan and leftovers of dead writers; the sizes of the entries kept."""
        present: dict[int, int] = {}
        now = time.time()
        for item in os.scandir(self.root):
            name = item.name
            try:
                if name.endswith(".tmp"):
                    if now - item.stat().st_mtime > STALE_TMP_S:
                        os.unlink(item.path)
                elif name.endswith(SUFFIX):
                    image_id = int(name[: -len(SUFFIX)]) if name[: -len(SUFFIX)].lstrip("-").isdigit() else None
                    if image_id in self.plan:
                        present[image_id] = item.stat().st_size
                    else:
                        os.unlink(item.path)
            except FileNotFoundError:  # another process of the same run tidies too
                continue
        return present

    def path(self, image_id: int) -> Path:
        return self.root / f"{image_id}{SUFFIX}"

    def read(self, image_id: int) -> np.ndarray | None:
        """The verified entry, or None when there is none; a corrupt entry is deleted."""
        if image_id not in self.plan:
            return None
        try:
            return read_entry(self.path(image_id))
        except FileNotFoundError:
            return None
        except (CorruptEntry, OSError) as exc:
            log.warning("image cache: %s; decoding the image again", exc)
            self.path(image_id).unlink(missing_ok=True)
            return None

    def store(self, image_id: int, array: np.ndarray) -> bool:
        """Write the entry if it is planned and fits; a full or failing disk never stops training."""
        if image_id not in self.plan:
            return False
        if array.ndim != 3 or entry_bytes(*array.shape[:2]) != self.sizes[image_id]:
            self._warn_once("size", f"image {image_id} decodes to {array.shape}, not its annotated size: not cached")
            return False
        try:
            if shutil.disk_usage(self.root).free - self.sizes[image_id] < MIN_FREE_BYTES:
                self._warn_once("space", f"{self.root}: less than {MIN_FREE_BYTES / GB:.1f} GB free; not caching more")
                return False
            write_entry(self.path(image_id), array)
        except OSError as exc:
            self._warn_once("write", f"{self.root}: cannot write an entry ({exc}); reading from the source")
            return False
        return True

    def load(self, image_id: int, decode: Callable[[], np.ndarray]) -> np.ndarray:
        array = self.read(image_id)
        if array is None:
            array = decode()
            self.store(image_id, array)
        return array

    def mark_complete(self, count: int, total_bytes: int) -> None:
        _write_json(
            self.root / COMPLETE,
            {
                "format": FORMAT,
                "identity": self.identity,
                "plan": self.plan_digest,
                "count": count,
                "bytes": total_bytes,
                "images_in_split": len(self.sizes),
                "max_bytes": self.max_bytes,
                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )

    def describe(self) -> str:
        state = "filled" if self.complete else f"{self.present_bytes / GB:.2f} GB present"
        return (
            f"{self.root}: {len(self.plan)} of {len(self.sizes)} images planned "
            f"({self.planned_bytes / GB:.2f} GB), {state}"
        )

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("image cache: %s", message)


def open_cache(
    cache_dir: str | os.PathLike, image_dir: Path, ann_file: Path, images: list[dict], budget: CacheBudget | None
) -> ImageCache:
    """The cache of one split, checked against its source; warns when the disk cannot hold what is missing."""
    sizes = {img["id"]: entry_bytes(img["height"], img["width"]) for img in images}
    identity = source_identity(image_dir, ann_file, images)
    cache = ImageCache(cache_dir, namespace(image_dir, ann_file), identity, sizes, budget)
    free = shutil.disk_usage(cache.root).free
    if cache.missing_bytes > free - MIN_FREE_BYTES:
        log.warning(
            "image cache %s: %.2f GB still to cache but %.2f GB free; entries stop at %.1f GB free "
            "(bound the cache with --cache-max-gb / DINO_CACHE_MAX_GB)",
            cache.root,
            cache.missing_bytes / GB,
            free / GB,
            MIN_FREE_BYTES / GB,
        )
    log.info("image cache %s", cache.describe())
    return cache


# --- filling ahead of training -------------------------------------------------------------------------------

_FILLING: CocoDetection | None = None  # the dataset a forked fill worker reads (inherited, never pickled)


def _fill_one(index: int) -> tuple[str, int, str]:
    """``(outcome, bytes, problem)`` for one image: ``kept`` a valid entry, ``decoded``, or ``failed``."""
    dataset = _FILLING
    assert dataset is not None and dataset.cache is not None
    img = dataset.images[index]
    image_id = img["id"]
    if dataset.cache.read(image_id) is not None:
        return "kept", dataset.cache.sizes[image_id], ""
    try:
        array = dataset.decode_source(img)
    except Exception as exc:  # an unreadable or undecodable image is reported by name, the others go on
        return "failed", 0, f"{img['file_name']}: {exc}"
    if not dataset.cache.store(image_id, array):
        return "failed", 0, f"{img['file_name']}: could not be cached (see the warning above)"
    return "decoded", dataset.cache.sizes[image_id], ""


@dataclasses.dataclass
class FillReport:
    split: str
    planned: int
    kept: int = 0
    decoded: int = 0
    failed: list[str] = dataclasses.field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    already_complete: bool = False


def _executor(kind: str, workers: int) -> Executor:
    if kind == "process":  # fork: the workers inherit the dataset instead of unpickling it per task
        return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    return ThreadPoolExecutor(workers)


def fill(dataset: CocoDetection, workers: int, pool: str = "thread", out=None) -> FillReport:
    """Cache every planned image of ``dataset`` with ``workers`` in parallel; the marker is written last.

    ``pool`` is ``thread`` (what `dinops cache` uses: Pillow and zlib release the GIL while decoding and
    checksumming) or ``process``; apps/bench/bench_data.py measures both.
    """
    global _FILLING
    cache = dataset.cache
    if cache is None:
        raise ValueError("the dataset has no cache_dir")
    report = FillReport(split=str(dataset.image_dir), planned=len(cache.plan))
    if cache.complete:
        report.already_complete = True
        return report
    todo = [i for i, img in enumerate(dataset.images) if img["id"] in cache.plan]
    began = last = time.monotonic()
    _FILLING = dataset
    try:
        with _executor(pool, workers) as executor:
            for done, (outcome, size, problem) in enumerate(executor.map(_fill_one, todo, chunksize=4), 1):
                if outcome == "failed":
                    report.failed.append(problem)
                else:
                    setattr(report, outcome, getattr(report, outcome) + 1)
                    report.bytes += size
                now = time.monotonic()
                if now - last >= PROGRESS_EVERY_S or done == len(todo):
                    last = now
                    rate = done / max(now - began, 1e-9)
                    eta = (len(todo) - done) / rate if rate else 0.0
                    print(
                        f"dinops cache: {dataset.image_dir.name} {done}/{len(todo)} images "
                        f"({report.kept} already cached), {rate:.1f} images/s, ETA {eta:.0f} s",
                        file=out or sys.stderr,
                        flush=True,
                    )
    finally:
        _FILLING = None
    report.seconds = time.monotonic() - began
    if not report.failed:
        cache.mark_complete(report.kept + report.decoded, report.bytes)
    return report


def cache_settings() -> tuple:
    """The training settings `dinops cache` reads (same flags, variables and defaults); ``--workers`` is
    DINO_CACHE_WORKERS."""
    table = DATA_PATH_SETTINGS + tuple(s for s in CACHE_SETTINGS if s.dest != "cache_workers")
    return table + tuple(dataclasses.replace(s, flag="--workers") for s in CACHE_SETTINGS if s.dest == "cache_workers")


def check_room(caches: Iterable[ImageCache]) -> None:
    """Refuse to start a fill that the free space cannot hold (the training's reserve left free)."""
    caches = list(caches)
    missing = sum(c.missing_bytes for c in caches if not c.complete)
    free = shutil.disk_usage(caches[0].root).free if caches else 0
    if caches and missing > free - MIN_FREE_BYTES:
        raise SettingsError(
            f"--cache-dir / DINO_CACHE_DIR {caches[0].root.parent}: {missing / GB:.2f} GB still to write but "
            f"{free / GB:.2f} GB free ({MIN_FREE_BYTES / GB:.1f} GB stay free); bound the cache with "
            "--cache-max-gb / DINO_CACHE_MAX_GB"
        )
