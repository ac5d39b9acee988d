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

  function render() {
    sliderValue.textContent = threshold().toFixed(2);
    if (!current) return;
    const { bitmap, answer } = current;
    const ctx = canvas.getContext("2d");
    canvas.width = answer.width;
    canvas.height = answer.height;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    if (bitmap) ctx.drawImage(bitmap, 0, 0, answer.width, answer.height);
    const shown = visible();
    const line = Math.max(2, Math.round(Math.max(answer.width, answer.height) / 400));
    ctx.font = `${6 * line + 6}px system-ui, sans-serif`;
    ctx.textBaseline = "top";
    rows.replaceChildren();
    shown.forEach((d) => {
      const [x1, y1, x2, y2] = d.box;
      const colour = palette[Math.abs(d.label) % palette.length];
      const caption = `${d.name} ${d.score.toFixed(2)}`;
      ctx.strokeStyle = colour;
      ctx.lineWidth = line;
      ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
      const width = ctx.measureText(caption).width + 2 * line;
      const height = 6 * line + 10;
      ctx.fillStyle = colour;
      ctx.fillRect(x1, Math.max(0, y1 - height), width, height);
      ctx.fillStyle = "#fff";
      ctx.fillText(caption, x1 + line, Math.max(0, y1 - height) + 2);

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
