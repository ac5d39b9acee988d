"""Structured logs: one JSON object per line (or plain text), shared by the serve, client and download apps."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

# Attributes every LogRecord has; anything else was passed through ``extra=`` and is logged as a field.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def logging_config(level: str = "info", fmt: str = "json", loggers: tuple[str, ...] = ()) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` mapping: one stderr handler, the root and ``loggers`` at ``level``."""
    formatter = {"()": JsonFormatter} if fmt == "json" else {"format": TEXT_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {name: {"level": level.upper(), "handlers": ["stderr"], "propagate": False} for name in loggers},
    }


def configure(level: str = "info", fmt: str = "json") -> None:
    import logging.config

    logging.config.dictConfig(logging_config(level, fmt))
