"""``create_app(test_config=None)``: settings defaults, then the environment, then the given overrides.

Config keys are the upper-cased ``dest`` names of :mod:`dinops.serve.settings` (``THRESHOLD``,
``BATCH_MAX_SIZE``...). Tests may also pass ``DETECTOR`` (a ready :class:`~dinops.serve.detector.Detector`)
or ``DETECTOR_LOADER`` (``config -> Detector``) instead of a checkpoint.
"""

from __future__ import annotations

import argparse
import io
import logging
import time
from collections.abc import Mapping
from typing import Any

from flask import Flask, Request, g, request

from dinops.serve import api, errors, health, protocols, training
from dinops.serve.metrics import Metrics
from dinops.serve.runtime import ModelRuntime
from dinops.serve.settings import SETTINGS
from dinops.settings import resolve

log = logging.getLogger(__name__)


class InMemoryRequest(Request):
    """Multipart uploads stay in memory (bounded by MAX_CONTENT_LENGTH) instead of spilling to temp files."""

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        return io.BytesIO()


def settings_config(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    namespace = resolve(argparse.Namespace(), SETTINGS, environ, warn=log.warning)
    return {s.dest.upper(): getattr(namespace, s.dest) for s in SETTINGS}


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.request_class = InMemoryRequest
    app.json.sort_keys = False
    app.config.from_mapping(settings_config())
    if test_config:
        app.config.update(test_config)
    app.config["MAX_CONTENT_LENGTH"] = int(app.config["MAX_UPLOAD_MB"] * 2**20)

    app.extensions["dino_metrics"] = Metrics()
    ModelRuntime(app)
    errors.register(app)
    app.register_blueprint(api.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(training.bp)
    protocols.register(app)
    _observe_requests(app)
    _cors(app, [o.strip() for o in app.config["CORS_ORIGINS"].split(",") if o.strip()])
    return app


def _observe_requests(app: Flask) -> None:
    metrics: Metrics = app.extensions["dino_metrics"]

    @app.before_request
    def _clock() -> None:
        g.started = time.perf_counter()

    @app.after_request
    def _count(response):
        endpoint = request.url_rule.rule if request.url_rule else "unmatched"
        metrics.requests.labels(endpoint, request.method, str(response.status_code)).inc()
        if "started" in g:
            metrics.latency.labels(endpoint).observe(time.perf_counter() - g.started)
        return response


def _cors(app: Flask, origins: list[str]) -> None:
    if not origins:
        return

    @app.after_request
    def _headers(response):
        origin = request.headers.get("Origin")
        if "*" in origins:
            response.headers["Access-Control-Allow-Origin"] = "*"
        elif origin in origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.vary.add("Origin")
        else:
            return response
        response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
        response.headers["Access-Control-Expose-Headers"] = "Retry-After"
        response.headers["Access-Control-Max-Age"] = "600"
        return response
