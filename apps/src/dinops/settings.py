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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the flag and the variable."""


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected a boolean (true/false/1/0/yes/no/on/off), got {text!r}")


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
    known = set()
    for s in table:
        known.update(((s.env,) if s.env else ()) + s.aliases)
    prefixes = tuple(prefixes)
    unknown = sorted(k for k in environ if k.startswith(prefixes) and k not in known)
    if unknown:
        raise SettingsError(
            "unknown setting(s) in the environment: " + ", ".join(unknown) + "; known: " + ", ".join(sorted(known))
        )


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
