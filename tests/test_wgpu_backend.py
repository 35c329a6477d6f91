"""cn.Wgpu at the protocol level, differential against cn.NumPy() (real wgpu, lavapipe in CI).

The conformance suite covers each op's semantics; this file covers what is Wgpu's own: strided
views feeding kernels, every matmul variant, the reduction strategies, erf's accuracy, the
buffer pool and in-place reuse, the device-limit error, profiling, autotuning, async readback.
Shapes are small and ops are batched per test: lavapipe runs on shared CPU cores.
"""

import asyncio
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import cinders as cn
from cinders import dtypes
from cinders.backend import reference_random

import cinders.wgpu as wgpu_backend  # noqa: E402  (CI installs wgpu: a missing one must fail)
from cinders.wgpu import matmul as matmul_select  # noqa: E402

F32, I32, BOOL = dtypes.float32, dtypes.int32, dtypes.bool_


@pytest.fixture(scope="module")
def gpu():
    return cn.Wgpu(autotune=False)


@pytest.fixture(scope="module")
def ref():
    return cn.NumPy()


def up(b, arr):
    dtype = {np.float32: F32, np.int32: I32, np.bool_: BOOL}[arr.dtype.type]
    return b.from_flat(arr.reshape(-1).tolist(), arr.shape, dtype)


def down(b, h):
    return np.array(b.to_flat(h)).reshape(b.shape(h))


def same(gpu, ref, fn, *arrays, rtol=2e-6, atol=1e-6):
    """Run fn(backend, *handles) on both backends and compare."""
    got = down(gpu, fn(gpu, *[up(gpu, a) for a in arrays]))
    want = down(ref, fn(ref, *[up(ref, a) for a in arrays]))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


rng = np.random.default_rng(7)


def test_kernels_read_strided_views(gpu, ref):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    y = rng.standard_normal((4, 1, 5)).astype(np.float32)

    def flat(b, h):
        return b.reshape(h, (math.prod(b.shape(h)),))

    def views(b, x, y):
        t = b.permute(x, (1, 0, 2))                            # (4, 3, 5) non-contiguous
        s = b.slice(t, (1, 0, 1), (4, 3, 5), (2, 1, 2))        # (2, 3, 2) offset + steps
        e = b.expand(b.slice(y, (0, 0, 0), (2, 1, 2), (1, 1, 1)), (2, 3, 2))
        z = b.binary("mul", b.unary("exp", s), e)              # strided inputs, broadcast
        r = b.reduce("sum", b.permute(z, (2, 0, 1)), 1, True)  # reduce through strides
        m = b.matmul(b.permute(s, (0, 2, 1)), s)               # transposed operand, no copy
        p = b.pad(b.permute(s, (2, 1, 0)), ((1, 0), (0, 2), (1, 1)), -1.5)
        return b.cat([flat(b, m), flat(b, r), flat(b, p), flat(b, z)], 0)
    same(gpu, ref, views, x, y)


def test_cat_pad_reshape_of_views_and_ints(gpu, ref):
    a = rng.integers(-5, 5, (2, 3)).astype(np.int32)
    b_ = rng.integers(-5, 5, (4, 3)).astype(np.int32)

    def fn(b, a, c):
        t = b.permute(c, (1, 0))                              # (3, 4)
        joined = b.cat([b.permute(a, (1, 0)), t, b.slice(t, (0, 1), (3, 4), (1, 2))], 1)
        flat = b.reshape(b.permute(joined, (1, 0)), (24,))    # reshape of a view copies
        return b.pad(b.reshape(flat, (4, 6)), ((0, 1), (2, 0)), 7)
    same(gpu, ref, fn, a, b_)


@pytest.mark.parametrize("variant", sorted(matmul_select.VARIANTS))
def test_every_matmul_variant(gpu, variant):
    def check(a, b, batch, ha=None, hb=None):
        ha = up(gpu, a) if ha is None else ha
        hb = up(gpu, b) if hb is None else hb
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        got = down(gpu, gpu._matmul_variant(variant, ha, hb, batch, m, n, k))
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)

    # Sizes that are not multiples of any tile, a broadcast batch dim, a transposed operand.
    a = rng.standard_normal((2, 1, 37, 600)).astype(np.float32)
    b = rng.standard_normal((1, 3, 600, 29)).astype(np.float32)
    check(a, b, (2, 3))
    bt = np.ascontiguousarray(np.swapaxes(b, 2, 3))
    check(a, b, (2, 3), hb=gpu.permute(up(gpu, bt), (0, 1, 3, 2)))
    # vec4-aligned layouts: exact tiles (no bounds checks), and ragged edges.
    check(rng.standard_normal((1, 3, 128, 64)).astype(np.float32),
          rng.standard_normal((2, 1, 64, 128)).astype(np.float32), (2, 3))
    check(rng.standard_normal((40, 64)).astype(np.float32),
          rng.standard_normal((64, 36)).astype(np.float32), ())
    # An operand that starts at an offset inside its buffer (a slice).
    big = rng.standard_normal((45, 64)).astype(np.float32)
    check(big[4:44], rng.standard_normal((64, 36)).astype(np.float32), (),
          ha=gpu.slice(up(gpu, big), (4, 0), (44, 64), (1, 1)))


def test_matmul_heuristic_covers_shapes(gpu, monkeypatch):
    assert matmul_select.heuristic(8, 8, 4096, 1) == "splitk64"
    assert matmul_select.heuristic(1024, 1024, 1024, 1) == "reg128x64"
    assert matmul_select.heuristic(4096, 4096, 4096, 1) == "reg128x256"
    assert matmul_select.heuristic(4096, 4096, 4096, 1, shared_limit=16384) == "block64"
    # A tiling needing more workgroup memory than any device has: a clear error, not a crash.
    monkeypatch.setitem(matmul_select.VARIANTS, "too_big",
                        matmul_select._t(128, 256, 32, 8, 16, lanes_x=8))
    a, b = up(gpu, np.ones((128, 64), np.float32)), up(gpu, np.ones((64, 128), np.float32))
    with pytest.raises(MemoryError, match="too_big needs 98304 bytes of workgroup memory"):
        gpu._matmul_variant("too_big", a, b, (), 128, 128, 64)
    assert matmul_select.heuristic(5, 5, 7, 1) == "tile16"
    assert matmul_select.heuristic(1, 128, 1568, 1) == "splitk_rows_direct"
    assert matmul_select.heuristic(1, 128, 1568, 1, cpu=True) == "rows_direct"
    for m, k, n in ((4, 3000, 2), (70, 50, 130), (1, 20, 3)):  # through the public op
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        got = down(gpu, gpu.matmul(up(gpu, a), up(gpu, b)))
        np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def test_reductions_long_and_short_axes(gpu, ref):
    x = rng.standard_normal((3, 700)).astype(np.float32)
    x[1, 5] = np.nan
    x[2, 300] = x[2, 600] = 50.0          # tie: argmax must pick the first
    i = rng.integers(-100, 100, (700, 3)).astype(np.int32)
    bools = rng.integers(0, 2, (5, 300)).astype(np.bool_)
    for op in ("sum", "prod", "max", "min", "argmax", "argmin"):
        for axis in (0, 1):
            same(gpu, ref, lambda b, x: b.reduce(op, x, axis, False), x, rtol=1e-5, atol=1e-4)
            same(gpu, ref, lambda b, x: b.reduce(op, x, axis, True), i)
        if op != "prod":
            same(gpu, ref, lambda b, x: b.reduce(op, x, 1, False), bools)


def test_erf_accuracy():
    b = cn.Wgpu(autotune=False)
    xs = np.concatenate([np.linspace(-6, 6, 4001), [0.49999, 0.5, -0.5, 1e-7, -1e-30]]).astype(np.float32)
    got = np.array(b.to_flat(b.unary("erf", up(b, xs))))
    want = np.array([math.erf(float(v)) for v in xs])
    assert np.max(np.abs(got - want)) < 1e-6


def test_integer_division_has_python_semantics(gpu):
    a = np.array([7, -7, 7, -7, 0, 5, -2147483647, 3], np.int32)
    c = np.array([2, 2, -2, -2, 3, 0, 7, -1], np.int32)
    ha, hc = up(gpu, a), up(gpu, c)
    assert gpu.to_flat(gpu.binary("floordiv", ha, hc)) == [
        x // y if y else 0 for x, y in zip(a.tolist(), c.tolist())]
    assert gpu.to_flat(gpu.binary("mod", ha, hc)) == [
        x % y if y else 0 for x, y in zip(a.tolist(), c.tolist())]


def test_random_uniform_is_bit_exact_and_normal_close(gpu):
    u = gpu.to_flat(gpu.random((1000,), "uniform", 99, F32))
    assert u == reference_random(1000, "uniform", 99)
    z = np.array(gpu.to_flat(gpu.random((500,), "normal", 5, F32)))
    np.testing.assert_allclose(z, reference_random(500, "normal", 5), rtol=1e-5, atol=2e-5)


def test_gather_scatter_unfold_fold(gpu, ref):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    idx = rng.integers(0, 5, (3, 7)).astype(np.int32)
    src = rng.standard_normal((3, 7)).astype(np.float32)
    for axis, index in ((1, idx), (0, rng.integers(0, 3, (2, 5)).astype(np.int32))):
        same(gpu, ref, lambda b, x, i: b.gather(x, axis, i), x, index)
        same(gpu, ref, lambda b, x, i, s: b.scatter_add(x, axis, i, s), x, index,
             src[:index.shape[0], :index.shape[1]].copy(), atol=1e-5)
    img = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    for geometry in (((3, 3), (1, 1), (1, 1), (1, 1)), ((2, 3), (2, 1), (0, 2), (2, 1))):
        kernel, stride, padding, dilation = geometry
        same(gpu, ref, lambda b, x: b.unfold2d(b.permute(b.permute(x, (0, 1, 3, 2)), (0, 1, 3, 2)),
                                               kernel, stride, padding, dilation, -math.inf), img)
        cols = ref.unfold2d(up(ref, img), kernel, stride, padding, dilation, 0.0)
        c = np.array(ref.to_flat(cols), np.float32).reshape(ref.shape(cols))
        same(gpu, ref, lambda b, c: b.fold2d(c, (7, 6), kernel, stride, padding, dilation), c,
             atol=1e-5)


def test_ops_enqueue_and_read_async(gpu):
    x = up(gpu, np.arange(6, dtype=np.float32))
    gpu.synchronize()
    y = gpu.unary("sqrt", gpu.binary("mul", x, x))
    assert gpu.device._pending, "ops must be recorded, not submitted one by one"
    assert asyncio.run(gpu.to_flat_async(y)) == list(range(6))
    assert not gpu.device._pending


def test_pool_reuse_inplace_and_upload_hazard(gpu):
    stats0 = gpu.memory_stats()
    x = up(gpu, np.full(1000, 2.0, np.float32))
    for _ in range(3):
        gpu.binary("add", x, x)                 # results die at once: their buffers come back
    stats1 = gpu.memory_stats()
    assert stats1["reused"] >= stats0["reused"] + 2
    assert stats1["peak_bytes"] >= stats1["allocated_bytes"] > 0
    held = gpu.unary("neg", x)
    out = gpu.binary("add", gpu.unary("exp", held), x)   # exp's result dies after the add:
    # the add's result takes its buffer (pool.py, "In-place results"; tests/test_donation.py)
    assert gpu.memory_stats()["inplace"] == stats1["inplace"] + 1
    assert gpu.to_flat(held)[:2] == [-2.0, -2.0]         # inputs someone holds stay intact
    np.testing.assert_allclose(gpu.to_flat(out)[:2], [math.exp(-2) + 2] * 2, rtol=1e-6)
    # A pooled buffer that the unsubmitted batch still reads must not be overwritten early.
    a = up(gpu, np.full(64, 3.0, np.float32))
    b = gpu.unary("neg", a)
    del a
    c = up(gpu, np.full(64, 9.0, np.float32))
    assert gpu.to_flat(b) == [-3.0] * 64 and gpu.to_flat(c) == [9.0] * 64


def test_tensor_beyond_binding_limit_is_a_clear_error(gpu):
    too_big = gpu.device.limits["max_storage_buffer_binding_size"] // 4 + 1
    with pytest.raises(MemoryError) as info:
        gpu.full((too_big,), 1.0, F32)
    message = str(info.value)
    assert str(4 * too_big) in message and str(gpu.device.limits["max_storage_buffer_binding_size"]) in message


def test_profile_counts_launches_bytes_and_gpu_time(gpu):
    x = up(gpu, np.ones((64, 64), np.float32))
    gpu.synchronize()
    with cn.profile(gpu) as p:
        y = gpu.matmul(gpu.binary("add", x, x), x)
        gpu.reduce("sum", y, 0, False)
    assert p.kernel_launches == 3
    names = [e["name"] for e in p.events if e["kind"] == "kernel"]
    assert names[0] == "add" and names[1].startswith("matmul_") and names[2] == "reduce_sum"
    assert p.bytes_written == 4 * (64 * 64 * 2 + 64)
    assert p.bytes_read >= 4 * 64 * 64 * 4
    assert p.cache_hits + p.cache_misses == 3
    if gpu.device.has_timestamps:
        assert p.gpu_time > 0
    with cn.profile(cn.Autodiff(gpu)) as outer:       # a decorator's profiler sees its inner
        cn.tensor([1.0, 2.0], backend=cn.Autodiff(gpu)).exp().tolist()
    assert outer.kernel_launches >= 1


def test_autotune_picks_and_caches_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("CINDERS_CACHE", str(tmp_path))
    b = cn.Wgpu(autotune=True)
    b._rt.tuner.chosen = None  # forget what this process tuned before
    a = rng.standard_normal((96, 200)).astype(np.float32)
    w = rng.standard_normal((200, 160)).astype(np.float32)
    got = down(b, b.matmul(up(b, a), up(b, w)))
    np.testing.assert_allclose(got, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)
    saved = json.loads((tmp_path / "autotune.json").read_text())
    chosen = saved[b.device.name][matmul_select.shape_class(96, 160, 200, 1)]
    assert chosen in matmul_select.VARIANTS
    fresh = matmul_select.Tuner(b.device.name)
    assert fresh.select(96, 160, 200, 1, True, run=None, wait=None) == chosen  # from disk, no run


def test_autotune_is_off_by_default_on_software_adapters_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("CINDERS_CACHE", str(tmp_path))
    default = cn.Wgpu()
    assert default.device.is_cpu  # lavapipe: adapter info says CPU
    assert default.autotune is False and cn.Wgpu(autotune=True).autotune is True
    default._rt.tuner.chosen = None
    a = up(default, rng.standard_normal((96, 200)).astype(np.float32))
    w = up(default, rng.standard_normal((200, 160)).astype(np.float32))
    down(default, default.matmul(a, w))
    assert not (tmp_path / "autotune.json").exists()  # the heuristic, nothing timed


def test_autotune_is_bounded_per_shape_class_and_says_so_on_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CINDERS_CACHE", str(tmp_path))
    b = cn.Wgpu(autotune=True)
    b._rt.tuner.chosen = None
    a = up(b, rng.standard_normal((64, 96)).astype(np.float32))
    w = up(b, rng.standard_normal((96, 512)).astype(np.float32))
    monkeypatch.setattr(matmul_select, "PROGRESS_AFTER", 1e9)
    down(b, b.matmul(a, w))  # a short search says nothing
    assert "autotuning" not in capsys.readouterr().err
    # No time left after the first variant (the heuristic's): the search stops there, and
    # progress past PROGRESS_AFTER seconds goes to stderr.
    monkeypatch.setattr(matmul_select, "TUNE_BUDGET", 0.0)
    monkeypatch.setattr(matmul_select, "PROGRESS_AFTER", 0.0)
    x = rng.standard_normal((80, 300)).astype(np.float32)
    y = rng.standard_normal((300, 100)).astype(np.float32)
    got = down(b, b.matmul(up(b, x), up(b, y)))
    np.testing.assert_allclose(got, x.astype(np.float64) @ y, rtol=1e-4, atol=1e-3)
    err = capsys.readouterr().err.strip().splitlines()
    klass = matmul_select.shape_class(80, 100, 300, 1)
    assert len(err) == 1 and "autotuning matmul %s" % klass in err[0] and " 1/" in err[0], err
    saved = json.loads((tmp_path / "autotune.json").read_text())[b.device.name]
    assert saved[klass] == matmul_select.heuristic(80, 100, 300, 1, True, b._rt.tuner.shared_limit)


def test_import_cinders_needs_no_wgpu():
    code = ("import sys, cinders, cinders.wgpu.backend, cinders.wgpu.codegen; "
            "assert 'wgpu' not in sys.modules, 'importing cinders loaded wgpu'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mnist_cnn_trains_like_numpy():
    from cinders.models.mnist import MnistCNN
    from cinders.nn import functional as F
    from cinders.optim.optimizers import Adam
    images = rng.random((8, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    losses = {}
    for name, backend in (("numpy", cn.Autodiff(cn.NumPy())),
                          ("wgpu", cn.Autodiff(cn.Wgpu(autotune=False)))):
        cn.manual_seed(0)  # the same initial weights on both
        model = MnistCNN().to(backend)
        opt = Adam(lr=1e-3)
        x, y = cn.tensor(images, backend=backend), cn.tensor(labels, backend=backend)
        history = []
        for _ in range(3):
            loss = F.cross_entropy(model(x), y)
            model = opt.step(model, loss.backward())
            history.append(loss.item())
        losses[name] = history
    assert losses["wgpu"][-1] < losses["wgpu"][0]
    np.testing.assert_allclose(losses["wgpu"], losses["numpy"], rtol=1e-4)


def test_batches_built_in_loader_threads_train_like_numpy():
    """DataLoader workers upload batches while the training thread records and submits
    kernels: the device's lock must keep a queue write from overtaking kernels recorded
    earlier that still read the reused buffer (the symptom was training on wrong pixels)."""
    from cinders.data import DataLoader, ListDataset
    from cinders.data.mnist import MnistBatcher
    from cinders.models.mnist import MnistMLP
    from cinders.nn import functional as F
    from cinders.optim.optimizers import Adam
    items = [(rng.random(784, dtype=np.float32), int(k % 10)) for k in range(24 * 16)]
    losses = {}
    for name, backend in (("numpy", cn.Autodiff(cn.NumPy())),
                          ("wgpu", cn.Autodiff(cn.Wgpu(autotune=False)))):
        cn.manual_seed(0)
        model = MnistMLP(hidden=32).to(backend)
        opt = Adam(lr=1e-3)
        loader = DataLoader(ListDataset(items), 16, shuffle=True, seed=1,
                            batcher=MnistBatcher(backend), num_workers=3)
        history = []
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            model = opt.step(model, loss.backward())
            history.append(loss)  # read at the end: no sync point inside the loop
        losses[name] = [loss.item() for loss in history]
    np.testing.assert_allclose(losses["wgpu"], losses["numpy"], rtol=1e-4)


def test_buffer_finalizers_never_wait_for_the_device_lock(gpu):
    """A dying buffer is handed back from whatever thread drops it, wgpu-py's poll thread
    included; if that waited for the device lock while the lock's holder waited for the poll
    thread (a readback), both would hang. Here another thread holds the lock for 5 s."""
    import threading
    import time
    x = up(gpu, np.ones(1000, dtype=np.float32))
    held, done = threading.Event(), threading.Event()

    def hold_the_lock():
        with gpu.device.lock:
            held.set()
            done.wait(5)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    held.wait()
    start = time.monotonic()
    del x  # the buffer's finalizer runs now, in this thread
    elapsed = time.monotonic() - start
    done.set()
    holder.join()
    assert elapsed < 1.0, "handing a buffer back waited %.1f s for the device lock" % elapsed
    assert gpu.memory_stats()["pooled_bytes"] > 0  # and it did reach the pool


def test_run_kernel_launches_a_custom_wgsl_kernel(gpu):
    x = up(gpu, np.arange(5, dtype=np.float32))
    out = gpu.empty((5,), F32)
    wgsl = """
struct Params { v: array<vec4<u32>, 1> }
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  if (gid.x < P.v[0][0]) { y[gid.x] = x[gid.x] * x[gid.x] + 1.0; }
}
"""
    with cn.profile(gpu) as p:
        gpu.run_kernel(("test", "square_plus_one"), lambda: wgsl, [x, out], [5], (1, 1, 1),
                       name="square_plus_one")
    assert gpu.to_flat(out) == [1.0, 2.0, 5.0, 10.0, 17.0]
    assert p.kernel_launches == 1 and p.events[-1]["name"] == "square_plus_one"
