"""cn.Wgpu's storage dtypes (wgpu_backend/codegen/packing.py): int8/uint8 four to a u32 word,
float16 as array<f16> where the adapter has shader-f16 or two to a word (shader_f16=False), on
cn.Wgpu and under cn.Fusion (tests/backends.py, STORAGE_BACKENDS). Every cast between them and
the compute dtypes, elementwise ops (which widen), fused chains through a storage dtype, strided
views and writes into words shared with other elements, against NumPy's conversions; and a
float16 ONNX model against onnxruntime."""

import numpy as np
import pytest

import cinders as cn
from cinders.wgpu.codegen.packing import HALF, PACKED

from backends import STORAGE_BACKENDS

wgpu = pytest.importorskip("wgpu")
BACKENDS = {name: make() for name, make in STORAGE_BACKENDS.items()}
NP = {cn.int8: np.int8, cn.uint8: np.uint8, cn.float16: np.float16, cn.float32: np.float32,
      cn.int32: np.int32, cn.bool: np.bool_}
RNG = np.random.default_rng(7)
# Odd lengths: the last word of a packed buffer is partly used.
SOURCES = {
    cn.float32: np.concatenate([RNG.normal(0, 200, 37), [0.5, -0.5, 1.5, 2.5, -127.9, 65504.0,
                                                           65519.0, 65520.0, 1e-7, 3e-8, -6.1e-5,
                                                           2.5e-5, 0.0, -0.0, 7e4]]).astype(np.float32),
    cn.int32: RNG.integers(-1000, 1000, 51).astype(np.int32),
    cn.bool: RNG.integers(0, 2, 23).astype(np.bool_),
    cn.int8: RNG.integers(-128, 128, 45).astype(np.int8),
    cn.uint8: RNG.integers(0, 256, 45).astype(np.uint8),
    cn.float16: RNG.normal(0, 3, 43).astype(np.float16),
}


def _numpy_cast(a, dtype):
    """NumPy's rule as cn.NumPy applies it (floats truncate through int32 into 8 bits)."""
    if dtype in (cn.int8, cn.uint8) and a.dtype.kind == "f":
        a = np.trunc(a.astype(np.float32)).astype(np.int32)
    return a.astype(NP[dtype])


@pytest.fixture(params=list(BACKENDS))
def gpu(request):
    return BACKENDS[request.param]


def test_float16_layout_follows_the_adapter():
    has_f16 = "shader-f16" in wgpu.gpu.request_adapter_sync(power_preference="high-performance").features
    assert BACKENDS["wgpu-f16"].storage_layout == (HALF if has_f16 else PACKED)
    assert BACKENDS["wgpu-f16"].device.shader_f16 is has_f16
    assert BACKENDS["wgpu-packed"].storage_layout == PACKED
    # two devices: tensors of one are not the other's
    with pytest.raises(cn.DeviceError):
        cn.tensor([1.0], backend=BACKENDS["wgpu-f16"]) + cn.tensor([1.0], backend=BACKENDS["wgpu-packed"])


@pytest.mark.parametrize("src", list(SOURCES), ids=repr)
@pytest.mark.parametrize("dst", [cn.int8, cn.uint8, cn.float16, cn.float32, cn.int32, cn.bool],
                         ids=repr)
def test_cast_matches_numpy(gpu, src, dst):
    a = SOURCES[src]
    if dst in (cn.int8, cn.uint8) and a.dtype.kind == "f":
        a = a[np.abs(a) < 2 ** 31]  # beyond int32 the float -> int conversion is undefined
    x = cn.tensor(a, backend=gpu, dtype=src)
    assert x.dtype is src
    y = x.cast(dst)
    assert y.dtype is dst and y.numpy().dtype == NP[dst]
    np.testing.assert_array_equal(y.numpy(), _numpy_cast(a, dst))
    assert y.tolist() == _numpy_cast(a, dst).tolist()


def test_float16_rounding_is_exact_over_many_values(gpu):
    bits = np.arange(0, 1 << 16, 7, dtype=np.uint16)
    halves = bits.view(np.float16)
    halves = halves[np.isfinite(halves)]
    # float32 values around every half: halfway points (ties to even) and just off them
    wide = halves.astype(np.float32)
    mids = np.concatenate([wide, wide * np.float32(1 + 2 ** -11), wide * np.float32(1 + 2 ** -12),
                           wide * np.float32(1 - 2 ** -12), np.float32([65520, -65520, 65519.996])])
    got = cn.tensor(mids, backend=gpu).cast(cn.float16).numpy()
    np.testing.assert_array_equal(got.view(np.uint16), mids.astype(np.float16).view(np.uint16))
    back = cn.tensor(halves, backend=gpu, dtype=cn.float16).cast(cn.float32).numpy()
    np.testing.assert_array_equal(back, halves.astype(np.float32))  # subnormals included


@pytest.mark.parametrize("dtype", [cn.int8, cn.uint8, cn.float16], ids=repr)
def test_elementwise_ops_widen_storage_operands(gpu, dtype):
    a = SOURCES[dtype][:40].reshape(5, 8)
    x = cn.tensor(a, backend=gpu, dtype=dtype)
    wide = a.astype(np.float32 if dtype is cn.float16 else np.int32)
    np.testing.assert_array_equal((x * 3 - x).numpy(), wide * 3 - wide)
    np.testing.assert_array_equal(x.sum(1).numpy(), wide.sum(1))
    np.testing.assert_array_equal(x.max(0).numpy(), wide.max(0))
    np.testing.assert_array_equal((x.cast(cn.float32) / 2).numpy(), wide.astype(np.float32) / 2)


@pytest.mark.parametrize("dtype", [cn.int8, cn.uint8, cn.float16], ids=repr)
def test_views_and_writes_into_shared_words(gpu, dtype):
    a = SOURCES[dtype][:42].reshape(6, 7)
    x = cn.tensor(a, backend=gpu, dtype=dtype)
    np.testing.assert_array_equal(x.permute(1, 0).numpy(), a.T)
    np.testing.assert_array_equal(x[1:5, 3:].numpy(), a[1:5, 3:])   # starts inside a word
    np.testing.assert_array_equal(x[:, ::3].numpy(), a[:, ::3])
    np.testing.assert_array_equal(x[2:3].expand(3, 7).numpy(), np.broadcast_to(a[2:3], (3, 7)))
    # cat and pad copy into regions that start and end inside words of the destination
    parts = [x[:, :3], x[:, 3:4], x[:, 4:]]
    np.testing.assert_array_equal(cn.cat(parts, 1).numpy(), a)
    np.testing.assert_array_equal(cn.cat([x[:1], x, x[5:]], 0).numpy(),
                                  np.concatenate([a[:1], a, a[5:]]))
    # pad fills the destination (whole words of one value), then copies into its middle
    np.testing.assert_array_equal(cn.pad(x, (2, 1, 1, 0), 5).numpy(),
                                  np.pad(a, ((1, 0), (2, 1)), constant_values=5))
    index = cn.tensor([[0, 6, 3], [2, 2, 5]], backend=gpu)
    np.testing.assert_array_equal(x[1:3].gather(1, index).numpy(),
                                  np.take_along_axis(a[1:3], np.array([[0, 6, 3], [2, 2, 5]]), 1))


@pytest.mark.parametrize("dtype,size", [(cn.int8, 1), (cn.uint8, 1), (cn.float16, 2),
                                        (cn.float32, 4)], ids=repr)
def test_storage_tensors_take_their_size_on_the_device(gpu, dtype, size):
    gpu.synchronize()
    gpu.empty_cache()
    before = gpu.memory_stats()["allocated_bytes"]
    x = cn.tensor(np.zeros(1 << 16, NP[dtype]), backend=gpu, dtype=dtype)
    assert gpu.memory_stats()["allocated_bytes"] - before == size << 16
    # ... and so does a result written by a kernel
    y = cn.tensor(np.zeros(1 << 16, np.float32), backend=gpu).cast(dtype)
    assert y.numpy().dtype == NP[dtype]  # (computed: cn.Fusion's result was pending)
    assert gpu.memory_stats()["allocated_bytes"] - before == 2 * size << 16
    del x, y


def test_fused_chains_through_storage_dtypes(gpu):
    """A cast to a storage dtype inside a chain holds the value memory would (wraps, rounds);
    under cn.Fusion the chain is one kernel that never stores it."""
    a = SOURCES[cn.float32][:40]
    x = cn.tensor(a, backend=gpu)
    wide = np.float32(3) * a
    rows = x.reshape(5, 8)
    with cn.profile(gpu) as p:
        through_int8 = ((x * 3).cast(cn.int8) + 1).cast(cn.uint8)
        through_half = (x * 3).cast(cn.float16) * 0.5
        got_int8, got_half = through_int8.numpy(), through_half.numpy()
        # reductions: a storage cast before them (prologue) and after them (epilogue)
        half_sums = rows.cast(cn.float16).sum(1).numpy()
        centred = (rows - rows.max(1, keepdim=True)).cast(cn.int8).numpy()
    np.testing.assert_array_equal(
        got_int8, (np.trunc(wide).astype(np.int32).astype(np.int8).astype(np.int32) + 1).astype(np.uint8))
    np.testing.assert_array_equal(got_half, wide.astype(np.float16).astype(np.float32) * np.float32(0.5))
    a2 = a.reshape(5, 8)
    np.testing.assert_allclose(half_sums, a2.astype(np.float16).astype(np.float32).sum(1), rtol=1e-6)
    np.testing.assert_array_equal(centred, np.trunc(a2 - a2.max(1, keepdims=True)).astype(np.int32).astype(np.int8))
    if isinstance(gpu, cn.Fusion):
        assert p.kernel_launches == 4


def test_float16_onnx_model_matches_onnxruntime(gpu):
    """A float16 ONNX model (weights, input and output float16) against onnxruntime: the input is
    uploaded at two bytes an element and read by a kernel, the output rounded to float16 by one.
    (The importer computes float16 graphs in float32: docs/onnx.md.)"""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    from cinders import onnx as cn_onnx
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array((rng.standard_normal((16, 12)) * 0.3).astype(np.float16), "W"),
               numpy_helper.from_array(rng.standard_normal(12).astype(np.float16), "B")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [5, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [5, 12])], weights)
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = rng.standard_normal((5, 16)).astype(np.float16)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    model = cn_onnx.load(data, backend=gpu)
    y = model(cn.tensor(x, backend=gpu, dtype=cn.float16).cast(cn.float32)).cast(cn.float16)
    got = y.numpy()
    assert got.dtype == want.dtype == np.float16
    # onnxruntime rounds to float16 after each op, cinders once at the end: a few float16 ulps
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=4e-3, atol=1e-4)


@pytest.mark.parametrize("name", [n for n in BACKENDS if not n.startswith("fusion-")])
def test_quantized_matmul_reads_float16_scales(name):
    """The quantized-B matmul reads float16 scales through the device's layout (packing.py)."""
    from cinders.backend import QuantizedLayout
    gpu = BACKENDS[name]
    k, n, m = 40, 24, 5
    q = RNG.integers(-128, 128, (k, n)).astype(np.int8)
    scale = (RNG.random(n) * 0.1).astype(np.float16)
    a = RNG.standard_normal((m, k)).astype(np.float32)
    out = gpu.matmul_quantized(cn.tensor(a, backend=gpu).handle, cn.tensor(q, backend=gpu, dtype=cn.int8).handle,
                               cn.tensor(scale, backend=gpu, dtype=cn.float16).handle, None,
                               QuantizedLayout(k, n, 8, 0, (0, n, 1), scale=(0, 0, 1)))
    np.testing.assert_allclose(np.array(gpu.to_flat(out)).reshape(m, n),
                               a @ (q.astype(np.float32) * scale.astype(np.float32)), rtol=1e-5, atol=1e-4)
