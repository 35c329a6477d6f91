// The voice-activity page: Silero VAD (an ONNX file imported by cinders.onnx in Pyodide) runs on
// WebGPU, else cn.Wasm(), else Python, on the microphone or an uploaded audio file, 512 samples
// of 16 kHz audio at a time (cinders.apps.vad_web). URL options: ?backend=auto|webgpu|wasm|python.
// window.cindersVad = {runtime, update, probabilities, heard (microphone samples), recording(), done()} for tests;
// recording() gives the microphone's samples as the model saw them (the last minute); #status says "ready",
// "listening", "reading", "done" or "error: ...".
import { Cinders } from "../wasm/cinders.js";
import { $, plain, fail, showBackend } from "../shared/page.js";

const RATE = 16000, CHUNK = 512, SHOWN_CHUNKS = 320;   // the canvas shows the last ~10 s
const RECORDED_BLOCKS = 60 * RATE / CHUNK;               // recording() keeps the last minute
const params = new URLSearchParams(location.search);
const status = (text) => { $("status").textContent = text; };
const api = (window.cindersVad = { runtime: null, update: null, probabilities: [], envelope: [], heard: 0 });
let recorded = [];                 // blocks of microphone samples, oldest first
api.recording = () => {
  const all = new Float32Array(recorded.length * CHUNK);
  recorded.forEach((block, i) => all.set(block, i * CHUNK));
  return Array.from(all);
};

let vadWeb = null;
let queue = Promise.resolve();     // pushes run one after another: the model's state is sequential
let stopMicrophone = null;

function enqueue(samples) {
  queue = queue.then(() => push(samples)).catch(fail);
  return queue;
}

async function push(samples) {
  for (let i = 0; i + CHUNK <= samples.length; i += CHUNK) {       // what the canvas draws
    let lo = 0, hi = 0;
    for (let j = i; j < i + CHUNK; j++) { lo = Math.min(lo, samples[j]); hi = Math.max(hi, samples[j]); }
    api.envelope.push([lo, hi]);
  }
  const update = plain(await vadWeb.push(samples));
  api.probabilities.push(...update.probabilities);
  api.update = update;
  show(update);
}

function show(update) {
  $("seconds").textContent = (update.chunks * CHUNK / RATE).toFixed(1) + " s";
  $("chunk-ms").textContent = update.chunk_ms.toFixed(2) + " ms";
  $("realtime").textContent = update.realtime.toFixed(1);
  $("segments").replaceChildren(...update.segments.map((s) => {
    const li = document.createElement("li");
    li.textContent = `${s.start.toFixed(2)} – ${s.end.toFixed(2)} s`;
    return li;
  }));
  draw(update);
}

function draw(update) {
  const canvas = $("wave"), g = canvas.getContext("2d");
  const { width, height } = canvas, mid = height / 2;
  const first = Math.max(0, api.envelope.length - SHOWN_CHUNKS), step = width / SHOWN_CHUNKS;
  g.fillStyle = "#111";
  g.fillRect(0, 0, width, height);
  g.fillStyle = "rgba(60, 200, 110, 0.35)";                      // speech segments
  for (const [a, b] of update.segments_samples) {
    const x0 = (a / CHUNK - first) * step, x1 = (b / CHUNK - first) * step;
    if (x1 > 0) g.fillRect(Math.max(0, x0), 0, x1 - Math.max(0, x0), height);
  }
  g.fillStyle = "#9cf";                                          // the waveform
  for (let i = first; i < api.envelope.length; i++) {
    const [lo, hi] = api.envelope[i];
    g.fillRect((i - first) * step, mid - hi * mid, Math.max(1, step - 0.5), (hi - lo) * mid + 1);
  }
  g.strokeStyle = "#fc3";                                        // speech probability
  g.beginPath();
  for (let i = first; i < api.probabilities.length; i++) {
    const x = (i - first + 0.5) * step, y = height - api.probabilities[i] * height;
    i === first ? g.moveTo(x, y) : g.lineTo(x, y);
  }
  g.stroke();
}

function restart() {
  vadWeb.reset();
  api.probabilities = [];
  api.envelope = [];
  api.update = null;
  api.heard = 0;
  recorded = [];
}

function isWav(bytes) {
  const tag = (at) => String.fromCharCode(...bytes.subarray(at, at + 4));
  return bytes.length > 12 && tag(0) === "RIFF" && tag(8) === "WAVE";
}

async function samplesOf(file) {
  const bytes = new Uint8Array(await file.arrayBuffer());
  if (isWav(bytes)) {                      // exact PCM, resampled as `cinders vad` does on the desktop
    return new Float32Array(plain(vadWeb.wav_samples(bytes)));
  }
  const audio = await new OfflineAudioContext(1, 1, RATE).decodeAudioData(bytes.buffer);  // MP3, OGG, ...
  const mono = new Float32Array(audio.length);
  for (let c = 0; c < audio.numberOfChannels; c++) {
    audio.getChannelData(c).forEach((v, i) => { mono[i] += v / audio.numberOfChannels; });
  }
  return mono;
}

async function readFile(file) {
  stopMicrophone && stopMicrophone();
  await queue;
  status("reading");
  restart();
  const samples = await samplesOf(file);
  const whole = Math.ceil(samples.length / CHUNK) * CHUNK;       // the last chunk zero-padded
  const padded = new Float32Array(whole);
  padded.set(samples);
  for (let i = 0; i < whole; i += CHUNK * 25) await enqueue(padded.subarray(i, i + CHUNK * 25));
  status("done");
}

async function startMicrophone() {
  await queue;
  restart();
  const stream = await navigator.mediaDevices.getUserMedia(
    { audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false } });
  const context = new AudioContext({ sampleRate: RATE });        // the browser resamples the microphone
  await context.audioWorklet.addModule("capture.js");
  const node = new AudioWorkletNode(context, "vad-capture");
  node.port.onmessage = (event) => {
    api.heard += event.data.length;
    recorded.push(event.data);
    if (recorded.length > RECORDED_BLOCKS) recorded.shift();
    enqueue(event.data);
  };
  const silent = context.createGain();
  silent.gain.value = 0;                                         // pulled by the graph, never heard
  context.createMediaStreamSource(stream).connect(node).connect(silent).connect(context.destination);
  stopMicrophone = () => {
    stream.getTracks().forEach((t) => t.stop());
    context.close();
    stopMicrophone = null;
    $("stop").disabled = true;
    $("mic").disabled = false;
    status("done");
  };
  $("stop").disabled = false;
  $("mic").disabled = true;
  status("listening");
}

try {
  const runtime = await Cinders.runtime({ backend: params.get("backend") || "auto", onStatus: status });
  api.runtime = runtime;
  showBackend(runtime, params.get("backend"));
  status("loading the model");
  const model = await (await fetch("../shipped-models/silero_vad.onnx")).arrayBuffer();
  vadWeb = runtime.pyodide.pyimport("cinders.apps.vad_web");
  api.info = plain(vadWeb.load(new Uint8Array(model)));
  for (const id of ["mic", "file"]) $(id).disabled = false;
  $("file").addEventListener("change", () => $("file").files[0] && readFile($("file").files[0]).catch(fail));
  $("mic").addEventListener("click", () => startMicrophone().catch(fail));
  $("stop").addEventListener("click", () => stopMicrophone && stopMicrophone());
  api.done = () => queue;
  status("ready");
} catch (error) {
  fail(error);
  throw error;
}
