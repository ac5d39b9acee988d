"""One table of settings per app: flag, environment variable, default, help.

Each app declares its settings once as a tuple of :class:`Setting`. The same table builds the argparse
parser, resolves environment variables, renders the README table (``markdown_table``) and lets tests check
that manifests and images use only names the app reads. Precedence, documented once for every app:

    command-line flag  >  environment variable  >  default

Environment variables that start with an app's prefix but are not in its table are an error, not silence
(``check_unknown_env``): a misspelt setting in a manifest must fail the pod, not be ignored.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Kubernetes injects <SERVICE>_SERVICE_HOST, <SERVICE>_PORT_8000_TCP... for every Service in the namespace; they
# are not settings, so a Service whose name starts like an app's prefix must not trip the unknown-variable check.
_SERVICE_LINK = re.compile(
    r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_[A-Z]+)?)?)$"
)


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the flag and the variable."""


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected a boolean (true/false/1/0/yes/no/on/off), got {text!r}")


def fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must lie between 0 and 1, got {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must not be negative, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be positive, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"must not be negative, got {value}")
    return value


@dataclass(frozen=True)
class Setting:
    """One setting. ``dest`` is the attribute name; ``flag`` and ``env`` default from it."""

    dest: str
    default: Any
    help: str
    type: Callable[[str], Any] = str
    env: str | None = None
    flag: str | None = None
    choices: tuple[Any, ...] | None = None
    aliases: tuple[str, ...] = field(default=())  # deprecated env names still accepted, with a warning

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.dest.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, table: Iterable[Setting]) -> None:
    """Add one flag per setting. Flags default to None so that resolution can tell 'not given' apart."""
    for s in table:
        kwargs: dict[str, Any] = {
            "dest": s.dest,
            "default": None,
            "help": f"{s.help} (env {s.env}, default {s.default!r})",
        }
        if s.type is bool:
            kwargs["type"] = parse_bool
            kwargs["metavar"] = "BOOL"
        else:
            kwargs["type"] = s.type
        if s.choices:
            kwargs["choices"] = s.choices
        parser.add_argument(s.flag_name, **kwargs)


def resolve(
    namespace: argparse.Namespace,
    table: Iterable[Setting],
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> argparse.Namespace:
    """Fill every setting left unset on the command line from the environment, then from its default."""
    environ = os.environ if environ is None else environ
    for s in table:
        if getattr(namespace, s.dest, None) is not None:
            continue
        value: Any = s.default
        for name in ((s.env,) if s.env else ()) + s.aliases:
            if name in environ:
                raw = environ[name]
                if name != s.env and warn is not None:
                    warn(f"environment variable {name} is deprecated; use {s.env}")
                try:
                    value = parse_bool(raw) if s.type is bool else s.type(raw)
                except (TypeError, ValueError) as exc:
                    raise SettingsError(f"{name}={raw!r} is not valid for {s.flag_name}: {exc}") from exc
                if s.choices and value not in s.choices:
                    raise SettingsError(f"{name}={raw!r} must be one of {', '.join(map(str, s.choices))}")
                break
        setattr(namespace, s.dest, value)
    return namespace


def check_unknown_env(
    table: Iterable[Setting], prefixes: Iterable[str], environ: Mapping[str, str] | None = None
) -> None:
    """Fail on environment variables that carry the app's prefix but that the app does not read."""
    environ = os.environ if environ is None else environ
    known = env_names(table)
    prefixes = tuple(prefixes)
    unknown = sorted(k for k in environ if k.startswith(prefixes) and k not in known and not _SERVICE_LINK.match(k))
    if unknown:
        raise SettingsError(
            "unknown setting(s) in the environment: " + ", ".join(unknown) + "; known: " + ", ".join(sorted(known))
        )


def without_service_links(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not _SERVICE_LINK.match(k)}


def resolve_from_env(args: argparse.Namespace, table: Iterable[Setting], prefixes: Iterable[str], prog: str) -> None:
    """Check and resolve ``args`` against the process environment (Kubernetes service links ignored); deprecated
    names warn on stderr. Raises :class:`SettingsError` for unknown or invalid variables."""
    environ = without_service_links(os.environ)
    check_unknown_env(table, prefixes, environ)
    resolve(args, table, environ, warn=lambda message: print(f"{prog}: {message}", file=sys.stderr))


def env_names(table: Iterable[Setting]) -> set[str]:
    names: set[str] = set()
    for s in table:
        names.update(((s.env,) if s.env else ()) + s.aliases)
    return names


def markdown_table(table: Iterable[Setting]) -> str:
    rows = ["| flag | environment variable | default | meaning |", "|---|---|---|---|"]
    for s in table:
        rows.append(f"| `{s.flag_name}` | `{s.env or ''}` | `{s.default!r}` | {s.help} |")
    return "\n".join(rows)
