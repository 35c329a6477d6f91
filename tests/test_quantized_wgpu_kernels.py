"""cn.Wgpu's quantized and half-precision convolutions on its conv kernels (issue 28): the direct
and the register-tiled forward kernels read an int8/uint8 weight from its packed words (or a
float16 one, in both storage layouts) and dequantize it as they stage it; an integer image sums
exactly in i32, a QDQ activation in f32. No unfold2d, no matmul, no float32 copy of the weight.
Both kernel kinds are forced on lavapipe (a CPU adapter, which runs only the direct kernel).
Integer results equal cn.NumPy()'s conv2d_quantized (tests/test_onnx_quant.py holds that to
onnxruntime); float results are held to 1e-4 of the output's largest magnitude."""

import logging
import warnings

import numpy as np
import pytest

import cinders as cn
from cinders.onnx import load

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from test_quantized_conv import SHAPE, VARIANTS, cnn  # noqa: E402,F401  (cnn: onnxruntime's quantized CNNs)
from test_quantized_weights import _kernels_run, _resident_bytes  # noqa: E402

RNG = np.random.default_rng(2028)


@pytest.fixture(scope="module")
def gpus():
    """cn.Wgpu with float16 as array<f16> (lavapipe has shader-f16) and packed two to a word
    (8-bit values are packed four to a word in both)."""
    return {"f16": cn.Wgpu(autotune=False), "packed": cn.Wgpu(autotune=False, shader_f16=False)}


@pytest.fixture(params=["direct", "reg"])
def kind(request, monkeypatch):
    """The conv kernel kind the test forces where the product allows it (the tiled kernel needs
    8 output channels a group and 16 deep sums, conv.kernel_kind)."""
    from cinders.wgpu import conv as wgpu_conv
    choose = wgpu_conv.kernel_kind
    monkeypatch.setattr(wgpu_conv, "kernel_kind", lambda og, k, cpu: choose(og, k, request.param == "direct"))
    return request.param


# name: (N, C, image, O, kernel, stride, padding ((top, bottom), (left, right)), dilation, groups,
#        weight dtype, per-channel scale/zero point, weight held as a permuted view)
CASES = {
    "3x3 pad 1": (2, 8, (9, 9), 16, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "int8", True, False),
    "stem 5x5 stride 2, K=75": (1, 3, (13, 11), 16, (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1), 1, "uint8", False, False),
    "grouped asymmetric pads": (1, 16, (8, 7), 32, (3, 3), (2, 1), ((1, 0), (0, 2)), (1, 1), 2, "uint8", True, False),
    "depthwise dilated": (1, 12, (11, 9), 12, (3, 3), (1, 2), ((2, 2), (2, 2)), (2, 1), 12, "int8", True, False),
    "1x1 K=24": (2, 24, (5, 6), 24, (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, "int8", False, False),
    "strided weight view": (1, 8, (7, 7), 16, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "uint8", True, True),
    "long sum K=2700": (1, 300, (3, 4), 8, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "int8", True, False),
}
MODES = ["integer", "qdq", "half"]   # (the weight dtype matters only to the first two)


def _case(name, mode):
    n, c, image, o, kernel, stride, padding, dilation, groups, wtype, per_channel, view = CASES[name]
    lo, hi = (-128, 127) if wtype == "int8" else (0, 255)
    q = RNG.integers(lo, hi + 1, (o, c // groups) + kernel).astype(wtype)
    zp = RNG.integers(lo, hi + 1, o if per_channel else 1).astype(wtype)
    scale = RNG.uniform(0.001, 0.01, o if per_channel else 1).astype(np.float32)
    bias = RNG.standard_normal(o).astype(np.float32)
    if mode == "integer":   # uint8 image minus its zero point: exact int32 sums
        x, x_param = RNG.integers(0, 256, (n, c) + image).astype(np.int32), np.array(131, np.int32)
        return x, x_param, q, None, zp, None
    if mode == "qdq":       # a QDQ activation: int8 values times their scale
        x_scale = np.float32(0.03)
        x = (RNG.integers(-128, 128, (n, c) + image) * x_scale).astype(np.float32)
        return x, np.array(x_scale), q, scale, zp, bias
    x = RNG.standard_normal((n, c) + image).astype(np.float32)
    return x, None, RNG.standard_normal(q.shape).astype(np.float16), None, None, bias


def _conv(backend, name, arrays):
    """conv2d_quantized on `backend` (the weight as a permuted view where the case says)."""
    x, x_param, q, scale, zp, bias = arrays
    stride, padding, dilation, groups, view = CASES[name][5:9] + CASES[name][11:]
    put = lambda a, dtype=None: None if a is None else cn.tensor(a, backend=backend, dtype=dtype)  # noqa: E731
    qdtype = getattr(cn, q.dtype.name)
    if view:   # held (O, kh, kw, C/G) and permuted back: no weight row is contiguous
        w = put(np.ascontiguousarray(q.transpose(0, 2, 3, 1)), qdtype).permute(0, 3, 1, 2)
    else:
        w = put(q, qdtype)
    handles = [put(x, cn.int32 if x.dtype == np.int32 else None), put(x_param, cn.int32 if x.dtype == np.int32 else None),
               w, put(scale), put(zp, None if zp is None else qdtype), put(bias)]
    handles = [None if t is None else t.handle for t in handles]
    out = backend.conv2d_quantized(*handles, stride, padding, dilation, groups)
    return cn.Tensor(backend, out, backend.shape(out), cn.int32 if x.dtype == np.int32 and scale is None
                     else cn.float32).numpy()


def _torch_half(name, arrays):
    """The half case's convolution in float64 (torch) of the widened weight, + bias."""
    import torch
    x, _, q, _, _, bias = arrays
    stride, ((pt, pb), (pl, pr)), dilation, groups = CASES[name][5:9]
    xp = torch.nn.functional.pad(torch.from_numpy(x).double(), (pl, pr, pt, pb))
    return torch.nn.functional.conv2d(xp, torch.from_numpy(q.astype(np.float64)), torch.from_numpy(bias).double(),
                                      stride, 0, dilation, groups).numpy()


@pytest.mark.parametrize("name,mode,layout", [(name, mode, layout) for name in CASES for mode in MODES
                                              for layout in (("f16", "packed") if mode == "half" else ("f16",))])
def test_quantized_conv_on_both_kernels(gpus, kind, monkeypatch, name, mode, layout):
    gpu = gpus[layout]
    arrays = _case(name, mode)
    got, names = _kernels_run(gpu, monkeypatch, lambda: _conv(gpu, name, arrays))
    convs = [n for n in names if n.startswith("conv2d_q")]
    assert len(convs) == 1 and names == convs, names   # one launch: no unfold2d, matmul or copy
    n, c, _, o, kernel, *_, groups = CASES[name][:9]
    tiled = kind == "reg" and o // groups >= 8 and c // groups * kernel[0] * kernel[1] >= 16
    assert ("_reg_" in convs[0]) == tiled, convs
    if mode == "half":
        want = _torch_half(name, arrays)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        return
    want = _conv(cn.NumPy(), name, arrays)
    assert got.dtype == want.dtype and got.shape == want.shape
    if mode == "integer":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
