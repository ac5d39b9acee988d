"""A real headless Chromium (Debian's, driven by Playwright) against the real client and API processes.

Run on its own with ``pytest -m browser``; needs ``/usr/bin/chromium`` (apt package ``chromium``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image

from dinops.serve.testing import free_port, running, write_small_checkpoint

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"
XSS = "<img src=x onerror=\"document.title='pwned'\">"
PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324"]
MAX_DETECTIONS = 8
MIN_DISPLAY_PX = 640  # app.js: a small image's longer side is shown at least this wide (within the page)

GEOMETRY = """() => {
    const c = document.getElementById('canvas');
    const r = c.getBoundingClientRect();
    return {css: [Math.round(r.width), Math.round(r.height)], device: [c.width, c.height],
            scale: Number(c.dataset.scale), ratio: window.devicePixelRatio,
            room: c.parentElement.getBoundingClientRect().width
                  - parseFloat(getComputedStyle(c.parentElement).paddingLeft)
                  - parseFloat(getComputedStyle(c.parentElement).paddingRight)};
}"""
PIXEL = """([x, y]) => Array.from(
    document.getElementById('canvas').getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3))"""


def _canvas_geometry(page) -> dict:
    return page.evaluate(GEOMETRY)


def _rgb(hex_colour: str) -> list[int]:
    return [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]


def _assert_box_drawn_at(page, box, scale: float, colour: str) -> None:
    """The outline (2 CSS px, centred on the edge) covers the whole pixel at floor(edge * scale): the box's left,
    right and bottom edges, at mid-height and mid-width, are exactly its colour where the scaled box lies."""
    x1, y1, x2, y2 = (c * scale for c in box)
    width, height = _canvas_geometry(page)["device"]
    mid_x, mid_y = int((x1 + x2) / 2), int((y1 + y2) / 2)
    for x, y in ((int(x1), mid_y), (min(int(x2), width - 1), mid_y), (mid_x, min(int(y2), height - 1))):
        assert page.evaluate(PIXEL, [x, y]) == _rgb(colour), (x, y, box, scale)
    # and not where the unscaled box would be: inside the scaled box, left of it, the image shows
    if x1 > 8:
        assert page.evaluate(PIXEL, [int(x1) - 4, mid_y]) != _rgb(colour)


def _caption_height(page, box, scale: float, colour: str) -> int:
    """Rows of the caption's background in the column just right of the box's left edge, left of the text."""
    column = int(box[0] * scale) + 1
    height = _canvas_geometry(page)["device"][1]
    top = max(0, int(box[1] * scale) - 40)
    rows = [page.evaluate(PIXEL, [column, y]) == _rgb(colour) for y in range(top, min(height, top + 60))]
    longest = run = 0
    for hit in rows:
        run = run + 1 if hit else 0
        longest = max(longest, run)
    return longest


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The API (small model whose class names are HTML) and the client, both under gunicorn on 127.0.0.1."""
    root = tmp_path_factory.mktemp("stack")
    names = [f"{XSS}class{i}" for i in range(91)]
    checkpoint = write_small_checkpoint(root / "small.pth", seed=2, class_names=names)
    api, client = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    api_env = {"DINO_CHECKPOINT": str(checkpoint), "DINO_BIND": api, "DINO_MIN_SIZE": "64", "DINO_MAX_SIZE": "96"}
    client_env = {
        "DINO_API_URL": f"http://{api}",
        "CLIENT_BIND": client,
        "THRESHOLD": "0",
        "CLIENT_MAX_DETECTIONS": str(MAX_DETECTIONS),
        "CLIENT_MAX_UPLOAD_MB": "2",
    }
    with (
        running("serve", api_env, f"http://{api}", root / "serve.log"),
        running("client", client_env, f"http://{client}", root / "client.log"),
    ):
        yield {"api": f"http://{api}", "client": f"http://{client}", "root": root}


@pytest.fixture(scope="module")
def page(stack, browser):
    page = browser.new_page(viewport={"width": 1100, "height": 1000})
    page.set_default_timeout(120_000)
    yield page
    page.close()


def test_upload_draws_the_api_answer_safely(stack, page):
    image_path = stack["root"] / "street.jpg"
    # grey noise, the same each run: no pixel of it can have a palette colour
    pixels = np.random.default_rng(7).integers(0, 256, size=(120, 160), dtype=np.uint8)
    Image.fromarray(pixels, "L").convert("RGB").save(image_path, "JPEG")
    page.goto(stack["client"] + "/")
    assert page.title() == "DINO object detection"
    page.set_input_files("#file", str(image_path))
    page.wait_for_selector('#status[data-state="done"]')

    rows = page.locator("tr.detection")
    listed = [
        (
            int(r.get_attribute("data-label")),
            float(r.get_attribute("data-score")),
            json.loads(r.get_attribute("data-box")),
        )
        for r in rows.all()
    ]
    answer = requests.post(
        f"{stack['api']}/v1/detect?threshold=0&max_detections={MAX_DETECTIONS}",
        data=image_path.read_bytes(),
        headers={"Content-Type": "image/jpeg"},
        timeout=120,
    ).json()
    assert len(listed) == len(answer["detections"]) == MAX_DETECTIONS
    for (label, score, box), expected in zip(listed, answer["detections"], strict=True):
        assert label == expected["label"]
        assert score == pytest.approx(expected["score"], abs=1e-3)
        assert box == pytest.approx(expected["box"], abs=0.05)

    # class names are HTML on purpose: shown as text, never parsed
    assert rows.first.locator("td").first.text_content() == answer["detections"][0]["name"]
    assert page.locator("#detections img, canvas ~ img").count() == 0
    assert page.title() == "DINO object detection"

    # the 160x120 image is shown scaled up to 640x480 CSS pixels (its longer side at least MIN_DISPLAY_PX), the canvas
    # holding as many device pixels, so captions are drawn at screen resolution. Boxes are drawn in list order, so a
    # later box may paint over an earlier one: the last one drawn is never covered, and no colour outside the shown
    # detections' may appear.
    shown = _canvas_geometry(page)
    assert shown["css"] == [MIN_DISPLAY_PX, 480] and shown["scale"] == 4.0 and shown["ratio"] == 1
    assert shown["device"] == shown["css"]  # devicePixelRatio 1 here: one canvas pixel per CSS pixel
    size = shown["device"]
    last_label, _, last_box = listed[-1]
    _assert_box_drawn_at(page, last_box, shown["scale"], PALETTE[last_label % len(PALETTE)])
    assert _caption_height(page, last_box, shown["scale"], PALETTE[last_label % len(PALETTE)]) >= 12
    painted = page.evaluate(
        """(palette) => {
            const c = document.getElementById('canvas');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            const rgbs = palette.map((hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)));
            const counts = palette.map(() => 0);
            for (let i = 0; i < d.length; i += 4) {
                rgbs.forEach((rgb, k) => {
                    if (d[i] === rgb[0] && d[i + 1] === rgb[1] && d[i + 2] === rgb[2]) counts[k]++;
                });
            }
            return counts;
        }""",
        PALETTE,
    )
    shown_colours = {label % len(PALETTE) for label, _, _ in listed}
    assert {k for k, n in enumerate(painted) if n > 0} <= shown_colours, painted
    if (
        last_box[0] * shown["scale"] < size[0] - 4
    ):  # its caption starts inside the canvas: a caption's area in its colour
        assert painted[last_label % len(PALETTE)] > 50, painted
    assert sum(painted) > 50, painted
    assert "answered in" in page.text_content("#latency")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "client-browser.png"), full_page=True)

    # the slider re-filters without a new request
    cut = sorted(score for _, score, _ in listed)[MAX_DETECTIONS // 2]
    page.locator("#threshold").fill(f"{cut:.2f}")
    kept = [s for _, s, _ in listed if s >= round(cut, 2)]
    assert page.locator("tr.detection").count() == len(kept)
    assert page.text_content("#status").startswith(f"{len(kept)} of {MAX_DETECTIONS} detections")


def test_a_large_image_fits_the_page(stack, page):
    image_path = stack["root"] / "wide.jpg"
    pixels = np.random.default_rng(3).integers(90, 140, size=(900, 2400), dtype=np.uint8)
    Image.fromarray(pixels, "L").convert("RGB").save(image_path, "JPEG", quality=60)
    page.goto(stack["client"] + "/")
    page.set_input_files("#file", str(image_path))
    page.wait_for_selector('#status[data-state="done"]')
    shown = _canvas_geometry(page)
    assert shown["scale"] < 1 and shown["css"][0] <= shown["room"] and shown["css"][0] >= shown["room"] - 50
    assert shown["css"][1] == round(900 * shown["css"][0] / 2400)
    label, box = (lambda r: (int(r.get_attribute("data-label")), json.loads(r.get_attribute("data-box"))))(
        page.locator("tr.detection").last
    )
    _assert_box_drawn_at(page, box, shown["scale"], PALETTE[label % len(PALETTE)])


def test_errors_are_shown_in_plain_words(stack, page, tmp_path):
    page.goto(stack["client"] + "/")
    fake = tmp_path / "holiday.png"
    fake.write_text("this is not a picture")
    page.set_input_files("#file", str(fake))
    page.wait_for_selector('#status[data-state="error"]')
    assert page.text_content("#status").startswith("The image was rejected: The data is not an image")
    big = tmp_path / "big.png"
    big.write_bytes(b"\x89PNG" + bytes(3 * 2**20))
    page.set_input_files("#file", str(big))
    page.wait_for_function("document.getElementById('status').textContent.includes('the limit is 2 MB')")
    assert page.get_attribute("#status", "data-state") == "error"
    good = tmp_path / "ok.png"  # and the page recovers after errors
    Image.new("RGB", (4, 4)).save(good, "PNG")
    page.set_input_files("#file", str(good))
    page.wait_for_selector('#status[data-state="done"]')
    assert page.locator("tr.detection").count() == MAX_DETECTIONS


def test_an_api_waiting_for_a_model_is_shown_as_such(stack, page, tmp_path):
    """A second API started with DINO_WAIT_FOR_MODEL and no checkpoint yet, and a client in front of it."""
    missing = tmp_path / "models" / "checkpoint.pth"
    api, client = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    api_env = {"DINO_CHECKPOINT": str(missing), "DINO_BIND": api, "DINO_WAIT_FOR_MODEL": "true"}
    client_env = {"DINO_API_URL": f"http://{api}", "CLIENT_BIND": client}
    with (
        running("serve", api_env, f"http://{api}", tmp_path / "serve.log", ready="/healthz"),
        running("client", client_env, f"http://{client}", tmp_path / "client.log"),
    ):
        assert requests.get(f"http://{client}/readyz", timeout=10).json()["api"] == f"waiting for a model ({missing})"
        page.goto(f"http://{client}/")
        image = tmp_path / "photo.png"
        Image.new("RGB", (64, 48), (200, 30, 30)).save(image, "PNG")
        page.set_input_files("#file", str(image))
        page.wait_for_selector('#status[data-state="waiting"]')
        text = page.text_content("#status")
        assert text.startswith(f"The model is not there yet: waiting for a model ({missing}) …"), text


PASSWORD = "browser test password"


@pytest.fixture(scope="module")
def secure_client(stack, make_tls_pair, tmp_path_factory):
    """Start clients in front of the stack's API as a public deployment runs them: HTTPS with a certificate made
    here, a login, ``CLIENT_PUBLIC``; yields a function of the session length that returns the client's URL."""
    root = tmp_path_factory.mktemp("secure")
    cert, key = make_tls_pair(root / "tls")
    password = root / "password"
    password.write_text(PASSWORD + "\n")
    with contextlib.ExitStack() as started, pytest.MonkeyPatch.context() as patch:
        patch.setenv("REQUESTS_CA_BUNDLE", str(cert))  # running() polls /readyz over HTTPS with requests' defaults

        def start(session_hours: float) -> str:
            address = f"127.0.0.1:{free_port()}"
            env = {
                "DINO_API_URL": stack["api"],
                "CLIENT_BIND": address,
                "CLIENT_PUBLIC": "true",
                "CLIENT_PASSWORD_FILE": str(password),
                "CLIENT_TLS_CERT_FILE": str(cert),
                "CLIENT_TLS_KEY_FILE": str(key),
                "CLIENT_SESSION_HOURS": str(session_hours),
                "THRESHOLD": "0",
                "CLIENT_MAX_DETECTIONS": str(MAX_DETECTIONS),
            }
            started.enter_context(running("client", env, f"https://{address}", root / f"client-{address[10:]}.log"))
            return f"https://{address}"

        yield start


@pytest.fixture
def tls_page(browser):
    # the certificate was made by this test for 127.0.0.1: this browser context, and only it, accepts it
    context = browser.new_context(ignore_https_errors=True, viewport={"width": 1100, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(120_000)
    yield page
    context.close()


def _log_in(page, url: str, password: str) -> None:
    page.fill("#user", "dinops")
    page.fill("#password", password)
    page.click("#login button[type=submit]")


def test_login_over_https_then_upload(secure_client, tls_page, tmp_path):
    url = secure_client(12)
    page = tls_page
    page.goto(url + "/")
    assert page.url == url + "/login" and page.title() == "Log in · DINO object detection"

    with page.expect_response(url + "/login") as wrong:
        _log_in(page, url, "not the password")
    assert wrong.value.status == 401
    assert page.text_content("#error") == "Wrong user name or password."
    assert page.context.cookies() == []

    _log_in(page, url, PASSWORD)
    page.wait_for_url(url + "/")
    (cookie,) = page.context.cookies()
    assert (cookie["name"], cookie["secure"], cookie["httpOnly"], cookie["sameSite"]) == (
        "dinops_session",
        True,
        True,
        "Strict",
    )
    assert PASSWORD not in cookie["value"]
    assert page.text_content("#logout span") == "Logged in as dinops"

    image_path = tmp_path / "street.jpg"
    pixels = np.random.default_rng(7).integers(0, 256, size=(120, 160), dtype=np.uint8)
    Image.fromarray(pixels, "L").convert("RGB").save(image_path, "JPEG")
    page.set_input_files("#file", str(image_path))
    page.wait_for_selector('#status[data-state="done"]')
    rows = page.locator("tr.detection")
    assert rows.count() == MAX_DETECTIONS
    label, box = int(rows.last.get_attribute("data-label")), json.loads(rows.last.get_attribute("data-box"))
    shown = _canvas_geometry(page)
    _assert_box_drawn_at(page, box, shown["scale"], PALETTE[label % len(PALETTE)])
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "client-browser-login.png"), full_page=True)

    page.click("#logout button")
    page.wait_for_url(url + "/login?logged_out=1")
    assert page.text_content("#message") == "You are logged out."
    assert page.context.cookies() == []
    page.goto(url + "/")
    assert page.url == url + "/login"


def test_an_expired_session_returns_to_the_login(secure_client, tls_page, tmp_path):
    hours = 0.002  # 7.2 s
    url = secure_client(hours)
    page = tls_page
    page.goto(url + "/")
    _log_in(page, url, PASSWORD)
    page.wait_for_url(url + "/")
    assert page.locator("#file").count() == 1
    page.wait_for_timeout(hours * 3600 * 1000 + 1500)  # the session ends while the page is open
    image = tmp_path / "photo.png"
    Image.new("RGB", (64, 48), (200, 30, 30)).save(image, "PNG")
    with page.expect_response(url + "/api/detect") as refused:
        page.set_input_files("#file", str(image))
    assert refused.value.status == 401
    page.wait_for_url(url + "/login?expired=1")
    assert page.text_content("#message") == "Your session has expired; log in again."
    page.goto(url + "/")  # the cookie is still in the browser (its Max-Age has passed too), but it opens nothing
    assert page.url.startswith(url + "/login")
    _log_in(page, url, PASSWORD)  # and logging in again works
    page.wait_for_url(url + "/")
