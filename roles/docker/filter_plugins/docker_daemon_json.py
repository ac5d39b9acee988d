"""Merge the keys dinops manages into Docker's daemon.json without touching anything else.

The file belongs to the user and to other tools (minikube rewrites it, nvidia-ctk edits it). The role owns only
the keys that ``dinops_daemon_json_managed`` returns; ``dinops_daemon_json_merge`` folds them into the current
text and reports whether the result differs. Invalid input is reported, never repaired: the caller stops the run
and the file stays as it was.
"""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError

# Keys whose value is a dict that several parties share: dinops sets its entries, others keep theirs.
MERGED_DICT_KEYS = ("runtimes", "log-opts")
# A managed key whose value is None withdraws the value dinops sets for it, and only that value: a default
# runtime someone else chose (runc, crun, kata) stays.
WITHDRAWN_VALUES = {"default-runtime": "nvidia"}
# Log drivers that understand max-size / max-file (dockerd refuses to start with them on other drivers).
ROTATING_LOG_DRIVERS = ("json-file", "local")
DEFAULT_LOG_DRIVER = "json-file"


def dinops_daemon_json_managed(options):
    """Build the managed keys from the role's settings.

    ``options`` keys: nvidia_runtime (bool), nvidia_runtime_path (str), nvidia_default_runtime (bool: true sets
    ``default-runtime: nvidia``, false withdraws it, absent leaves the key alone), default_shm_size (str, '' =
    unmanaged), log_max_size (str, '' = unmanaged), log_max_file (int, 0 = unmanaged), data_root (str, '' =
    unmanaged). Docker's keys: ``runtimes.<name>.path``/``runtimeArgs`` and ``default-runtime`` (default runc), as
    documented in https://docs.docker.com/reference/cli/dockerd/#configure-container-runtimes.
    """
    if not isinstance(options, dict):
        raise AnsibleFilterError(f"dinops_daemon_json_managed expects a dict of settings, got {type(options).__name__}")
    managed = {}
    if options.get("nvidia_runtime"):
        path = options.get("nvidia_runtime_path") or "nvidia-container-runtime"
        managed["runtimes"] = {"nvidia": {"path": path, "runtimeArgs": []}}
    if options.get("nvidia_default_runtime"):
        if not options.get("nvidia_runtime"):
            raise AnsibleFilterError(
                "default-runtime 'nvidia' needs the nvidia runtime entry: set docker_nvidia_runtime to true as well"
                " (dockerd refuses to start with a default runtime it does not know)"
            )
        managed["default-runtime"] = "nvidia"
    elif "nvidia_default_runtime" in options:
        managed["default-runtime"] = None
    if options.get("default_shm_size"):
        managed["default-shm-size"] = str(options["default_shm_size"])
    log_opts = {}
    if options.get("log_max_size"):
        log_opts["max-size"] = str(options["log_max_size"])
    if options.get("log_max_file"):
        log_opts["max-file"] = str(int(options["log_max_file"]))
    if log_opts:
        managed["log-opts"] = log_opts
    if options.get("data_root"):
        data_root = str(options["data_root"])
        if not data_root.startswith("/"):
            raise AnsibleFilterError(f"docker_data_root must be an absolute path, got {data_root!r}")
        managed["data-root"] = data_root
    return managed


def _parse(text, path):
    """Return (config, error). Empty or whitespace-only text is an empty configuration."""
    if text is None or not str(text).strip():
        return {}, ""
    try:
        config = json.loads(text)
    except ValueError as exc:
        return None, (
            f"{path} is not valid JSON ({exc}); it was left unchanged. Fix or remove the file and run again: dinops"
            " merges its keys into this file and never replaces what it cannot read."
        )
    if not isinstance(config, dict):
        return None, (
            f"{path} holds a JSON {type(config).__name__}, but dockerd expects a JSON object; it was left unchanged."
            " Fix or remove the file and run again."
        )
    return config, ""


def _refused(text, error):
    return {"valid": False, "error": error, "needs_write": False, "config": {}, "content": text or "", "notes": []}


def dinops_daemon_json_merge(text, managed, path="/etc/docker/daemon.json"):
    """Merge ``managed`` into the JSON document ``text``.

    Returns a dict: ``valid`` (bool), ``error`` (message when not valid), ``needs_write`` (bool), ``config`` (merged
    object), ``content`` (the text to write, two-space indented, key order kept), ``notes`` (list of strings for
    the user, e.g. a log rotation setting that the user's log driver cannot take).
    """
    if not isinstance(managed, dict):
        kind = type(managed).__name__
        raise AnsibleFilterError(f"dinops_daemon_json_merge expects a dict of managed keys, got {kind}")
    current, error = _parse(text, path)
    if error:
        return _refused(text, error)

    merged = json.loads(json.dumps(current))  # deep copy, keeps key order
    notes = []
    for key, value in managed.items():
        if value is None:
            if key in WITHDRAWN_VALUES and merged.get(key) == WITHDRAWN_VALUES[key]:
                del merged[key]
            continue
        if key == "log-opts":
            driver = merged.get("log-driver", DEFAULT_LOG_DRIVER)
            if driver not in ROTATING_LOG_DRIVERS:
                notes.append(
                    f"log rotation not applied: log-driver {driver!r} does not take max-size/max-file"
                    f" (only {', '.join(ROTATING_LOG_DRIVERS)} do)"
                )
                continue
        if key in MERGED_DICT_KEYS and isinstance(value, dict):
            existing = merged.get(key)
            if existing is not None and not isinstance(existing, dict):
                found = json.dumps(existing)
                return _refused(text, f"{path}: key {key!r} must be a JSON object, found {found}; left unchanged.")
            combined = dict(existing or {})
            combined.update(value)
            merged[key] = combined
        else:
            merged[key] = value

    needs_write = merged != current or not (text or "").strip()
    content = json.dumps(merged, indent=2) + "\n" if needs_write else text
    return {
        "valid": True,
        "error": "",
        "needs_write": needs_write,
        "config": merged,
        "content": content,
        "notes": notes,
    }


class FilterModule:
    """Docker daemon.json filters."""

    def filters(self):
        return {
            "dinops_daemon_json_managed": dinops_daemon_json_managed,
            "dinops_daemon_json_merge": dinops_daemon_json_merge,
        }
