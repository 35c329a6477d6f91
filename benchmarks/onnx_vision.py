"""ONNX import benchmarks (JSON lines, measured side by side in one run).

    python benchmarks/onnx_vision.py                 # import time of resnet18; resnet18 batch 1 on
                                              # cn.NumPy() vs onnxruntime CPU, both 1 thread
    python benchmarks/onnx_vision.py --gpu           # resnet50 batch 32 on cn.Wgpu() vs torch CUDA eager fp32,
                                              # uncaptured and captured, and its GPU time by kernel
    python benchmarks/onnx_vision.py --gpu --fusion  # the same on cn.Fusion(cn.Wgpu())

Models are torchvision architectures with seeded random weights at 224x224, exported by the
TorchScript exporter and cached in .cache/onnx (tests/onnx_models.py).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # tests/onnx_models.py: the cached exports
from timing import kernel_table  # noqa: E402  (benchmarks/, this script's folder)


def emit(**row):
    print(json.dumps(row), flush=True)


def best_of(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), sorted(times)[len(times) // 2]


def cpu(repeat):
    import numpy as np
    import onnxruntime as ort
    import cinders as cn
    import cinders.onnx as co
    import onnx_models
    path = onnx_models.export("resnet18", "torchscript", size=224)
    data = open(path, "rb").read()
    imports = []
    for _ in range(3):
        t = time.perf_counter()
        model = co.load(data, backend=cn.NumPy())
        imports.append(time.perf_counter() - t)
    t = time.perf_counter()
    source = co.to_source(data)
    codegen = time.perf_counter() - t
    emit(bench="onnx_import", model="resnet18", seconds=min(imports), read_and_generate_seconds=codegen,
         nodes=source.count("  # "), bytes=len(data), goal_seconds=2.0)
    x = np.random.RandomState(0).randn(1, 3, 224, 224).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    xt = cn.tensor(x, backend=cn.NumPy())
    ours = best_of(lambda: model(xt).numpy(), repeat)
    theirs = best_of(lambda: session.run(None, {name: x}), repeat)
    diff = float(np.abs(model(xt).numpy() - session.run(None, {name: x})[0]).max())
    emit(bench="onnx_resnet18_b1_cpu", cinders_numpy_ms=ours[0] * 1e3, onnxruntime_ms=theirs[0] * 1e3,
         ratio=ours[0] / theirs[0], cinders_median_ms=ours[1] * 1e3, onnxruntime_median_ms=theirs[1] * 1e3,
         max_abs_diff=diff, threads=1, goal_ratio=3.0)
    profile_numpy(model, xt)


def profile_numpy(model, xt):
    """Where the time goes: time per op function over one forward pass."""
    import collections
    from cinders.onnx import ops
    spent = collections.Counter()
    originals = {}
    for name, fn in list(vars(ops).items()):
        if ("", name) in ops.REGISTRY:
            originals[name] = fn

            def timed(*args, _fn=fn, _name=name, **kwargs):
                t = time.perf_counter()
                out = _fn(*args, **kwargs)
                spent[_name] += time.perf_counter() - t
                return out
            setattr(ops, name, timed)
    try:
        t = time.perf_counter()
        model(xt).numpy()
        total = time.perf_counter() - t
    finally:
        for name, fn in originals.items():
            setattr(ops, name, fn)
    emit(bench="onnx_resnet18_b1_profile", total_ms=total * 1e3,
         op_ms={k: round(v * 1e3, 2) for k, v in spent.most_common(8)},
         inline_and_other_ms=round((total - sum(spent.values())) * 1e3, 2))


def gpu(repeat, batch, name="resnet50", size=224, device="cuda", fusion=False):
    import numpy as np
    import torch
    import cinders as cn
    import cinders.onnx as co
    import onnx_models
    t = time.perf_counter()
    path = onnx_models.export(name, "torchscript", size=size)
    export_s = time.perf_counter() - t
    backend = cn.Fusion(cn.Wgpu()) if fusion else cn.Wgpu()
    t = time.perf_counter()
    model = co.load(path, backend=backend)
    import_s = time.perf_counter() - t
    x = np.random.RandomState(0).randn(batch, 3, size, size).astype(np.float32)
    xt = cn.tensor(x, backend=backend)

    def ours():
        model(xt).numpy()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    reference = onnx_models.build(name, size)[0].to(device)
    xc = torch.from_numpy(x).to(device)

    def theirs():
        with torch.no_grad():
            reference(xc).cpu()
    t = time.perf_counter()
    ours()                      # first call: pipelines compile, matmul kernels autotune
    first_s = time.perf_counter() - t
    a, b = best_of(ours, repeat), best_of(theirs, repeat)
    with torch.no_grad():
        diff = float(np.abs(model(xt).numpy() - reference(xc).cpu().numpy()).max())
    emit(bench="onnx_%s_gpu" % name, backend=repr(backend), batch=batch, size=size, cinders_wgpu_ms=a[0] * 1e3, torch_ms=b[0] * 1e3,
         ratio=a[0] / b[0], cinders_median_ms=a[1] * 1e3, torch_median_ms=b[1] * 1e3, max_abs_diff=diff,
         torch_device=device, adapter=str((backend.inner or backend).device_key()), export_s=export_s, import_s=import_s,
         first_run_s=first_s, goal_ratio=2.0)
    captured_model = cn.capture(model)

    def ours_captured():
        captured_model(xt).numpy()
    for _ in range(3):          # the capture records on its first calls
        ours_captured()
    c, b = best_of(ours_captured, repeat), best_of(theirs, repeat)
    emit(bench="onnx_%s_gpu_captured" % name, backend=repr(backend), batch=batch, size=size,
         captured_ms=c[0] * 1e3, torch_ms=b[0] * 1e3, ratio=c[0] / b[0], captured_median_ms=c[1] * 1e3,
         torch_median_ms=b[1] * 1e3, torch_device=device, goal_ratio=1.3)
    with cn.profile(backend) as p:
        ours()
    gpu_ms, kernels = kernel_table(p)
    emit(bench="onnx_%s_gpu_profile" % name, kernel_launches=p.kernel_launches,
         per_launch_us=a[0] * 1e6 / max(1, p.kernel_launches), kernel_gpu_ms=gpu_ms, kernels=kernels)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--model", default="resnet50", help="--gpu: torchvision architecture (default resnet50)")
    p.add_argument("--size", type=int, default=224, help="--gpu: image size (default 224)")
    p.add_argument("--device", default="cuda", help="--gpu: torch device of the reference (default cuda)")
    p.add_argument("--fusion", action="store_true", help="--gpu: run on cn.Fusion(cn.Wgpu())")
    args = p.parse_args(argv)
    if args.gpu:
        gpu(args.repeat, args.batch, args.model, args.size, args.device, args.fusion)
    else:
        cpu(args.repeat)


if __name__ == "__main__":
    main()
