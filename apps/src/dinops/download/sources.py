"""What to download: COCO 2017's archives with their checksums, or a user's list of URLs.

COCO does not publish checksums on cocodataset.org. The MD5 values below are the ones used by many public
download scripts (PaddleDetection, TensorFlow models, torchvision-style helpers) and the SHA-256 values are
those of TensorFlow Datasets' COCO builder; both are checked when present. A user who distrusts them can
pass their own with ``--checksum-file`` (md5sum/sha256sum format), which takes precedence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import unquote, urlparse

COCO_BASE = "http://images.cocodataset.org"


class SourceError(ValueError):
    """A URL list or checksum file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Item:
    name: str  # file name on disk (and S3 key suffix)
    url: str
    digests: dict[str, str] = field(default_factory=dict)  # algorithm -> lowercase hex
    image_split: str | None = None  # COCO image archive of this split (skipped in subset mode)

    @property
    def is_zip(self) -> bool:
        return self.name.lower().endswith(".zip")


COCO: dict[str, Item] = {
    "train2017": Item(
        "train2017.zip",
        f"{COCO_BASE}/zips/train2017.zip",
        {
            "md5": "cced6f7f71b7629ddf16f17bbcfab6b2",
            "sha256": "69a8bb58ea5f8f99d24875f21416de2e9ded3178e903f1f7603e283b9e06d929",
        },
        "train2017",
    ),
    "val2017": Item(
        "val2017.zip",
        f"{COCO_BASE}/zips/val2017.zip",
        {
            "md5": "442b8da7639aecaf257c1dceb8ba8c80",
            "sha256": "4f7e2ccb2866ec5041993c9cf2a952bbed69647b115d0f74da7ce8f4bef82f05",
        },
        "val2017",
    ),
    "test2017": Item(
        "test2017.zip",
        f"{COCO_BASE}/zips/test2017.zip",
        {
            "md5": "77ad2c53ac5d0aea611d422c0938fb35",
            "sha256": "c7908c3c9f94ba2f3340ebbeec58c25db6be8774f18d68c2f15d0e369d95baba",
        },
        "test2017",
    ),
    "annotations": Item(
        "annotations_trainval2017.zip",
        f"{COCO_BASE}/annotations/annotations_trainval2017.zip",
        {
            "md5": "f4bbac642086de4f52a3fdda2de5fa2c",
            "sha256": "113a836d90195ee1f884e704da6304dfaaecff1f023f49b6ca93c4aaae470268",
        },
    ),
}

_HEX = re.compile(r"^[0-9a-fA-F]+$")
_LENGTHS = {32: "md5", 40: "sha1", 64: "sha256", 128: "sha512"}


def parse_digest(text: str, where: str) -> tuple[str, str]:
    """``sha256:HEX``, ``md5:HEX`` or bare hex (the algorithm from its length)."""
    algorithm, _, value = text.rpartition(":")
    value = value.strip().lower()
    if not _HEX.match(value):
        raise SourceError(f"{where}: {text!r} is not a hexadecimal checksum")
    algorithm = algorithm.lower() or _LENGTHS.get(len(value), "")
    if (
        algorithm not in _LENGTHS.values()
        or len(value) * 4 != {"md5": 128, "sha1": 160, "sha256": 256, "sha512": 512}[algorithm]
    ):
        raise SourceError(f"{where}: {text!r} is not an md5, sha1, sha256 or sha512 checksum")
    return algorithm, value


def name_of(url: str) -> str:
    path = urlparse(url).path
    name = Path(unquote(path)).name
    if not name or name in {".", ".."}:
        raise SourceError(f"{url}: the URL names no file")
    return name


def read_urls(path: str | Path) -> list[Item]:
    items: list[Item] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SourceError(f"cannot read the URL list {path}: {exc.strerror}") from exc
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        if urlparse(words[0]).scheme not in {"http", "https"}:
            raise SourceError(f"{where}: {words[0]!r} is not an http(s) URL")
        digests = dict(parse_digest(w, where) for w in words[1:])
        items.append(Item(name_of(words[0]), words[0], digests))
    names = [i.name for i in items]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SourceError(f"{path}: several URLs end in the same file name: {', '.join(duplicates)}")
    if not items:
        raise SourceError(f"{path}: no URLs")
    return items


def read_checksum_file(path: str | Path) -> dict[str, dict[str, str]]:
    """``HEX  name`` / ``HEX *name`` lines (md5sum, sha256sum) -> {name: {algorithm: hex}}."""
    table: dict[str, dict[str, str]] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SourceError(f"cannot read the checksum file {path}: {exc.strerror}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.strip().split(None, 1)
        if len(parts) != 2:
            raise SourceError(f"{path}:{number}: expected 'CHECKSUM  FILENAME', got {line!r}")
        algorithm, value = parse_digest(parts[0], f"{path}:{number}")
        name = Path(parts[1].lstrip("*").strip()).name
        table.setdefault(name, {})[algorithm] = value
    return table


def with_checksums(items: list[Item], table: dict[str, dict[str, str]]) -> list[Item]:
    """The user's checksums replace the built-in ones for the files they name."""
    return [replace(item, digests=table[item.name]) if item.name in table else item for item in items]


def coco_items(sets: str) -> list[Item]:
    return [COCO[name] for name in sets.split(",")]
