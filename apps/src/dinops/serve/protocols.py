"""The inference protocols beside /v1/detect: KServe V1 and the Open Inference Protocol V2, for one model.

Their routes carry the model's name (DINO_MODEL_NAME) literally, so a request for another model or version matches
no route: the 404 handler here says which model (and version) this server has, as KServe answers an unknown model
with 404 (kserve/kserve@v0.20.0:python/kserve/kserve/errors.py ``ModelNotFound``).
"""

from __future__ import annotations

import re

from flask import Flask, current_app, request
from werkzeug.exceptions import NotFound

from dinops.serve import kserve_v1, oip_v2
from dinops.serve.errors import json_error

_MODEL_PATH = re.compile(r"^/v(?:1/models/(?P<v1>[^/:]+)|2/models/(?P<v2>[^/]+)(?:/versions/(?P<version>[^/]+))?)")


def register(app: Flask) -> None:
    app.register_blueprint(kserve_v1.blueprint(app.config["MODEL_NAME"]))
    app.register_blueprint(oip_v2.blueprint(app.config["MODEL_NAME"]))
    app.register_error_handler(NotFound, _not_found)


def _not_found(exc: NotFound):
    served = current_app.config["MODEL_NAME"]
    match = _MODEL_PATH.match(request.path)
    name = match and (match["v1"] or match["v2"])
    if name and name != served:
        return json_error(
            404,
            "model_not_found",
            f"Model {name!r} is not served here: this server serves {served!r} (DINO_MODEL_NAME).",
        )
    if name and match["version"] not in (None, oip_v2.VERSION):
        return json_error(
            404,
            "model_version_not_found",
            f"Model {served!r} has no version {match['version']!r}: it has one version, {oip_v2.VERSION!r}.",
        )
    return json_error(404, "not_found", exc.description or "Not found.")
