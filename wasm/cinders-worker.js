// The worker side of Cinders.load({worker: true}) (cinders.js): Pyodide, cinders and the model live
// here, off the page's thread. Messages in: {type: "load", options}, then {type: "predict", id,
// pixels}, {type: "predictBatch", id, inputs} and {type: "run", id, values, sampleShape}. Messages out: {type: "status", text},
// {type: "progress", progress} while loading, then {type: "ready", info, backend, backendName,
// backendNote, wasmThreads, timings, timeOrigin} or {type: "error", message}; each call is answered by {type: "result", id,
// result} or {type: "failed", id, message}.
import { Cinders } from "./cinders.js";

let model = null;
const post = (message) => self.postMessage(message);
const messageOf = (error) => String(error && error.message ? error.message : error);

async function load(options) {
  try {
    model = await Cinders.load({
      ...options, worker: false,
      onStatus: (text) => post({ type: "status", text }),
      onProgress: (progress) => post({ type: "progress", progress }),
    });
    post({ type: "ready", info: model.info, backend: model.backend, backendName: model.backendName,
           backendNote: model.backendNote, wasmThreads: model.wasmThreads, timings: model.timings,
           timeOrigin: performance.timeOrigin });
  } catch (error) {
    post({ type: "error", message: messageOf(error) });
  }
}

// Calls are answered in the order they come: a prediction never overlaps another.
let queue = Promise.resolve();

self.onmessage = ({ data }) => {
  if (data.type === "load") { load(data.options); return; }
  queue = queue.then(async () => {
    try {
      const result = data.type === "predict" ? await model.predict(data.pixels)
        : data.type === "run" ? await model.run(data.values, data.sampleShape) : await model.predictBatch(data.inputs);
      post({ type: "result", id: data.id, result });
    } catch (error) {
      post({ type: "failed", id: data.id, message: messageOf(error) });
    }
  });
};
