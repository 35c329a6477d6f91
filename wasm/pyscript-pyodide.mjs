// PyScript's interpreter for pages that run cinders (pyscript.json: "interpreter":
// "/wasm/pyscript-pyodide.mjs"). PyScript imports it for {loadPyodide, version} and calls
// loadPyodide(options); this one starts Pyodide the way cinders.js does (startPyodide: from the
// server's memory snapshot with cinders already imported, the wheel installed), so a PyScript
// page starts about as fast as the demo pages instead of in 10-20 s. Progress (steps and bytes
// fetched) goes out on the BroadcastChannel PROGRESS_CHANNEL (the page: watchProgress): PyScript runs this in a worker for
// `<script type="py" worker>`, whose downloads the page cannot see.
import { PROGRESS_CHANNEL, progressReporter, startPyodide } from "./cinders.js";

export { version } from "../node_modules/pyodide/pyodide.mjs";

// indexURL is PyScript's guess (this file's folder); Pyodide is where cinders.js finds it.
export async function loadPyodide({ indexURL, ...options }) {
  const channel = new BroadcastChannel(PROGRESS_CHANNEL);
  const progress = progressReporter({ onProgress: (p) => channel.postMessage(p) });
  try {
    const { pyodide } = await startPyodide({
      ...options, status: progress.status,
      pyodideURL: new URL("../node_modules/pyodide/", import.meta.url).href,
      wheelManifest: new URL("../wheels/cinders-wheel.json", import.meta.url).href,
    });
    return pyodide;
  } finally {
    progress.stop();
    channel.close();
  }
}

