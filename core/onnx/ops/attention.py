"""ONNX operators: attention (opset 23+)."""

import math

import cinders as cn
from ...dtypes import bool_, int32
from ...functional import softmax, stack
from ...indexing import _take
from .base import op


@op(multi=True)
def Attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, is_causal=0,
              kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
              softmax_precision=None, left_window_size=-1, right_window_size=-1, outputs=1):
    three_d = Q.ndim == 3
    if three_d:  # (B, S, H*D) -> (B, H, S, D)
        b = Q.shape[0]
        Q = Q.reshape(b, Q.shape[1], q_num_heads, -1).transpose(1, 2)
        K = K.reshape(b, K.shape[1], kv_num_heads, -1).transpose(1, 2)
        V = V.reshape(b, V.shape[1], kv_num_heads, -1).transpose(1, 2)
    past = past_key.shape[2] if past_key is not None else 0
    if past_key is not None:
        K = cn.cat([past_key, K], 2)
    if past_value is not None:
        V = cn.cat([past_value, V], 2)
    present_k, present_v = K, V
    hq, hk = Q.shape[1], K.shape[1]
    if hq != hk:  # grouped-query attention: each K/V head serves hq // hk query heads
        rep = hq // hk
        K = K.unsqueeze(2).expand(K.shape[0], hk, rep, K.shape[2], K.shape[3]).reshape(K.shape[0], hq, K.shape[2], K.shape[3])
        V = V.unsqueeze(2).expand(V.shape[0], hk, rep, V.shape[2], V.shape[3]).reshape(V.shape[0], hq, V.shape[2], V.shape[3])
    d = Q.shape[-1]
    s = (1.0 / math.sqrt(d)) if scale is None else scale
    qk = (Q * math.sqrt(s)) @ (K * math.sqrt(s)).transpose(-2, -1)
    if softcap:  # before the mask, so that masked positions stay -inf
        qk = (qk / softcap).tanh() * softcap
    sq, skv = qk.shape[-2], qk.shape[-1]
    bias = None
    if attn_mask is not None:
        m = attn_mask
        if m.shape[-1] < skv:  # a mask shorter than the keys: the rest is masked out
            m = cn.pad(m, [0, skv - m.shape[-1]], False if m.dtype is bool_ else -math.inf)
        bias = cn.where(m, 0.0, -math.inf) if m.dtype is bool_ else m
    rows = cn.arange(sq, backend=Q.backend).reshape(sq, 1)
    cols = cn.arange(skv, backend=Q.backend).reshape(1, skv)
    # query i sits at absolute position i + offset: after the keys that precede this block
    if past_key is None and nonpad_kv_seqlen is not None:
        offset = (nonpad_kv_seqlen.cast(int32) - sq).reshape(-1, 1, 1, 1)
    else:
        offset = past
    if is_causal:
        causal = cn.where(cols <= rows + offset, 0.0, -math.inf)
        bias = causal if bias is None else bias + causal
    if left_window_size >= 0 or right_window_size >= 0:   # sliding window around that position
        diff = rows + offset - cols
        allowed = (diff <= left_window_size) if left_window_size >= 0 else (diff == diff)
        if right_window_size >= 0:
            allowed = allowed & (-diff <= right_window_size)
        window = cn.where(allowed, 0.0, -math.inf)
        bias = window if bias is None else bias + window
    if nonpad_kv_seqlen is not None:
        lens = nonpad_kv_seqlen.cast(int32).reshape(-1, 1, 1, 1)
        pad_bias = cn.where(cols.reshape(1, 1, 1, skv) < lens, 0.0, -math.inf)
        bias = pad_bias if bias is None else bias + pad_bias
    with_bias = qk + bias if bias is not None else qk
    probs = softmax(with_bias, -1)
    probs = cn.where(probs != probs, 0.0, probs)   # rows masked entirely give 0, not NaN
    y = probs @ V
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    qk_out = (qk, qk, with_bias, probs)[qk_matmul_output_mode]   # as the ONNX reference numbers them
    results = (y, present_k, present_v, qk_out)[:outputs]
    return results if outputs > 1 else y


@op()
def RotaryEmbedding(X, cos_cache, sin_cache, position_ids=None, interleaved=0, num_heads=0, rotary_embedding_dim=0):
    shape = X.shape
    x = X.transpose(1, 2) if X.ndim == 4 else X.reshape(shape[0], shape[1], num_heads, shape[2] // num_heads)
    head = x.shape[3]
    dim = rotary_embedding_dim or head
    if position_ids is not None:   # (batch, seq) rows of the caches
        cos_cache = _take(cos_cache, 0, position_ids.cast(int32))
        sin_cache = _take(sin_cache, 0, position_ids.cast(int32))
    cos, sin = cos_cache.unsqueeze(2), sin_cache.unsqueeze(2)          # (batch, seq, 1, dim/2)
    rotate, keep = x[..., :dim], x[..., dim:]
    if interleaved:
        x1, x2 = rotate[..., 0::2], rotate[..., 1::2]
    else:
        x1, x2 = rotate[..., :dim // 2], rotate[..., dim // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = stack([real, imag], -1).reshape(real.shape[:-1] + (dim,))
    else:
        rotated = cn.cat([real, imag], -1)
    out = cn.cat([rotated, keep], -1) if keep.shape[-1] else rotated
    return out.transpose(1, 2) if X.ndim == 4 else out.reshape(shape)
