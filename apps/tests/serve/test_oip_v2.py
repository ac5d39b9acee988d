"""The Open Inference Protocol V2 over real HTTP: `dinops serve` under gunicorn with the small DINO, driven by
Triton's own client library (tritonclient[http]) and by hand-made bodies, JSON and binary, good and bad."""

from __future__ import annotations

import base64
import json
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from PIL import Image
from tritonclient.utils import InferenceServerException

from dinops.serve.testing import noise_jpeg, small_server

SERVER_ENV = {
    "DINO_MIN_SIZE": "64",
    "DINO_MAX_SIZE": "96",
    "DINO_BATCH_MAX_WAIT_MS": "100",
    "DINO_CPU_BATCH_MAX_SIZE": "8",  # the batching tests run on a CPU
    "DINO_THREADS": "16",
    "DINO_MAX_UPLOAD_MB": "1",
    "DINO_QUEUE_SIZE": "16",
}
OUTPUTS = ["boxes", "scores", "labels", "num_detections"]
HEADER = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with small_server(tmp_path_factory.mktemp("serve"), SERVER_ENV, seed=1) as url:
        yield url


@pytest.fixture
def client(server):
    with triton.InferenceServerClient(server.removeprefix("http://")) as client:
        yield client


def _detect(url: str, image: bytes, **params) -> dict:
    response = requests.post(url + "/v1/detect", params=params, data=image, headers={"Content-Type": "image/jpeg"})
    assert response.status_code == 200, response.text
    return response.json()


def _assert_row_is(answer: dict, boxes, scores, labels, count) -> None:
    """One image's row of the V2 outputs holds /v1/detect's detections, then padding."""
    detections = answer["detections"]
    assert count == len(detections)
    assert labels[:count].tolist() == [d["label"] for d in detections]
    assert scores[:count].tolist() == pytest.approx([d["score"] for d in detections], abs=5e-5)
    assert boxes[:count].reshape(-1).tolist() == pytest.approx([c for d in detections for c in d["box"]], abs=5e-3)
    assert (labels[count:] == -1).all() and (scores[count:] == 0).all() and (boxes[count:] == 0).all()


def test_health_and_metadata_through_tritonclient(server, client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("dino") and client.is_model_ready("dino", "1")
    assert not client.is_model_ready("yolo") and not client.is_model_ready("dino", "2")
    assert client.get_server_metadata() == {"name": "dinops", "version": "0.1.0", "extensions": ["binary_tensor_data"]}
    metadata = client.get_model_metadata("dino")
    assert metadata == client.get_model_metadata("dino", "1")
    assert metadata == {
        "name": "dino",
        "versions": ["1"],
        "platform": "dinops_pytorch",
        "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [
            {"name": "boxes", "datatype": "FP32", "shape": [-1, -1, 4]},
            {"name": "scores", "datatype": "FP32", "shape": [-1, -1]},
            {"name": "labels", "datatype": "INT64", "shape": [-1, -1]},
            {"name": "num_detections", "datatype": "INT32", "shape": [-1]},
        ],
    }
    with pytest.raises(InferenceServerException, match="'yolo' is not served here") as error:
        client.get_model_metadata("yolo")
    assert error.value.status() == "404"
    assert requests.get(server + "/v2/models").json() == {"models": ["dino"]}
    assert requests.get(server + "/v2/health/live").json() == {"live": True}


@pytest.mark.parametrize("binary_in", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["binary-out", "json-out"])
def test_tritonclient_infer_equals_v1_detect(server, client, binary_in, binary_out):
    image = noise_jpeg(0)
    expected = _detect(server, image, threshold=0, max_detections=5)
    tensor = triton.InferInput("image", [1], "BYTES")
    # JSON strings must be UTF-8 text: raw JPEG bytes go as binary data, as base64 text in JSON.
    tensor.set_data_from_numpy(
        np.array([image if binary_in else base64.b64encode(image)], dtype=np.object_), binary_data=binary_in
    )
    outputs = [triton.InferRequestedOutput(name, binary_data=binary_out) for name in OUTPUTS]
    result = client.infer(
        "dino", [tensor], outputs=outputs, request_id="req-7", parameters={"threshold": 0, "max_detections": 5}
    )
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_name"] == "dino" and response["model_version"] == "1"
    assert response["parameters"] == {"threshold": 0.0, "max_detections": 5}
    for name in OUTPUTS:
        assert ("binary_data_size" in result.get_output(name).get("parameters", {})) == binary_out
    boxes, scores = result.as_numpy("boxes"), result.as_numpy("scores")
    labels, counts = result.as_numpy("labels"), result.as_numpy("num_detections")
    assert (boxes.dtype, scores.dtype, labels.dtype, counts.dtype) == (np.float32, np.float32, np.int64, np.int32)
    assert boxes.shape == (1, 5, 4) and scores.shape == labels.shape == (1, 5) and counts.tolist() == [5]
    _assert_row_is(expected, boxes[0], scores[0], labels[0], 5)


def test_several_images_in_one_request_are_batched_and_padded(server, client):
    images = [noise_jpeg(seed) for seed in (3, 4, 5)]  # one size: a batch computes exactly what single requests do
    alone = [_detect(server, image, threshold=0, max_detections=100) for image in images]
    threshold = alone[0]["detections"][9]["score"]  # image 0 keeps about 10: the others keep other numbers
    expected = [_detect(server, image, threshold=threshold) for image in images]
    counts = [len(answer["detections"]) for answer in expected]
    assert len(set(counts)) > 1, counts  # the padding is exercised
    tensor = triton.InferInput("image", [3], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=np.object_), binary_data=True)
    result = client.infer("dino", [tensor], parameters={"threshold": threshold})  # no outputs: all, binary
    boxes, scores, labels = result.as_numpy("boxes"), result.as_numpy("scores"), result.as_numpy("labels")
    assert result.as_numpy("num_detections").tolist() == counts
    assert boxes.shape == (3, max(counts), 4) and scores.shape == labels.shape == (3, max(counts))
    for row, answer in enumerate(expected):
        _assert_row_is(answer, boxes[row], scores[row], labels[row], counts[row])


def test_images_of_different_sizes_and_no_detections(server, client):
    images = [noise_jpeg(1, (120, 90)), noise_jpeg(2, (64, 160)), noise_jpeg(6, (200, 50))]
    tensor = triton.InferInput("image", [3], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=np.object_), binary_data=True)
    result = client.infer("dino", [tensor], parameters={"threshold": 0.0, "max_detections": 7})
    boxes, scores = result.as_numpy("boxes"), result.as_numpy("scores")
    assert result.as_numpy("num_detections").tolist() == [7, 7, 7] and boxes.shape == (3, 7, 4)
    assert (np.diff(scores, axis=1) <= 0).all()  # best first
    for row, (width, height) in enumerate([(120, 90), (64, 160), (200, 50)]):  # pixels of each original image
        assert (boxes[row, :, 0::2] <= width).all() and (boxes[row, :, 1::2] <= height).all()
    nothing = client.infer("dino", [tensor], parameters={"threshold": 1.0})  # nothing scores 1: K = 0
    assert nothing.as_numpy("boxes").shape == (3, 0, 4) and nothing.as_numpy("labels").shape == (3, 0)
    assert nothing.as_numpy("num_detections").tolist() == [0, 0, 0]


def test_json_request_by_hand_with_an_output_subset(server):
    image = noise_jpeg(0)
    expected = _detect(server, image, threshold=0.1, classes="person,2,3")
    body = {
        "id": "42",
        "parameters": {"threshold": 0.1, "classes": ["person", 2, "3"]},
        "inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [[base64.b64encode(image).decode()]]}],
        "outputs": [{"name": "num_detections"}, {"name": "labels"}],
    }
    response = requests.post(server + "/v2/models/dino/versions/1/infer", json=body)
    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    assert HEADER not in response.headers
    answer = response.json()
    assert answer["id"] == "42" and [o["name"] for o in answer["outputs"]] == ["num_detections", "labels"]
    count = len(expected["detections"])
    assert answer["outputs"][0] == {"name": "num_detections", "datatype": "INT32", "shape": [1], "data": [count]}
    assert answer["outputs"][1]["data"] == [d["label"] for d in expected["detections"]]
    assert set(answer["outputs"][1]["data"]) <= {1, 2, 3}


def test_binary_request_and_response_by_hand(server):
    """The wire format of the extension, written and read without any client library."""
    images = [noise_jpeg(0), noise_jpeg(1)]
    tensor = b"".join(struct.pack("<I", len(image)) + image for image in images)
    head = {
        "inputs": [
            {"name": "image", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(tensor)}}
        ],
        "outputs": [{"name": "scores", "parameters": {"binary_data": True}}, {"name": "num_detections"}],
        "parameters": {"max_detections": 3, "threshold": 0},
    }
    text = json.dumps(head).encode()
    response = requests.post(
        server + "/v2/models/dino/infer",
        data=text + tensor,
        headers={HEADER: str(len(text)), "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers[HEADER])
    answer = json.loads(response.content[:length])
    scores, counts = answer["outputs"]
    assert scores["parameters"] == {"binary_data_size": 2 * 3 * 4} and "data" not in scores
    assert counts["data"] == [3, 3] and len(response.content) == length + 24
    values = np.frombuffer(response.content[length:], "<f4").reshape(2, 3)
    for row, image in enumerate(images):
        assert values[row].tolist() == pytest.approx(
            [d["score"] for d in _detect(server, image, threshold=0, max_detections=3)["detections"]], abs=5e-5
        )
    raw = requests.post(server + "/v2/models/dino/infer", data=images[1], headers={HEADER: "0"})
    assert raw.status_code == 200, raw.text  # raw binary request: the body is the one image, outputs binary
    answer = json.loads(raw.content[: int(raw.headers[HEADER])])
    assert [o["name"] for o in answer["outputs"]] == OUTPUTS
    assert all("binary_data_size" in o["parameters"] for o in answer["outputs"])


def test_concurrent_requests_share_forward_passes(server):
    def metric(name: str) -> float:
        for line in requests.get(server + "/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(name)

    before_sum, before_count = metric("dino_batch_size_sum"), metric("dino_batch_size_count")

    def infer(seed: int) -> int:
        image = noise_jpeg(seed)
        tensor = struct.pack("<I", len(image)) + image
        text = json.dumps(
            {
                "inputs": [
                    {
                        "name": "image",
                        "shape": [1],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(tensor)},
                    }
                ]
            }
        ).encode()
        response = requests.post(server + "/v2/models/dino/infer", data=text + tensor, headers={HEADER: str(len(text))})
        assert response.status_code == 200, response.text
        return json.loads(response.content)["outputs"][3]["data"][0]

    with ThreadPoolExecutor(10) as pool:
        list(pool.map(infer, range(10)))
    assert metric("dino_batch_size_sum") - before_sum == 10
    assert metric("dino_batch_size_count") - before_count < 10  # some requests shared a forward pass


def _json_infer(data=None, **changes) -> dict:
    tensor = {
        "name": "image",
        "shape": [1],
        "datatype": "BYTES",
        "data": data or [base64.b64encode(noise_jpeg(0)).decode()],
    }
    body = {"inputs": [tensor]}
    for key, value in changes.items():  # input_<key> changes the tensor (None: drops the key), <key> the request
        if key.startswith("input_"):
            tensor[key.removeprefix("input_")] = value
            if value is None:
                del tensor[key.removeprefix("input_")]
        else:
            body[key] = value
    return body


def _binary(tensor: bytes, size: int | None = None, header: int | None = None) -> dict:
    text = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": size if size is not None else len(tensor)},
                }
            ]
        }
    ).encode()
    return {"data": text + tensor, "headers": {HEADER: str(len(text) if header is None else header)}}


def _nested(value, depth: int):
    for _ in range(depth):
        value = [value]
    return value


_IMAGE = noise_jpeg(0)
_ELEMENT = struct.pack("<I", len(_IMAGE)) + _IMAGE

BAD = {
    "wrong datatype": ({"json": _json_infer(input_datatype="FP32")}, 400, "bad_input", "must be BYTES"),
    "wrong shape, rank 2": ({"json": _json_infer(input_shape=[1, 1])}, 400, "bad_input", "shape [N]"),
    "shape and data disagree": ({"json": _json_infer(input_shape=[2])}, 400, "bad_input", "its shape says [2]"),
    "missing input": ({"json": {"inputs": []}}, 400, "bad_input", "'image'"),
    "input of another name": ({"json": _json_infer(input_name="input-0")}, 400, "bad_input", "exactly one input"),
    "undecodable image": ({"json": _json_infer(["bm90IGFuIGltYWdl"])}, 415, "unsupported_image", "element 0"),
    "base64 garbage": ({"json": _json_infer(["@@not base64@@"])}, 400, "bad_base64", "not valid base64"),
    "binary size beyond the body": (
        _binary(_ELEMENT, size=len(_ELEMENT) + 10),
        400,
        "binary_size_mismatch",
        "only",
    ),
    "bytes left over": (
        _binary(_ELEMENT + b"xyz", size=len(_ELEMENT)),
        400,
        "binary_size_mismatch",
        "3 bytes follow",
    ),
    "element length beyond its tensor": (
        _binary(struct.pack("<I", 10**6) + _IMAGE),
        400,
        "binary_size_mismatch",
        "element 0 says 1000000 bytes",
    ),
    "header longer than the body": (_binary(_ELEMENT, header=10**6), 400, "bad_header", "longer than the body"),
    "header not a number": ({**_binary(_ELEMENT, header=None), "headers": {HEADER: "ten"}}, 400, "bad_header", "ten"),
    "binary data without the header": (
        {"data": _binary(_ELEMENT)["data"]},
        400,
        "bad_json",
        "not valid JSON",
    ),
    "unknown output": ({"json": _json_infer(outputs=[{"name": "masks"}])}, 400, "bad_output", "'masks'"),
    "output name not a string": ({"json": _json_infer(outputs=[{"name": ["boxes"]}])}, 400, "bad_output", "['boxes']"),
    "binary_data_size without the header": (
        {"json": _json_infer(input_parameters={"binary_data_size": 10}, input_data=None)},
        400,
        "bad_header",
        "no Inference-Header-Content-Length",
    ),
    "unknown parameter": ({"json": _json_infer(parameters={"treshold": 0.5})}, 400, "bad_parameter", "'treshold'"),
    "threshold out of range": ({"json": _json_infer(parameters={"threshold": 2})}, 400, "bad_parameter", "between 0"),
    "non-JSON body": ({"data": b"hello"}, 400, "bad_json", "not valid JSON"),
    "JSON but not an object": ({"json": [1, 2]}, 400, "bad_json", "must be a JSON object"),
    "JSON nested past the parser": ({"data": b"[" * 100_000}, 400, "bad_json", "nested too deeply"),
    "data nested 500 deep": ({"json": _json_infer(_nested(["AAAA"], 500))}, 415, "unsupported_image", "element 0"),
    "oversized request": ({"data": b"x" * (1024 * 1024 + 1)}, 413, "request_entity_too_large", "1 MiB limit"),
    "more images than the queue": (
        {"json": _json_infer(["AAAA"] * 17, input_shape=[17])},
        413,
        "too_many_images",
        "at most 16 are accepted (DINO_MAX_IMAGES_PER_REQUEST)",
    ),
    "compressed body": (
        {"json": _json_infer(), "headers": {"Content-Encoding": "gzip"}},
        415,
        "unsupported_encoding",
        "gzip",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_requests_get_4xx_json(server, case):
    kwargs, status, code, words = BAD[case]
    response = requests.post(server + "/v2/models/dino/infer", **kwargs)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code and words in body["error"], body


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("/v2/models/yolo/infer", "model_not_found", "'yolo' is not served here: this server serves 'dino'"),
        ("/v2/models/dino/versions/7/infer", "model_version_not_found", "no version '7'"),
    ],
)
def test_unknown_model_or_version_is_404(server, path, code, words):
    response = requests.post(server + path, json=_json_infer())
    assert response.status_code == 404 and response.json()["code"] == code and words in response.json()["error"]


def test_tritonclient_raises_the_servers_message(client):
    tensor = triton.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([_IMAGE[:300]], dtype=np.object_), binary_data=True)  # a truncated JPEG
    with pytest.raises(InferenceServerException, match="element 0: The image header could not be read") as error:
        client.infer("dino", [tensor])
    assert error.value.status() == "400"
    tensor.set_data_from_numpy(np.array([_IMAGE], dtype=np.object_), binary_data=True)
    with pytest.raises(InferenceServerException, match="Unknown output 'masks'"):
        client.infer("dino", [tensor], outputs=[triton.InferRequestedOutput("masks")])


def test_a_server_waiting_for_a_model_is_live_not_ready(tmp_path):
    env = {**SERVER_ENV, "DINO_CHECKPOINT": str(tmp_path / "not-yet.pth"), "DINO_WAIT_FOR_MODEL": "true"}
    with small_server(tmp_path, env, ready="/healthz") as url:
        with triton.InferenceServerClient(url.removeprefix("http://")) as client:
            assert client.is_server_live() and not client.is_server_ready() and not client.is_model_ready("dino")
            assert client.get_model_metadata("dino")["name"] == "dino"  # static: known before the model is
            tensor = triton.InferInput("image", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([_IMAGE], dtype=np.object_), binary_data=True)
            with pytest.raises(InferenceServerException, match="waiting for a model") as error:
                client.infer("dino", [tensor])
            assert error.value.status() == "503"
        ready = requests.get(url + "/v2/health/ready")
        assert ready.status_code == 503 and ready.json()["code"] == "model_waiting" and ready.headers["Retry-After"]


def test_known_answers_token_and_model_name_in_process(make_app, encode, fake_answer):
    """With the fake model whose answers are known: the exact layout, the token, another DINO_MODEL_NAME."""
    client = make_app(API_TOKEN="s3cret", MODEL_NAME="detr").test_client()
    body = _json_infer([base64.b64encode(encode(Image.new("RGB", (400, 200)))).decode()])
    assert client.post("/v2/models/detr/infer", json=body).status_code == 401
    assert client.get("/v2/models/detr").status_code == 200 and client.get("/v2/health/ready").status_code == 200
    response = client.post("/v2/models/detr/infer", json=body, headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200, response.get_json()
    outputs = {o["name"]: o for o in response.get_json()["outputs"]}
    assert outputs["num_detections"]["data"] == [2] and outputs["labels"]["data"] == [18, 1]  # 0.2 < threshold 0.3
    assert outputs["scores"]["data"] == pytest.approx([0.9, 0.6]) and outputs["boxes"]["shape"] == [1, 2, 4]
    (cx, cy, w, h), _ = fake_answer["boxes"][:2]
    assert outputs["boxes"]["data"][:4] == pytest.approx(
        [(cx - w / 2) * 400, (cy - h / 2) * 200, (cx + w / 2) * 400, (cy + h / 2) * 200]
    )
    other = client.post("/v2/models/dino/infer", json=body, headers={"Authorization": "Bearer s3cret"})
    assert other.status_code == 404 and "serves 'detr' (DINO_MODEL_NAME)" in other.get_json()["error"]


@pytest.mark.parametrize("name", ["a/b", "", "dino:predict", "-x"])
def test_a_model_name_that_cannot_go_into_a_path_is_refused(name):
    from dinops.serve.app import settings_config
    from dinops.settings import SettingsError

    with pytest.raises(SettingsError, match="DINO_MODEL_NAME"):
        settings_config({"DINO_MODEL_NAME": name})
