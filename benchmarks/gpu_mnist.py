"""MNIST CNN inference latency on cn.Wgpu() against PyTorch (CUDA when present), side by side.

The same weights in both (copied from the cinders model into an identical torch.nn.Sequential);
latency is one forward pass plus reading the logits back to the host, median of --repeat runs.
One JSON line per batch size:
    {"bench": "mnist_cnn", "batch", "cinders_ms", "captured_ms", "torch_ms", "ratio",
     "captured_ratio", "max_abs_diff", "dispatches_per_forward", ...}
cinders_ms runs the model as it is; captured_ms the same model through cn.capture (replays).

    python benchmarks/gpu_mnist.py             # batch 1 and 256 (a real GPU)
    python benchmarks/gpu_mnist.py --small     # fewer repeats: runs on lavapipe
    python benchmarks/gpu_mnist.py --fusion    # on cn.Fusion(cn.Wgpu())
"""

import argparse
import json

import numpy as np

import cinders as cn
from cinders.models.mnist import MnistCNN
from timing import median_ms



def torch_model(model):
    import torch
    from torch import nn
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    class Wrapper(nn.Module):  # the same parameter names as MnistCNN's ("layers.0.weight", ...)
        def __init__(self):
            super().__init__()
            self.layers = net

        def forward(self, x):
            return self.layers(x)

    wrapper = Wrapper()
    state = {k: torch.from_numpy(np.asarray(v.numpy(), dtype=np.float32))
             for k, v in model.state_dict().items()}
    wrapper.load_state_dict(state)
    return wrapper.eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="few repeats (lavapipe)")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 256])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--fusion", action="store_true", help="run on cn.Fusion(cn.Wgpu())")
    args = parser.parse_args()
    repeat = 3 if args.small else args.repeat
    gpu = cn.Wgpu()
    backend = cn.Fusion(gpu) if args.fusion else gpu
    model = MnistCNN().to(backend).eval()
    try:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        net = torch_model(model).to(device)
    except ImportError:
        torch, device, net = None, "none", None
    rng = np.random.default_rng(0)
    for batch in args.batches:
        x_np = rng.random((batch, 1, 28, 28), dtype=np.float32)
        x = cn.tensor(x_np, backend=backend)

        def run_cinders():
            return model(x).numpy()

        fast = cn.capture(model)
        ours = median_ms(run_cinders, repeat)
        fast(x), fast(x)  # the first three calls run the model (median_ms warms up twice more)
        captured = median_ms(lambda: fast(x).numpy(), repeat)
        theirs = diff = None
        if net is not None:
            xt = torch.from_numpy(x_np).to(device)

            def run_torch():
                with torch.no_grad():
                    return net(xt).cpu().numpy()

            theirs = median_ms(run_torch, repeat)
            diff = float(np.max(np.abs(run_cinders() - run_torch())))
        with cn.profile(backend) as prof:
            run_cinders()
        print(json.dumps({
            "bench": "mnist_cnn", "batch": batch, "cinders_ms": round(ours, 4),
            "captured_ms": round(captured, 4), "torch_ms": round(theirs, 4) if theirs else None,
            "ratio": round(ours / theirs, 4) if theirs else None,
            "captured_ratio": round(captured / theirs, 4) if theirs else None,
            "max_abs_diff": diff, "dispatches_per_forward": prof.kernel_launches,
            "backend": repr(backend), "device": gpu.device.name, "torch_device": device}),
            flush=True)


if __name__ == "__main__":
    main()
