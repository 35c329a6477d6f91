"""Bad input raises the right error type, before reaching the backend, with a message that names
the op and the offending shapes / dtypes / backends."""

import pytest

import cinders as cn


class SecondDevice(cn.NumPy):
    """A NumPy backend that claims to be another device, so tensors of the two must not mix."""

    def device_key(self):
        return ("SecondDevice",)


def _raises(error, fn, *fragments):
    with pytest.raises(error) as info:
        fn()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, "%r not in error message %r" % (fragment, message)


@pytest.fixture
def x(backend):
    return cn.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], backend=backend)


def test_shape_errors_name_op_and_both_shapes(backend, x):
    y = cn.ones(3, 2, backend=backend)
    _raises(cn.ShapeError, lambda: x + y, "add", "(2, 3)", "(3, 2)")
    _raises(cn.ShapeError, lambda: x * cn.ones(4, backend=backend), "mul", "(2, 3)", "(4,)")
    _raises(cn.ShapeError, lambda: x < y, "lt", "(2, 3)", "(3, 2)")
    _raises(cn.ShapeError, lambda: x @ x, "matmul", "(2, 3)", "(2, 3)")
    _raises(cn.ShapeError, lambda: cn.ones(2, 3, 4, backend=backend) @ cn.ones(3, 4, 2, backend=backend),
            "matmul", "(2, 3, 4)", "(3, 4, 2)")
    _raises(cn.ShapeError, lambda: cn.where(x > 1, x, y), "where", "(2, 3)", "(3, 2)")
    _raises(cn.ShapeError, lambda: cn.cat([x, y], 0), "cat", "(2, 3)", "(3, 2)")
    _raises(cn.ShapeError, lambda: cn.stack([x, y]), "stack", "(2, 3)", "(3, 2)")
    _raises(cn.ShapeError, lambda: x.reshape(4, 2), "reshape", "(2, 3)", "(4, 2)")
    _raises(cn.ShapeError, lambda: x.reshape(-1, 4), "reshape", "(2, 3)")
    _raises(cn.ShapeError, lambda: x.expand(4, 3), "expand", "(2, 3)", "(4, 3)")
    _raises(cn.ShapeError, lambda: x.permute(0, 0), "permute", "(2, 3)")
    _raises(cn.ShapeError, lambda: x.gather(1, cn.zeros(3, 1, backend=backend, dtype=cn.int32)),
            "gather", "(3, 1)", "(2, 3)")
    _raises(cn.ShapeError, lambda: cn.pad(x, (1,)), "pad", "(2, 3)")


def test_axis_errors_name_op_and_shape(x):
    for fn, op in ((lambda: x.sum(2), "sum"), (lambda: x.max(-3), "max"), (lambda: x.softmax(5), "softmax"),
                   (lambda: x.unsqueeze(4), "unsqueeze"), (lambda: x.transpose(0, 2), "transpose"),
                   (lambda: x.mean((0, 0)), "mean")):
        _raises(cn.ShapeError, fn, op, "(2, 3)")


def test_empty_reductions_that_have_no_value(backend):
    empty = cn.zeros(2, 0, backend=backend)
    for op in ("max", "min", "argmax", "argmin"):
        _raises(cn.ShapeError, lambda: getattr(empty, op)(1), op, "(2, 0)")
        _raises(cn.ShapeError, lambda: getattr(empty, op)(), op, "(2, 0)")


def test_conv_and_pool_errors(backend):
    img = cn.ones(1, 4, 5, 5, backend=backend)
    _raises(cn.ShapeError, lambda: cn.conv2d(img, cn.ones(2, 3, 3, 3, backend=backend)),
            "conv2d", "(1, 4, 5, 5)", "(2, 3, 3, 3)")
    _raises(cn.ShapeError, lambda: cn.conv2d(img, cn.ones(3, 2, 3, 3, backend=backend), groups=2),
            "conv2d", "(3, 2, 3, 3)", "groups")
    _raises(cn.ShapeError, lambda: cn.conv2d(img, cn.ones(2, 4, 3, 3, backend=backend), cn.ones(3, backend=backend)),
            "conv2d", "bias", "(3,)")
    _raises(cn.ShapeError, lambda: cn.conv2d(img, cn.ones(2, 4, 7, 7, backend=backend)),
            "conv2d", "(1, 4, 5, 5)", "(7, 7)")
    _raises(cn.ShapeError, lambda: cn.max_pool2d(cn.ones(4, 5, backend=backend), 2), "max_pool2d", "(4, 5)")
    _raises(cn.ShapeError, lambda: cn.avg_pool2d(img, 2, padding=2), "avg_pool2d", "padding")


def test_dtype_errors_name_op_and_dtype(backend, x):
    ints = cn.tensor([1, 2, 3], backend=backend)
    flags = cn.tensor([True, False, True], backend=backend)
    _raises(cn.DTypeError, lambda: ints @ ints, "matmul", "int32")
    _raises(cn.DTypeError, lambda: ints & ints, "logical_and", "int32")
    _raises(cn.DTypeError, lambda: ~ints, "logical_not", "int32")
    _raises(cn.DTypeError, lambda: -flags, "neg", "bool")
    _raises(cn.DTypeError, lambda: cn.where(ints, x, x), "where", "int32")
    _raises(cn.DTypeError, lambda: x.gather(0, cn.zeros(1, 3, backend=backend)), "gather", "float32")
    if cn.float16 in backend.storage_dtypes:   # held at its size here (core/dtypes.py)
        assert x.cast(cn.float16).dtype is cn.float16
    else:
        _raises(cn.DTypeError, lambda: x.cast(cn.float16), "cast", "float16")
    _raises(cn.DTypeError, lambda: cn.one_hot(x, 3), "one_hot", "float32")
    _raises(cn.DTypeError, lambda: cn.conv2d(cn.ones(1, 1, 3, 3, backend=backend, dtype=cn.int32),
                                             cn.ones(1, 1, 2, 2, backend=backend)), "conv2d", "int32")
    _raises(cn.DTypeError, lambda: cn.random(3, backend=backend, dtype=cn.int32), "random", "int32")


def test_device_errors_name_both_backends(backend, x):
    other = SecondDevice()
    y = cn.ones(2, 3, backend=other)
    for fn, op in ((lambda: x + y, "add"), (lambda: x @ y.T, "matmul"), (lambda: cn.cat([x, y]), "cat"),
                   (lambda: cn.where(x > 0, x, y), "where"), (lambda: x.maximum(y), "maximum"),
                   (lambda: cn.conv2d(x.reshape(1, 1, 2, 3), y.reshape(1, 1, 2, 3)), "conv2d")):
        _raises(cn.DeviceError, fn, op, repr(backend), repr(other))


def test_index_errors(x):
    _raises(IndexError, lambda: x[2], "2", "(2, 3)")
    _raises(IndexError, lambda: x[0, 0, 0], "(2, 3)")
    _raises(IndexError, lambda: x[[0.5]], "0.5", "float")
    _raises(IndexError, lambda: x[:, [0, 3]], "3", "(2, 3)")
    _raises(IndexError, lambda: x[..., ...], "Ellipsis")
    _raises(IndexError, lambda: x[(x > 1)[:, :2]], "mask", "(2, 2)", "(2, 3)")


def test_setitem_errors(x):
    y = x * 1.0
    _raises(ValueError, lambda: y.__setitem__((0, slice(None)), cn.ones(2, backend=x.backend)), "(2,)", "(3,)")
    _raises(IndexError, lambda: y.__setitem__(5, 1.0), "5", "(2, 3)")
    leaf = cn.tensor([1.0, 2.0], backend=cn.Autodiff(cn.NumPy())).require_grad()
    _raises(cn.NotDifferentiableError, lambda: leaf.__setitem__(0, 3.0), "leaf", "no_grad")


def test_ambiguous_truth_and_item(x):
    _raises(cn.ShapeError, lambda: bool(x), "bool", "(2, 3)")
    _raises(cn.ShapeError, lambda: x.item(), "item", "(2, 3)")


def test_ragged_data(backend):
    _raises(cn.ShapeError, lambda: cn.tensor([[1, 2], [3]], backend=backend), "tensor", "ragged")
    _raises(cn.ShapeError, lambda: cn.tensor([1, [2]], backend=backend), "tensor", "ragged")


def test_backward_without_autodiff_says_how_to_fix(backend):
    while backend.inner is not None:  # the undecorated backend underneath Autodiff/Fusion
        backend = backend.inner
    x = cn.ones(2, 3, backend=backend)
    for fn, op in ((x.backward, "backward"), (x.require_grad, "require_grad"), (x.detach, "detach")):
        _raises(cn.NotDifferentiableError, fn, op, "cn.Autodiff(")


def test_errors_are_standard_python_errors():
    assert issubclass(cn.ShapeError, ValueError) and issubclass(cn.DTypeError, TypeError)
    assert issubclass(cn.DeviceError, ValueError)


def test_gather_and_scatter_add_index_range_rule(backend, x):
    """core/backend.py, "Index values": [-n, n) is valid everywhere (negatives from the end);
    outside it a backend raises IndexError naming op and index where it can check without a
    device sync, and otherwise gathers 0 / drops the value, never touching another row."""
    index = cn.tensor([[-1], [0]], backend=backend)
    assert x.gather(1, index).tolist() == [[3.0], [4.0]]
    assert x.scatter_add(1, index, cn.ones(2, 1, backend=backend)).tolist() == [[1.0, 2.0, 4.0], [5.0, 5.0, 6.0]]
    for bad in (3, -4):
        index = cn.tensor([[bad], [1]], backend=backend)
        try:
            gathered = x.gather(1, index).tolist()
        except IndexError as e:
            assert "gather" in str(e) and str(bad) in str(e) and "size 3" in str(e)
        else:
            assert gathered == [[0.0], [5.0]]
        try:
            added = x.scatter_add(1, index, cn.ones(2, 1, backend=backend)).tolist()
        except IndexError as e:
            assert "scatter_add" in str(e) and str(bad) in str(e)
        else:
            assert added == [[1.0, 2.0, 3.0], [4.0, 6.0, 6.0]]
    _raises(IndexError, lambda: x[:, [0, 3]], "index", "3")   # list indices: the tensor layer checks
