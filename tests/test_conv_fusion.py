"""Fewer kernels around convolutions: batch norms, per-channel adds and activations folded into
the conv at ONNX import (core/onnx/fold.py) and pooling as one kernel that never builds the unfolded matrix (the
optional pool2d primitive: wgpu_backend/codegen/images.py).

Oracles: onnxruntime for imported graphs, cn.NumPy()'s composition (unfold2d + reduce) for the
pools; both on cn.Wgpu() (lavapipe) and cn.Fusion(cn.Wgpu()).
"""

import numpy as np
import pytest

import cinders as cn

RNG = np.random.default_rng(2121)


@pytest.fixture(scope="module")
def gpu():
    return cn.Wgpu(autotune=False)


def _stacks(gpu):
    return (gpu, cn.Fusion(gpu))


def _kernels(backend, fn):
    with cn.profile(backend) as prof:
        out = fn()
        out.numpy()
    return [e["name"] for e in prof.events if e.get("kind") == "kernel"]


# -- pooling ---------------------------------------------------------------------------------

POOLS = [  # (max_pool2d arguments); avg_pool2d takes the same without dilation
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 1), dilation=(2, 1)),
    dict(kernel_size=(2, 3), stride=1, padding=(0, 1)),
]


@pytest.mark.parametrize("args", POOLS, ids=str)
def test_pools_against_the_composition(gpu, args):
    """max (NaN propagates, padding is -inf) and avg (with and without the padding in the
    count) on a strided view, equal to the unfold2d + reduce composition on cn.NumPy()."""
    x = RNG.standard_normal((2, 3, 9, 7)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    view = lambda b: cn.tensor(x, backend=b).permute(0, 1, 3, 2)     # (2, 3, 7, 9), not contiguous
    avg_args = {k: v for k, v in args.items() if k != "dilation"}
    for backend in _stacks(gpu):
        want = cn.max_pool2d(view(cn.NumPy()), **args).numpy()
        got = cn.max_pool2d(view(backend), **args).numpy()
        np.testing.assert_array_equal(got, want, err_msg=repr(backend))
        for include in (True, False):
            want = cn.avg_pool2d(view(cn.NumPy()), count_include_pad=include, **avg_args).numpy()
            got = cn.avg_pool2d(view(backend), count_include_pad=include, **avg_args).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=repr(backend))


def test_conv_relu_pool_runs_two_kernels(gpu):
    """conv + ReLU (the conv's epilogue) + max pool: two kernels, no unfold2d, no reduction
    (the MNIST CNN's block; see also the pool prologue on Fusion below)."""
    x = RNG.standard_normal((2, 4, 12, 12)).astype(np.float32)
    w = RNG.standard_normal((16, 4, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(16).astype(np.float32)

    def forward(backend):
        t = lambda a: cn.tensor(a, backend=backend)
        return cn.max_pool2d(cn.conv2d(t(x), t(w), t(b), padding=1, activation="relu"), 2)

    want = forward(cn.NumPy()).numpy()
    for backend in _stacks(gpu):
        names = _kernels(backend, lambda: forward(backend))
        assert [n.split("_")[0] for n in names[-2:]] == ["conv2d", "pool2d"], names
        assert not any("unfold" in n or "reduce" in n for n in names), names
        np.testing.assert_allclose(forward(backend).numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["max", "avg"])
def test_fusion_runs_the_elementwise_group_inside_the_pool(gpu, op):
    """On cn.Fusion a pending elementwise group feeding a pool (conv -> + bias -> ReLU, NaN
    included) is the pool kernel's prologue: one launch after the conv, the group never stored;
    read afterwards, the group is computed by its own kernel and equals the composition."""
    x = RNG.standard_normal((2, 4, 10, 9)).astype(np.float32)
    w = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    b = RNG.standard_normal((1, 8, 1, 1)).astype(np.float32)
    x[1, 2, 3, 4] = np.nan
    pool = (lambda t: cn.max_pool2d(t, 3, stride=2, padding=1)) if op == "max" else \
        (lambda t: cn.avg_pool2d(t, 2, padding=1, count_include_pad=False))

    def forward(backend, keep=False):
        t = lambda a: cn.tensor(a, backend=backend)
        act = ((cn.conv2d(t(x), t(w)) + t(b)) * 0.5).relu()
        return (pool(act), act) if keep else pool(act)

    want, want_act = (v.numpy() for v in forward(cn.NumPy(), keep=True))
    fused = cn.Fusion(gpu)
    names = _kernels(fused, lambda: forward(fused))
    assert len(names) == 2 and names[0].startswith("conv2d"), names
    assert names[1].startswith("pool2d_" + op) and "_fused_add_mul_le_where" in names[1], names
    np.testing.assert_allclose(forward(fused).numpy(), want, rtol=1e-5, atol=1e-5)
    got, act = forward(fused, keep=True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(act.numpy(), want_act, rtol=1e-5, atol=1e-5)


def test_abilities_are_declared(gpu):
    assert gpu.pool2d_kernel is True and cn.Fusion(gpu).pool2d_kernel is True
    # Autodiff differentiates the composition (unfold2d + reduce), so it does not forward it.
    assert cn.Autodiff(gpu).pool2d_kernel is False
    assert cn.NumPy().pool2d_kernel is False and cn.Python().pool2d_kernel is False


# -- batch norm folded into the conv at import -----------------------------------------------

def _model(nodes, inits, x_shape, out="z"):
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]).SerializeToString()


def _bn_inits(channels, prefix):
    return {prefix + "s": RNG.standard_normal(channels).astype(np.float32),
            prefix + "be": RNG.standard_normal(channels).astype(np.float32),
            prefix + "m": RNG.standard_normal(channels).astype(np.float32),
            prefix + "v": RNG.uniform(0.05, 3.0, channels).astype(np.float32)}


def _bn(inp, out, prefix, eps=1e-5):
    from onnx import helper
    return helper.make_node("BatchNormalization", [inp] + [prefix + k for k in ("s", "be", "m", "v")],
                            [out], epsilon=eps)


def _check_against_onnxruntime(gpu, data, x):
    import onnxruntime
    from cinders.onnx import load
    want = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sources = []
    for backend in _stacks(gpu) + (cn.NumPy(),):
        model = load(data, backend=backend)
        sources.append(model.source)
        got = model(cn.tensor(x, backend=backend)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=repr(backend))
    return sources[0]


def test_batch_norm_and_activation_fold_into_the_conv(gpu):
    """Conv (bias) -> BN -> Relu and a bias-free grouped Conv -> BN -> Clip(0, 6) feeding an
    Add: both batch norms become the convs' weights and biases, the activations their
    epilogues (three kernels in all); results equal onnxruntime's."""
    from onnx import helper
    x = RNG.standard_normal((2, 4, 9, 8)).astype(np.float32)
    inits = {"w1": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32),
             "b1": RNG.standard_normal(8).astype(np.float32),
             "w2": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)}
    inits.update(_bn_inits(8, "n1"))
    inits.update(_bn_inits(8, "n2"))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             _bn("c1", "y1", "n1", 1e-3),
             helper.make_node("Relu", ["y1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=2),
             _bn("c2", "y2", "n2"),
             helper.make_node("Clip", ["y2", "lo", "hi"], ["q2"]),
             helper.make_node("Add", ["q2", "r1"], ["z"])]
    inits.update(lo=np.array(0.0, np.float32), hi=np.array(6.0, np.float32))
    source = _check_against_onnxruntime(gpu, _model(nodes, inits, x.shape), x)
    assert "BatchNormalization" not in source and "Clip" not in source, source

    from cinders.onnx import load
    model = load(_model(nodes, inits, x.shape), backend=gpu)
    names = _kernels(gpu, lambda: model(cn.tensor(x, backend=gpu)))
    assert [n.split("_")[-1] for n in names] == ["relu", "relu6", "add"], names


def test_batch_norm_that_cannot_fold_stays(gpu):
    """A conv output read by the batch norm and by another node, or by a node of an If branch:
    the batch norm stays, and the result still equals onnxruntime's."""
    from onnx import TensorProto, helper
    x = RNG.standard_normal((1, 3, 6, 7)).astype(np.float32)
    inits = {"w": RNG.standard_normal((5, 3, 3, 3)).astype(np.float32), "cond": np.array(True)}
    inits.update(_bn_inits(5, "n"))
    head = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), _bn("c", "y", "n")]
    branch = lambda name, op: helper.make_graph(   # noqa: E731
        [helper.make_node(op, ["c"], ["b_" + name])], name, [],
        [helper.make_tensor_value_info("b_" + name, TensorProto.FLOAT, None)])
    for tail in ([helper.make_node("Add", ["y", "c"], ["z"])],
                 [helper.make_node("If", ["cond"], ["t"], then_branch=branch("then", "Relu"),
                                   else_branch=branch("else", "Neg")),
                  helper.make_node("Add", ["y", "t"], ["z"])]):
        source = _check_against_onnxruntime(gpu, _model(head + tail, inits, x.shape), x)
        assert "BatchNormalization" in source


def test_depthwise_convs_with_silu_hardswish_hardsigmoid_against_onnxruntime(gpu):
    """Depthwise convs followed by x * Sigmoid(x) (SiLU as exporters write it), HardSwish,
    torch's HardSigmoid and a Clip(0, 6) whose bounds are Constant nodes: each becomes its
    conv's activation (cn.Wasm()'s and cn.Wgpu()'s kernels apply it at the store; cn.NumPy()
    and cn.Autodiff compose it), and a Sigmoid * x whose x has a third reader, or a HardSigmoid
    of another slope, stays. Every backend equals onnxruntime's output."""
    import onnxruntime
    from onnx import helper, numpy_helper
    from cinders.onnx import load
    x = RNG.standard_normal((1, 6, 17, 16)).astype(np.float32)
    inits = {"w1": RNG.standard_normal((6, 1, 3, 3)).astype(np.float32), "b1": RNG.standard_normal(6).astype(np.float32),
             "w2": RNG.standard_normal((12, 1, 5, 5)).astype(np.float32),
             "w3": RNG.standard_normal((12, 12, 1, 1)).astype(np.float32),
             "w4": RNG.standard_normal((12, 1, 7, 7)).astype(np.float32),
             "w5": RNG.standard_normal((12, 12, 1, 1)).astype(np.float32)}
    const = lambda name, v: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(  # noqa: E731
        np.array(v, np.float32), name))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], group=6),
             helper.make_node("Sigmoid", ["c1"], ["s1"]),
             helper.make_node("Mul", ["c1", "s1"], ["a1"]),                        # silu
             helper.make_node("Conv", ["a1", "w2"], ["c2"], pads=[2, 2, 2, 2], strides=[2, 2], group=6),
             helper.make_node("HardSwish", ["c2"], ["a2"]),
             helper.make_node("Conv", ["a2", "w3"], ["c3"]),
             helper.make_node("HardSigmoid", ["c3"], ["a3"], alpha=1 / 6, beta=0.5),
             helper.make_node("Conv", ["a3", "w4"], ["c4"], pads=[3, 3, 3, 3], group=12),
             const("lo", 0.0), const("hi", 6.0),
             helper.make_node("Clip", ["c4", "lo", "hi"], ["a4"]),                 # relu6
             helper.make_node("Conv", ["a4", "w5"], ["c5"]),
             helper.make_node("Sigmoid", ["c5"], ["s5"]),
             helper.make_node("Mul", ["s5", "c5"], ["m5"]),                        # c5 read thrice
             helper.make_node("HardSigmoid", ["c5"], ["h5"], alpha=0.2, beta=0.5),  # another slope
             helper.make_node("Add", ["m5", "h5"], ["z"])]
    data = _model(nodes, inits, x.shape)
    want = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for backend in (cn.Wasm(engine="native"), cn.Wasm(engine="wasmtime"), cn.Autodiff(cn.Wasm(engine="native")),
                    gpu, cn.NumPy()):
        model = load(data, backend=backend)
        got = model(cn.tensor(x, backend=backend)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=repr(backend))
    for activation in ("silu", "hardswish", "hardsigmoid", "relu6"):
        assert "activation='%s'" % activation in model.source, model.source
    assert "Clip" not in model.source and model.source.count("Sigmoid(") == 1, model.source
    assert model.source.count("HardSigmoid(") == 1 and "HardSwish(" not in model.source, model.source
    model = load(data, backend=gpu)
    convs = [n for n in _kernels(gpu, lambda: model(cn.tensor(x, backend=gpu))) if n.startswith("conv2d")]
    assert [n.split("_")[-1] for n in convs][:4] == ["silu", "hardswish", "hardsigmoid", "relu6"], convs


def test_per_channel_adds_fold_into_the_conv_bias(gpu):
    """PaddlePaddle's export of conv + bias + ReLU: a bias-free Conv, an Add of a (1, C, 1, 1)
    constant, an Identity, a Relu: one conv with bias and activation. A (C, 1, 1) constant
    added (first operand) to a conv with a bias folds too; a (C,) constant (it broadcasts along
    W, here as long as C) does not. Results equal onnxruntime's."""
    from onnx import helper
    x = RNG.standard_normal((1, 4, 7, 6)).astype(np.float32)
    inits = {"w1": RNG.standard_normal((6, 4, 3, 3)).astype(np.float32),
             "a1": RNG.standard_normal((1, 6, 1, 1)).astype(np.float32),
             "w2": RNG.standard_normal((6, 1, 3, 3)).astype(np.float32), "b2": RNG.standard_normal(6).astype(np.float32),
             "a2": RNG.standard_normal((6, 1, 1)).astype(np.float32),
             "w3": RNG.standard_normal((6, 6, 1, 1)).astype(np.float32),
             "a3": RNG.standard_normal(6).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "a1"], ["d1"]),
             helper.make_node("Identity", ["d1"], ["i1"]),
             helper.make_node("Relu", ["i1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=6),
             helper.make_node("Add", ["a2", "c2"], ["d2"]),
             helper.make_node("Conv", ["d2", "w3"], ["c3"]),
             helper.make_node("Add", ["c3", "a3"], ["z"])]
    source = _check_against_onnxruntime(gpu, _model(nodes, inits, x.shape), x)
    assert source.count(" + ") == 1 and "Relu" not in source and "activation='relu'" in source, source


MAXPOOLS = [dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),      # resnet's
            dict(kernel_shape=[3, 2], pads=[1, 0, 1, 0], dilations=[2, 1]),
            dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], ceil_mode=1),
            dict(kernel_shape=[2, 2], pads=[0, 0, 1, 1], strides=[2, 2])]        # asymmetric


@pytest.mark.parametrize("attrs", MAXPOOLS, ids=str)
def test_onnx_maxpool_against_onnxruntime(gpu, attrs):
    """ONNX MaxPool with symmetric pads runs as the pool2d kernel (ceil_mode and asymmetric
    pads as the padded composition); every form equals onnxruntime's."""
    from onnx import helper
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    _check_against_onnxruntime(gpu, _model([helper.make_node("MaxPool", ["x"], ["z"], **attrs)], {}, x.shape), x)
