"""dinops-download fetches a small dataset from an HTTP server on a Docker network into a named volume; the second
run finds everything in place and sends no request at all."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest

pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(3600)]

FILES = {"tiny/a.txt": "first file\n", "tiny/sub/b.txt": "second file\n"}


def _requests(log: str) -> list[str]:
    return [line for line in log.splitlines() if '"GET ' in line or '"HEAD ' in line]


def test_download_into_a_volume_then_nothing_to_do(images, docker, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    archive = served / "tiny.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, text in FILES.items():
            zf.writestr(name, text)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    urls = tmp_path / "in"
    urls.mkdir()
    (urls / "urls.txt").write_text(f"http://files:8000/tiny.zip sha256:{digest}\n")
    served.chmod(0o755)
    urls.chmod(0o755)

    network = docker.name("network", "download-net")
    docker("network", "create", network)
    server = docker.name("container", "files")
    docker(
        "run", "-d", "--name", server, "--network", network, "--network-alias", "files", "--read-only",
        "-v", f"{served}:/srv:ro", "--entrypoint", "python3", images["download"],
        "-m", "http.server", "8000", "--bind", "0.0.0.0", "--directory", "/srv",
    )  # fmt: skip
    volume = docker.name("volume", "coco")
    docker("volume", "create", volume)

    def download() -> str:
        result = docker(
            "run", "--rm", "--network", network, "--read-only", "--cap-drop", "ALL",
            "-v", f"{volume}:/data", "-v", f"{urls}:/in:ro", images["download"],
            "--urls-file", "/in/urls.txt", "--progress", "off",
            timeout=300,
        )  # fmt: skip
        return result.stdout + result.stderr

    first = download()
    after_first = _requests(docker.logs(server))
    assert after_first and all("/tiny.zip" in line for line in after_first), after_first
    listing = docker(
        "run", "--rm", "-v", f"{volume}:/data:ro", "--entrypoint", "python3", images["download"], "-c",
        "import json, os; print(json.dumps(sorted(os.path.relpath(os.path.join(r, f), '/data/coco') "
        "for r, _, fs in os.walk('/data/coco') for f in fs if '/.' not in os.path.join(r, f))))",
    ).stdout  # fmt: skip
    assert json.loads(listing) == sorted(FILES), first
    content = docker(
        "run", "--rm", "-v", f"{volume}:/data:ro", "--entrypoint", "cat", images["download"], "/data/coco/tiny/a.txt"
    ).stdout
    assert content == FILES["tiny/a.txt"]

    second = download()
    assert _requests(docker.logs(server)) == after_first, second
    assert "already in place" in second
