"""``GET /v1/training``: the live state of the training run whose checkpoint this service serves.

`dinops train` writes ``OUTPUT_DIR/progress.json`` beside its checkpoints (:mod:`dinops.train.progress`); the file
read here is ``progress.json`` in the folder of ``DINO_CHECKPOINT``. The answer is that file's fields plus
``progress_file`` and ``served`` (the checkpoint the model in use came from and when it was loaded; null while no
model is loaded). It is always 200 with a ``state``: the trainer's, or ``not_started`` (no file yet),
``unreadable`` (a file that cannot be read or is not a progress document; ``reason`` says why) or ``unavailable``
(a checkpoint in S3: the progress file lies on the trainer's disk). Needs the API token when one is set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flask import Blueprint, current_app, jsonify

from dinops import s3
from dinops.serve.auth import require_token
from dinops.train.progress import FILENAME, STATES

bp = Blueprint("training", __name__)

MAX_BYTES = 1 << 20  # a progress file is a few tens of KiB (its loss curve is bounded)


def read_progress(path: Path) -> dict[str, Any]:
    """The progress document at ``path``, or a ``not_started`` / ``unreadable`` state saying why there is none."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return {"state": "not_started"}
    except OSError as exc:
        return {"state": "unreadable", "reason": f"{path} cannot be read: {exc.strerror or exc}"}
    if len(raw) > MAX_BYTES:
        return {"state": "unreadable", "reason": f"{path} is larger than {MAX_BYTES} bytes: not a progress file"}
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        return {"state": "unreadable", "reason": f"{path} is not JSON ({exc})"}
    if not isinstance(document, dict) or document.get("state") not in STATES:
        return {"state": "unreadable", "reason": f"{path} is not a training progress document (no known state)"}
    return document


@bp.get("/v1/training")
def training():
    require_token()
    runtime = current_app.extensions["dino"]
    loaded = runtime.loaded
    served = None
    if loaded is not None:
        served = {k: loaded[k] for k in ("checkpoint", "loaded_at", "epoch", "global_step", "mtime") if k in loaded}
    checkpoint = runtime.checkpoint
    if not checkpoint:
        body: dict[str, Any] = {"state": "unavailable", "reason": "this service was given a model, not a checkpoint"}
    elif s3.is_s3_url(checkpoint):
        body = {
            "state": "unavailable",
            "reason": f"the checkpoint comes from S3 ({checkpoint}); the training run's progress is on its own disk",
        }
    else:
        path = Path(checkpoint).parent / FILENAME
        body = read_progress(path) | {"progress_file": str(path)}
    return jsonify(body | {"served": served})
