"""cn.Wasm() specifics: the module is built here from source, small and self-contained; its op
tables cover the protocol; views, the heap, the command queue and errors behave. (The whole
conformance and gradient suites run on it through tests/backends.py: "wasm", "autodiff-wasm";
on the desktop its kernels run in a Node child process, in the browser through JS: e2e/
test_mnist_nowebgpu.py replays the conformance table there.)"""
import numpy as np
import pytest

import cinders as cn
from cinders import backend as protocol
from cinders.backend import reference_random
from cinders.wasm import Wasm, build, kernels
from cinders.wasm.backend import Heap
from cinders.wasm.engines import WasmEngineError

# An earlier issue's goal was <= 150 KB; the recurrent cells and the quantized matmul with its
# 8-bit dtypes took it to 151 KiB (ORT Web's wasm build is 14 MB). The budget still catches a
# kernel table that multiplies by accident. Issue 28's q8 and float16 work took it to 160.4 KiB:
# +4.2 KiB for the exact integer product on i32x4.dot_i16x8 (mm_pairs, fill_pairs with its SIMD
# interleave, the packing of A), +0.7 KiB for DynamicQuantizeLinear in one kernel, +4.7 KiB for
# float16 storage (its copy, the two casts to and from float32, its gather). Quantized
# convolutions as integer kernels took it to 165.6 KiB: +5.1 KiB for conv2d_quantized (the
# centring of image and weight into int16, the pixel panels' gather, the float epilogue).
# conv2d's backward kernels took it to 170.7 KiB: +5.0 KiB for conv2d_grad_input_f32 (the
# transposed weight, the panel's fold: conv_panel's adjoint), conv2d_grad_weight_f32 (partial
# products on mm_nn, or mm_nt for few taps) and conv2d_grad_bias_f32, 1.9 KiB of it the
# depthwise direct loops. QDQ graphs' integer products added 1.4 KiB: a QDQ activation's
# packing into int16 pairs, the scaled epilogue of matmul_quantized, quantize_dequantize_f32.
# Half-precision weights added 1.7 KiB (173.8 KiB): float16 B in matmul_quantized, widened a
# panel at a time without branches (f16_widen). Depthwise convs and conv activations added
# 4.3 KiB: the depthwise rows (3x3 taps unrolled, stride 1 and 2), the conv epilogue's SiLU /
# hard activations (a vectorised exp) and erf's polynomial.
MODULE_BUDGET = 179 * 1024


@pytest.fixture(scope="module")
def wasm():
    return Wasm()


def _section_ids(data):
    """Section ids of a WebAssembly binary (LEB128 sizes)."""
    ids, at = [], 8
    while at < len(data):
        ids.append(data[at])
        at += 1
        size = shift = 0
        while True:
            byte = data[at]
            at += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        at += size
    return ids


def test_module_is_built_from_source_small_and_imports_nothing():
    path = build.module_path()
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\0asm\x01\0\0\0"
    assert len(data) <= MODULE_BUDGET, "module is %d bytes, over the %d budget" % (len(data), MODULE_BUDGET)
    ids = _section_ids(data)
    assert 2 not in ids, "the module imports something: it must run on an empty import object"
    assert 10 in ids and 7 in ids  # code and exports


def test_op_tables_cover_the_protocol():
    assert set(kernels.UNARY) == set(protocol.UNARY_OPS)
    assert set(kernels.BINARY) == set(protocol.BINARY_OPS)
    assert set(kernels.REDUCE) | set(kernels.ARG_REDUCE) == set(protocol.REDUCE_OPS)


def test_every_generated_kernel_is_exported_and_queueable(wasm):
    assert set(kernels.kernel_names()) <= wasm.engine.kernels
    queued = [name for name, _ in kernels.queued_kernels()]
    assert len(queued) == len(set(queued)) and set(queued) <= wasm.engine.kernels


def test_views_share_storage_and_strided_kernels_read_them(wasm):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = cn.tensor(a, backend=wasm)
    views = [x.permute(2, 0, 1), x[:, 1:, ::2], x[:, :1].expand(2, 3, 4), x.reshape(4, 6)]
    assert all(v.handle.buf is x.handle.buf for v in views)
    want = [a.transpose(2, 0, 1), a[:, 1:, ::2], np.broadcast_to(a[:, :1], (2, 3, 4)), a.reshape(4, 6)]
    for v, w in zip(views, want):
        np.testing.assert_array_equal(np.array((v * 2 + 1).tolist()), w * 2 + 1)
        np.testing.assert_allclose(np.array(v.exp().sum(-1).tolist()), np.exp(w.astype(np.float64)).sum(-1), rtol=1e-6)


@pytest.mark.parametrize("sa, sb, transpose", [
    ((5, 7), (7, 13), ""), ((9, 16), (16, 8), ""), ((3, 1, 5, 6), (4, 6, 9), ""),
    ((6, 33), (10, 33), "b"), ((2, 4, 17), (2, 3, 17), "b"), ((7, 6), (7, 5), "a"), ((1, 70), (70, 1), "")])
def test_matmul_register_blocks_tails_and_transposed_operands(wasm, sa, sb, transpose):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    x, y = cn.tensor(a, backend=wasm), cn.tensor(b, backend=wasm)
    if "a" in transpose:
        a, x = a.swapaxes(-1, -2), x.transpose(-1, -2)
    if "b" in transpose:
        b, y = b.swapaxes(-1, -2), y.transpose(-1, -2)
    np.testing.assert_allclose(np.array((x @ y).tolist()), a @ b, rtol=1e-5, atol=1e-5)


def test_heap_reuses_freed_blocks_and_grows(wasm):
    x = cn.zeros(1000, backend=wasm)
    ptr = x.handle.buf.ptr
    del x
    assert cn.zeros(1000, backend=wasm).handle.buf.ptr == ptr
    end = wasm.heap.end
    n = 1 << 22  # 16 MiB of float32
    big = cn.full((n,), 1.5, backend=wasm)
    assert wasm.heap.end > end
    assert (big * 2).sum().item() == 3.0 * n
    for nbytes in (1, 16, 17, 1000, 4096, 123457):
        size = Heap.size_class(nbytes)
        assert size >= nbytes and size % 16 == 0 and size <= nbytes * 1.25 + 16


def test_kernels_are_queued_until_a_result_is_read(wasm):
    engine = wasm.engine
    x = cn.tensor([[0.5, -1.0], [2.0, 3.0]], backend=wasm)
    ((x + 1) * 2).relu().sum(0).tolist()  # first run: writes the (then cached) descriptors
    calls = []
    plain = engine.call
    engine.call = lambda name, *args: calls.append(name) or plain(name, *args)
    try:
        y = ((x + 1) * 2).relu().sum(0)
        assert calls == []
        assert y.tolist() == [9.0, 8.0]
        assert calls == ["run_commands"]
    finally:
        del engine.call


def test_index_errors_raise_and_change_nothing(wasm):
    x = cn.tensor([[1.0, 2.0, 3.0]], backend=wasm)
    with pytest.raises(cn.errors.IndexingError, match="gather: index 3 is out of bounds for axis 1 with size 3"):
        x.gather(1, cn.tensor([[0, 3]], backend=wasm))
    with pytest.raises(cn.errors.IndexingError, match="scatter_add: index -4 is out of bounds"):
        x.scatter_add(1, cn.tensor([[1, -4]], backend=wasm), cn.tensor([[5.0, 5.0]], backend=wasm))
    assert x.tolist() == [[1.0, 2.0, 3.0]]
    assert x.gather(1, cn.tensor([[-1, 0]], backend=wasm)).tolist() == [[3.0, 1.0]]


@pytest.mark.parametrize("distribution", ["uniform", "normal"])
def test_random_is_the_reference_generator(wasm, distribution):
    got = cn.random((10007,), backend=wasm, distribution=distribution, seed=2**32 - 5).tolist()
    want = np.array(reference_random(10007, distribution, 2**32 - 5), dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_trap_is_an_error_and_the_engine_survives(wasm):
    with pytest.raises(WasmEngineError, match="out of bounds"):
        wasm.engine.call("fill_32", 2**31 - 64, 4096, 0)
    assert (cn.ones(3, backend=wasm) + 1).tolist() == [2.0, 2.0, 2.0]


def test_missing_toolchain_says_how_to_fix(monkeypatch):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(build.WasmBuildError, match="scripts/setup.sh"):
        build._tool("clang")


def test_profile_lists_the_queued_kernels(wasm):
    """cn.profile reports each kernel cn.Wasm() queues, nested profiles each see theirs, and
    nothing is reported once the blocks close."""
    x = cn.tensor([1.0, 2.0], backend=wasm)

    def kernels(p):
        return [e["name"] for e in p.events if e["kind"] == "kernel"]
    with cn.profile(wasm) as outer:
        with cn.profile(wasm) as inner:
            x.exp().tolist()
        x.sqrt().tolist()
    x.tanh().tolist()
    assert kernels(inner) == ["unary_exp_f32"]
    assert kernels(outer) == ["unary_exp_f32", "unary_sqrt_f32"]


def test_memory_stats_count_the_heap_blocks_tensors_hold():
    """cn.Wasm().memory_stats(): a tensor's block counts as allocated while it lives, then as
    pooled (free for reuse) once collected; reserved is both."""
    import gc
    backend = cn.Wasm()
    before = backend.memory_stats()
    t = cn.tensor(np.ones(1000, np.float32), backend=backend)
    held = backend.memory_stats()
    assert 4000 <= held["allocated_bytes"] - before["allocated_bytes"] < 4000 * 1.25
    assert held["reserved_bytes"] == held["allocated_bytes"] + held["pooled_bytes"] <= held["memory_bytes"]
    del t
    gc.collect()
    freed = backend.memory_stats()
    block = held["allocated_bytes"] - before["allocated_bytes"]
    assert freed["allocated_bytes"] == before["allocated_bytes"]
    assert freed["pooled_bytes"] == held["pooled_bytes"] + block   # (it may have come off the lists)
    assert freed["reserved_bytes"] == held["reserved_bytes"]
