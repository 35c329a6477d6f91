// What the Pyodide pages (onnx, model, vad, ocr) share: results out of Python, errors as one line,
// the backend line. Each page keeps this DOM contract:
//   #status                  "error: <one line>" on failure (tests wait on it)
//   <details id="error" hidden><summary>details</summary><pre id="error-details">   the whole text
//   #backend, #backend-note  the backend the page runs on; ?backend= and, after a fallback, why
//
//   import { $, plain, fail, row, showBackend } from "../shared/page.js";

export const $ = (id) => document.getElementById(id);

// A table row of cells (text, or DOM nodes such as input fields); th cells when header.
export function row(cells, header = false) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement(header ? "th" : "td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = c;
    tr.appendChild(td);
  }
  return tr;
}

// Python -> JS for results: dicts become plain objects, lists arrays; the proxy is released.
export function plain(proxy) {
  const value = proxy.toJs({ dict_converter: Object.fromEntries, create_pyproxies: false });
  proxy.destroy();
  return value;
}

// The line a person reads: a Python exception arrives as its whole traceback, whose last
// non-empty line is the exception and its message (its class named without its module:
// "OnnxError: ...", not "cinders.onnx.proto.OnnxError: ..."); other errors are their first line.
export function errorLine(error) {
  const text = String(error && error.message ? error.message : error).trim();
  const lines = text.split("\n").map((l) => l.trim()).filter(Boolean);
  if (lines.length === 0) return "unknown error";
  return text.startsWith("Traceback") ? lines[lines.length - 1].replace(/^(?:[A-Za-z_]\w*\.)+(?=\w+:)/, "") : lines[0];
}

// Status "error: <one line>", the whole text folded under "details"; `stale` elements (results
// of an earlier run) are emptied so the error never sits beside an old output.
export function fail(error, ...stale) {
  $("status").textContent = "error: " + errorLine(error);
  $("error").hidden = false;
  $("error").open = false;
  $("error-details").textContent = String(error && error.message ? error.message : error);
  for (const id of stale) if ($(id)) $(id).textContent = "";
}

export function clearError() {
  $("error").hidden = true;
  $("error-details").textContent = "";
}

const KIND_NAMES = { webgpu: "WebGPU", wasm: "WebAssembly", cpu: "Python" };

// The runtime's note on its backend choice, for a visitor: after a WebGPU fallback one friendly
// sentence instead of the adapter's error and browser flags (pages keep that in a tooltip).
export function friendlyNote(kind, note) {
  return /WebGPU unavailable/.test(note || "") ? `no WebGPU in this browser, so it runs on ${KIND_NAMES[kind] || kind}`
    : note || "";
}

// "#backend" gets the kind (webgpu | wasm | cpu); "#backend-note" the ?backend= asked for and, when
// the page fell back, the friendly note (the runtime's full reason stays in its tooltip).
export function showBackend(runtime, asked) {
  $("backend").textContent = runtime.backend;
  const why = friendlyNote(runtime.backend, runtime.backendNote);
  $("backend-note").textContent = `(?backend=${asked || "auto"}${why ? " · " + why : ""})`;
  $("backend-note").title = runtime.backendNote || "";
}
