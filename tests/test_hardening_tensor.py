"""Issue 10, the Tensor API and input files: sizes fail fast, bad arguments get a CindersError
that names what is wrong (still a ValueError/TypeError/IndexError for code that catches those),
and input files are read with a size cap."""

import os
import subprocess
import sys
import time

import pytest

import cinders as cn
from cinders import inputs, limits
from cinders.cli import main


@pytest.fixture
def fixed_limit():
    old = limits.set_max_elements(None)
    yield
    limits.set_max_elements(old)


@pytest.mark.parametrize("make", [
    lambda: cn.arange(10 ** 12),
    lambda: cn.arange(0, 1e12, 0.5),
    lambda: cn.eye(10 ** 6),
    lambda: cn.random((10 ** 12,), backend=cn.Python()),
    lambda: cn.random((10 ** 6, 10 ** 6), backend=cn.NumPy()),
    lambda: cn.zeros(10 ** 7, 10 ** 7, backend=cn.Python()),
    lambda: cn.full((10 ** 13,), 1.5),
    lambda: cn.zeros(3, backend=cn.Python()).reshape(3, 1).expand(3, 10 ** 12),
    lambda: cn.pad(cn.zeros(2, backend=cn.Python()), (0, 10 ** 12)),
    lambda: cn.zeros(10 ** 6, 1, backend=cn.NumPy()) + cn.zeros(10 ** 6, backend=cn.NumPy()),
    lambda: cn.zeros(10 ** 6, 1, backend=cn.Python()) @ cn.zeros(1, 10 ** 6, backend=cn.Python()),
    lambda: cn.where(cn.zeros(10 ** 6, 1, dtype=cn.bool), cn.zeros(10 ** 6), 1.0),
], ids=["arange", "arange-float", "eye", "random-python", "random-numpy", "zeros", "full", "expand", "pad",
        "broadcast", "matmul", "where"])
def test_huge_tensors_fail_fast_before_allocating(make, fixed_limit):
    started = time.monotonic()
    with pytest.raises(cn.SizeLimitError, match="elements"):
        make()
    assert time.monotonic() - started < 1.0


def test_the_limit_is_configurable(fixed_limit):
    limits.set_max_elements(100)
    cn.zeros(100, backend=cn.Python())
    with pytest.raises(cn.SizeLimitError, match="limit of 100"):
        cn.zeros(101, backend=cn.Python())
    with pytest.raises(cn.SizeLimitError):
        cn.arange(101)
    limits.set_max_elements(None)
    assert cn.zeros(101).shape == (101,)
    with pytest.raises(cn.SizeLimitError):
        limits.set_max_elements(0)
    assert issubclass(cn.SizeLimitError, cn.CindersError) and issubclass(cn.SizeLimitError, ValueError)
    code = ("import cinders as cn\ncn.zeros(10)\ntry:\n    cn.zeros(11)\nexcept cn.SizeLimitError as e:\n"
            "    print(e)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, CINDERS_MAX_ELEMENTS="10"),
                         capture_output=True, text=True, timeout=60)
    assert "limit of 10 set by" in out.stdout, out.stderr


def test_eye_rejects_negative_sizes_on_every_backend(backend):
    for n, m in ((-1, None), (2, -3), (2.0, None), (True, 2)):
        with pytest.raises(cn.ShapeError, match="eye"):
            cn.eye(n, m, backend=backend)
    assert cn.eye(2, 3, backend=backend).tolist() == [[1, 0, 0], [0, 1, 0]]


def test_one_hot_rejects_indices_out_of_range_on_every_backend(backend):
    idx = cn.tensor([0, 2, 1], backend=backend)
    assert cn.one_hot(idx, 3).tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
    for bad, shown in (([0, 5], 5), ([1, -1], -1), ([3], 3)):
        with pytest.raises(cn.IndexingError, match=r"one_hot: index %d is outside \[0, 3\)" % shown):
            cn.one_hot(cn.tensor(bad, backend=backend), 3)
    for n in (0, -2, 2.0, True):
        with pytest.raises(cn.ArgumentError, match="num_classes"):
            cn.one_hot(idx, n)
    assert issubclass(cn.IndexingError, IndexError)


@pytest.mark.parametrize("shape", [(2.0, 3), (True, 6), (6.0,), (-1.0, 3), ("6",), (2, 3.0)])
def test_reshape_takes_only_ints(shape):
    x = cn.zeros(2, 3)
    with pytest.raises(cn.ShapeError, match="must be ints"):
        x.reshape(*shape)
    assert x.reshape(3, -1).shape == (3, 2)


def test_float_and_other_bad_indices_are_named():
    x = cn.tensor([1.0, 2.0, 3.0])
    with pytest.raises(cn.IndexingError, match="0.5 in an index list is a float"):
        x[[0.5]]
    with pytest.raises(cn.IndexingError, match="out of range"):
        x[[0, 5]]
    with pytest.raises(cn.IndexingError, match="slice"):
        x[::0]
    with pytest.raises(cn.IndexingError):
        x["a"]


def test_bad_arguments_raise_cinders_errors_that_are_still_python_errors():
    x = cn.tensor([[1, 2], [3, 4]])
    cases = [
        (lambda: x + 2 ** 31, cn.ArgumentError, ValueError, "does not fit int32"),
        (lambda: cn.tensor([2 ** 40]), cn.ArgumentError, ValueError, "does not fit int32"),
        (lambda: cn.full((2,), 2 ** 40), cn.ArgumentError, ValueError, "does not fit int32"),
        (lambda: x.sum(axis=1j), cn.ArgumentTypeError, TypeError, "axis"),
        (lambda: x.sum(axis=False), cn.ArgumentTypeError, TypeError, "axis"),
        (lambda: x.sum(axis=0, keepdim="yes"), cn.ArgumentTypeError, TypeError, "keepdim"),
        (lambda: x.cast("complex"), cn.DTypeError, TypeError, "unknown dtype"),
        (lambda: x.squeeze(cn.float32), cn.ArgumentTypeError, TypeError, "squeeze"),
        (lambda: x.permute(slice(None), 0), cn.ArgumentTypeError, TypeError, "axis"),
        (lambda: cn.full(..., 1.0), cn.ShapeError, ValueError, "shape"),
        (lambda: cn.zeros({"a": 1}), cn.ShapeError, ValueError, "shape"),
        (lambda: cn.random((2,), seed=cn.bool), cn.ArgumentTypeError, TypeError, "seed"),
        (lambda: cn.random((2,), distribution="cauchy"), cn.ArgumentError, ValueError, "distribution"),
        (lambda: cn.arange(float("nan")), cn.ArgumentTypeError, TypeError, "finite"),
        (lambda: cn.arange(0, 3, 0), cn.ArgumentError, ValueError, "step"),
        (lambda: cn.stack([x, True]), cn.ArgumentTypeError, TypeError, "stack"),
        (lambda: cn.max_pool2d(cn.zeros(1, 1, 4, 4), [2, 2], stride=[1, 1]).shape, None, None, None),
        (lambda: cn.max_pool2d(cn.zeros(1, 1, 4, 4), cn.float32), cn.ShapeError, ValueError, "kernel"),
        (lambda: cn.pad(x, (1, 1), value="a"), cn.ArgumentTypeError, TypeError, "value"),
        (lambda: x.clamp(), cn.ArgumentError, ValueError, "clamp"),
        (lambda: len(cn.tensor(1.0)), cn.ArgumentTypeError, TypeError, "len"),
    ]
    for make, error, python_error, message in cases:
        if error is None:
            assert make() == (1, 1, 3, 3)
            continue
        with pytest.raises(error, match=message) as info:
            make()
        assert isinstance(info.value, (cn.CindersError, python_error))
        assert isinstance(info.value, python_error)


def test_reduce_over_an_empty_inner_dim_on_the_python_backend():
    for b in (cn.Python(), cn.NumPy()):
        x = cn.zeros(2, 0, backend=b, dtype=cn.bool)
        assert x.all(axis=0).shape == (0,) and x.any(axis=-2).shape == (0,)
        assert cn.zeros(3, 2, 0, backend=b).max(axis=1).shape == (3, 0)


# ---------------------------------------------------------------- input files

def test_inputs_are_read_with_a_size_cap(tmp_path):
    started = time.monotonic()
    with pytest.raises(cn.InputError, match="larger than"):
        inputs.read_json("/dev/zero")
    assert time.monotonic() - started < 5
    big = tmp_path / "big.json"
    big.write_bytes(b"[" + b"0," * 600 + b"0]")
    with pytest.raises(cn.InputError, match="larger than 1000 bytes"):
        inputs.read_json(str(big), max_bytes=1000)
    assert len(inputs.read_json(str(big))) == 601
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200000 + "]" * 200000)
    with pytest.raises(cn.InputError, match="too deeply"):
        inputs.read_json(str(deep))
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe")
    with pytest.raises(cn.InputError, match="not UTF-8"):
        inputs.read_json(str(tmp_path / "bad.json"))
    with pytest.raises(cn.InputError, match="cannot read"):
        inputs.read_json(str(tmp_path / "missing.json"))


def test_predict_refuses_endless_and_deeply_nested_inputs(tmp_path, capsys):
    record = str(tmp_path / "mlp.safetensors")
    from cinders.models.mnist import MnistMLP
    MnistMLP(hidden=4).save(record)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200000 + "]" * 200000)
    for path, message in (("/dev/zero", "larger than"), (str(deep), "too deeply")):
        started = time.monotonic()
        assert main(["predict", record, path, "--backend", "numpy"]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
        assert time.monotonic() - started < 10
    assert os.path.exists(record)


def test_idx_files_are_read_with_a_cap_and_checked(tmp_path, monkeypatch):
    import gzip
    from cinders.data import mnist
    good = tmp_path / "labels.idx1-ubyte"
    good.write_bytes(b"\0\0\x08\x01" + (3).to_bytes(4, "big") + bytes([7, 1, 4]))
    assert mnist.read_idx(str(good)) == ((3,), bytes([7, 1, 4]))
    lying = tmp_path / "lying.idx1-ubyte"
    lying.write_bytes(b"\0\0\x08\x01" + (2 ** 31).to_bytes(4, "big") + bytes([7, 1, 4]))
    with pytest.raises(cn.InputError, match="needs 2147483648 bytes of data, file has 3"):
        mnist.read_idx(str(lying))
    bomb = tmp_path / "bomb.idx1-ubyte.gz"
    with gzip.open(bomb, "wb") as f:  # 4 MB of zeros behind a 4 KB file
        f.write(b"\0\0\x08\x01" + bytes(4 << 20))
    monkeypatch.setattr(cn.inputs, "MAX_DATASET_BYTES", 1 << 20)
    with pytest.raises(cn.InputError, match="larger than 1048576 bytes"):
        mnist.read_idx(str(bomb))
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    with pytest.raises(cn.InputError, match="cannot read"):
        mnist.read_idx(str(tmp_path / "bad.gz"))
