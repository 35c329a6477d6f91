"""Quantized models against their float32 originals (issue 28, item 7), side by side in one run.

Files: resnet18 (torchvision, random weights) and a BERT-style encoder (`transformers` config,
random weights; benchmarks/onnx_transformers.py builds and exports it), each as
    f32          the exported float model
    q8_dynamic   onnxruntime quantize_dynamic, int8 weights (DynamicQuantizeLinear + MatMulInteger
                 / ConvInteger)
    q8_qdq       onnxruntime quantize_static in QDQ form (int8, random calibration batches)
    q4           onnxruntime MatMul4BitsQuantizer (MatMulNBits, 4-bit blocks of 32)
    cinders_q8   `cinders quantize --mode q8` (DynamicQuantizeMatMul, int8 per-column weights)
    cinders_q4   `cinders quantize --mode q4` (MatMulNBits, block 32)
all written offline into .cache/quantized/. Stacks: cn.NumPy(), cn.Wasm() (the desktop engine:
wasmtime in process), cn.Wgpu(), and onnxruntime's CPU provider (1 thread).

One JSON line per (model, variant, stack):
    {"bench": "quantized", "model", "variant", "stack", "file_bytes", "file_ratio" (to f32),
     "memory_bytes" (what the loaded model holds: Wgpu memory_stats allocated bytes, NumPy
     tracemalloc, Wasm heap bytes in use; onnxruntime: null), "memory_ratio" (to f32 on the same stack),
     "ms" (median of --repeat calls after warm-up), "time_ratio" (to f32 on the same stack),
     "ort_ratio" (to onnxruntime on the same file), "max_abs_diff" (to onnxruntime on the same
     file), "device"}
Every model's files are loaded on every stack first and then timed in turns, one call of each
per round (timing.interleaved_median_ms), so the ratios hold on a loaded machine.

    python benchmarks/quantized.py --backend wgpu           # the lent GPU (with onnxruntime CPU)
    python benchmarks/quantized.py --small                  # lavapipe / 2 cores: small shapes
    python benchmarks/quantized.py --backend numpy,wasm,wgpu,ort --models bert
    python benchmarks/quantized.py --backend wasm,ort --variants f32,q8_dynamic,cinders_q8   # cn.Wasm() q8
    python benchmarks/quantized.py --backend wasm,ort --wasm-engine wasmtime   # the tab's .wasm module
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
from timing import interleaved_median_ms  # noqa: E402

import numpy as np  # noqa: E402

import cinders as cn  # noqa: E402
from cinders.onnx import load  # noqa: E402

CACHE = os.path.join(ROOT, ".cache", "quantized")
VARIANTS = ("f32", "q8_dynamic", "q8_qdq", "q4", "cinders_q8", "cinders_q4")
STACKS = ("numpy", "wasm", "wgpu", "ort")


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
            elif variant == "q4":
                from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
                q = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=False)
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
    return cn.Wgpu()


def _memory(stack, backend):
    """Bytes the backend holds now (see the module's docstring)."""
    if stack == "wgpu":
        backend.synchronize()
        return backend.memory_stats()["allocated_bytes"]
    if stack == "wasm":
        backend.synchronize()
        return backend.heap.in_use
    return tracemalloc.get_traced_memory()[0]


def cinders_runner(stack, path, feeds, wasm_engine=None):
    """({memory_bytes, device}, run) of the model at path loaded on `stack`; run() -> output."""
    backend = _backend(stack, wasm_engine)
    if stack == "wgpu":
        backend.synchronize()
        backend.empty_cache()
    tracemalloc.start()
    before = _memory(stack, backend)
    model = load(path, backend=backend)
    held = _memory(stack, backend) - before
    tracemalloc.stop()
    inputs = [cn.tensor(v.astype(np.int32) if v.dtype == np.int64 else v, backend=backend)
              for v in feeds.values()]

    def run():
        out = model(*inputs)
        return (out[0] if isinstance(out, (tuple, list)) else out).numpy()
    device = backend.device.name if stack == "wgpu" else stack
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="numpy,wasm,wgpu,ort",
                        help="comma-separated stacks among %s (onnxruntime runs as the reference "
                             "of max_abs_diff whatever is chosen)" % ", ".join(STACKS))
    parser.add_argument("--models", default="resnet18,bert")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--small", action="store_true", help="64x64 images, a 2-layer d=32 BERT")
    parser.add_argument("--wasm-engine", default=None,
                        help="cn.Wasm()'s engine: native, wasmtime or node (default: the desktop's, native)")
    args = parser.parse_args()
    stacks = [s for s in args.backend.split(",") if s]
    unknown = [s for s in stacks if s not in STACKS] + [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        parser.error("unknown stacks or variants: %s" % ", ".join(unknown))
    for name in args.models.split(","):
        src, feeds = float_model(name, args.small)
        rows, runs = {}, {}   # (variant, stack) -> its row so far, its run()
        for variant in args.variants.split(","):
            path = quantized_file(src, variant, feeds)
            for stack in ["ort"] + [s for s in stacks if s != "ort"]:   # onnxruntime: the reference
                try:
                    row, run = ort_runner(path, feeds) if stack == "ort" else cinders_runner(stack, path, feeds, args.wasm_engine)
                except cn.CindersError as e:   # a graph this stack refuses: say so, go on
                    print(json.dumps({"bench": "quantized", "model": name, "variant": variant,
                                      "stack": stack, "error": str(e)[:300]}), flush=True)
                    continue
                rows[variant, stack] = dict(bench="quantized", model=name, variant=variant, stack=stack,
                                            file_bytes=os.path.getsize(path), **row)
                runs[variant, stack] = run
        ms = interleaved_median_ms(runs, args.repeat)
        for (variant, stack), row in rows.items():
            if stack == "ort" and "ort" not in stacks:
                continue
            reference = runs[variant, "ort"]()
            row["ms"] = ms[variant, stack]
            row["max_abs_diff"] = float(np.abs(np.asarray(runs[variant, stack](), np.float64) - reference).max())
            row["ort_ratio"] = round(ms[variant, stack] / ms[variant, "ort"], 4)   # to onnxruntime, same file
            first = rows.get(("f32", stack))
            if first:
                row["file_ratio"] = round(row["file_bytes"] / first["file_bytes"], 4)
                row["time_ratio"] = round(ms[variant, stack] / ms["f32", stack], 4)
                if row["memory_bytes"] and first["memory_bytes"]:
                    row["memory_ratio"] = round(row["memory_bytes"] / first["memory_bytes"], 4)
            print(json.dumps(dict(row, ms=round(row["ms"], 3))), flush=True)
        del rows, runs


if __name__ == "__main__":
    main()
