"""Weights stay quantized (issue 28, item 3) on the backends that declare `quantized_matmul`
(cn.Wgpu: packed in u32 words of device memory; cn.Wasm: one byte each in the heap): int8 and
4-bit weights of MatMulInteger, DynamicQuantizeMatMul and MatMulNBits stay at their size and
are dequantized inside the matmul kernel (matmul_quantized); the float32 model's weights take
4x / ~8x the bytes. The outputs equal cn.NumPy()'s, which tests/test_onnx_quant.py holds to
onnxruntime's."""

import numpy as np
import pytest

import cinders as cn
from cinders.onnx import load
from capture_support import assert_replays_match_eager

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402


def _held_bytes(backend):
    """Bytes the backend holds now: cn.Wgpu's allocated device buffers, cn.Wasm's heap blocks."""
    backend.synchronize()
    if backend.name == "wgpu":
        return backend.memory_stats()["allocated_bytes"]
    return backend.heap.in_use


def _kernels_run(backend, monkeypatch, call):
    """call()'s result and the names of the kernels it ran: cn.profile's kernel events on
    cn.Wgpu; on cn.Wasm (no kernel events) the names its command queue receives."""
    if backend.name == "wgpu":
        with cn.profile(backend) as p:
            result = call()
        return result, [e["name"] for e in p.events if e["kind"] == "kernel"]
    names, queue = [], backend.commands.add

    def add(name, *args):
        names.append(name)
        return queue(name, *args)
    monkeypatch.setattr(backend.commands, "add", add)
    monkeypatch.setattr(backend, "_run", add)
    result = call()
    monkeypatch.undo()
    return result, names


BACKENDS = {"wgpu": lambda: cn.Wgpu(autotune=False), "wasm": lambda: cn.Wasm()}


@pytest.fixture(params=list(BACKENDS))
def backend(request):
    return BACKENDS[request.param]()

K, N = 512, 512
RNG = np.random.default_rng(11)
A = RNG.standard_normal((3, K)).astype(np.float32)


def _model(op, inputs, inits, domain="", **attrs):
    node = helper.make_node(op, ["a"] + inputs, ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 1, A.shape)],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def float_model():
    return _model("MatMul", ["w"], {"w": RNG.standard_normal((K, N)).astype(np.float32)})


def int8_model():
    """DynamicQuantizeMatMul: what `cinders quantize --mode q8` and quantize_dynamic write."""
    return _model("DynamicQuantizeMatMul", ["w", "s", "z"], {
        "w": RNG.integers(-63, 64, (K, N)).astype(np.int8),
        "s": RNG.uniform(0.01, 0.02, N).astype(np.float32), "z": np.zeros(N, np.int8)},
        domain="com.microsoft")


def int4_model():
    """MatMulNBits, 4-bit blocks of 32 with packed zero points (MatMul4BitsQuantizer's layout)."""
    blocks = K // 32
    return _model("MatMulNBits", ["w", "s", "z"], {
        "w": RNG.integers(0, 256, (N, blocks, 16)).astype(np.uint8),
        "s": RNG.uniform(0.01, 0.1, N * blocks).astype(np.float32),
        "z": RNG.integers(0, 256, N * blocks // 2).astype(np.uint8)},
        domain="com.microsoft", K=K, N=N, bits=4, block_size=32)


def _resident_bytes(backend, data):
    """Bytes a loaded model holds, and the model (kept alive while measured)."""
    if backend.name == "wgpu":
        backend.synchronize()
        backend.empty_cache()
    before = _held_bytes(backend)
    model = load(data, backend=backend)
    return _held_bytes(backend) - before, model


def test_quantized_weights_take_a_quarter_and_an_eighth_of_the_float_bytes(backend):
    gpu = backend
    f32, kept = _resident_bytes(gpu, float_model())
    assert f32 >= 4 * K * N
    q8, kept8 = _resident_bytes(gpu, int8_model())
    q4, kept4 = _resident_bytes(gpu, int4_model())
    # int8: K*N bytes and N scales/zero points; 4-bit: K*N/2 bytes, a float32 scale per 32 values
    # (1/32 of the float bytes) and the packed zero points.
    assert 0.25 <= q8 / f32 < 0.26, (q8, f32)
    assert 0.125 <= q4 / f32 < 0.165, (q4, f32)
    del kept, kept8, kept4


@pytest.mark.parametrize("make", [int8_model, int4_model], ids=["int8", "int4"])
def test_quantized_matmul_runs_in_the_kernel_and_equals_numpy(backend, make, monkeypatch):
    data = make()
    gpu = backend
    model = load(data, backend=gpu)
    x = cn.tensor(A, backend=gpu)
    got, names = _kernels_run(gpu, monkeypatch, lambda: model(x).numpy())
    assert "matmul_quantized" in names, names
    assert not any(n.startswith("matmul_") and n != "matmul_quantized" for n in names), names
    expected = load(data, backend=cn.NumPy())(cn.tensor(A, backend=cn.NumPy())).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_matmul_integer_is_exact_in_the_kernel(backend, monkeypatch):
    a = RNG.integers(0, 256, (4, 300)).astype(np.uint8)
    w = RNG.integers(-128, 128, (300, 9)).astype(np.int8)
    wz = RNG.integers(-3, 3, 9).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "w", "az", "wz"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 2, a.shape)],
                              [helper.make_tensor_value_info("y", 6, None)],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(np.uint8(131), "az"),
                               numpy_helper.from_array(wz, "wz")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    data = model.SerializeToString()
    gpu = backend
    model = load(data, backend=gpu)
    got, names = _kernels_run(gpu, monkeypatch,
                              lambda: model(cn.tensor(a.astype(np.int32), backend=gpu)).numpy())
    assert "matmul_quantized" in names, names
    # exact integers (onnxruntime's u8 x s8 kernel saturates pairs of products in int16 here)
    expected = (a.astype(np.int64) - 131) @ (w.astype(np.int64) - wz)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype,np_dtype", [(cn.int8, np.int8), (cn.uint8, np.uint8)], ids=repr)
def test_wasm_holds_8_bit_tensors_at_one_byte(dtype, np_dtype, tmp_path):
    """cn.Wasm's int8/uint8: creation, casts that wrap
    like NumPy's, views, writes into regions, gather, records, one byte each in the heap."""
    from cinders import record
    wasm = cn.Wasm()
    a = RNG.integers(-128, 128, 42) if dtype is cn.int8 else RNG.integers(0, 256, 42)
    a = a.astype(np_dtype).reshape(6, 7)
    before = wasm.heap.in_use
    x = cn.tensor(a, backend=wasm, dtype=dtype)
    assert wasm.heap.in_use - before == 48   # 42 bytes in a 16-byte-aligned block
    assert x.dtype is dtype and x.numpy().dtype == np_dtype and x.tolist() == a.tolist()
    np.testing.assert_array_equal(x.permute(1, 0).numpy(), a.T)
    np.testing.assert_array_equal(x[1:5, 3:].numpy(), a[1:5, 3:])
    np.testing.assert_array_equal(cn.cat([x[:, :3], x[:, 3:]], 1).numpy(), a)
    np.testing.assert_array_equal(cn.pad(x, (2, 1, 1, 0), 5).numpy(),
                                  np.pad(a, ((1, 0), (2, 1)), constant_values=5))
    index = np.array([[0, 6, 3], [2, 2, 5]])
    np.testing.assert_array_equal(x[1:3].gather(1, cn.tensor(index, backend=wasm)).numpy(),
                                  np.take_along_axis(a[1:3], index, 1))
    np.testing.assert_array_equal((x * 3).numpy(), a.astype(np.int32) * 3)
    floats = np.array([300.7, -1.5, 255.0, -129.0, 127.9, 0.0], np.float32)
    expected = np.trunc(floats).astype(np.int32).astype(np_dtype)
    assert cn.tensor(floats, backend=wasm).cast(dtype).tolist() == expected.tolist()
    assert cn.tensor([-1, 256, 128], backend=wasm).cast(dtype).tolist() == \
        np.array([-1, 256, 128]).astype(np_dtype).tolist()
    other = cn.int8 if dtype is cn.uint8 else cn.uint8
    assert x.cast(other).tolist() == a.astype(other.name).tolist()
    path = str(tmp_path / "w.safetensors")
    record.save_tensors(path, {"w": x})
    kept = record.read_tensors(path, wasm, keep_dtypes=True)[1]["w"]
    assert kept.dtype is dtype and kept.tolist() == a.tolist()


def test_wasm_holds_float16_at_two_bytes():
    """cn.Wasm's float16: its bit patterns in two bytes, from data, casts both ways (to 8-bit
    dtypes through float32), views, pads, gathers; ops widen it to float32."""
    wasm = cn.Wasm()
    a = (RNG.standard_normal((5, 7)) * 100).astype(np.float16)
    before = wasm.heap.in_use
    h = cn.tensor(a, backend=wasm, dtype=cn.float16)
    assert wasm.heap.in_use - before == 80   # 70 bytes in a 16-byte-aligned block
    assert h.numpy().dtype == np.float16
    np.testing.assert_array_equal(h.numpy(), a)
    np.testing.assert_array_equal(h.permute(1, 0)[2:, ::2].numpy(), a.T[2:, ::2])
    np.testing.assert_array_equal(cn.pad(h, (1, 2, 0, 1), 3).numpy(),
                                  np.pad(a, ((0, 1), (1, 2)), constant_values=3))
    index = np.array([[0, 6, 3], [2, 2, 5]])
    np.testing.assert_array_equal(h[1:3].gather(1, cn.tensor(index, backend=wasm)).numpy(),
                                  np.take_along_axis(a[1:3], index, 1))
    assert (h * 2).dtype is cn.float32
    np.testing.assert_array_equal((h * 2).numpy(), a.astype(np.float32) * 2)
    np.testing.assert_array_equal(h.cast(cn.int8).numpy(), a.astype(np.float32).astype(np.int32).astype(np.int8))
    ints = cn.tensor([253, 200], backend=wasm, dtype=cn.uint8).cast(cn.float16)
    assert ints.dtype is cn.float16 and ints.tolist() == [253.0, 200.0]


@pytest.mark.parametrize("make", [int4_model, int8_model], ids=["int4", "int8"])
def test_captured_quantized_model_replays_the_same_answer(backend, make):
    """cn.capture replays the quantized matmul like any other kernel (the weights it reads stay
    where the model holds them; int8: the activations' quantization and the integer product's
    scratch too)."""
    data = make()
    model = load(data, backend=backend)
    assert_replays_match_eager(model, [cn.tensor(A, backend=backend)], calls=5, min_replays=2)


@pytest.mark.parametrize("m,k,n", [(5, 64, 96), (5, 70, 37), (1030, 36, 1024)],
                         ids=["whole-words", "single-values", "large-tiles"])
@pytest.mark.parametrize("stored", ["nk", "kn"])
@pytest.mark.parametrize("dtype", [cn.int8, cn.uint8], ids=repr)
def test_wgpu_quantized_matmul_reads_packed_rows_either_way(m, k, n, stored, dtype):
    """cn.Wgpu stages B from whole packed words along its contiguous axis (stored (N, K): conv
    and Gemm weights; (K, N): MatMulInteger's) where rows start on word boundaries, and value by
    value elsewhere: the same numbers as NumPy, float (per-column scale and zero point) and the
    exact integer product; in 32 x 32 tiles of C and, for large products, 64 x 64."""
    from cinders.backend import QuantizedLayout
    gpu = cn.Wgpu(autotune=False)
    lo = -128 if dtype is cn.int8 else 0
    w = RNG.integers(lo, lo + 256, (n, k) if stored == "nk" else (k, n)).astype(dtype.name)
    b = (w.T if stored == "nk" else w).astype(np.int64)          # B as (K, N)
    q = (0, 1, k) if stored == "nk" else (0, n, 1)
    scale = RNG.uniform(0.5, 1.5, n).astype(np.float32)
    zp = RNG.integers(lo, lo + 20, n).astype(dtype.name)

    def run(a, scale_t, out_dtype):
        t = [None if v is None else cn.tensor(v, backend=gpu, dtype=d).handle
             for v, d in ((a, None), (w.reshape(-1), dtype), (scale_t, None), (zp, dtype))]
        layout = QuantizedLayout(k, n, 8, k, q, scale=(0, 0, 1), zp=(0, 0, 1))
        return cn.Tensor(gpu, gpu.matmul_quantized(*t, layout), (a.shape[0], n), out_dtype).numpy()
    a = RNG.standard_normal((m, k)).astype(np.float32)
    np.testing.assert_allclose(run(a, scale, cn.float32), a @ ((b - zp) * scale), rtol=1e-4, atol=1e-3)
    ai = RNG.integers(-255, 256, (m, k)).astype(np.int32)
    np.testing.assert_array_equal(run(ai, None, cn.int32), ai.astype(np.int64) @ (b - zp))


def _qdq_model():
    """A QDQ graph as quantize_static writes it: DequantizeLinear of int8 weights (per output
    channel for the conv, per tensor for the Gemm, per column for the MatMul) feeding a Conv
    (asymmetric padding), a Gemm (transB) and a MatMul."""
    wc = RNG.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)
    wg = RNG.integers(-127, 128, (12, 8 * 5 * 5)).astype(np.int8)
    wm = RNG.integers(-127, 128, (12, 6)).astype(np.int8)
    inits = {"wc": wc, "sc": RNG.uniform(0.01, 0.02, 8).astype(np.float32), "zc": np.zeros(8, np.int8),
             "bc": RNG.standard_normal(8).astype(np.float32),
             "wg": wg, "sg": np.float32(0.003), "zg": np.int8(2),
             "wm": wm, "sm": RNG.uniform(0.01, 0.02, 6).astype(np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["wc", "sc", "zc"], ["wcf"], axis=0),
             helper.make_node("Conv", ["x", "wcf", "bc"], ["c"], pads=[1, 1, 0, 0], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("DequantizeLinear", ["wg", "sg", "zg"], ["wgf"]),
             helper.make_node("Gemm", ["f", "wgf"], ["g"], transB=1, alpha=0.5),
             helper.make_node("DequantizeLinear", ["wm", "sm"], ["wmf"], axis=1),
             helper.make_node("MatMul", ["g", "wmf"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", 1, (2, 3, 10, 10))],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def test_qdq_weights_stay_8_bit_inside_conv_gemm_and_matmul(backend, monkeypatch):
    """The importer joins DequantizeLinear(constant int8 W) with the Conv/Gemm/MatMul reading it:
    W is read 8-bit inside matmul_quantized (no float32 copy, no float conv or matmul kernel),
    and the output is onnxruntime's."""
    ort = pytest.importorskip("onnxruntime")
    data = _qdq_model()
    x = RNG.standard_normal((2, 3, 10, 10)).astype(np.float32)
    model = load(data, backend=backend)
    got, names = _kernels_run(backend, monkeypatch, lambda: model(cn.tensor(x, backend=backend)).numpy())
    assert names.count("matmul_quantized") == 3, names
    assert not any(n.startswith(("matmul_", "conv")) and n != "matmul_quantized" for n in names), names
    # the graph as written: onnxruntime's optimizer rewrites DequantizeLinear -> Gemm/MatMul into
    # its own integer kernels, which requantize x (1% off here)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_conv_integer_and_qlinear_conv_are_exact_in_the_kernel(backend, monkeypatch):
    """ConvInteger and QLinearConv read their int8 weight inside the kernel (cn.Wgpu: its conv
    kernels' quantized variants, tests/test_quantized_wgpu_kernels.py; cn.Wasm: its integer conv
    kernel, tests/test_quantized_conv.py) and give cn.NumPy()'s exact integer results
    (tests/test_onnx_quant.py holds those to onnxruntime)."""
    x = RNG.integers(0, 256, (1, 4, 9, 9)).astype(np.uint8)
    inits = {"w": RNG.integers(-128, 128, (5, 4, 3, 3)).astype(np.int8), "xz": np.uint8(129),
             "wz": RNG.integers(-4, 4, 5).astype(np.int8), "xs": np.float32(0.02),
             "ws": RNG.uniform(0.001, 0.002, 5).astype(np.float32), "ys": np.float32(0.5), "yz": np.uint8(128)}
    nodes = [helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["ci"], pads=[0, 1, 1, 0]),
             helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["qc"],
                              strides=[2, 2])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 2, x.shape)],
                              [helper.make_tensor_value_info("ci", 6, None), helper.make_tensor_value_info("qc", 2, None)],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    data = model.SerializeToString()
    run = lambda b: [t.numpy() for t in load(data, backend=b)(cn.tensor(x.astype(np.int32), backend=b))]  # noqa: E731
    got, names = _kernels_run(backend, monkeypatch, lambda: run(backend))
    kernel = {"wgpu": "conv2d_qint8_", "wasm": "conv2d_quantized"}[backend.name]
    assert len([n for n in names if n.startswith(kernel)]) == 2, names
    for g, e in zip(got, run(cn.NumPy())):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("stored", ["nk", "kn"])
@pytest.mark.parametrize("bits", [8, 4])
def test_numpy_integer_products_go_a_panel_of_b_at_a_time(stored, bits, monkeypatch):
    """cn.NumPy reads an integer product's B a few columns at a time (QUANT_PANEL values, made
    small here so that 70 columns take five panels, the last a ragged one): the exact int32 sums
    of MatMulInteger and a QDQ activation's scaled sums, per-column zero points or 4-bit zero
    points per block of K, B stored (N, K) or (K, N)."""
    from cinders.backend import QuantizedLayout
    from cinders.backends import numpy_backend
    monkeypatch.setattr(numpy_backend, "QUANT_PANEL", 16 * 40)
    np_b = cn.NumPy()
    k, n, m = 40, 70, 3
    if bits == 8:
        w = RNG.integers(-128, 128, (n, k) if stored == "nk" else (k, n)).astype(np.int8)
        b = (w.T if stored == "nk" else w).astype(np.int64)
        q, block, zp_bits = w.reshape(-1), k, 8
        zp = RNG.integers(-5, 5, n).astype(np.int8)
        zp_full = np.broadcast_to(zp.astype(np.int64), (k, n))
        zp_layout, blocks = (0, 0, 1), 1
    else:
        values = RNG.integers(0, 16, (n, k) if stored == "nk" else (k, n)).astype(np.uint8)
        b = (values.T if stored == "nk" else values).astype(np.int64)
        flat = values.reshape(-1)
        q, block, zp_bits = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8), 16, 4
        blocks = -(-k // block)
        zp_values = RNG.integers(0, 16, (blocks, n)).astype(np.uint8)    # (block, n) at block * n + n
        zflat = zp_values.reshape(-1)
        zp = (zflat[0::2] | (zflat[1::2] << 4)).astype(np.uint8)
        zp_full = np.repeat(zp_values.astype(np.int64), block, axis=0)[:k]
        zp_layout = (0, n, 1)
    layout = QuantizedLayout(k, n, bits, block, (0, 1, k) if stored == "nk" else (0, n, 1),
                             scale=(0, 0, 1), zp=zp_layout, zp_bits=zp_bits)
    a = RNG.integers(-255, 256, (m, k)).astype(np.int32)
    got = np_b.matmul_quantized(a, q, None, zp, layout)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ (b - zp_full))
    if bits == 8:   # a QDQ activation: its integers times a_scale
        a_scale = np.float32(0.05)
        scale = RNG.uniform(0.5, 1.5, n).astype(np.float32)
        got = np_b.matmul_quantized((a * a_scale).astype(np.float32), q, scale, zp, layout, a_scale=a_scale)
        expected = (a.astype(np.int64) @ (b - zp_full)).astype(np.float32) * (a_scale * scale)
        np.testing.assert_allclose(got, expected, rtol=1e-6)
