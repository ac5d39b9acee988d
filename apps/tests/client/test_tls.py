"""The real client under gunicorn, published as a public deployment publishes it: HTTPS with a certificate made here,
a login, and nothing on plain HTTP."""

from __future__ import annotations

import pytest
import requests

from dinops.serve.testing import free_port, running

ANSWER = {"width": 4, "height": 4, "detections": [{"box": [0, 0, 2, 2], "label": 1, "name": "person", "score": 0.9}]}


@pytest.fixture
def public_client(tmp_path, tls_pair, fake_api, monkeypatch):
    cert, key = tls_pair
    password = tmp_path / "password"
    password.write_text("s3cret pass\n")
    port = free_port()
    env = {
        "CLIENT_PUBLIC": "true",
        "CLIENT_BIND": f"127.0.0.1:{port}",
        "CLIENT_PASSWORD_FILE": str(password),
        "CLIENT_TLS_CERT_FILE": str(cert),
        "CLIENT_TLS_KEY_FILE": str(key),
        "CLIENT_WORKERS": "2",
        "DINO_API_URL": fake_api.url,
        "DINO_API_TOKEN": "tok",
    }
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # running() polls /readyz with requests' defaults
    with running("client", env, f"https://127.0.0.1:{port}", tmp_path / "client.log", timeout=120):
        yield {"url": f"https://127.0.0.1:{port}", "port": port, "cert": str(cert)}


def test_https_with_a_login_and_nothing_on_plain_http(public_client, fake_api):
    url = public_client["url"]
    browser = requests.Session()
    browser.verify = public_client["cert"]  # verified against the certificate made for 127.0.0.1, not switched off
    first = browser.get(url + "/", timeout=10)
    assert first.url == url + "/login" and first.status_code == 200 and 'type="password"' in first.text

    anonymous = browser.post(url + "/api/detect", data=b"x", headers={"Content-Type": "image/png"}, timeout=10)
    assert anonymous.status_code == 401 and anonymous.json()["login"] is True
    assert fake_api.received == []

    wrong = browser.post(url + "/login", data={"user": "dinops", "password": "guess"}, timeout=10)
    assert wrong.status_code == 401 and "dinops_session" not in browser.cookies

    right = browser.post(url + "/login", data={"user": "dinops", "password": "s3cret pass"}, allow_redirects=False)
    assert right.status_code == 303
    cookie = right.headers["Set-Cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie

    fake_api.reply = {"json": ANSWER}
    for _ in range(6):  # two workers: each one accepts the session the other signed
        answer = browser.post(url + "/api/detect", data=b"x", headers={"Content-Type": "image/png"}, timeout=10)
        assert answer.status_code == 200 and answer.json()["detections"][0]["name"] == "person"
    assert {r["auth"] for r in fake_api.received} == {"Bearer tok"}

    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{public_client['port']}/healthz", timeout=10)
    stranger = requests.Session()
    stranger.trust_env = False  # the system's certificate authorities only, not REQUESTS_CA_BUNDLE
    with pytest.raises(requests.exceptions.SSLError):  # the certificate is checked, not switched off, above
        stranger.get(url + "/healthz", timeout=10)
