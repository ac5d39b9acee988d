"""``POST /v1/detect``, the original service's ``POST /inference``, and ``GET /openapi.json``."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request

from dinops.serve import detection
from dinops.serve.auth import require_token
from dinops.serve.errors import ApiError
from dinops.serve.openapi import spec

bp = Blueprint("api", __name__)

RAW_TYPES = ("image/", "application/octet-stream")


@bp.before_app_request
def _start_model() -> None:
    current_app.extensions["dino"].start()


@bp.before_request
def _authorise() -> None:
    if request.endpoint != "api.openapi":
        require_token()


def _image_bytes() -> bytes:
    content_type = request.mimetype or ""
    if content_type == "multipart/form-data":
        upload = request.files.get("image")
        if upload is None:
            raise ApiError(400, "missing_image", "Send the image in a multipart form field named 'image'.")
        return upload.read()
    if content_type.startswith(RAW_TYPES):
        return request.get_data(cache=False)
    shown = content_type or "none"
    raise ApiError(
        415,
        "unsupported_media_type",
        f"Content type {shown!r} is not accepted: send multipart/form-data with a field 'image', "
        "or the image itself as the body with an image/* content type.",
    )


def _param(name: str) -> str | None:
    value = request.args.get(name)
    if value is None and request.mimetype == "multipart/form-data":
        value = request.form.get(name)
    return value


def _class_items() -> list[str]:
    values = request.args.getlist("classes")
    if not values and request.mimetype == "multipart/form-data":
        values = request.form.getlist("classes")
    return detection.class_items(values)


@bp.post("/v1/detect")
def detect():
    threshold = detection.threshold(_param("threshold"))
    max_detections = detection.max_detections(_param("max_detections"))
    wanted_items = _class_items()
    runtime = detection.ready_runtime()
    wanted = detection.classes(wanted_items, runtime.detector)
    (found,) = detection.detect(runtime, [_image_bytes()])
    return jsonify(detection.detect_body(found, threshold, max_detections, wanted))


@bp.post("/inference")
def inference():
    """The original service's contract: normalised xyxy boxes in parallel lists."""
    threshold = detection.threshold(_param("threshold"))
    (found,) = detection.detect(detection.ready_runtime(), [_image_bytes()])
    prediction, w, h = found.prediction, found.width, found.height
    keep = detection.selected(prediction, threshold, current_app.config["MAX_DETECTIONS"], None)
    return jsonify(
        scores=[round(float(prediction.scores[i]), 4) for i in keep],
        labels=[int(prediction.labels[i]) for i in keep],
        boxes=[[round(b / s, 5) for b, s in zip(prediction.boxes[i], (w, h, w, h), strict=True)] for i in keep],
    )


@bp.get("/openapi.json")
def openapi():
    return jsonify(spec(current_app.config))
