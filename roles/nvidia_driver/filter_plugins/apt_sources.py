"""Enable archive components on the apt entries that already point at Debian's archive.

apt requires every entry for one URI and suite to carry the same Signed-By: a second entry for the same mirror with
another value (or none, read after one with a value) makes every apt call fail with "Conflicting values set for
option Signed-By" (finding 4 of the GPU-host audit). So the nvidia_driver role adds no parallel source for Debian's
archive. It adds the missing components (contrib, non-free, non-free-firmware) to the entries the host already has,
in whichever form they come: one-line entries (sources.list, sources.list.d/*.list) or deb822 stanzas
(sources.list.d/*.sources), with http, https or mirror+file URIs. Their options (Signed-By, arch, trusted...) stay
as they are. Only a host with no entry for Debian's archive gets the role's own source file.

For a repository the role writes its own source for (NVIDIA's CUDA repository, ``replaced``) it is the other way
round: the role's entry, with the key it downloads, is the one; the host's other entries for that URI (NVIDIA's
cuda-keyring package writes /etc/apt/sources.list.d/cuda-<distro>-<arch>.list with
signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg; older guides a line in sources.list) are taken out, or every
apt call fails the same way (NVIDIA/cuda-repo-management#4: "Conflicting values set for option Signed-By regarding
source https://developer.download.nvidia.com/compute/cuda/repos/.../ /: /usr/share/keyrings/cuda-archive-keyring.gpg
!= ...", NVIDIA's advice: "check for and remove cuda*.list files"; finding F6 of the second hosts audit). Taken out
rather than adopted: an entry the role did not write may carry any key or none (trusted=yes), and the role would then
trust whatever it says; NVIDIA's advice is the same. A file that holds nothing else is removed; otherwise the line is
commented out, or the deb822 stanza gets ``Enabled: no`` (its other URIs stay), with a comment saying why.

``dinops_apt_components_plan`` is a pure function of the files' contents, tested with the layouts real hosts ship in
tests/ansible/test_apt_sources.py.
"""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from urllib.parse import urlsplit

# Components of Debian's archive: an entry with none of them is some other repository.
DEBIAN_COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MAIN_LIST = "/etc/apt/sources.list"
PARTS_DIR = "/etc/apt/sources.list.d"

# deb [ options ] uri suite component... # comment
ONE_LINE = re.compile(
    r"^\s*(?P<type>deb|deb-src)\s+(?:\[(?P<options>[^\]]*)\]\s+)?(?P<uri>[^\s#]+)\s+(?P<suite>[^\s#]+)"
    r"(?P<components>(?:[ \t]+[^\s#]+)*)(?P<rest>\s*(?:#.*)?)$"
)
FIELD = re.compile(r"^(?P<name>[^\s:#][^:]*):(?P<value>.*)$")


def _source_files(files):
    """The files apt reads, in apt's order: sources.list, then sources.list.d/*.list and *.sources by name."""
    parts = sorted(
        path for path in files if posixpath.dirname(path) == PARTS_DIR and path.endswith((".list", ".sources"))
    )
    return ([MAIN_LIST] if MAIN_LIST in files else []) + parts


def _one_line_entries(path, lines):
    for index, line in enumerate(lines):
        match = ONE_LINE.match(line.rstrip("\n"))
        if not match:
            continue
        options = dict(option.split("=", 1) for option in (match.group("options") or "").split() if "=" in option)
        yield {
            "file": path,
            "form": "one-line",
            "line": index,
            "insert_at": match.end("components"),
            "types": [match.group("type")],
            "uris": [match.group("uri")],
            "suites": [match.group("suite")],
            "components": match.group("components").split(),
            "enabled": True,
            "signed_by": {key.lower(): value for key, value in options.items()}.get("signed-by", ""),
        }


def _stanzas(lines):
    """Yield each deb822 stanza as {field name (lower case): (first line, last line, name as written, value)}."""
    fields, current = {}, None
    for index, line in enumerate(lines + ["\n"]):
        if not line.strip():
            if fields:
                yield fields
            fields, current = {}, None
        elif line.startswith("#"):
            continue
        elif line[0] in " \t" and current:
            first, _, name, value = fields[current]
            fields[current] = (first, index, name, value + "\n" + line.strip())
        elif match := FIELD.match(line.rstrip("\n")):
            current = match.group("name").strip().lower()
            fields[current] = (index, index, match.group("name").strip(), match.group("value").strip())


def _deb822_entries(path, lines):
    for fields in _stanzas(lines):
        value = {name: field[3] for name, field in fields.items()}
        yield {
            "file": path,
            "form": "deb822",
            "fields": fields,
            "field": fields.get("components"),
            "types": value.get("types", "").split(),
            "uris": value.get("uris", "").split(),
            "suites": value.get("suites", "").split(),
            "components": value.get("components", "").split(),
            "enabled": value.get("enabled", "yes").lower() not in ("no", "false", "0"),
            "signed_by": value.get("signed-by", ""),
        }


def _repository(uri):
    """apt's identity of a repository: http and https URIs of one host and path are the same one to apt (same
    index files, same Signed-By rule)."""
    scheme, separator, rest = uri.partition("://")
    return (rest if separator and scheme in ("http", "https") else uri).rstrip("/")


def _mirror_list_path(uri):
    """The local file a mirror+file: URI names (Debian's cloud images), or None for any other URI."""
    scheme, _, rest = uri.partition(":")
    return urlsplit("file:" + rest).path if scheme == "mirror+file" else None


def _names_debian_archive(target, mirror):
    """True for Debian's archive: the configured mirror, or any mirror whose path ends in /debian (deb.debian.org,
    cdn-aws.deb.debian.org, ftp.<cc>.debian.org, a local mirror's /debian) or a mirror list named debian.list."""
    if _repository(target) == _repository(mirror):
        return True
    name = posixpath.basename(urlsplit(target).path.rstrip("/"))
    return name in ("debian", "debian.list")


def _points_at_debian_archive(uri, mirror, files):
    mirror_list = _mirror_list_path(uri)
    if mirror_list is None:
        return _names_debian_archive(uri, mirror)
    listed = [line.split()[0] for line in files.get(mirror_list, "").splitlines() if line.strip()[:1] not in ("", "#")]
    return any(_names_debian_archive(target, mirror) for target in listed or [mirror_list])


def _with_components(entry, lines, added):
    """Return the entry's file lines with the components added to it."""
    lines = list(lines)
    if entry["form"] == "one-line":
        line = lines[entry["line"]]
        lines[entry["line"]] = line[: entry["insert_at"]] + " " + " ".join(added) + line[entry["insert_at"] :]
    else:
        # Continuation lines become empty strings, so that the line numbers of later stanzas stay valid.
        first, last, name, _ = entry["field"]
        lines[first : last + 1] = [f"{name}: {' '.join(entry['components'] + added)}\n"] + [""] * (last - first)
    return lines


def _rewrite_field(lines, field, text):
    """Replace a deb822 field (first line, last line, ...) by ``text``; continuation lines become empty strings, so
    that the line numbers of later stanzas stay valid."""
    first, last, _, _ = field
    lines[first : last + 1] = [text] + [""] * (last - first)


def _without_replaced(entry, lines, keys, note):
    """Return the entry's file lines with the entry's URIs in ``keys`` taken out, ``note`` saying why."""
    lines = list(lines)
    if entry["form"] == "one-line":
        line = lines[entry["line"]]
        lines[entry["line"]] = note + "# " + line + ("" if line.endswith("\n") else "\n")
        return lines
    fields = entry["fields"]
    others = [uri for uri in entry["uris"] if _repository(uri) not in keys]
    if others:
        _rewrite_field(lines, fields["uris"], f"{fields['uris'][2]}: {' '.join(others)}\n")
    elif "enabled" in fields:
        _rewrite_field(lines, fields["enabled"], f"{note}{fields['enabled'][2]}: no\n")
    else:
        start = min(field[0] for field in fields.values())
        lines[start] = f"{note}Enabled: no\n{lines[start]}"
    return lines


def _replace_plan(lines, replaced, edited):
    """Take the host's entries for the ``replaced`` repositories ({URI: the role's own source file}) out of
    ``lines`` ({path: lines}): whole files where they hold nothing else (never sources.list), else in place, into
    ``edited``. Returns (files to remove, the entries taken out)."""
    owners = {_repository(uri): own for uri, own in (replaced or {}).items()}
    removed, taken = [], []
    for path in lines:
        if path in owners.values():
            continue
        parse = _deb822_entries if path.endswith(".sources") else _one_line_entries
        entries = list(parse(path, lines[path]))
        hits = [e for e in entries if e["enabled"] and {_repository(uri) for uri in e["uris"]} & owners.keys()]
        if not hits:
            continue
        whole = path != MAIN_LIST and all({_repository(uri) for uri in e["uris"]} <= owners.keys() for e in entries)
        for entry in hits:
            if not whole:
                own = next(owners[_repository(uri)] for uri in entry["uris"] if _repository(uri) in owners)
                note = (
                    f"# Disabled by the nvidia_driver role, whose {posixpath.basename(own)} is the entry for this"
                    " repository (two entries with different Signed-By break apt):\n"
                )
                edited[path] = _without_replaced(entry, edited.get(path, lines[path]), owners.keys(), note)
            summary = {key: entry[key] for key in ("file", "form", "uris", "suites", "signed_by")}
            taken.append({**summary, "action": "remove" if whole else "disable"})
        if whole:
            removed.append(path)
    return removed, taken


def _own_source(mirror, suites, components, keyring):
    return (
        "# Managed by the nvidia_driver role: this host had no apt entry for Debian's archive.\n"
        "Types: deb\n"
        f"URIs: {mirror}\n"
        f"Suites: {' '.join(suites)}\n"
        f"Components: {' '.join(components)}\n"
        f"Signed-By: {keyring}\n"
    )


def dinops_apt_components_plan(files, suites, components, mirror, own_path, keyring=DEBIAN_KEYRING, replaced=None):
    """Decide how to enable ``components`` of Debian's archive for ``suites`` without a conflicting source, and take
    the host's entries for the ``replaced`` repositories out.

    ``files``: {path: content} of /etc/apt/sources.list, the files in /etc/apt/sources.list.d and the mirror lists
    (/etc/apt/mirrors/*.list) that mirror+file: URIs name. ``mirror``: the URI the role's own source would use;
    ``own_path``: that source's file (a previous version of this role wrote it unconditionally). ``replaced``:
    {URI: file} of the repositories the role writes its own source file for (that file is left alone).

    Returns ``entries`` (the enabled binary entries for Debian's archive and these suites, with ``added``: the
    components this plan gives them), ``edits`` (``path`` and new ``content`` of each file to write, in apt's
    order), ``remove`` (files to delete), ``own_source`` (whether the role's own source is needed) and ``replaced``
    (the host's entries for the replaced repositories that are taken out, with ``action``: remove or disable).
    A component is added only where no entry for the same URI and suite has it yet, so no index is configured twice.
    """
    files = dict(files or {})
    wanted_suites, wanted = list(suites), list(components)
    lines = {path: files[path].splitlines(keepends=True) for path in _source_files(files)}
    edited = {}
    removed, taken = _replace_plan(lines, replaced, edited)
    entries = []
    for path in lines:
        if path == own_path:
            continue
        parse = _deb822_entries if path.endswith(".sources") else _one_line_entries
        entries += [
            entry
            for entry in parse(path, lines[path])
            if entry["enabled"]
            and "deb" in entry["types"]
            and set(entry["suites"]) & set(wanted_suites)
            and set(entry["components"]) & set(DEBIAN_COMPONENTS)
            and any(_points_at_debian_archive(uri, mirror, files) for uri in entry["uris"])
        ]

    present = defaultdict(set)
    for entry in entries:
        for uri in entry["uris"]:
            for suite in entry["suites"]:
                present[(_repository(uri), suite)].update(entry["components"])
    for entry in entries:
        keys = [
            (_repository(uri), suite) for uri in entry["uris"] for suite in entry["suites"] if suite in wanted_suites
        ]
        entry["added"] = [c for c in wanted if c not in entry["components"] and any(c not in present[k] for k in keys)]
        for key in keys:
            present[key].update(entry["added"])
        if entry["added"]:
            edited[entry["file"]] = _with_components(
                entry, edited.get(entry["file"], lines[entry["file"]]), entry["added"]
            )

    edits = [{"path": path, "content": "".join(edited[path])} for path in lines if path in edited]
    own = _own_source(mirror, wanted_suites, wanted, keyring)
    if not entries and files.get(own_path) != own:
        edits.append({"path": own_path, "content": own})
    return {
        "entries": [
            {key: entry[key] for key in ("file", "form", "uris", "suites", "components", "signed_by", "added")}
            for entry in entries
        ],
        "edits": edits,
        "remove": ([own_path] if entries and own_path in files else []) + removed,
        "own_source": not entries,
        "replaced": taken,
    }


class FilterModule:
    """apt sources for Debian's archive components and the repositories the role replaces."""

    def filters(self):
        return {"dinops_apt_components_plan": dinops_apt_components_plan}
