"""MNIST CNN inference latency on cn.Wgpu() against PyTorch (CUDA when present), side by side.

The same weights in both (copied from the cinders model into an identical torch.nn.Sequential);
latency is one forward pass plus reading the logits back to the host, median of --repeat runs.
One JSON line per (stack, batch size):
    {"bench": "mnist_cnn", "stack", "batch", "cinders_ms", "captured_ms", "torch_ms", "ratio",
     "captured_ratio", "max_abs_diff", "dispatches_per_forward", ...}
cinders_ms runs the model as it is; captured_ms the same model through cn.capture (replays),
timed against torch call by call in turns (timing.interleaved_median_ms).
Stacks: cn.Wgpu(), and with --fusion also cn.Fusion(cn.Wgpu()).

    python benchmarks/gpu_mnist.py             # batch 1 and 256 (a real GPU)
    python benchmarks/gpu_mnist.py --small     # fewer repeats: runs on lavapipe
"""

import argparse
import json

import numpy as np

import cinders as cn
from cinders.models.mnist import MnistCNN
from timing import interleaved_median_ms, median_ms



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
    parser.add_argument("--fusion", action="store_true", help="also cn.Fusion(cn.Wgpu())")
    args = parser.parse_args()
    repeat = 3 if args.small else args.repeat
    gpu = cn.Wgpu()
    cn.manual_seed(0)
    weights = MnistCNN().to(gpu).eval()
    try:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        net = torch_model(weights).to(device)
    except ImportError:
        torch, device, net = None, "none", None
    rng = np.random.default_rng(0)
    for stack in ("wgpu", "wgpu+fusion") if args.fusion else ("wgpu",):
        backend = cn.Fusion(gpu) if stack == "wgpu+fusion" else gpu
        model = MnistCNN().to(backend).eval()
        model.load_state_dict(weights.state_dict())
        for batch in args.batches:
            x_np = rng.random((batch, 1, 28, 28), dtype=np.float32)
            x = cn.tensor(x_np, backend=backend)

            def run_cinders():
                return model(x).numpy()

            fast = cn.capture(model)
            ours = median_ms(run_cinders, repeat)
            fast(x), fast(x)  # the first three calls run the model (the timing warms up more)
            theirs = diff = ratio = None
            if net is not None:
                xt = torch.from_numpy(x_np).to(device)

                def run_torch():
                    with torch.no_grad():
                        return net(xt).cpu().numpy()

                times = interleaved_median_ms({"ours": lambda: fast(x).numpy(), "theirs": run_torch}, repeat)
                captured, theirs = times["ours"], times["theirs"]
                ratio = captured / theirs
                diff = float(np.max(np.abs(run_cinders() - run_torch())))
            else:
                captured = median_ms(lambda: fast(x).numpy(), repeat)
            with cn.profile(backend) as prof:
                run_cinders()
            print(json.dumps({
                "bench": "mnist_cnn", "stack": stack, "batch": batch, "cinders_ms": round(ours, 4),
                "captured_ms": round(captured, 4), "torch_ms": round(theirs, 4) if theirs else None,
                "ratio": round(ours / theirs, 4) if theirs else None,
                "captured_ratio": round(ratio, 4) if ratio else None,
                "max_abs_diff": diff, "dispatches_per_forward": prof.kernel_launches,
                "device": gpu.device.name, "torch_device": device}),
                flush=True)


if __name__ == "__main__":
    main()
