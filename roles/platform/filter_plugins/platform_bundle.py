"""The manifest bundle: what a connected machine fetched, described by bundle.json, checked before it is used.

``dinops_platform_components``      the components the switches turn on, in installation order.
``dinops_platform_sources``         each file of the enabled components, with its kustomize target or URL.
``dinops_platform_bundle_manifest`` bundle.json for the files just fetched into a bundle directory.
``dinops_platform_bundle_check``    what is wrong with a bundle directory for the pinned releases (empty: usable).

bundle.json::

    {"format": 1,
     "files": [{"component": "katib", "version": "v0.19.0", "bundled": {},
                "source": "https://github.com/kubeflow/katib.git/...?ref=v0.19.0",
                "path": "katib/katib-standalone.yaml", "sha256": "<hex>"}, ...]}

A bundle is refused when an enabled component is missing, when its version (or a release it bundles, JobSet in
Trainer's) differs from the pin in roles/platform/vars/main.yml, or when a file is missing or its sha256 differs.
Files are read at their pinned paths (``<component>/<file>``), never at a path bundle.json names. The sha256
protects the copy to the air-gapped side; it cannot vouch for what was downloaded (the release assets publish no
checksum of their own).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

BUNDLE_FORMAT = 1
BUNDLE_FILE = "bundle.json"
REMAKE = "make a bundle of the pinned versions with playbooks/platform_bundle.yml on a connected machine"


class BundleError(ValueError):
    """Settings the role cannot use; the message names the variable."""


def components(releases: dict[str, Any], switches: dict[str, Any]) -> list[str]:
    """The enabled components in the order of platform_releases (cert-manager before KServe)."""
    unknown = sorted(set(switches or {}) - set(releases or {}))
    if unknown:
        raise BundleError(f"no pinned release for {', '.join(unknown)} (roles/platform/vars/main.yml)")
    return [name for name in releases if bool((switches or {}).get(name))]


def sources(releases: dict[str, Any], enabled: list[str]) -> list[dict[str, str]]:
    """Each file of the enabled components: {component, file, path (in the bundle), kustomize | url}."""
    result = []
    for name in enabled:
        for source in releases[name]["sources"]:
            entry = {"component": name, "file": source["file"], "path": f"{name}/{source['file']}"}
            entry.update({key: source[key] for key in ("kustomize", "url") if source.get(key)})
            result.append(entry)
    return result


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _source(entry: dict[str, Any]) -> str:
    return str(entry.get("kustomize") or entry.get("url") or "")


def bundle_manifest(bundle_dir: str, releases: dict[str, Any], enabled: list[str]) -> dict[str, Any]:
    """bundle.json for the enabled components' files, which must be in ``bundle_dir`` already."""
    root = Path(bundle_dir)
    files = []
    for name in enabled:
        release = releases[name]
        for source in release["sources"]:
            relative = f"{name}/{source['file']}"
            path = root / relative
            if not path.is_file():
                raise BundleError(f"the bundle in {bundle_dir} lacks {relative} (from {_source(source)})")
            files.append(
                {
                    "component": name,
                    "version": release["version"],
                    "bundled": dict(release.get("bundled") or {}),
                    "source": _source(source),
                    "path": relative,
                    "sha256": _sha256(path),
                }
            )
    return {"format": BUNDLE_FORMAT, "files": files}


def _read_manifest(root: Path) -> tuple[dict[str, Any] | None, str | None]:
    path = root / BUNDLE_FILE
    if not root.is_dir():
        return None, f"{root} is not a directory"
    if not path.is_file():
        return None, f"{path} does not exist"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return None, f"{path} is not JSON: {error}"
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        return None, f"{path} is not a bundle.json of format {BUNDLE_FORMAT}"
    if not isinstance(manifest.get("files"), list) or not all(isinstance(f, dict) for f in manifest["files"]):
        return None, f"{path} has no list of files"
    return manifest, None


def bundle_check(bundle_dir: str, releases: dict[str, Any], enabled: list[str]) -> list[str]:
    """Every reason ``bundle_dir`` cannot serve the enabled components at the pinned versions; empty when it can.
    Only the enabled components' files are read: a full bundle serves a smaller set."""
    root = Path(str(bundle_dir or ""))
    if not str(bundle_dir or "").strip():
        return ["platform_bundle_dir is empty"]
    manifest, error = _read_manifest(root)
    if error:
        return [f"{error}: {REMAKE}"]
    entries: dict[str, list[dict[str, Any]]] = {}
    for entry in manifest["files"]:
        entries.setdefault(str(entry.get("component")), []).append(entry)
    problems = []
    for name in enabled:
        release = releases[name]
        found = entries.get(name, [])
        if not found:
            problems.append(f"the bundle in {root} holds no {name} (it was made without it): {REMAKE}")
            continue
        versions = sorted({str(entry.get("version")) for entry in found})
        if versions != [release["version"]]:
            problems.append(
                f"the bundle in {root} holds {name} {', '.join(versions)}, this role pins {release['version']} "
                f"(roles/platform/vars/main.yml): {REMAKE}"
            )
            continue
        for entry in found:
            bundled = entry.get("bundled") or {}
            if bundled != (release.get("bundled") or {}):
                problems.append(
                    f"the bundle in {root} holds {name} with {json.dumps(bundled, sort_keys=True)}, this role pins "
                    f"{json.dumps(release.get('bundled') or {}, sort_keys=True)}: {REMAKE}"
                )
        by_path = {str(entry.get("path")): entry for entry in found}
        for source in release["sources"]:
            relative = f"{name}/{source['file']}"
            entry = by_path.get(relative)
            if entry is None:
                problems.append(f"the bundle in {root} lists no {relative} ({_source(source)}): {REMAKE}")
                continue
            # Looked up by the pinned path (component/file): a bundle cannot point the role at another file.
            path = root / relative
            if not path.is_file():
                problems.append(f"{path} is listed in {root / BUNDLE_FILE} but missing")
            elif _sha256(path) != str(entry.get("sha256", "")).lower():
                problems.append(
                    f"{path} does not match its sha256 in {root / BUNDLE_FILE} (changed or truncated in transit): "
                    "copy the bundle again"
                )
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_platform_components": components,
            "dinops_platform_sources": sources,
            "dinops_platform_bundle_manifest": bundle_manifest,
            "dinops_platform_bundle_check": bundle_check,
        }
