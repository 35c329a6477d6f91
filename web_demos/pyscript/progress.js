// The page's side of the PyScript example's start, on the page's thread. The interpreter
// (/wasm/pyscript-pyodide.mjs) starts Pyodide in PyScript's worker and posts {step, steps, text,
// bytes} on a BroadcastChannel: the progress bar. main.py (pyscript.json names this module `page`)
// then calls step() and ready(): one call each from the worker, where every DOM access of its own
// would be a round trip to this thread.
import { LOAD_STEPS, watchProgress } from "/wasm/cinders.js";

const $ = (id) => document.getElementById(id);

const channel = watchProgress(({ step: reached, steps, text, bytes }) => {
  if (reached < $("load-progress").value) return;   // main.py is past this step already
  $("load-progress").max = steps;
  step(text);
  $("load-bytes").textContent = `${(bytes / 1e6).toFixed(1)} MB`;
});

// A step of LOAD_STEPS reached: the bar and #status.
export function step(text) {
  $("load-progress").value = LOAD_STEPS.indexOf(text) + 1;
  $("status").textContent = text;
}

// The model is loaded: the backend it runs on (and why, after a fallback), the bar gone.
export function ready(backend, note) {
  channel.close();
  $("backend").textContent = backend;
  $("backend-note").textContent = note ? `(${note})` : "";
  $("load-progress").hidden = true;
  $("load-bytes").textContent = "";
  $("status").textContent = "ready";
}
