"""Fixtures for the web client: a scriptable fake API on 127.0.0.1, the app and its test client, a self-signed
certificate for 127.0.0.1."""

from __future__ import annotations

import datetime
import ipaddress
import threading
import time
from pathlib import Path

import pytest
from flask import Flask, jsonify, request
from werkzeug.serving import make_server

from dinops.client.app import create_app

CHROMIUM = Path("/usr/bin/chromium")


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives a real headless Chromium (its own CI stage)")


class FakeApi:
    """Answers /v1/detect with whatever ``self.reply`` says, and records what it received."""

    def __init__(self) -> None:
        self.reply: dict = {}
        self.ready_reply: dict = {}  # what /readyz answers: {"status": 503, "json": {...}}; empty: 200 ready
        self.training_reply: dict = {}  # what /v1/training answers: {"status": ..., "json": ... or "raw": ...}
        self.training_auth: list[str | None] = []  # the Authorization header of each /v1/training request
        self.received: list[dict] = []
        app = Flask("fake_api")

        @app.post("/v1/detect")
        def detect():
            self.received.append(
                {"args": dict(request.args), "type": request.mimetype, "body": request.get_data(),
                 "auth": request.headers.get("Authorization")}
            )  # fmt: skip
            if self.reply.get("sleep"):
                time.sleep(self.reply["sleep"])
            status = self.reply.get("status", 200)
            if "raw" in self.reply:
                return self.reply["raw"], status, {"Content-Type": "text/html"}
            response = jsonify(self.reply.get("json", {}))
            response.status_code = status
            response.headers.update(self.reply.get("headers", {}))
            return response

        @app.get("/v1/training")
        def training():
            self.training_auth.append(request.headers.get("Authorization"))
            status = self.training_reply.get("status", 200)
            if "raw" in self.training_reply:
                return self.training_reply["raw"], status, {"Content-Type": "text/html"}
            response = jsonify(self.training_reply.get("json", {"state": "not_started", "served": None}))
            response.status_code = status
            return response

        @app.get("/readyz")
        def readyz():
            response = jsonify(self.ready_reply.get("json", {"status": "ready"}))
            response.status_code = self.ready_reply.get("status", 200)
            return response

        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="session")
def _fake_api():
    api = FakeApi()
    yield api
    api.server.shutdown()


@pytest.fixture
def fake_api(_fake_api):
    _fake_api.reply, _fake_api.received, _fake_api.ready_reply = {}, [], {}
    _fake_api.training_reply, _fake_api.training_auth = {}, []
    return _fake_api


@pytest.fixture
def make_client(fake_api):
    def _make(**overrides):
        return create_app({"TESTING": True, "API_URL": fake_api.url, **overrides}).test_client()

    return _make


@pytest.fixture
def client(make_client):
    return make_client()


def write_self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (valid for one day) and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dinops-client test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "tls.crt", folder / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture(scope="session")
def make_tls_pair():
    return write_self_signed


@pytest.fixture
def tls_pair(tmp_path):
    return write_self_signed(tmp_path / "tls")


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail("the browser test needs Debian's chromium: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]  # fmt: skip
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        yield browser
        browser.close()
