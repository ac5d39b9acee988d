"""Decide whether containerd reads the toolkit's drop-in, and write the drop-in it can safely read.

``dinops_containerd_nvidia_dropin`` is pure (tested in tests/ansible/test_nvidia_container_toolkit_containerd.py).
The containerd behaviour it relies on:

- containerd reads the drop-in only when a loaded file names it in ``imports``: the daemon loads config.toml only
  when it exists and follows each loaded file's own ``imports`` (containerd@v2.2.0
  cmd/containerd/command/main.go:133-139, cmd/containerd/server/config/config.go:325). The
  ``/etc/containerd/conf.d/*.toml`` import that containerd 2.2 added to its default configuration (containerd PR
  #12323) appears in ``containerd config default`` output, not in a running daemon without config.toml.
- containerd 1.x replaces a plugin's whole table with the imported one (containerd@v1.7.27
  services/server/config/config.go:305-308, containerd#5837): a drop-in holding only the nvidia runtime would
  wipe the CRI settings of config.toml (SystemdCgroup, sandbox image, registries). containerd 2.0 merges plugin
  tables key by key (containerd PR #9982; containerd@v2.0.0 cmd/containerd/server/config/config.go:432-445).
- A file is merged at its own ``version``; the drop-in takes config.toml's, whose CRI runtime plugin is
  ``io.containerd.grpc.v1.cri`` (version 2) or ``io.containerd.cri.v1.runtime`` (version 3).
- Docker's containerd.io ships a config.toml with ``disabled_plugins = ["cri"]``: no Kubernetes runtime there.

The runtime entry copies the options of config.toml's default runtime (else runc, else crun) and sets
``options.BinaryName``, as ``nvidia-ctk runtime configure --runtime=containerd`` does (nvidia-container-toolkit@v1.17.8
pkg/config/engine/containerd/config.go, AddRuntime; pkg/config/engine/engine.go, GetLowLevelRuntimes), so that
``SystemdCgroup = true`` carries over to pods with runtimeClassName nvidia.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re

import tomllib
from ansible.errors import AnsibleFilterError

CRI_RUNTIME_PLUGINS = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
# Names under which disabled_plugins switches the CRI plugin off.
CRI_PLUGIN_NAMES = {"cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"}
LOW_LEVEL_RUNTIMES = ("runc", "crun")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def containerd_major(version_output):
    """Return containerd's major version from ``containerd --version``, or None when it cannot be read.

    "containerd containerd.io 1.7.27 05044ec..." (Docker), "containerd github.com/containerd/containerd/v2 v2.1.4
    75cb2b7..." (upstream), "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1" (Debian 12).
    """
    fields = str(version_output or "").split()
    if len(fields) < 3 or fields[0] != "containerd":
        return None
    match = _VERSION.match(fields[2])
    return int(match.group(1)) if match else None


def _imports_path(imports, config_path, path):
    """True when one of config.toml's imports (relative to its directory, '*' within one directory) names path."""
    for pattern in imports or []:
        absolute = posixpath.normpath(posixpath.join(posixpath.dirname(config_path), str(pattern)))
        parts, wanted = absolute.split("/"), posixpath.normpath(path).split("/")
        if len(parts) == len(wanted) and all(fnmatch.fnmatchcase(w, p) for w, p in zip(wanted, parts, strict=True)):
            return True
    return False


def _toml_key(key):
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _toml_value(value):
    if isinstance(value, (bool, int, float, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise AnsibleFilterError(f"cannot write {value!r} to the containerd drop-in (only scalars and lists)")


def _toml(table, path=()):
    """Render nested dicts as TOML: scalars first, then one [header] per sub-table (what tomllib reads back)."""
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for key, value in table.items():
        if isinstance(value, dict):
            header = ".".join(_toml_key(part) for part in (*path, key))
            scalars = any(not isinstance(v, dict) for v in value.values())
            block = _toml(value, (*path, key))
            lines += (["", f"[{header}]"] if scalars or not value else []) + block
    return lines


def _runtime_entry(config, plugin, runtime_path):
    """The nvidia runtime: a copy of the default (else runc, else crun) runtime with BinaryName set."""
    cri = (config.get("plugins") or {}).get(plugin) or {}
    runtimes = (cri.get("containerd") or {}).get("runtimes") or {}
    default = str((cri.get("containerd") or {}).get("default_runtime_name") or "")
    candidates = ([default] if default and not default.startswith("nvidia") else []) + list(LOW_LEVEL_RUNTIMES)
    source = next((name for name in candidates if isinstance(runtimes.get(name), dict)), None)
    entry = json.loads(json.dumps(runtimes[source])) if source else {"runtime_type": "io.containerd.runc.v2"}
    entry.setdefault("options", {})["BinaryName"] = runtime_path
    return entry, source


def dinops_containerd_nvidia_dropin(config_text, version_output, config_path, dropin_path, runtime_path):
    """Decide what to do with the drop-in.

    ``config_text``: containerd's config.toml at ``config_path`` ('' when missing); ``version_output``:
    ``containerd --version`` ('' when containerd is missing). Returns ``{write, imported, reason, content}``:
    ``imported`` says whether containerd reads ``dropin_path`` (a change to it needs a restart), ``content`` is the
    TOML to write when ``write``.
    """
    if not config_path or not dropin_path or not runtime_path:
        raise AnsibleFilterError("dinops_containerd_nvidia_dropin needs the config, drop-in and runtime paths")

    def plan(write, imported, reason, content=""):
        return {"write": write, "imported": imported, "reason": reason, "content": content}

    if not str(config_text or "").strip():
        return plan(False, False, f"no {config_path}: containerd runs on built-in defaults, which import no drop-in")
    try:
        config = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as exc:
        return plan(False, False, f"{config_path} is not valid TOML ({exc}); containerd cannot start with it")
    disabled = sorted(CRI_PLUGIN_NAMES.intersection(config.get("disabled_plugins") or []))
    if disabled:
        return plan(
            False,
            False,
            f"containerd's CRI plugin is disabled in {config_path} ({', '.join(disabled)}, as in Docker's"
            " containerd.io): there is no Kubernetes runtime to register",
        )
    if not _imports_path(config.get("imports"), config_path, dropin_path):
        return plan(False, False, f"{config_path} does not import {dropin_path}: containerd would not read it")
    major = containerd_major(version_output)
    if major is None:
        return plan(
            False,
            True,
            f"cannot read containerd's version from {str(version_output or '').strip()!r}: the drop-in is only"
            " safe from containerd 2.0 on",
        )
    if major < 2:
        return plan(
            False,
            True,
            f"containerd {major}.x replaces the CRI plugin's whole table with an imported one (containerd#5837),"
            f" so a drop-in would drop the CRI settings of {config_path}: run `nvidia-ctk runtime configure"
            " --runtime=containerd` to edit that file instead",
        )
    version = config.get("version")
    if version not in CRI_RUNTIME_PLUGINS:
        return plan(False, True, f"{config_path} has config version {version!r}; the drop-in supports 2 and 3")
    plugin = CRI_RUNTIME_PLUGINS[version]
    runtime, source = _runtime_entry(config, plugin, runtime_path)
    dropin = {"version": version, "plugins": {plugin: {"containerd": {"runtimes": {"nvidia": runtime}}}}}
    content = "\n".join(_toml(dropin)).strip() + "\n"
    copied = f"the options of runtime {source!r}" if source else "runc's default options"
    return plan(True, True, f"containerd {major}.x imports {dropin_path}: nvidia runtime with {copied}", content)


class FilterModule:
    """containerd drop-in filter."""

    def filters(self):
        return {"dinops_containerd_nvidia_dropin": dinops_containerd_nvidia_dropin}
