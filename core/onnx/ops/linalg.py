"""ONNX operators: linear algebra.

A half model's weights (float16 initializers that only MatMul/Gemm/Conv read as their weight,
kept float16 by cinders.onnx where the backend declares `quantized_matmul`) are multiplied in
the backend's matmul_quantized kernel, which widens each value as it reads it (`half_product`):
the model holds them at 2 bytes a value and no op makes a float32 copy of one."""

import cinders as cn
from ...backend import QuantizedLayout
from ...dtypes import float16, float32
from ...tensor import Tensor
from ..proto import OnnxError
from .base import op


def half_weight(w, a):
    """True where w is a float16 weight that a's backend multiplies without widening it."""
    return w.dtype is float16 and a.dtype is float32 and w.backend is a.backend \
        and a.backend.quantized_matmul


def widened(w):
    """A weight as float32: a float16 one that a backend cannot multiply as such (cn.Python
    running a record that `cinders import-onnx` wrote with float16 weights) is widened per call."""
    return w.cast(float32) if w.dtype is float16 else w


def half_product(a, w, transposed=False):
    """a (..., K) @ W (W^T where transposed) for a float16 weight W (half_weight), read and
    widened inside the backend's matmul_quantized (core/backend.py)."""
    rows, cols = w.shape
    k, n = (cols, rows) if transposed else (rows, cols)
    flat = a.reshape((-1, k))
    layout = QuantizedLayout(k, n, 16, k, (0, 1, k) if transposed else (0, n, 1))
    out = a.backend.matmul_quantized(flat.handle, w.reshape((-1,)).handle, None, None, layout)
    return Tensor(a.backend, out, (flat.shape[0], n), float32).reshape(a.shape[:-1] + (n,))


@op()
def Gemm(A, B, C=None, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    a = A.transpose(0, 1) if transA else A
    if half_weight(B, a):
        out = half_product(a, B, transB)
    else:
        out = a @ widened(B.transpose(0, 1) if transB else B)
    if alpha != 1.0:
        out = out * alpha
    if C is not None:
        out = out + (C * beta if beta != 1.0 else C)
    return out


@op()
def MatMul(A, B):
    return half_product(A, B) if B.ndim == 2 and half_weight(B, A) else A @ widened(B)


@op()
def Einsum(*Inputs, equation):
    lhs, _, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if "." in equation:
        raise OnnxError("Einsum: ellipsis is not supported (%r)" % (equation,))
    if not _:
        counts = {}
        for t in terms:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        rhs = "".join(sorted(ch for ch, n in counts.items() if n == 1))
    letters = []
    for t in terms:
        for ch in t:
            if ch not in letters:
                letters.append(ch)
    sizes = {}
    product = None
    for term, x in zip(terms, Inputs):
        if len(set(term)) != len(term):
            x, term = _diagonal(x, term)
        for ch, n in zip(term, x.shape):
            sizes[ch] = max(sizes.get(ch, 1), n)
        order = sorted(range(len(term)), key=lambda i: letters.index(term[i]))
        x = x.permute(tuple(order)) if order else x
        placed = [ch for ch in letters if ch in term]
        shape = [x.shape[placed.index(ch)] if ch in term else 1 for ch in letters]
        x = x.reshape(tuple(shape))
        product = x if product is None else product * x
    summed = tuple(i for i, ch in enumerate(letters) if ch not in rhs)
    out = product.sum(summed) if summed else product
    kept = [ch for ch in letters if ch in rhs]
    return out.permute(tuple(kept.index(ch) for ch in rhs)) if rhs else out


def _diagonal(x, term):
    """Collapse repeated letters of one einsum term into one axis (the diagonal)."""
    while len(set(term)) != len(term):
        for i, ch in enumerate(term):
            j = term.find(ch, i + 1)
            if j >= 0:
                break
        n = x.shape[i]
        eye = cn.eye(n, backend=x.backend, dtype=x.dtype).reshape(
            [n if d in (i, j) else 1 for d in range(x.ndim)])
        x = (x * eye).sum(j)
        term = term[:j] + term[j + 1:]
    return x, term
