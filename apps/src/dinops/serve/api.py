"""``POST /v1/detect``, the original service's ``POST /inference``, and ``GET /openapi.json``."""

from __future__ import annotations

import concurrent.futures
import hmac
import time
from pathlib import Path
from typing import Any

from flask import Blueprint, current_app, jsonify, request

from dinops.serve import images
from dinops.serve.batching import QueueFull
from dinops.serve.errors import ApiError
from dinops.serve.openapi import spec
from dinops.serve.runtime import ModelRuntime

bp = Blueprint("api", __name__)

RAW_TYPES = ("image/", "application/octet-stream")


@bp.before_app_request
def _start_model() -> None:
    current_app.extensions["dino"].start()


@bp.before_request
def _authorise() -> None:
    token = current_app.config["API_TOKEN"]
    if not token or request.method == "OPTIONS" or request.endpoint == "api.openapi":
        return
    sent = request.headers.get("Authorization", "")
    scheme, _, credentials = sent.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(credentials.strip().encode(), token.encode()):
        raise ApiError(
            401,
            "unauthorized",
            "This API needs a token: send the header 'Authorization: Bearer <token>'.",
            {"WWW-Authenticate": 'Bearer realm="dinops"'},
        )


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


def _threshold() -> float:
    raw = _param("threshold")
    if raw is None:
        return current_app.config["THRESHOLD"]
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise ApiError(400, "bad_parameter", f"threshold must be a number between 0 and 1, got {raw!r}.")
    return value


def _max_detections() -> int:
    limit = current_app.config["MAX_DETECTIONS"]
    raw = _param("max_detections")
    if raw is None:
        return limit
    if not raw.isdigit() or not 1 <= int(raw) <= limit:
        raise ApiError(400, "bad_parameter", f"max_detections must be a whole number from 1 to {limit}, got {raw!r}.")
    return int(raw)


def _classes(runtime: ModelRuntime) -> set[int] | None:
    values = request.args.getlist("classes")
    if not values and request.mimetype == "multipart/form-data":
        values = request.form.getlist("classes")
    wanted = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not wanted:
        return None
    ids = set()
    for item in wanted:
        label = int(item) if item.lstrip("-").isdigit() else runtime.detector.class_names.id_of(item)
        if label is None:
            raise ApiError(400, "bad_parameter", f"classes: {item!r} is neither a class id nor a known class name.")
        ids.add(label)
    return ids


def _ready_runtime() -> ModelRuntime:
    runtime: ModelRuntime = current_app.extensions["dino"]
    if runtime.state == "waiting":
        raise ApiError(
            503,
            "model_waiting",
            runtime.waiting_message,
            {"Retry-After": str(runtime.retry_after_s)},
            {"model": "waiting", "checkpoint": runtime.checkpoint},
        )
    if runtime.state == "failed":
        retry = str(runtime.retry_after_s) if runtime.waits_for_model else "60"
        raise ApiError(
            503,
            "model_failed",
            f"The model failed to load: {runtime.error}",
            {"Retry-After": retry},
            {"model": "failed", "checkpoint": runtime.checkpoint},
        )
    if runtime.state != "ready":
        raise ApiError(503, "model_loading", "The model is still loading; try again shortly.", {"Retry-After": "5"})
    return runtime


def _detect(runtime: ModelRuntime) -> tuple[Any, Any, Any, dict[str, float]]:
    """Decode one image and run it through the batcher; returns (prediction, the detector that computed it, decoded
    image, timings in ms). A reload may swap the detector meanwhile: names and model info come from the one used."""
    started = time.perf_counter()
    image = images.decode(_image_bytes(), current_app.config["MAX_IMAGE_PIXELS"])
    decoded = time.perf_counter()
    short, long = sorted(image.size)
    detector = runtime.detector
    if short * min(detector.min_size / short, detector.max_size / long) < 2:  # would resize to nothing
        raise ApiError(400, "bad_aspect_ratio", f"The image ({image.width}x{image.height}) is too thin to analyse.")
    try:
        future = runtime.batcher.submit(detector.prepare(image), (image.height, image.width))
    except QueueFull as exc:
        runtime.metrics.rejected.inc()
        raise ApiError(
            503, "busy", "The service is busy; try again shortly.", {"Retry-After": str(exc.retry_after_s)}
        ) from None
    timeout = current_app.config["REQUEST_TIMEOUT_S"]
    try:
        (prediction, detector), batch = future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise ApiError(
            503, "timeout", f"No result within {timeout:g} s; the service is overloaded.", {"Retry-After": "5"}
        ) from None
    runtime.metrics.queue_wait.observe(batch.queue_s)
    timing = {
        "decode_ms": (decoded - started) * 1000,
        "queue_ms": batch.queue_s * 1000,
        "inference_ms": batch.inference_s * 1000,
        "total_ms": (time.perf_counter() - started) * 1000,
        "batch_size": batch.size,
    }
    return prediction, detector, image, {k: round(v, 2) for k, v in timing.items()}


def _selected(prediction, threshold: float, max_detections: int, wanted: set[int] | None) -> list[int]:
    order = sorted(range(len(prediction.scores)), key=lambda i: -prediction.scores[i])
    keep = [
        i for i in order if prediction.scores[i] >= threshold and (wanted is None or prediction.labels[i] in wanted)
    ]
    return keep[:max_detections]


@bp.post("/v1/detect")
def detect():
    threshold, max_detections = _threshold(), _max_detections()
    runtime = _ready_runtime()
    wanted = _classes(runtime)
    prediction, detector, image, timing = _detect(runtime)
    names = detector.class_names
    detections = [
        {
            "box": [round(c, 2) for c in prediction.boxes[i]],
            "label": int(prediction.labels[i]),
            "name": names[prediction.labels[i]],
            "score": round(float(prediction.scores[i]), 4),
        }
        for i in _selected(prediction, threshold, max_detections, wanted)
    ]
    return jsonify(
        width=image.width,
        height=image.height,
        detections=detections,
        threshold=threshold,
        model={**detector.info, "checkpoint": Path(detector.info.get("checkpoint", "")).name},
        device=str(detector.device),
        backend=detector.info.get("backend", "pytorch"),
        timing=timing,
    )


@bp.post("/inference")
def inference():
    """The original service's contract: normalised xyxy boxes in parallel lists."""
    threshold = _threshold()
    prediction, _, image, _ = _detect(_ready_runtime())
    keep = _selected(prediction, threshold, current_app.config["MAX_DETECTIONS"], None)
    w, h = image.width, image.height
    return jsonify(
        scores=[round(float(prediction.scores[i]), 4) for i in keep],
        labels=[int(prediction.labels[i]) for i in keep],
        boxes=[[round(b / s, 5) for b, s in zip(prediction.boxes[i], (w, h, w, h), strict=True)] for i in keep],
    )


@bp.get("/openapi.json")
def openapi():
    return jsonify(spec(current_app.config))
