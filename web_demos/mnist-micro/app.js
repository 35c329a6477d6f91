// The MNIST page on MicroPython-wasm: pointer strokes -> MNIST-like 28x28 (the shared
// preprocessing) -> predict() of main.py, run by MicroPython WebAssembly.
// Same DOM contract and window.cindersDemo API as the Pyodide page (web_demos/mnist/): both are
// web_demos/shared/digit_page.js; here the interpreter is started and predict() handed over.
//   ?loader=pyscript (default)  PyScript runs main.py: <script type="mpy" src="main.py"
//                               config="bundle/pyscript.json">
//   ?loader=direct              app.js loads the same interpreter module itself, copies the
//                               bundle into its filesystem and runs main.py (no PyScript:
//                               PyScript's own start-up is most of the cold start)
//   ?backend=python              the runtime's array engine instead of cn.Wasm()'s kernels
import { digitPage } from "/shared/digit_page.js";

const params = new URLSearchParams(location.search);
const loader = params.get("loader") || "pyscript";

// The pixels cross into MicroPython as base64 float32 bytes: decoding 784 floats from JSON there
// costs more than the whole MLP on the wasm engine.
function float32Base64(pixels) {
  const bytes = new Uint8Array(Float32Array.from(pixels).buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i++) binary += String.fromCharCode(bytes[i]);
  return btoa(binary);
}

// Inference is synchronous here (MicroPython runs on the main thread); the latest drawing wins.
const page = digitPage({ inAnimationFrame: true });

// main.py calls this once the model is loaded. Load time counts from navigation start: it is
// the cold start (page, PyScript, interpreter, bundle files, record) to `ready`.
window.cindersMicroReady = (predictPy, engine = "array") => {
  page.ready({
    predict: (pixels) => {
      const t = performance.now();
      const result = JSON.parse(predictPy(float32Base64(pixels)));
      result.ms = performance.now() - t;
      return result;
    },
    backend: engine === "wasm" ? "wasm" : "cpu",
    note: `MicroPython WebAssembly, ${engine} engine${kernelsNote}`,
    fallback: engine !== "wasm",
    loadMs: performance.now(),
  });
};

// cn.Wasm()'s kernels for the runtime's `wasm` engine (its `linear` runs in them); without them
// (or with ?backend=python) the runtime picks its array engine. Loaded before MicroPython
// imports cinders.
let kernelsNote = "";
const kernels = params.get("backend") === "python" ? Promise.resolve(null)
  : import("/wasm/micro_kernels.mjs").then((m) => m.loadMicroKernels()).catch((error) => {
    kernelsNote = ` (WebAssembly kernels unavailable: ${error.message})`;
    return null;
  });

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
  await kernels;
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
  await kernels;
  for (const [path, data] of await files) {
    mp.FS.mkdirTree(path.slice(0, path.lastIndexOf("/")));
    mp.FS.writeFile(path, data);
  }
  mp.runPython(await main);
}

(loader === "direct" ? startDirect() : startWithPyScript()).catch((error) => {
  page.fail(error);
  throw error;
});
