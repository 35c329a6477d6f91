// The Cinders browser runtime: Pyodide + the pure-Python cinders wheel, both served locally.
//
//   import { Cinders } from "/wasm/cinders.js";
//   const model = await Cinders.load({ model: "/models/mnist-cnn.safetensors" });
//   const { class: digit, logits, probabilities } = await model.predict(pixels);  // 784 floats in [0, 1]
//
// With `worker: true` the runtime lives in a dedicated Web Worker (cinders-worker.js): the page's
// own thread only posts pixels and draws, so it answers input while Pyodide starts, while the
// model loads and while it runs. The model then has the same predict/predictBatch/info/backend/
// timings, but no `runtime` (Pyodide is in the worker).
//
// Nothing is fetched from outside the page's server unless a caller passes a CDN `pyodideURL`.
// Python does the work (cinders.web.bridge): it picks the backend (WebGPU through
// cinders.wgpu.browser, else WebAssembly SIMD kernels through cinders.wasm, else Python), reads the record with cinders' own loader and rebuilds the
// model class the record names.

import { importedMemoryPages, startThreaded, threadCount } from "./kernel_threads.mjs";
import { restoreZeroPages } from "./snapshot_pages.mjs";

const HERE = new URL(".", import.meta.url);                     // .../wasm/
const DEFAULTS = {
  pyodideURL: new URL("../node_modules/pyodide/", HERE).href,   // or a CDN folder, for users online
  wheelManifest: new URL("../wheels/cinders-wheel.json", HERE).href,
  backend: "auto",               // "auto" (WebGPU, else WebAssembly SIMD, else Python) | "webgpu" | "wasm" | "python"
  kernelsURL: new URL("../wasm-kernels/cinders-kernels.wasm", HERE).href,  // cn.Wasm()'s module
  threadedKernelsURL: new URL("../wasm-kernels/cinders-kernels-threads.wasm", HERE).href,  // its threaded build
  threads: null,      // cn.Wasm()'s threads where the page is cross-origin isolated: null = the
                      // cores, at most 4; 1 = the single-threaded module (kernel_threads.mjs)
  fusion: false,      // WebGPU through cn.Fusion: elementwise chains become one kernel
  snapshot: true,     // start from the server's Pyodide memory snapshot when it has one: a fast
                      // start, but no JSPI (t.tolist() cannot block; await t.to_data_async())
  packages: [],       // Pyodide packages to load first, e.g. ["numpy"] (needs a pyodideURL that has them)
  onStatus: null,                                               // (text) => void, progress messages
  onProgress: null,   // ({step, steps, text, bytes}) => void: the step reached (1..steps) and the
                      // bytes the network delivered so far (compressed), for a progress bar
  worker: false,      // run Pyodide and the model in a Web Worker (the page never freezes)
  modelSource: null,  // URL of a .py file defining the class the record names (a user's own model)
};

// Options that name files: a worker resolves relative URLs against its own script, so they are
// made absolute against the page first.
const URL_OPTIONS = ["model", "modelSource", "pyodideURL", "wheelManifest", "kernelsURL", "threadedKernelsURL"];

// The steps of a load, in order (onStatus texts; onProgress's step counts them).
export const LOAD_STEPS = ["loading Pyodide", "installing cinders", "starting the backend", "loading the model"];

// Where a Pyodide started for PyScript (pyscript-pyodide.mjs) posts its progress: PyScript may
// start it in a worker, whose downloads the page cannot see.
export const PROGRESS_CHANNEL = "cinders-progress";

// The page's side: onProgress({step, steps, text, bytes}) for each message; returns the channel.
export function watchProgress(onProgress) {
  const channel = new BroadcastChannel(PROGRESS_CHANNEL);
  channel.onmessage = ({ data }) => onProgress(data);
  return channel;
}

let runtimePromise = null;

// onStatus and onProgress from one place: each status text advances the step; the byte count
// grows as each file finishes (resource timing's transferSize: 0 for files from the cache).
export function progressReporter(options) {
  const onStatus = options.onStatus || (() => {});
  const onProgress = options.onProgress;
  if (!onProgress) return { status: onStatus, stop() {} };
  let step = 0, text = "", bytes = 0;
  const report = () => onProgress({ step, steps: LOAD_STEPS.length, text, bytes });
  const observer = typeof PerformanceObserver === "undefined" ? null : new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) bytes += entry.transferSize || 0;
    report();
  });
  if (observer) observer.observe({ type: "resource", buffered: true });
  return {
    status(message) {
      text = message;
      step = Math.max(step, LOAD_STEPS.indexOf(message) + 1);
      onStatus(message);
      report();
    },
    stop() { if (observer) observer.disconnect(); },
  };
}

function now() { return performance.now(); }

async function fetchOk(url, what, init = undefined) {
  const response = await fetch(url, init);
  if (!response.ok) throw new Error(`cinders: cannot fetch ${what} from ${url}: HTTP ${response.status}`);
  return response;
}

// One file the server prepared (cinders.web.wheel; the manifest names it), as an ArrayBuffer.
function fetchPart(manifest, manifestURL, name, what, signal = undefined) {
  const url = new URL(name, manifestURL);
  url.searchParams.set("v", manifest.sources_sha256.slice(0, 16));  // a new build is a new URL
  return fetchOk(url.href, what, { signal }).then((r) => r.arrayBuffer());
}

// The downloads a start begins with, each a promise: the manifest, then as soon as it is in the
// wheel and (useSnapshot) the memory snapshot it names (made by a Pyodide under Node: Pyodide with
// cinders imported; null when there is none); stop() ends the snapshot's download.
function startDownloads(manifestURL, useSnapshot) {
  const manifest = fetchOk(manifestURL, "the wheel manifest").then((r) => r.json());
  const stopper = new AbortController();
  const downloads = {
    manifest,
    wheel: manifest.then((m) => fetchPart(m, manifestURL, m.wheel, "the cinders wheel")),
    snapshot: manifest.then((m) => useSnapshot && m.snapshot
      ? fetchPart(m, manifestURL, m.snapshot, "the Pyodide snapshot", stopper.signal) : null),
    stop: () => stopper.abort(),
  };
  for (const key of ["manifest", "wheel", "snapshot"]) downloads[key].catch(() => {});  // reported where awaited
  return downloads;
}

// loadPyodide's options for a start from the snapshot. Pyodide's loader sizes the interpreter's
// memory by the snapshot, so by itself it sets the interpreter up (compiles pyodide.asm.wasm,
// links it, runs its constructors) only once the whole snapshot is in. Given the snapshot's size
// (the manifest's snapshot_bytes), it gets a buffer of that size at once and sets the interpreter
// up while the snapshot downloads; the createPyodideModule hook (Pyodide's own pyodide.asm.mjs,
// imported from the start) hands the interpreter back only once the snapshot has filled the
// buffer, and Pyodide reads the buffer only then (restoreSnapshot).
// The file holds the memory's nonzero pages only (snapshot_pages.mjs). interpreterScript: the
// import of pyodide.asm.mjs, begun with the loader's. onInterpreter() is called when the
// interpreter is set up.
function snapshotStart(snapshot, size, interpreterScript, onInterpreter) {
  const memory = new Uint8Array(size);
  const filled = snapshot.then((file) => restoreZeroPages(file, memory));
  const createPyodideModule = async (settings) => {
    const { default: create } = await interpreterScript;
    const created = create(settings);
    created.then(onInterpreter, () => {});
    return (await Promise.all([created, filled]))[0];
  };
  return { _loadSnapshot: memory, createPyodideModule };
}

// Pyodide started the fast way: from the server's memory snapshot (cinders already imported) when
// it has one for this Pyodide, with the cinders wheel installed. options: pyodideURL,
// wheelManifest, snapshot, packages, status (progress texts), and loadPyodide's own options
// (stdout, stderr, ...: PyScript passes those). Resolves to {pyodide, timings}.
export async function startPyodide(options) {
  const { pyodideURL, wheelManifest, snapshot: useSnapshot = true, packages = [], status = () => {},
          ...pyodideOptions } = options;
  const timings = {};
  const t0 = now();
  status("loading Pyodide");
  // The downloads, Pyodide's loader and its interpreter's JS, all at once.
  const downloads = startDownloads(wheelManifest, useSnapshot);
  const interpreterScript = import(new URL("pyodide.asm.mjs", pyodideURL).href);
  interpreterScript.catch(() => {});  // reported where it is awaited
  const { loadPyodide, version } = await import(new URL("pyodide.mjs", pyodideURL).href);
  const manifest = await downloads.manifest;
  // The bytecode and the snapshot serve only the very Pyodide that made them (a page may load
  // another Pyodide: pyodideURL).
  const made = (name) => name && name.includes(`-pyodide-${version}.`);
  const parts = {
    wheelName: manifest.wheel,
    wheel: downloads.wheel,
    snapshot: useSnapshot && made(manifest.snapshot) ? downloads.snapshot : null,
    snapshotBytes: manifest.snapshot_bytes,   // the memory it restores
    // Fetched lazily: only a start without the snapshot needs it.
    bytecode: made(manifest.pycache) ? () => fetchPart(manifest, wheelManifest, manifest.pycache, "the cinders bytecode") : null,
  };
  if (!parts.snapshot) downloads.stop();
  if (parts.snapshot) parts.snapshot.then(() => { timings.snapshot_fetched_ms = now() - t0; }, () => {});
  let pyodide = null;
  const start = { ...pyodideOptions, indexURL: pyodideURL };
  if (parts.snapshot) {
    try {
      pyodide = await loadPyodide({ ...start, ...snapshotStart(parts.snapshot, parts.snapshotBytes, interpreterScript,
                                                                () => { timings.interpreter_ms = now() - t0; }) });
      timings.snapshot = true;
    } catch (error) {  // the snapshot API is experimental in Pyodide: a plain start still works
      console.warn("cinders: the Pyodide snapshot did not load, starting without it:", error);
      timings.snapshot_error = String(error);
    }
  } else if (useSnapshot) {
    timings.snapshot_error = "the server has no snapshot for Pyodide " + version +
      " (cinders.web.wheel printed why when it built the wheel)";
  }
  if (!pyodide) {
    pyodide = await loadPyodide(start);
    timings.snapshot = false;
  }
  // The npm package holds no wheels: NumPy (the CPU fallback's faster backend) needs a CDN copy.
  if (packages.length) await pyodide.loadPackage(packages);
  timings.pyodide_ms = now() - t0;

  status("installing cinders");
  const t1 = now();
  const sitePackages = pyodide.runPython("import sysconfig; sysconfig.get_paths()['purelib']");
  if (timings.snapshot) {
    // The snapshot imported cinders from the wheel file itself (zipimport, precompile.mjs): its
    // bytes at the same path serve whatever is imported later, and tracebacks.
    pyodide.FS.writeFile(`${sitePackages}/${parts.wheelName}`, new Uint8Array(await parts.wheel));
  } else {
    pyodide.unpackArchive(await parts.wheel, "wheel", { extractDir: sitePackages });
    if (parts.bytecode) pyodide.unpackArchive(await parts.bytecode(), "zip", { extractDir: sitePackages });
    // New files: forget cached directory listings (importlib.invalidate_caches() does more, and
    // takes a second here).
    pyodide.runPython("import sys; sys.path_importer_cache.clear()");
  }
  timings.wheel_ms = now() - t1;
  return { pyodide, timings };
}

// cn.Wasm()'s kernels: the threaded build on options.threads threads (kernel_threads.mjs: this
// thread and threads - 1 Web Workers on one shared memory) where the page may share memory
// (cross-origin isolated: `cinders serve` and export-web send COOP/COEP), else the single-threaded
// module. With `eager` the module downloads and compiles at once (while Pyodide starts), else on
// the first `await`; the instance and the workers start on the first `await` (a page that runs on
// WebGPU starts none). Awaiting gives
// {instance, memory, threads, note}. A pool on the page's own thread (?worker=0) works too: there
// the calling thread spins for the workers' last items instead of blocking.
function wasmKernels(options, eager) {
  const threads = threadCount(options.threads, navigator.hardwareConcurrency);
  const threaded = threads > 1 && globalThis.crossOriginIsolated;
  const single = () => WebAssembly.compileStreaming(fetchOk(options.kernelsURL, "cn.Wasm()'s kernels"));
  let compiled = null;
  const compile = () => {
    if (compiled) return compiled;
    compiled = threaded
      ? fetchOk(options.threadedKernelsURL, "the threaded kernels").then((r) => r.arrayBuffer())
        .then(async (bytes) => ({ bytes, module: await WebAssembly.compile(bytes) }))
      : single();
    compiled.catch(() => {});  // reported (or fallen back from) where it is awaited
    return compiled;
  };
  if (eager) compile();
  let note = threads > 1 ? "single-threaded build (the page is not cross-origin isolated: no shared memory)"
    : "single-threaded build (threads: 1)";
  const startThreads = async () => {
    const { bytes, module } = await compile();
    const script = new URL("./cinders-kernel-thread.js", import.meta.url);
    const spawn = (data) => {
      const worker = new Worker(script, { type: "module" });
      worker.postMessage(data);
      return worker;
    };
    // (Atomics.wait blocks in a worker; on the page's main thread it is not allowed)
    const inWorker = typeof WorkerGlobalScope !== "undefined" && self instanceof WorkerGlobalScope;
    return startThreaded(module, importedMemoryPages(bytes), threads, spawn, inWorker);
  };
  const start = async () => {
    if (threaded) {
      try {
        const started = await startThreads();
        console.info(`cinders: cn.Wasm() runs its threaded build on ${threads} threads`);
        return { ...started, note: `threaded build on ${threads} threads` };
      } catch (error) {
        note = `single-threaded build (the threaded one failed: ${error.message || error})`;
        console.warn("cinders:", note);
      }
    }
    const instance = await WebAssembly.instantiate(await (threaded ? single() : compile()), {});
    console.info(`cinders: cn.Wasm() runs its ${note}`);
    return { instance, memory: instance.exports.memory, threads: 1, note };
  };
  let started = null;
  return { then(resolve, reject) { started = started || start(); return started.then(resolve, reject); } };
}

async function startRuntime(options) {
  // options.status: Cinders.load's progress reporter (onStatus and onProgress together)
  const status = options.status || options.onStatus || (() => {});
  const t0 = now();
  // cn.Wasm()'s module (~150 KB; threaded, ~180 KB) compiles while Pyodide starts where the page
  // is likely to run on it; where the browser has WebGPU, which "auto" tries first, only once
  // cn.Wasm() is chosen (the download and compile would compete with Pyodide's for the cores).
  // A page forced onto another backend never loads it.
  const kernels = ["webgpu", "python", "cpu"].includes(options.backend) ? null
    : wasmKernels(options, options.backend === "wasm" || !navigator.gpu);
  const { pyodide, timings } = await startPyodide({
    pyodideURL: options.pyodideURL, wheelManifest: options.wheelManifest, snapshot: options.snapshot,
    packages: options.packages, status });
  const t1 = now();
  const bridge = pyodide.pyimport("cinders.web.bridge");
  timings.wheel_ms += now() - t1;

  status("starting the backend");
  const t2 = now();
  const chosen = (await bridge.init(options.backend, options.fusion, kernels || options.kernelsURL)).toJs({ dict_converter: Object.fromEntries });
  timings.backend_ms = now() - t2;
  timings.runtime_ms = now() - t0;
  // cn.Wasm()'s threads (cn.Wasm().threads in Python); 0 on another backend
  const wasmThreads = chosen.backend === "wasm" ? (await kernels).threads : 0;
  timings.wasm_threads = wasmThreads;
  return { pyodide, bridge, backend: chosen.backend, backendName: chosen.name, backendNote: chosen.note,
           wasmThreads, timings };
}

// One image's answer from its logits (float32, as Python hands them over or a Replay reads
// them): the class (the first of equal maxima) and the max-stabilised softmax probabilities.
export function answerOf(logits) {
  let top = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[top]) top = i;
  const exps = Array.from(logits, (v) => Math.exp(v - logits[top]));
  let total = 0;
  for (const e of exps) total += e;
  return { class: top, logits: Array.from(logits), probabilities: exps.map((e) => e / total) };
}

// A captured forward the page replays by itself, with no Python: the pixels written straight
// into the program's input in the module's memory, one run_commands call, the logits read as a
// Float32Array slice of that memory. Python hands the program out after a prediction that
// replayed (cinders.web.bridge Predictor.predict_now, wasm_backend/capture.py standalone) by
// writing a plan block in the module's memory, read here at every call: its first word names
// the model whose plan it is, and Python zeroes it as soon as the plan no longer holds (the
// program stale after a weight was replaced, its commands rebound, kernels queued that must
// run first). Then, and for an input of another length, Python answers as before.
class Replay {
  constructor({ exports, memory, block, owner }) {   // Predictor.replay_slot()
    this.exports = exports;
    this.memory = memory;
    this.block = block >>> 2;   // in words: owner, commands, count, input, input bytes, output, output bytes
    this.owner = owner;
    this.words = null;
    this.floats = null;
  }

  // The logits for these pixels, or null when no plan of this model holds for them.
  run(pixels) {
    const buffer = this.memory.buffer;
    if (this.words === null || this.words.buffer !== buffer) {   // the memory grew: new views
      this.words = new Uint32Array(buffer);
      this.floats = new Float32Array(buffer);
    }
    const plan = this.words, at = this.block;
    if (plan[at] !== this.owner || 4 * pixels.length !== plan[at + 4]) return null;
    this.floats.set(pixels, plan[at + 3] >>> 2);
    this.exports.run_commands(plan[at + 1], plan[at + 2]);
    const output = plan[at + 5] >>> 2;
    return this.floats.slice(output, output + (plan[at + 6] >>> 2));
  }
}

// Python -> JS for results: dicts become plain objects, lists arrays.
function toPlain(proxy) {
  const value = proxy.toJs({ dict_converter: Object.fromEntries, create_pyproxies: false });
  proxy.destroy();
  return value;
}

function flatPixels(input) {
  if (input instanceof Float32Array) return input;
  if (ArrayBuffer.isView(input)) return Float32Array.from(input);
  if (Array.isArray(input)) return Float32Array.from(input.flat(Infinity));
  throw new TypeError("cinders: predict(input) takes a Float32Array or a (nested) array of numbers");
}

class Model {
  constructor(runtime, predictor, info, timings) {
    this.runtime = runtime;
    this._predictor = predictor;
    this.info = info;                 // {class: "MnistCNN", config: {...}, input_shape: [1, 28, 28]}
    this.backend = runtime.backend;   // "webgpu" | "wasm" | "cpu"
    this.backendName = runtime.backendName;
    this.backendNote = runtime.backendNote;
    this.wasmThreads = runtime.wasmThreads;   // cn.Wasm()'s threads (1: single-threaded), 0 elsewhere
    this.timings = timings;
    const slot = runtime.backend === "wasm" ? predictor.replay_slot() : null;
    this.replay = slot ? new Replay(slot) : null;   // cn.Wasm(): the page's own replays
  }

  // input: 784 numbers in [0, 1] (row-major 28x28), flat or nested. Resolves to
  // {class, logits, probabilities, ms}.
  async predict(input) {
    const pixels = flatPixels(input);
    const t0 = now();
    let logits = this.replay ? this.replay.run(pixels) : null;
    // WebGPU reads are awaited; the CPU and cn.Wasm() answer within the call (no event-loop trip)
    if (logits === null) {
      logits = this.backend === "webgpu" ? await this._predictor.predict(pixels) : this._predictor.predict_now(pixels);
    }
    const result = answerOf(logits);
    result.ms = now() - t0;
    return result;
  }

  // Several images at once: inputs is an array of 784-float inputs; one batch through the model.
  async predictBatch(inputs) {
    const flat = new Float32Array(inputs.length * 784);
    inputs.forEach((input, i) => flat.set(flatPixels(input), i * 784));
    const logits = await this._predictor.predict_batch(flat, inputs.length);
    const classes = logits.length / inputs.length;
    return inputs.map((_, i) => answerOf(logits.subarray(i * classes, (i + 1) * classes)));
  }

  // Any model: input holds one or more samples of sampleShape (default: the record's
  // info.input_shape), flat or nested numbers. Resolves to {shape, values (nested as the output), ms}.
  async run(input, sampleShape = null) {
    const t0 = now();
    const result = toPlain(await this._predictor.run(flatPixels(input), sampleShape ?? undefined));  // null would be jsnull
    result.ms = now() - t0;
    return result;
  }
}

// The page's side of a model loaded in a worker: each call is a message answered by id.
class WorkerModel {
  constructor(worker, loaded) {
    this.worker = worker;
    this.info = loaded.info;
    this.backend = loaded.backend;
    this.backendName = loaded.backendName;
    this.backendNote = loaded.backendNote;
    this.wasmThreads = loaded.wasmThreads;
    this.timings = loaded.timings;
    this.pending = new Map();
    this.nextId = 0;
    worker.onmessage = ({ data }) => {
      const call = this.pending.get(data.id);
      this.pending.delete(data.id);
      if (data.type === "result") call.resolve(data.result);
      else call.reject(new Error(data.message));
    };
  }

  call(type, payload, transfer = []) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ type, id, ...payload }, transfer);
    });
  }

  // As Model.predict; `ms` is what the page waited (the worker's own time is `worker_ms`).
  async predict(input) {
    const pixels = Float32Array.from(flatPixels(input));   // a copy: its buffer moves to the worker
    const t0 = now();
    const result = await this.call("predict", { pixels }, [pixels.buffer]);
    result.worker_ms = result.ms;
    result.ms = now() - t0;
    return result;
  }

  predictBatch(inputs) {
    return this.call("predictBatch", { inputs: inputs.map((input) => Float32Array.from(flatPixels(input))) });
  }

  run(input, sampleShape = null) {
    const values = Float32Array.from(flatPixels(input));
    return this.call("run", { values, sampleShape }, [values.buffer]);
  }

  terminate() { this.worker.terminate(); }
}

// Cinders.load({worker: true}): starts cinders-worker.js, which runs Cinders.load itself and
// forwards its onStatus/onProgress calls; resolves to a WorkerModel once the model is loaded.
function loadInWorker(options) {
  const settings = {};
  for (const [key, value] of Object.entries(options)) {
    if (typeof value === "function") continue;   // callbacks stay here, their calls come as messages
    settings[key] = URL_OPTIONS.includes(key) && value ? new URL(value, location.href).href : value;
  }
  const workerCreatedMs = now();   // the page's clock: since navigation
  const worker = new Worker(new URL("./cinders-worker.js", import.meta.url), { type: "module" });
  return new Promise((resolve, reject) => {
    const failed = (message) => { worker.terminate(); reject(new Error(message)); };
    worker.onerror = (event) => failed(`cinders: the worker failed to start: ${event.message || "script error"}`);
    worker.onmessage = ({ data }) => {
      if (data.type === "status") (options.onStatus || (() => {}))(data.text);
      else if (data.type === "progress") (options.onProgress || (() => {}))(data.progress);
      else if (data.type === "error") failed(data.message);
      else if (data.type === "ready") {
        worker.onerror = null;
        data.timings.worker_created_ms = workerCreatedMs;
        // The worker's clock starts when its thread does: on the page's clock, that is
        data.timings.worker_started_ms = data.timeOrigin - performance.timeOrigin;
        resolve(new WorkerModel(worker, data));
      }
    };
    worker.postMessage({ type: "load", options: settings });
  });
}

export const Cinders = {
  // The shared runtime (one Pyodide per page): {pyodide, bridge, backend, timings}.
  runtime(options = {}) {
    if (!runtimePromise) runtimePromise = startRuntime({ ...DEFAULTS, ...options });
    return runtimePromise;
  },

  async load(options = {}) {
    if (!options.model) throw new TypeError("cinders: Cinders.load({model: url}) needs the record's URL");
    if (options.worker) return loadInWorker(options);
    const t0 = now();
    const started_ms = t0;   // in a worker: since the worker started (its own clock)
    const progress = progressReporter(options);
    try {
      // The record (and the model's source) download while the runtime starts.
      const record = fetchOk(options.model, "the model").then((r) => r.arrayBuffer());
      record.catch(() => {});  // reported where it is awaited
      const source = options.modelSource ? fetchOk(options.modelSource, "the model source").then((r) => r.text()) : null;
      if (source) source.catch(() => {});
      const runtime = await this.runtime({ ...options, status: progress.status });
      progress.status("loading the model");
      const t1 = now();
      const bytes = new Uint8Array(await record);
      // undefined, not null, for "none": a JS null reaches Python as jsnull, not None
      const predictor = await runtime.bridge.load_model(bytes, options.model, source ? await source : undefined,
                                                        options.modelSource || undefined);
      const info = predictor.info().toJs({ dict_converter: Object.fromEntries });
      const timings = { ...runtime.timings, model_ms: now() - t1, load_ms: now() - t0, started_ms };
      return new Model(runtime, predictor, info, timings);
    } finally {
      progress.stop();
    }
  },
};

export default Cinders;
