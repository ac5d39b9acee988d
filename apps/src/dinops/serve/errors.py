"""Every failure an API client can cause becomes a JSON body ``{"error": ..., "code": ...}`` with a 4xx status
(503 while the model is not there: ``code`` ``model_waiting``, ``model_loading`` or ``model_failed``)."""

from __future__ import annotations

import logging

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error meant for the client: ``status``, a short machine ``code`` and a sentence a person understands."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}
        self.extra = extra or {}  # more keys of the body, e.g. the checkpoint a 503 waits for


def json_error(status: int, code: str, message: str, headers=None, extra=None):
    response = jsonify(error=message, code=code, **(extra or {}))
    response.status_code = status
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def register(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def api_error(exc: ApiError):
        return json_error(exc.status, exc.code, exc.message, exc.headers, exc.extra)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        code = (exc.name or "error").lower().replace(" ", "_")
        message = exc.description or exc.name
        if exc.code == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH") or 0
            message = f"The upload is larger than the {limit / 2**20:.3g} MiB limit of this service."
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return json_error(exc.code or 500, code, message, headers)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        log.exception("unhandled error")
        return json_error(500, "internal_error", "The server failed to process the request; the error was logged.")
