"""The bearer token of the detection endpoints (``DINO_API_TOKEN``); health, metadata and OpenAPI stay open."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from flask import current_app, request

from dinops.serve.errors import ApiError


def require_token() -> None:
    """Raise 401 unless ``DINO_API_TOKEN`` is empty or the request carries ``Authorization: Bearer <token>``."""
    token = current_app.config["API_TOKEN"]
    if not token or request.method == "OPTIONS":
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


def on(*endpoints: str) -> Callable[[], None]:
    """A ``before_request`` hook asking for the token on these endpoints only (a blueprint's detection routes)."""

    def check() -> None:
        if request.endpoint in endpoints:
            require_token()

    return check
