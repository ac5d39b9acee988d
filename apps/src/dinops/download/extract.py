"""Atomic extraction: unpack into a hidden temporary directory beside the target, then rename into place.

A folder such as ``train2017/`` therefore appears complete or not at all; a crash leaves only a
``.extract-*`` directory, removed by the next run.
"""

from __future__ import annotations

import logging
import os
import shutil
import zipfile
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

TEMP_PREFIX = ".extract-"


class ExtractError(RuntimeError):
    pass


def top_level_entries(archive: Path) -> list[str]:
    with zipfile.ZipFile(archive) as zf:
        return sorted({_safe_parts(info.filename, archive)[0] for info in zf.infolist()})


def _safe_parts(name: str, archive: Path) -> tuple[str, ...]:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ExtractError(f"{archive.name}: refusing the unsafe member name {name!r}")
    return path.parts


def clean_stale(dest: Path) -> None:
    for stale in dest.glob(TEMP_PREFIX + "*"):
        log.info("removing %s left by an interrupted extraction", stale)
        shutil.rmtree(stale, ignore_errors=True)


def extract_zip(archive: Path, dest: Path, replace: frozenset[str] = frozenset()) -> list[str]:
    """Extract ``archive`` into ``dest``; returns its top-level names. Existing targets are an error unless
    listed in ``replace`` (left by an extraction of ours that was interrupted between renames)."""
    try:
        tops = top_level_entries(archive)
    except zipfile.BadZipFile as exc:
        raise ExtractError(f"{archive.name} is not a valid zip archive ({exc})") from exc
    taken = [t for t in tops if (dest / t).exists() and t not in replace]
    if taken:
        raise ExtractError(
            f"{archive.name}: {', '.join(str(dest / t) for t in taken)} already exists and was not extracted by "
            "dinops download; move it away (nothing was overwritten)"
        )
    temp = dest / f"{TEMP_PREFIX}{archive.stem}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(temp)
        for top in tops:
            target = dest / top
            if target.exists():
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
            os.rename(temp / top, target)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ExtractError(f"extracting {archive.name} failed: {exc}") from exc
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return tops
