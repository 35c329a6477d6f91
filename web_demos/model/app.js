// The page `cinders export-web MODEL.onnx` ships: model.onnx (beside this file) is imported by
// cinders.onnx.web in Pyodide and run on WebGPU, else cn.Wasm(), else Python, on inputs the visitor
// can edit (prefilled with example values).
// URL options: ?backend=auto|webgpu|wasm|python. window.cindersModel = {runtime, info, result}
// for tests; #status says "ready", "running", "done" or "error: ...".
import { Cinders } from "../wasm/cinders.js";
import { $, plain, fail, row, showBackend } from "../shared/page.js";
import { inputTable, outputText } from "../shared/onnx_model.js";

const params = new URLSearchParams(location.search);
const status = (text) => { $("status").textContent = text; };
const api = (window.cindersModel = { runtime: null, info: null, result: null });

async function run(onnxWeb, pyodide, fields) {
  status("running");
  const result = plain(await onnxWeb.run(pyodide.toPy(fields.read())));
  api.result = result;
  $("timings").replaceChildren(row(["step", "ms"], true), row(["import", api.info.import_ms.toFixed(1)]),
    row(["first run", result.first_ms.toFixed(1)]), row(["warm run", result.warm_ms.toFixed(1)]));
  $("outputs").textContent = outputText(result);
  status("done");
}

try {
  const runtime = await Cinders.runtime({ backend: params.get("backend") || "auto", onStatus: status });
  api.runtime = runtime;
  showBackend(runtime, params.get("backend"));
  status("importing the model");
  const pyodide = runtime.pyodide;
  const onnxWeb = pyodide.pyimport("cinders.onnx.web");
  const bytes = new Uint8Array(await (await fetch("model.onnx")).arrayBuffer());
  api.info = plain(onnxWeb.import_model(bytes, "model.onnx"));
  const fields = inputTable($("inputs"), onnxWeb, pyodide, api.info.inputs);
  $("run").disabled = false;
  $("run").addEventListener("click", () => run(onnxWeb, pyodide, fields).catch((e) => fail(e, "outputs", "timings")));
  status("ready");
} catch (error) {
  fail(error);
  throw error;
}
