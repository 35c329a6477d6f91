// Runs a cinders micro bundle inside MicroPython WebAssembly (npm
// @micropython/micropython-webassembly-pyscript) under Node:
//   node micro_wasm_run.mjs MICROPYTHON_MJS BUNDLE_DIR INPUT_JSON [REPEAT] [KERNELS_WASM]
// Copies the bundle into the interpreter's in-memory filesystem, runs the bundle's predict
// entry (cinders.run.main) on INPUT_JSON, then times REPEAT more inferences. Prints the
// predict JSON line, then one JSON line of timings.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { pathToFileURL } from "node:url";

const [mjsPath, bundleDir, inputPath, repeatArg, kernelsPath] = process.argv.slice(2);
if (kernelsPath) {  // cn.Wasm()'s module: the runtime then picks its wasm engine (test_wasm_micro.py)
  const { installMicroKernels } = await import(new URL("../wasm/micro_kernels.mjs", import.meta.url).href);
  const { instance } = await WebAssembly.instantiate(readFileSync(kernelsPath), {});
  installMicroKernels(instance);
}
const repeat = parseInt(repeatArg || "0", 10);
const t0 = performance.now();
const { loadMicroPython } = await import(pathToFileURL(mjsPath).href);
const lines = [];
const mp = await loadMicroPython({
  stdout: (s) => lines.push(s),
  stderr: (s) => process.stderr.write(s + "\n"),
});
const tReady = performance.now();

function copyTree(dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    const target = "/bundle/" + relative(bundleDir, path);
    if (statSync(path).isDirectory()) {
      mp.FS.mkdirTree(target);
      copyTree(path);
    } else {
      mp.FS.writeFile(target, readFileSync(path));
    }
  }
}
mp.FS.mkdirTree("/bundle");
copyTree(bundleDir);
mp.FS.writeFile("/bundle/input.json", readFileSync(inputPath));
const tFiles = performance.now();

try {
  mp.runPython(`
import sys, os, gc, time
os.chdir("/bundle")
sys.path.insert(0, "/bundle/lib")
sys.path.insert(0, "/bundle")
import model
from cinders import run, record
run.main(["predict.py", "input.json"], model)
_net = record.load_model("model.safetensors", model)
_pixels = run.read_input("input.json", (1, 28, 28))[0]
_times = []
for _ in range(${repeat}):
    _t = time.ticks_us()
    run.predict(_net, _pixels)
    _times.append(time.ticks_diff(time.ticks_us(), _t) / 1000)
print("TIMING", min(_times) if _times else 0, sum(_times) / max(len(_times), 1))
`);
} catch (e) {
  process.stderr.write(String(e) + "\n" + lines.join("\n") + "\n");
  process.exit(1);
}
const tDone = performance.now();
const timing = lines.find((l) => l.startsWith("TIMING"));
for (const l of lines) if (!l.startsWith("TIMING")) console.log(l);
console.log(JSON.stringify({
  interpreter_ready_ms: tReady - t0,
  files_ms: tFiles - tReady,
  first_prediction_ms: tDone - tFiles,
  inference_ms: repeat ? parseFloat(timing.split(" ")[1]) : null,  // best of REPEAT
  mean_ms: repeat ? parseFloat(timing.split(" ")[2]) : null,
}));
