// The ONNX page: an uploaded .onnx file is imported by cinders.onnx inside Pyodide (no onnx
// package, no server round trip) and run on WebGPU (or the CPU fallback).
// URL options: ?backend=cpu|webgpu|auto (default auto).
// window.cindersOnnx = {info, result, runtime} for tests; #status says "ready", "importing",
// "running", "done" or "error: ...".
import { Cinders } from "../wasm/cinders.js";

const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const status = (text) => { $("status").textContent = text; };
const api = (window.cindersOnnx = { info: null, result: null, runtime: null });

// A Python exception arrives as its whole traceback: the status shows its last line (the
// exception and its message); the traceback stays folded under "details".
function fail(error) {
  const text = String(error && error.message ? error.message : error).trim();
  const lines = text.split("\n");
  status("error: " + (lines[0].startsWith("Traceback") ? lines[lines.length - 1] : lines[0]).trim());
  $("outputs").textContent = "";
  $("error").hidden = false;
  $("error-details").textContent = text;
}

function row(cells, header = false) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement(header ? "th" : "td");
    td.textContent = c;
    tr.appendChild(td);
  }
  return tr;
}

function plain(proxy) {
  const value = proxy.toJs({ dict_converter: Object.fromEntries, create_pyproxies: false });
  proxy.destroy();
  return value;
}

async function runModel(onnxWeb) {
  status("running");
  const batch = Number($("batch").value) || 1;
  const result = plain(await onnxWeb.run(batch, 0));
  api.result = result;
  const t = $("timings");
  t.replaceChildren(row(["step", "ms"], true), row(["import (read + generate + build)", api.info.import_ms.toFixed(1)]),
    row([`first run (batch ${batch})`, result.first_ms.toFixed(1)]), row([result.captured ? "warm run (captured replay)" : "warm run", result.warm_ms.toFixed(1)]));
  $("outputs").textContent = result.outputs.map((o) =>
    `${o.name} ${JSON.stringify(o.shape)}: ${o.values.slice(0, 10).map((v) => Number(v).toFixed(5)).join(", ")}` +
    (o.values.length > 10 ? " …" : "")).join("\n");
  status("done");
}

try {
  const runtime = await Cinders.runtime({ backend: params.get("backend") || "auto", onStatus: status });
  api.runtime = runtime;
  $("backend").textContent = runtime.backend + (runtime.backendNote ? ` (${runtime.backendNote})` : "");
  const onnxWeb = runtime.pyodide.pyimport("cinders.onnx.web");
  $("file").disabled = false;
  status("ready");
  $("file").addEventListener("change", async () => {
    const file = $("file").files[0];
    if (!file) return;
    $("error").hidden = true;
    try {
      status("importing");
      const bytes = new Uint8Array(await file.arrayBuffer());
      api.info = plain(onnxWeb.import_model(bytes, file.name));
      $("source").textContent = api.info.source;
      const io = $("io");
      io.replaceChildren(row(["", "name", "shape", "type"], true));
      api.info.inputs.forEach((i) => io.appendChild(row(["input", i.name, JSON.stringify(i.shape), i.type])));
      api.info.outputs.forEach((o) => io.appendChild(row(["output", o, "", ""])));
      $("model").hidden = false;
      $("run").disabled = false;
      await runModel(onnxWeb);
    } catch (error) {
      fail(error);
    }
  });
  $("run").addEventListener("click", () => runModel(onnxWeb).catch(fail));
} catch (error) {
  fail(error);
  throw error;
}
