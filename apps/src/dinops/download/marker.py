"""``<dest>/.dinops-complete.json``: the dataset's completion marker, the gate between download and training.

`dinops download` writes it (atomically: a temporary file in the same directory, fsync, rename) only after every
file was downloaded, verified and extracted, and removes it when a run starts that will change the dataset.
`dinops data-ready` (the training Job's init container) waits for it. Standard library only: the training
image, which lacks the download extra, imports this module.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

MARKER = ".dinops-complete.json"


class MarkerError(ValueError):
    """The marker exists but does not say that the dataset is complete; the message says what is wrong."""


def path(root: str | Path) -> Path:
    return Path(root) / MARKER


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write(root: str | Path, fields: dict[str, Any]) -> Path:
    """Write ``{"complete": true, **fields, "finished_at": now}`` atomically and durably; returns the path."""
    target = path(root)
    body = {"complete": True, **fields, "finished_at": fields.get("finished_at") or utc_now()}
    tmp = target.with_name(f".{MARKER}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(body, indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return target


def remove(root: str | Path) -> bool:
    """Remove the marker (durably); True when there was one."""
    target = path(root)
    try:
        target.unlink()
    except FileNotFoundError:
        return False
    _fsync_dir(target.parent)
    return True


def read(root: str | Path) -> dict[str, Any] | None:
    """The marker's content; None when there is none. Raises :class:`MarkerError` when it exists but is not valid
    JSON, not an object, or does not say ``"complete": true``."""
    target = path(root)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MarkerError(f"{target} cannot be read: {exc}") from exc
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise MarkerError(f"{target} is not valid JSON ({exc}); remove it and run the download again") from exc
    if not isinstance(body, dict):
        raise MarkerError(f"{target} must hold a JSON object, not {type(body).__name__}")
    if body.get("complete") is not True:
        raise MarkerError(
            f"{target} does not say complete=true (complete={body.get('complete')!r}); run the download again"
        )
    return body


def describe(target: Path, body: dict[str, Any]) -> str:
    """One line for a person: what the marker says."""
    sets = body.get("sets")
    shown = ",".join(map(str, sets)) if isinstance(sets, list) else str(sets)
    subset = body.get("subset")
    return (
        f"the dataset is complete: {target} (sets {shown or '-'}, "
        f"{'subset ' + str(subset) + ' images per split' if subset else 'full'}, "
        f"{body.get('files', '?')} files, finished at {body.get('finished_at', '?')})"
    )


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
