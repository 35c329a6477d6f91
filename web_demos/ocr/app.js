// The reading-text page: PP-OCR (three ONNX files imported by cinders.onnx in Pyodide) runs on
// WebGPU, else cn.Wasm(), else Python, on an uploaded photo or a camera frame: the canvas's pixels
// go to cinders.apps.ocr_web (the same TextReader as `cinders ocr`). URL options:
// ?backend=auto|webgpu|wasm|python, ?side=N (the detector's shorter side, default rapidocr's 736).
// window.cindersOcr = {runtime, info, result} for tests; #status says "ready", "reading", "done"
// or "error: ...".
import { Cinders } from "../wasm/cinders.js";
import { $, plain, fail, showBackend } from "../shared/page.js";

const MODELS = ["PP-OCRv6_det_small.onnx", "ch_ppocr_mobile_v2.0_cls_mobile.onnx", "PP-OCRv6_rec_small.onnx"];
const STAGES = ["pixels", "detect", "boxes", "classify", "recognise"];
const params = new URLSearchParams(location.search);
const status = (text) => { $("status").textContent = text; };
const api = (window.cindersOcr = { runtime: null, info: null, result: null });

let ocrWeb = null;
let busy = Promise.resolve();     // one reading at a time

async function readCanvas() {
  status("reading");
  const canvas = $("picture"), g = canvas.getContext("2d");
  const pixels = g.getImageData(0, 0, canvas.width, canvas.height);
  const started = performance.now();
  const result = plain(await ocrWeb.read(pixels.data, canvas.width, canvas.height));
  result.total_ms = performance.now() - started;
  api.result = result;
  show(result);
  status("done");
}

function show(result) {
  const g = $("picture").getContext("2d");
  g.lineWidth = 2;
  g.strokeStyle = "#e33";
  for (const line of result.lines) {
    g.beginPath();
    line.box.forEach(([x, y], i) => (i ? g.lineTo(x, y) : g.moveTo(x, y)));
    g.closePath();
    g.stroke();
  }
  $("lines").replaceChildren(...result.lines.map((line) => {
    const li = document.createElement("li");
    li.textContent = `${line.text}  (${line.score.toFixed(3)})`;
    return li;
  }));
  $("timings").replaceChildren(...[...STAGES, "total"].flatMap((stage) => {
    const th = document.createElement("th"), td = document.createElement("td");
    th.textContent = stage;
    td.textContent = (stage === "total" ? result.total_ms : result.timings[stage]).toFixed(0) + " ms";
    return [th, td];
  }));
}

function paint(source, width, height) {
  const canvas = $("picture");
  canvas.width = width;
  canvas.height = height;
  canvas.getContext("2d").drawImage(source, 0, 0, width, height);
}

async function readFile(file) {
  const bitmap = await createImageBitmap(file);
  paint(bitmap, bitmap.width, bitmap.height);
  bitmap.close();
  await readCanvas();
}

async function startCamera() {
  const video = $("video");
  video.srcObject = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480 } });
  video.hidden = false;
  await video.play();
  $("snap").disabled = false;
  $("camera").disabled = true;
}

async function snap() {
  const video = $("video");
  paint(video, video.videoWidth, video.videoHeight);
  await readCanvas();
}

const queued = (work) => () => { busy = busy.then(work).catch(fail); return busy; };

try {
  const runtime = await Cinders.runtime({ backend: params.get("backend") || "auto", onStatus: status });
  api.runtime = runtime;
  showBackend(runtime, params.get("backend"));
  status("loading the models");
  const models = await Promise.all(MODELS.map(async (name) =>
    new Uint8Array(await (await fetch("../shipped-models/" + name)).arrayBuffer())));
  ocrWeb = runtime.pyodide.pyimport("cinders.apps.ocr_web");
  const side = params.get("side");
  api.info = plain(side ? ocrWeb.load(...models, Number(side)) : ocrWeb.load(...models));
  for (const id of ["file", "camera"]) $(id).disabled = false;
  $("file").addEventListener("change", () => $("file").files[0] && queued(() => readFile($("file").files[0]))());
  $("camera").addEventListener("click", () => startCamera().catch(fail));
  $("snap").addEventListener("click", queued(snap));
  api.done = () => busy;
  status("ready");
} catch (error) {
  fail(error);
  throw error;
}
