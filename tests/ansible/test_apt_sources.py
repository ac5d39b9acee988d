"""Debian's archive components on the apt layouts real hosts ship (finding 4 of the GPU-host audit).

Each layout is a file set as found on a real host. The plan's result is checked for its content and, where apt-get
is installed (Debian CI, developer machines), by apt itself: apt parses the sources offline (no download) and
reports the Signed-By conflict and the index targets, so these tests prove what the Molecule scenario apt_layouts
proves with downloads, in milliseconds.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from dinops_testing import load_plugin

plan = load_plugin("roles/nvidia_driver/filter_plugins/apt_sources.py").dinops_apt_components_plan

SUITES = ["bookworm", "bookworm-updates"]
COMPONENTS = ["contrib", "non-free", "non-free-firmware"]
MIRROR = "http://deb.debian.org/debian"
OWN = "/etc/apt/sources.list.d/dinops-debian-nonfree.sources"
# What the role wrote next to every layout before this fix (ansible.builtin.deb822_repository's output).
PARALLEL_SOURCE = (
    "X-Repolib-Name: dinops-debian-nonfree\nTypes: deb\nURIs: http://deb.debian.org/debian\n"
    "Suites: bookworm bookworm-updates\nComponents: contrib non-free non-free-firmware\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
)

INSTALLER = """\
#deb cdrom:[Debian GNU/Linux 12.5.0 _Bookworm_ - Official amd64 NETINST with firmware 20240210-11:27]/ bookworm main

deb http://deb.debian.org/debian/ bookworm main
deb-src http://deb.debian.org/debian/ bookworm main

deb http://security.debian.org/debian-security bookworm-security main
deb-src http://security.debian.org/debian-security bookworm-security main

# bookworm-updates, to get updates before a point release is made;
# see https://www.debian.org/doc/manuals/debian-reference/ch02.en.html#_updates_and_backports
deb http://deb.debian.org/debian/ bookworm-updates main
deb-src http://deb.debian.org/debian/ bookworm-updates main
"""
DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20240513T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20240513T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
CLOUD_MIRRORS = """\
Types: deb deb-src
URIs: mirror+file:///etc/apt/mirrors/debian.list
Suites: bookworm bookworm-updates bookworm-backports
Components: main

Types: deb deb-src
URIs: mirror+file:///etc/apt/mirrors/debian-security.list
Suites: bookworm-security
Components: main
"""

# Layouts: (a) the installer's sources.list, main only and with non-free-firmware; (b) deb822 debian.sources with
# Signed-By (debian:12 and most images); (c) Debian's AWS images, mirror+file URIs; (d) https URIs (GCE);
# (e) a one-line entry signed by another keyring; (f) an unsigned entry in sources.list.d read after the role's
# parallel source (hand-configured machines); plus Docker's and Microsoft's repositories, which are not Debian's.
LAYOUTS = {
    "installer": {"/etc/apt/sources.list": INSTALLER},
    "installer-firmware": {"/etc/apt/sources.list": INSTALLER.replace(" main\n", " main non-free-firmware\n")},
    "deb822": {"/etc/apt/sources.list.d/debian.sources": DEB822},
    "aws-mirror-file": {
        "/etc/apt/sources.list.d/debian.sources": CLOUD_MIRRORS,
        "/etc/apt/mirrors/debian.list": "https://cdn-aws.deb.debian.org/debian\n",
        "/etc/apt/mirrors/debian-security.list": "https://cdn-aws.deb.debian.org/debian-security\n",
    },
    "gcp-https": {
        "/etc/apt/sources.list.d/debian.sources": CLOUD_MIRRORS.replace(
            "mirror+file:///etc/apt/mirrors/", "https://deb.debian.org/"
        ).replace(".list\n", "\n")
    },
    "signed-by-other": {
        "/etc/apt/sources.list": (
            "deb [arch=amd64 signed-by=/etc/apt/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian"
            " bookworm main # keyring copied by the image build\n"
            "deb [arch=amd64 signed-by=/etc/apt/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian"
            " bookworm-updates main\n"
        )
    },
    "unsigned-after-own": {
        "/etc/apt/sources.list": "deb http://deb.debian.org/debian bookworm main\n",
        "/etc/apt/sources.list.d/non-free.list": "deb http://deb.debian.org/debian bookworm contrib non-free\n",
    },
}
THIRD_PARTY = {
    "/etc/apt/sources.list.d/docker.list": (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.gpg] https://download.docker.com/linux/debian bookworm"
        " stable\n"
    ),
    "/etc/apt/sources.list.d/microsoft-prod.list": (
        "deb [arch=amd64,arm64,armhf signed-by=/usr/share/keyrings/microsoft-prod.gpg]"
        " https://packages.microsoft.com/debian/12/prod bookworm main\n"
    ),
}


def run_plan(files, **overrides):
    settings = {"suites": SUITES, "components": COMPONENTS, "mirror": MIRROR, "own_path": OWN}
    settings.update(overrides)
    return plan(files, **settings)


def apply(files, result):
    """The files after the role's tasks: edits written, removals done."""
    after = {path: content for path, content in files.items() if path not in result["remove"]}
    after.update({edit["path"]: edit["content"] for edit in result["edits"]})
    return after


apt_get = shutil.which("apt-get")
needs_apt = pytest.mark.skipif(apt_get is None, reason="apt-get is not installed")


def apt_view(root, files):
    """(exit status, stderr, {(site, suite, component)}) of apt reading these sources, offline."""
    etc = root / "etc"
    (etc / "sources.list.d").mkdir(parents=True)
    for path, content in files.items():
        if path == "/etc/apt/sources.list" or path.startswith("/etc/apt/sources.list.d/"):
            (etc / path.removeprefix("/etc/apt/")).write_text(content)
    (root / "lists" / "partial").mkdir(parents=True)
    options = {
        "Dir::Etc::SourceList": etc / "sources.list",
        "Dir::Etc::SourceParts": etc / "sources.list.d",
        "Dir::State::Lists": root / "lists",
        "Dir::Cache::pkgcache": "",
        "Dir::Cache::srcpkgcache": "",
        "APT::Architecture": "amd64",
    }
    command = [apt_get] + [arg for name, value in options.items() for arg in ("-o", f"{name}={value}")]
    command += [
        "indextargets",
        "--no-release-info",
        "--format",
        "$(SITE) $(RELEASE) $(COMPONENT)",
        "Created-By: Packages",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    targets = {tuple(line.split()) for line in done.stdout.splitlines() if line.strip()}
    return done.returncode, done.stderr, targets


# What apt said about each layout with the parallel source the role added before this fix; the others were clean.
PARALLEL_SOURCE_RESULT = {
    "signed-by-other": (
        100,
        "E: Conflicting values set for option Signed-By regarding source http://deb.debian.org/debian/ bookworm:"
        " /etc/apt/keyrings/debian-archive-keyring.gpg != /usr/share/keyrings/debian-archive-keyring.gpg",
    ),
    "unsigned-after-own": (
        100,
        "E: Conflicting values set for option Signed-By regarding source http://deb.debian.org/debian/ bookworm:"
        " /usr/share/keyrings/debian-archive-keyring.gpg != \n",
    ),
    "installer-firmware": (
        0,
        "W: Target Packages (non-free-firmware/binary-amd64/Packages) is configured multiple times",
    ),
}


@needs_apt
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_parallel_source_the_role_added_breaks_apt_where_another_signed_by_comes_first(tmp_path, layout):
    """The reproduction: apt rejects the old parallel source only where another Signed-By is read before it."""
    status, stderr, _ = apt_view(tmp_path, {**LAYOUTS[layout], OWN: PARALLEL_SOURCE})

    expected_status, expected_message = PARALLEL_SOURCE_RESULT.get(layout, (0, ""))
    assert status == expected_status
    assert expected_message in stderr if expected_message else stderr == ""


def debian_components(targets):
    """{suite: {site: components}} of the binary index targets for Debian's archive (not its security archive)."""
    found = {}
    for site, release, component in targets:
        if site.rstrip("/").endswith(("/debian", "debian.list")) and component in ("main", *COMPONENTS):
            found.setdefault(release, {}).setdefault(site, set()).add(component)
    return found


@needs_apt
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_keeps_apt_working_and_gets_every_component(tmp_path, layout):
    files = {**LAYOUTS[layout], **THIRD_PARTY, OWN: PARALLEL_SOURCE}
    _, _, before = apt_view(tmp_path / "before", LAYOUTS[layout])

    status, stderr, targets = apt_view(tmp_path / "after", apply(files, run_plan(files)))

    assert (status, stderr) == (0, ""), stderr  # no conflict, and no index configured twice
    before, after = debian_components(before), debian_components(targets)
    assert sorted(after) == sorted(before)  # no suite added
    for suite in SUITES:
        if suite in before:
            # The same single source as before (no parallel one), now with every component.
            assert after[suite] == {site: {"main", *COMPONENTS} for site in before[suite]}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_second_run_changes_nothing(layout):
    files = {**LAYOUTS[layout], OWN: PARALLEL_SOURCE}
    after = apply(files, run_plan(files))

    again = run_plan(after)

    assert (again["edits"], again["remove"], again["own_source"]) == ([], [], False)
    assert all(entry["added"] == [] for entry in again["entries"])


def test_installer_sources_list_gets_the_components_on_its_deb_lines_only():
    result = run_plan(LAYOUTS["installer"])

    assert result["edits"] == [
        {"path": "/etc/apt/sources.list", "content": INSTALLER.replace(
            "deb http://deb.debian.org/debian/ bookworm main\n",
            "deb http://deb.debian.org/debian/ bookworm main contrib non-free non-free-firmware\n",
        ).replace(
            "deb http://deb.debian.org/debian/ bookworm-updates main\n",
            "deb http://deb.debian.org/debian/ bookworm-updates main contrib non-free non-free-firmware\n",
        )}
    ]  # fmt: skip
    assert [entry["added"] for entry in result["entries"]] == [COMPONENTS, COMPONENTS]
    assert (result["remove"], result["own_source"]) == ([], False)


def test_non_free_firmware_from_the_installer_is_not_repeated():
    result = run_plan(LAYOUTS["installer-firmware"])

    assert [entry["added"] for entry in result["entries"]] == [["contrib", "non-free"]] * 2
    assert (
        "deb http://deb.debian.org/debian/ bookworm main non-free-firmware contrib non-free\n"
        in result["edits"][0]["content"]
    )


def test_deb822_stanza_keeps_its_signed_by_and_comments():
    result = run_plan(LAYOUTS["deb822"])

    assert result["edits"] == [
        {"path": "/etc/apt/sources.list.d/debian.sources", "content": DEB822.replace(
            "Components: main\n", "Components: main contrib non-free non-free-firmware\n", 1)}
    ]  # fmt: skip
    assert result["entries"][0]["signed_by"] == "/usr/share/keyrings/debian-archive-keyring.gpg"


def test_mirror_file_uris_are_recognised_through_their_mirror_list():
    files = LAYOUTS["aws-mirror-file"]

    result = run_plan(files)

    assert [(entry["uris"], entry["added"]) for entry in result["entries"]] == [
        (["mirror+file:///etc/apt/mirrors/debian.list"], COMPONENTS)
    ]
    assert (
        "Suites: bookworm bookworm-updates bookworm-backports\nComponents: main contrib non-free non-free-firmware\n"
        in result["edits"][0]["content"]
    )
    # The security stanza is left alone: its suite is not one the driver comes from.
    assert result["edits"][0]["content"].endswith("Suites: bookworm-security\nComponents: main\n")


def test_a_mirror_list_that_names_another_archive_is_not_debian():
    files = {**LAYOUTS["aws-mirror-file"], "/etc/apt/mirrors/debian.list": "https://apt.example.org/ubuntu\n"}

    assert run_plan(files)["own_source"] is True


def test_one_line_options_and_trailing_comment_stay():
    result = run_plan(LAYOUTS["signed-by-other"])

    assert result["edits"][0]["content"].splitlines()[0] == (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian"
        " bookworm main contrib non-free non-free-firmware # keyring copied by the image build"
    )
    assert [entry["signed_by"] for entry in result["entries"]] == ["/etc/apt/keyrings/debian-archive-keyring.gpg"] * 2


def test_components_another_entry_already_has_are_not_added_again():
    result = run_plan(LAYOUTS["unsigned-after-own"])

    assert [(entry["file"], entry["added"]) for entry in result["entries"]] == [
        ("/etc/apt/sources.list", ["non-free-firmware"]),
        ("/etc/apt/sources.list.d/non-free.list", []),
    ]


def test_the_parallel_source_of_earlier_runs_is_removed_where_entries_exist():
    result = run_plan({**LAYOUTS["deb822"], OWN: PARALLEL_SOURCE})

    assert result["remove"] == [OWN]
    assert [edit["path"] for edit in result["edits"]] == ["/etc/apt/sources.list.d/debian.sources"]


@pytest.mark.parametrize(
    "files",
    [
        {},
        THIRD_PARTY,
        {"/etc/apt/sources.list": "deb http://mirror.example.org/deb bookworm main\n"},
        {"/etc/apt/sources.list": "# deb http://deb.debian.org/debian bookworm main\n"},
        {"/etc/apt/sources.list": "deb-src http://deb.debian.org/debian bookworm main\n"},
        {"/etc/apt/sources.list.d/debian.sources": DEB822.replace("Types: deb\n", "Enabled: no\nTypes: deb\n")},
        {"/etc/apt/sources.list": "deb http://deb.debian.org/debian bookworm-backports main\n"},
    ],
    ids=["nothing", "third-party-only", "unknown-mirror", "commented", "deb-src-only", "disabled", "other-suite"],
)
def test_a_host_without_an_entry_for_debian_gets_the_role_source(files):
    result = run_plan(files)

    assert result["own_source"] is True
    assert result["edits"][-1] == {
        "path": OWN,
        "content": "# Managed by the nvidia_driver role: this host had no apt entry for Debian's archive.\n"
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n"
        "Components: contrib non-free non-free-firmware\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
    }
    assert result["remove"] == []


def test_the_configured_mirror_counts_as_debian_whatever_its_path():
    files = {"/etc/apt/sources.list": "deb http://mirror.example.org/deb bookworm main\n"}

    result = run_plan(files, mirror="http://mirror.example.org/deb/")

    assert result["own_source"] is False
    assert (
        result["edits"][0]["content"]
        == "deb http://mirror.example.org/deb bookworm main contrib non-free non-free-firmware\n"
    )


def test_a_components_field_on_continuation_lines_is_rewritten_in_place():
    sources = (
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents:\n main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-updates\nComponents: main\n"
    )

    result = run_plan({"/etc/apt/sources.list.d/debian.sources": sources})

    assert result["edits"][0]["content"] == (
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n"
        "Components: main contrib non-free non-free-firmware\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-updates\n"
        "Components: main contrib non-free non-free-firmware\n"
    )


def test_files_apt_does_not_read_are_ignored():
    files = {
        "/etc/apt/sources.list.d/debian.sources.dpkg-old": DEB822,
        "/etc/apt/sources.list.d/debian.sources": DEB822.replace(
            "Components: main\n", "Components: main contrib non-free non-free-firmware\n"
        ),
    }

    assert run_plan(files)["edits"] == []


@needs_apt
def test_http_and_https_of_one_archive_are_one_repository_as_for_apt(tmp_path):
    files = {
        "/etc/apt/sources.list": "deb https://deb.debian.org/debian bookworm main\n",
        "/etc/apt/sources.list.d/non-free.list": "deb http://deb.debian.org/debian bookworm contrib non-free\n",
    }

    result = run_plan(files)
    status, stderr, targets = apt_view(tmp_path, apply(files, result))

    assert [entry["added"] for entry in result["entries"]] == [["non-free-firmware"], []]
    assert (status, stderr) == (0, "")
    assert debian_components(targets) == {"bookworm": {"https://deb.debian.org/debian": {"main", *COMPONENTS}}}
