"""``GET /api/training``: the client's proxy of the API's ``/v1/training`` for the training panel. Only known fields
of known types reach the page; API failures become a sentence; behind a login like every other route."""

from __future__ import annotations

import pytest

from .test_login import log_in

RUN = {
    "state": "training",
    "epoch": 1,
    "epochs": 12,
    "step": 40,
    "steps_per_epoch": 100,
    "global_step": 140,
    "total_steps": 1200,
    "eta_s": 530.5,
    "images_per_s": 31.5,
    "step_s": 0.5,
    "loss_curve": [[1, 20.5], [140, 9.25]],
    "evaluations": [{"epoch": 0, "global_step": 100, "ap": 0.125, "ap50": 0.25, "ap75": 0.0625}],
    "checkpoint": {"path": "/out/checkpoint.pth", "saved_at": "2026-11-26T19:00:00Z", "epochs_done": 1},
    "gpu": {"name": "NVIDIA H100", "utilization_percent": 97, "memory_allocated_bytes": 2**34},
    "progress_file": "/out/progress.json",
    "updated_at": "2026-11-26T19:00:02Z",
    "served": {"checkpoint": "/out/checkpoint.pth", "loaded_at": "2026-11-26T19:00:05Z", "global_step": 100},
}


def test_the_run_is_passed_on_with_known_fields_only(make_client, fake_api):
    hostile = RUN | {
        "step": "<b>40</b>",  # not a number: left out
        "loss_curve": [[1, 20.5], [2, float("inf")], ["3", 1.0], [4], [140, 9.25]],
        "evaluations": [{"epoch": 0, "global_step": 100, "ap": 0.125, "script": "<script>"}],
        "gpu": {"name": "NVIDIA H100", "utilization_percent": 97, "extra": {"nested": True}},
        "unknown": "dropped",
    }
    fake_api.training_reply = {"json": hostile}
    answer = make_client(API_TOKEN="tok").get("/api/training")
    assert answer.status_code == 200
    body = answer.get_json()
    assert "unknown" not in body and "step" not in body
    assert body["loss_curve"] == [[1, 20.5], [140, 9.25]]
    assert body["evaluations"] == [{"epoch": 0, "global_step": 100, "ap": 0.125}]
    assert body["gpu"] == {"name": "NVIDIA H100", "utilization_percent": 97}
    assert body["checkpoint"] == {"path": "/out/checkpoint.pth", "saved_at": "2026-11-26T19:00:00Z"}
    assert body["served"] == RUN["served"]
    assert (body["state"], body["epoch"], body["eta_s"], body["progress_file"]) == (
        "training",
        1,
        530.5,
        RUN["progress_file"],
    )
    assert fake_api.training_auth == ["Bearer tok"]


@pytest.mark.parametrize(
    ("reply", "status", "message"),
    [
        ({"json": {"state": "sleeping"}}, 502, "a training report this page does not understand"),
        ({"raw": "<html>oops</html>"}, 502, "a training report this page does not understand"),
        ({"status": 500, "json": {"error": "x"}}, 502, "a training report this page does not understand"),
        ({"status": 404, "json": {"error": "not found"}}, 502, "does not report training runs"),
        ({"status": 401, "json": {"error": "token"}}, 502, "check DINO_API_TOKEN"),
    ],
    ids=["unknown-state", "html", "server-error", "old-api", "token"],
)
def test_api_failures_become_sentences(client, fake_api, reply, status, message):
    fake_api.training_reply = reply
    answer = client.get("/api/training")
    assert answer.status_code == status and message in answer.get_json()["error"]


def test_an_unreachable_api(make_client):
    answer = make_client(API_URL="http://127.0.0.1:9").get("/api/training")
    assert answer.status_code == 502 and "cannot be reached" in answer.get_json()["error"]


def test_needs_a_login_when_there_is_one(make_client, fake_api, tmp_path):
    password = tmp_path / "password"
    password.write_text("training panel password\n")
    client = make_client(PASSWORD_FILE=str(password), LOGIN_FAILURE_DELAY_S=0)
    refused = client.get("/api/training")
    assert refused.status_code == 401 and refused.get_json() == {"error": "Log in first.", "login": True}
    assert fake_api.training_auth == []  # nothing was forwarded
    log_in(client, "training panel password")
    assert client.get("/api/training").get_json()["state"] == "not_started"
    assert len(fake_api.training_auth) == 1
