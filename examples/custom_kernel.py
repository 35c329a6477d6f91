"""A user kernel: a custom activation written as one WGSL function, trained under Autodiff.

    python examples/custom_kernel.py

`cn.fusion.custom_op` turns a WGSL function into an elementwise op. On cn.Fusion(cn.Wgpu()) it
is pasted into the fused kernel of the ops around it (here the bias add and the scaling run in
the same launch); on cn.Wgpu() it is a kernel of its own; on CPU backends the `reference`
written with tensor ops runs instead. Under cn.Autodiff the given `backward` supplies the
gradient. The same code runs in the browser (Pyodide + WebGPU): kernels reach the GPU through
the same device interface there.
"""

import math

import cinders as cn
from cinders import nn
from cinders.nn import functional as F

# Swish-with-a-learned-shape would need two inputs; this one is x * sigmoid(beta * x), beta=1.7.
BETA = 1.7

swish = cn.fusion.custom_op(
    "swish_beta",
    wgsl="""
fn swish_beta(x: f32) -> f32 {
  return x / (1.0 + exp(-1.7 * x));
}""",
    # The same op with tensor ops, for backends without WGSL (NumPy, Python, MicroPython).
    reference=lambda x: x * cn.sigmoid(x * BETA),
    # d/dx [x s(bx)] = s(bx) + b x s(bx) (1 - s(bx)); y = x s(bx) is handed in, so reuse it.
    backward=lambda x, y, g: (g * (cn.sigmoid(x * BETA) * (1.0 + BETA * x) - BETA * y * cn.sigmoid(x * BETA)),),
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(2, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        return self.out(swish(self.hidden(x)) * 0.5)


def main():
    backend = cn.Autodiff(cn.Fusion(cn.Wgpu()))
    cn.manual_seed(0)
    model = Net().to(backend)
    opt = cn.optim.Adam(0.02)
    # Learn y = sin(x0) * cos(x1) on a grid.
    points = [(i / 8.0 - 1.0, j / 8.0 - 1.0) for i in range(17) for j in range(17)]
    x = cn.tensor([[a * math.pi, b * math.pi] for a, b in points], backend=backend)
    y = cn.tensor([[math.sin(a * math.pi) * math.cos(b * math.pi)] for a, b in points], backend=backend)
    first = None
    for step in range(200):
        loss = F.mse_loss(model(x), y)
        model = opt.step(model, loss.backward())
        if step % 50 == 0 or step == 199:
            value = loss.item()
            first = value if first is None else first
            print("step %3d  loss %.5f" % (step, value))
    model(x).numpy()  # computes the last pending parameter update, so the count below is the forward's
    with cn.profile(backend) as p:
        model(x).numpy()
    print("forward pass: %d kernel launches (%d compiled, %d from cache)"
          % (p.kernel_launches, p.cache_misses, p.cache_hits))
    assert value < first / 4, "the model did not learn"


if __name__ == "__main__":
    main()
