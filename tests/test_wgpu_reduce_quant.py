"""cn.Wgpu's two-stage reductions and activation quantization (issue 28).

Few rows over a long axis (a whole tensor's min, a long sum) run the one rows generator in two
stages (codegen/program.py: partials per (row, chunk), then their reduction): the same answers
as cn.NumPy's on cn.Wgpu and cn.Fusion(cn.Wgpu()) for every op and dtype, sizes that are not
multiples of the workgroup or the chunk, one element, more than a million. DynamicQuantizeLinear
(three launches: both extrema in one two-stage pass, then y) and the QDQ round trip (one launch)
equal onnxruntime's bits.
"""

import numpy as np
import pytest

import cinders as cn
from cinders.onnx import load

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

BACKENDS = {"wgpu": lambda: cn.Wgpu(autotune=False),
            "fusion-wgpu": lambda: cn.Fusion(cn.Wgpu(autotune=False))}
# (shape, axis): whole tensors (axis None) of 1 element, not a multiple of 64 or of a chunk,
# over a million; a long axis with few rows; many short rows (one stage)
FRAMES = [((1,), None), ((1000,), None), ((70001,), None), ((3, 40000), 1), ((2, 5000, 3), 1),
          ((300, 70), 1)]
OPS = ["sum", "prod", "max", "min", "argmax", "argmin"]
DTYPES = ["float32", "int32", "bool"]


def _values(shape, dtype, op, rng):
    """Values whose reduction has one right answer in any order (float sums of small integers,
    products of powers of two), so that a chunk counted twice or missed cannot hide in a
    rounding tolerance; extrema of normal values."""
    if dtype == "bool":
        return rng.random(shape) < (0.999 if op in ("min", "argmin") else 0.001)
    if op == "prod":
        x = np.ones(shape, np.float32 if dtype == "float32" else np.int32)
        x.flat[rng.integers(0, x.size, 40)] = rng.choice([-1, 2] if dtype == "int32" else [-1.0, 0.5, 2.0], 40)
        return x
    if dtype == "int32":
        return rng.integers(-1000, 1000, shape).astype(np.int32)
    if op == "sum":
        return rng.integers(-8, 9, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def _reduce(t, op, axis):
    if t.dtype is cn.bool and op in ("sum", "prod"):
        t = t.cast(cn.int32)
    return getattr(t, op)() if axis is None else getattr(t, op)(axis)


@pytest.mark.parametrize("name", list(BACKENDS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: "%s-%s" % f)
def test_reductions_equal_numpy(name, frame, dtype):
    backend, shape, axis = BACKENDS[name](), *frame
    rng = np.random.default_rng(len(shape) * 1000 + shape[0])
    for op in OPS:
        if dtype == "bool" and op.startswith("arg"):
            continue
        x = _values(shape, dtype, op, rng)
        got = _reduce(cn.tensor(x, backend=backend), op, axis).numpy()
        expected = _reduce(cn.tensor(x, backend=cn.NumPy()), op, axis).numpy()
        np.testing.assert_array_equal(got, expected, err_msg=op)


@pytest.mark.parametrize("name", list(BACKENDS))
def test_reductions_of_over_a_million(name):
    backend, rng = BACKENDS[name](), np.random.default_rng(20)
    for op, dtype in (("sum", "float32"), ("max", "float32"), ("argmin", "float32"), ("sum", "int32")):
        x = _values(((1 << 20) + 3,), dtype, op, rng)
        got = _reduce(cn.tensor(x, backend=backend), op, None).numpy()
        np.testing.assert_array_equal(got, _reduce(cn.tensor(x, backend=cn.NumPy()), op, None).numpy(), err_msg=op)


@pytest.mark.parametrize("name", list(BACKENDS))
def test_whole_tensor_reductions_at_chunk_edges(name):
    """NaN in a later chunk wins max and argmax; ties across chunks go to the lower index; a
    tensor of the reduction's identity (-inf for argmax) answers index 0."""
    backend = BACKENDS[name]()
    n = 300001
    x = np.zeros(n, np.float32)
    x[[5000, 150000, 290000]] = 7.0
    x[[4000, 200000]] = -7.0
    t = cn.tensor(x, backend=backend)
    assert (t.argmax().item(), t.argmin().item(), t.max().item(), t.min().item()) == (5000, 4000, 7.0, -7.0)
    x[250000] = np.nan
    t = cn.tensor(x, backend=backend)
    assert t.argmax().item() == 250000 and np.isnan(t.max().item()) and np.isnan(t.min().item())
    t = cn.tensor(np.full(n, -np.inf, np.float32), backend=backend)
    assert t.argmax().item() == 0 and t.max().item() == -np.inf


@pytest.mark.parametrize("name", list(BACKENDS))
def test_fused_prologues_and_epilogues_split_too(name):
    """A whole-tensor sum with a prologue and an epilogue (mean of squares), several reductions
    over one input, and a softmax over a long axis (its reduction reads a row value: one stage)."""
    backend = BACKENDS[name]()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 100000)).astype(np.float32)
    t = cn.tensor(x, backend=backend)
    got = ((t * t + 1.0).sum(1) / 100000.0).numpy()
    np.testing.assert_allclose(got, (x.astype(np.float64) ** 2 + 1).mean(1), rtol=1e-5)
    with cn.profile(backend) as p:
        lo, hi = t.min(), t.max()
        values = lo.numpy(), hi.numpy()
    assert values == (x.min(), x.max())
    assert sum(e["name"].endswith("_partial") for e in p.events if e["kind"] == "kernel") >= 1
    np.testing.assert_allclose(cn.softmax(t, 1).numpy().sum(1), [1.0, 1.0], rtol=1e-4)


def test_whole_tensor_min_runs_in_two_stages():
    backend = cn.Wgpu(autotune=False)
    t = cn.tensor(np.arange(200000, dtype=np.float32), backend=backend)
    with cn.profile(backend) as p:
        assert t.min().item() == 0.0
    names = [e["name"] for e in p.events if e["kind"] == "kernel"]
    assert names == ["reduce_min_partial", "reduce_min"], names
    with cn.profile(backend) as p:
        assert cn.tensor(np.ones((400, 50), np.float32), backend=backend).sum(1).numpy().sum() == 20000
    assert [e["name"] for e in p.events if e["kind"] == "kernel"] == ["reduce_sum"]


def _dynamic_quantize_model():
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, None)],
                              [helper.make_tensor_value_info(n, t, None) for n, t in (("y", 2), ("s", 1), ("z", 2))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("values", ["normal", "positive", "negative", "zeros", "ties", "one", "large"])
def test_dynamic_quantize_linear_equals_onnxruntime(values):
    rng = np.random.default_rng(7)
    x = {"normal": rng.standard_normal((3, 37)) * 4, "positive": rng.uniform(1, 2, (5, 8)),
         "negative": rng.uniform(-3, -1, (1, 64, 56, 56)), "zeros": np.zeros((2, 3)),
         "ties": np.array([[-2.0, 0.5, 1.5, 2.5, 3.5, 125.5, 253.0, -1.0, 0.0, 1.0, 7.25]]),
         "one": np.array([0.3]), "large": rng.standard_normal((1 << 20) + 5) * 2 + 1}[values]
    x = x.astype(np.float32)
    data = _dynamic_quantize_model()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    backend = cn.Wgpu(autotune=False)
    model = load(data, backend=backend)
    xt = cn.tensor(x, backend=backend)
    with cn.profile(backend) as p:
        got = model(xt)
        backend.synchronize()
    # min and max in one pass (two stages where x is long), then scale, zero point and y
    names = [e["name"] for e in p.events if e["kind"] == "kernel"]
    assert names == ["dynamic_quantize_range_partial"] * (x.size >= 2048) + ["dynamic_quantize_range",
                                                                               "dynamic_quantize"], names
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g.numpy(), e)


@pytest.mark.parametrize("zero_points", [("int8", -3, -3), ("uint8", 130, 128), ("int32", 5, -7), (None, 0, 0)])
@pytest.mark.parametrize("size", [1, 1001, (1 << 20) + 1])
def test_quantize_dequantize_is_one_kernel_equal_to_numpy(zero_points, size):
    dtype, yz, xz = zero_points
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 40).astype(np.float32)
    x[:min(size, 4)] = [0.125, 0.375, -0.125, np.nan][:min(size, 4)]   # ties to even, NaN
    ys, xs = np.float32(0.25), np.float32(0.0625)
    backend, numpy = cn.Wgpu(autotune=False), cn.NumPy()

    def args(b):
        zps = [None if dtype is None else cn.tensor(np.array(z), backend=b).cast(getattr(cn, dtype)).handle
               for z in (yz, xz)]
        return (cn.tensor(x, backend=b).handle, cn.tensor(ys, backend=b).handle, zps[0],
                cn.tensor(xs, backend=b).handle, zps[1], lo, hi)
    a = args(backend)
    with cn.profile(backend) as p:
        got = backend.to_numpy(backend.quantize_dequantize(*a))
    assert [e["name"] for e in p.events if e["kind"] == "kernel"] == ["quantize_dequantize"]
    np.testing.assert_array_equal(got, numpy.quantize_dequantize(*args(numpy)))
