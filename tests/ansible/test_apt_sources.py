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
import yaml

from dinops_testing import REPO, load_plugin

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


# --- NVIDIA's CUDA repository (finding F6 of the second hosts audit) -------------------------------------------------
# The nvidia_driver role writes its own source for NVIDIA's CUDA repository (cuda_repo.yml, deb822_repository with the
# key downloaded to /etc/apt/keyrings). A host that already lists that URI and suite with another Signed-By (or none)
# then fails every apt call: NVIDIA/cuda-repo-management#4 (NVIDIA's kmittman), "E: Conflicting values set for option
# Signed-By regarding source https://developer.download.nvidia.com/compute/cuda/repos/.../ /:
# /usr/share/keyrings/cuda-archive-keyring.gpg != ... check for and remove `cuda*.list` files". The role takes the
# host's other entries for that URI out (files holding nothing else are removed, other lines commented out, other
# stanzas disabled) before anything calls apt.
CUDA_URI = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
CUDA_OWN = "/etc/apt/sources.list.d/dinops-nvidia-cuda.sources"
# What ansible.builtin.deb822_repository writes for cuda_repo.yml (fields in its sorted order).
CUDA_OWN_SOURCE = (
    f"X-Repolib-Name: dinops-nvidia-cuda\nSigned-By: /etc/apt/keyrings/dinops-nvidia-cuda.asc\nSuites: /\n"
    f"Types: deb\nURIs: {CUDA_URI}\n"
)
# The list file of NVIDIA's cuda-keyring package (and of NVIDIA's Debian 12 network-repository instructions).
CUDA_KEYRING_LIST = f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {CUDA_URI} /\n"
CUDA_LAYOUTS = {
    "cuda-keyring": {"/etc/apt/sources.list.d/cuda-debian12-x86_64.list": CUDA_KEYRING_LIST},
    # Older guides and add-apt-repository: a line in sources.list, http, without the trailing slash.
    "sources-list-line": {
        "/etc/apt/sources.list": INSTALLER + f"deb {CUDA_URI.replace('https', 'http').rstrip('/')} /\n"
    },
    "deb822": {
        "/etc/apt/sources.list.d/cuda.sources": (
            f"Types: deb\nURIs: {CUDA_URI}\nSuites: /\nSigned-By: /usr/share/keyrings/cuda-archive-keyring.gpg\n"
        )
    },
    # One file for several NVIDIA repositories: only the CUDA entry goes, the file stays.
    "shared-list": {
        "/etc/apt/sources.list.d/nvidia.list": (
            f"deb [trusted=yes] {CUDA_URI} /\n" + THIRD_PARTY["/etc/apt/sources.list.d/docker.list"]
        )
    },
    "shared-deb822": {
        "/etc/apt/sources.list.d/nvidia.sources": (
            f"Types: deb\nURIs: https://download.docker.com/linux/debian\nSuites: bookworm\nComponents: stable\n\n"
            f"Enabled: yes\nTypes: deb\nURIs: {CUDA_URI}\nSuites: /\n"
            f"Signed-By: /usr/share/keyrings/cuda-archive-keyring.gpg\n"
        )
    },
}


def cuda_host(layout, own=True):
    """The layout's files with Debian's archive (debian:12's deb822 file unless the layout has a sources.list) and,
    with ``own``, the role's CUDA source of an earlier run."""
    files = CUDA_LAYOUTS[layout]
    debian = {} if "/etc/apt/sources.list" in files else LAYOUTS["deb822"]
    return {**debian, **files, **({CUDA_OWN: CUDA_OWN_SOURCE} if own else {})}


def run_cuda_plan(files):
    return run_plan(files, replaced={CUDA_URI: CUDA_OWN})


# What apt says with the role's source beside each layout: another Signed-By (or trusted=yes) read after it stops
# apt; an unsigned entry read before it is taken for the repository (no key checked against it) with a warning.
CUDA_RESULT = {
    "cuda-keyring": (100, "E: Conflicting values set for option Signed-By regarding source " + CUDA_URI + " /"),
    "deb822": (100, "E: Conflicting values set for option Signed-By regarding source " + CUDA_URI + " /"),
    "shared-deb822": (100, "E: Conflicting values set for option Signed-By regarding source " + CUDA_URI + " /"),
    "shared-list": (100, "E: Conflicting values set for option Trusted regarding source " + CUDA_URI + " /"),
    "sources-list-line": (0, "W: Target Packages (Packages) is configured multiple times"),
}


@needs_apt
@pytest.mark.parametrize("layout", sorted(CUDA_LAYOUTS))
def test_the_role_cuda_source_beside_another_entry_for_the_repository_breaks_apt(tmp_path, layout):
    """The reproduction: with the role's source and the host's entry, apt refuses to read the sources, or warns."""
    status, stderr, _ = apt_view(tmp_path, cuda_host(layout))

    assert status == CUDA_RESULT[layout][0]
    assert CUDA_RESULT[layout][1] in stderr


@needs_apt
@pytest.mark.parametrize("layout", sorted(CUDA_LAYOUTS))
def test_other_entries_for_the_cuda_repository_are_taken_out_and_apt_works(tmp_path, layout):
    files = cuda_host(layout)

    status, stderr, targets = apt_view(tmp_path, apply(files, run_cuda_plan(files)))

    assert (status, stderr) == (0, ""), stderr
    # A flat repository's targets have no release or component: only the site.
    assert [t[0] for t in targets if "nvidia.com" in t[0]] == [CUDA_URI.rstrip("/")]  # the role's entry, once
    if layout.startswith("shared"):
        assert any("download.docker.com" in t[0] and t[1:] == ("bookworm", "stable") for t in targets)
    components = debian_components({t for t in targets if len(t) == 3})
    assert list(components["bookworm"].values()) == [{"main", *COMPONENTS}]


def test_the_cuda_keyring_list_file_is_removed():
    result = run_cuda_plan(cuda_host("cuda-keyring", own=False))

    assert result["remove"] == ["/etc/apt/sources.list.d/cuda-debian12-x86_64.list"]
    assert [(e["file"], e["signed_by"], e["action"]) for e in result["replaced"]] == [
        ("/etc/apt/sources.list.d/cuda-debian12-x86_64.list", "/usr/share/keyrings/cuda-archive-keyring.gpg", "remove")
    ]
    # Debian's archive still gets its components in the same plan.
    assert [edit["path"] for edit in result["edits"]] == ["/etc/apt/sources.list.d/debian.sources"]


def test_a_cuda_line_in_sources_list_is_commented_out_beside_the_components_edit():
    """Both changes land in the same file: neither may overwrite the other."""
    result = run_cuda_plan(cuda_host("sources-list-line"))

    assert result["remove"] == []
    content = result["edits"][0]["content"]
    assert "deb http://deb.debian.org/debian/ bookworm main contrib non-free non-free-firmware\n" in content
    assert content.endswith(
        "# Disabled by the nvidia_driver role, whose dinops-nvidia-cuda.sources is the entry for this repository"
        " (two entries with different Signed-By break apt):\n"
        "# deb http://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64 /\n"
    )


def test_a_cuda_stanza_beside_other_stanzas_is_disabled():
    result = run_cuda_plan(cuda_host("shared-deb822"))

    edit = next(e for e in result["edits"] if e["path"] == "/etc/apt/sources.list.d/nvidia.sources")
    assert "\nEnabled: no\nTypes: deb\nURIs: " + CUDA_URI in edit["content"]
    assert "Enabled: yes" not in edit["content"]
    assert edit["content"].startswith("Types: deb\nURIs: https://download.docker.com/linux/debian\n")


@pytest.mark.parametrize("layout", sorted(CUDA_LAYOUTS))
def test_taking_the_cuda_entries_out_is_done_once(layout):
    files = cuda_host(layout)
    after = apply(files, run_cuda_plan(files))

    again = run_cuda_plan(after)

    assert (again["edits"], again["remove"], again["replaced"]) == ([], [], [])
    assert after[CUDA_OWN] == CUDA_OWN_SOURCE


def test_other_nvidia_repositories_and_hosts_without_the_cuda_source_are_left_alone():
    files = {
        "/etc/apt/sources.list.d/cuda-debian11-x86_64.list": CUDA_KEYRING_LIST.replace("debian12", "debian11"),
        "/etc/apt/sources.list.d/nvidia-container-toolkit.list": (
            "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg]"
            " https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
        ),
    }
    assert run_cuda_plan({**LAYOUTS["deb822"], **files})["replaced"] == []
    # Debian's own driver (source debian): no CUDA repository, nothing replaced.
    assert run_plan(cuda_host("cuda-keyring"))["remove"] == []


def repo_task_plan(files, source):
    """repo.yml's decision task rendered by Ansible, with the role's filters, for these files and plan source."""
    import base64

    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import filter_loader
    from ansible.template import Templar, trust_as_template

    tasks = yaml.safe_load((REPO / "roles/nvidia_driver/tasks/repo.yml").read_text())
    task = next(t for t in tasks if "ansible.builtin.set_fact" in t)
    filter_loader.add_directory(str(REPO / "roles/nvidia_driver/filter_plugins"))
    variables = {
        "__nvidia_driver_apt_contents_result": {
            "results": [
                {"source": path, "content": base64.b64encode(text.encode()).decode()} for path, text in files.items()
            ]
        },
        "__nvidia_driver_plan": {"source": source},
        "nvidia_driver_debian_suites": SUITES,
        "nvidia_driver_debian_components": COMPONENTS,
        "nvidia_driver_debian_mirror": MIRROR,
        "nvidia_driver_cuda_repo_url": CUDA_URI,
        **yaml.safe_load((REPO / "roles/nvidia_driver/vars/main.yml").read_text()),
        **{name: trust_as_template(value) for name, value in task.get("vars", {}).items()},
    }
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template(task["ansible.builtin.set_fact"]["__nvidia_driver_apt_plan"]))


@pytest.mark.parametrize(("source", "removed"), [("nvidia", True), ("debian", False)])
def test_repo_tasks_take_out_the_cuda_keyring_entry_when_the_role_adds_the_cuda_repository(source, removed):
    result = repo_task_plan(cuda_host("cuda-keyring", own=False), source)

    assert ("/etc/apt/sources.list.d/cuda-debian12-x86_64.list" in result["remove"]) is removed
