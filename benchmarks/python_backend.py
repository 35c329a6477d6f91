"""What the pure-Python backend costs: the CPU fallback of the browser (Pyodide without WebGPU).

Prints one JSON line per case: the median milliseconds on cn.Python() and, when NumPy is
installed, on cn.NumPy() and their ratio. Runs unchanged inside Pyodide (no NumPy there). Protocol-level cases time the backend alone; the
model cases time a whole MNIST forward pass (batch 1) through the tensor layer.

    python benchmarks/python_backend.py [--repeat 5]
"""

import argparse
import json
import platform
import sys

import cinders as cn
from cinders import dtypes
from timing import median_ms



def mlp_forward(b):
    """x (1, 784) -> 784x128 -> relu -> 128x10, the MNIST MLP's arithmetic at protocol level;
    weights stored (out, in) and used as x @ w^T, like nn.Linear."""
    f32 = dtypes.float32
    x = b.random((1, 784), "uniform", 1, f32)
    w1, b1 = b.random((128, 784), "normal", 2, f32), b.random((1, 128), "normal", 3, f32)
    w2, b2 = b.random((10, 128), "normal", 4, f32), b.random((1, 10), "normal", 5, f32)
    zero = b.full((1, 1), 0.0, f32)

    def run():
        h = b.binary("add", b.matmul(x, b.permute(w1, (1, 0))), b1)
        h = b.binary("maximum", h, zero)
        return b.to_flat(b.binary("add", b.matmul(h, b.permute(w2, (1, 0))), b2))
    return run


def conv_layer(b, channels_in, channels_out, size):
    """One 3x3 padding-1 convolution as the tensor layer composes it: unfold2d + matmul."""
    f32 = dtypes.float32
    x = b.random((1, channels_in, size, size), "uniform", 6, f32)
    w = b.random((1, 1, channels_out, channels_in * 9), "normal", 7, f32)

    def run():
        cols = b.unfold2d(x, (3, 3), (1, 1), (1, 1), (1, 1), 0.0)
        cols = b.reshape(cols, (1, 1, channels_in * 9, size * size))
        return b.to_flat(b.matmul(w, cols))
    return run


def model_forward(backend, model_class):
    from cinders.models.mnist import MnistCNN, MnistMLP
    model = {"mlp": MnistMLP, "cnn": MnistCNN}[model_class]().to(backend)
    image = cn.random((1, 1, 28, 28), backend=backend, seed=8)
    return lambda: model(image).tolist()


CASES = [
    ("mlp_784x128x10_batch1", lambda b: mlp_forward(b)),
    ("conv3x3_1to16_28x28", lambda b: conv_layer(b, 1, 16, 28)),
    ("conv3x3_16to32_14x14", lambda b: conv_layer(b, 16, 32, 14)),
    ("model_mnist_mlp_forward_batch1", lambda b: model_forward(b, "mlp")),
    ("model_mnist_cnn_forward_batch1", lambda b: model_forward(b, "cnn")),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    backends = {"python": cn.Python()}
    try:
        backends["numpy"] = cn.NumPy()
    except ImportError:
        pass
    for name, make in CASES:
        # The interpreter matters: 3.12+ has math.sumprod, Pyodide reports sys.platform "emscripten".
        row = {"bench": name, "python": platform.python_version(), "platform": sys.platform}
        for backend_name, backend in backends.items():
            row[backend_name + "_ms"] = round(median_ms(make(backend), args.repeat, warm=1), 3)
        if "numpy_ms" in row:
            row["python_over_numpy"] = round(row["python_ms"] / row["numpy_ms"], 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
