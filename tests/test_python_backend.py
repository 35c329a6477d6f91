"""cn.Python() at the protocol level, differentially against cn.NumPy() (the reference backend).

Every primitive and every op name of core/backend.py is run on both backends with the same
inputs (random values plus the edge values where IEEE and Python disagree: nan, inf, signed
zeros, division by zero, int32 overflow) and the results must agree: exactly where float32
rounding of a correctly rounded double result is exact (+ - * / sqrt, movement, indexing...),
within a few float32 ulps where libm and NumPy's float32 kernels may differ (the op table's ULP
and ACCUMULATED ops: exp, log, pow, sums in a different order...).
"""

import math
import random
from array import array

import numpy as np
import pytest

from cinders import dtypes
from cinders.backend import BINARY_OPS, COMPARISON_OPS, PRIMITIVES, REDUCE_OPS, UNARY_OPS, reference_random
from cinders.backends.numpy_backend import NumPy
from cinders.backends.python_backend import Python
from cinders.ops import EXACT, FLOAT, OPS

P, N = Python(), NumPy()
F32, I32, BOOL = dtypes.float32, dtypes.int32, dtypes.bool_
NP_DTYPE = {F32: np.float32, I32: np.int32, BOOL: np.bool_}
INF, NAN = math.inf, math.nan
FLOAT_EDGES = [NAN, INF, -INF, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 3.0, -7.0,
               1e-30, 100.0, -100.0, 88.8, 1e30, -3e38]
INT_EDGES = [0, 1, -1, 2, -2, 7, -7, 2147483647, -2147483648, 1000, -65536]


def may_differ(op):
    """Whether the op table lets libm-in-double-then-rounded and NumPy's kernels differ."""
    return OPS[op].exactness != EXACT


def both(values, shape, dtype):
    return P.from_flat(values, shape, dtype), N.from_flat(values, shape, dtype)


def assert_same(ph, nh, approx=False):
    """Python result ph equals NumPy result nh: shape, dtype and values (nan == nan)."""
    assert P.shape(ph) == N.shape(nh)
    assert P.dtype(ph) is N.dtype(nh)
    got = np.array(P.to_flat(ph), dtype=NP_DTYPE[P.dtype(ph)]).reshape(P.shape(ph))
    want = np.asarray(nh)
    if approx:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, equal_nan=True)
        return
    np.testing.assert_array_equal(got, want)
    if got.dtype == np.float32:  # signed zeros too (floor(-0.5) is -0.0); a nan's sign is free
        number = ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got[number]), np.signbit(want[number]))


def rand_floats(rng, n, edges=True):
    values = [rng.uniform(-10, 10) for _ in range(n)]
    if edges:
        values[:len(FLOAT_EDGES)] = FLOAT_EDGES[:n]
    return values


def test_every_primitive_is_implemented():
    assert [name for name in PRIMITIVES if not callable(vars(Python).get(name))] == []
    assert P.name == "python" and P == Python() and P != N


# -- creation / reading ------------------------------------------------------------------------

def test_from_flat_to_flat_types():
    assert P.to_flat(P.from_flat([1.5, 2, True], (3,), F32)) == [1.5, 2.0, 1.0]
    ints = P.to_flat(P.from_flat([1, -2, 3], (3,), I32))
    assert ints == [1, -2, 3] and all(type(v) is int for v in ints)
    bools = P.to_flat(P.from_flat([0, 2, 0.5, NAN], (2, 2), BOOL))
    assert bools == [False, True, True, True] and all(type(v) is bool for v in bools)
    assert P.to_flat(P.from_flat([0.1], (), F32)) == [float(np.float32(0.1))]
    assert P.to_flat(P.from_flat([1e300, -1e300], (2,), F32)) == [INF, -INF]
    assert_same(*both([2.7, -2.7, 0.5], (3,), I32))  # floats given for int32 truncate
    with pytest.raises(OverflowError, match="int32"):
        P.from_flat([2 ** 40], (1,), I32)
    assert P.shape(P.from_flat([], (0, 3), F32)) == (0, 3)


@pytest.mark.parametrize("dtype,value", [(F32, -1.25), (F32, INF), (I32, 7), (I32, 2.9), (BOOL, True),
                                         (BOOL, 0)])
def test_full(dtype, value):
    assert_same(P.full((2, 3), value, dtype), N.full((2, 3), value, dtype))
    assert P.shape(P.full((0, 4), value, dtype)) == (0, 4)


@pytest.mark.parametrize("distribution", ["uniform", "normal"])
@pytest.mark.parametrize("seed", [0, 1, 12345, 2 ** 32 + 7, 2 ** 40 + 3])
def test_random_is_the_reference_generator(distribution, seed):
    h = P.random((3, 7), distribution, seed, F32)
    assert P.shape(h) == (3, 7) and P.dtype(h) is F32
    want = array("f", reference_random(21, distribution, seed)).tolist()  # float32-rounded
    assert P.to_flat(h) == want
    assert_same(h, N.random((3, 7), distribution, seed, F32))


def test_random_statistics():
    u = P.to_flat(P.random((4000,), "uniform", 5, F32))
    assert 0.0 <= min(u) and max(u) < 1.0 and abs(sum(u) / len(u) - 0.5) < 0.02
    z = P.to_flat(P.random((4000,), "normal", 5, F32))
    mean = sum(z) / len(z)
    assert abs(mean) < 0.05 and abs(sum((v - mean) ** 2 for v in z) / len(z) - 1.0) < 0.08


# -- elementwise -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", UNARY_OPS)
def test_unary_float(op):
    values = rand_floats(random.Random(1), 40)
    p, n = both(values, (5, 8), F32)
    assert_same(P.unary(op, p), N.unary(op, n), approx=may_differ(op))


def test_numpy_erf_is_within_one_ulp_of_libm_everywhere():
    # NumPy has no erf: cn.NumPy() evaluates its own polynomials. Every 397th float32 from 0 to
    # past 4 (where erf rounds to 1), both signs, against math.erf rounded once (cn.Python()).
    magnitudes = np.arange(0, np.float32(4.5).view(np.int32), 397, dtype=np.int32).view(np.float32)
    values = np.concatenate([magnitudes, -magnitudes, [INF, -INF, NAN, -0.0]]).astype(np.float32).tolist()
    p, n = both(values, (len(values),), F32)
    got, want = np.asarray(N.unary("erf", n)), np.array(P.to_flat(P.unary("erf", p)), np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulps[~np.isnan(want)].max() <= 1 and np.isnan(got[np.isnan(want)]).all()
    assert np.signbit(got[-1]) and (ulps[:len(magnitudes)] == 0).mean() > 0.99


@pytest.mark.parametrize("op", [op for op in UNARY_OPS if OPS[op].rule != FLOAT])  # int kernels
def test_unary_int(op):
    p, n = both(INT_EDGES + [random.Random(2).randint(-99, 99) for _ in range(5)], (16,), I32)
    assert_same(P.unary(op, p), N.unary(op, n))


def test_unary_bool_logical_not():
    assert_same(P.unary("logical_not", P.from_flat([1, 0, 1], (3,), BOOL)),
                N.unary("logical_not", N.from_flat([1, 0, 1], (3,), BOOL)))


def test_unary_float_math_on_int_keeps_dtype():
    h = P.unary("sqrt", P.from_flat([0, 4, 10], (3,), I32))
    assert P.dtype(h) is I32 and P.to_flat(h) == [0, 2, 3]


def edge_pairs(edges):
    pairs = [(x, y) for x in edges for y in edges]
    return [x for x, _ in pairs], [y for _, y in pairs]


@pytest.mark.parametrize("op", BINARY_OPS)
def test_binary_float_edges(op):
    xs, ys = edge_pairs(FLOAT_EDGES)
    rng = random.Random(3)
    xs += rand_floats(rng, 50, edges=False)
    ys += [rng.choice([rng.uniform(-4, 4), float(rng.randint(-3, 3))]) for _ in range(50)]
    (pa, na), (pb, nb) = both(xs, (len(xs),), F32), both(ys, (len(ys),), F32)
    assert_same(P.binary(op, pa, pb), N.binary(op, na, nb), approx=may_differ(op))


@pytest.mark.parametrize("op", [op for op in BINARY_OPS if OPS[op].rule != FLOAT])
def test_binary_int_edges(op):
    xs, ys = edge_pairs(INT_EDGES)  # includes x // 0, x % 0 (-> 0) and int32 overflow (wraps)
    (pa, na), (pb, nb) = both(xs, (len(xs),), I32), both(ys, (len(ys),), I32)
    assert_same(P.binary(op, pa, pb), N.binary(op, na, nb))


def test_binary_int_div_and_pow():
    rng = random.Random(4)
    xs = [rng.randint(-50, 50) for _ in range(60)]
    ys = [rng.choice([-7, -3, -1, 1, 2, 5]) for _ in range(60)]
    (pa, na), (pb, nb) = both(xs, (60,), I32), both(ys, (60,), I32)
    assert_same(P.binary("div", pa, pb), N.binary("div", na, nb))
    (pe, ne) = both([rng.randint(0, 12) for _ in range(60)], (60,), I32)
    assert_same(P.binary("pow", pa, pe), N.binary("pow", na, ne))  # wraps like int32
    big = P.binary("pow", P.from_flat([3, 1, -1, 2], (4,), I32), P.from_flat([40, -5, -3, -1], (4,), I32))
    assert P.to_flat(big) == [int(np.int32(np.uint32(3 ** 40 % 2 ** 32))), 1, -1, 0]


@pytest.mark.parametrize("op", ["add", "mul", "maximum", "minimum", "logical_and", "logical_or"]
                         + list(COMPARISON_OPS))
def test_binary_bool(op):
    xs, ys = edge_pairs([0, 1])
    (pa, na), (pb, nb) = both(xs, (4,), BOOL), both(ys, (4,), BOOL)
    assert_same(P.binary(op, pa, pb), N.binary(op, na, nb))


BROADCASTS = [((2, 3), (1, 3)), ((2, 1), (1, 3)), ((1, 1), (2, 3)), ((2, 3), (1, 1)),
              ((4, 1, 3), (1, 2, 1)), ((0, 3), (1, 3)), ((2, 0), (2, 1)), ((1, 0), (3, 1)),
              ((), ()), ((3,), (3,))]


@pytest.mark.parametrize("sa,sb", BROADCASTS)
@pytest.mark.parametrize("op", ["sub", "div", "maximum", "lt"])
def test_binary_broadcasting(sa, sb, op):
    rng = random.Random(5)
    pa, na = both(rand_floats(rng, math.prod(sa), edges=False), sa, F32)
    pb, nb = both(rand_floats(rng, math.prod(sb), edges=False), sb, F32)
    assert_same(P.binary(op, pa, pb), N.binary(op, na, nb))
    assert_same(P.binary(op, pb, pa), N.binary(op, nb, na))


@pytest.mark.parametrize("sc,sa,sb", [((2, 3), (2, 3), (2, 3)), ((2, 1), (1, 3), ()),
                                      ((1, 3), (2, 1), (1, 1)), ((0, 2), (1, 2), (1, 1))])
@pytest.mark.parametrize("dtype", [F32, I32, BOOL])
def test_where(sc, sa, sb, dtype):
    sb = sb or (1,) * len(sa)
    rng = random.Random(6)
    pc, nc = both([rng.randint(0, 1) for _ in range(math.prod(sc))], sc, BOOL)
    pa, na = both([rng.randint(-9, 9) for _ in range(math.prod(sa))], sa, dtype)
    pb, nb = both([rng.randint(-9, 9) for _ in range(math.prod(sb))], sb, dtype)
    assert_same(P.where(pc, pa, pb), N.where(nc, na, nb))


@pytest.mark.parametrize("src", [F32, I32, BOOL])
@pytest.mark.parametrize("dst", [F32, I32, BOOL])
def test_cast(src, dst):
    values = {F32: FLOAT_EDGES + [3e9, -3e9, 2147483520.0, -0.9, 16777217.0],
              I32: INT_EDGES + [16777217], BOOL: [0, 1, 1, 0]}[src]
    p, n = both(values, (len(values),), src)
    assert_same(P.cast(p, dst), N.cast(n, dst))


# -- reductions --------------------------------------------------------------------------------

@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_float(op, axis, keepdim):
    rng = random.Random(7)
    values = [rng.choice([rng.uniform(-3, 3), float(rng.randint(-2, 2))]) for _ in range(60)]
    values[5], values[17], values[40] = NAN, INF, -INF  # nan propagates in max/min/argmax
    p, n = both(values, (3, 4, 5), F32)
    assert_same(P.reduce(op, p, axis, keepdim), N.reduce(op, n, axis, keepdim),
                approx=may_differ(op))


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", [I32, BOOL])
def test_reduce_int_bool(op, dtype):
    rng = random.Random(8)
    lo = 0 if dtype is BOOL else -3
    p, n = both([rng.randint(lo, 1 if dtype is BOOL else 3) for _ in range(24)], (2, 3, 4), dtype)
    for axis in (0, 1, 2):
        assert_same(P.reduce(op, p, axis, False), N.reduce(op, n, axis, False))


def test_reduce_ties_first_occurrence_and_overflow_wraps():
    p, n = both([1.0, 3.0, 3.0, -1.0, -1.0, 0.0], (2, 3), F32)
    for op in ("argmax", "argmin"):
        assert_same(P.reduce(op, p, 1, False), N.reduce(op, n, 1, False))
    p, n = both([2147483647, 1, 65536, 65536], (2, 2), I32)
    for op in ("sum", "prod"):
        assert_same(P.reduce(op, p, 1, False), N.reduce(op, n, 1, False))


@pytest.mark.parametrize("shape,axis", [((2, 0, 3), 1), ((0, 3), 1), ((3, 0), 1), ((0,), 0)])
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_reduce_empty(shape, axis, op):
    p, n = both([], shape, F32)
    assert_same(P.reduce(op, p, axis, True), N.reduce(op, n, axis, True))
    assert_same(P.reduce(op, p, axis, False), N.reduce(op, n, axis, False))


# -- matmul ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((1, 7), (7, 1)), ((2, 3, 4), (2, 4, 2)),
                                   ((2, 3, 4), (1, 4, 2)), ((1, 3, 4), (3, 4, 2)),
                                   ((2, 1, 2, 3), (1, 3, 3, 2)), ((3, 0), (0, 2)), ((0, 3), (3, 2)),
                                   ((2, 3), (3, 0)), ((3, 16), (16, 2)), ((2, 17), (17, 3)),
                                   ((1, 2, 40), (2, 40, 3))])
def test_matmul(sa, sb):
    rng = random.Random(9)
    pa, na = both(rand_floats(rng, math.prod(sa), edges=False), sa, F32)
    pb, nb = both(rand_floats(rng, math.prod(sb), edges=False), sb, F32)
    got = P.matmul(pa, pb)
    assert P.shape(got) == N.shape(N.matmul(na, nb)) and P.dtype(got) is F32
    # Python accumulates in double, NumPy's sgemm in float32: compare both with the exact result.
    exact = np.matmul(na.astype(np.float64), nb.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(np.array(P.to_flat(got), np.float32).reshape(exact.shape), exact,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sa,sw", [((3, 4), (5, 4)), ((2, 3, 4), (2, 5, 4)), ((2, 3, 4), (1, 5, 4)),
                                   ((2, 0), (3, 0)), ((1, 1, 3), (2, 1, 3)), ((3, 30), (4, 30))])
def test_matmul_with_a_transposed_operand(sa, sw):
    """x @ w^T (every Linear layer) reads w's rows directly; the transpose stays correct for
    every other reader too, and transposing back gives w again."""
    rng = random.Random(13)
    pa, na = both(rand_floats(rng, math.prod(sa), edges=False), sa, F32)
    pw, nw = both(rand_floats(rng, math.prod(sw), edges=False), sw, F32)
    swap = tuple(range(len(sw) - 2)) + (len(sw) - 1, len(sw) - 2)
    pt, nt = P.permute(pw, swap), N.permute(nw, swap)
    for _ in range(2):  # the second product reuses the cached rows
        got = np.array(P.to_flat(P.matmul(pa, pt)), np.float32)
        exact = np.matmul(na.astype(np.float64), nt.astype(np.float64)).astype(np.float32)
        np.testing.assert_allclose(got.reshape(exact.shape), exact, rtol=1e-6, atol=1e-6)
    assert_same(P.binary("mul", pt, pt), N.binary("mul", nt, nt))
    assert_same(P.reshape(pt, (math.prod(sw),)), N.reshape(nt, (math.prod(sw),)))
    assert_same(P.permute(pt, swap), nw)
    assert_same(pt, nt)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_matmul_inf_nan():
    pa, na = both([1.0, INF, NAN, 2.0], (2, 2), F32)
    pb, nb = both([1.0, 0.0, 1.0, 1.0], (2, 2), F32)
    assert_same(P.matmul(pa, pb), N.matmul(na, nb))


# -- movement ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, I32, BOOL])
def test_movement(dtype):
    rng = random.Random(10)
    p, n = both([rng.randint(-5, 5) for _ in range(24)], (2, 3, 4), dtype)
    assert_same(P.reshape(p, (4, 6)), N.reshape(n, (4, 6)))
    assert_same(P.reshape(p, (24,)), N.reshape(n, (24,)))
    for dims in [(0, 1, 2), (2, 0, 1), (1, 2, 0), (2, 1, 0), (0, 2, 1)]:
        assert_same(P.permute(p, dims), N.permute(n, dims))
    pe, ne = both([1, 0, 3], (3, 1), dtype)
    assert_same(P.expand(pe, (3, 4)), N.expand(ne, (3, 4)))
    pe, ne = both([1], (1, 1), dtype)
    assert_same(P.expand(pe, (2, 3)), N.expand(ne, (2, 3)))
    assert_same(P.expand(p, (2, 3, 4)), N.expand(n, (2, 3, 4)))
    for starts, stops, steps in [((0, 0, 0), (2, 3, 4), (1, 1, 1)), ((1, 0, 1), (2, 3, 4), (1, 2, 2)),
                                 ((0, 1, 3), (2, 1, 4), (1, 1, 1)), ((0, 0, 0), (2, 3, 4), (3, 5, 3))]:
        assert_same(P.slice(p, starts, stops, steps), N.slice(n, starts, stops, steps))
    q, m = both([rng.randint(-5, 5) for _ in range(12)], (2, 3, 2), dtype)
    for axis, (px, nx) in [(2, (q, m)), (0, both([7] * 12, (1, 3, 4), dtype)),
                           (1, both([], (2, 0, 4), dtype))]:
        if axis == 2:
            assert_same(P.cat([p, px, p], 2), N.cat([n, nx, n], 2))
        else:
            assert_same(P.cat([p, px], axis), N.cat([n, nx], axis))
    for pads in [((0, 0), (1, 2), (0, 3)), ((2, 1), (0, 0), (1, 1)), ((0, 0), (0, 0), (0, 0))]:
        assert_same(P.pad(p, pads, 1), N.pad(n, pads, 1))


def test_pad_float_value_and_empty():
    p, n = both([1.0, 2.0], (1, 2), F32)
    assert_same(P.pad(p, ((1, 0), (2, 1)), -INF), N.pad(n, ((1, 0), (2, 1)), -INF))
    p, n = both([], (0, 2), F32)
    assert_same(P.pad(p, ((1, 1), (0, 1)), 5.0), N.pad(n, ((1, 1), (0, 1)), 5.0))


def test_movement_results_do_not_alias_their_input():
    p = P.from_flat([1.0, 2.0, 3.0, 4.0], (2, 2), F32)
    idx = P.from_flat([0, 0, 1, 0], (2, 2), I32)
    P.scatter_add(p, 0, idx, P.full((2, 2), 10.0, F32))
    assert P.to_flat(p) == [1.0, 2.0, 3.0, 4.0]


# -- indexing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("index_shape", [(2, 3, 4), (1, 2, 3)])
def test_gather_scatter_add(axis, index_shape):
    rng = random.Random(11 + axis)
    x_shape = (2, 3, 4)
    p, n = both(rand_floats(rng, 24, edges=False), x_shape, F32)
    ishape = list(index_shape)
    ishape[axis] = 5  # along the axis the index may be longer than x
    pi, ni = both([rng.randrange(x_shape[axis]) for _ in range(math.prod(ishape))], tuple(ishape), I32)
    assert_same(P.gather(p, axis, pi), N.gather(n, axis, ni))
    src_shape = tuple(d + 1 for d in ishape)  # src may be larger than index
    ps, ns = both(rand_floats(rng, math.prod(src_shape), edges=False), src_shape, F32)
    assert_same(P.scatter_add(p, axis, pi, ps), N.scatter_add(n, axis, ni, ns))
    pint, nint = both([rng.randint(-9, 9) for _ in range(24)], x_shape, I32)
    psi, nsi = both([rng.randint(-9, 9) for _ in range(math.prod(src_shape))], src_shape, I32)
    assert_same(P.gather(pint, axis, pi), N.gather(nint, axis, ni))
    assert_same(P.scatter_add(pint, axis, pi, psi), N.scatter_add(nint, axis, ni, nsi))


def test_gather_scatter_add_index_bounds():
    p, n = both([1.0, 2.0, 3.0, 4.0], (2, 2), F32)
    pi, ni = both([-1, 0, -2, 1], (2, 2), I32)  # negative indices count from the end, like NumPy
    assert_same(P.gather(p, 1, pi), N.gather(n, 1, ni))
    assert_same(P.scatter_add(p, 1, pi, p), N.scatter_add(n, 1, ni, n))
    for bad in (2, -3):
        index = P.from_flat([0, bad, 0, 0], (2, 2), I32)
        with pytest.raises(IndexError, match="gather: index %d is out of bounds for axis 1 with size 2" % bad):
            P.gather(p, 1, index)
        with pytest.raises(IndexError, match="scatter_add: index %d is out of bounds" % bad):
            P.scatter_add(p, 1, index, p)


# -- images ------------------------------------------------------------------------------------

UNFOLDS = [((1, 1, 5, 5), (3, 3), (1, 1), (0, 0), (1, 1)),
           ((2, 3, 6, 5), (3, 2), (2, 1), (1, 2), (1, 1)),
           ((1, 2, 7, 7), (2, 3), (1, 2), (2, 1), (2, 2)),
           ((2, 1, 4, 4), (2, 2), (2, 2), (0, 0), (1, 1)),
           ((1, 1, 3, 3), (1, 1), (1, 1), (1, 1), (1, 1)),
           ((0, 2, 4, 4), (3, 3), (1, 1), (1, 1), (1, 1))]


@pytest.mark.parametrize("shape,kernel,stride,padding,dilation", UNFOLDS)
@pytest.mark.parametrize("pad_value", [0.0, -INF])
def test_unfold2d_fold2d(shape, kernel, stride, padding, dilation, pad_value):
    rng = random.Random(12)
    p, n = both(rand_floats(rng, math.prod(shape), edges=False), shape, F32)
    pu, nu = P.unfold2d(p, kernel, stride, padding, dilation, pad_value), \
        N.unfold2d(n, kernel, stride, padding, dilation, pad_value)
    assert_same(pu, nu)
    cols_shape = N.shape(nu)
    pc, nc = both(rand_floats(rng, math.prod(cols_shape), edges=False), cols_shape, F32)
    assert_same(P.fold2d(pc, shape[2:], kernel, stride, padding, dilation),
                N.fold2d(nc, shape[2:], kernel, stride, padding, dilation))
    # Cached index lists serve the second call with the same geometry.
    assert_same(P.unfold2d(p, kernel, stride, padding, dilation, pad_value), nu)


def test_random_rejects_unknown_distribution():
    with pytest.raises(ValueError, match="random: unknown distribution 'gamma'"):
        P.random((2,), "gamma", 0, F32)
