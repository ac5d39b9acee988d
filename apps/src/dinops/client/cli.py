"""`dinops client`: the web client under gunicorn.

Upload an image (drag and drop or file picker); the page sends it to this server, which forwards it (kept in
memory, never written to disk) to the inference API at DINO_API_URL, and draws the boxes. A slider filters
them by score without sending the image again. Every option is also an environment variable
(flag > environment > default); THRESHOLD's old misspelling TRESHOLD still works, with a warning.

With --password-file the page and /api/detect need a login; with --tls-cert-file and --tls-key-file gunicorn serves
HTTPS. --public true (a client published beyond loopback) refuses to start without both.
"""

from __future__ import annotations

import argparse
import sys

from dinops import logs
from dinops.client.auth import check_settings
from dinops.client.settings import ENV_PREFIXES, SETTINGS
from dinops.serve.cli import run_gunicorn
from dinops.settings import SettingsError, add_arguments, resolve_from_env


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dinops client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, SETTINGS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        resolve_from_env(args, SETTINGS, ENV_PREFIXES, "dinops client")
        config = {s.dest.upper(): getattr(args, s.dest) for s in SETTINGS}
        check_settings(config)  # a public client without a login and TLS never starts
    except SettingsError as exc:
        print(f"dinops client: {exc}", file=sys.stderr)
        return 2
    logs.configure(args.log_level, args.log_format)
    tls = {"certfile": args.tls_cert_file, "keyfile": args.tls_key_file} if args.tls_cert_file else {}

    def app_factory():
        from dinops.client.app import create_app

        return create_app(config)

    run_gunicorn(
        app_factory,
        {
            "bind": args.bind,
            "workers": args.workers,
            "worker_class": "gthread",
            "threads": args.threads,
            "timeout": int(args.api_timeout_s) + 30,
            "accesslog": "-",
            "errorlog": "-",
            "loglevel": args.log_level,
            "logconfig_dict": logs.logging_config(
                args.log_level, args.log_format, ("gunicorn.error", "gunicorn.access")
            ),
            "proc_name": "dinops-client",
            # gunicorn itself believes X-Forwarded-Proto from 127.0.0.1 and ::1 by default: no peer here, the app
            # alone decides (CLIENT_PROXY_HOPS, werkzeug's ProxyFix)
            "forwarded_allow_ips": "",
            **tls,
        },
    )
    return 0
