// The page: send the chosen image to /api/detect, draw the boxes, re-filter them with the slider.
// Everything that came from the API is put into the page with textContent / setAttribute, never as HTML.
"use strict";

(function () {
  const app = document.getElementById("app");
  const maxBytes = Number(app.dataset.maxBytes);
  const maxMb = app.dataset.maxMb;
  const drop = document.getElementById("drop");
  const input = document.getElementById("file");
  const slider = document.getElementById("threshold");
  const sliderValue = document.getElementById("threshold-value");
  const status = document.getElementById("status");
  const latency = document.getElementById("latency");
  const canvas = document.getElementById("canvas");
  const rows = document.querySelector("#detections tbody");
  const palette = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324"];
  let current = null; // {bitmap, answer}

  function say(state, text) {
    status.dataset.state = state;
    status.textContent = text;
  }

  function threshold() {
    return Number(slider.value);
  }

  function visible() {
    if (!current) return [];
    return current.answer.detections.filter((d) => d.score >= threshold());
  }

  // Display size: small images (the demo's are 128-256 px) are scaled up so that their longer side is at least
  // MIN_DISPLAY_PX CSS pixels, large ones scaled down to the page width; never wider than the page.
  const MIN_DISPLAY_PX = 640;
  const LINE_PX = 2; // box outline, CSS pixels
  const FONT_PX = 14; // caption text, CSS pixels: readable whatever the image's own size

  function displayScale(width, height) {
    const parent = canvas.parentElement;
    const style = getComputedStyle(parent);
    const room = parent.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) || width;
    return Math.min(room / width, Math.max(1, MIN_DISPLAY_PX / Math.max(width, height)));
  }

  function render() {
    sliderValue.textContent = threshold().toFixed(2);
    if (!current) return;
    const { bitmap, answer } = current;
    // The canvas holds the displayed size times devicePixelRatio, and everything (image, boxes, captions) is drawn
    // in CSS pixels through one transform: captions are rasterised at screen resolution, never stretched.
    const scale = displayScale(answer.width, answer.height);
    const cssWidth = Math.round(answer.width * scale);
    const cssHeight = Math.round(answer.height * scale);
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(cssWidth * ratio);
    canvas.height = Math.round(cssHeight * ratio);
    canvas.style.width = `${cssWidth}px`;
    canvas.dataset.scale = String(scale);
    canvas.dataset.captionPx = String(FONT_PX);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, cssWidth, cssHeight);
    ctx.imageSmoothingQuality = "high";
    if (bitmap) ctx.drawImage(bitmap, 0, 0, cssWidth, cssHeight);
    const shown = visible();
    ctx.font = `${FONT_PX}px system-ui, sans-serif`;
    ctx.textBaseline = "top";
    rows.replaceChildren();
    shown.forEach((d) => {
      const [x1, y1, x2, y2] = d.box.map((c) => c * scale);
      const colour = palette[Math.abs(d.label) % palette.length];
      const caption = `${d.name} ${d.score.toFixed(2)}`;
      ctx.strokeStyle = colour;
      ctx.lineWidth = LINE_PX;
      ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
      const width = ctx.measureText(caption).width + 2 * LINE_PX;
      const height = FONT_PX + 6;
      ctx.fillStyle = colour;
      ctx.fillRect(x1, Math.max(0, y1 - height), width, height);
      ctx.fillStyle = "#fff";
      ctx.fillText(caption, x1 + LINE_PX, Math.max(0, y1 - height) + 3);

      const row = document.createElement("tr");
      row.className = "detection";
      row.setAttribute("data-label", String(d.label));
      row.setAttribute("data-score", String(d.score));
      row.setAttribute("data-box", JSON.stringify(d.box));
      [d.name, d.score.toFixed(3), d.box.map((c) => c.toFixed(1)).join(", ")].forEach((text) => {
        const cell = document.createElement("td");
        cell.textContent = text;
        row.appendChild(cell);
      });
      rows.appendChild(row);
    });
    const total = answer.detections.length;
    say("done", `${shown.length} of ${total} detections scored ${threshold().toFixed(2)} or more.`);
  }

  async function detect(file) {
    if (!file) return;
    if (!file.type.startsWith("image/")) {
      say("error", "That file is not an image. Please choose a JPEG, PNG, WebP, BMP, GIF or TIFF file.");
      return;
    }
    if (file.size > maxBytes) {
      say("error", `That image is ${(file.size / 1048576).toFixed(1)} MB; the limit is ${maxMb} MB.`);
      return;
    }
    say("busy", "Detecting objects…");
    latency.textContent = "";
    let response;
    try {
      response = await fetch("api/detect", { method: "POST", body: file, headers: { "Content-Type": file.type } });
    } catch (error) {
      say("error", "The web server cannot be reached. Check your connection and try again.");
      return;
    }
    if (response.status === 401) {
      // the session ended (expired, logged out elsewhere, new password): back to the login form, which says so
      say("error", "Your session has expired; taking you to the login page…");
      window.location.assign("login?expired=1");
      return;
    }
    let body = null;
    try {
      body = await response.json();
    } catch (error) {
      body = null;
    }
    if (!response.ok || !body || body.error) {
      const message = body && typeof body.error === "string" ? body.error : `The request failed (HTTP ${response.status}).`;
      // "waiting for a model": not an error of the person's; the API has no model yet (training, or none given)
      say(body && body.model === "waiting" ? "waiting" : "error", message);
      return;
    }
    let bitmap = null;
    try {
      bitmap = await createImageBitmap(file, { imageOrientation: "from-image" });
    } catch (error) {
      bitmap = null; // e.g. TIFF: the browser cannot show it, but the detections are still listed
    }
    current = { bitmap, answer: body };
    latency.textContent = `answered in ${Math.round(body.latency_ms)} ms`;
    render();
    if (!bitmap) say("done", status.textContent + " (This browser cannot display the image format.)");
  }

  input.addEventListener("change", () => detect(input.files[0]));
  slider.addEventListener("input", render);
  window.addEventListener("resize", render); // the page width bounds the displayed size
  ["dragenter", "dragover"].forEach((name) =>
    drop.addEventListener(name, (event) => {
      event.preventDefault();
      drop.classList.add("over");
    })
  );
  ["dragleave", "drop"].forEach((name) =>
    drop.addEventListener(name, (event) => {
      event.preventDefault();
      drop.classList.remove("over");
    })
  );
  drop.addEventListener("drop", (event) => detect(event.dataTransfer.files[0]));
  render();
})();
