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

// The training panel: polls api/training (the API's GET /v1/training) and shows the run's state, progress, speed,
// loss curve (an SVG drawn here), evaluations and the checkpoint the API serves. Text only, as above.
(function () {
  const panel = document.getElementById("training");
  if (!panel) return;
  const SVG = "http://www.w3.org/2000/svg";
  const ACTIVE_POLL_MS = 2000; // while a run moves
  const IDLE_POLL_MS = 5000; // not started, finished, failed: a new run may still begin
  const $ = (id) => document.getElementById(id);
  const message = $("training-message");
  const run = $("training-run");
  const MESSAGES = {
    not_started: () =>
      "No training run has started yet. Its progress appears here as soon as `dinops train` begins writing to the output folder.",
    waiting_for_data: (t) =>
      t.reason
        ? `Training has not started: ${t.reason}.`
        : "Training is starting: reading the dataset and waiting for the first batches…",
    training: (t) => `Training: epoch ${t.epoch + 1} of ${t.epochs}.`,
    evaluating: (t) => `Evaluating the model after epoch ${t.epoch + 1} of ${t.epochs}…`,
    done: (t) => `Training finished: ${t.global_step} steps in ${t.epochs} epochs.`,
    stopped: (t) => `Training stopped (${t.reason || "signal"}); restarted with --resume auto it continues from its last checkpoint.`,
    failed: (t) => `Training failed: ${t.reason || "no reason given"}.`,
    unreadable: (t) => `The training progress cannot be read: ${t.reason || "unknown reason"}.`,
    unavailable: (t) => `The training run cannot be seen from here: ${t.reason || "unknown reason"}.`,
  };

  function duration(seconds) {
    if (seconds === undefined) return "measuring…";
    const s = Math.round(seconds);
    if (s < 60) return `${s} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min ${s % 60} s`;
    return `${Math.floor(m / 60)} h ${m % 60} min`;
  }

  function gib(bytes) {
    return `${(bytes / 2 ** 30).toFixed(1)} GiB`;
  }

  function svgNode(name, attributes, text) {
    const node = document.createElementNS(SVG, name);
    Object.entries(attributes).forEach(([key, value]) => node.setAttribute(key, String(value)));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Steps along x, loss along y, both from their own minimum to maximum; the four extremes are written at the axes.
  function drawCurve(points) {
    const svg = $("training-loss");
    const [width, height, left, right, top, bottom] = [640, 220, 56, 12, 12, 28];
    svg.replaceChildren();
    svg.dataset.points = String(points.length);
    if (points.length === 0) {
      svg.appendChild(svgNode("text", { x: width / 2, y: height / 2, "text-anchor": "middle" }, "no step yet"));
      return;
    }
    const xs = points.map((p) => p[0]);
    const ys = points.map((p) => p[1]);
    const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
    const sx = (x) => left + ((x - x0) / (x1 - x0 || 1)) * (width - left - right);
    const sy = (y) => height - bottom - ((y - y0) / (y1 - y0 || 1)) * (height - top - bottom);
    svg.appendChild(svgNode("line", { x1: left, y1: height - bottom, x2: width - right, y2: height - bottom }));
    svg.appendChild(svgNode("line", { x1: left, y1: top, x2: left, y2: height - bottom }));
    svg.appendChild(svgNode("text", { x: left - 6, y: top + 10, "text-anchor": "end" }, y1.toFixed(2)));
    svg.appendChild(svgNode("text", { x: left - 6, y: height - bottom, "text-anchor": "end" }, y0.toFixed(2)));
    svg.appendChild(svgNode("text", { x: left, y: height - 8, "text-anchor": "start" }, `step ${x0}`));
    svg.appendChild(svgNode("text", { x: width - right, y: height - 8, "text-anchor": "end" }, `step ${x1}`));
    const line = points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    svg.appendChild(svgNode("polyline", { points: line }));
  }

  function showEvaluations(evaluations) {
    const rows = document.querySelector("#training-evaluations tbody");
    rows.replaceChildren();
    evaluations.forEach((e) => {
      const row = document.createElement("tr");
      row.className = "evaluation";
      const cells = [e.epoch + 1, e.global_step];
      ["ap", "ap50", "ap75"].forEach((k) => cells.push(e[k] === undefined ? "–" : e[k].toFixed(3)));
      cells.forEach((value) => {
        const cell = document.createElement("td");
        cell.textContent = String(value);
        row.appendChild(cell);
      });
      rows.appendChild(row);
    });
    $("training-evaluations").hidden = evaluations.length === 0;
  }

  function showServed(t) {
    const served = t.served;
    $("training-served").textContent = served
      ? `The API serves ${served.checkpoint}` +
        (served.global_step !== undefined ? ` (step ${served.global_step})` : "") +
        `, loaded at ${new Date(served.loaded_at).toLocaleString()}.`
      : "The API has no model loaded yet.";
  }

  function show(t) {
    panel.dataset.state = t.state;
    message.textContent = MESSAGES[t.state](t);
    showServed(t);
    const hasRun = t.epochs !== undefined && !["not_started", "unreadable", "unavailable"].includes(t.state);
    run.hidden = !hasRun;
    if (!hasRun) return;
    const total = t.total_steps || t.epochs * t.steps_per_epoch;
    const progress = $("training-progress");
    progress.max = total;
    progress.value = Math.min(t.global_step, total);
    progress.textContent = `${t.global_step} of ${total} steps`;
    $("training-epoch").textContent = `${t.epoch + 1} of ${t.epochs}`;
    $("training-step").textContent = `${t.step} of ${t.steps_per_epoch} (${t.global_step} of ${total} in all)`;
    $("training-eta").textContent = t.state === "done" ? "none" : duration(t.eta_s);
    $("training-speed").textContent =
      t.images_per_s === undefined ? "measuring…" : `${t.images_per_s.toFixed(1)} images/s, ${t.step_s.toFixed(3)} s/step`;
    const gpu = t.gpu;
    $("training-gpu-row").hidden = !gpu;
    if (gpu) {
      const parts = [];
      if (gpu.utilization_percent !== undefined) parts.push(`${gpu.utilization_percent}% busy`);
      if (gpu.memory_allocated_bytes !== undefined) {
        const of = gpu.memory_total_bytes ? ` of ${gib(gpu.memory_total_bytes)}` : "";
        parts.push(`${gib(gpu.memory_allocated_bytes)}${of} memory`);
      }
      $("training-gpu").textContent = `${gpu.name || "GPU"}: ${parts.join(", ")}`;
    }
    drawCurve(t.loss_curve);
    showEvaluations(t.evaluations);
  }

  async function poll() {
    let next = IDLE_POLL_MS;
    try {
      const response = await fetch("api/training", { headers: { Accept: "application/json" } });
      if (response.status === 401) {
        window.location.assign("login?expired=1");
        return;
      }
      const body = await response.json();
      if (!response.ok || !MESSAGES[body.state]) {
        panel.dataset.state = "error";
        message.textContent = typeof body.error === "string" ? body.error : `The training report failed (HTTP ${response.status}).`;
      } else {
        show(body);
        if (["waiting_for_data", "training", "evaluating"].includes(body.state)) next = ACTIVE_POLL_MS;
      }
    } catch (error) {
      panel.dataset.state = "error";
      message.textContent = "The web server cannot be reached; trying again…";
    }
    panel.dataset.polls = String(Number(panel.dataset.polls || 0) + 1);
    window.setTimeout(poll, next);
  }

  poll();
})();
