// The drawing page both MNIST demos share (web_demos/mnist/ on Pyodide, web_demos/mnist-micro/ on
// MicroPython-wasm): pointer strokes on #digit-canvas -> the shared MNIST preprocessing -> the
// page's model -> #prediction, ten probability bars in #probabilities, the 28x28 #preview and the
// timings. Each page's app.js only loads its model and hands a predict function to ready().
//
//   const page = digitPage({ inAnimationFrame });
//   page.progress({ step, steps, bytes })                            while loading: #load-progress
//   page.ready({ predict, backend, note, fallback, loadMs, api })   model loaded: status "ready"
//   page.fail(error)                                                 status "error: ..."
//
// predict(pixels) returns (or resolves to) {class, probabilities, logits, ms, ...}.
// window.cindersDemo (used by the e2e tests and benchmarks): {strokesToMnist, imageToMnist, clear,
// predict(pixels) -> Promise, settled() -> Promise, loadMs, ...api}.
import { strokesToMnist, imageToMnist, SIZE } from "/shared/preprocess.js";
import { friendlyNote } from "/shared/page.js";

const $ = (id) => document.getElementById(id);

// inAnimationFrame: the model runs synchronously on the main thread (MicroPython), so inference
// is started from an animation frame rather than from inside the pointer event.
export function digitPage({ inAnimationFrame = false } = {}) {
  const canvas = $("digit-canvas"), ctx = canvas.getContext("2d");
  const previewCtx = $("preview").getContext("2d");
  const strokes = [];            // [[{x, y}, ...], ...] in canvas pixels
  let predict = null, busy = false, dirty = false;

  const fail = (error) => { $("status").textContent = `error: ${error.message}`; };

  // ---- probability bars -----------------------------------------------------------------------
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

  // ---- inference, at most one in flight; the latest drawing wins ----------------------------
  async function classify() {
    if (!predict) return;
    if (busy) { dirty = true; return; }
    busy = true;
    try {
      if (inAnimationFrame) await new Promise((resolve) => requestAnimationFrame(resolve));
      do {
        dirty = false;
        const pixels = strokesToMnist(strokes);
        showPreview(pixels);
        showResult(pixels ? await predict(pixels) : null);
      } while (dirty);
    } catch (error) {
      fail(error);
      throw error;
    } finally {
      busy = false;
    }
  }

  // ---- drawing with pointer events (mouse, touch, pen) --------------------------------------
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

  // ---- loading: a bar over the load's steps and the megabytes downloaded so far -------------------
  function progress({ step, steps, bytes }) {
    const bar = $("load-progress");
    if (!bar) return;
    bar.max = steps;
    bar.value = step;
    $("load-bytes").textContent = `${(bytes / 1e6).toFixed(1)} MB`;
  }

  // ---- the model is loaded --------------------------------------------------------------------
  // backend: "webgpu" | "wasm" | "cpu"; note: shown in brackets after it, marked as a fallback when
  // `fallback`; loadMs: load time shown; api: what the page adds to window.cindersDemo.
  function ready({ predict: modelPredict, backend, note, fallback = false, loadMs, api = {} }) {
    predict = modelPredict;
    $("backend").textContent = backend;
    $("backend-note").textContent = `(${friendlyNote(backend, note)})`;
    $("backend-note").title = note;    // the runtime's whole reason, for whoever hovers
    $("backend-note").classList.toggle("fallback", fallback);
    $("load-time").textContent = `${(loadMs / 1000).toFixed(2)} s`;
    window.cindersDemo = {
      ...api, strokesToMnist, imageToMnist, clear, loadMs,
      predict: async (pixels) => modelPredict(pixels),
      // Resolves once the prediction shown is the one for the current drawing.
      settled: async () => { while (busy || dirty) await new Promise((r) => setTimeout(r, 20)); },
    };
    $("status").textContent = "ready";
    if ($("load-progress")) $("load-progress").hidden = true;
    if (strokes.length) classify();
  }

  return { ready, fail, progress };
}
