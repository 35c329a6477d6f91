// The MNIST drawing page: pointer strokes -> MNIST-like 28x28 -> cinders model in Pyodide.
// URL options: ?backend=auto|webgpu|wasm|python (default auto: WebGPU, else WebAssembly SIMD,
// else Python), ?model=<record url>, ?fusion=1 (WebGPU through cn.Fusion), ?worker=0 (Pyodide on
// the page's thread instead of a Web Worker: window.cindersDemo.model.runtime.pyodide then exists,
// for tests and benchmarks that run Python in the page; the page freezes while it loads),
// ?threads=n (cn.Wasm()'s threads on a cross-origin isolated page; 1: single-threaded).
// The page itself (drawing, bars, timings, window.cindersDemo) is web_demos/shared/digit_page.js;
// here the model is loaded. window.cindersDemo adds {model, readyAt} for tests and benchmarks.
import { Cinders } from "/wasm/cinders.js";
import { digitPage } from "/shared/digit_page.js";

const params = new URLSearchParams(location.search);
const page = digitPage();

const started = performance.now();
try {
  const model = await Cinders.load({
    model: params.get("model") || "/models/mnist-cnn.safetensors",
    backend: params.get("backend") || "auto",
    fusion: params.get("fusion") === "1",
    worker: params.get("worker") !== "0",
    threads: params.has("threads") ? Number(params.get("threads")) : null,   // cn.Wasm()'s threads
    onStatus: (text) => { document.getElementById("status").textContent = text; },
    onProgress: page.progress,
  });
  page.ready({
    predict: (pixels) => model.predict(pixels),
    backend: model.backend,
    note: model.backendNote || model.backendName,
    fallback: model.backend !== "webgpu",
    loadMs: performance.now() - started,
    api: { model, readyAt: performance.now() },     // readyAt: ms since navigation start
  });
} catch (error) {
  page.fail(error);
  throw error;
}
