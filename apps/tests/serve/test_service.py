"""Health, readiness, metrics, OpenAPI, auth, CORS, overload and settings of the inference API."""

from __future__ import annotations

import threading

import pytest
from PIL import Image

from dinops.serve.app import create_app
from dinops.serve.cli import main as serve_main
from dinops.settings import SettingsError, without_service_links


def _metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == (f"{name}{{{wanted}}}" if labels else name):
            return float(value)
    raise AssertionError(f"{name} {labels} not in metrics")


def test_health_and_readiness(client):
    health = client.get("/healthz").get_json()
    loaded = health.pop("loaded")
    assert health == {"status": "alive", "model": "ready", "checkpoint": ""}  # no file: no "reload"
    assert loaded.pop("loaded_at").endswith("Z")
    assert loaded == {"checkpoint": "fake", "class_names": "coco"}  # an injected detector: no file, no position
    ready = client.get("/readyz")
    body = ready.get_json()
    assert ready.status_code == 200
    assert (body["status"], body["device"], body["backend"], body["checkpoint"]) == ("ready", "cpu", "pytorch", "fake")
    assert body["warmup_s"] > 0


def test_not_ready_until_loaded_then_failed_load_is_reported(make_app, fake_model):
    release = threading.Event()
    _, detector = fake_model()

    def slow_loader(config):
        release.wait(10)
        return detector

    app = make_app(DETECTOR=None, DETECTOR_LOADER=slow_loader, START=False)
    client = app.test_client()
    response = client.get("/readyz")
    assert response.status_code == 503 and response.get_json() == {"status": "loading"}
    busy = client.post("/v1/detect", data=b"x", content_type="image/png")
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "5" and busy.get_json()["code"] == "model_loading"
    release.set()
    assert app.extensions["dino"].wait(10)
    assert client.get("/readyz").status_code == 200

    def broken_loader(config):
        raise RuntimeError("checkpoint /models/x.pth does not exist")

    client = make_app(DETECTOR=None, DETECTOR_LOADER=broken_loader, START=False).test_client()
    client.get("/healthz")  # the first request starts loading
    client.application.extensions["dino"].wait(10)
    body = client.get("/readyz").get_json()
    assert body == {"status": "failed", "error": "checkpoint /models/x.pth does not exist"}
    failed = client.post("/v1/detect", data=b"x", content_type="image/png").get_json()
    assert failed["code"] == "model_failed" and "x.pth does not exist" in failed["error"]
    assert client.get("/healthz").status_code == 200


def test_metrics_count_requests_and_batches(client, encode):
    image = encode(Image.new("RGB", (32, 32)))
    for _ in range(3):
        client.post("/v1/detect", data=image, content_type="image/png")
    client.post("/v1/detect", data=b"", content_type="image/png")
    client.get("/nowhere")
    response = client.get("/metrics")
    assert response.mimetype == "text/plain"
    text = response.get_data(as_text=True)
    assert _metric(text, "dino_http_requests_total", endpoint="/v1/detect", method="POST", status="200") == 3
    assert _metric(text, "dino_http_requests_total", endpoint="/v1/detect", method="POST", status="400") == 1
    assert _metric(text, "dino_http_requests_total", endpoint="unmatched", method="GET", status="404") == 1
    assert _metric(text, "dino_batch_size_count") == 3  # the empty body never reached the model
    assert _metric(text, "dino_batch_size_sum") == 3
    assert _metric(text, "dino_http_request_duration_seconds_count", endpoint="/v1/detect") == 4
    assert _metric(text, "dino_model_ready") == 1
    assert _metric(text, "dino_queue_depth") == 0


def test_openapi_describes_every_route(app, client):
    spec = client.get("/openapi.json").get_json()
    routes = {rule.rule for rule in app.url_map.iter_rules() if rule.endpoint != "static"}
    assert set(spec["paths"]) == routes
    for path, item in spec["paths"].items():
        methods = {m.upper() for m in item}
        rule_methods = set().union(*(r.methods for r in app.url_map.iter_rules() if r.rule == path)) - {
            "HEAD",
            "OPTIONS",
        }
        assert methods == rule_methods, path
    assert spec["paths"]["/v1/detect"]["post"]["parameters"][0]["schema"]["default"] == 0.3


def test_bearer_token(make_app, encode):
    client = make_app(API_TOKEN="s3cret").test_client()
    image = encode(Image.new("RGB", (16, 16)))
    missing = client.post("/v1/detect", data=image, content_type="image/png")
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = client.post("/inference", data=image, content_type="image/png", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.get_json()["code"] == "unauthorized"
    right = client.post("/v1/detect", data=image, content_type="image/png", headers={"Authorization": "Bearer s3cret"})
    assert right.status_code == 200
    assert client.get("/healthz").status_code == 200 and client.get("/openapi.json").status_code == 200
    spec = client.get("/openapi.json").get_json()
    assert spec["paths"]["/v1/detect"]["post"]["security"] == [{"bearer": []}]


def test_cors(make_app):
    client = make_app(CORS_ORIGINS="https://a.example, https://b.example", API_TOKEN="t").test_client()
    allowed = client.options(
        "/v1/detect", headers={"Origin": "https://b.example", "Access-Control-Request-Method": "POST"}
    )
    assert allowed.status_code == 200
    assert allowed.headers["Access-Control-Allow-Origin"] == "https://b.example"
    assert "Authorization" in allowed.headers["Access-Control-Allow-Headers"]
    other = client.get("/healthz", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers
    assert (
        "Access-Control-Allow-Origin" not in make_app().test_client().get("/healthz", headers={"Origin": "x"}).headers
    )


def test_full_queue_answers_503_with_retry_after(make_app, fake_model, encode):
    model, detector = fake_model()
    app = make_app(DETECTOR=detector, QUEUE_SIZE=1, BATCH_MAX_SIZE=1)
    model.gate = threading.Event()
    image = encode(Image.new("RGB", (16, 16)))
    runtime = app.extensions["dino"]
    statuses: list[int] = []

    def post():
        statuses.append(app.test_client().post("/v1/detect", data=image, content_type="image/png").status_code)

    first = threading.Thread(target=post)
    first.start()  # taken by the batcher, held at the gate
    _wait_for(lambda: model.entered == 2)  # warm-up, then the first request
    second = threading.Thread(target=post)
    second.start()
    _wait_for(lambda: runtime.batcher.depth() == 1)  # the queue (size 1) is now full
    refused = app.test_client().post("/v1/detect", data=image, content_type="image/png")
    assert refused.status_code == 503
    assert int(refused.headers["Retry-After"]) >= 1 and refused.get_json()["code"] == "busy"
    model.gate.set()
    first.join(10)
    second.join(10)
    assert statuses == [200, 200]
    text = app.test_client().get("/metrics").get_data(as_text=True)
    assert _metric(text, "dino_queue_rejections_total") == 1


def test_request_timeout_answers_503(make_app, fake_model, encode):
    model, detector = fake_model()
    app = make_app(DETECTOR=detector, REQUEST_TIMEOUT_S=0.2)
    model.gate = threading.Event()
    try:
        response = app.test_client().post("/v1/detect", data=encode(Image.new("RGB", (8, 8))), content_type="image/png")
    finally:
        model.gate.set()
    assert response.status_code == 503 and response.get_json()["code"] == "timeout"


def _wait_for(condition, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_settings_come_from_the_environment(monkeypatch, fake_model):
    monkeypatch.setenv("DINO_THRESHOLD", "0.75")
    monkeypatch.setenv("DINO_BATCH_MAX_SIZE", "3")
    app = create_app({"DETECTOR": fake_model()[1], "BATCH_MAX_SIZE": 5})
    assert app.config["THRESHOLD"] == 0.75  # environment over default
    assert app.config["BATCH_MAX_SIZE"] == 5  # test override over environment
    monkeypatch.setenv("DINO_THRESHOLD", "1.5")
    with pytest.raises(SettingsError, match="DINO_THRESHOLD"):
        create_app()


def test_cli_refuses_unknown_variables_and_missing_checkpoint(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DINO_TRESHOLD", "0.5")
    assert serve_main([]) == 2
    assert "DINO_TRESHOLD" in capsys.readouterr().err
    monkeypatch.delenv("DINO_TRESHOLD")
    monkeypatch.setenv("DINO_API_SERVICE_HOST", "10.0.0.1")  # Kubernetes service links are not settings
    monkeypatch.setenv("DINO_API_PORT_8000_TCP_ADDR", "10.0.0.1")
    monkeypatch.delenv("DINO_CHECKPOINT", raising=False)
    assert serve_main([]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert serve_main(["--checkpoint", str(tmp_path / "missing.pth")]) == 2
    assert "missing.pth: no such file" in capsys.readouterr().err


def test_cli_accepts_the_models_own_setting_and_refuses_a_bad_value(monkeypatch, capsys, tmp_path):
    # DINO_DEFORM_ATTN is read by the model (dinops.model.ms_deform_attn_core): a pod that sets it must start, and a
    # misspelt value must stop `dinops serve` at once (exit 2, the name in the message), not at the first request.
    monkeypatch.delenv("DINO_CHECKPOINT", raising=False)
    monkeypatch.setenv("DINO_DEFORM_ATTN", "pure")
    assert serve_main(["--checkpoint", str(tmp_path / "missing.pth")]) == 2
    assert "missing.pth: no such file" in capsys.readouterr().err
    monkeypatch.setenv("DINO_DEFORM_ATTN", "fast")
    assert serve_main(["--checkpoint", str(tmp_path / "missing.pth")]) == 2
    assert "DINO_DEFORM_ATTN" in capsys.readouterr().err


def test_service_links_are_filtered():
    env = {
        "DINO_API_PORT": "tcp://1.2.3.4:80",
        "DINO_API_SERVICE_PORT_HTTP": "80",
        "DINO_API_SERVICE_HOST": "1.2.3.4",
        "DINO_API_PORT_80_TCP_ADDR": "1.2.3.4",
        "DINO_THRESHOLD": "0.2",
        "DINO_BIND": "0.0.0.0:8000",
    }
    assert without_service_links(env) == {"DINO_THRESHOLD": "0.2", "DINO_BIND": "0.0.0.0:8000"}


def test_docs_list_every_setting():
    from pathlib import Path

    from dinops.serve.settings import SETTINGS
    from dinops.settings import markdown_table

    text = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()
    documented = text.split("<!-- settings:serve -->\n", 1)[1].split("\n<!-- /settings:serve -->", 1)[0]
    assert documented == markdown_table(SETTINGS), "regenerate the table in docs/api.md from dinops.serve.settings"
