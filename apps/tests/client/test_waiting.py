"""The API has no model yet ("waiting for a model"): the client says so in plain words, not as a generic error."""

from __future__ import annotations

import pytest

PATH = "/models/checkpoint.pth"
WAITING = {
    "error": f"waiting for a model: {PATH} does not exist yet; train, or give a checkpoint",
    "code": "model_waiting",
    "model": "waiting",
    "checkpoint": PATH,
}


@pytest.mark.parametrize(
    "body",
    [WAITING, {"error": WAITING["error"], "code": "model_waiting"}, {"error": WAITING["error"]}],
    ids=["full", "no-checkpoint-key", "message-only"],
)
def test_waiting_for_a_model_in_plain_words(client, fake_api, body):
    fake_api.reply = {"status": 503, "json": body, "headers": {"Retry-After": "5"}}
    response = client.post("/api/detect", data=b"x", content_type="image/jpeg")
    answer = response.get_json()
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert answer["error"].startswith(f"The model is not there yet: waiting for a model ({PATH}) …")
    assert "Try again in 5 seconds" in answer["error"] and answer["model"] == "waiting"


def test_a_model_that_failed_to_load_is_named(client, fake_api):
    body = {"error": f"The model failed to load: checkpoint {PATH} cannot be used: bad zip", "code": "model_failed"}
    fake_api.reply = {"status": 503, "json": body, "headers": {"Retry-After": "5"}}
    answer = client.post("/api/detect", data=b"x", content_type="image/jpeg").get_json()
    assert "could not be loaded" in answer["error"] and "bad zip" in answer["error"] and answer["model"] == "failed"


def test_other_503s_stay_generic(client, fake_api):
    fake_api.reply = {"status": 503, "json": {"error": "busy", "code": "busy"}, "headers": {"Retry-After": "2"}}
    answer = client.post("/api/detect", data=b"x", content_type="image/jpeg").get_json()
    assert "busy or still loading" in answer["error"] and "model" not in answer


def test_readyz_reports_an_api_waiting_for_a_model(client, fake_api):
    fake_api.ready_reply = {"status": 503, "json": {"status": "waiting for a model", "checkpoint": PATH}}
    assert client.get("/readyz").get_json() == {"status": "ready", "api": f"waiting for a model ({PATH})"}
    fake_api.ready_reply = {"status": 503, "json": {"status": "loading"}}
    assert client.get("/readyz").get_json() == {"status": "ready", "api": "not ready (HTTP 503)"}
