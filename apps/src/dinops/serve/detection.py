"""What every protocol of the API shares: the answer options, the model's readiness, images through the batcher.

``/v1/detect``, ``/inference``, KServe V1 (:mod:`dinops.serve.kserve_v1`) and the Open Inference Protocol V2
(:mod:`dinops.serve.oip_v2`) differ only in how images and options arrive and how detections leave. The options
(``threshold``, ``max_detections``, ``classes``) are checked here with the same rules and messages whether they come
as query strings or as JSON values; :func:`detect` decodes a request's images, queues every one in the micro-batcher
(so the images of one request share forward passes with each other and with concurrent requests) and waits for all.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import current_app, request

from dinops.serve import images
from dinops.serve.batching import QueueFull
from dinops.serve.detector import Detector, Prediction
from dinops.serve.errors import ApiError
from dinops.serve.inflight import InFlight, request_bytes
from dinops.serve.runtime import ModelRuntime


def _bad(message: str) -> ApiError:
    return ApiError(400, "bad_parameter", message)


def threshold(raw: Any) -> float:
    """``None`` -> DINO_THRESHOLD; a number or a numeric string from 0 to 1."""
    if raw is None:
        return current_app.config["THRESHOLD"]
    try:
        value = float(raw) if isinstance(raw, str | int | float) and not isinstance(raw, bool) else math.nan
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise _bad(f"threshold must be a number between 0 and 1, got {raw!r}.")
    return value


def max_detections(raw: Any) -> int:
    """``None`` -> DINO_MAX_DETECTIONS; a whole number (or its digits) from 1 to DINO_MAX_DETECTIONS."""
    limit = current_app.config["MAX_DETECTIONS"]
    if raw is None:
        return limit
    if isinstance(raw, str) and raw.isdigit():
        value = int(raw)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    else:
        value = 0
    if not 1 <= value <= limit:
        raise _bad(f"max_detections must be a whole number from 1 to {limit}, got {raw!r}.")
    return value


def class_items(values: Any) -> list[str]:
    """Comma-separated strings, names or ids (one value or a list) -> the wanted items as strings, resolved against
    the model's names by :func:`classes` once it is ready."""
    if values is None:
        return []
    items = []
    for value in values if isinstance(values, list) else [values]:
        if isinstance(value, int) and not isinstance(value, bool):
            items.append(str(value))
        elif isinstance(value, str):
            items.extend(v.strip() for v in value.split(",") if v.strip())
        else:
            raise _bad(f"classes: {value!r} is neither a class id nor a class name.")
    return items


def json_parameters(value: Any, allowed: Iterable[str]) -> dict[str, Any]:
    """A JSON request's ``parameters`` (absent: none), an object of only the ``allowed`` names."""
    parameters = {} if value is None else value
    if not isinstance(parameters, dict):
        raise _bad(f"'parameters' must be an object, got {type(value).__name__}.")
    check_keys(parameters, allowed, "parameters", "bad_parameter")
    return parameters


def json_options(parameters: dict[str, Any]) -> tuple[float, int, list[str]]:
    """``threshold``, ``max_detections`` and the ``classes`` items of a JSON request's ``parameters``."""
    return (
        threshold(parameters.get("threshold")),
        max_detections(parameters.get("max_detections")),
        class_items(parameters.get("classes")),
    )


def classes(items: Sequence[str], detector: Detector) -> set[int] | None:
    """Class ids or names (of the model in use) -> ids; ``None`` keeps every class. An id the model does not answer
    is refused rather than answered with nothing."""
    if not items:
        return None
    known = detector.class_names.ids
    ids = set()
    for item in items:
        label = int(item) if item.lstrip("-").isdigit() else detector.class_names.id_of(item)
        if label is None:
            raise _bad(f"classes: {item!r} is neither a class id nor a known class name.")
        if label not in known:
            shown = ", ".join(map(str, known[:20])) + (", ..." if len(known) > 20 else "")
            raise _bad(f"classes: {item!r} is not a class of this model (its ids: {shown}).")
        ids.add(label)
    return ids


def ready_runtime() -> ModelRuntime:
    """The runtime with a model in it, or the 503 that says why not (waiting, loading, failed)."""
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


@dataclass
class Detected:
    """One image's answer: the prediction, the detector that computed it (a reload may swap the model meanwhile:
    names and model info come from this one), the upright image's size and the timings in ms."""

    prediction: Prediction
    detector: Detector
    width: int
    height: int
    timing: dict[str, float]


def images_per_request() -> tuple[int, str]:
    """The most images one request may hold and the setting that says so: DINO_MAX_IMAGES_PER_REQUEST, or
    DINO_QUEUE_SIZE where the queue is smaller (beyond it a request could never be served)."""
    config = current_app.config
    if config["QUEUE_SIZE"] < config["MAX_IMAGES_PER_REQUEST"]:
        return config["QUEUE_SIZE"], "DINO_QUEUE_SIZE"
    return config["MAX_IMAGES_PER_REQUEST"], "DINO_MAX_IMAGES_PER_REQUEST"


def check_count(count: int) -> None:
    limit, setting = images_per_request()
    if count > limit:
        raise ApiError(
            413,
            "too_many_images",
            f"{count} images in one request: at most {limit} are accepted ({setting}); split the request.",
        )


def in_flight() -> InFlight:
    """This worker's budget (each gunicorn worker builds its own app, so its own budget)."""
    budget = current_app.extensions.get("dino_in_flight")
    if budget is None:
        config = current_app.config
        budget = InFlight(int(config["MAX_DECODED_MB"] * images.MIB), config["DECODE_THREADS"])
        budget = current_app.extensions.setdefault("dino_in_flight", budget)  # if two threads race, one wins
    return budget


def _busy(what: str) -> ApiError:
    return ApiError(429, "busy", f"The service is busy: {what}; try again shortly.", {"Retry-After": "1"})


def _name(where: Callable[[int], str] | None, index: int, exc: ApiError) -> None:
    if where is not None:
        exc.message = f"{where(index)}: {exc.message}"


def _open(blobs: Sequence[bytes], detector: Detector, where: Callable[[int], str] | None) -> list[images.Pending]:
    """Every image's header, checked against the limits before any image of the request is decoded."""
    config = current_app.config
    limits = images.Limits(
        config["MAX_IMAGE_PIXELS"], int(config["MAX_IMAGE_MB"] * images.MIB), detector.min_size, detector.max_size
    )
    pending = []
    for index, blob in enumerate(blobs):
        try:
            image = images.open_image(blob, limits)
            short, long = sorted((image.width, image.height))
            if short * min(detector.min_size / short, detector.max_size / long) < 2:  # would resize to nothing
                raise ApiError(
                    400, "bad_aspect_ratio", f"The image ({image.width}x{image.height}) is too thin to analyse."
                )
        except ApiError as exc:
            _name(where, index, exc)
            raise
        pending.append(image)
    return pending


def detect(runtime: ModelRuntime, blobs: Sequence[bytes], where: Callable[[int], str] | None = None) -> list[Detected]:
    """Check every image's header, reserve the memory they need, decode them, queue them all, wait for all
    (``where(i)`` names image i in error messages).

    Images beyond DINO_MAX_IMAGES_PER_REQUEST, DINO_MAX_IMAGE_PIXELS or DINO_MAX_IMAGE_MB, or a request that could
    never fit DINO_MAX_DECODED_MB, answer 413 before anything is decoded; no room in the worker's budget or no free
    decode slot (DINO_DECODE_THREADS) by the deadline answers 429 ``busy``; a full queue cancels the images already
    queued and answers 503 ``busy``. DINO_REQUEST_TIMEOUT_S bounds the wait of the whole request."""
    started = time.perf_counter()
    check_count(len(blobs))
    detector = runtime.detector
    pending = _open(blobs, detector, where)
    budget, need = in_flight(), request_bytes(pending)
    if need > budget.capacity:
        raise ApiError(
            413,
            "request_too_large",
            f"The request's images would take about {need / images.MIB:,.0f} MiB once decoded: a worker holds at "
            f"most {budget.capacity / images.MIB:,.4g} MiB of images (DINO_MAX_DECODED_MB); send fewer or smaller "
            "images per request.",
        )
    timeout = current_app.config["REQUEST_TIMEOUT_S"]
    deadline = time.monotonic() + timeout
    if not budget.reserve(need, deadline):
        raise _busy(
            f"the images in flight fill this worker's {budget.capacity / images.MIB:,.4g} MiB (DINO_MAX_DECODED_MB)"
        )
    try:
        return _detect_reserved(runtime, detector, pending, budget, deadline, started, where)
    finally:
        budget.release(need)


def _detect_reserved(runtime, detector, pending, budget, deadline, started, where) -> list[Detected]:
    prepared, decode_ms = [], []
    for index, image in enumerate(pending):
        with budget.decoding(deadline) as slot:
            if not slot:
                raise _busy(f"all {budget.decode_threads} decode slots stayed taken (DINO_DECODE_THREADS)")
            begun = time.perf_counter()
            try:
                pixels = detector.prepare(image.decode())
            except ApiError as exc:
                _name(where, index, exc)
                raise
        prepared.append(pixels)
        decode_ms.append((time.perf_counter() - begun) * 1000)
    futures = []
    try:
        for image, pixels in zip(pending, prepared, strict=True):
            futures.append(runtime.batcher.submit(pixels, (image.height, image.width)))
    except QueueFull as exc:
        for future in futures:
            future.cancel()
        runtime.metrics.rejected.inc()
        raise ApiError(
            503, "busy", "The service is busy; try again shortly.", {"Retry-After": str(exc.retry_after_s)}
        ) from None
    del prepared
    timeout = current_app.config["REQUEST_TIMEOUT_S"]
    results = []
    try:
        for future in futures:
            results.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
    except concurrent.futures.TimeoutError:
        for future in futures:
            future.cancel()
        raise ApiError(
            503, "timeout", f"No result within {timeout:g} s; the service is overloaded.", {"Retry-After": "5"}
        ) from None
    total_ms = (time.perf_counter() - started) * 1000
    answers = []
    for image, ms, ((prediction, used), batch) in zip(pending, decode_ms, results, strict=True):
        runtime.metrics.queue_wait.observe(batch.queue_s)
        timing = {
            "decode_ms": ms,
            "queue_ms": batch.queue_s * 1000,
            "inference_ms": batch.inference_s * 1000,
            "total_ms": total_ms,
            "batch_size": batch.size,
        }
        answers.append(
            Detected(prediction, used, image.width, image.height, {k: round(v, 2) for k, v in timing.items()})
        )
    return answers


def selected(prediction: Prediction, threshold: float, max_detections: int, wanted: set[int] | None) -> list[int]:
    """Indices of the detections to return: best first, at least ``threshold``, of the ``wanted`` classes."""
    order = sorted(range(len(prediction.scores)), key=lambda i: -prediction.scores[i])
    keep = [
        i for i in order if prediction.scores[i] >= threshold and (wanted is None or prediction.labels[i] in wanted)
    ]
    return keep[:max_detections]


def detect_body(found: Detected, threshold: float, max_detections: int, wanted: set[int] | None) -> dict[str, Any]:
    """The answer of ``POST /v1/detect`` for one image (and of one KServe V1 prediction)."""
    prediction, detector = found.prediction, found.detector
    names = detector.class_names
    detections = [
        {
            "box": [round(c, 2) for c in prediction.boxes[i]],
            "label": int(prediction.labels[i]),
            "name": names[prediction.labels[i]],
            "score": round(float(prediction.scores[i]), 4),
        }
        for i in selected(prediction, threshold, max_detections, wanted)
    ]
    return {
        "width": found.width,
        "height": found.height,
        "detections": detections,
        "threshold": threshold,
        "model": {**detector.info, "checkpoint": Path(detector.info.get("checkpoint", "")).name},
        "device": str(detector.device),
        "backend": detector.info.get("backend", "pytorch"),
        "timing": found.timing,
    }


def check_identity_encoding() -> None:
    """Compressed request bodies are not accepted (their decompressed size would escape DINO_MAX_UPLOAD_MB)."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in {"", "identity"}:
        raise ApiError(
            415, "unsupported_encoding", f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed."
        )


def json_object(data: bytes, what: str = "The request body") -> dict[str, Any]:
    """Bytes -> a JSON object, or a 400 ``bad_json`` that says what is wrong."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, "bad_json", f"{what} is not valid JSON: {exc}.") from None
    except RecursionError:  # "[[[[..." deeper than the parser goes
        raise ApiError(400, "bad_json", f"{what} is nested too deeply to be read.") from None
    if not isinstance(value, dict):
        raise ApiError(400, "bad_json", f"{what} must be a JSON object, got {type(value).__name__}.")
    return value


def check_keys(value: dict[str, Any], allowed: Iterable[str], where: str, code: str = "bad_request") -> None:
    allowed = tuple(allowed)
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ApiError(
            400, code, f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; accepted: {', '.join(allowed)}."
        )


def base64_bytes(text: Any, where: str) -> bytes:
    """Standard base64 (RFC 4648 section 4, no line breaks) -> bytes, or a 400 ``bad_base64``."""
    if not isinstance(text, str):
        raise ApiError(400, "bad_base64", f"{where} must be a base64 string, got {type(text).__name__}.")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(400, "bad_base64", f"{where} is not valid base64 ({exc}).") from None
