// The ONNX page: uploaded files (an .onnx, with its external data if it has any) are imported by
// cinders.onnx inside Pyodide (no onnx package, no server round trip) and run on WebGPU, else
// cn.Wasm(), else Python, on inputs the visitor can edit; a decoder with a KV cache also generates.
// URL options: ?backend=auto|webgpu|wasm|python (default auto), ?threads=n (cn.Wasm()'s threads).
// window.cindersOnnx = {info, result, runtime, generation} for tests; #status says "ready",
// "importing", "running", "generating", "done" or "error: ...".
import { Cinders } from "../wasm/cinders.js";
import { $, plain, fail, clearError, row, showBackend } from "../shared/page.js";
import { inputTable, outputText } from "../shared/onnx_model.js";

const params = new URLSearchParams(location.search);
const status = (text) => { $("status").textContent = text; };
const api = (window.cindersOnnx = { info: null, result: null, runtime: null, generation: null });
const STALE = ["outputs", "timings", "tokens", "tokens-per-s"];   // emptied when something fails

async function runModel(onnxWeb, pyodide, fields) {
  status("running");
  const result = plain(await onnxWeb.run(pyodide.toPy(fields.read())));
  api.result = result;
  $("timings").replaceChildren(row(["step", "ms"], true),
    row(["import (read + generate + build)", api.info.import_ms.toFixed(1)]),
    row(["first run", result.first_ms.toFixed(1)]),
    row([result.captured ? "warm run (captured replay)" : "warm run", result.warm_ms.toFixed(1)]));
  $("outputs").textContent = outputText(result);
  status("done");
}

// The sampling fields as generate's keyword arguments: temperature 0 is greedy; an empty top-k
// keeps every token, an empty seed draws from cn.random's counter.
function samplingOptions() {
  const options = { temperature: Number($("temperature").value || 0) };
  if (!(options.temperature >= 0)) throw new Error(`the temperature must be a number ≥ 0, got "${$("temperature").value}"`);
  for (const [name, id, least] of [["top_k", "top-k", 1], ["seed", "seed", 0]]) {
    const text = $(id).value.trim();
    if (!text) continue;
    const value = Number(text);
    if (!Number.isInteger(value) || value < least) throw new Error(`${id} must be an integer ≥ ${least} or empty, got "${text}"`);
    options[name] = value;
  }
  return options;
}

async function generate(onnxWeb, pyodide) {
  const prompt = $("prompt").value.trim().split(/[\s,]+/).filter(Boolean).map(Number);
  if (!prompt.length || prompt.some((t) => !Number.isInteger(t) || t < 0)) {
    throw new Error(`the prompt must be token ids (integers ≥ 0) separated by spaces, got "${$("prompt").value}"`);
  }
  const options = samplingOptions();
  status("generating");
  const generation = (api.generation = { prompt, options, tokens: [], seconds: [], result: null });
  $("tokens").textContent = prompt.join(" ") + " |";
  $("tokens-per-s").textContent = "";
  const onToken = (token, seconds) => {     // called from Python as each token is read
    generation.tokens.push(token);
    generation.seconds.push(seconds);
    $("tokens").textContent += " " + token;
    $("tokens-per-s").textContent = `${(generation.tokens.length / seconds).toFixed(1)} tokens/s`;
  };
  const newTokens = Number($("new-tokens").value) || 1;
  generation.result = plain(await onnxWeb.generate.callKwargs(pyodide.toPy(prompt), newTokens, onToken, options));
  $("tokens-per-s").textContent = `${generation.result.tokens_per_s.toFixed(1)} tokens/s ` +
    `(${generation.tokens.length} tokens in ${generation.result.ms.toFixed(0)} ms)`;
  status("done");
}

async function importFiles(onnxWeb, pyodide, files) {
  clearError();
  $("model").hidden = true;
  $("run").disabled = true;
  status("importing");
  const named = new Map();
  for (const file of files) named.set(file.name, new Uint8Array(await file.arrayBuffer()));
  api.info = plain(onnxWeb.import_files(pyodide.toPy(named)));
  $("source").textContent = api.info.source;
  const fields = inputTable($("inputs"), onnxWeb, pyodide, api.info.inputs);
  $("generate").hidden = !api.info.generates;
  $("model").hidden = false;
  $("run").disabled = false;
  $("run").onclick = () => { clearError(); runModel(onnxWeb, pyodide, fields).catch((e) => fail(e, ...STALE)); };
  $("generate-button").onclick = () => { clearError(); generate(onnxWeb, pyodide).catch((e) => fail(e, ...STALE)); };
  await runModel(onnxWeb, pyodide, fields);
}

try {
  const runtime = await Cinders.runtime({ backend: params.get("backend") || "auto", onStatus: status,
                                          threads: params.has("threads") ? Number(params.get("threads")) : null });
  api.runtime = runtime;
  showBackend(runtime, params.get("backend"));
  const pyodide = runtime.pyodide;
  const onnxWeb = pyodide.pyimport("cinders.onnx.web");
  const load = (files) => files.length && importFiles(onnxWeb, pyodide, files).catch((e) => fail(e, ...STALE));
  $("file").disabled = false;
  $("file").addEventListener("change", () => load([...$("file").files]));
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    load([...e.dataTransfer.files]);
  });
  status("ready");
} catch (error) {
  fail(error);
  throw error;
}
