"""cn.Wasm()'s desktop engines: the native build of the kernels (the default where clang is
installed), in-process Wasmtime and the Node child process run the same kernel source to the same
numbers; memory accesses are bounds-checked in all of them, and a kernel's stray access is a trap."""

import os
import subprocess

import numpy as np
import pytest

import cinders as cn
import cinders.nn.functional as F
from cinders.models.mnist import MnistCNN
from cinders.wasm import build
from cinders.wasm.engines import (NativeEngine, NodeEngine, WasmEngineError, WasmtimeEngine, default_engine,
                                  engine)


def test_the_desktop_default_is_the_native_build():
    assert isinstance(default_engine(), NativeEngine)  # (clang is installed here: scripts/setup.sh)
    assert cn.Wasm().engine is default_engine() is engine("native")
    assert isinstance(cn.Wasm(engine="wasmtime").engine, WasmtimeEngine)
    with pytest.raises(cn.errors.ArgumentError, match="engines are native, wasmtime, node"):
        cn.Wasm(engine="wasm3")


def _training_step_losses(engine):
    cn.manual_seed(0)
    backend = cn.Autodiff(cn.Wasm(engine=engine))
    model = MnistCNN().to(backend)
    opt = cn.optim.AdamW(lr=1e-3)
    rng = np.random.default_rng(0)
    out = []
    for _ in range(3):
        x = cn.tensor(rng.random((4, 1, 28, 28), dtype=np.float32), backend=backend)
        y = cn.tensor(rng.integers(0, 10, 4).astype(np.int32), backend=backend)
        loss = F.cross_entropy(model(x), y)
        opt.step(model, loss.backward())
        out.append(loss.item())
    return out, model.layers[0].weight.numpy()


def test_node_and_wasmtime_compute_the_same_training_step():
    node, wasmtime = _training_step_losses(NodeEngine()), _training_step_losses(WasmtimeEngine())
    assert node[0] == wasmtime[0]  # the same module: the same bits
    np.testing.assert_array_equal(node[1], wasmtime[1])


def test_native_and_wasmtime_compute_the_same_training_step():
    native, wasmtime = _training_step_losses(NativeEngine()), _training_step_losses(WasmtimeEngine())
    # (not the same bits: the host's libm and fused multiply-adds round differently)
    np.testing.assert_allclose(native[0], wasmtime[0], rtol=1e-5)
    np.testing.assert_allclose(native[1], wasmtime[1], rtol=1e-4, atol=1e-6)


def test_the_native_library_is_built_once_per_source_and_cpu():
    path = build.native_library_path()
    assert path.endswith(".so") and "native" in path
    assert build.native_library_path() == path


@pytest.mark.parametrize("make", [WasmtimeEngine, NativeEngine])
def test_memory_access_out_of_bounds_is_an_error(make):
    engine = make()  # its own memory: no backend's data at the end of it
    size = engine.size
    with pytest.raises(WasmEngineError, match="outside the module's memory"):
        engine.write(size - 2, b"abcd")
    with pytest.raises(WasmEngineError, match="outside the module's memory"):
        engine.read(-1, 4)
    engine.write(size - 4, b"abcd")
    assert engine.read(size - 4, 4) == b"abcd"


@pytest.mark.parametrize("address", [-2**31, -64, 2**31 - 64])
def test_a_native_kernel_out_of_its_memory_traps_and_the_engine_survives(address):
    engine = NativeEngine()
    with pytest.raises(WasmEngineError, match="fill_32 failed: memory access out of bounds"):
        engine.call("fill_32", address, 4096, 0)  # past the committed pages, into the guards
    with pytest.raises(WasmEngineError, match="gather_f32 failed: memory access out of bounds"):
        engine.call("gather_f32", address, 0, 0, 0, 1, 1)  # its descriptor out there
    backend = cn.Wasm(engine=engine)
    x = cn.tensor([[1.0, 2.0, 3.0]], backend=backend)
    assert (x + 1).tolist() == [[2.0, 3.0, 4.0]]
    with pytest.raises(cn.errors.IndexingError, match="index 3 is out of bounds"):
        x.gather(1, cn.tensor([[0, 3]], backend=backend))


def test_native_memory_grows_in_place_up_to_4_gib():
    engine = NativeEngine()
    base, pages = engine.base, engine.call("memory_pages")
    assert engine.call("memory_grow", 64) == pages
    assert engine.call("memory_pages") == pages + 64 and engine.base == base
    engine.memory_grown()
    engine.write(engine.size - 4, b"wxyz")
    assert engine.read(engine.size - 4, 4) == b"wxyz"
    assert engine.call("memory_grow", 65536) == -1  # past wasm32's 4 GiB, as the module refuses


@pytest.mark.parametrize("transposed", [False, True])
def test_native_matmul_tiles_and_their_edges_match_numpy(transposed):
    # native.h's tiles: 6/4/2/1 rows, 16/8/4 columns and a zero-padded last 1-3; K in 8s and a tail
    backend = cn.Wasm(engine="native")
    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 5, 6, 7, 13):
        for n in (1, 2, 3, 4, 5, 8, 11, 16, 19, 37):
            for k in (1, 7, 8, 9, 33):
                a = rng.standard_normal((m, k)).astype(np.float32)
                b = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
                x, y = cn.tensor(a, backend=backend), cn.tensor(b, backend=backend)
                got = (x @ y.T if transposed else x @ y).numpy()
                want = a.astype(np.float64) @ (b.T if transposed else b).astype(np.float64)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k),
                                           err_msg="m=%d n=%d k=%d" % (m, n, k))


# WebAssembly's semantics of each SIMD128 intrinsic native.h stands in for (the tab's int8 and
# float kernels use them; a wrong lane rule would be a silently wrong number only on the desktop)
SHIM_CHECKS = r"""
#include <stdio.h>
#include <math.h>
void run_commands(const int *c, int n) {}
int main(void) {
    int bad = 0;
    v128_t a = (v128_t)(f32x4){NAN, -0.0f, 2.5f, -3.5f}, b = (v128_t)(f32x4){1.0f, 0.0f, 1.0f, 5.0f};
    f32x4 mx = (f32x4)wasm_f32x4_max(a, b), mn = (f32x4)wasm_f32x4_min(a, b), nr = (f32x4)wasm_f32x4_nearest(a);
    bad |= !(mx[0] != mx[0] && mx[1] == 0 && !signbit(mx[1]) && mx[2] == 2.5f && mx[3] == 5.0f);
    bad |= !(mn[0] != mn[0] && mn[1] == 0 && signbit(mn[1]) && mn[2] == 1.0f && mn[3] == -3.5f);
    bad |= !(nr[2] == 2.0f && nr[3] == -4.0f);
    v128_t t = wasm_i32x4_trunc_sat_f32x4((v128_t)(f32x4){NAN, 3e9f, -3e9f, -2.7f});
    bad |= !(t[0] == 0 && t[1] == INT32_MAX && t[2] == INT32_MIN && t[3] == -2);
    i16x8 n = (i16x8)wasm_i16x8_narrow_i32x4((v128_t){40000, -40000, 5, -5}, (v128_t){1, 2, 32767, -32768});
    bad |= !(n[0] == 32767 && n[1] == -32768 && n[2] == 5 && n[3] == -5 && n[4] == 1 && n[6] == 32767 && n[7] == -32768);
    signed char bytes[8] = {-1, 2, -128, 127, 0, 5, -6, 7};
    i16x8 s8 = (i16x8)wasm_i16x8_load8x8(bytes), u8v = (i16x8)wasm_u16x8_load8x8(bytes);
    bad |= !(s8[0] == -1 && s8[2] == -128 && u8v[0] == 255 && u8v[2] == 128 && u8v[3] == 127);
    i16x8 d = (i16x8)wasm_i16x8_sub((v128_t)(i16x8){-32768, 1, 2, 3, 4, 5, 6, 7}, (v128_t)(i16x8){1, 1, 1, 1, 1, 1, 1, 1});
    bad |= !(d[0] == 32767 && d[1] == 0);
    v128_t lo = (v128_t)(i16x8){0,1,2,3,4,5,6,7}, hi = (v128_t)(i16x8){8,9,10,11,12,13,14,15};
    i16x8 sh = (i16x8)wasm_i16x8_shuffle(lo, hi, 0, 8, 1, 9, 2, 10, 3, 11);
    bad |= !(sh[0] == 0 && sh[1] == 8 && sh[2] == 1 && sh[7] == 11);
    v128_t dot = wasm_i32x4_dot_i16x8((v128_t)(i16x8){1, 2, 3, 4, -5, 6, 7, 8}, (v128_t)(i16x8){10, 20, 30, 40, 50, 60, 70, 80});
    bad |= !(dot[0] == 50 && dot[1] == 250 && dot[2] == 110 && dot[3] == 1130);
    v128_t ia = wasm_i32x4_add((v128_t){INT32_MAX, 1, 2, 3}, wasm_i32x4_splat(1));
    bad |= !(ia[0] == INT32_MIN && ia[3] == 4);
    f32x4 dv = (f32x4)wasm_f32x4_div(b, (v128_t)(f32x4){2, 2, 2, 2});
    bad |= !(dv[0] == 0.5f && dv[3] == 2.5f && wasm_f32x4_extract_lane(wasm_f32x4_splat(3.0f), 2) == 3.0f);
    printf(bad ? "FAIL\n" : "ok\n");
    return bad;
}"""


def test_native_simd128_shims_keep_webassemblys_lane_rules(tmp_path):
    source = tmp_path / "shims.c"
    source.write_text(open(os.path.join(os.path.dirname(build.__file__), "native.h")).read() + SHIM_CHECKS)
    done = subprocess.run(["clang", "-O2", "-march=native", "-std=gnu11", "-Wno-unused-function", "-o",
                           str(tmp_path / "shims"), str(source), "-lm"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ran = subprocess.run([str(tmp_path / "shims")], capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (0, "ok\n")
