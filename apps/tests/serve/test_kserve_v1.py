"""KServe's V1 protocol over real HTTP: `dinops serve` under gunicorn with the small DINO, good and bad requests."""

from __future__ import annotations

import base64

import pytest
import requests
from PIL import Image

from dinops.serve.testing import noise_jpeg, small_server

SERVER_ENV = {
    "DINO_MIN_SIZE": "64",
    "DINO_MAX_SIZE": "96",
    "DINO_BATCH_MAX_WAIT_MS": "100",
    "DINO_CPU_BATCH_MAX_SIZE": "8",  # the batching tests run on a CPU
    "DINO_MAX_UPLOAD_MB": "1",
    "DINO_QUEUE_SIZE": "8",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with small_server(tmp_path_factory.mktemp("serve"), SERVER_ENV, seed=2) as url:
        yield url


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _without_timing(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k != "timing"}


def test_models_and_readiness(server):
    assert requests.get(server + "/v1/models").json() == {"models": ["dino"]}
    assert requests.get(server + "/v1/models/dino").json() == {"name": "dino", "ready": True}
    unknown = requests.get(server + "/v1/models/yolo")
    assert unknown.status_code == 404 and unknown.json()["code"] == "model_not_found"
    assert "'yolo' is not served here: this server serves 'dino'" in unknown.json()["error"]


def test_predict_equals_v1_detect_per_instance(server):
    images = [noise_jpeg(0), noise_jpeg(1)]  # one size: the shared batch computes what single requests do
    expected = [
        requests.post(
            server + "/v1/detect?threshold=0&max_detections=4", data=image, headers={"Content-Type": "image/jpeg"}
        ).json()
        for image in images
    ]
    body = {
        "instances": [{"image": {"b64": _b64(images[0])}}, {"b64": _b64(images[1])}],  # named input, or the value
        "parameters": {"threshold": 0, "max_detections": 4},
    }
    response = requests.post(server + "/v1/models/dino:predict", json=body)
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert [_without_timing(p) for p in predictions] == [_without_timing(e) for e in expected]
    assert [p["timing"]["batch_size"] for p in predictions] == [2, 2]  # both images in one forward pass
    assert [len(p["detections"]) for p in predictions] == [4, 4], predictions


def test_classes_parameter(server):
    image = noise_jpeg(3)
    everything = requests.post(
        server + "/v1/models/dino:predict",
        json={"instances": [{"image": {"b64": _b64(image)}}], "parameters": {"threshold": 0}},
    ).json()["predictions"][0]["detections"]
    first = everything[0]
    second = next(d for d in everything if d["label"] != first["label"])
    chosen = requests.post(
        server + "/v1/models/dino:predict",
        json={
            "instances": [{"b64": _b64(image)}],
            "parameters": {"threshold": 0, "classes": [first["name"], second["label"]]},
        },
    ).json()["predictions"][0]["detections"]
    assert chosen and {d["label"] for d in chosen} == {first["label"], second["label"]}


_IMAGE = _b64(noise_jpeg(0))

BAD = {
    "non-JSON body": ({"data": b"instances please"}, 400, "bad_json", "not valid JSON"),
    "no instances": ({"json": {"parameters": {}}}, 400, "bad_instance", "non-empty list"),
    "empty instances": ({"json": {"instances": []}}, 400, "bad_instance", "non-empty list"),
    "instance of another shape": ({"json": {"instances": [{"img": _IMAGE}]}}, 400, "bad_instance", "instances[0]"),
    "base64 garbage": ({"json": {"instances": [{"b64": "%%%"}]}}, 400, "bad_base64", "instances[0].b64"),
    "undecodable image": (
        {"json": {"instances": [{"b64": _IMAGE}, {"image": {"b64": _b64(b"plain text, no picture")}}]}},
        415,
        "unsupported_image",
        "instances[1]: The data is not an image",
    ),
    "unknown parameter": (
        {"json": {"instances": [{"b64": _IMAGE}], "parameters": {"score": 0.5}}},
        400,
        "bad_parameter",
        "'score'",
    ),
    "bad threshold": (
        {"json": {"instances": [{"b64": _IMAGE}], "parameters": {"threshold": "high"}}},
        400,
        "bad_parameter",
        "threshold",
    ),
    "unknown class": (
        {"json": {"instances": [{"b64": _IMAGE}], "parameters": {"classes": ["unicorn"]}}},
        400,
        "bad_parameter",
        "'unicorn'",
    ),
    "unknown top-level key": (
        {"json": {"instances": [{"b64": _IMAGE}], "signature_name": "x"}},
        400,
        "bad_request",
        "'signature_name'",
    ),
    "more instances than the queue": (
        {"json": {"instances": [{"b64": _IMAGE}] * 9}},
        413,
        "too_many_images",
        "at most 8",
    ),
    "oversized request": ({"data": b"{" * (1024 * 1024 + 1)}, 413, "request_entity_too_large", "1 MiB limit"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_requests_get_4xx_json(server, case):
    kwargs, status, code, words = BAD[case]
    response = requests.post(server + "/v1/models/dino:predict", **kwargs)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code and words in body["error"], body


def test_unknown_model_and_wrong_method(server):
    other = requests.post(server + "/v1/models/yolo:predict", json={"instances": [{"b64": _IMAGE}]})
    assert other.status_code == 404 and other.json()["code"] == "model_not_found"
    explain = requests.post(server + "/v1/models/dino:explain", json={"instances": [{"b64": _IMAGE}]})
    assert explain.status_code == 404 and explain.json()["code"] == "not_found"
    wrong = requests.get(server + "/v1/models/dino:predict")
    assert wrong.status_code == 405 and wrong.json()["code"] == "method_not_allowed"


def test_token_is_required_for_predict_only(make_app, encode):
    client = make_app(API_TOKEN="s3cret").test_client()
    body = {"instances": [{"b64": _b64(encode(Image.new("RGB", (64, 48))))}]}
    assert client.post("/v1/models/dino:predict", json=body).status_code == 401
    assert client.get("/v1/models").status_code == 200 and client.get("/v1/models/dino").status_code == 200
    answer = client.post("/v1/models/dino:predict", json=body, headers={"Authorization": "Bearer s3cret"})
    assert answer.status_code == 200 and [d["label"] for d in answer.get_json()["predictions"][0]["detections"]] == [
        18,
        1,
    ]


def test_a_server_waiting_for_a_model_answers_503(tmp_path):
    env = {**SERVER_ENV, "DINO_CHECKPOINT": str(tmp_path / "later.pth"), "DINO_WAIT_FOR_MODEL": "true"}
    with small_server(tmp_path, env, ready="/healthz") as url:
        assert requests.get(url + "/v1/models").json() == {"models": ["dino"]}
        ready = requests.get(url + "/v1/models/dino")
        assert ready.status_code == 503 and ready.headers["Retry-After"]
        assert ready.json()["code"] == "model_waiting" and "waiting for a model" in ready.json()["error"]
        predict = requests.post(url + "/v1/models/dino:predict", json={"instances": [{"b64": _IMAGE}]})
        assert predict.status_code == 503 and predict.json()["code"] == "model_waiting"
