"""The real client under gunicorn on 127.0.0.1, behind a TLS-terminating proxy (``CLIENT_PROXY_HOPS=1``, as the
ingress component sets it) and reached directly (the default): the forwarded scheme and host are believed only in
the first case, so the page's own POSTs pass the same-origin check there and the session cookie stays Secure, while a
direct caller cannot claim another origin with the same headers."""

from __future__ import annotations

import contextlib

import pytest
import requests

from dinops.serve.testing import free_port, running

PASSWORD = "proxy test password"
PUBLIC = "https://public.example"
FORWARDED = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "public.example", "X-Forwarded-For": "203.0.113.9"}
ANSWER = {"width": 4, "height": 4, "detections": [{"box": [0, 0, 2, 2], "label": 1, "name": "person", "score": 0.9}]}


@pytest.fixture
def start(tmp_path, fake_api):
    """Start a client with a login (no TLS of its own) and the given extra settings; returns its URL."""
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    with contextlib.ExitStack() as started:

        def _start(**settings: str) -> str:
            url = f"http://127.0.0.1:{free_port()}"
            env = {
                "CLIENT_BIND": url.removeprefix("http://"),
                "CLIENT_PASSWORD_FILE": str(password),
                "CLIENT_WORKERS": "1",
                "CLIENT_LOG_FORMAT": "text",
                "DINO_API_URL": fake_api.url,
                **settings,
            }
            log = tmp_path / f"client-{url.rsplit(':', 1)[1]}.log"
            started.enter_context(running("client", env, url, log, timeout=120))
            return url

        yield _start


def log_in(url: str, origin: str, **headers: str) -> requests.Response:
    form = {"user": "dinops", "password": PASSWORD}
    return requests.post(url + "/login", data=form, headers={"Origin": origin, **headers}, allow_redirects=False)


def test_behind_the_proxy_the_public_origin_logs_in_with_a_secure_cookie(start, fake_api):
    url = start(CLIENT_PROXY_HOPS="1")
    answer = log_in(url, PUBLIC, **FORWARDED)
    assert answer.status_code == 303 and answer.headers["Location"] == "/"
    cookie = answer.headers["Set-Cookie"]
    assert "dinops_session=" in cookie and "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    session = cookie.split(";", 1)[0]  # a Secure cookie: requests would not send it back over http://127.0.0.1

    fake_api.reply = {"json": ANSWER}
    upload = {"Origin": PUBLIC, "Content-Type": "image/png", "Cookie": session, **FORWARDED}
    detected = requests.post(url + "/api/detect", data=b"\x89PNG", headers=upload, timeout=10)
    assert detected.status_code == 200 and detected.json()["detections"][0]["name"] == "person"

    foreign = log_in(url, "https://evil.example", **FORWARDED)
    assert foreign.status_code == 403 and "Set-Cookie" not in foreign.headers
    refused = requests.post(url + "/api/detect", data=b"\x89PNG", headers={**upload, "Origin": "https://evil.example"})
    assert refused.status_code == 403 and len(fake_api.received) == 1
    logout = requests.post(url + "/logout", headers={"Origin": PUBLIC, **FORWARDED}, allow_redirects=False)
    assert logout.status_code == 303 and "Secure" in logout.headers["Set-Cookie"]


def test_a_direct_client_ignores_forwarded_headers(start):
    url = start()
    assert log_in(url, PUBLIC, **FORWARDED).status_code == 403  # the proxy's origin is not this client's
    # gunicorn believes X-Forwarded-Proto from 127.0.0.1 by default (forwarded_allow_ips): the client turns that off,
    # or any local process could claim https:// for its own address
    spoofed = log_in(url, url.replace("http://", "https://"), **{"X-Forwarded-Proto": "https"})
    assert spoofed.status_code == 403 and "Set-Cookie" not in spoofed.headers
    assert log_in(url, "https://evil.example").status_code == 403
    own = log_in(url, url, **FORWARDED)  # its own origin, whatever the headers claim
    assert own.status_code == 303 and "Secure" not in own.headers["Set-Cookie"]  # plain HTTP: it would never return
