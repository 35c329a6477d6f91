"""cn.Wgpu's packed storage dtypes (wgpu_backend/codegen/packing.py): int8/uint8 four to a u32
word, float16 two. Every cast between them and the compute dtypes, elementwise ops (which widen),
strided views and writes into words shared with other elements, against NumPy's conversions."""

import numpy as np
import pytest

import cinders as cn

pytest.importorskip("wgpu")
GPU = cn.Wgpu(autotune=False)
NP = {cn.int8: np.int8, cn.uint8: np.uint8, cn.float16: np.float16, cn.float32: np.float32,
      cn.int32: np.int32, cn.bool: np.bool_}
RNG = np.random.default_rng(7)
# Odd lengths: the last word of a packed buffer is partly used.
SOURCES = {
    cn.float32: np.concatenate([RNG.normal(0, 200, 37), [0.5, -0.5, 1.5, 2.5, -127.9, 65504.0,
                                                           65519.0, 65520.0, 1e-7, 3e-8, -6.1e-5,
                                                           2.5e-5, 0.0, -0.0, 7e4]]).astype(np.float32),
    cn.int32: RNG.integers(-1000, 1000, 51).astype(np.int32),
    cn.bool: RNG.integers(0, 2, 23).astype(np.bool_),
    cn.int8: RNG.integers(-128, 128, 45).astype(np.int8),
    cn.uint8: RNG.integers(0, 256, 45).astype(np.uint8),
    cn.float16: RNG.normal(0, 3, 43).astype(np.float16),
}


def _numpy_cast(a, dtype):
    """NumPy's rule as cn.NumPy applies it (floats truncate through int32 into 8 bits)."""
    if dtype in (cn.int8, cn.uint8) and a.dtype.kind == "f":
        a = np.trunc(a.astype(np.float32)).astype(np.int32)
    return a.astype(NP[dtype])


@pytest.mark.parametrize("src", list(SOURCES), ids=repr)
@pytest.mark.parametrize("dst", [cn.int8, cn.uint8, cn.float16, cn.float32, cn.int32, cn.bool],
                         ids=repr)
def test_cast_matches_numpy(src, dst):
    a = SOURCES[src]
    if dst in (cn.int8, cn.uint8) and a.dtype.kind == "f":
        a = a[np.abs(a) < 2 ** 31]  # beyond int32 the float -> int conversion is undefined
    x = cn.tensor(a, backend=GPU, dtype=src)
    assert x.dtype is src
    y = x.cast(dst)
    assert y.dtype is dst and y.numpy().dtype == NP[dst]
    np.testing.assert_array_equal(y.numpy(), _numpy_cast(a, dst))
    assert y.tolist() == _numpy_cast(a, dst).tolist()


def test_float16_rounding_is_exact_over_many_values():
    bits = np.arange(0, 1 << 16, 7, dtype=np.uint16)
    halves = bits.view(np.float16)
    halves = halves[np.isfinite(halves)]
    # float32 values around every half: halfway points (ties to even) and just off them
    wide = halves.astype(np.float32)
    mids = np.concatenate([wide, wide * np.float32(1 + 2 ** -11), wide * np.float32(1 + 2 ** -12),
                           wide * np.float32(1 - 2 ** -12), np.float32([65520, -65520, 65519.996])])
    got = cn.tensor(mids, backend=GPU).cast(cn.float16).numpy()
    np.testing.assert_array_equal(got.view(np.uint16), mids.astype(np.float16).view(np.uint16))
    back = cn.tensor(halves, backend=GPU, dtype=cn.float16).cast(cn.float32).numpy()
    np.testing.assert_array_equal(back, halves.astype(np.float32))  # subnormals included


@pytest.mark.parametrize("dtype", [cn.int8, cn.uint8, cn.float16], ids=repr)
def test_elementwise_ops_widen_packed_operands(dtype):
    a = SOURCES[dtype][:40].reshape(5, 8)
    x = cn.tensor(a, backend=GPU, dtype=dtype)
    wide = a.astype(np.float32 if dtype is cn.float16 else np.int32)
    np.testing.assert_array_equal((x * 3 - x).numpy(), wide * 3 - wide)
    np.testing.assert_array_equal(x.sum(1).numpy(), wide.sum(1))
    np.testing.assert_array_equal(x.max(0).numpy(), wide.max(0))
    np.testing.assert_array_equal((x.cast(cn.float32) / 2).numpy(), wide.astype(np.float32) / 2)


@pytest.mark.parametrize("dtype", [cn.int8, cn.uint8, cn.float16], ids=repr)
def test_views_and_writes_into_shared_words(dtype):
    a = SOURCES[dtype][:42].reshape(6, 7)
    x = cn.tensor(a, backend=GPU, dtype=dtype)
    np.testing.assert_array_equal(x.permute(1, 0).numpy(), a.T)
    np.testing.assert_array_equal(x[1:5, 3:].numpy(), a[1:5, 3:])   # starts inside a word
    np.testing.assert_array_equal(x[:, ::3].numpy(), a[:, ::3])
    np.testing.assert_array_equal(x[2:3].expand(3, 7).numpy(), np.broadcast_to(a[2:3], (3, 7)))
    # cat and pad copy into regions that start and end inside words of the destination
    parts = [x[:, :3], x[:, 3:4], x[:, 4:]]
    np.testing.assert_array_equal(cn.cat(parts, 1).numpy(), a)
    np.testing.assert_array_equal(cn.cat([x[:1], x, x[5:]], 0).numpy(),
                                  np.concatenate([a[:1], a, a[5:]]))
    # pad fills the destination (whole words of one value), then copies into its middle
    np.testing.assert_array_equal(cn.pad(x, (2, 1, 1, 0), 5).numpy(),
                                  np.pad(a, ((1, 0), (2, 1)), constant_values=5))
    index = cn.tensor([[0, 6, 3], [2, 2, 5]], backend=GPU)
    np.testing.assert_array_equal(x[1:3].gather(1, index).numpy(),
                                  np.take_along_axis(a[1:3], np.array([[0, 6, 3], [2, 2, 5]]), 1))


@pytest.mark.parametrize("dtype,size", [(cn.int8, 1), (cn.uint8, 1), (cn.float16, 2),
                                        (cn.float32, 4)], ids=repr)
def test_packed_tensors_take_their_size_on_the_device(dtype, size):
    GPU.synchronize()
    GPU.empty_cache()
    before = GPU.memory_stats()["allocated_bytes"]
    x = cn.tensor(np.zeros(1 << 16, NP[dtype]), backend=GPU, dtype=dtype)
    assert GPU.memory_stats()["allocated_bytes"] - before == size << 16
    del x
