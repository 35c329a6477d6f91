"""onnxruntime's contrib ops (com.microsoft) through cinders.onnx: one-node models built with
onnx.helper from one table, run in onnxruntime (the oracle) and on cinders' Python, NumPy, Wgpu
(lavapipe) and Wasm backends to 1e-4; the variants cinders refuses raise OnnxError; and BERT-
(Attention or MultiHeadAttention), GPT-2- and T5-encoder-style models from `transformers` configs
after onnxruntime's transformer optimizer, against onnxruntime.

    python tests/test_onnx_contrib.py --write-docs     # the com.microsoft section of docs/onnx-ops.md
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import cinders as cn
from cinders.onnx import OnnxError, load, to_source

sys.path.insert(0, os.path.dirname(__file__))
from backends import BACKENDS  # noqa: E402

MS = "com.microsoft"
RTOL = ATOL = 1e-4
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS_MARK = "<!-- com.microsoft: written by tests/test_onnx_contrib.py --write-docs -->"


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def ints(values, dtype=np.int32):
    return np.array(values, dtype=dtype)


B, S, D, N = 2, 3, 8, 2          # batch, sequence, hidden, heads (head size 4)
P = 2                            # past length
W_QKV = rand(D, 3 * D, seed=1, scale=0.5)
B_QKV = rand(3 * D, seed=2, scale=0.1)


def rope_caches(half, positions=16):
    """(cos, sin) caches (positions, half) of rotary embedding."""
    angles = np.arange(positions)[:, None] * (0.1 ** (np.arange(half) / half))[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


COS, SIN = rope_caches(2)

# (case id, op type, [(input name, value or None for an omitted optional input)], attributes,
#  number of outputs, domain)
CASES = [
    ("gelu", "Gelu", [("X", rand(2, 5))], {}, 1, MS),
    ("bias_gelu", "BiasGelu", [("A", rand(2, 3, 4)), ("B", rand(4, seed=1))], {}, 1, MS),
    ("fast_gelu", "FastGelu", [("X", rand(2, 5, scale=3.0))], {}, 1, MS),
    ("fast_gelu_bias", "FastGelu", [("X", rand(2, 3, 4)), ("bias", rand(4, seed=1))], {}, 1, MS),
    ("quick_gelu", "QuickGelu", [("X", rand(2, 5, scale=3.0))], {}, 1, MS),
    ("quick_gelu_alpha", "QuickGelu", [("X", rand(2, 5, scale=3.0))], {"alpha": 1.0}, 1, MS),
    ("fused_matmul", "FusedMatMul", [("A", rand(3, 4)), ("B", rand(4, 5, seed=1))], {}, 1, MS),
    ("fused_matmul_trans_alpha", "FusedMatMul", [("A", rand(4, 3)), ("B", rand(5, 4, seed=1))],
     {"transA": 1, "transB": 1, "alpha": 0.5}, 1, MS),
    ("fused_matmul_batched", "FusedMatMul", [("A", rand(2, 3, 4)), ("B", rand(2, 5, 4, seed=1))],
     {"transB": 1, "alpha": 2.0}, 1, MS),
    ("fused_matmul_trans_batch_a", "FusedMatMul", [("A", rand(3, 2, 4)), ("B", rand(2, 4, 5, seed=1))],
     {"transBatchA": 1}, 1, MS),
    ("fused_matmul_trans_batch_b", "FusedMatMul", [("A", rand(2, 3, 4)), ("B", rand(4, 2, 5, seed=1))],
     {"transBatchB": 1}, 1, MS),
    ("fused_matmul_trans_batch_both_4d", "FusedMatMul", [("A", rand(4, 2, 3, 3)), ("B", rand(5, 2, 3, 4, seed=1))],
     {"transBatchA": 1, "transA": 1, "transBatchB": 1, "transB": 1}, 1, MS),
    ("fused_matmul_vector", "FusedMatMul", [("A", rand(2, 3, 4)), ("B", rand(4, seed=1))],
     {"transB": 1}, 1, MS),
    ("skip_layer_norm", "SkipLayerNormalization",
     [("input", rand(B, S, D)), ("skip", rand(B, S, D, seed=1)), ("gamma", rand(D, seed=2))], {}, 1, MS),
    ("skip_layer_norm_all", "SkipLayerNormalization",
     [("input", rand(B, S, D)), ("skip", rand(B, S, D, seed=1)), ("gamma", rand(D, seed=2)),
      ("beta", rand(D, seed=3)), ("bias", rand(D, seed=4))], {"epsilon": 1e-5}, 4, MS),
    ("skip_layer_norm_broadcast_skip", "SkipLayerNormalization",
     [("input", rand(B, S, D)), ("skip", rand(S, D, seed=1)), ("gamma", rand(D, seed=2)),
      ("beta", rand(D, seed=3))], {}, 1, MS),
    ("skip_simplified_layer_norm", "SkipSimplifiedLayerNormalization",
     [("input", rand(B, S, D)), ("skip", rand(B, S, D, seed=1)), ("gamma", rand(D, seed=2))], {}, 1, MS),
    ("skip_simplified_layer_norm_bias_sum", "SkipSimplifiedLayerNormalization",
     [("input", rand(B, S, D)), ("skip", rand(B, S, D, seed=1)), ("gamma", rand(D, seed=2)),
      ("bias", rand(D, seed=3))], {"epsilon": 1e-6}, 4, MS),
    ("simplified_layer_norm", "SimplifiedLayerNormalization", [("X", rand(B, S, D)), ("scale", rand(D, seed=1))],
     {"epsilon": 1e-6}, 2, ""),
    ("simplified_layer_norm_axis", "SimplifiedLayerNormalization",
     [("X", rand(B, S, D)), ("scale", rand(S, D, seed=1))], {"axis": 1}, 1, ""),
    ("embed_layer_norm", "EmbedLayerNormalization",
     [("input_ids", ints([[1, 5, 7], [2, 0, 9]])), ("segment_ids", ints([[0, 0, 1], [0, 1, 1]])),
      ("word_embedding", rand(10, D)), ("position_embedding", rand(6, D, seed=1)),
      ("segment_embedding", rand(2, D, seed=2)), ("gamma", rand(D, seed=3)), ("beta", rand(D, seed=4)),
      ("mask", ints([[1, 0, 1], [1, 1, 0]]))], {}, 3, MS),   # mask_index counts ones: [2, 2]
    ("embed_layer_norm_no_segment", "EmbedLayerNormalization",
     [("input_ids", ints([[1, 5, 7], [2, 0, 9]])), ("segment_ids", None), ("word_embedding", rand(10, D)),
      ("position_embedding", rand(6, D, seed=1)), ("segment_embedding", None), ("gamma", rand(D, seed=3)),
      ("beta", rand(D, seed=4))], {"epsilon": 1e-5}, 2, MS),
    ("embed_layer_norm_position_ids", "EmbedLayerNormalization",
     [("input_ids", ints([[1, 5, 7], [2, 0, 9]])), ("segment_ids", ints([[0, 0, 1], [0, 1, 1]])),
      ("word_embedding", rand(10, D)), ("position_embedding", rand(6, D, seed=1)),
      ("segment_embedding", rand(2, D, seed=2)), ("gamma", rand(D, seed=3)), ("beta", rand(D, seed=4)),
      ("mask", None), ("position_ids", ints([[3, 2, 1], [0, 4, 5]]))], {}, 2, MS),
    ("attention", "Attention", [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV)],
     {"num_heads": N}, 1, MS),
    ("attention_mask_lengths", "Attention",
     [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV), ("mask_index", ints([3, 2]))],
     {"num_heads": N}, 1, MS),
    ("attention_mask_end_start", "Attention",
     [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV), ("mask_index", ints([3, 2, 1, 0]))],
     {"num_heads": N}, 1, MS),
    ("attention_mask_2d", "Attention",
     [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV), ("mask_index", ints([[1, 1, 0], [0, 1, 1]]))],
     {"num_heads": N}, 1, MS),
    ("attention_mask_3d", "Attention",
     [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV),
      ("mask_index", ints([[[1, 0, 1], [1, 1, 0], [0, 0, 0]], [[1, 1, 1], [0, 1, 1], [1, 0, 0]]]))],
     {"num_heads": N}, 1, MS),
    ("attention_unidirectional_mask_scale", "Attention",
     [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV), ("mask_index", ints([[1, 1, 1], [0, 1, 1]]))],
     {"num_heads": N, "unidirectional": 1, "scale": 0.3}, 1, MS),
    ("attention_past_present", "Attention",
     [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV), ("mask_index", None),
      ("past", rand(2, B, N, P, D // N, seed=5))], {"num_heads": N, "unidirectional": 1}, 2, MS),
    ("attention_decode_step", "Attention",
     [("input", rand(B, 1, D)), ("weights", W_QKV), ("bias", B_QKV), ("mask_index", ints([[1, 1, 1], [0, 1, 1]])),
      ("past", rand(2, B, N, P, D // N, seed=5))], {"num_heads": N, "unidirectional": 1}, 2, MS),
    ("attention_bias", "Attention",
     [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV), ("mask_index", None), ("past", None),
      ("attention_bias", rand(1, N, S, S, seed=6))], {"num_heads": N}, 1, MS),
    ("attention_qkv_hidden_sizes", "Attention",
     [("input", rand(B, S, D)), ("weights", rand(D, 8 + 8 + 4, seed=1)), ("bias", rand(20, seed=2))],
     {"num_heads": N, "qkv_hidden_sizes": [8, 8, 4]}, 1, MS),
    ("mha", "MultiHeadAttention", [("query", rand(B, S, D)), ("key", rand(B, 4, D, seed=1)),
                                   ("value", rand(B, 4, D, seed=2))], {"num_heads": N}, 1, MS),
    ("mha_bias_mask_2d", "MultiHeadAttention",
     [("query", rand(B, S, D)), ("key", rand(B, 4, D, seed=1)), ("value", rand(B, 4, D, seed=2)),
      ("bias", rand(3 * D, seed=3)), ("key_padding_mask", ints([[1, 1, 1, 0], [1, 0, 1, 1]]))],
     {"num_heads": N}, 1, MS),
    ("mha_mask_lengths", "MultiHeadAttention",
     [("query", rand(B, S, D)), ("key", rand(B, 4, D, seed=1)), ("value", rand(B, 4, D, seed=2)), ("bias", None),
      ("key_padding_mask", ints([4, 2]))], {"num_heads": N}, 1, MS),
    ("mha_unidirectional_past_present", "MultiHeadAttention",
     [("query", rand(B, S, D)), ("key", rand(B, S, D, seed=1)), ("value", rand(B, S, D, seed=2)),
      ("bias", rand(3 * D, seed=3)), ("key_padding_mask", None), ("attention_bias", rand(B, 1, S, P + S, seed=4)),
      ("past_key", rand(B, N, P, D // N, seed=5)), ("past_value", rand(B, N, P, D // N, seed=6))],
     {"num_heads": N, "unidirectional": 1, "scale": 0.4}, 4, MS),
    ("mha_key_as_heads", "MultiHeadAttention",
     [("query", rand(B, S, D)), ("key", rand(B, N, 5, D // N, seed=1)), ("value", rand(B, N, 5, D // N, seed=2))],
     {"num_heads": N}, 1, MS),
    ("mha_key_as_heads_bias", "MultiHeadAttention",
     [("query", rand(B, S, D)), ("key", rand(B, N, 5, D // N, seed=1)), ("value", rand(B, N, 5, D // N, seed=2)),
      ("bias", rand(3 * D, seed=3))], {"num_heads": N}, 1, MS),
    ("rotary", "RotaryEmbedding",
     [("input", rand(B, S, D)), ("position_ids", ints([[0, 1, 2], [4, 5, 6]], np.int64)), ("cos_cache", COS),
      ("sin_cache", SIN)], {}, 1, MS),
    ("rotary_offset_interleaved", "RotaryEmbedding",
     [("input", rand(B, S, D)), ("position_ids", ints([3], np.int64)), ("cos_cache", COS), ("sin_cache", SIN)],
     {"interleaved": 1}, 1, MS),
    ("rotary_4d", "RotaryEmbedding",
     [("input", rand(B, N, S, 4)), ("position_ids", ints([[0, 1, 2], [4, 5, 6]], np.int64)), ("cos_cache", COS),
      ("sin_cache", SIN)], {}, 1, MS),
    ("rotary_partial", "RotaryEmbedding",
     [("input", rand(B, S, 2 * 6)), ("position_ids", ints([[0, 1, 2], [4, 5, 6]], np.int64)), ("cos_cache", COS),
      ("sin_cache", SIN)], {"num_heads": 2, "rotary_embedding_dim": 4}, 1, MS),
]


def gqa(name, seq, past, seqlens, total, attrs=None, packed=False, rotary=False, batch=B, extra=(), outputs=3):
    """A GroupQueryAttention row: 4 query heads over 2 key/value heads of size 16 (onnxruntime's
    CPU kernel wants multiples of 16 for rotary); extra: (name, value) inputs after the caches;
    outputs (y, present_key, present_value[, qk])."""
    heads, kv, h = 4, 2, 16
    if packed:
        qkv = [("query", rand(batch, seq, (heads + 2 * kv) * h)), ("key", None), ("value", None)]
    else:
        qkv = [("query", rand(batch, seq, heads * h)), ("key", rand(batch, seq, kv * h, seed=1)),
               ("value", rand(batch, seq, kv * h, seed=2))]
    inputs = qkv + [("past_key", rand(batch, kv, past, h, seed=3) if past else None),
                    ("past_value", rand(batch, kv, past, h, seed=4) if past else None),
                    ("seqlens_k", ints(seqlens)), ("total_sequence_length", ints(total))]
    if rotary:
        inputs += list(zip(("cos_cache", "sin_cache"), rope_caches(h // 2)))
    inputs += list(extra)
    return (name, "GroupQueryAttention", inputs, dict({"num_heads": heads, "kv_num_heads": kv}, **(attrs or {})),
            outputs, MS)


CASES += [
    gqa("gqa_prompt", S, 0, [S - 1] * B, S),
    gqa("gqa_decode", 1, 3, [3, 3], 4),
    gqa("gqa_chunk_after_past_rotary", 2, 3, [4], 5, {"do_rotary": 1}, rotary=True, batch=1),
    gqa("gqa_packed_rotary_interleaved", S, 0, [S - 1] * B, S, {"do_rotary": 1, "rotary_interleaved": 1},
        packed=True, rotary=True),
    gqa("gqa_local_window_softcap_scale", 4, 0, [3, 3], 4, {"local_window_size": 1, "softcap": 2.0, "scale": 0.3}),
    gqa("gqa_not_causal", S, 0, [S - 1] * B, S, {"causal": 0}),
    gqa("gqa_shared_buffer_ragged", 1, 6, [3, 2], 4),
    gqa("gqa_rotary_position_ids", S, 0, [S - 1] * B, S, {"do_rotary": 1}, rotary=True,
        extra=[("position_ids", ints([[2, 0, 1], [5, 3, 4]], np.int64))]),
    gqa("gqa_attention_bias", 1, 6, [3, 2], 4, extra=[("cos_cache", None), ("sin_cache", None), ("position_ids", None),
                                                      ("attention_bias", rand(B, 1, 1, 4, seed=7))]),
    gqa("gqa_ragged_prompt", S, 0, [S - 1, S - 2], S),
    gqa("gqa_qk_before_softmax", S, 0, [S - 1, S - 2], S, {"qk_output": 1, "softcap": 2.0, "scale": 0.5}, outputs=4),
    gqa("gqa_qk_after_softmax_bias", 1, 6, [3, 2], 4, {"qk_output": 2}, outputs=4,
        extra=[("cos_cache", None), ("sin_cache", None), ("position_ids", None),
               ("attention_bias", rand(B, 1, 1, 4, seed=7))]),
    gqa("gqa_qk_before_softmax_bias", 1, 6, [3, 2], 4, {"qk_output": 1}, outputs=4,
        extra=[("cos_cache", None), ("sin_cache", None), ("position_ids", None),
               ("attention_bias", rand(B, 1, 1, 4, seed=7))]),
]

# Variants onnxruntime documents that cinders refuses (never a silently wrong answer).
REFUSED = [
    ("attention_mask_4d", "Attention",
     [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV), ("mask_index", ints(np.ones((B, 1, 4, 4))))],
     {"num_heads": N}, 1, MS),
    ("attention_mask_3b_plus_2", "Attention",
     [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV), ("mask_index", ints([3] * (3 * B + 2)))],
     {"num_heads": N}, 1, MS),
    ("attention_do_rotary", "Attention", [("input", rand(B, S, D)), ("weights", W_QKV), ("bias", B_QKV)],
     {"num_heads": N, "do_rotary": 1}, 1, MS),
    ("mha_packed_qkv", "MultiHeadAttention", [("query", rand(B, S, N, 3, D // N))], {"num_heads": N}, 1, MS),
    ("mha_packed_kv", "MultiHeadAttention", [("query", rand(B, S, D)), ("key", rand(B, 4, N, 2, D // N, seed=1))],
     {"num_heads": N}, 1, MS),
    ("rotary_packed_batching", "RotaryEmbedding",
     [("input", rand(B, S, D)), ("position_ids", ints([0], np.int64)), ("cos_cache", COS), ("sin_cache", SIN)],
     {"is_packed_batching": 1}, 1, MS),
    gqa("gqa_qk_output_without_its_output", S, 0, [S - 1] * B, S, {"qk_output": 1}),
    gqa("gqa_sliding_window_cache", 1, 3, [3, 3], 4, {"sliding_window_cache": 1, "local_window_size": 2}),
]


INT_OUTPUTS = {("EmbedLayerNormalization", 1): onnx.TensorProto.INT32}   # (op, output index): others float


def make_model(case):
    """(model bytes, {input name: array}, [output names]) of a one-node model for a table row."""
    name, op_type, inputs, attrs, n_out, domain = case
    feeds = {n: v for n, v in inputs if v is not None}
    outputs = ["y%d" % i for i in range(n_out)]
    node = helper.make_node(op_type, [n if v is not None else "" for n, v in inputs], outputs, domain=domain,
                            name=name, **attrs)
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [helper.make_tensor_value_info(o, INT_OUTPUTS.get((op_type, i), onnx.TensorProto.FLOAT), None)
         for i, o in enumerate(outputs)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString(), feeds, outputs


def onnxruntime_outputs(data, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def cinders_outputs(data, feeds, backend):
    model = load(data, backend=backend)
    out = model(*[cn.tensor(v, backend=backend) for v in feeds.values()])
    return [np.asarray(t.numpy()) for t in (out if isinstance(out, tuple) else (out,))]


@pytest.fixture(scope="module", params=["python", "numpy", "wgpu", "wasm"])
def backend(request):
    return BACKENDS[request.param]()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_contrib_op_matches_onnxruntime(case, backend):
    data, feeds, _ = make_model(case)
    expected = onnxruntime_outputs(data, feeds)
    got = cinders_outputs(data, feeds, backend)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e.astype(g.dtype), rtol=RTOL, atol=ATOL)


def test_generated_code_names_the_domain():
    """com.microsoft ops are called through their own namespace: `ops.com_microsoft.Attention`
    and the ai.onnx Attention stay two different functions."""
    rows = {c[0]: c for c in CASES}
    source = to_source(make_model(rows["attention_past_present"])[0])
    assert "ops.com_microsoft.Attention(" in source
    source = to_source(make_model(rows["simplified_layer_norm"])[0])
    assert "ops.SimplifiedLayerNormalization(" in source
    from cinders.onnx import ops
    assert ops.com_microsoft.Attention is not ops.Attention
    assert ops.REGISTRY[(MS, "RotaryEmbedding")] is not ops.REGISTRY[("", "RotaryEmbedding")]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_unsupported_variant_is_refused(case):
    data, feeds, _ = make_model(case)
    with pytest.raises(OnnxError):
        cinders_outputs(data, feeds, cn.NumPy())


def test_unknown_contrib_op_is_listed():
    data, _, _ = make_model(("x", "NotAnOp", [("X", rand(2))], {}, 1, MS))
    with pytest.raises(OnnxError, match="NotAnOp"):
        load(data, backend=cn.NumPy())


# -- transformers after onnxruntime's transformer optimizer --------------------------------------------

HIDDEN, HEADS, VOCAB = 32, 4, 100
# name -> (transformers model class and config, its inputs, optimizer model_type, FusionOptions set to
# True, the contrib ops the optimized graph must hold). transformers 5's GPT-2 attention and mask graph
# does not match the optimizer's attention patterns: only its norms and GELU fuse.
TRANSFORMERS = {
    "bert": ("BertModel", "BertConfig", dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
                                             intermediate_size=2 * HIDDEN, max_position_embeddings=64),
             ["input_ids", "attention_mask", "token_type_ids"], "bert", [],
             {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"}),
    "bert_mha_fast_gelu": ("BertModel", "BertConfig", dict(hidden_size=HIDDEN, num_hidden_layers=2,
                                                           num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
                                                           max_position_embeddings=64),
                           ["input_ids", "attention_mask", "token_type_ids"], "bert",
                           ["use_multi_head_attention", "enable_gelu_approximation"],
                           {"EmbedLayerNormalization", "MultiHeadAttention", "SkipLayerNormalization", "FastGelu"}),
    "gpt2": ("GPT2Model", "GPT2Config", dict(n_embd=HIDDEN, n_layer=2, n_head=HEADS, n_positions=64),
             ["input_ids", "attention_mask"], "gpt2", [], {"SkipLayerNormalization", "FastGelu"}),
    "t5_encoder": ("T5EncoderModel", "T5Config", dict(d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN,
                                                      num_layers=2, num_heads=HEADS),
                   ["input_ids", "attention_mask"], "t5", [],
                   {"SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"}),
}


def optimized_transformer(name, folder):
    """(optimized model path, example feeds) of a 2-layer model built from a `transformers` config
    with seeded random weights, exported by torch.onnx.export (dynamo=False) and run through
    onnxruntime.transformers.optimizer.optimize_model."""
    import onnx_models
    onnx_models._torchvision_models()   # transformers imports torchvision, whose __init__ fails here
    import torch
    import transformers
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model
    model_class, config_class, sizes, names, model_type, options, _ = TRANSFORMERS[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=VOCAB, use_cache=False, attn_implementation="eager",
                                                 **sizes)
    net = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():   # biases, norm scales and shifts away from their 0 / 1 initial values
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)

    class LastHiddenState(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, *inputs):
            return self.net(**dict(zip(names, inputs))).last_hidden_state

    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, VOCAB, (2, 8)), "attention_mask": np.ones((2, 8), np.int64),
             "token_type_ids": np.concatenate([np.zeros((2, 4), np.int64), np.ones((2, 4), np.int64)], 1)}
    feeds["attention_mask"][1, 5:] = 0   # right padding in the second sequence
    feeds = {n: feeds[n] for n in names}
    raw, path = os.path.join(folder, name + ".onnx"), os.path.join(folder, name + "_optimized.onnx")
    torch.onnx.export(LastHiddenState(net), tuple(torch.from_numpy(v) for v in feeds.values()), raw,
                      input_names=names, output_names=["hidden"], dynamo=False, opset_version=17,
                      dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names})
    fusion = FusionOptions(model_type)
    for option in options:
        setattr(fusion, option, True)
    optimize_model(raw, model_type=model_type, num_heads=HEADS, hidden_size=HIDDEN,
                   optimization_options=fusion).save_model_to_file(path)
    return path, feeds


@pytest.fixture(scope="module", params=sorted(TRANSFORMERS))
def transformer(request, tmp_path_factory):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path, feeds = optimized_transformer(request.param, str(tmp_path_factory.mktemp(request.param)))
    return request.param, path, feeds


@pytest.mark.parametrize("backend_name", ["numpy", "python", "wgpu", "wasm"])
def test_optimized_transformer_matches_onnxruntime(transformer, backend_name):
    """The optimizer's graph holds the contrib ops, and cinders answers as onnxruntime does on it."""
    name, path, feeds = transformer
    fused = {n.op_type for n in onnx.load(path).graph.node if n.domain == MS or n.op_type.startswith("Simplified")}
    assert TRANSFORMERS[name][-1] <= fused, fused
    with open(path, "rb") as f:
        data = f.read()
    expected = onnxruntime_outputs(data, feeds)[0]
    got = cinders_outputs(data, feeds, BACKENDS[backend_name]())[0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


# -- docs/onnx-ops.md: the com.microsoft section ---------------------------------------------------------

def case_result(case, backend):
    """pass | fail: one table row on one backend against onnxruntime."""
    data, feeds, _ = make_model(case)
    try:
        expected = onnxruntime_outputs(data, feeds)
        got = cinders_outputs(data, feeds, backend)
        ok = len(got) == len(expected) and all(
            g.shape == e.shape and np.allclose(g, e, rtol=RTOL, atol=ATOL) for g, e in zip(got, expected))
    except Exception:  # noqa: BLE001  (a crash is a failure in the table, not an abort)
        ok = False
    return "pass" if ok else "fail"


def write_docs(path=os.path.join(ROOT, "docs", "onnx-ops.md")):
    """Replace the section after DOCS_MARK (tests/onnx_node_cases.py keeps it when it rewrites the
    table above) with the com.microsoft ops: cases passed / run per backend, and refused variants."""
    backends = {"NumPy": cn.NumPy(), "Python": cn.Python(), "Wgpu": cn.Wgpu(), "Wasm": cn.Wasm()}
    per_op = {}
    for case in CASES:
        per_op.setdefault((case[5], case[1]), []).append(case)
    lines = [DOCS_MARK, "", "## onnxruntime contrib ops (com.microsoft)", "",
             "Generated by `python tests/test_onnx_contrib.py --write-docs` from that file's table of one-node",
             "models, each against onnxruntime %s (CPU) to %g: cases passed / run per backend."
             % (ort.__version__, RTOL),
             "These are the ops `onnxruntime.transformers.optimizer.optimize_model` writes; BERT-, GPT-2-",
             "and T5-encoder-style models after it are tested in the same file. Refused variants raise",
             "OnnxError.", "",
             "| op | domain | cases | " + " | ".join(backends) + " | refused |",
             "| --- | --- | --- |" + " --- |" * len(backends) + " --- |"]
    for (domain, op_type), cases in sorted(per_op.items(), key=lambda kv: kv[0][1]):
        row = ["`%s`" % op_type, domain or "ai.onnx (onnxruntime's)", str(len(cases))]
        for backend in backends.values():
            row.append("%d / %d" % (sum(case_result(c, backend) == "pass" for c in cases), len(cases)))
        row.append(", ".join("`%s`" % c[0] for c in REFUSED if c[1] == op_type))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Refused: Attention's 4-D (Megatron) and (3B+2) masks, do_rotary, shared past/present buffers;",
              "MultiHeadAttention's packed QKV/KV, cache_indirection; RotaryEmbedding's packed batching and",
              "scale; GroupQueryAttention's quantized caches, sliding_window_cache, head_sink/smooth_softmax,",
              "q/k norms and query_seqlens. BiasAdd and BiasSplitGelu (diffusion models, CUDA-only in",
              "onnxruntime) are not implemented."]
    with open(path) as f:
        text = f.read()
    head = text[:text.index(DOCS_MARK)].rstrip("\n") if DOCS_MARK in text else text.rstrip("\n")
    with open(path, "w") as f:
        f.write(head + "\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    if "--write-docs" in sys.argv:
        write_docs()
