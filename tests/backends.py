"""The backends every conformance test runs on: name -> factory.

Add a backend by adding one entry, e.g.
    "wgpu": lambda: cn.Wgpu(),
    "autodiff-numpy": lambda: cn.Autodiff(cn.NumPy()),
    "fusion-wgpu": lambda: cn.Fusion(cn.Wgpu()),
`CINDERS_TEST_BACKENDS=python,numpy` selects a subset; by default every registered backend runs.
A factory that raises makes that backend's tests FAIL (never skip): a missing backend is a bug.
"""

import functools
import os

import cinders as cn

import remote_support

BACKENDS = {
    "python": lambda: cn.Python(),
    "numpy": lambda: cn.NumPy(),
    "autodiff-python": lambda: cn.Autodiff(cn.Python()),
    "autodiff-numpy": lambda: cn.Autodiff(cn.NumPy()),
    # autotune off: tests must not write the on-disk tuning cache (test_wgpu_backend tunes).
    "wgpu": lambda: cn.Wgpu(autotune=False),
    "autodiff-wgpu": lambda: cn.Autodiff(cn.Wgpu(autotune=False)),
    "fusion-wgpu": lambda: cn.Fusion(cn.Wgpu(autotune=False)),
    "autodiff-fusion-wgpu": lambda: cn.Autodiff(cn.Fusion(cn.Wgpu(autotune=False))),
    # WebAssembly SIMD kernels: the tab's .wasm module, run in-process by Wasmtime
    "wasm": lambda: cn.Wasm(engine="wasmtime"),
    "autodiff-wasm": lambda: cn.Autodiff(cn.Wasm(engine="wasmtime")),
    # the same kernel source compiled natively for this CPU (cn.Wasm()'s desktop default)
    "native": lambda: cn.Wasm(engine="native"),
    "autodiff-native": lambda: cn.Autodiff(cn.Wasm(engine="native")),
    # cn.Router: tensors on its first member, on its second, and differentiated on the second
    "router-numpy-python": lambda: cn.Router(cn.NumPy(), cn.Python()),
    "router-numpy-python-device1": lambda: cn.Router(cn.NumPy(), cn.Python()).device(1),
    "autodiff-router-numpy-python-device1": lambda: cn.Autodiff(cn.Router(cn.NumPy(), cn.Python()).device(1)),
    # cn.Remote through `cinders serve-backend`'s server, started on 127.0.0.1 by the tests
    "remote-numpy": lambda: remote_support.remote("numpy"),
    "remote-python": lambda: remote_support.remote("python"),
    "autodiff-remote-numpy": lambda: cn.Autodiff(remote_support.remote("numpy")),
}

# Backends whose float kernels are less exact than float32-rounded libm (GPU exp/erf/...): the
# loosest (rtol, atol) their float results are held to. Others use the suite's defaults.
TOLERANCES = {}

# Backends whose transcendental kernels are bounded absolutely, not in ulps (WGSL; on lavapipe
# log near 1 is 2.7e-8 off, tanh near 0 1.7e-8, exp(-100) flushes to 0): the (rtol, atol) the op
# table's ULP ops are held to there, instead of 2 float32 ulps.
TRANSCENDENTAL_TOLERANCES = {name: (2e-6, 1e-6) for name in
                             ("wgpu", "autodiff-wgpu", "fusion-wgpu", "autodiff-fusion-wgpu")}


def selected_names():
    wanted = os.environ.get("CINDERS_TEST_BACKENDS", "").strip()
    if not wanted:
        return list(BACKENDS)
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ValueError("CINDERS_TEST_BACKENDS names unknown backends %s; registered: %s"
                         % (unknown, ", ".join(BACKENDS)))
    return names


# cn.Wgpu's two layouts of storage dtypes (codegen/packing.py: float16 as array<f16> where the
# adapter has shader-f16, or packed two to a u32 word), plain and under cn.Fusion: the
# storage-dtype tests (test_wgpu_dtypes, test_dtypes_storage) run on each.
STORAGE_LAYOUTS = {"f16": True, "packed": False}


def storage_backend(shader_f16, fused):
    gpu = cn.Wgpu(autotune=False, shader_f16=shader_f16)
    return cn.Fusion(gpu) if fused else gpu


STORAGE_BACKENDS = {prefix + "wgpu-" + layout: functools.partial(storage_backend, flag, fused)
                    for layout, flag in STORAGE_LAYOUTS.items()
                    for prefix, fused in (("", False), ("fusion-", True))}
