"""`dinops serve`: the DINO inference API under gunicorn.

Every option below is also an environment variable (flag > environment > default). gunicorn runs
``--workers`` processes with ``--threads`` request threads each; each worker builds its own model after the
fork (the master never loads torch's CUDA state) and batches the requests of its threads. One worker per GPU.

With --wait-for-model (DINO_WAIT_FOR_MODEL=true) a checkpoint that does not exist yet is not an error: the API
starts, /healthz says "model": "waiting", /readyz and the detection endpoints answer 503 until the file appears
and has been loaded. --reload (DINO_RELOAD; auto: on with --wait-for-model) follows the file afterwards: a
checkpoint that training replaces is loaded in the background and swapped in; /healthz says which one is in use.

Endpoints: POST /v1/detect, POST /inference (the original service's contract), GET /healthz, /readyz,
/metrics, /openapi.json; KServe V1 (/v1/models/<name>:predict) and the Open Inference Protocol V2
(/v2/models/<name>/infer, with the binary tensor data extension), <name> being --model-name. docs/api.md has them all.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from dinops import logs, s3
from dinops.serve.settings import ENV_PREFIXES, SETTINGS
from dinops.settings import SettingsError, add_arguments, resolve_from_env

log = logging.getLogger("dinops.serve")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dinops serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, SETTINGS)
    return parser


def gunicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "bind": args.bind,
        "workers": args.workers,
        "worker_class": "gthread",
        "threads": args.threads,
        "preload_app": False,  # the model, and CUDA, belong in the workers
        "timeout": max(120, int(args.request_timeout_s) + 30),  # model loading happens in a thread; this is slack
        "graceful_timeout": 30,
        "keepalive": 5,
        "accesslog": "-",
        "errorlog": "-",
        "loglevel": args.log_level,
        "logconfig_dict": logs.logging_config(args.log_level, args.log_format, ("gunicorn.error", "gunicorn.access")),
        "proc_name": "dinops-serve",
    }


def run_gunicorn(app_factory, options: dict[str, Any]) -> None:
    from gunicorn.app.base import BaseApplication

    class Server(BaseApplication):
        def load_config(self) -> None:
            for key, value in options.items():
                self.cfg.set(key, value)
            if "control_socket_disable" in self.cfg.settings:  # gunicorn >= 24: no socket in $HOME (read-only)
                self.cfg.set("control_socket_disable", True)
            if os.path.isdir("/dev/shm"):  # worker heartbeats in memory, not on a read-only or slow /tmp
                self.cfg.set("worker_tmp_dir", "/dev/shm")

        def load(self):  # runs in each worker, after the fork
            return app_factory()

    Server().run()


def s3_checkpoint_usable(args: argparse.Namespace) -> bool:
    """Before forking: the URL, the endpoint, the credentials and the object (a missing one only with
    --wait-for-model) checked with one request; False after saying why on stderr."""
    from dinops.serve.s3_checkpoint import S3Checkpoint

    try:
        found = S3Checkpoint(args.checkpoint, args.s3_endpoint, args.s3_cache_dir).identity()
    except s3.S3Error as exc:
        print(f"dinops serve: --checkpoint (DINO_CHECKPOINT) {args.checkpoint}: {exc}", file=sys.stderr)
        return False
    if found is None and not args.wait_for_model:
        print(f"dinops serve: --checkpoint (DINO_CHECKPOINT) {args.checkpoint}: no such object", file=sys.stderr)
        return False
    if found is None:
        log.warning(
            "checkpoint %s does not exist yet: serving, waiting for a model (DINO_WAIT_FOR_MODEL)", args.checkpoint
        )
    return True


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        # The model reads DINO_DEFORM_ATTN itself: accepted and checked here, imported here only (the web client
        # imports this module for run_gunicorn and must not import torch).
        from dinops.model.ms_deform_attn_core import DEFORM_ATTN

        resolve_from_env(args, (*SETTINGS, DEFORM_ATTN), ENV_PREFIXES, "dinops serve")
    except SettingsError as exc:
        print(f"dinops serve: {exc}", file=sys.stderr)
        return 2
    logs.configure(args.log_level, args.log_format)
    if s3.is_s3_url(args.checkpoint) and not s3_checkpoint_usable(args):
        return 2
    for name in ("checkpoint", "config", "class_names"):
        value = getattr(args, name)
        if name == "checkpoint" and s3.is_s3_url(value):
            continue
        if name == "checkpoint" and args.wait_for_model:
            if value and not Path(value).is_file():
                log.warning(
                    "checkpoint %s does not exist yet: serving, waiting for a model (DINO_WAIT_FOR_MODEL)", value
                )
            continue
        if value and not Path(value).is_file():
            env = next(s.env for s in SETTINGS if s.dest == name)
            print(f"dinops serve: --{name.replace('_', '-')} ({env}) {value}: no such file", file=sys.stderr)
            return 2
    if not args.checkpoint:
        print("dinops serve: no checkpoint: set DINO_CHECKPOINT or --checkpoint to a .pth file", file=sys.stderr)
        return 2
    config = {s.dest.upper(): getattr(args, s.dest) for s in SETTINGS}

    def app_factory():
        from dinops.serve.app import create_app

        app = create_app(config)
        app.extensions["dino"].start()
        return app

    run_gunicorn(app_factory, gunicorn_options(args))
    return 0
