// The page `cinders export-web MODEL.onnx` ships: model.onnx (beside this file) is imported by
// cinders.onnx.web in Pyodide and run on WebGPU, else cn.Wasm(), else Python, on random inputs.
// URL options: ?backend=auto|webgpu|wasm|python. window.cindersModel = {runtime, info, result}
// for tests; #status says "ready", "running", "done" or "error: ...".
import { Cinders } from "../wasm/cinders.js";
import { $, plain, fail, row, showBackend } from "../shared/page.js";

const params = new URLSearchParams(location.search);
const status = (text) => { $("status").textContent = text; };
const api = (window.cindersModel = { runtime: null, info: null, result: null });

async function run(onnxWeb) {
  status("running");
  const result = plain(await onnxWeb.run.callKwargs({ batch: Number($("batch").value) || 1,
                                                     seed: Number($("seed").value) || 0 }));
  api.result = result;
  $("timings").replaceChildren(row(["step", "ms"], true), row(["import", api.info.import_ms.toFixed(1)]),
    row(["first run", result.first_ms.toFixed(1)]), row(["warm run", result.warm_ms.toFixed(1)]));
  $("outputs").textContent = result.outputs.map((o) =>
    `${o.name} ${JSON.stringify(o.shape)}: ${o.values.slice(0, 10).map((v) => Number(v).toFixed(5)).join(", ")}` +
    (o.values.length > 10 ? " …" : "")).join("\n");
  status("done");
}

try {
  const runtime = await Cinders.runtime({ backend: params.get("backend") || "auto", onStatus: status });
  api.runtime = runtime;
  showBackend(runtime, params.get("backend"));
  status("importing the model");
  const onnxWeb = runtime.pyodide.pyimport("cinders.onnx.web");
  const bytes = new Uint8Array(await (await fetch("model.onnx")).arrayBuffer());
  api.info = plain(onnxWeb.import_model(bytes, "model.onnx"));
  $("io").replaceChildren(row(["", "name", "shape", "type"], true),
    ...api.info.inputs.map((i) => row(["input", i.name, JSON.stringify(i.shape), i.type])),
    ...api.info.outputs.map((o) => row(["output", o, "", ""])));
  $("run").disabled = false;
  $("run").addEventListener("click", () => run(onnxWeb).catch((e) => fail(e, "outputs", "timings")));
  status("ready");
} catch (error) {
  fail(error);
  throw error;
}
