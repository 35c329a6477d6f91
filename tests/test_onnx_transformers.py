"""Transformers through cinders.onnx: BERT-, GPT-2-, ViT-, Whisper-encoder- and T5-encoder-style
models built from `transformers` configs with seeded random weights (tiny: 2 layers, d_model 64;
no downloads), each exported by both torch exporters (TorchScript, dynamo) and each export also
run through onnxruntime's transformer optimizer (com.microsoft ops), plus a plain
torch.nn.TransformerEncoder. Every variant is imported and compared with onnxruntime to 1e-4 on
cn.NumPy() and cn.Python(), and on cn.Wgpu() (lavapipe) captured (cn.capture) with no device read
in any call (cn.profile's device_reads): the shape arithmetic the exporters write (Shape -> Gather
-> Concat -> Reshape, ConstantOfShape -> Mul -> Equal -> Where -> Expand, Range over a sequence
length) is decided at import or on the host.

The variants come from one table (VARIANTS). Exports take seconds (dynamo: tens of seconds), so
they are cached in CINDERS_CACHE/onnx/transformers/, keyed by the torch, transformers and
onnxruntime versions and this file's builder source; an exporter that cannot export a model
skips its rows, naming the exporter's error."""

import gc
import hashlib
import inspect
import os
import sys
import warnings
import weakref

import numpy as np
import onnxruntime as ort
import pytest

import cinders as cn
from cinders.assets import cache_dir
from cinders.backend import reference_random
from cinders.onnx import OnnxError, load, to_source

sys.path.insert(0, os.path.dirname(__file__))
import onnx_models  # noqa: E402
from backends import BACKENDS  # noqa: E402

TOLERANCE = 1e-4
TINY = dict(layers=2, d=64, heads=4, ff=128, vocab=100)
# transformers models -> optimize_model's model_type (the Whisper encoder is BART-like)
HF = {"bert": "bert", "gpt2": "gpt2", "vit": "vit", "whisper": "bart", "t5": "t5"}
EXPORTERS = ("torchscript", "dynamo")
# (model, exporter, optimized): every transformers model from both exporters, as exported and
# after onnxruntime's optimizer; the TransformerEncoder as exported
VARIANTS = [(name, exporter, optimized) for name in HF for exporter in EXPORTERS for optimized in (False, True)] + \
    [("transformer_encoder", "torchscript", False)]
VARIANT_IDS = ["%s-%s%s" % (n, e, "-optimized" if o else "") for n, e, o in VARIANTS]


def _build(name):
    """(torch module in eval mode, example inputs tuple, input names, {input: {dim: name}})."""
    import torch
    onnx_models._torchvision_models()   # transformers imports torchvision when present: the stub
    import transformers as tf
    torch.manual_seed(0)
    if name == "transformer_encoder":
        model, inputs, names = onnx_models.build(name)
        return model, inputs, names, {n: {0: "batch"} for n in names}
    layers, d, heads, ff, vocab = (TINY[k] for k in ("layers", "d", "heads", "ff", "vocab"))
    ids = torch.randint(0, vocab, (2, 10))
    dims = {"x": {0: "batch", 1: "seq"}}
    if name == "bert":
        inner = tf.BertModel(tf.BertConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                                           num_attention_heads=heads, intermediate_size=ff,
                                           max_position_embeddings=64, attn_implementation="eager"))
        call = lambda m, x: m(input_ids=x).last_hidden_state  # noqa: E731
    elif name == "gpt2":
        inner = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=vocab, n_embd=d, n_layer=layers, n_head=heads,
                                                 n_inner=ff, n_positions=64, bos_token_id=0, eos_token_id=0,
                                                 use_cache=False, attn_implementation="eager"))
        # an explicit all-ones mask: the exporters write it as ConstantOfShape(Shape(x))
        call = lambda m, x: m(input_ids=x, attention_mask=torch.ones_like(x)).logits  # noqa: E731
    elif name == "t5":
        inner = tf.T5EncoderModel(tf.T5Config(vocab_size=vocab, d_model=d, d_kv=d // heads, d_ff=ff,
                                              num_layers=layers, num_heads=heads, use_cache=False,
                                              attn_implementation="eager"))
        call = lambda m, x: m(input_ids=x).last_hidden_state  # noqa: E731
    elif name == "vit":
        inner = tf.ViTModel(tf.ViTConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                                         intermediate_size=ff, image_size=32, patch_size=8,
                                         attn_implementation="eager"), add_pooling_layer=False)
        call = lambda m, x: m(pixel_values=x).last_hidden_state  # noqa: E731
        ids, dims = torch.randn(2, 3, 32, 32), {"x": {0: "batch"}}
    elif name == "whisper":
        config = tf.WhisperConfig(d_model=d, encoder_layers=layers, encoder_attention_heads=heads, encoder_ffn_dim=ff,
                                  num_mel_bins=16, max_source_positions=20, decoder_layers=1,
                                  decoder_attention_heads=heads, decoder_ffn_dim=ff, vocab_size=vocab, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                                  attn_implementation="eager")
        inner = tf.WhisperModel(config).get_encoder()
        call = lambda m, x: m(input_features=x).last_hidden_state  # noqa: E731
        ids, dims = torch.randn(2, 16, 40), {"x": {0: "batch"}}
    else:
        raise KeyError(name)
    with torch.no_grad():   # biases, norm scales and shifts away from their 0 / 1 initial values
        for p in inner.parameters():
            p.add_(torch.randn_like(p) * 0.02)

    class Wrapper(torch.nn.Module):   # one tensor in, one out: what the exporters take
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return call(self.inner, x)
    return Wrapper().eval(), (ids,), ["x"], dims


def _export(name, exporter, path):
    import torch
    model, inputs, names, dims = _build(name)
    with warnings.catch_warnings():   # (no torch.no_grad: TransformerEncoder would take its fused path)
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, inputs, path, dynamo=False, input_names=names, output_names=["y"],
                              dynamic_axes=dims, opset_version=17)
        else:
            shapes = tuple({d: torch.export.Dim(label, min=2, max=32) for d, label in dims[n].items()} for n in names)
            program = torch.onnx.export(model, inputs, dynamo=True, input_names=names, output_names=["y"],
                                        dynamic_shapes=shapes)
            program.save(path)


def _optimize(name, source, path):
    from onnxruntime.transformers.optimizer import optimize_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimize_model(source, model_type=HF[name], num_heads=TINY["heads"],
                       hidden_size=TINY["d"]).save_model_to_file(path)


def _cached(name, exporter, optimized):
    """Path of the variant's .onnx file in the cache (made now if missing). An export the exporter
    refuses skips the variant, naming its error (remembered in the cache beside the files)."""
    import torch
    import transformers
    key = hashlib.sha256(repr((torch.__version__, transformers.__version__, ort.__version__, TINY,
                                inspect.getsource(_build), inspect.getsource(_export),
                                inspect.getsource(_optimize))).encode()).hexdigest()[:12]
    folder = os.path.join(cache_dir(), "onnx", "transformers")
    os.makedirs(folder, exist_ok=True)
    raw = os.path.join(folder, "%s-%s-%s.onnx" % (name, exporter, key))
    refused = raw + ".refused"
    if os.path.exists(refused):
        with open(refused) as f:
            pytest.skip(f.read())
    if not os.path.exists(raw):
        try:
            _export(name, exporter, raw + ".tmp")
        except Exception as e:  # noqa: BLE001 - the exporter's own failure: the reason of the skip
            while e.__cause__ is not None:   # (the exporter wraps the error that says what failed)
                e = e.__cause__
            reason = "torch.onnx.export(dynamo=%s) cannot export %s: %s: %s" % (
                exporter == "dynamo", name, type(e).__name__, str(e).strip().splitlines()[0][:300])
            with open(refused, "w") as f:
                f.write(reason)
            pytest.skip(reason)
        os.replace(raw + ".tmp", raw)
    if not optimized:
        return raw
    path = raw[:-len(".onnx")] + "-optimized.onnx"
    if not os.path.exists(path):
        _optimize(name, raw, path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


@pytest.fixture(scope="session")
def exported():
    """exported(name, exporter="torchscript", optimized=False) -> path of the variant's .onnx file."""
    return lambda name, exporter="torchscript", optimized=False: _cached(name, exporter, optimized)


def _inputs(name, batch, seed):
    rng = np.random.default_rng(seed)
    if name == "transformer_encoder":
        return onnx_models.inputs_for(name, batch, seed)
    if name == "vit":
        return [rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)]
    if name == "whisper":
        return [rng.standard_normal((batch, 16, 40)).astype(np.float32)]
    return [rng.integers(0, TINY["vocab"], (batch, 7 + seed % 5)).astype(np.int64)]


def _ort(path, inputs):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})[0]


def _tensors(inputs, backend):
    return [cn.tensor(x.astype(np.int32) if x.dtype == np.int64 else x, backend=backend) for x in inputs]


def _assert_close(got, expected, what):
    assert got.shape == expected.shape, what
    scale = max(1.0, float(np.abs(expected).max()))
    assert np.abs(got - expected).max() <= TOLERANCE * scale, (what, float(np.abs(got - expected).max()))


@pytest.mark.parametrize("backend_name", ["numpy", "python"])
@pytest.mark.parametrize("name, exporter, optimized", VARIANTS, ids=VARIANT_IDS)
def test_transformer_matches_onnxruntime(exported, name, exporter, optimized, backend_name):
    """Batch 1 and 3 (and another sequence length) through one import, against onnxruntime;
    the forward reads no value of the model's backend."""
    path = exported(name, exporter, optimized)
    backend = cn.NumPy() if backend_name == "numpy" else cn.Python()
    model = load(path, backend=backend)
    assert model.device_reads == []
    for batch, seed in ((1, 0), (3, 1)):
        inputs = _inputs(name, batch, seed)
        with cn.profile(backend) as p:   # (the shape values' own reads are the host's, not counted)
            out = model(*_tensors(inputs, backend))
        assert p.device_reads == 0
        _assert_close(out.numpy(), _ort(path, inputs), (name, batch))


@pytest.mark.parametrize("name, exporter, optimized", VARIANTS, ids=VARIANT_IDS)
def test_transformer_captures_on_wgpu_without_device_reads(exported, name, exporter, optimized):
    """cn.Wgpu() (lavapipe): calls 1-3 run and record the model, later calls replay it; no call
    reads a device value (the shape arithmetic never waits for the GPU), and every replay, with
    new token values, matches onnxruntime."""
    path = exported(name, exporter, optimized)
    backend = cn.Wgpu(autotune=False)
    model = load(path, backend=backend)
    assert model.device_reads == []
    forward = cn.capture(model)
    calls = [_inputs(name, 2, seed) for seed in (0, 5, 10, 15, 20)]   # one signature (seeds 5 apart)
    outputs = []
    with cn.profile(backend) as p:
        for inputs in calls:
            outputs.append(forward(*_tensors(inputs, backend)))
    assert p.device_reads == 0, [e for e in p.events if e["kind"] == "read"]
    assert forward.replays == 2 and forward.captures == 1
    for inputs, out in zip(calls, outputs):
        _assert_close(out.numpy(), _ort(path, inputs), (name, exporter, optimized))


def test_optimizer_fuses_into_contrib_ops(exported):
    """The optimized variants are not the exports unchanged: onnxruntime's optimizer wrote
    com.microsoft ops (layer norms, GELU, attention where its patterns match) into each."""
    import onnx
    for name in HF:
        fused = {n.op_type for n in onnx.load(exported(name, "torchscript", True)).graph.node
                 if n.domain == "com.microsoft"}
        assert fused, name


def test_shape_chains_are_decided_at_import(exported):
    """GPT-2's expand of the attention mask (ConstantOfShape -> Mul -> Equal -> Where -> Expand
    over a shape of known length) folds to constants and host values: the Expand reads its shape
    from the host, and no ConstantOfShape of a known shape is left in the code."""
    source = to_source(exported("gpt2"))
    assert "device_reads = []" in source
    forward = source.split("def forward")[1]
    # the -1 entries of the target shape are replaced on the host; the all-ones vector is folded
    assert "inner_transformer_Where = ops.Where(inner_transformer_Equal, ops.host_tensor([1, 1, 1, 1], 'int32'), " \
        "inner_transformer_Reshape_4)" in forward
    assert "inner_transformer_Expand = ops.Expand(inner_transformer_And_1, inner_transformer_Where)" in forward
    assert "inner_transformer_ConstantOfShape_1" not in forward


def test_inputs_of_other_declared_dims_are_refused(exported):
    """Folding assumed the declared fixed dims (ViT's 3x32x32 image): other dims are refused with
    a clear error instead of a silently wrong result."""
    model = load(exported("vit"), backend=cn.NumPy())
    with pytest.raises(OnnxError, match="declares"):
        model(cn.tensor(np.zeros((1, 3, 16, 16), np.float32), backend=cn.NumPy()))


def test_profile_counts_device_reads():
    """cn.profile's device_reads counts every read of a tensor's values by the host."""
    backend = cn.Wgpu(autotune=False)
    x = cn.tensor([1.0, 2.0], backend=backend)
    with cn.profile(backend) as p:
        y = x + 1
        assert y.tolist() == [2.0, 3.0]
        assert y.sum().item() == 5.0
        y.numpy()
    assert p.device_reads == 3
    assert [e["name"] for e in p.events if e["kind"] == "read"] == ["tolist", "item", "numpy"]


def _graph(nodes, inputs, outputs, initializers=(), opset=17):
    from onnx import helper
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def test_constant_padding_chain_is_folded_at_import():
    """silero VAD's reflect padding: pads computed from constants only (ConstantOfShape, Concat,
    Reshape, reversing Slice, Transpose, Cast) become the literal the Pad reads."""
    from onnx import TensorProto, helper, numpy_helper
    consts = [numpy_helper.from_array(np.array([2], np.int64), "two"),
              numpy_helper.from_array(np.array([64, 0], np.int64), "tail"),
              numpy_helper.from_array(np.array([-1, 2], np.int64), "pairs"),
              numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
              numpy_helper.from_array(np.array([-2 ** 63 + 1], np.int64), "far"),
              numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array([-1], np.int64), "flat")]
    nodes = [helper.make_node("ConstantOfShape", ["two"], ["zeros"],
                              value=helper.make_tensor("v", TensorProto.INT64, [1], [0])),
             helper.make_node("Concat", ["tail", "zeros"], ["both"], axis=0),
             helper.make_node("Reshape", ["both", "pairs"], ["rows"]),
             helper.make_node("Slice", ["rows", "minus_one", "far", "zero", "minus_one"], ["reversed"]),
             helper.make_node("Transpose", ["reversed"], ["cols"], perm=[1, 0]),
             helper.make_node("Reshape", ["cols", "flat"], ["pads_long"]),
             helper.make_node("Cast", ["pads_long"], ["pads"], to=TensorProto.INT64),
             helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")]
    data = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 576])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 640])], consts)
    source = to_source(data)
    assert "y = ops.Pad(x, [0, 64, 0, 0], mode='reflect')" in source
    assert "ConstantOfShape" not in source.split("def forward")[1].replace("# ", "")
    x = np.random.default_rng(0).standard_normal((2, 576)).astype(np.float32)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(load(data, backend=cn.NumPy())(cn.tensor(x, backend=cn.NumPy())).numpy(), ref)


def _data_dependent_model():
    """y = x reshaped to (count of nonzero x, -1): NonZero's size depends on the values."""
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("NonZero", ["x"], ["where"], name="nonzero"),
             helper.make_node("Shape", ["where"], ["shape"]),
             helper.make_node("Slice", ["shape", "one", "two"], ["count"]),
             helper.make_node("Concat", ["count", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    consts = [numpy_helper.from_array(np.array([1], np.int64), "one"),
              numpy_helper.from_array(np.array([2], np.int64), "two"),
              numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    return _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)


def test_data_dependent_nodes_are_listed(tmp_path):
    """Only NonZero reads the device (its output's size is data); the shape arithmetic after it
    runs on the host. The model lists it, cn.profile counts it, `cinders import-onnx` prints it."""
    import subprocess
    data = _data_dependent_model()
    backend = cn.NumPy()
    model = load(data, backend=backend)
    assert model.device_reads == ["NonZero 'nonzero'"]
    x = np.array([1, 0, 2, 0, 3, 4, 0, 0], np.float32)
    with cn.profile(backend) as p:
        y = model(cn.tensor(x, backend=backend))
    assert p.device_reads == 1 and y.shape == (4, 2)
    path = tmp_path / "nonzero.onnx"
    path.write_bytes(data)
    done = subprocess.run([sys.executable, "-m", "cinders", "import-onnx", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 node(s) depend on data" in done.stdout and "NonZero 'nonzero'" in done.stdout


# -- text generation with a KV cache (cinders.onnx.generate) ----------------------------------------

HEADS, HEAD_DIM, LAYERS = 4, 8, 2
PASTS = ["past_key_values.%d.%s" % (i, kv) for i in range(LAYERS) for kv in ("key", "value")]


def _decoder(optimum):
    """A GPT-style decoder whose past keys/values are inputs and present ones outputs. Plain:
    positions and the causal mask come from the past length (Shape -> Range -> LessOrEqual in the
    graph); optimum-style: from the attention_mask and position_ids inputs."""
    import math
    import torch
    torch.manual_seed(0)
    vocab, width = 50, HEADS * HEAD_DIM

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
            self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                           torch.nn.Linear(4 * width, width))

        def forward(self, x, past_key, past_value, mask):
            b, t, _ = x.shape
            q, k, v = (z.reshape(b, t, HEADS, HEAD_DIM).transpose(1, 2)
                       for z in self.qkv(self.ln1(x)).split(width, dim=-1))
            k, v = torch.cat([past_key, k], 2), torch.cat([past_value, v], 2)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
            y = (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(b, t, width)
            x = x + self.proj(y)
            return x + self.mlp(self.ln2(x)), k, v

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = torch.nn.Embedding(vocab, width), torch.nn.Embedding(64, width)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln, self.head = torch.nn.LayerNorm(width), torch.nn.Linear(width, vocab, bias=False)

        def run(self, ids, pos, mask, past):
            x = self.tokens(ids) + self.positions(pos)
            present = []
            for i, block in enumerate(self.blocks):
                x, k, v = block(x, past[2 * i], past[2 * i + 1], mask)
                present += [k, v]
            return (self.head(self.ln(x)), *present)

    class Plain(Decoder):
        def forward(self, ids, *past):
            t, p = ids.shape[1], past[0].shape[2]
            pos = torch.arange(p, p + t).unsqueeze(0)
            return self.run(ids, pos, torch.arange(p + t).unsqueeze(0) <= pos.transpose(0, 1), past)

    class Optimum(Decoder):
        def forward(self, ids, attention_mask, position_ids, *past):
            t, total = ids.shape[1], attention_mask.shape[1]
            causal = torch.arange(total).unsqueeze(0) <= torch.arange(total - t, total).unsqueeze(1)
            mask = causal.unsqueeze(0).unsqueeze(0) & attention_mask.bool()[:, None, None, :]
            return self.run(ids, position_ids, mask, past)
    return (Optimum() if optimum else Plain()).eval()


def _hf_gpt2_with_cache():
    """transformers' GPT-2 (random weights) behind a wrapper whose past keys/values are inputs
    and present ones outputs (what optimum exports), with attention_mask and position_ids."""
    import torch
    onnx_models._torchvision_models()
    import transformers as tf
    torch.manual_seed(0)
    inner = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=50, n_embd=HEADS * HEAD_DIM, n_layer=LAYERS, n_head=HEADS,
                                             n_positions=64, initializer_range=0.2)).eval()
    return onnx_models.with_kv_cache(inner, LAYERS)


@pytest.fixture(scope="session")
def decoder_path(tmp_path_factory):
    """decoder_path(kind) -> the exported decoder, once per session: "plain" and "optimum" (the
    decoder above, TorchScript exporter), "gpt2" (transformers' GPT-2, dynamo exporter)."""
    import torch
    folder, paths = tmp_path_factory.mktemp("decoder"), {}

    def get(kind):
        if kind not in paths:
            path = str(folder / ("decoder-%s.onnx" % kind))
            presents = [n.replace("past_key_values", "present") for n in PASTS]
            extra = [] if kind == "plain" else ["attention_mask", "position_ids"]
            example = (torch.randint(0, 50, (2, 3)),) + \
                ((torch.ones(2, 7, dtype=torch.int64), torch.arange(4, 7).repeat(2, 1)) if extra else ()) + \
                tuple(torch.randn(2, HEADS, 4, HEAD_DIM) for _ in PASTS)
            names = dict(input_names=["input_ids"] + extra + PASTS, output_names=["logits"] + presents)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if kind == "gpt2":
                    dim = torch.export.Dim
                    batch, seq = dim("batch", min=1, max=8), dim("seq", min=1, max=32)
                    shapes = ({0: batch, 1: seq}, {0: batch, 1: dim("total", min=1, max=64)}, {0: batch, 1: seq},
                              tuple({0: batch, 2: dim("past", min=0, max=32)} for _ in PASTS))
                    torch.onnx.export(_hf_gpt2_with_cache(), example, dynamo=True, dynamic_shapes=shapes,
                                      **names).save(path)
                else:
                    dims = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"},
                            "attention_mask": {0: "batch", 1: "total"}, "position_ids": {0: "batch", 1: "seq"}}
                    dims.update({n: {0: "batch", 2: "past"} for n in PASTS})
                    dims.update({n: {0: "batch", 2: "total"} for n in presents})
                    torch.onnx.export(_decoder(kind == "optimum"), example, path, dynamo=False, opset_version=17,
                                      dynamic_axes={n: dims[n] for n in ["input_ids", "logits"] + extra + PASTS +
                                                    presents}, **names)
            paths[kind] = path
        return paths[kind]
    return get


def _reference_pick(last, step, temperature, top_k, seed, u=None):
    """The tokens cinders.onnx.generate picks from the last logits rows at `step`, in float64
    NumPy: greedy, or the Gumbel-max draw on cn.random's uniforms (core/onnx/generate.py), or on
    the uniforms `u` given."""
    if not temperature:
        return last.argmax(-1)
    if top_k:
        last = np.where(last >= np.sort(last, -1)[:, -top_k:][:, :1], last, -np.inf)
    if u is None:
        u = np.array(reference_random(last.size, "uniform", (seed * 1000003 + step) & 0xFFFFFFFF))
        u = u.reshape(last.shape)
    return (last / temperature - np.log(np.maximum(-np.log1p(-u), 2.0 ** -25))).argmax(-1)


def _ort_generate(path, prompt, steps, temperature=0.0, top_k=None, seed=None):
    """The reference: a generation loop on onnxruntime, the pasts growing from empty."""
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    rows = [list(r) for r in prompt]
    ids, filled = np.array(prompt, np.int64), 0
    past = {n: np.zeros((len(prompt), HEADS, 0, HEAD_DIM), np.float32) for n in PASTS}
    for step in range(steps):
        new = ids.shape[1]
        feed = dict(past, input_ids=ids, attention_mask=np.ones((len(prompt), filled + new), np.int64),
                    position_ids=np.tile(np.arange(filled, filled + new), (len(prompt), 1)))
        logits, *presents = session.run(None, {n: feed[n] for n in names})
        past, filled = dict(zip(PASTS, presents)), filled + new
        ids = _reference_pick(logits[:, -1].astype(np.float64), step, temperature, top_k, seed)
        ids = ids.reshape(-1, 1).astype(np.int64)
        for r, (t,) in zip(rows, ids):
            r.append(int(t))
    return rows


@pytest.mark.parametrize("kind", ["plain", "optimum", "gpt2"])
@pytest.mark.parametrize("backend_name", ["numpy", "python", "wgpu"])
def test_greedy_generation_matches_onnxruntime(decoder_path, backend_name, kind):
    """Greedy decoding with the KV cache fed back: the same tokens as a greedy loop on onnxruntime,
    whether the pasts grow (plain graph) or keep a fixed, masked length (optimum-style inputs)."""
    from cinders.onnx import generate
    backend = {"numpy": cn.NumPy, "python": cn.Python, "wgpu": lambda: cn.Wgpu(autotune=False)}[backend_name]()
    model = load(decoder_path(kind), backend=backend)
    assert model.device_reads == []
    prompt = [[5, 7, 9, 11], [1, 2, 3, 4]]
    assert generate(model, prompt, 12) == _ort_generate(decoder_path(kind), prompt, 12)


def _kinds(profile, kind):
    return [e["name"] for e in profile.events if e["kind"] == kind]


def test_window_decode_steps_replay_without_device_reads(decoder_path):
    """With a fixed-length masked cache every decode step has the same shapes: on cn.Wgpu() the
    steps after the first three replay one captured program, and greedy steps read nothing from
    the device until the tokens are returned. The programs are kept: a second call, or a prompt
    of a nearby length (the same window), records nothing and replays every decode step."""
    from cinders.onnx import generate
    from cinders.onnx.generate import drop_programs
    backend = cn.Wgpu(autotune=False)
    model = load(decoder_path("optimum"), backend=backend)
    prompt = [[5, 7, 9, 11]]
    expected = _ort_generate(decoder_path("optimum"), prompt, 10)
    with cn.profile(backend) as p:
        tokens = generate(model, prompt, 10)
    # the prompt step and its pick run as they are (shapes of their own); decode steps 1-3 and
    # their picks run (warm, recorded twice), steps 4-9 replay
    replays = _kinds(p, "replay")
    assert replays.count("step") == 6 and replays.count("next_tokens") == 6, replays
    assert sorted(_kinds(p, "record")) == ["next_tokens"] * 2 + ["step"] * 2
    assert p.device_reads == 10     # the ten picked tokens, read once at the end
    assert tokens == expected
    for again in (prompt, [[3, 5, 7, 9, 11]]):   # 4 + 10 and 5 + 10 tokens: both a window of 16
        with cn.profile(backend) as p:
            tokens = generate(model, again, 10)
        replays = _kinds(p, "replay")
        assert _kinds(p, "record") == [] and replays.count("step") == replays.count("next_tokens") == 9, replays
        assert p.device_reads == 10
        assert tokens == _ort_generate(decoder_path("optimum"), again, 10)
    drop_programs(model)   # the uncached path: recorded anew, the same tokens
    with cn.profile(backend) as p:
        assert generate(model, prompt, 10) == expected
    assert len(_kinds(p, "record")) == 4


def test_kept_programs_follow_batch_length_sampling_and_weights(decoder_path):
    """The kept programs are chosen by batch, window and sampling, so calls that differ in any of
    them give the onnxruntime tokens (a seed the same draw, call after call); new weights
    (load_state_dict) are read, not the old ones a replay would; and only the KEPT most recently
    used programs stay: a batch pushed out starts again from its uncaptured first call."""
    from cinders.onnx import generate
    from cinders.onnx.generate import KEPT
    backend = cn.Wgpu(autotune=False)
    path = decoder_path("optimum")
    model = load(path, backend=backend)
    one, two = [[5, 7, 9, 11]], [[5, 7, 9, 11], [1, 2, 3, 4]]
    for prompt, new in ((one, 8), (two, 8), (one, 20), (two, 8), (one, 8)):   # windows 16, 32
        assert generate(model, prompt, new) == _ort_generate(path, prompt, new), (prompt, new)
    for _ in range(2):
        with cn.profile(backend) as p:
            sampled = generate(model, two, 8, temperature=0.9, top_k=10, seed=3)
        assert sampled == _ort_generate(path, two, 8, 0.9, 10, 3)
    assert _kinds(p, "record") == [] and len(_kinds(p, "replay")) == 14   # 7 steps, 7 picks
    greedy = generate(model, one, 8)
    flipped = {name: np.flip(t.numpy(), 0).tolist() for name, t in model.state_dict().items()
               if t.dtype is cn.float32 and t.ndim == 2}   # other weights (embedding rows, matrices)
    model.load_state_dict(flipped, strict=False)
    reference = load(path, backend=cn.NumPy())
    reference.load_state_dict(flipped, strict=False)
    assert generate(model, one, 8) == generate(reference, one, 8) != greedy
    # two new tokens: one decode step, through the kept program of its batch: warm in a program's
    # first call, recorded in its second
    prompts = {b: [[(3 * b + i) % 50 for i in range(4)]] * b for b in range(3, 3 + KEPT + 1)}
    for b, prompt in prompts.items():
        assert generate(model, prompt, 2) == generate(reference, prompt, 2)
    with cn.profile(backend) as p:
        generate(model, prompts[3 + KEPT], 2)   # still kept: its second call records
    assert sorted(_kinds(p, "record")) == ["next_tokens", "step"]
    with cn.profile(backend) as p:
        generate(model, prompts[3], 2)           # pushed out by the others: a first call again
    assert _kinds(p, "record") == []
    gone = weakref.ref(model)   # the kept programs do not keep their model alive
    del model
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("kind", ["plain", "optimum"])
@pytest.mark.parametrize("backend_name", ["numpy", "python", "wgpu", "wasm"])
def test_sampling_gives_the_tokens_of_the_reference_draw_on_every_backend(decoder_path, backend_name, kind):
    """Sampled on the device (the Gumbel-max draw on cn.random's uniforms, top-k by TopK): one
    seed gives the same tokens on every backend, those of the same draw on onnxruntime's logits,
    and reads nothing from the device until the tokens are returned."""
    from cinders.onnx import generate
    backend = BACKENDS[backend_name]()
    model = load(decoder_path(kind), backend=backend)
    prompt = [[5, 7, 9, 11], [1, 2, 3, 4]]
    for temperature, top_k, seed in ((0.9, 10, 3), (1.5, None, 7)):
        with cn.profile(backend) as p:
            tokens = generate(model, prompt, 10, temperature=temperature, top_k=top_k, seed=seed)
        assert tokens == _ort_generate(decoder_path(kind), prompt, 10, temperature, top_k, seed), (temperature, top_k)
        assert p.device_reads == 10   # the ten picked tokens, read once at the end
    assert tokens != _ort_generate(decoder_path(kind), prompt, 10)   # it did sample: not the greedy tokens


@pytest.mark.parametrize("backend_name", ["numpy", "python", "wgpu", "wasm"])
def test_pick_draws_as_the_reference_at_the_edges_of_the_uniforms(backend_name):
    """generate's pick on wide rows against the float64 draw, where the uniforms are at their
    edges: u = 0 (E clamped), the smallest u (E by its series, where a GPU log near 1 is exact
    only to 2**-21), both sides of the series' bound 1/32, u just below 1; with and without top-k
    (a masked token with u = 0 never wins), and a top-k whose k-th value ties."""
    from cinders.onnx.generate import pick
    backend = BACKENDS[backend_name]()
    batch, vocab = 5, 1024
    logits = np.array(reference_random(batch * vocab, "normal", 11), np.float32).reshape(batch, vocab) * 3
    u = np.array(reference_random(batch * vocab, "uniform", 12), np.float32).reshape(batch, vocab)
    u[0, 5] = 0.0
    u[1, 7], u[1, 9] = 2.0 ** -24, 2.0 ** -23
    logits[2, 100] = logits[2, 200] = logits[2].max() + 10   # a tie the uniforms decide, across 1/32
    u[2, 100], u[2, 200] = 1 / 32 - 2.0 ** -16, 1 / 32 + 2.0 ** -16   # scores 0.001 apart
    u[3, :] = 1 - 2.0 ** -24
    u[3, 17] = 1 - 2.0 ** -23
    logits[4, 30] = logits[4, 31] = logits[4].max() + 1   # the top 2 tie: top_k=1 keeps both
    got_logits, got_u = (cn.tensor(a.tolist(), backend=backend) for a in (logits, u))
    for temperature, top_k in ((1.0, None), (0.7, 40), (1.3, 1), (0.5, 3)):
        got = pick(got_logits, temperature, top_k, got_u).tolist()
        expected = _reference_pick(logits.astype(np.float64), None, temperature, top_k, None, u.astype(np.float64))
        assert got == expected.reshape(batch, 1).tolist(), (temperature, top_k)
        if top_k is None:   # the edges decide: u = 0 wins; 2**-24 beats 2**-23 by less than the logits
            assert expected[:3].tolist() == [5, 9, 100], expected
        if top_k == 1:
            assert expected[4] in (30, 31) and expected[2] == 100, expected


def test_sampling_seeds_and_top_k_1(decoder_path):
    """seed=None draws from cn.random's counter (cn.manual_seed(s) then gives seed=s's tokens);
    top_k=1 at any temperature is greedy; bad arguments are one-line errors."""
    from cinders.onnx import generate
    model = load(decoder_path("optimum"), backend=cn.NumPy())
    prompt = [[5, 7, 9]]
    first = generate(model, prompt, 8, temperature=0.9, top_k=10, seed=3)
    assert all(0 <= t < 50 for t in first[0]) and len(first[0]) == 11
    cn.manual_seed(3)
    assert generate(model, prompt, 8, temperature=0.9, top_k=10) == first
    assert generate(model, prompt, 8, temperature=0.9, top_k=10) != first   # the counter moved on
    assert generate(model, prompt, 8, temperature=2.0, top_k=1, seed=4) == generate(model, prompt, 8)
    with pytest.raises(OnnxError, match="temperature"):
        generate(model, prompt, 3, temperature=-1.0)


# -- the benchmark's BERT (benchmarks/onnx_transformers.py): its build and export, smaller --------------

def _benchmark_module():
    """benchmarks/onnx_transformers.py, loaded by path (benchmarks/ on sys.path would shadow onnx)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                        "onnx_transformers.py")
    spec = importlib.util.spec_from_file_location("onnx_transformers_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_bert_captures_at_batch_1_and_16(tmp_path):
    """The benchmark's BERT (its build() and export(): vocab 1000, 512 positions, exported at seq 128),
    2 layers of d 32 instead of 4 of d 256: captured on cn.Wgpu() at batch 1 and 16 with no device
    read, matching onnxruntime."""
    bench = _benchmark_module()
    config = dict(bench.SMALL, seq=128)
    path = str(tmp_path / "bert.onnx")
    bench.export(bench.build("bert", config), config["seq"], path)
    backend = cn.Wgpu(autotune=False)
    model = load(path, backend=backend)
    assert model.device_reads == []
    forward = cn.capture(model)
    for batch in (1, 16):
        ids = np.random.default_rng(batch).integers(0, 1000, (batch, config["seq"])).astype(np.int64)
        with cn.profile(backend) as p:
            outputs = [forward(*_tensors([ids], backend)) for _ in range(4)]
        assert p.device_reads == 0, [e for e in p.events if e["kind"] == "read"]
        _assert_close(outputs[-1].numpy(), _ort(path, [ids]), batch)
    assert forward.replays == 2


def test_shape_of_a_value_of_unknown_rank_is_a_vector():
    """transformers 5.17's BERT (what the GPU machine has): the token-type ids are expanded to a
    shape computed on the host (Where(Equal(shape, -1), 1, shape)), so the embeddings' rank is not
    known at import; the attention mask's expand then takes Shape -> Gather -> Concat -> Reshape ->
    Shape -> ConstantOfShape of those embeddings. Shape's output is a vector whatever its input's
    rank, and an Expand keeps its target's length: the ConstantOfShape is folded (four ones), the
    mask's shape stays on the host, and the Expand reads nothing from the device."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array(rng.standard_normal((10, 4)).astype(np.float32), "table"),
              numpy_helper.from_array(np.zeros((1, 16), np.int64), "types"),
              numpy_helper.from_array(np.array([-1, -1], np.int64), "minus_ones"),
              numpy_helper.from_array(np.array([1, 1], np.int64), "ones"),
              numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
              numpy_helper.from_array(np.array(0, np.int64), "i0"),
              numpy_helper.from_array(np.array(1, np.int64), "i1"),
              numpy_helper.from_array(np.array([0], np.int64), "axis0"),
              numpy_helper.from_array(np.array([1], np.int64), "axis1"),
              numpy_helper.from_array(np.array(-1, np.int64), "scalar_minus_one"),
              numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "one_mask")]
    node = helper.make_node
    nodes = [node("Shape", ["x"], ["s"]), node("Gather", ["s", "i0"], ["b"]), node("Gather", ["s", "i1"], ["t"]),
             node("Unsqueeze", ["b", "axis0"], ["ub"]), node("Unsqueeze", ["t", "axis0"], ["ut"]),
             node("Concat", ["ub", "ut"], ["bt"], axis=0),
             node("Equal", ["bt", "minus_ones"], ["is_minus"]), node("Where", ["is_minus", "ones", "bt"], ["target"]),
             node("Slice", ["types", "axis0", "ut", "axis1"], ["types_t"]),
             node("Expand", ["types_t", "target"], ["types_bt"]),   # rank unknown before the fix
             node("Add", ["x", "types_bt"], ["ids"]),
             node("Gather", ["table", "ids"], ["h"]),
             node("Shape", ["h"], ["hs"]), node("Gather", ["hs", "i0"], ["hb"]), node("Gather", ["hs", "i1"], ["ht"]),
             node("Unsqueeze", ["hb", "axis0"], ["uhb"]), node("Unsqueeze", ["ht", "axis0"], ["uht"]),
             node("Concat", ["uhb", "minus_one", "uht", "uht"], ["mask_shape"], axis=0),
             node("Reshape", ["mask_shape", "minus_one"], ["flat"]), node("Shape", ["flat"], ["n"]),
             node("ConstantOfShape", ["n"], ["filled"], value=helper.make_tensor("v", TensorProto.INT64, [1], [1])),
             node("Mul", ["filled", "scalar_minus_one"], ["minus_filled"]),
             node("Equal", ["flat", "minus_filled"], ["unknown"]),
             node("Where", ["unknown", "filled", "flat"], ["mask_target"]),
             node("Expand", ["one_mask", "mask_target"], ["mask"]),
             node("ReduceSum", ["h", "minus_one"], ["row"], keepdims=1),
             node("Unsqueeze", ["row", "axis0"], ["row4"]),
             node("Mul", ["mask", "row4"], ["y"])]
    data = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.INT64, ["batch", "seq"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    forward = to_source(data).split("def forward")[1]
    assert "ConstantOfShape(" not in forward   # folded: four ones
    backend = cn.Wgpu(autotune=False)
    model = load(data, backend=backend)
    assert model.device_reads == []
    captured = cn.capture(model)
    ids = [np.random.default_rng(s).integers(0, 5, (2, 6)).astype(np.int64) for s in range(5)]
    with cn.profile(backend) as p:
        outputs = [captured(*_tensors([x], backend)) for x in ids]
    assert p.device_reads == 0, [e for e in p.events if e["kind"] == "read"]
    for x, out in zip(ids, outputs):
        _assert_close(out.numpy(), _ort(data, [x]), "mask")


@pytest.mark.parametrize("backend_name", ["numpy", "python", "wgpu"])
def test_pow_by_a_constant_2_or_3_is_products(backend_name):
    """GELU's tanh form cubes and RMS norms square by a scalar constant: the code multiplies (as
    onnxruntime does for these exponents), bit for bit onnxruntime's answer; other exponents and
    int exponents stay Pow."""
    from onnx import TensorProto, helper, numpy_helper
    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("two", 2.0), ("three", 3.0),
                                                                            ("half", 0.5))] + \
        [numpy_helper.from_array(np.array(3, np.int32), "int_three")]
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]), helper.make_node("Pow", ["x", "three"], ["cube"]),
             helper.make_node("Pow", ["sq", "half"], ["root"]), helper.make_node("Pow", ["n", "int_three"], ["ncube"]),
             helper.make_node("Pow", ["n", "two"], ["nsq"])]
    data = _graph(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5]),
                          helper.make_tensor_value_info("n", TensorProto.INT32, [4])],
                  [helper.make_tensor_value_info(n, t, None) for n, t in (("sq", TensorProto.FLOAT),
                   ("cube", TensorProto.FLOAT), ("root", TensorProto.FLOAT), ("ncube", TensorProto.INT32),
                   ("nsq", TensorProto.INT32))], consts)
    source = to_source(data)
    assert source.count("ops.power_by_constant(") == 3 and "ops.Pow(sq" in source and "ops.Pow(n" in source
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32) * 3
    n = np.array([-3, 0, 2, 7], np.int32)
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x, "n": n})
    backend = {"numpy": cn.NumPy, "python": cn.Python, "wgpu": lambda: cn.Wgpu(autotune=False)}[backend_name]()
    got = load(data, backend=backend)(cn.tensor(x, backend=backend), cn.tensor(n, backend=backend, dtype=cn.int32))
    for g, e in zip(got[:2], expected[:2]):
        np.testing.assert_array_equal(g.numpy(), e)
    np.testing.assert_allclose(got[2].numpy(), expected[2], rtol=1e-6)
    np.testing.assert_array_equal(got[3].numpy(), expected[3])
    np.testing.assert_array_equal(got[4].numpy(), expected[4])   # an int base: Pow, rounded
