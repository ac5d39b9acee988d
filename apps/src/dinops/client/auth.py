"""The login in front of the web client, and the start-up check of the login and TLS settings.

With ``CLIENT_PASSWORD_FILE`` set, every page and ``/api/detect`` need a session; only the login form, the stylesheet
it uses, ``/healthz`` and ``/readyz`` do not, and those tell an anonymous caller nothing but alive or ready
(:func:`may_see_details`). The session is a signed cookie (``dinops_session``: HttpOnly, SameSite=Strict, Secure when
the client serves TLS or the request came over HTTPS through a trusted proxy) holding the user name and the time of
the login; it is refused once ``CLIENT_SESSION_HOURS`` have passed. Its signing key is derived (scrypt) from the
password file's content, so every gunicorn worker shares it without any other secret, and a new password ends every
session at once. Every POST must come from the page's own origin (``Origin``, else ``Sec-Fetch-Site``), the scheme
and host being the client's own or, behind ``CLIENT_PROXY_HOPS`` proxies, the forwarded ones. Failed logins are slowed
down (``LOGIN_FAILURE_DELAY_S``) and, per client address (the forwarded one behind a proxy) and worker process, limited
to ``LOGIN_MAX_FAILURES`` within ``LOGIN_FAILURE_WINDOW_S`` seconds; past that even the right password is refused (429)
until the oldest failure ages out.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import ipaddress
import logging
import math
import os
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, current_app, jsonify, redirect, render_template, request, url_for
from itsdangerous import BadSignature, URLSafeSerializer
from werkzeug.exceptions import Forbidden, ServiceUnavailable

from dinops.settings import SettingsError

log = logging.getLogger(__name__)
bp = Blueprint("auth", __name__)

COOKIE = "dinops_session"
LIMITS = {"LOGIN_MAX_FAILURES": 10, "LOGIN_FAILURE_WINDOW_S": 600, "LOGIN_FAILURE_DELAY_S": 1.0}
OPEN_ENDPOINTS = {"auth.login", "auth.logout", "ui.healthz", "ui.readyz"}
OPEN_STATIC = {"app.css"}  # the login page's stylesheet; app.js needs a session
MAX_TRACKED_ADDRESSES = 10_000


def read_password(path: str) -> str:
    """The file's text without one trailing newline (as ``echo`` writes it)."""
    with open(path, encoding="utf-8") as file:
        text = file.read()
    return text.removesuffix("\n").removesuffix("\r")


def check_settings(config: Mapping[str, Any]) -> None:
    """Raise :class:`SettingsError` (one line) when the login and TLS settings cannot be served as asked."""
    cert, key, password_file = config["TLS_CERT_FILE"], config["TLS_KEY_FILE"], config["PASSWORD_FILE"]
    if bool(cert) != bool(key):
        given = "CLIENT_TLS_CERT_FILE" if cert else "CLIENT_TLS_KEY_FILE"
        raise SettingsError(f"CLIENT_TLS_CERT_FILE and CLIENT_TLS_KEY_FILE go together: only {given} is set")
    if config["PUBLIC"]:
        missing = ["a password file (CLIENT_PASSWORD_FILE)"] if not password_file else []
        if not cert:
            missing.append("a TLS certificate and key (CLIENT_TLS_CERT_FILE, CLIENT_TLS_KEY_FILE)")
        if missing:
            raise SettingsError(
                f"CLIENT_PUBLIC is true but {' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} not set: "
                "a client published beyond loopback needs a login and TLS"
            )
    if password_file:
        try:
            password = read_password(password_file)
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"CLIENT_PASSWORD_FILE={password_file} cannot be read: {_reason(exc)}") from exc
        if not password:
            raise SettingsError(f"CLIENT_PASSWORD_FILE={password_file} is empty")
    if cert:
        for name, path in (("CLIENT_TLS_CERT_FILE", cert), ("CLIENT_TLS_KEY_FILE", key)):
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise SettingsError(f"{name}={path} cannot be read: {_reason(exc)}") from exc
        try:  # what gunicorn will do in each worker, done once here so that a bad pair stops the start
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            raise SettingsError(
                f"CLIENT_TLS_CERT_FILE={cert} and CLIENT_TLS_KEY_FILE={key} are not a usable pair: {_reason(exc)}"
            ) from exc


def _reason(exc: Exception) -> str:
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())


class FailureLimit:
    """Failed logins per client address within a sliding window, in this process."""

    def __init__(self, max_failures: int, window_s: float) -> None:
        self.max_failures, self.window_s = max_failures, window_s
        self._failures: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0 when it may now."""
        now = time.monotonic()
        with self._lock:
            times = self._failures.get(address)
            while times and times[0] <= now - self.window_s:
                times.popleft()
            if not times or len(times) < self.max_failures:
                return 0.0
            return times[-self.max_failures] + self.window_s - now

    def record(self, address: str) -> None:
        with self._lock:
            self._failures.setdefault(address, collections.deque(maxlen=self.max_failures)).append(time.monotonic())
            self._failures.move_to_end(address)
            while len(self._failures) > MAX_TRACKED_ADDRESSES:  # bounded memory against address spraying
                self._failures.popitem(last=False)

    def clear(self, address: str) -> None:
        with self._lock:
            self._failures.pop(address, None)


class Login:
    """The configured user and password file, and the sessions signed with a key derived from that password."""

    def __init__(self, *, user: str, password_file: str, session_hours: float, secure: bool) -> None:
        self.user, self.password_file, self.secure = user, password_file, secure
        self.session_s = session_hours * 3600
        self._file_identity: tuple[int, ...] | None = None
        self._password_digest = b""
        self._serializer: URLSafeSerializer | None = None
        self._lock = threading.Lock()

    def _current(self) -> tuple[bytes, URLSafeSerializer]:
        """The password's digest and the session serializer, re-derived whenever the file changes."""
        try:
            stat = os.stat(self.password_file)
            identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            with self._lock:
                if identity != self._file_identity or self._serializer is None:
                    password = read_password(self.password_file).encode()
                    if not password:
                        raise ValueError("empty")
                    key = hashlib.scrypt(
                        password, salt=b"dinops-client session\0" + self.user.encode(), n=2**14, r=8, p=1
                    )
                    self._password_digest = hashlib.sha256(password).digest()
                    self._serializer = URLSafeSerializer(key, salt="dinops-client-session")
                    self._file_identity = identity
                return self._password_digest, self._serializer
        except (OSError, ValueError) as exc:
            log.error("CLIENT_PASSWORD_FILE=%s is unusable (%s): every login is refused", self.password_file, exc)
            raise ServiceUnavailable("The login is unavailable: the client's password file cannot be read.") from None

    def check(self, user: str, password: str) -> bool:
        """Constant time in the content of both fields (their digests are compared, both of them always)."""
        digest, _ = self._current()
        user_ok = hmac.compare_digest(
            hashlib.sha256(user.encode()).digest(), hashlib.sha256(self.user.encode()).digest()
        )
        password_ok = hmac.compare_digest(hashlib.sha256(password.encode()).digest(), digest)
        return user_ok & password_ok

    def token(self, issued_at: float | None = None) -> str:
        return self._current()[1].dumps({"user": self.user, "at": int(time.time() if issued_at is None else issued_at)})

    def session(self, token: str | None) -> str:
        """``valid``, ``expired`` or ``none`` (no cookie, a forged one, or one signed with another password)."""
        if not token:
            return "none"
        try:
            payload = self._current()[1].loads(token)
        except BadSignature:
            return "none"
        if not isinstance(payload, dict) or payload.get("user") != self.user or not isinstance(payload.get("at"), int):
            return "none"
        age = time.time() - payload["at"]
        return "valid" if -60 <= age < self.session_s else "expired"


def init_app(app) -> None:
    """Attach the login when a password file is configured; the same-origin check on POSTs applies always."""
    for name, default in LIMITS.items():
        app.config.setdefault(name, default)
    config = app.config
    if config["PASSWORD_FILE"]:
        app.extensions["login"] = Login(
            user=config["USER"],
            password_file=config["PASSWORD_FILE"],
            session_hours=config["SESSION_HOURS"],
            secure=bool(config["TLS_CERT_FILE"]),
        )
        app.extensions["login_failures"] = FailureLimit(config["LOGIN_MAX_FAILURES"], config["LOGIN_FAILURE_WINDOW_S"])
    app.register_blueprint(bp)


def _secure_cookie(login: Login | None) -> bool:
    """The client serves TLS, or this request came over HTTPS (the scheme a trusted proxy forwarded, see app.py)."""
    return bool(login and login.secure) or request.is_secure


def _from_loopback() -> bool:
    """The connection itself comes from loopback (before ProxyFix) and no proxy forwarded it: a process in the client's
    own container or pod, such as Docker's HEALTHCHECK."""
    address = request.environ.get("werkzeug.proxy_fix.orig", request.environ).get("REMOTE_ADDR") or ""
    try:
        loopback = ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
    return loopback and "X-Forwarded-For" not in request.headers


def may_see_details() -> bool:
    """Whether the probes may say more than ready or alive: always without a login; with one, to a logged-in caller
    or one on loopback. Never for an anonymous caller from elsewhere (the API's state names the checkpoint)."""
    login: Login | None = current_app.extensions.get("login")
    if login is None or _from_loopback():
        return True
    try:
        return login.session(request.cookies.get(COOKIE)) == "valid"
    except ServiceUnavailable:  # the password file is gone: no session is valid
        return False


def _same_origin() -> bool:
    origin = request.headers.get("Origin")
    if origin is not None:
        return origin == f"{request.scheme}://{request.host}"
    return request.headers.get("Sec-Fetch-Site", "same-origin") in {"same-origin", "none"}


@bp.before_app_request
def require_login():
    if request.method == "POST" and not _same_origin():
        raise Forbidden("This request came from another site; it was refused.")
    login: Login | None = current_app.extensions.get("login")
    if login is None or request.endpoint in OPEN_ENDPOINTS:
        return None
    if request.endpoint == "static" and (request.view_args or {}).get("filename") in OPEN_STATIC:
        return None
    state = login.session(request.cookies.get(COOKIE))
    if state == "valid":
        return None
    if request.path.startswith("/api/"):  # nothing is forwarded, so the API token goes nowhere
        message = "Your session has expired; log in again." if state == "expired" else "Log in first."
        response = jsonify(error=message, login=True)
        response.status_code = 401
        return response
    return redirect(url_for("auth.login", expired=1 if state == "expired" else None), 303)


def _form(status: int, error: str | None = None, message: str | None = None, retry_after: float | None = None):
    response = current_app.make_response((render_template("login.html", error=error, message=message), status))
    if retry_after is not None:
        response.headers["Retry-After"] = str(math.ceil(retry_after))
    return response


@bp.route("/login", methods=["GET", "POST"])
def login():
    login: Login | None = current_app.extensions.get("login")
    if login is None:
        return redirect(url_for("ui.index"), 303)
    if request.method == "GET":
        if request.args.get("expired"):
            return _form(200, message="Your session has expired; log in again.")
        return _form(200, message="You are logged out." if request.args.get("logged_out") else None)
    failures: FailureLimit = current_app.extensions["login_failures"]
    address = request.remote_addr or "unknown"
    wait = failures.retry_after(address)
    if wait > 0:
        minutes = math.ceil(wait / 60)
        error = f"Too many failed logins from your address; try again in {minutes} minute{'s' * (minutes != 1)}."
        return _form(429, error=error, retry_after=wait)
    if not login.check(request.form.get("user", ""), request.form.get("password", "")):
        failures.record(address)
        log.warning("failed login from %s", address)
        time.sleep(current_app.config["LOGIN_FAILURE_DELAY_S"])
        return _form(401, error="Wrong user name or password.")
    failures.clear(address)
    response = redirect(url_for("ui.index"), 303)
    response.set_cookie(
        COOKIE,
        login.token(),
        max_age=math.ceil(login.session_s),
        path=request.script_root or "/",
        secure=_secure_cookie(login),
        httponly=True,
        samesite="Strict",
    )
    return response


@bp.post("/logout")
def logout():
    response = redirect(url_for("auth.login", logged_out=1), 303)
    login: Login | None = current_app.extensions.get("login")
    response.delete_cookie(
        COOKIE, path=request.script_root or "/", secure=_secure_cookie(login), httponly=True, samesite="Strict"
    )
    return response
