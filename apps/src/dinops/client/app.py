"""``create_app(test_config=None)`` for the web client: the page, and ``POST /api/detect`` which forwards the
image (held in memory only) to the inference API and turns every failure into a sentence for a person. The login in
front of both is :mod:`dinops.client.auth`. Behind ``PROXY_HOPS`` reverse proxies (the ingress), werkzeug's ProxyFix
takes the caller's address, scheme and host from the last that many ``X-Forwarded-For``/``-Proto``/``-Host`` values;
otherwise those headers change nothing."""

from __future__ import annotations

import argparse
import logging
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import requests
from flask import Blueprint, Flask, current_app, jsonify, render_template, request
from werkzeug.exceptions import HTTPException
from werkzeug.middleware.proxy_fix import ProxyFix

from dinops.client import auth
from dinops.client.settings import SETTINGS
from dinops.settings import resolve

log = logging.getLogger(__name__)
bp = Blueprint("ui", __name__)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


WAITING = re.compile(r"^waiting for a model: (?P<path>.*) does not exist yet")


class ClientError(Exception):
    def __init__(self, status: int, message: str, retry_after: str | None = None, model: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after, self.model = status, message, retry_after, model


def settings_config(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    namespace = resolve(argparse.Namespace(), SETTINGS, environ, warn=log.warning)
    return {s.dest.upper(): getattr(namespace, s.dest) for s in SETTINGS}


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_mapping(settings_config())
    if test_config:
        app.config.update(test_config)
    app.config["MAX_CONTENT_LENGTH"] = int(app.config["MAX_UPLOAD_MB"] * 2**20)
    app.config["API_URL"] = app.config["API_URL"].rstrip("/")
    auth.check_settings(app.config)
    if hops := app.config["PROXY_HOPS"]:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops)
    app.extensions["api_session"] = requests.Session()
    auth.init_app(app)
    app.register_blueprint(bp)

    @app.errorhandler(ClientError)
    def client_error(exc: ClientError):
        response = jsonify(error=exc.message, **({"model": exc.model} if exc.model else {}))
        response.status_code = exc.status
        if exc.retry_after:
            response.headers["Retry-After"] = exc.retry_after
        return response

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        message = exc.description
        if exc.code == 413:
            message = f"The image is larger than the {app.config['MAX_UPLOAD_MB']:g} MB limit; choose a smaller one."
        response = jsonify(error=message)
        response.status_code = exc.code or 500
        return response

    @app.after_request
    def security_headers(response):
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        # same-origin, not no-referrer: under no-referrer browsers send "Origin: null" even on the page's own POSTs,
        # which the same-origin check in auth must be able to tell from another site's
        response.headers["Referrer-Policy"] = "same-origin"
        return response

    return app


@bp.get("/")
def index():
    config = current_app.config
    return render_template(
        "index.html",
        threshold=config["THRESHOLD"],
        max_bytes=config["MAX_CONTENT_LENGTH"],
        max_mb=f"{config['MAX_UPLOAD_MB']:g}",
        user=config["USER"] if "login" in current_app.extensions else None,
    )


@bp.get("/healthz")
def healthz():
    return jsonify(status="alive")


@bp.get("/readyz")
def readyz():
    """Ready to serve pages; the API's state is reported, not required (the page explains when it is down). Only to a
    caller who may see it (:func:`auth.may_see_details`): anyone else gets ``{"status": "ready"}`` and the API is not
    asked."""
    if not auth.may_see_details():
        return jsonify(status="ready")
    try:
        api = current_app.extensions["api_session"].get(current_app.config["API_URL"] + "/readyz", timeout=2)
        api_state = "ready" if api.status_code == 200 else f"not ready (HTTP {api.status_code})"
        waiting = _waiting_for(_json_or_none(api)) if api.status_code == 503 else None
        if waiting is not None:
            api_state = f"waiting for a model ({waiting})"
    except requests.RequestException:
        api_state = "unreachable"
    return jsonify(status="ready", api=api_state)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


def clean_answer(body: Any) -> dict[str, Any]:
    """Only the fields the page uses, with their types checked: the browser never sees anything else.

    A detection without a name is of a class the page does not know (the API names every class of its model): it is
    left out, not shown as a bare id."""
    if not isinstance(body, dict) or not isinstance(body.get("detections"), list):
        raise ValueError("no detections list")
    detections = []
    for item in body["detections"]:
        box = item["box"]
        if not isinstance(box, list) or len(box) != 4:
            raise ValueError(f"bad box {box!r}")
        detection = {
            "box": [_number(c) for c in box],
            "label": int(_number(item["label"])),
            "name": item.get("name"),
            "score": _number(item["score"]),
        }
        if isinstance(detection["name"], str) and detection["name"].strip():
            detections.append(detection)
        else:
            log.warning("the API answered class %d without a name: not shown", detection["label"])
    return {"width": int(_number(body["width"])), "height": int(_number(body["height"])), "detections": detections}


API_REFUSED = "The web client is not allowed to use the detection service (check DINO_API_TOKEN)."


def _api_auth(config: Mapping[str, Any]) -> dict[str, str]:
    """The header that carries the API token to the API, when one is set."""
    return {"Authorization": f"Bearer {config['API_TOKEN']}"} if config["API_TOKEN"] else {}


@bp.post("/api/detect")
def detect():
    config = current_app.config
    if not (request.mimetype or "").startswith("image/"):
        raise ClientError(415, "Please choose an image file (JPEG, PNG, WebP, BMP, GIF or TIFF).")
    data = request.get_data(cache=False)  # in memory, bounded by MAX_CONTENT_LENGTH; never a file
    if not data:
        raise ClientError(400, "The file is empty.")
    headers = {"Content-Type": request.mimetype, **_api_auth(config)}
    started = time.perf_counter()
    try:
        answer = current_app.extensions["api_session"].post(
            config["API_URL"] + "/v1/detect",
            params={"threshold": 0, "max_detections": config["MAX_DETECTIONS"]},
            data=data,
            headers=headers,
            timeout=(5, config["API_TIMEOUT_S"]),
        )
    except requests.Timeout:
        raise ClientError(
            504, f"The detection service did not answer within {config['API_TIMEOUT_S']:g} seconds. Try again later."
        ) from None
    except requests.RequestException:
        log.warning("API at %s unreachable", config["API_URL"], exc_info=True)
        raise ClientError(
            502, "The detection service cannot be reached right now. It may be starting or down; try again in a minute."
        ) from None
    latency_ms = round((time.perf_counter() - started) * 1000, 1)
    return jsonify(**_interpret(answer), latency_ms=latency_ms)


TRAINING_STATES = ("not_started", "waiting_for_data", "training", "evaluating", "done", "stopped", "failed",
                   "unreadable", "unavailable")  # fmt: skip
TRAINING_NUMBERS = ("epoch", "epochs", "step", "steps_per_epoch", "global_step", "total_steps", "step_s",
                    "data_wait_s", "images_per_s", "eta_s", "learning_rate")  # fmt: skip
GPU_FIELDS = ("utilization_percent", "memory_allocated_bytes", "memory_reserved_bytes", "memory_total_bytes")


def _numbers(source: Any, keys: tuple[str, ...]) -> dict[str, float]:
    """The keys of ``source`` whose values are finite numbers (anything else is left out, never passed on)."""
    if not isinstance(source, dict):
        return {}
    kept = {}
    for key in keys:
        try:
            kept[key] = _number(source.get(key))
        except ValueError:
            continue
    return kept


def _text(value: Any, limit: int = 500) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def clean_training(body: Any) -> dict[str, Any]:
    """The API's ``/v1/training`` answer reduced to the fields the training panel shows, each of its type."""
    if not isinstance(body, dict) or body.get("state") not in TRAINING_STATES:
        raise ValueError("no known training state")
    curve = body.get("loss_curve") if isinstance(body.get("loss_curve"), list) else []
    evaluations = body.get("evaluations") if isinstance(body.get("evaluations"), list) else []
    checkpoint, served, gpu = body.get("checkpoint"), body.get("served"), body.get("gpu")
    cleaned: dict[str, Any] = {"state": body["state"], **_numbers(body, TRAINING_NUMBERS)}
    for key in ("reason", "progress_file", "updated_at"):
        if (text := _text(body.get(key))) is not None:
            cleaned[key] = text
    points = (_numbers(dict(zip("xy", p, strict=False)), ("x", "y")) for p in curve[:2000] if isinstance(p, list))
    cleaned["loss_curve"] = [[p["x"], p["y"]] for p in points if len(p) == 2]
    cleaned["evaluations"] = [
        _numbers(e, ("epoch", "global_step", "ap", "ap50", "ap75")) for e in evaluations[:1000] if isinstance(e, dict)
    ]
    if isinstance(checkpoint, dict):
        cleaned["checkpoint"] = {"path": _text(checkpoint.get("path")), "saved_at": _text(checkpoint.get("saved_at"))}
    if isinstance(served, dict):
        cleaned["served"] = {
            "checkpoint": _text(served.get("checkpoint")),
            "loaded_at": _text(served.get("loaded_at")),
            **_numbers(served, ("epoch", "global_step")),
        }
    if isinstance(gpu, dict):
        cleaned["gpu"] = {"name": _text(gpu.get("name"), 100), **_numbers(gpu, GPU_FIELDS)}
    return cleaned


@bp.get("/api/training")
def training():
    """The training run as the API reports it (``GET /v1/training``), for the page's training panel."""
    config = current_app.config
    try:
        answer = current_app.extensions["api_session"].get(
            config["API_URL"] + "/v1/training", headers=_api_auth(config), timeout=(5, 10)
        )
    except requests.RequestException:
        raise ClientError(502, "The detection service cannot be reached, so the training run is not known.") from None
    if answer.status_code == 401:
        raise ClientError(502, API_REFUSED)
    if answer.status_code == 404:
        raise ClientError(502, "This detection service does not report training runs (an older version).")
    try:
        if answer.status_code != 200:
            raise ValueError(f"HTTP {answer.status_code}")
        return jsonify(clean_training(_json_or_none(answer)))
    except (KeyError, TypeError, ValueError) as exc:
        log.error("unexpected training answer from the API: %s", exc)
        raise ClientError(502, "The detection service sent a training report this page does not understand.") from None


def _json_or_none(answer: requests.Response) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None


def _waiting_for(body: Any) -> str | None:
    """The checkpoint path when the API's answer says it is waiting for a model; None otherwise."""
    if not isinstance(body, dict):
        return None
    message = body.get("error") if isinstance(body.get("error"), str) else ""
    match = WAITING.match(message)
    if body.get("code") != "model_waiting" and body.get("status") != "waiting for a model" and not match:
        return None
    path = body.get("checkpoint")
    return str(path) if isinstance(path, str) and path else (match.group("path") if match else "no path given")


def _interpret(answer: requests.Response) -> dict[str, Any]:
    body = _json_or_none(answer)
    api_message = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), str) else None
    if answer.status_code == 200:
        try:
            return clean_answer(body)
        except (KeyError, TypeError, ValueError) as exc:
            log.error("unexpected answer from the API: %s", exc)
            raise ClientError(502, "The detection service sent an answer this page does not understand.") from None
    if answer.status_code == 503 and (path := _waiting_for(body)) is not None:
        wait = answer.headers.get("Retry-After", "a few")
        raise ClientError(
            503,
            f"The model is not there yet: waiting for a model ({path}) … It appears once a training run has "
            f"written it or an operator gives one. Try again in {wait} seconds.",
            answer.headers.get("Retry-After"),
            model="waiting",
        )
    if answer.status_code == 503 and isinstance(body, dict) and body.get("code") == "model_failed":
        wait = answer.headers.get("Retry-After", "a few")
        raise ClientError(
            503,
            f"The detection service's model could not be loaded ({api_message}). Try again in {wait} seconds.",
            answer.headers.get("Retry-After"),
            model="failed",
        )
    if answer.status_code == 503:
        wait = answer.headers.get("Retry-After", "a few")
        raise ClientError(
            503,
            f"The detection service is busy or still loading. Try again in {wait} seconds.",
            answer.headers.get("Retry-After"),
        )
    if answer.status_code == 401:
        raise ClientError(502, API_REFUSED)
    if 400 <= answer.status_code < 500:
        raise ClientError(
            answer.status_code, f"The image was rejected: {api_message or 'HTTP ' + str(answer.status_code)}"
        )
    raise ClientError(502, f"The detection service failed (HTTP {answer.status_code}). Try again later.")
