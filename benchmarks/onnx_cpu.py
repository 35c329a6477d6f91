"""The desktop CPU against onnxruntime (one thread each), side by side in one run (JSON lines).

Models: the ONNX models of the test suite (tests/onnx_models.py: torchvision architectures with
random weights at 64x64, a transformer encoder, LSTM, GRU, a 1-D conv net; TorchScript exports,
batch 1) and the apps' shipped models (Silero VAD per 32 ms chunk with its state; PP-OCR's
detector on a 480x640 image, its recogniser on a 48x320 line, its angle classifier on 48x192).
Each model runs on every CPU configuration asked for:

    numpy         cn.NumPy(), op by op
    wasm          cn.Wasm(engine="wasmtime"): the tab's .wasm module in-process, forward captured
                  (one call per run)
    native        cn.Wasm(engine="native"): the same kernels compiled for this CPU (cn.Wasm()'s
                  desktop default), forward captured

One line per (model, configuration):
    {"bench": "onnx_cpu", "model", "backend", "cinders_ms", "onnxruntime_ms", "ratio", "max_abs_diff"}
and one summary line per configuration: {"bench": "onnx_cpu_geomean", "backend", "ratio", "models", "load"}
(the 1-minute load average at the end).
Times are medians over rounds in which the two alternate (the same machine load for both); the
ratio is the median of the per-round ratios.

    OPENBLAS_NUM_THREADS=1 python benchmarks/onnx_cpu.py [--backends numpy,wasm,native] [--rounds 15]
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import cinders as cn  # noqa: E402
from cinders.onnx import load  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import onnx_models  # noqa: E402  (tests/onnx_models.py: the cached exports)


def suite_models():
    for name in onnx_models.VISION + onnx_models.SEQUENCE:
        path = onnx_models.export(name)
        yield name, path, dict(zip(input_names(path), onnx_models.inputs_for(name, 1))), None


def shipped_models():
    from cinders.apps import shipped
    rng = np.random.default_rng(0)
    yield ("silero_vad", shipped.model_path("silero_vad.onnx"),
           {"input": rng.uniform(-0.3, 0.3, (1, 512)).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32)}, {"sr": 16000})
    for name, shape in (("PP-OCRv6_det_small", (1, 3, 480, 640)), ("PP-OCRv6_rec_small", (1, 3, 48, 320)),
                        ("ch_ppocr_mobile_v2.0_cls_mobile", (1, 3, 48, 192))):
        path = shipped.model_path(name + ".onnx")
        yield name, path, {input_names(path)[0]: rng.uniform(-1, 1, shape).astype(np.float32)}, None


def input_names(path):
    import onnxruntime as ort
    return [i.name for i in ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()]


def ort_session(path):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def block_seconds(fn, seconds=0.05):
    """Mean seconds per call over a block of calls lasting about `seconds`."""
    start, n = time.perf_counter(), 0
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / n


def make_backend(name):
    if name == "numpy":
        return cn.NumPy(), False
    if name in ("wasm", "native"):
        return cn.Wasm(engine="wasmtime" if name == "wasm" else "native"), True
    raise SystemExit("unknown backend %r (numpy, wasm, native)" % name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="numpy,wasm,native")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", help="comma-separated model names")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    ratios = {b: [] for b in args.backends.split(",")}
    for name, path, feeds, fixed in list(suite_models()) + list(shipped_models()):
        if only and name not in only:
            continue
        session = ort_session(path)
        ort_feeds = dict(feeds, **{k: np.array(v, dtype=np.int64) for k, v in (fixed or {}).items()})
        want = session.run(None, ort_feeds)
        for backend_name in ratios:
            backend, captured = make_backend(backend_name)
            model = load(path, backend=backend, fixed_inputs=fixed)
            forward = cn.capture(model) if captured else model
            args_in = [cn.tensor(v, backend=backend) for v in feeds.values()]

            def ours():
                out = forward(*args_in)
                return [t.numpy() for t in (out if isinstance(out, (tuple, list)) else (out,))]
            got = ours()
            ours(), ours()  # warm: kernels built, capture recorded
            diff = max(float(np.max(np.abs(g - w.astype(np.float32)))) if g.size else 0.0
                       for g, w in zip(got, want))
            ours_s, theirs_s, rounds = [], [], []
            for _ in range(args.rounds):
                a = block_seconds(ours)
                b = block_seconds(lambda: session.run(None, ort_feeds))
                ours_s.append(a)
                theirs_s.append(b)
                rounds.append(a / b)
            ratio = statistics.median(rounds)
            ratios[backend_name].append(ratio)
            print(json.dumps({"bench": "onnx_cpu", "model": name, "backend": backend_name,
                              "cinders_ms": round(statistics.median(ours_s) * 1e3, 4),
                              "onnxruntime_ms": round(statistics.median(theirs_s) * 1e3, 4),
                              "ratio": round(ratio, 3), "max_abs_diff": diff}), flush=True)
    for backend_name, values in ratios.items():
        if values:
            print(json.dumps({"bench": "onnx_cpu_geomean", "backend": backend_name, "models": len(values),
                              "ratio": round(math.exp(sum(map(math.log, values)) / len(values)), 3),
                              "load": round(os.getloadavg()[0], 2)}),
                  flush=True)


if __name__ == "__main__":
    main()
