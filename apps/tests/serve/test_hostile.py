"""Hostile images against the real thing: `dinops serve` under gunicorn on 127.0.0.1 with a small checkpoint, real
bytes over TCP, the worker's memory read from /proc.

A 16-bit 6000x6000 PNG of zeros is 70 kB on the wire; decoded through 64-bit arrays it grew the worker by 687 MiB
(issue 26). The worker must now decode it within DINO_MAX_IMAGE_MB, refuse what would cost more, refuse requests of
too many images whatever the protocol, and survive concurrent hostile requests with its memory bounded.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from PIL import Image

from dinops.serve.testing import (
    WorkerMemory,
    children,
    free_port,
    kserve_v1_body,
    noise_jpeg,
    oip_v2_binary_body,
    running,
    write_small_checkpoint,
)

MIB = 2**20
# The limits are the defaults (DINO_MAX_IMAGE_MB 128, DINO_MAX_DECODED_MB 512, DINO_MAX_IMAGES_PER_REQUEST 16):
# what a fresh install runs with must hold.
SERVER_ENV = {
    "DINO_MIN_SIZE": "480",  # forward passes 2.8x cheaper than at 800/1333; decoding costs the same
    "DINO_MAX_SIZE": "800",
    "DINO_MAX_IMAGE_PIXELS": "40000000",  # the former default, so that 36-MP images reach the memory bound
    "DINO_THREADS": "16",
    "DINO_REQUEST_TIMEOUT_S": "300",  # a loaded CPU must not turn slow answers into 503s here
}
# Growth of the worker over its idle size that the container's limit stands for here: beyond it the watchdog kills
# the worker as the OOM killer would. The images in flight (DINO_MAX_DECODED_MB), plus 256 MiB for the forward
# passes' activations (~100 MiB at 800x1067 for this model, measured; less at 480), request bodies and what
# glibc's per-thread arenas keep of freed memory (docs/api.md, "Bounded work per request").
WORKER_LIMIT = (512 + 256) * MIB
JPEG, PNG = {"Content-Type": "image/jpeg"}, {"Content-Type": "image/png"}


def _png(image: Image.Image, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", **kwargs)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``{"url", "master"}``: one worker (DINO_WORKERS defaults to 1) under the gunicorn master."""
    folder = tmp_path_factory.mktemp("hostile")
    checkpoint = write_small_checkpoint(folder / "small.pth", seed=2)
    port = free_port()
    env = {**SERVER_ENV, "DINO_CHECKPOINT": str(checkpoint), "DINO_BIND": f"127.0.0.1:{port}"}
    with running("serve", env, f"http://127.0.0.1:{port}", folder / "serve.log") as master:
        url = f"http://127.0.0.1:{port}"
        assert requests.post(url + "/v1/detect", data=noise_jpeg(0), headers=JPEG, timeout=120).status_code == 200
        yield {"url": url, "master": master.pid}


@pytest.fixture
def worker(server):
    """The worker's pid; after the test, the same worker must still be there and answer."""
    (pid,) = children(server["master"])
    yield pid
    assert children(server["master"]) == [pid], "the worker died and gunicorn replaced it"
    assert requests.post(server["url"] + "/v1/detect", data=noise_jpeg(1), headers=JPEG, timeout=120).ok


@pytest.fixture(scope="module")
def sixteen_bit_zeros():
    """70 kB on the wire, 36 megapixels of 16-bit grey."""
    return _png(Image.fromarray(np.zeros((6000, 6000), dtype=np.uint16)))


def test_sixteen_bit_png_decodes_within_the_image_bound(server, worker, sixteen_bit_zeros):
    memory = WorkerMemory(worker, kill_above=WORKER_LIMIT).start()
    response = requests.post(server["url"] + "/v1/detect", data=sixteen_bit_zeros, headers=PNG, timeout=120)
    grown = memory.stop()
    assert memory.killed_at is None, f"the worker grew by {grown / MIB:.0f} MiB and was killed"
    assert response.status_code == 200, response.text
    assert (response.json()["width"], response.json()["height"]) == (6000, 6000)
    assert grown <= 128 * MIB, f"the worker grew by {grown / MIB:.0f} MiB for one image (DINO_MAX_IMAGE_MB=128)"


def test_an_image_over_the_memory_bound_is_refused_before_decoding(server, worker):
    """36 MP with a palette and transparency: expanded to RGBA to be reduced, far more than 128 MiB."""
    body = _png(Image.new("P", (6000, 6000)), transparency=0)
    memory = WorkerMemory(worker, kill_above=WORKER_LIMIT).start()
    response = requests.post(server["url"] + "/v1/detect", data=body, headers=PNG, timeout=120)
    grown = memory.stop()
    assert response.status_code == 413, response.text
    answer = response.json()
    assert answer["code"] == "image_too_large"
    assert "at most 128 MiB per image are accepted (DINO_MAX_IMAGE_MB)" in answer["error"]
    assert grown < 16 * MIB, f"refusing it cost {grown / MIB:.0f} MiB: it was decoded"


@pytest.mark.parametrize("protocol", ["kserve_v1", "oip_v2"])
def test_too_many_images_in_one_request_are_refused(server, worker, protocol):
    images = [noise_jpeg(i, (64, 48)) for i in range(17)]
    if protocol == "kserve_v1":
        response = requests.post(server["url"] + "/v1/models/dino:predict", timeout=120, **kserve_v1_body(images))
    else:
        response = requests.post(server["url"] + "/v2/models/dino/infer", timeout=120, **oip_v2_binary_body(images))
    assert response.status_code == 413, response.text[:300]
    answer = response.json()
    assert answer["code"] == "too_many_images"
    assert "at most 16 are accepted (DINO_MAX_IMAGES_PER_REQUEST)" in answer["error"]


def test_concurrent_hostile_requests_leave_the_worker_alive(server, worker, sixteen_bit_zeros):
    """Four KServe requests of four 16-bit PNGs and four normal images at once: no 5xx, memory bounded."""
    url = server["url"]
    hostile = [("/v1/models/dino:predict", kserve_v1_body([sixteen_bit_zeros] * 4)) for _ in range(4)]
    normal = [("/v1/detect", {"data": noise_jpeg(i), "headers": JPEG}) for i in range(4)]
    memory = WorkerMemory(worker, kill_above=WORKER_LIMIT).start()

    def send(item):
        path, kwargs = item
        try:
            return requests.post(url + path, timeout=300, **kwargs).status_code
        except requests.ConnectionError as exc:
            return f"no answer: {exc}"

    with ThreadPoolExecutor(len(hostile) + len(normal)) as pool:
        statuses = list(pool.map(send, [x for pair in zip(hostile, normal, strict=True) for x in pair]))
    grown = memory.stop()
    assert memory.killed_at is None, f"the worker grew by {grown / MIB:.0f} MiB and was killed; answers {statuses}"
    assert all(isinstance(s, int) and (s == 200 or 400 <= s < 500) for s in statuses), statuses
    assert statuses[1::2] == [200] * len(normal), statuses
    assert grown <= WORKER_LIMIT, f"the worker grew by {grown / MIB:.0f} MiB"
