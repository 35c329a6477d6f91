// The MNIST page on MicroPython-wasm: pointer strokes -> MNIST-like 28x28 (the shared
// preprocessing) -> predict() of main.py, run by MicroPython WebAssembly.
// Same DOM contract and window.cindersDemo API as the Pyodide page (web_demos/mnist/).
//   ?loader=pyscript (default)  PyScript runs main.py: <script type="mpy" src="main.py"
//                               config="bundle/pyscript.json">
//   ?loader=direct              app.js loads the same interpreter module itself, copies the
//                               bundle into its filesystem and runs main.py (no PyScript:
//                               PyScript's own start-up is most of the cold start)
import { strokesToMnist, imageToMnist, SIZE } from "/shared/preprocess.js";

const params = new URLSearchParams(location.search);
const loader = params.get("loader") || "pyscript";

const $ = (id) => document.getElementById(id);
const canvas = $("digit-canvas"), ctx = canvas.getContext("2d");
const previewCtx = $("preview").getContext("2d");
const strokes = [];
let predictPy = null, busy = false, dirty = false;

const bars = [];
for (let d = 0; d < 10; d++) {
  const bar = document.createElement("div");
  bar.className = "bar";
  bar.dataset.digit = String(d);
  bar.innerHTML = `<span class="digit">${d}</span><span class="track"><span class="fill"></span></span><span class="value"></span>`;
  $("probabilities").appendChild(bar);
  bars.push(bar);
}

function predict(pixels) {
  const t = performance.now();
  const result = JSON.parse(predictPy(JSON.stringify(Array.from(pixels))));
  result.ms = performance.now() - t;
  return result;
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

// Inference is synchronous here (MicroPython runs on the main thread); the latest drawing wins.
function classify() {
  if (!predictPy) return;
  if (busy) { dirty = true; return; }
  busy = true;
  requestAnimationFrame(() => {
    try {
      do {
        dirty = false;
        const pixels = strokesToMnist(strokes);
        showPreview(pixels);
        showResult(pixels ? predict(pixels) : null);
      } while (dirty);
    } catch (error) {
      $("status").textContent = `error: ${error.message}`;
      throw error;
    } finally {
      busy = false;
    }
  });
}

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
  canvas.setPointerCapture(event.pointerId);
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
  canvas.addEventListener(type, () => { if (drawing) { drawing = null; classify(); } });
}

function clear() {
  strokes.length = 0;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  showPreview(null);
  showResult(null);
}
$("clear").addEventListener("click", clear);

// main.py calls this once the model is loaded. Load time counts from navigation start: it is
// the cold start (page, PyScript, interpreter, bundle files, record) to `ready`.
window.cindersMicroReady = (fn) => {
  predictPy = fn;
  const loadMs = performance.now();
  $("backend").textContent = "cpu";
  $("backend-note").textContent = "(MicroPython WebAssembly, array engine)";
  $("load-time").textContent = `${(loadMs / 1000).toFixed(2)} s`;
  window.cindersDemo = {
    strokesToMnist, imageToMnist, clear, loadMs,
    predict: async (pixels) => predict(pixels),
    settled: async () => { while (busy || dirty) await new Promise((r) => setTimeout(r, 20)); },
  };
  $("status").textContent = "ready";
  if (strokes.length) classify();
};

// The bundle is generated (cinders.micro.web.ensure_web_bundle, which `cinders demo` runs):
// say so plainly when it is missing instead of leaving the page at "loading".
async function bundleConfig() {
  const response = await fetch("bundle/pyscript.json");
  if (!response.ok) {
    throw new Error(`bundle/pyscript.json: HTTP ${response.status}; build the bundle with ` +
                    "cinders.micro.web.ensure_web_bundle() (cinders demo does)");
  }
  return response.json();
}

async function startWithPyScript() {
  await bundleConfig();
  const script = document.createElement("script");
  script.type = "mpy";
  script.src = "main.py";
  script.setAttribute("config", "bundle/pyscript.json");
  document.body.appendChild(script);
  await import("/node_modules/@pyscript/core/dist/core.js");
}

// The interpreter PyScript would load (bundle/pyscript.json names the same file); started
// before anything else so its download and compilation overlap the bundle's.
const INTERPRETER = "/node_modules/@micropython/micropython-webassembly-pyscript/micropython.mjs";

async function fetchBundle() {
  const config = await bundleConfig();
  return Promise.all(Object.entries(config.files).map(async ([url, path]) => {
    const response = await fetch(new URL(url, new URL("bundle/", location.href)));
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    return [path, new Uint8Array(await response.arrayBuffer())];
  }));
}

async function startDirect() {
  const interpreter = import(INTERPRETER).then((m) => m.loadMicroPython());
  const files = fetchBundle();
  const main = fetch("main.py").then((r) => r.text());
  const mp = await interpreter;
  for (const [path, data] of await files) {
    mp.FS.mkdirTree(path.slice(0, path.lastIndexOf("/")));
    mp.FS.writeFile(path, data);
  }
  mp.runPython(await main);
}

(loader === "direct" ? startDirect() : startWithPyScript()).catch((error) => {
  $("status").textContent = `error: ${error.message}`;
  throw error;
});
