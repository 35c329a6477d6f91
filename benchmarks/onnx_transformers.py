"""Transformers from `transformers` configs (random weights, no downloads), exported to ONNX by
torch.onnx.export and imported by cinders.onnx, side by side in one run with PyTorch on the same
device and with onnxruntime on the CPU.

One JSON line per (model, batch, stack):
    {"bench": "transformers", "model", "batch", "seq", "stack", "cinders_ms", "reference",
     "reference_ms", "ratio", "replays", "device_reads", "max_abs_diff", "device"}
Models (issue 22's): "bert" (4 layers, d 256, 4 heads, ff 1024, seq 128) and "gpt2" (4 layers,
d 256, 4 heads, seq 64, logits). Stacks:
    wgpu      cn.Wgpu() under cn.capture (call + reading the result back), against torch on the
              GPU (TF32 off, cuDNN included) with a synchronisation after each call
    numpy     cn.NumPy() against onnxruntime's CPU provider with one thread (--cpu)
Medians of --repeat calls after warm-up (capture's first three calls included in the warm-up).

    python benchmarks/onnx_transformers.py               # a real GPU (and torch with CUDA)
    python benchmarks/onnx_transformers.py --cpu         # cn.NumPy() vs onnxruntime, 1 thread
    python benchmarks/onnx_transformers.py --small       # tiny shapes: lavapipe, a smoke run
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

# benchmarks/onnx.py would shadow the onnx package that torch's exporter imports
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import numpy as np  # noqa: E402

import cinders as cn  # noqa: E402
from cinders.onnx import load  # noqa: E402

CONFIGS = {"bert": dict(layers=4, d=256, heads=4, ff=1024, seq=128),
           "gpt2": dict(layers=4, d=256, heads=4, ff=1024, seq=64)}
SMALL = dict(layers=2, d=32, heads=4, ff=64, seq=16)


def build(name, c):
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import onnx_models
    onnx_models._torchvision_models()   # transformers imports torchvision when present: its stub
    import transformers as tf
    torch.manual_seed(0)
    if name == "bert":
        inner = tf.BertModel(tf.BertConfig(vocab_size=1000, hidden_size=c["d"], num_hidden_layers=c["layers"],
                                           num_attention_heads=c["heads"], intermediate_size=c["ff"],
                                           max_position_embeddings=512))
        call = lambda m, x: m(input_ids=x).last_hidden_state  # noqa: E731
    else:
        inner = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=1000, n_embd=c["d"], n_layer=c["layers"],
                                                 n_head=c["heads"], n_inner=c["ff"], n_positions=512,
                                                 bos_token_id=0, eos_token_id=0, use_cache=False))
        call = lambda m, x: m(input_ids=x, attention_mask=torch.ones_like(x)).logits  # noqa: E731

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return call(self.inner, x)
    return Wrapper().eval()


def export(model, seq, path):
    import torch
    ids = torch.randint(0, 1000, (2, seq))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), path, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch", 1: "seq"}}, opset_version=17)


def median_ms(run, repeat, warm=4):
    for _ in range(warm):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def gpu_rows(name, c, path, torch_model, batches, repeat):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = cn.Wgpu()
    model = load(path, backend=backend)
    forward = cn.capture(model)
    reference = torch_model.to(device)
    for batch in batches:
        ids = np.random.default_rng(batch).integers(0, 1000, (batch, c["seq"])).astype(np.int64)
        x = cn.tensor(ids.astype(np.int32), backend=backend, dtype=cn.int32)
        tx = torch.tensor(ids, device=device)

        def ours():
            return forward(x).numpy()

        def theirs():
            with torch.no_grad():
                out = reference(tx)
            if device == "cuda":
                torch.cuda.synchronize()
            return out
        ms = median_ms(ours, repeat)
        with cn.profile(backend) as p:   # the forward alone: its device reads (0 expected)
            out = forward(x)
        got = out.numpy()
        ref_ms = median_ms(theirs, repeat)
        want = theirs().float().cpu().numpy()
        yield {"bench": "transformers", "model": name, "batch": batch, "seq": c["seq"], "stack": "wgpu",
               "cinders_ms": round(ms, 3), "reference": "torch-%s" % device, "reference_ms": round(ref_ms, 3),
               "ratio": round(ms / ref_ms, 3), "replays": forward.replays, "device_reads": p.device_reads,
               "max_abs_diff": float(np.abs(got - want).max()), "device": backend.device.name}


def cpu_rows(name, c, path, batches, repeat):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    backend = cn.NumPy()
    model = load(path, backend=backend)
    for batch in batches:
        ids = np.random.default_rng(batch).integers(0, 1000, (batch, c["seq"])).astype(np.int64)
        x = cn.tensor(ids.astype(np.int32), backend=backend, dtype=cn.int32)
        ms = median_ms(lambda: model(x).numpy(), repeat)
        ref_ms = median_ms(lambda: session.run(None, {"x": ids}), repeat)
        diff = float(np.abs(model(x).numpy() - session.run(None, {"x": ids})[0]).max())
        yield {"bench": "transformers", "model": name, "batch": batch, "seq": c["seq"], "stack": "numpy",
               "cinders_ms": round(ms, 3), "reference": "onnxruntime-cpu-1-thread", "reference_ms": round(ref_ms, 3),
               "ratio": round(ms / ref_ms, 3), "replays": None, "device_reads": None, "max_abs_diff": diff,
               "device": "cpu"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="cn.NumPy() vs onnxruntime (1 thread)")
    parser.add_argument("--small", action="store_true", help="tiny shapes (lavapipe smoke run)")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 16])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--models", nargs="*", default=sorted(CONFIGS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            c = SMALL if args.small else CONFIGS[name]
            model = build(name, c)
            path = os.path.join(folder, name + ".onnx")
            export(model, c["seq"], path)
            rows = cpu_rows(name, c, path, args.batches, args.repeat) if args.cpu else \
                gpu_rows(name, c, path, model, args.batches, args.repeat)
            for row in rows:
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
