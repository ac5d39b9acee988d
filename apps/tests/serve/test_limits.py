"""Bounded work per request, in process: the worker's budget of images in flight (DINO_MAX_DECODED_MB), its decode
slots (DINO_DECODE_THREADS), and detections of reduced images still in the original's pixels."""

from __future__ import annotations

import base64
import threading
import time

import pytest
from PIL import Image

from dinops.serve import detection, images
from dinops.serve.inflight import InFlight, request_bytes


def _instances(body: bytes, count: int) -> dict:
    return {"instances": [{"image": {"b64": base64.b64encode(body).decode()}}] * count}


def test_reduced_images_are_answered_in_the_original_pixels(client, encode):
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 1000x500, shown 500x1000
    for body, kind, size in [
        (encode(Image.new("RGB", (1000, 500))), "image/png", (1000, 500)),
        (encode(Image.new("RGB", (1000, 500)), "JPEG", exif=exif), "image/jpeg", (500, 1000)),
    ]:
        answer = client.post("/v1/detect", data=body, content_type=kind).get_json()
        w, h = size
        assert (answer["width"], answer["height"]) == size
        assert answer["detections"][0]["box"] == [0.25 * w, 0.25 * h, 0.75 * w, 0.75 * h]  # FakeDINO's first box


def test_a_request_that_could_never_fit_the_worker_gets_413(make_app, encode):
    client = make_app(MAX_DECODED_MB=0.1).test_client()
    response = client.post("/v1/detect", data=encode(Image.new("RGB", (200, 200))), content_type="image/png")
    assert response.status_code == 413, response.text
    body = response.get_json()
    assert body["code"] == "request_too_large" and "at most 0.1 MiB of images (DINO_MAX_DECODED_MB)" in body["error"]


def test_no_room_in_flight_gets_429_after_the_wait(make_app, encode):
    app = make_app(MAX_DECODED_MB=1.0, REQUEST_TIMEOUT_S=0.3)
    client = app.test_client()
    with app.app_context():
        budget = detection.in_flight()
    assert budget.reserve(budget.capacity, time.monotonic())  # another request holds all of it
    began = time.monotonic()
    response = client.post("/v1/detect", data=encode(Image.new("RGB", (100, 100))), content_type="image/png")
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    assert 0.3 <= time.monotonic() - began < 5
    body = response.get_json()
    assert body["code"] == "busy" and "1 MiB (DINO_MAX_DECODED_MB)" in body["error"]
    budget.release(budget.capacity)
    response = client.post("/v1/detect", data=encode(Image.new("RGB", (100, 100))), content_type="image/png")
    assert response.status_code == 200 and budget.in_use == 0  # given back after the answer


def test_no_free_decode_slot_gets_429(make_app, encode):
    app = make_app(DECODE_THREADS=1, REQUEST_TIMEOUT_S=0.3)
    client = app.test_client()
    with app.app_context():
        budget = detection.in_flight()
    with budget.decoding(time.monotonic()) as slot:
        assert slot
        response = client.post("/v1/detect", data=encode(Image.new("RGB", (100, 100))), content_type="image/png")
    assert response.status_code == 429
    assert (
        "all 1 decode slots" in response.get_json()["error"] and "DINO_DECODE_THREADS" in response.get_json()["error"]
    )
    assert budget.in_use == 0


def test_a_request_waits_for_room_rather_than_failing(make_app, encode):
    app = make_app(MAX_DECODED_MB=1.0, REQUEST_TIMEOUT_S=10)
    with app.app_context():
        budget = detection.in_flight()
    assert budget.reserve(budget.capacity, time.monotonic())
    threading.Timer(0.3, budget.release, (budget.capacity,)).start()
    response = app.test_client().post("/v1/detect", data=encode(Image.new("RGB", (100, 100))), content_type="image/png")
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("overrides", "limit", "setting"),
    [({}, 16, "DINO_MAX_IMAGES_PER_REQUEST"), ({"QUEUE_SIZE": 4}, 4, "DINO_QUEUE_SIZE")],
)
def test_images_per_request_names_the_setting_that_binds(make_app, encode, overrides, limit, setting):
    client = make_app(**overrides).test_client()
    body = encode(Image.new("RGB", (20, 20)))
    response = client.post("/v1/models/dino:predict", json=_instances(body, limit + 1))
    assert response.status_code == 413
    assert response.get_json()["error"] == (
        f"{limit + 1} images in one request: at most {limit} are accepted ({setting}); split the request."
    )
    assert client.post("/v1/models/dino:predict", json=_instances(body, limit)).status_code == 200


def test_request_bytes_is_the_sequential_peak():
    pending = [
        images.Pending(None, 1, 1, factor=1, cost=100, held=10),
        images.Pending(None, 1, 1, factor=1, cost=50, held=30),
    ]
    assert request_bytes(pending) == 10 + 30 + 90  # both arrays, plus the dearer decode beyond its own array


def test_in_flight_never_goes_over_capacity():
    budget, peak, lock = InFlight(100, decode_threads=2), [0], threading.Lock()

    def worker():
        for _ in range(50):
            if budget.reserve(40, time.monotonic() + 5):
                with lock:
                    peak[0] = max(peak[0], budget.in_use)
                budget.release(40)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert budget.in_use == 0 and 40 <= peak[0] <= 80
