"""The login in front of the web client: settings checked at start, the form, the session cookie, the guard on
``/api/detect`` (nothing forwarded, no token added, for a caller who has not logged in), brute-force limits."""

from __future__ import annotations

import time

import pytest

from dinops.client.cli import main as client_main

PASSWORD = "correct horse battery staple"
ORIGIN = "http://localhost"  # the Flask test client's own origin
ANSWER = {"width": 4, "height": 4, "detections": [{"box": [0, 0, 2, 2], "label": 1, "name": "person", "score": 0.9}]}


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "password"
    path.write_text(PASSWORD + "\n")  # as `echo` or a Secret written by hand leaves it: the newline is not part of it
    return path


@pytest.fixture
def login_client(make_client, password_file):
    def _make(**overrides):
        return make_client(PASSWORD_FILE=str(password_file), API_TOKEN="tok", LOGIN_FAILURE_DELAY_S=0, **overrides)

    return _make


def log_in(client, password=PASSWORD, user="dinops", **kwargs):
    return client.post("/login", data={"user": user, "password": password}, headers={"Origin": ORIGIN}, **kwargs)


def detect(client, **headers):
    return client.post("/api/detect", data=b"\x89PNG", content_type="image/png", headers={"Origin": ORIGIN, **headers})


# --- start-up checks: a public client needs a login and TLS, and every file it names must be usable -------------


@pytest.mark.parametrize(
    ("argv", "missing"),
    [
        ([], "a password file (CLIENT_PASSWORD_FILE) and a TLS certificate and key"),
        (["--password-file", "{password}"], "a TLS certificate and key (CLIENT_TLS_CERT_FILE, CLIENT_TLS_KEY_FILE)"),
        (["--tls-cert-file", "{cert}", "--tls-key-file", "{key}"], "a password file (CLIENT_PASSWORD_FILE)"),
    ],
    ids=["nothing", "password-only", "tls-only"],
)
def test_a_public_client_without_login_and_tls_refuses_to_start(
    capsys, password_file, tls_pair, argv, missing, monkeypatch
):
    cert, key = tls_pair
    argv = [a.format(password=password_file, cert=cert, key=key) for a in argv]
    monkeypatch.setenv("CLIENT_PUBLIC", "true")
    assert client_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    assert err.startswith("dinops client: CLIENT_PUBLIC is true but ") and missing in err, err


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"CLIENT_TLS_CERT_FILE": "{cert}"}, "CLIENT_TLS_CERT_FILE and CLIENT_TLS_KEY_FILE go together"),
        ({"CLIENT_TLS_KEY_FILE": "{key}"}, "CLIENT_TLS_CERT_FILE and CLIENT_TLS_KEY_FILE go together"),
        ({"CLIENT_PASSWORD_FILE": "{missing}"}, "CLIENT_PASSWORD_FILE={missing} cannot be read"),
        ({"CLIENT_PASSWORD_FILE": "{empty}"}, "CLIENT_PASSWORD_FILE={empty} is empty"),
        ({"CLIENT_TLS_CERT_FILE": "{cert}", "CLIENT_TLS_KEY_FILE": "{other_key}"}, "are not a usable pair"),
        ({"CLIENT_TLS_CERT_FILE": "{missing}", "CLIENT_TLS_KEY_FILE": "{key}"}, "CLIENT_TLS_CERT_FILE={missing}"),
    ],
    ids=["cert-alone", "key-alone", "password-missing", "password-empty", "key-of-another-cert", "cert-missing"],
)
def test_unusable_files_stop_the_client(capsys, monkeypatch, tmp_path, tls_pair, make_tls_pair, files, words):
    cert, key = tls_pair
    names = {"cert": cert, "key": key, "missing": tmp_path / "nope", "empty": tmp_path / "empty"}
    names["other_key"] = make_tls_pair(tmp_path / "other")[1]
    (tmp_path / "empty").write_text("\n")
    for name, value in files.items():
        monkeypatch.setenv(name, value.format(**names))
    assert client_main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words.format(**names) in err, err


# --- the login ------------------------------------------------------------------------------------------------


def test_everything_but_the_login_page_its_stylesheet_and_health_needs_a_login(login_client, fake_api):
    client = login_client()
    page = client.get("/")
    assert page.status_code == 303 and page.headers["Location"] == "/login"
    assert client.get("/static/app.js").status_code == 303
    with client.get("/static/app.css") as stylesheet:
        assert stylesheet.status_code == 200
    assert client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 200
    form = client.get("/login")
    html = form.get_data(as_text=True)
    assert form.status_code == 200
    assert '<form method="post"' in html and 'name="password"' in html and 'type="password"' in html
    assert "form-action 'self'" in form.headers["Content-Security-Policy"]
    assert form.headers["Referrer-Policy"] == "same-origin"  # under no-referrer Chromium sends "Origin: null"
    answer = detect(client)
    assert answer.status_code == 401 and "log in" in answer.get_json()["error"].lower()
    assert answer.get_json()["login"] is True
    assert fake_api.received == []  # nothing forwarded, so the token went nowhere


def test_wrong_password_shows_the_form_again(login_client, fake_api):
    client = login_client()
    for user, password in (("dinops", "wrong"), ("admin", PASSWORD), ("dinops", PASSWORD + "x"), ("dinops", "")):
        answer = log_in(client, password, user)
        assert answer.status_code == 401
        assert "wrong user name or password" in answer.get_data(as_text=True).lower()
        assert "Set-Cookie" not in answer.headers
    assert detect(client).status_code == 401 and fake_api.received == []


def test_login_then_detect_forwards_the_token(login_client, fake_api):
    client = login_client()
    answer = log_in(client)
    assert answer.status_code == 303 and answer.headers["Location"] == "/"
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age=43200" in cookie
    assert "Secure" not in cookie  # no TLS in this test: a Secure cookie would never come back
    assert PASSWORD not in cookie
    page = client.get("/")
    assert page.status_code == 200 and 'action="/logout"' in page.get_data(as_text=True)
    fake_api.reply = {"json": ANSWER}
    assert detect(client).status_code == 200
    assert fake_api.received[0]["auth"] == "Bearer tok"


def test_a_session_signed_with_another_password_is_refused(login_client, fake_api, make_client, tmp_path):
    other = tmp_path / "other-password"
    other.write_text("another one")
    foreign = make_client(PASSWORD_FILE=str(other), LOGIN_FAILURE_DELAY_S=0)
    log_in(foreign, "another one")
    value = foreign.get_cookie("dinops_session").value
    client = login_client()
    client.set_cookie("dinops_session", value)
    assert client.get("/").status_code == 303
    assert detect(client).status_code == 401 and fake_api.received == []


def test_an_expired_session_goes_back_to_the_login(login_client, fake_api):
    client = login_client()
    issued = time.time() - 12 * 3600 - 5  # CLIENT_SESSION_HOURS defaults to 12
    client.set_cookie("dinops_session", client.application.extensions["login"].token(issued_at=issued))
    page = client.get("/")
    assert page.status_code == 303 and page.headers["Location"] == "/login?expired=1"
    assert "session has expired" in client.get(page.headers["Location"]).get_data(as_text=True)
    answer = detect(client)
    assert answer.status_code == 401 and "session has expired" in answer.get_json()["error"]
    assert fake_api.received == []
    fresh = client.application.extensions["login"].token(issued_at=time.time() - 11 * 3600)
    client.set_cookie("dinops_session", fresh)
    assert client.get("/").status_code == 200


def test_session_hours_bound_the_cookie(login_client):
    client = login_client(SESSION_HOURS=0.5)
    assert "Max-Age=1800" in log_in(client).headers["Set-Cookie"]
    old = client.application.extensions["login"].token(issued_at=time.time() - 1801)
    client.set_cookie("dinops_session", old)
    assert client.get("/").headers["Location"] == "/login?expired=1"


def test_logout(login_client, fake_api):
    client = login_client()
    log_in(client)
    answer = client.post("/logout", headers={"Origin": ORIGIN})
    assert answer.status_code == 303 and answer.headers["Location"] == "/login?logged_out=1"
    assert "dinops_session=;" in answer.headers["Set-Cookie"]
    assert client.get("/").status_code == 303
    assert detect(client).status_code == 401 and fake_api.received == []


def test_a_new_password_ends_every_session(login_client, password_file):
    client = login_client()
    log_in(client)
    assert client.get("/").status_code == 200
    password_file.write_text("a new password\n")
    assert client.get("/").status_code == 303
    assert log_in(client).status_code == 401 and log_in(client, "a new password").status_code == 303


def test_cross_site_posts_are_refused(login_client, fake_api):
    client = login_client()
    refused = client.post("/login", data={"user": "dinops", "password": PASSWORD}, headers={"Origin": "http://evil"})
    assert refused.status_code == 403 and "Set-Cookie" not in refused.headers
    log_in(client)
    fake_api.reply = {"json": ANSWER}
    assert detect(client, Origin="https://localhost").status_code == 403  # another scheme is another origin
    assert detect(client, Origin="null").status_code == 403
    assert client.post("/logout", headers={"Origin": "http://evil"}).status_code == 403
    assert fake_api.received == []
    assert detect(client).status_code == 200


def test_repeated_failures_from_one_address_are_locked_out(login_client):
    client = login_client(LOGIN_MAX_FAILURES=3, LOGIN_FAILURE_WINDOW_S=60)
    attacker = {"environ_base": {"REMOTE_ADDR": "198.51.100.7"}}
    for _ in range(3):
        assert log_in(client, "guess", **attacker).status_code == 401
    locked = log_in(client, **attacker)  # even the right password: the limit would mean nothing otherwise
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) <= 60
    assert "too many failed logins" in locked.get_data(as_text=True).lower()
    assert "Set-Cookie" not in locked.headers
    assert log_in(client, environ_base={"REMOTE_ADDR": "203.0.113.9"}).status_code == 303  # others still can


def test_failures_age_out_of_the_window(login_client, monkeypatch):
    client = login_client(LOGIN_MAX_FAILURES=2, LOGIN_FAILURE_WINDOW_S=0.5)
    for _ in range(2):
        assert log_in(client, "guess").status_code == 401
    assert log_in(client).status_code == 429
    time.sleep(0.6)
    assert log_in(client).status_code == 303


def test_each_failure_is_slowed_down(make_client, password_file):
    client = make_client(PASSWORD_FILE=str(password_file), LOGIN_FAILURE_DELAY_S=0.3)
    started = time.perf_counter()
    assert log_in(client, "guess").status_code == 401
    assert time.perf_counter() - started >= 0.3


def test_defaults_of_the_brute_force_limit(make_client, password_file):
    config = make_client(PASSWORD_FILE=str(password_file)).application.config
    assert (config["LOGIN_MAX_FAILURES"], config["LOGIN_FAILURE_WINDOW_S"], config["LOGIN_FAILURE_DELAY_S"]) == (
        10,
        600,
        1.0,
    )


def test_without_a_password_file_nothing_changes(client, fake_api):
    assert client.get("/").status_code == 200
    assert client.get("/login").status_code == 303  # no login to show
    fake_api.reply = {"json": ANSWER}
    assert client.post("/api/detect", data=b"x", content_type="image/png").status_code == 200
    assert "logout" not in client.get("/").get_data(as_text=True)


def test_a_password_file_gone_at_run_time_locks_everything(login_client, password_file, fake_api, caplog):
    client = login_client()
    log_in(client)
    password_file.unlink()
    page = client.get("/")
    assert page.status_code == 503 and "password file cannot be read" in page.get_json()["error"]
    assert detect(client).status_code == 503 and fake_api.received == []
    assert log_in(client).status_code == 503
    assert f"CLIENT_PASSWORD_FILE={password_file} is unusable" in caplog.text


def test_behind_the_proxy_the_failure_limit_counts_the_forwarded_address(login_client):
    client = login_client(PROXY_HOPS=1, LOGIN_MAX_FAILURES=2, LOGIN_FAILURE_WINDOW_S=60)
    proxy = {"environ_base": {"REMOTE_ADDR": "10.42.0.7"}}  # every request comes from the ingress controller's pod

    def through_proxy(password, address):
        headers = {"Origin": "https://public.example", "X-Forwarded-Proto": "https",
                   "X-Forwarded-Host": "public.example", "X-Forwarded-For": address}  # fmt: skip
        return client.post("/login", data={"user": "dinops", "password": password}, headers=headers, **proxy)

    for _ in range(2):
        assert through_proxy("guess", "198.51.100.7").status_code == 401
    assert through_proxy(PASSWORD, "198.51.100.7").status_code == 429
    # not the proxy's address that is locked out, and a caller cannot pick another one: the proxy appends the address
    # it saw, the last entry is the one believed
    assert through_proxy(PASSWORD, "203.0.113.9").status_code == 303
    assert through_proxy(PASSWORD, "203.0.113.9, 198.51.100.7").status_code == 429


# --- the probes: an anonymous caller learns ready or not, nothing else ---------------------------------------------

STRANGER = {"environ_base": {"REMOTE_ADDR": "198.51.100.7"}}  # the Flask test client's default is 127.0.0.1


@pytest.mark.parametrize("api_state", ["ready", "waiting", "down"])
def test_an_anonymous_caller_of_readyz_learns_nothing_but_ready(login_client, fake_api, make_client, api_state):
    if api_state == "waiting":
        fake_api.ready_reply = {"status": 503, "json": {"status": "waiting for a model", "code": "model_waiting",
                                                        "checkpoint": "/models/secret-run/checkpoint.pth"}}  # fmt: skip
    client = login_client(API_URL="http://127.0.0.1:9") if api_state == "down" else login_client()
    for answer in (client.get("/readyz", **STRANGER), client.get("/healthz", **STRANGER)):
        assert answer.status_code == 200
        text = answer.get_data(as_text=True)
        assert set(answer.get_json()) == {"status"}, text
        for secret in ("api", "model", "checkpoint", "secret-run", "127.0.0.1", "http", "waiting", "unreachable"):
            assert secret not in text, (secret, text)
    assert client.get("/readyz", **STRANGER).get_json() == {"status": "ready"}


def test_readyz_details_for_a_session_or_the_health_check_on_loopback(login_client, fake_api):
    fake_api.ready_reply = {"status": 503, "json": {"status": "waiting for a model", "checkpoint": "/models/c.pth"}}
    client = login_client()
    detailed = {"status": "ready", "api": "waiting for a model (/models/c.pth)"}
    assert client.get("/readyz").get_json() == detailed  # 127.0.0.1: the container's own HEALTHCHECK
    assert client.get("/readyz", headers={"X-Forwarded-For": "198.51.100.7"}).get_json() == {"status": "ready"}
    log_in(client, **STRANGER)
    assert client.get("/readyz", **STRANGER).get_json() == detailed
    behind = login_client(PROXY_HOPS=1)
    # a forwarded 127.0.0.1 is not loopback: only the connection's own address is
    claimed = behind.get("/readyz", headers={"X-Forwarded-For": "127.0.0.1"}, **STRANGER)
    assert claimed.get_json() == {"status": "ready"}


def test_without_a_login_readyz_keeps_its_details(client, fake_api):
    assert client.get("/readyz", **STRANGER).get_json() == {"status": "ready", "api": "ready"}
