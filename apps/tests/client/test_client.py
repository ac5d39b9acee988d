"""The web client's server side: the page, the proxy to the API, and every failure in plain words."""

from __future__ import annotations

import logging

import pytest

from dinops.client.app import create_app
from dinops.client.cli import main as client_main
from dinops.serve.testing import free_port

ANSWER = {
    "width": 640,
    "height": 480,
    "detections": [{"box": [1.5, 2, 300, 400], "label": 18, "name": "dog", "score": 0.91, "extra": "<b>x</b>"}],
    "model": {"checkpoint": "/secret/path.pth"},
}


def test_page_has_settings_and_a_strict_policy(make_client):
    response = make_client(THRESHOLD=0.45, MAX_UPLOAD_MB=3).get("/")
    html = response.get_data(as_text=True)
    assert response.status_code == 200
    assert 'data-threshold="0.45"' in html and 'value="0.45"' in html
    assert f'data-max-bytes="{3 * 2**20}"' in html and "up to 3 MB" in html
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    with make_client().get("/static/app.js") as static:
        js = static.get_data(as_text=True)
    assert "innerHTML" not in js and "textContent" in js


def test_detect_forwards_the_image_and_returns_only_known_fields(client, fake_api):
    fake_api.reply = {"json": ANSWER}
    response = client.post("/api/detect", data=b"\x89PNG fake", content_type="image/png")
    body = response.get_json()
    assert response.status_code == 200
    assert body["detections"] == [{"box": [1.5, 2.0, 300.0, 400.0], "label": 18, "name": "dog", "score": 0.91}]
    assert (body["width"], body["height"]) == (640, 480) and body["latency_ms"] >= 0
    assert "model" not in body
    sent = fake_api.received[0]
    assert sent["body"] == b"\x89PNG fake" and sent["type"] == "image/png"
    assert sent["args"] == {"threshold": "0", "max_detections": "100"} and sent["auth"] is None


def test_a_detection_without_a_name_is_not_shown(client, fake_api, caplog):
    unnamed = [{"box": [0, 0, 5, 5], "label": 0, "score": 0.8}] + [
        {"box": [0, 0, 5, 5], "label": 12, "name": name, "score": 0.5} for name in ("", " ", None, 7)
    ]
    fake_api.reply = {"json": {**ANSWER, "detections": ANSWER["detections"] + unnamed}}
    with caplog.at_level(logging.WARNING, "dinops.client.app"):
        body = client.post("/api/detect", data=b"x", content_type="image/png").get_json()
    assert body["detections"] == [{"box": [1.5, 2.0, 300.0, 400.0], "label": 18, "name": "dog", "score": 0.91}]
    assert caplog.text.count("the API answered class 12 without a name: not shown") == 4
    assert "class 0 without a name" in caplog.text


def test_token_is_forwarded(make_client, fake_api):
    fake_api.reply = {"json": ANSWER}
    make_client(API_TOKEN="tok").post("/api/detect", data=b"x", content_type="image/jpeg")
    assert fake_api.received[0]["auth"] == "Bearer tok"


@pytest.mark.parametrize(
    ("reply", "status", "words"),
    [
        ({"status": 503, "json": {"error": "busy"}, "headers": {"Retry-After": "7"}}, 503, "Try again in 7 seconds"),
        ({"status": 415, "json": {"error": "Not an image."}}, 415, "The image was rejected: Not an image."),
        ({"status": 413, "json": {"error": "too large"}}, 413, "The image was rejected: too large"),
        ({"status": 401, "json": {"error": "token"}}, 502, "not allowed to use the detection service"),
        ({"status": 500, "raw": "<html>Traceback</html>"}, 502, "failed (HTTP 500)"),
        ({"status": 200, "raw": "<html>not json</html>"}, 502, "does not understand"),
        ({"json": {"width": 1, "height": 1, "detections": [{"box": [1, 2], "label": 1, "score": 1}]}}, 502,
         "does not understand"),
        ({"json": {"width": 1, "height": 1, "detections": [{"box": [1, 2, 3, "x"], "label": 1, "score": 1}]}}, 502,
         "does not understand"),
    ],
)  # fmt: skip
def test_api_failures_in_plain_words(client, fake_api, reply, status, words):
    fake_api.reply = reply
    response = client.post("/api/detect", data=b"x", content_type="image/jpeg")
    assert response.status_code == status
    assert words in response.get_json()["error"]
    assert "Traceback" not in response.get_data(as_text=True)
    if status == 503:
        assert response.headers["Retry-After"] == "7"


def test_api_down_and_slow(make_client, fake_api):
    down = make_client(API_URL=f"http://127.0.0.1:{free_port()}").post(
        "/api/detect", data=b"x", content_type="image/png"
    )
    assert down.status_code == 502 and "cannot be reached" in down.get_json()["error"]
    fake_api.reply = {"sleep": 1.0, "json": ANSWER}
    slow = make_client(API_TIMEOUT_S=0.2).post("/api/detect", data=b"x", content_type="image/png")
    assert slow.status_code == 504 and "did not answer within 0.2 seconds" in slow.get_json()["error"]


@pytest.mark.parametrize(
    ("kwargs", "status", "words"),
    [
        ({"data": b"x", "content_type": "text/plain"}, 415, "choose an image file"),
        ({"data": b"", "content_type": "image/png"}, 400, "empty"),
        ({"data": b"x" * (2 * 2**20), "content_type": "image/png"}, 413, "larger than the 1 MB limit"),
    ],
)
def test_bad_uploads(make_client, fake_api, kwargs, status, words):
    response = make_client(MAX_UPLOAD_MB=1).post("/api/detect", **kwargs)
    assert response.status_code == status and words in response.get_json()["error"]
    assert fake_api.received == []


def test_uploads_never_touch_the_disk(client, fake_api, monkeypatch):
    import tempfile

    def forbidden(*args, **kwargs):
        raise AssertionError("an upload was about to be written to disk")

    for name in ("SpooledTemporaryFile", "TemporaryFile", "NamedTemporaryFile", "mkstemp"):
        monkeypatch.setattr(tempfile, name, forbidden)
    fake_api.reply = {"json": ANSWER}
    response = client.post("/api/detect", data=b"\xff\xd8" + b"j" * 3_000_000, content_type="image/jpeg")
    assert response.status_code == 200 and len(fake_api.received[0]["body"]) == 3_000_002


def test_threshold_env_and_its_old_misspelling(monkeypatch, caplog):
    monkeypatch.setenv("TRESHOLD", "0.4")
    with caplog.at_level(logging.WARNING):
        assert create_app().config["THRESHOLD"] == 0.4
    assert "TRESHOLD is deprecated; use THRESHOLD" in caplog.text
    monkeypatch.setenv("THRESHOLD", "0.6")
    assert create_app().config["THRESHOLD"] == 0.6


def test_readyz_reports_the_api(client, make_client):
    assert client.get("/readyz").get_json() == {"status": "ready", "api": "ready"}
    down = make_client(API_URL=f"http://127.0.0.1:{free_port()}")
    assert down.get("/readyz").get_json() == {"status": "ready", "api": "unreachable"}
    assert client.get("/healthz").get_json() == {"status": "alive"}


def test_cli_rejects_bad_settings(monkeypatch, capsys):
    monkeypatch.setenv("DINO_API_ULR", "http://x")
    assert client_main([]) == 2
    assert "DINO_API_ULR" in capsys.readouterr().err
    monkeypatch.delenv("DINO_API_ULR")
    monkeypatch.setenv("THRESHOLD", "2")
    assert client_main([]) == 2
    assert "THRESHOLD='2'" in capsys.readouterr().err


def test_docs_list_every_setting():
    from pathlib import Path

    from dinops.client.settings import SETTINGS
    from dinops.settings import markdown_table

    text = (Path(__file__).resolve().parents[3] / "docs" / "client.md").read_text()
    documented = text.split("<!-- settings:client -->\n", 1)[1].split("\n<!-- /settings:client -->", 1)[0]
    assert documented == markdown_table(SETTINGS), "regenerate the table in docs/client.md from dinops.client.settings"


def test_client_never_imports_torch():
    import subprocess
    import sys

    code = "import sys, dinops.client.cli, dinops.client.app; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
