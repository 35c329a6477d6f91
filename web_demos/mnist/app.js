// The MNIST drawing page: pointer strokes -> MNIST-like 28x28 -> cinders model in Pyodide.
// URL options: ?backend=cpu|webgpu|auto (default auto), ?model=<record url>, ?fusion=1 (WebGPU
// through cn.Fusion).
// Tests and benchmarks use window.cindersDemo: {model, predict(pixels), strokesToMnist, ...}.
import { Cinders } from "/wasm/cinders.js";
import { strokesToMnist, imageToMnist, SIZE } from "/shared/preprocess.js";

const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const canvas = $("digit-canvas"), ctx = canvas.getContext("2d");
const preview = $("preview"), previewCtx = preview.getContext("2d");
const strokes = [];            // [[{x, y}, ...], ...] in canvas pixels
let model = null, busy = false, dirty = false;

// ---- probability bars -------------------------------------------------------------------
const bars = [];
for (let d = 0; d < 10; d++) {
  const bar = document.createElement("div");
  bar.className = "bar";
  bar.dataset.digit = String(d);
  bar.innerHTML = `<span class="digit">${d}</span><span class="track"><span class="fill"></span></span><span class="value"></span>`;
  $("probabilities").appendChild(bar);
  bars.push(bar);
}

function showResult(result) {
  $("prediction").textContent = result ? String(result.class) : "";
  bars.forEach((bar, d) => {
    const p = result ? result.probabilities[d] : 0;
    bar.querySelector(".fill").style.width = `${(100 * p).toFixed(1)}%`;
    bar.querySelector(".value").textContent = result ? `${(100 * p).toFixed(1)}%` : "";
    bar.classList.toggle("top", !!result && result.class === d);
  });
  if (result) $("inference-time").textContent = `${result.ms.toFixed(1)} ms`;
}

function showPreview(pixels) {
  const image = previewCtx.createImageData(SIZE, SIZE);
  for (let i = 0; i < SIZE * SIZE; i++) {
    const v = Math.round(255 * (pixels ? pixels[i] : 0));
    image.data.set([v, v, v, 255], 4 * i);
  }
  previewCtx.putImageData(image, 0, 0);
}

// ---- inference, at most one in flight; the latest drawing wins ------------------------------
async function classify() {
  if (!model) return;
  if (busy) { dirty = true; return; }
  busy = true;
  try {
    do {
      dirty = false;
      const pixels = strokesToMnist(strokes);
      showPreview(pixels);
      showResult(pixels ? await model.predict(pixels) : null);
    } while (dirty);
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
    throw error;
  } finally {
    busy = false;
  }
}

// ---- drawing with pointer events (mouse, touch, pen) ----------------------------------------
function canvasPoint(event) {
  const rect = canvas.getBoundingClientRect();
  return { x: (event.clientX - rect.left) * canvas.width / rect.width,
           y: (event.clientY - rect.top) * canvas.height / rect.height };
}

function drawSegment(a, b) {
  ctx.lineWidth = 18;
  ctx.lineCap = "round";
  ctx.lineJoin = "round";
  ctx.strokeStyle = "#111";
  ctx.beginPath();
  ctx.moveTo(a.x, a.y);
  ctx.lineTo(b.x, b.y);
  ctx.stroke();
}

let drawing = null;
canvas.addEventListener("pointerdown", (event) => {
  event.preventDefault();
  // Keep receiving the stroke when the pen leaves the canvas (fails only for synthetic events).
  try { canvas.setPointerCapture(event.pointerId); } catch { /* no such active pointer */ }
  const p = canvasPoint(event);
  drawing = [p];
  strokes.push(drawing);
  drawSegment(p, p);
  classify();
});
canvas.addEventListener("pointermove", (event) => {
  if (!drawing) return;
  const events = event.getCoalescedEvents ? event.getCoalescedEvents() : [event];
  for (const e of events.length ? events : [event]) {
    const p = canvasPoint(e);
    drawSegment(drawing[drawing.length - 1], p);
    drawing.push(p);
  }
  classify();
});
for (const type of ["pointerup", "pointercancel"]) {
  canvas.addEventListener(type, () => {
    if (drawing) { drawing = null; classify(); }
  });
}

function clear() {
  strokes.length = 0;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  showPreview(null);
  showResult(null);
}
$("clear").addEventListener("click", clear);

// ---- start -----------------------------------------------------------------------------------
const started = performance.now();
try {
  model = await Cinders.load({
    model: params.get("model") || "/models/mnist-cnn.safetensors",
    backend: params.get("backend") || "auto",
    fusion: params.get("fusion") === "1",
    onStatus: (text) => { $("status").textContent = text; },
  });
  $("backend").textContent = model.backend;
  $("backend-note").textContent = model.backendNote ? `(${model.backendNote})` : `(${model.backendName})`;
  $("backend-note").classList.toggle("fallback", model.backend !== "webgpu");
  $("load-time").textContent = `${((performance.now() - started) / 1000).toFixed(2)} s`;
  window.cindersDemo = {
    model, strokesToMnist, imageToMnist, clear,
    predict: (pixels) => model.predict(pixels),
    // Resolves once the prediction shown is the one for the current drawing.
    settled: async () => { while (busy || dirty) await new Promise((r) => setTimeout(r, 20)); },
    loadMs: performance.now() - started,
    readyAt: performance.now(),      // ms since navigation start
  };
  $("status").textContent = "ready";
  if (strokes.length) classify();
} catch (error) {
  $("status").textContent = `error: ${error.message}`;
  throw error;
}
