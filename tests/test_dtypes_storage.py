"""Storage dtypes cn.int8, cn.uint8, cn.float16: held at their size, widened by every op,
round-tripped through records; NumPy's own conversions are the oracle."""

import numpy as np
import pytest

import cinders as cn
from cinders import record

from backends import STORAGE_BACKENDS

# cn.Wgpu in both layouts of float16, plain and under cn.Fusion (tests/backends.py)
HOLDERS = {"python": cn.Python(), "numpy": cn.NumPy(), "wasm": cn.Wasm(),
           **{name: make() for name, make in STORAGE_BACKENDS.items()}}


@pytest.fixture(params=list(HOLDERS))
def backend(request):
    return HOLDERS[request.param]


def test_creation_keeps_values_and_dtype(backend):
    a = cn.tensor([[-128, 5], [127, 0]], backend=backend, dtype=cn.int8)
    assert a.dtype is cn.int8 and a.tolist() == [[-128, 5], [127, 0]]
    assert a.numpy().dtype == np.int8
    u = cn.tensor(np.array([0, 200, 255]), backend=backend, dtype="uint8")
    assert u.dtype is cn.uint8 and u.numpy().dtype == np.uint8 and u.tolist() == [0, 200, 255]


def test_float16_rounds_like_numpy(backend):
    values = [1.0, 3.14159, 65519.0, -1e-8, 65504.0, 1e-7, -0.1]
    h = cn.tensor(values, backend=backend, dtype=cn.float16)
    expected = np.array(values, dtype=np.float64).astype(np.float16)
    assert h.numpy().dtype == np.float16
    np.testing.assert_array_equal(h.numpy(), expected)
    via32 = cn.tensor(values, backend=backend).cast(cn.float16)
    np.testing.assert_array_equal(via32.numpy(), np.array(values, np.float32).astype(np.float16))
    assert cn.tensor([70000.0, -1e6], backend=backend).cast(cn.float16).tolist() == [float("inf"), float("-inf")]


def test_cast_to_8_bit_wraps_like_numpy(backend):
    values = [300.7, -1.5, 255.0, -129.0, 127.9, 0.0]
    x = cn.tensor(values, backend=backend)
    ints = np.trunc(np.array(values, np.float32)).astype(np.int32)
    assert x.cast(cn.uint8).tolist() == ints.astype(np.uint8).tolist()
    assert x.cast(cn.int8).tolist() == ints.astype(np.int8).tolist()
    assert x.cast(cn.int8).cast(cn.uint8).tolist() == ints.astype(np.int8).astype(np.uint8).tolist()
    assert cn.tensor([-1, 256], backend=backend).cast(cn.uint8).tolist() == [255, 0]


def test_creation_refuses_values_that_do_not_fit(backend):
    with pytest.raises(cn.ArgumentError, match="does not fit int8"):
        cn.tensor([1, 200], backend=backend, dtype=cn.int8)
    with pytest.raises(cn.ArgumentError, match="does not fit uint8"):
        cn.tensor(np.array([-1]), backend=backend, dtype=cn.uint8)


def test_ops_widen_to_the_compute_dtype(backend):
    a = cn.tensor([-128, 5, 127], backend=backend, dtype=cn.int8)
    assert (a + 1).dtype is cn.int32 and (a + 1).tolist() == [-127, 6, 128]
    assert (a * a).tolist() == [16384, 25, 16129]
    assert a.sum().tolist() == 4 and a.sum().dtype is cn.int32
    h = cn.tensor([0.5, -2.0], backend=backend, dtype=cn.float16)
    assert (h * 3).dtype is cn.float32 and (h * 3).tolist() == [1.5, -6.0]
    assert (h + a[:2].cast(cn.float16)).dtype is cn.float32
    assert cn.where(h > 0, h, h).dtype is cn.float32
    with pytest.raises(cn.DTypeError, match="matmul"):
        h.reshape(1, 2) @ h.reshape(2, 1)


def test_movement_ops_keep_the_storage_dtype(backend):
    u = cn.tensor([[1, 2, 3], [4, 5, 6]], backend=backend, dtype=cn.uint8)
    t = u.permute(1, 0)
    assert t.dtype is cn.uint8 and t.tolist() == [[1, 4], [2, 5], [3, 6]]
    assert u.reshape(3, 2).tolist() == [[1, 2], [3, 4], [5, 6]]
    assert u[:, 1:].dtype is cn.uint8 and u[:, 1:].tolist() == [[2, 3], [5, 6]]
    h = cn.tensor([[1.5, -2.0]], backend=backend, dtype=cn.float16)
    assert cn.cat([h, h], 0).dtype is cn.float16 and cn.cat([h, h], 0).tolist() == [[1.5, -2.0]] * 2


def test_moves_between_holding_backends():
    a = cn.tensor([250, 3], backend=cn.Python(), dtype=cn.uint8)
    b = a.to(cn.NumPy())
    assert b.dtype is cn.uint8 and b.numpy().dtype == np.uint8 and b.tolist() == [250, 3]


def test_backends_that_do_not_hold_storage_dtypes_refuse_them():
    ad = cn.Autodiff(cn.NumPy())
    with pytest.raises(cn.DTypeError, match="does not hold cn.int8"):
        cn.tensor([1, 2], backend=ad, dtype=cn.int8)
    with pytest.raises(cn.DTypeError, match="does not hold cn.float16"):
        cn.tensor([1.0], backend=ad).cast(cn.float16)
    with pytest.raises(cn.DTypeError, match="does not hold cn.uint8"):
        cn.tensor([1], backend=cn.NumPy(), dtype=cn.uint8).to(ad)
    with pytest.raises(cn.DTypeError, match="storage dtype"):
        cn.zeros(2, dtype=cn.int8)


def test_records_round_trip_every_storage_dtype(backend, tmp_path):
    path = str(tmp_path / "s.safetensors")
    tensors = {"i8": cn.tensor([-128, 0, 127], backend=backend, dtype=cn.int8),
               "u8": cn.tensor([[0, 255]], backend=backend, dtype=cn.uint8),
               "f16": cn.tensor([0.1, -2.5, 65504.0], backend=backend, dtype=cn.float16),
               "f32": cn.tensor([1.5], backend=backend)}
    record.save_tensors(path, tensors)
    table = record.read_header(path)[1]
    assert {n: code for n, (code, _) in table.items()} == {"i8": "I8", "u8": "U8", "f16": "F16", "f32": "F32"}
    _, kept = record.read_tensors(path, backend, keep_dtypes=True)
    for name, t in tensors.items():
        assert kept[name].dtype is t.dtype and kept[name].tolist() == t.tolist()
    _, wide = record.read_tensors(path, backend)
    assert [wide[n].dtype for n in ("i8", "u8", "f16")] == [cn.int32, cn.int32, cn.float32]
    assert wide["f16"].tolist() == tensors["f16"].tolist()
    with pytest.raises(cn.DTypeError, match="does not hold"):
        record.read_tensors(path, cn.Autodiff(backend), keep_dtypes=True)


def test_records_match_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    path = str(tmp_path / "s.safetensors")
    arrays = {"i8": np.array([-7, 100], np.int8), "u8": np.array([9, 250], np.uint8),
              "f16": np.array([0.333, -1e4], np.float16)}
    st.save_file(arrays, path)
    _, kept = record.read_tensors(path, cn.NumPy(), keep_dtypes=True)
    for name, a in arrays.items():
        np.testing.assert_array_equal(kept[name].numpy(), a)
        assert kept[name].numpy().dtype == a.dtype
    record.save_tensors(path, kept)
    back = st.load_file(path)
    for name, a in arrays.items():
        np.testing.assert_array_equal(back[name], a)
        assert back[name].dtype == a.dtype


def test_pad_of_float16_takes_fractional_and_infinite_values(backend):
    x = np.arange(6, dtype=np.float16).reshape(2, 3)
    t = cn.tensor(x, backend=backend, dtype=cn.float16)
    for value in (0.5, float("inf"), -float("inf")):
        got = cn.pad(t, (1, 1), value)
        assert got.dtype is cn.float16
        np.testing.assert_array_equal(got.numpy(), np.pad(x, ((0, 0), (1, 1)), constant_values=value))
    assert np.isnan(cn.pad(t, (1, 0), float("nan")).numpy()[:, 0]).all()
    with pytest.raises(cn.DTypeError):
        cn.pad(cn.tensor([1, 2], backend=backend, dtype=cn.int8), (1, 1), 0.5)


def test_setitem_on_storage_dtypes_narrows_like_cast(backend):
    h = np.arange(6, dtype=np.float16).reshape(2, 3)
    t = cn.tensor(h, backend=backend, dtype=cn.float16)
    t[0, 1] = 0.3333
    t[1] = cn.tensor([7.1, 8.2, 9.3], backend=backend)
    h[0, 1], h[1] = 0.3333, np.float32([7.1, 8.2, 9.3]).astype(np.float16)
    assert t.dtype is cn.float16
    np.testing.assert_array_equal(t.numpy(), h)
    q = cn.tensor(np.arange(6, dtype=np.int8), backend=backend, dtype=cn.int8)
    q[2] = 300                      # wraps, as cast does: 300 - 256
    q[3:5] = [-1, 7]
    assert q.dtype is cn.int8 and q.numpy().tolist() == [0, 1, 44, -1, 7, 5]
    u = cn.tensor(np.arange(4, dtype=np.uint8), backend=backend, dtype=cn.uint8)
    u[1:3] = [9, 250]
    assert u.dtype is cn.uint8 and u.numpy().tolist() == [0, 9, 250, 3]
