// The anchor pages' ONNX Runtime Web, loaded once here: ?ep=wasm (ort.wasm.min.js) | webgpu
// (ort.webgpu.min.js) from the local npm package, single-threaded (the pages are not
// cross-origin isolated: ORT would fall back to one thread anyway). withOrt(setup) runs
// `await setup(params, ep)` once `ort` exists and shows "ready", or the error, in #status.
function withOrt(setup) {
  const params = new URLSearchParams(location.search);
  const ep = params.get("ep") || "wasm";
  const dist = "/node_modules/onnxruntime-web/dist/";
  const status = (text) => { document.getElementById("status").textContent = text; };
  const script = document.createElement("script");
  script.src = dist + (ep === "webgpu" ? "ort.webgpu.min.js" : "ort.wasm.min.js");
  script.onload = async () => {
    try {
      ort.env.wasm.wasmPaths = dist;
      ort.env.wasm.numThreads = 1;
      await setup(params, ep);
      status("ready");
    } catch (error) {
      status("error: " + error.message);
    }
  };
  script.onerror = () => status("error: cannot load " + script.src);
  document.head.appendChild(script);
}
