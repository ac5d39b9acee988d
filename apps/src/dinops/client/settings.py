"""Settings of the web client (`dinops client`). ``THRESHOLD`` keeps the original service's name; its old
misspelling ``TRESHOLD`` is still read, with a deprecation warning. The login and TLS settings are checked together
at start-up by :func:`dinops.client.auth.check_settings`."""

from __future__ import annotations

from dinops.settings import Setting, fraction, non_negative_int, positive_float, positive_int

ENV_PREFIXES = ("CLIENT_", "DINO_API_")


SETTINGS: tuple[Setting, ...] = (
    Setting("api_url", "http://127.0.0.1:8000", "base URL of the inference API", env="DINO_API_URL"),
    Setting(
        "api_token",
        "",
        "bearer token sent to the API (if it requires one); with a login, only for logged-in callers",
        env="DINO_API_TOKEN",
    ),
    Setting(
        "api_timeout_s", 30.0, "how long to wait for the API's answer", type=positive_float, env="DINO_API_TIMEOUT_S"
    ),
    Setting(
        "threshold", 0.3, "initial position of the score slider", type=fraction, env="THRESHOLD", aliases=("TRESHOLD",)
    ),
    Setting(
        "max_detections",
        100,
        "detections asked from the API per image",
        type=positive_int,
        env="CLIENT_MAX_DETECTIONS",
    ),
    Setting("max_upload_mb", 10.0, "largest image accepted, in MiB", type=positive_float, env="CLIENT_MAX_UPLOAD_MB"),
    Setting("bind", "0.0.0.0:8080", "address:port to listen on", env="CLIENT_BIND"),
    Setting(
        "public",
        False,
        "published on a non-loopback address: refuse to start without a password file and a TLS certificate and key",
        type=bool,
        env="CLIENT_PUBLIC",
    ),
    Setting(
        "proxy_hops",
        0,
        "reverse proxies in front of the client whose X-Forwarded-For, -Proto and -Host it believes (behind the "
        "ingress: 1); 0: those headers are ignored",
        type=non_negative_int,
        env="CLIENT_PROXY_HOPS",
    ),
    Setting("user", "dinops", "user name asked by the login form", env="CLIENT_USER"),
    Setting(
        "password_file",
        "",
        "file holding the login password (one trailing newline ignored); empty: no login",
        env="CLIENT_PASSWORD_FILE",
    ),
    Setting(
        "tls_cert_file",
        "",
        "PEM certificate (chain) to serve HTTPS with; empty: plain HTTP",
        env="CLIENT_TLS_CERT_FILE",
    ),
    Setting("tls_key_file", "", "PEM private key of the TLS certificate", env="CLIENT_TLS_KEY_FILE"),
    Setting(
        "session_hours",
        12.0,
        "how long a login lasts, in hours",
        type=positive_float,
        env="CLIENT_SESSION_HOURS",
    ),
    Setting("workers", 2, "gunicorn worker processes", type=positive_int, env="CLIENT_WORKERS"),
    Setting("threads", 8, "threads per worker (each waits on one API call)", type=positive_int, env="CLIENT_THREADS"),
    Setting("log_level", "info", "log level", env="CLIENT_LOG_LEVEL", choices=("debug", "info", "warning", "error")),
    Setting(
        "log_format", "json", "json (one object per line) or text", env="CLIENT_LOG_FORMAT", choices=("json", "text")
    ),
)
