"""Quantized models against their float32 originals (issue 28, item 7), side by side in one run.

Files: resnet18 (torchvision, random weights) and a BERT-style encoder (`transformers` config,
random weights; benchmarks/onnx_transformers.py builds and exports it), each as
    f32          the exported float model
    q8_dynamic   onnxruntime quantize_dynamic, int8 weights (DynamicQuantizeLinear + MatMulInteger
                 / ConvInteger)
    q8_qdq       onnxruntime quantize_static in QDQ form (int8, random calibration batches)
    q4           onnxruntime MatMul4BitsQuantizer (MatMulNBits, 4-bit blocks of 32)
    q4_qdq       the same quantizer with quant_format=QDQ (DequantizeLinear of uint4 weights in
                 blocks of 32 along K, with zero points, feeding each MatMul)
    cinders_q8   `cinders quantize --mode q8` (DynamicQuantizeMatMul, int8 per-column weights)
    cinders_q4   `cinders quantize --mode q4` (MatMulNBits, block 32)
    f16          onnxruntime's float16 converter (convert_float_to_float16, keep_io_types: float32
                 inputs and outputs, float16 weights and activations inside)
all written offline into .cache/quantized/. Stacks: cn.NumPy(), cn.Wasm() (the desktop engine:
wasmtime in process), cn.Wgpu(), cn.Fusion(cn.Wgpu()) ("fusion") and onnxruntime's CPU provider
(1 thread). --capture times cn.capture(model)'s replays instead of eager calls (on a GPU the
eager calls' time is mostly Python per kernel, and the quantized graphs have more kernels).

One JSON line per (model, variant, stack):
    {"bench": "quantized", "model", "variant", "stack", "file_bytes", "file_ratio" (to f32),
     "memory_bytes" (what the loaded model holds: Wgpu memory_stats allocated bytes, NumPy
     tracemalloc, Wasm heap bytes in use; onnxruntime: null), "memory_ratio" (to f32 on the same stack),
     "ms" (median of --repeat calls after warm-up), "time_ratio" (to f32 on the same stack),
     "ort_ratio" (to onnxruntime on the same file), "max_abs_diff" (to onnxruntime on the same
     file), "device"}
Every model's files are loaded on every stack first and then timed in turns, one call of each
per round (timing.interleaved_median_ms), so the ratios hold on a loaded machine.

--tab: the same files in one headless Chromium instead (default variants f32,q8_dynamic), both
single-threaded: stack "tab-wasm" is cn.Wasm() in the /onnx/ page's Pyodide (?backend=wasm; the
page's Python loads each file and calls its captured forward, memory_bytes = the Wasm heap bytes
the loaded model holds) and "ort-web-wasm" ONNX Runtime Web's WASM EP
(benchmarks/web/ort_models.html); ms is timed by each page's clock around the call and the read of
the first output, in turns as above; ort_ratio and max_abs_diff are to ORT Web on the same file,
max_abs_diff_ort_as_written to onnxruntime CPU with graph optimizations off.

    python benchmarks/quantized.py --backend wgpu           # the lent GPU (with onnxruntime CPU)
    python benchmarks/quantized.py --backend wgpu,fusion,ort --capture   # the GPU, captured
    python benchmarks/quantized.py --small                  # lavapipe / 2 cores: small shapes
    python benchmarks/quantized.py --backend numpy,wasm,wgpu,ort --models bert
    python benchmarks/quantized.py --backend wasm,ort --variants f32,q8_dynamic,cinders_q8   # cn.Wasm() q8
    python benchmarks/quantized.py --tab                    # cn.Wasm() in the tab vs ORT Web (WASM EP)
    python benchmarks/quantized.py --backend wasm,ort --wasm-engine wasmtime   # the tab's .wasm module
    python benchmarks/quantized.py --backend numpy,wasm,ort --variants f32,f16  # half models
    python benchmarks/quantized.py --backend numpy,wasm,ort --models bert --variants f32,q4,q4_qdq

--profile: where cn.Wasm()'s time goes instead, one JSON line per (model, variant):
    {"bench": "quantized_profile", "model", "variant", "device", "launches", "ms" (the kernels'
     sum per call), "kernels": {name: [ms per call, launches per call]} (largest first)}
cn.profile sees no kernel events on cn.Wasm() (its queued kernels run in one host call), so each
kernel is run and timed on its own here: every launch then also pays one host call, which
inflates small kernels; read the shares, not the absolute times.
    python benchmarks/quantized.py --profile --models bert --variants f32,q8_qdq --wasm-engine wasmtime
With --backend wgpu, cn.Wgpu()'s instead: each kernel's GPU time (cn.profile's timestamps; "ms" is
their sum, not the wall time) and launches per call.
    python benchmarks/quantized.py --profile --backend wgpu --variants f32,f16,q8_dynamic,q8_qdq
"""

import argparse
import importlib.util
import json
import logging
import os
import sys
import tracemalloc
import warnings

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from timing import interleaved_median_ms, torch_cuda_context  # noqa: E402

import numpy as np  # noqa: E402

import cinders as cn  # noqa: E402
from cinders.onnx import load  # noqa: E402

CACHE = os.path.join(ROOT, ".cache", "quantized")
VARIANTS = ("f32", "q8_dynamic", "q8_qdq", "q4", "cinders_q8", "cinders_q4", "f16", "q4_qdq")
STACKS = ("numpy", "wasm", "wgpu", "fusion", "ort")


def _transformers_bench():
    """benchmarks/onnx_transformers.py as a module (its BERT builder and exporter)."""
    spec = importlib.util.spec_from_file_location("onnx_transformers", os.path.join(HERE, "onnx_transformers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def float_model(name, small):
    """(path of the float32 file, {input name: array} of one call)."""
    os.makedirs(CACHE, exist_ok=True)
    rng = np.random.default_rng(0)
    if name == "resnet18":
        import onnx_models
        size = 64 if small else 224
        path = onnx_models.export("resnet18", "torchscript", size=size)
        return path, {"image": rng.standard_normal((1, 3, size, size)).astype(np.float32)}
    bench = _transformers_bench()
    config = bench.SMALL if small else bench.CONFIGS["bert"]
    path = os.path.join(CACHE, "bert%s.onnx" % ("_small" if small else ""))
    if not os.path.exists(path):
        bench.export(bench.build("bert", config), config["seq"], path)
    return path, {"x": rng.integers(0, 1000, (1, config["seq"])).astype(np.int64)}


def quantized_file(src, variant, feeds):
    """The `variant` of the float model at src, written once into the cache."""
    if variant == "f32":
        return src
    dst = os.path.join(CACHE, "%s.%s.onnx" % (os.path.splitext(os.path.basename(src))[0], variant))
    if os.path.exists(dst):
        return dst
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    logging.disable(logging.WARNING)   # the quantizers advise pre-processing on every call
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if variant == "q8_dynamic":
                quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
            elif variant == "q8_qdq":
                quantize_static(src, dst, _Calibration(feeds), quant_format=QuantFormat.QDQ,
                                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
            elif variant == "f16":
                from onnxruntime.transformers.float16 import convert_float_to_float16
                onnx.save(convert_float_to_float16(onnx.load(src), keep_io_types=True), dst)
            elif variant == "q4":
                from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
                q = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=False)
                q.process()
                q.model.save_model_to_file(dst)
            elif variant == "q4_qdq":
                from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                             MatMulNBitsQuantizer)
                config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False, quant_format=QuantFormat.QDQ)
                q = MatMulNBitsQuantizer(onnx.load(src), algo_config=config)
                q.process()
                q.model.save_model_to_file(dst)
            else:
                from cinders.onnx.quantize import quantize_model
                quantize_model(src, dst, variant.split("_")[1])
    finally:
        logging.disable(logging.NOTSET)
    return dst


class _Calibration:
    """onnxruntime's CalibrationDataReader: a few random batches like the benchmark's input."""

    def __init__(self, feeds):
        rng = np.random.default_rng(1)
        batches = []
        for _ in range(4):
            batches.append({k: (rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f"
                                else rng.integers(0, 1000, v.shape).astype(v.dtype)) for k, v in feeds.items()})
        self.batches = iter(batches)

    def get_next(self):
        return next(self.batches, None)



def _backend(stack, wasm_engine=None):
    if stack == "numpy":
        return cn.NumPy()
    if stack == "wasm":
        return cn.Wasm(engine=wasm_engine)
    return cn.Fusion(cn.Wgpu()) if stack == "fusion" else cn.Wgpu()


def _memory(stack, backend):
    """Bytes the backend holds now (see the module's docstring)."""
    if stack in ("wgpu", "fusion"):
        backend.synchronize()
        return backend.memory_stats()["allocated_bytes"]
    if stack == "wasm":
        backend.synchronize()
        return backend.heap.in_use
    return tracemalloc.get_traced_memory()[0]


def cinders_runner(stack, path, feeds, wasm_engine=None, backend=None, capture=False):
    """({memory_bytes, device}, run) of the model at path loaded on `stack` (on `backend` where
    given, else a new one); run() -> output; capture: run() replays cn.capture(model)."""
    backend = backend or _backend(stack, wasm_engine)
    if stack in ("wgpu", "fusion"):
        backend.synchronize()
        backend.empty_cache()
    tracemalloc.start()
    before = _memory(stack, backend)
    model = load(path, backend=backend)
    held = _memory(stack, backend) - before
    tracemalloc.stop()
    inputs = [cn.tensor(v.astype(np.int32) if v.dtype == np.int64 else v, backend=backend)
              for v in feeds.values()]

    forward = cn.capture(model) if capture else model

    def run():
        out = forward(*inputs)
        return (out[0] if isinstance(out, (tuple, list)) else out).numpy()
    device = backend.device.name if stack == "wgpu" else backend.inner.device.name if stack == "fusion" else stack
    if stack == "wasm":
        from cinders.wasm.engines import default_engine_name
        device = "wasm-%s" % (wasm_engine or default_engine_name())
    return {"memory_bytes": held, "device": device}, run


def ort_runner(path, feeds):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return {"memory_bytes": None, "device": "onnxruntime-cpu-1-thread"}, lambda: session.run(None, feeds)[0]


# ---- --tab: the same files in headless Chromium ------------------------------------------------
TAB_STACKS = ("tab-wasm", "ort-web-wasm")
# The page's Python, run in the /onnx/ page's Pyodide (?backend=wasm): a file is fetched, loaded on
# the page's cn.Wasm() and its forward captured, as the pages run models; the Python that is
# alive then is frozen out of the collector, as the MNIST page does after loading its model.
# tab_run(key) is one replay of the captured forward and the read of its first output, timed by
# the page's clock (Pyodide's perf_counter is performance.now(), ORT Web's page's clock).
TAB_PYTHON = """
import gc
import json
import time

import js

import cinders as cn
from cinders.onnx import load
from cinders.web.bridge import current_backend, read_async

TAB = {}


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


async def tab_load(key, url, feeds):
    data = (await (await js.fetch(url)).arrayBuffer()).to_bytes()
    path = "/tmp/%s.onnx" % key
    with open(path, "wb") as f:
        f.write(data)
    del data
    backend = current_backend()
    backend.synchronize()
    before = backend.heap.in_use
    model = load(path, backend=backend)
    backend.synchronize()
    held = backend.heap.in_use - before
    inputs = [cn.tensor(f["values"], backend=backend, dtype=cn.float32 if f["type"] == "float32" else cn.int32)
              .reshape(*f["shape"]) for f in feeds]
    forward = cn.capture(model)
    for _ in range(3):   # call 1 runs, calls 2 and 3 record: every later call replays
        await read_async(_first(forward(*inputs)))
    TAB[key] = (forward, inputs)
    gc.collect()
    gc.freeze()
    return held


async def tab_run(key):
    forward, inputs = TAB[key]
    started = time.perf_counter()
    await read_async(_first(forward(*inputs)))
    return (time.perf_counter() - started) * 1e3


async def tab_output(key):
    forward, inputs = TAB[key]
    return json.dumps(list(await read_async(_first(forward(*inputs)))))
"""
TAB_JS = """async (code) => {
    const py = window.cindersOnnx.runtime.pyodide;
    await py.runPythonAsync(code);
    const [load, run, output] = ["tab_load", "tab_run", "tab_output"].map((name) => py.globals.get(name));
    window.tabBench = { load: (key, url, feeds) => load(key, url, py.toPy(feeds)), run,
                        output: async (key) => JSON.parse(await output(key)) };
}"""


def tab_feeds(feeds):
    """The inputs as both pages take them: [{name, type, shape, values}]; ORT Web gets int64, the
    Cinders page int32 tensors of the same values (as cinders.onnx.web makes of typed inputs)."""
    return [{"name": k, "type": "float32" if v.dtype == np.float32 else "int64", "shape": list(v.shape),
             "values": v.ravel().tolist()} for k, v in feeds.items()]


def tab_main(models, variants, repeat, small):
    """Each model's variants on cn.Wasm() in the /onnx/ page and on ORT Web's WASM EP
    (benchmarks/web/ort_models.html), both single-threaded in one headless Chromium, timed in
    turns: one call of each (model file, page) per round."""
    from playwright.sync_api import sync_playwright
    import browser as pages   # benchmarks/browser.py: Chromium, its flags, opening a page cold
    from cinders.web.server import DemoServer, default_mounts, ensure_setup
    ensure_setup()
    files = {}
    for name in models:
        src, feeds = float_model(name, small)
        for variant in variants:
            files[name, variant] = quantized_file(src, variant, feeds), feeds
    folders = sorted({os.path.dirname(path) for path, _ in files.values()})
    mounts = [("/bench-files/%d/" % i, folder) for i, folder in enumerate(folders)]
    mounts += [("/bench/", os.path.join(HERE, "web"))] + default_mounts()

    def url(path):
        return "/bench-files/%d/%s" % (folders.index(os.path.dirname(path)), os.path.basename(path))
    with DemoServer(port=0, mounts=mounts) as server, sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=pages.CHROMIUM, headless=True, args=pages.QUIET_FLAGS)
        print(json.dumps({"bench": "quantized", "kind": "environment", "chromium": chromium.version,
                          "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
                          "threads": "one (cn.Wasm() has one; ORT Web's numThreads = 1)"}), flush=True)
        for name in models:
            ours_context, ours = pages.open_cold(chromium, server.url + "onnx/?backend=wasm")
            theirs_context, theirs = pages.open_cold(chromium, server.url + "bench/ort_models.html?ep=wasm")
            ours.evaluate(TAB_JS, TAB_PYTHON)
            rows, runs, outputs = {}, {}, {}
            for variant in variants:
                path, feeds = files[name, variant]
                for stack, page, api in (("ort-web-wasm", theirs, "ortModels"), ("tab-wasm", ours, "tabBench")):
                    try:
                        held = page.evaluate("([k, u, f]) => window.%s.load(k, u, f)" % api,
                                             [variant, url(path), tab_feeds(feeds)])
                    except Exception as e:  # noqa: BLE001  (a graph a page refuses: say so, go on)
                        print(json.dumps({"bench": "quantized", "model": name, "variant": variant, "stack": stack,
                                          "error": str(e).strip().splitlines()[-1][:300]}), flush=True)
                        continue
                    rows[variant, stack] = dict(bench="quantized", model=name, variant=variant, stack=stack,
                                                file_bytes=os.path.getsize(path), memory_bytes=held,
                                                device="chromium-" + stack)
                    runs[variant, stack] = lambda page=page, api=api, key=variant: page.evaluate(
                        "(k) => window.%s.run(k)" % api, key)
                    outputs[variant, stack] = lambda page=page, api=api, key=variant: np.asarray(json.loads(
                        page.evaluate("async (k) => JSON.stringify(await window.%s.output(k))" % api, key)))
            ms = interleaved_median_ms(runs, repeat, self_timed=True)
            outputs = {key: output() for key, output in outputs.items()}
            for (variant, stack), row in rows.items():   # who strays from the graph as written
                row["max_abs_diff_ort_as_written"] = float(np.abs(
                    outputs[variant, stack] - ort_as_written(*files[name, variant]).ravel()).max())
            print_rows(rows, ms, outputs, "ort-web-wasm", TAB_STACKS)
            ours_context.close()
            theirs_context.close()
        print(json.dumps({"bench": "quantized", "kind": "environment", "load_avg_1m_after": os.getloadavg()[0]}),
              flush=True)
        chromium.close()


def wasm_kernel_profile(path, feeds, wasm_engine, repeat):
    """({kernel: [ms per call, launches per call]}, device) of the model at path on cn.Wasm(),
    each kernel queued and run on its own (see the module's docstring)."""
    import collections
    import time

    from cinders.wasm.backend import Commands
    ms, launches, timing = collections.Counter(), collections.Counter(), [False]
    queue = Commands.add

    def timed(commands, name, *args):
        if not timing[0]:
            return queue(commands, name, *args)
        commands.flush()
        start = time.perf_counter()
        queue(commands, name, *args)
        commands.flush()
        ms[name] += (time.perf_counter() - start) * 1000 / repeat
        launches[name] += 1
    Commands.add = timed   # (before the backend is made: it binds commands.add)
    try:
        row, run = cinders_runner("wasm", path, feeds, wasm_engine)
        run()
        timing[0] = True
        for _ in range(repeat):
            run()
    finally:
        Commands.add = queue
    return {name: [round(t, 3), launches[name] // repeat] for name, t in ms.most_common()}, row["device"]


def wgpu_kernel_profile(path, feeds, repeat):
    """({kernel: [GPU ms per call, launches per call]}, device) of the model at path on cn.Wgpu(),
    from cn.profile's kernel timestamps."""
    import collections
    torch_cuda_context()
    backend = cn.Wgpu()
    row, run = cinders_runner("wgpu", path, feeds, backend=backend)
    run()
    ms, launches = collections.Counter(), collections.Counter()
    for _ in range(repeat):
        with cn.profile(backend) as p:
            run()
        for event in p.events:
            if event["kind"] == "kernel":
                ms[event["name"]] += (event.get("gpu_time") or 0.0) * 1000 / repeat
                launches[event["name"]] += 1
    return {name: [round(t, 3), launches[name] // repeat] for name, t in ms.most_common()}, row["device"]


def profile_main(models, variants, repeat, small, wasm_engine, gpu):
    for name in models:
        src, feeds = float_model(name, small)
        for variant in variants:
            path = quantized_file(src, variant, feeds)
            kernels, device = wgpu_kernel_profile(path, feeds, repeat) if gpu else \
                wasm_kernel_profile(path, feeds, wasm_engine, repeat)
            print(json.dumps({"bench": "quantized_profile", "model": name, "variant": variant, "device": device,
                              "launches": sum(n for _, n in kernels.values()),
                              "ms": round(sum(t for t, _ in kernels.values()), 3), "kernels": kernels}), flush=True)


def ort_as_written(path, feeds):
    """onnxruntime's CPU output with graph optimizations off: the graph as written, the tests'
    oracle for full-range int8 files (tests/test_onnx_quant.py). On x86 without AVX-VNNI its
    ConvInteger still sums pairs in saturating int16 (docs/onnx.md, "Quantized models")."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="numpy,wasm,wgpu,ort",
                        help="comma-separated stacks among %s (onnxruntime runs as the reference "
                             "of max_abs_diff whatever is chosen)" % ", ".join(STACKS))
    parser.add_argument("--models", default="resnet18,bert")
    parser.add_argument("--variants", help="default: all (%s); with --tab f32,q8_dynamic" % ",".join(VARIANTS))
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--small", action="store_true", help="64x64 images, a 2-layer d=32 BERT")
    parser.add_argument("--tab", action="store_true",
                        help="cn.Wasm() in headless Chromium's /onnx/ page against ORT Web's WASM EP "
                             "(instead of the desktop stacks of --backend)")
    parser.add_argument("--profile", action="store_true",
                        help="cn.Wasm()'s time per kernel instead of the stacks' comparison "
                             "(cn.Wgpu()'s GPU time with --backend wgpu)")
    parser.add_argument("--capture", action="store_true",
                        help="time cn.capture(model)'s replays (no Python per kernel) instead of eager calls")
    parser.add_argument("--wasm-engine", default=None,
                        help="cn.Wasm()'s engine: native, wasmtime or node (default: the desktop's, native)")
    args = parser.parse_args()
    stacks = [s for s in args.backend.split(",") if s]
    variants = (args.variants or ("f32,q8_dynamic" if args.tab else ",".join(VARIANTS))).split(",")
    unknown = [s for s in stacks if s not in STACKS] + [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error("unknown stacks or variants: %s" % ", ".join(unknown))
    if args.profile:
        return profile_main(args.models.split(","), variants, args.repeat, args.small, args.wasm_engine,
                            stacks == ["wgpu"])
    if args.tab:
        return tab_main(args.models.split(","), variants, args.repeat, args.small)
    for name in args.models.split(","):
        src, feeds = float_model(name, args.small)
        rows, runs = {}, {}   # (variant, stack) -> its row so far, its run()
        for variant in variants:
            path = quantized_file(src, variant, feeds)
            for stack in ["ort"] + [s for s in stacks if s != "ort"]:   # onnxruntime: the reference
                try:
                    row, run = ort_runner(path, feeds) if stack == "ort" else \
                        cinders_runner(stack, path, feeds, args.wasm_engine, capture=args.capture)
                except cn.CindersError as e:   # a graph this stack refuses: say so, go on
                    print(json.dumps({"bench": "quantized", "model": name, "variant": variant,
                                      "stack": stack, "error": str(e)[:300]}), flush=True)
                    continue
                rows[variant, stack] = dict(bench="quantized", model=name, variant=variant, stack=stack,
                                            file_bytes=os.path.getsize(path), **row)
                runs[variant, stack] = run
        torch_cuda_context()   # (the exports imported torch: see timing.py)
        ms = interleaved_median_ms(runs, args.repeat)
        outputs = {key: np.asarray(run(), np.float64) for key, run in runs.items()}
        print_rows(rows, ms, outputs, "ort", stacks)
        del rows, runs, outputs


def print_rows(rows, ms, outputs, reference, shown):
    """Print the rows of the `shown` stacks with their times and ratios (the module's docstring):
    ort_ratio and max_abs_diff to the `reference` stack on the same file; file, time and memory
    ratios to f32 on the same stack."""
    for (variant, stack), row in rows.items():
        if stack not in shown:
            continue
        row["ms"] = ms[variant, stack]
        if (variant, reference) in outputs:
            row["max_abs_diff"] = float(np.abs(outputs[variant, stack] - outputs[variant, reference]).max())
            row["ort_ratio"] = round(ms[variant, stack] / ms[variant, reference], 4)
        first = rows.get(("f32", stack))
        if first:
            row["file_ratio"] = round(row["file_bytes"] / first["file_bytes"], 4)
            row["time_ratio"] = round(ms[variant, stack] / ms["f32", stack], 4)
            if row["memory_bytes"] and first["memory_bytes"]:
                row["memory_ratio"] = round(row["memory_bytes"] / first["memory_bytes"], 4)
        print(json.dumps(dict(row, ms=round(row["ms"], 3))), flush=True)


if __name__ == "__main__":
    main()
