"""``GET /healthz`` (the process answers; its ``model`` says waiting, loading, ready or failed), ``GET /readyz``
(model loaded and warmed up), ``GET /metrics``."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    """200 while the process answers, model or not; ``model`` is waiting, loading, ready or failed, and a failed load
    carries its ``error`` (the workloads stage reports it from here). ``loaded`` describes the model in use: its file,
    the training position stored in it (``epoch``, ``step``, ``global_step``), the file's ``mtime`` (for a checkpoint in
    S3: its ``url``, ``etag``, ``size`` and ``sha256``), where its class names came from; ``reload`` (with
    DINO_RELOAD) counts reloads and carries the last failed one's ``error``."""
    runtime = current_app.extensions["dino"]
    model_state, error, loaded, reloads, reload_error = runtime.health_view()
    body = {"status": "alive", "model": model_state, "checkpoint": runtime.checkpoint}
    if model_state == "failed" and error:
        body["error"] = error
    if loaded is not None:
        body["loaded"] = loaded
    if runtime.follows:
        body["reload"] = {"enabled": True, "poll_s": runtime.poll_s, "reloads": reloads}
        if reload_error:
            body["reload"]["error"] = reload_error
    return jsonify(body)


@bp.get("/readyz")
def readyz():
    runtime = current_app.extensions["dino"]
    if runtime.state == "waiting":
        response = jsonify(
            status="waiting for a model", checkpoint=runtime.checkpoint, model="waiting", error=runtime.waiting_message
        )
        response.status_code = 503
        response.headers["Retry-After"] = str(runtime.retry_after_s)
        return response
    if runtime.state != "ready":
        body = {"status": runtime.model_state}
        if runtime.error:
            body["error"] = runtime.error
        if runtime.checkpoint:
            body["checkpoint"] = runtime.checkpoint
        response = jsonify(body)
        response.status_code = 503
        return response
    detector = runtime.detector
    return jsonify(
        status="ready",
        device=str(detector.device),
        backend=detector.info.get("backend", "pytorch"),
        checkpoint=detector.info.get("checkpoint"),
        precision=detector.precision,
        warmup_s=None if runtime.warmup_s is None else round(runtime.warmup_s, 3),
        model=detector.info,
        batching={
            "max_batch": runtime.batcher.max_batch if runtime.batcher else current_app.config["BATCH_MAX_SIZE"],
            "max_wait_ms": current_app.config["BATCH_MAX_WAIT_MS"],
            "queue_size": current_app.config["QUEUE_SIZE"],
        },
    )


@bp.get("/metrics")
def metrics():
    registry = current_app.extensions["dino_metrics"].registry
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST.split(";")[0])
