"""Real models through cinders.onnx against onnxruntime (1e-4): torchvision architectures with
seeded random weights and sequence/audio models, each exported by both PyTorch exporters, at
batch 1 and 8 through one import (the batch dim is symbolic); and the test models the onnx
package ships. Exports are cached in .cache/onnx/ (tests/onnx_models.py)."""

import glob
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import cinders as cn
from cinders.onnx import OnnxError, load

sys.path.insert(0, os.path.dirname(__file__))
import onnx_models  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
TOLERANCE = 1e-4


def _ort(path, inputs):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})


def _check(path, name, backend, batches=(1, 8)):
    model = load(path, backend=backend)
    for batch in batches:
        inputs = onnx_models.inputs_for(name, batch)
        expected = _ort(path, inputs)[0]
        got = model(*[cn.tensor(x, backend=backend) for x in inputs]).numpy()
        assert got.shape == expected.shape
        scale = max(1.0, float(np.abs(expected).max()))
        assert np.abs(got - expected).max() <= TOLERANCE * scale, (name, batch, np.abs(got - expected).max())


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", onnx_models.VISION + onnx_models.SEQUENCE)
def test_real_model_matches_onnxruntime_on_numpy(name, exporter):
    _check(onnx_models.export(name, exporter), name, cn.NumPy())


@pytest.mark.parametrize("name, exporter", [("mobilenet_v3_small", "torchscript"), ("mobilenet_v3_small", "dynamo"),
                                            ("transformer_encoder", "dynamo"), ("lstm", "torchscript"),
                                            ("gru", "dynamo"), ("audio_conv1d", "torchscript")])
def test_real_model_matches_onnxruntime_on_wgpu(name, exporter):
    """The same comparison on cn.Wgpu() (lavapipe in CI), batch 1 and 8, for a lean subset."""
    _check(onnx_models.export(name, exporter), name, cn.Wgpu())


def _shipped_models():
    found = []
    for kind in ("pytorch-converted", "pytorch-operator", "simple"):
        found += sorted(glob.glob(os.path.join(DATA, kind, "*", "model.onnx")))
    return found


def test_models_shipped_with_onnx():
    """Every test model under onnx/backend/test/data/{pytorch-converted,pytorch-operator,simple}
    with its stored inputs and outputs: imports and matches, or is reported unsupported at import."""
    passed, unsupported = [], []
    for path in _shipped_models():
        folder = os.path.dirname(path)
        try:
            model = load(path, backend=cn.NumPy())
        except OnnxError as e:
            unsupported.append((folder, str(e).splitlines()[-1]))
            continue
        for data_set in sorted(glob.glob(os.path.join(folder, "test_data_set_*"))):
            inputs = [numpy_helper.to_array(onnx.load_tensor(p))
                      for p in sorted(glob.glob(os.path.join(data_set, "input_*.pb")))]
            outputs = [numpy_helper.to_array(onnx.load_tensor(p))
                       for p in sorted(glob.glob(os.path.join(data_set, "output_*.pb")))]
            got = model(*[cn.tensor(x, backend=cn.NumPy()) for x in inputs])
            got = got if isinstance(got, tuple) else (got,)
            for g, e in zip(got, outputs):
                np.testing.assert_allclose(g.numpy(), e.astype(g.numpy().dtype), rtol=1e-3, atol=TOLERANCE,
                                           err_msg=folder)
        passed.append(folder)
    assert len(passed) >= 120, (len(passed), unsupported)
    assert len(unsupported) <= 16, unsupported   # sequences, strings, training-only Gradient
