// The page's progress bar while PyScript starts Pyodide in its worker: the interpreter
// (/wasm/pyscript-pyodide.mjs) posts {step, steps, text, bytes} on a BroadcastChannel; main.py
// sets the later steps (the backend, the model) and "ready" itself.
import { LOAD_STEPS, watchProgress } from "/wasm/cinders.js";

const $ = (id) => document.getElementById(id);
watchProgress(({ step, steps, text, bytes }) => {
  const bar = $("load-progress");
  if (bar.hidden || step < bar.value) return;   // main.py is past this step already
  bar.max = steps;
  bar.value = step;
  if (LOAD_STEPS.includes($("status").textContent) || $("status").textContent === "loading") $("status").textContent = text;
  $("load-bytes").textContent = `${(bytes / 1e6).toFixed(1)} MB`;
});
