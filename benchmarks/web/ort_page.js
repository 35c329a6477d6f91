// The anchor pages' ONNX Runtime Web, loaded once here: ?ep=wasm (ort.wasm.min.js) | webgpu
// (ort.webgpu.min.js) from the local npm package, single-threaded unless ?threads=n (the demo
// server's pages are cross-origin isolated, so ORT may start its workers). withOrt(setup) runs
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
      ort.env.wasm.numThreads = Number(params.get("threads") || 1);   // ?threads=n: its worker pool
      await setup(params, ep);
      status("ready");
    } catch (error) {
      status("error: " + error.message);
    }
  };
  script.onerror = () => status("error: cannot load " + script.src);
  document.head.appendChild(script);
}
