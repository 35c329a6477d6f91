"""cn.Fusion's kept plans (wgpu_backend/programs.py, `program_signature`): a fused group is
planned once per signature; later flushes of the same group reuse that plan and only patch the
leaves' offsets and the constants' values into its parameter block. A group that differs in
anything else the plan reads must get a plan of its own: each case below runs a group, then a
twin differing in one field, on one backend (so the twin meets the kept plan of the first), and
checks both against NumPy. Removing any field from the signature fails one of these cases."""

import numpy as np
import pytest

import cinders as cn


@pytest.fixture(scope="module")
def fused():
    return cn.Fusion(cn.Wgpu(autotune=False))


def data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def t(array, backend):
    return cn.tensor(array, backend=backend)


# Each case: (name, [(compute(backend) -> (cinders result, NumPy expected))...]) run in order.
def affine(scale, shape=(8, 12)):
    def run(be):
        x = data(*shape, seed=1)
        return t(x, be) * scale + 1.0, x * scale + 1.0
    return run


def constants_only(length):
    def run(be):  # a group without leaves, summing rows: only the frame gives their length
        return (cn.full((6, length), 2.0, backend=be) * 3.0).sum(axis=1), \
            np.full(6, 6.0 * length, np.float32)
    return run


def rows_sum(axis, keepdim=False):
    def run(be):
        x = data(6, 6, seed=2)
        return (t(x, be) * 2.0).sum(axis=axis, keepdim=keepdim), (x * 2.0).sum(axis=axis, keepdims=keepdim)
    return run


def transposed(view):
    def run(be):
        x = data(8, 8, seed=3)
        xt = t(x, be)
        return (xt.T if view else xt) * 2.0 + 1.0, (x.T if view else x) * 2.0 + 1.0
    return run


def sliced(start):
    def run(be):
        x = data(24, seed=4)
        xt = t(x, be)
        return xt[start:start + 16] * 2.0 + 1.0, x[start:start + 16] * 2.0 + 1.0
    return run


def two_leaves(shared):
    def run(be):
        x, y = data(32, seed=5), data(16, seed=6)
        if shared:  # two views of one buffer
            xt = t(x, be)
            a, b, an, bn = xt[:16], xt[16:], x[:16], x[16:]
        else:  # the same views of two buffers
            a, b, an, bn = t(x, be)[:16], t(x[::-1].copy(), be)[16:], x[:16], x[::-1][16:]
        return a * b + 1.0, an * bn + 1.0
    return run


def broadcast(rows):
    def run(be):
        x, b = data(4, 8, seed=7), data(rows, 8, seed=8)
        return t(x, be) * t(b, be) + 1.0, x * b + 1.0
    return run


def cast_to_int(dtype):
    def run(be):
        values = [3.7, 0.0, -2.5, 1.0] if dtype is cn.float32 else [True, False, True, True]
        x = cn.tensor(values, dtype=dtype, backend=be)
        expected = np.array(values, dtype=np.float32).astype(np.int32) + 1
        return x.cast(cn.int32) + 1, expected
    return run


CASES = [
    ("constant value", [affine(2.0), affine(-3.0)]),
    ("frame shape", [constants_only(8), constants_only(12)]),
    ("reduced axis", [rows_sum(0), rows_sum(1)]),
    ("row kept or squeezed", [rows_sum(1, keepdim=True), rows_sum(1)]),
    ("leaf strides", [transposed(False), transposed(True)]),
    ("leaf alignment", [sliced(0), sliced(4), sliced(1)]),
    ("leaves sharing a buffer", [two_leaves(True), two_leaves(False)]),
    ("leaf broadcast", [broadcast(4), broadcast(1)]),
    ("leaf dtype", [cast_to_int(cn.bool), cast_to_int(cn.float32)]),
]


@pytest.mark.parametrize("name, runs", CASES, ids=[c[0] for c in CASES])
def test_a_group_differing_in_one_field_gets_its_own_plan(fused, name, runs):
    for run in runs:
        for _ in range(2):  # the second time through, the group meets its own kept plan
            ours, expected = run(fused)
            got = ours.numpy()  # the inner handle's own shape (a stale plan's output shape)
            assert got.shape == expected.shape, name
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_repeated_group_reuses_its_plan_with_new_constants_and_buffers(fused):
    compiler = fused.compiler
    x = data(5, 7, seed=9)
    results = []
    for step in range(3):
        before = compiler.kept_plans
        y = (t(x + step, fused) * (step + 0.5) - step).exp()
        results.append(np.asarray(y.tolist()))
        if step:
            assert compiler.kept_plans == before  # planned once, reused after
        np.testing.assert_allclose(results[-1], np.exp((x + step) * (step + 0.5) - step),
                                   rtol=1e-5, atol=1e-6)


def test_only_a_dying_leaf_at_its_buffers_start_gives_the_result_its_buffer(fused):
    # (the kept plan of a view at offset 0 names the buffer a donor; one of a view further in
    # must not: the kernel would write element i where element i + 4 is still to be read)
    x = data(24, seed=10)
    for start in (0, 4, 0, 4):
        before = fused.memory_stats()["inplace"]
        y = t(x, fused)[start:start + 16] * 2.0 + 1.0  # the uploaded tensor dies here
        np.testing.assert_allclose(y.numpy(), x[start:start + 16] * 2.0 + 1.0, rtol=1e-6)
        assert fused.memory_stats()["inplace"] - before == (1 if start == 0 else 0)
