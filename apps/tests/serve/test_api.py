"""/v1/detect and /inference through Flask's test client, with a fake model whose answers are known."""

from __future__ import annotations

import io

import pytest
from PIL import Image


def _expected_box(box, width, height):
    cx, cy, w, h = box
    return [
        round((cx - w / 2) * width, 2),
        round((cy - h / 2) * height, 2),
        round((cx + w / 2) * width, 2),
        round((cy + h / 2) * height, 2),
    ]


def test_detect_multipart_returns_boxes_in_original_pixels(client, encode, fake_answer):
    image = encode(Image.new("RGB", (400, 200), (10, 200, 30)))
    response = client.post("/v1/detect", data={"image": (io.BytesIO(image), "a.png")})
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert (body["width"], body["height"]) == (400, 200)
    assert body["threshold"] == 0.3
    # scores 0.9 (dog) and 0.6 (person) pass the default 0.3; 0.2 does not
    assert [(d["label"], d["name"], d["score"]) for d in body["detections"]] == [(18, "dog", 0.9), (1, "person", 0.6)]
    assert [d["box"] for d in body["detections"]] == [_expected_box(fake_answer["boxes"][q], 400, 200) for q in (0, 1)]
    assert body["backend"] == "pytorch" and body["device"] == "cpu"
    assert set(body["timing"]) == {"decode_ms", "queue_ms", "inference_ms", "total_ms", "batch_size"}
    assert body["timing"]["batch_size"] == 1


def test_detect_raw_body_with_parameters(client, encode):
    image = encode(Image.new("RGB", (100, 300)), "JPEG")
    response = client.post("/v1/detect?threshold=0.1&max_detections=2", data=image, content_type="image/jpeg")
    body = response.get_json()
    assert response.status_code == 200
    assert [d["label"] for d in body["detections"]] == [18, 1]
    response = client.post("/v1/detect?threshold=0.1", data=image, content_type="image/jpeg")
    # the third query's 0.2 is for id 12, none of COCO's 80 classes: not answered
    assert [d["name"] for d in response.get_json()["detections"]] == ["dog", "person"]


@pytest.mark.parametrize(
    ("classes", "expected"), [("person", [1]), ("dog,person", [18, 1]), ("18", [18]), ("DOG", [18])]
)
def test_detect_classes_filter(client, encode, classes, expected):
    image = encode(Image.new("RGB", (64, 64)))
    response = client.post(f"/v1/detect?threshold=0.1&classes={classes}", data=image, content_type="image/png")
    assert [d["label"] for d in response.get_json()["detections"]] == expected


def test_legacy_inference_contract(client, encode, fake_answer):
    image = encode(Image.new("RGB", (320, 240)))
    response = client.post("/inference", data={"image": (io.BytesIO(image), "x.png")})
    body = response.get_json()
    assert response.status_code == 200
    assert set(body) == {"scores", "labels", "boxes"}
    assert body["labels"] == [18, 1] and body["scores"] == [0.9, 0.6]
    cx, cy, w, h = fake_answer["boxes"][0]
    assert body["boxes"][0] == pytest.approx([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], abs=1e-4)


def _truncated_png(encode):
    data = encode(Image.effect_noise((200, 200), 50).convert("RGB"))
    return data[: len(data) // 2]


def _truncated_jpeg(encode):
    data = encode(Image.effect_noise((200, 200), 50).convert("RGB"), "JPEG")
    return data[: len(data) // 3]


BAD_BODIES = {
    "empty": (lambda e, p: b"", "image/png", 400, "empty_image"),
    "text": (lambda e, p: b"hello, I am not a picture", "image/png", 415, "unsupported_image"),
    "pdf": (
        lambda e, p: b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n",
        "image/png",
        415,
        "unsupported_image",
    ),
    "truncated png": (lambda e, p: _truncated_png(e), "image/png", 400, "corrupt_image"),
    "truncated jpeg": (lambda e, p: _truncated_jpeg(e), "image/jpeg", 400, "corrupt_image"),
    "zero width": (lambda e, p: p(0, 10), "image/png", 415, "unsupported_image"),
    "decompression bomb": (lambda e, p: p(30000, 30000), "image/png", 413, "image_too_large"),
    "just over the pixel limit": (lambda e, p: p(8000, 5001), "image/png", 413, "image_too_large"),
    "thin as a thread": (lambda e, p: e(Image.new("RGB", (5000, 2))), "image/png", 400, "bad_aspect_ratio"),
    "unsupported format (ICO)": (
        lambda e, p: e(Image.new("RGB", (16, 16)), "ICO"),
        "image/x-icon",
        415,
        "unsupported_image",
    ),
}


@pytest.mark.parametrize("case", BAD_BODIES, ids=list(BAD_BODIES))
def test_bad_images_get_4xx_json(client, encode, png_with_size, case):
    make, content_type, status, code = BAD_BODIES[case]
    for response in (
        client.post("/v1/detect", data=make(encode, png_with_size), content_type=content_type),
        client.post("/inference", data={"image": (io.BytesIO(make(encode, png_with_size)), "f")}),
    ):
        body = response.get_json()
        assert response.status_code == status, body
        assert isinstance(body["error"], str) and len(body["error"]) > 20
        assert body["code"] == code


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        ("get", "/v1/detect", {}, 405, "method_not_allowed"),
        ("put", "/inference", {}, 405, "method_not_allowed"),
        ("get", "/nowhere", {}, 404, "not_found"),
        ("post", "/v1/detect", {"json": {"image": "aGVsbG8="}}, 415, "unsupported_media_type"),
        ("post", "/v1/detect", {"data": b"x", "content_type": "text/plain"}, 415, "unsupported_media_type"),
        ("post", "/v1/detect", {"data": {"picture": (io.BytesIO(b"x"), "a.png")}}, 400, "missing_image"),
        ("post", "/v1/detect?threshold=1.5", {"data": b"x", "content_type": "image/png"}, 400, "bad_parameter"),
        ("post", "/v1/detect?threshold=abc", {"data": b"x", "content_type": "image/png"}, 400, "bad_parameter"),
        ("post", "/v1/detect?max_detections=0", {"data": b"x", "content_type": "image/png"}, 400, "bad_parameter"),
        ("post", "/v1/detect?max_detections=101", {"data": b"x", "content_type": "image/png"}, 400, "bad_parameter"),
        ("post", "/v1/detect?classes=unicorn", {"data": b"x", "content_type": "image/png"}, 400, "bad_parameter"),
    ],
)
def test_bad_requests_get_4xx_json(client, method, path, kwargs, status, code):
    response = getattr(client, method)(path, **kwargs)
    assert response.status_code == status
    assert response.mimetype == "application/json"
    assert response.get_json()["code"] == code
    if status == 405:
        assert "POST" in response.headers["Allow"]


def test_oversized_upload_is_refused(make_app, encode):
    client = make_app(MAX_UPLOAD_MB=0.01).test_client()
    body = encode(Image.effect_noise((200, 200), 80).convert("RGB"))
    assert len(body) > 0.01 * 2**20
    response = client.post("/v1/detect", data=body, content_type="image/png")
    assert response.status_code == 413
    assert "0.01 MiB limit" in response.get_json()["error"]


def test_pixel_limit_is_configurable(make_app, encode):
    client = make_app(MAX_IMAGE_PIXELS=100 * 100).test_client()
    response = client.post("/v1/detect", data=encode(Image.new("RGB", (101, 100))), content_type="image/png")
    assert response.status_code == 413 and "(101x100)" in response.get_json()["error"]
    assert (
        client.post("/v1/detect", data=encode(Image.new("RGB", (100, 100))), content_type="image/png").status_code
        == 200
    )


def test_exif_rotation_is_applied(client, encode):
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: stored 40x20, shown 20x40
    image = encode(Image.new("RGB", (40, 20)), "JPEG", exif=exif)
    body = client.post("/v1/detect", data=image, content_type="image/jpeg").get_json()
    assert (body["width"], body["height"]) == (20, 40)
    assert body["detections"][0]["box"] == [5.0, 10.0, 15.0, 30.0]
