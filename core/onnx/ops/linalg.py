"""ONNX operators: linear algebra."""

import cinders as cn
from ..proto import OnnxError
from .base import op


@op()
def Gemm(A, B, C=None, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    a = A.transpose(0, 1) if transA else A
    b = B.transpose(0, 1) if transB else B
    out = a @ b
    if alpha != 1.0:
        out = out * alpha
    if C is not None:
        out = out + (C * beta if beta != 1.0 else C)
    return out


@op()
def MatMul(A, B):
    return A @ B


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
