"""onnxruntime's contrib operators (domain com.microsoft), as its transformer optimizer writes them
(`onnxruntime.transformers.optimizer.optimize_model`): fused attention, fused layer norms, GELU
variants, FusedMatMul, rotary embedding. Generated code reaches them as `ops.com_microsoft.X`.

Semantics follow onnxruntime's ContribOperators.md and its CPU kernels, which are the oracle in
tests/test_onnx_contrib.py. Padding masks are additive like onnxruntime's: a masked key gets
`mask_filter_value` (-10000), not -inf, so a row masked entirely averages over every key as it
does there; keys after a query (causal masks) get the lowest float32 and drop out. Variants onnxruntime's CPU kernels do not run (4-D Megatron masks, shared past/present
buffers, beam-search cache indirection, quantized caches) are refused with an OnnxError.
"""

import math

import cinders as cn
from ...dtypes import int32
from ...functional import softmax
from ...indexing import _take
from ...nn.functional import layer_norm
from ..proto import OnnxError
from . import attention as onnx_attention
from .base import op, scalar

MS = "com.microsoft"
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_LOWEST = -3.4028234663852886e38   # the lowest float32


def _refuse(cond, message):
    if cond:
        raise OnnxError(message)


# -- activations ------------------------------------------------------------------------------------

@op(domain=MS)
def Gelu(X):
    return X.gelu()


@op(domain=MS)
def BiasGelu(A, B):
    return (A + B).gelu()


@op(domain=MS)
def FastGelu(X, bias=None):
    """The tanh approximation of GELU, with an optional bias added first."""
    x = X if bias is None else X + bias
    return x * 0.5 * (1.0 + ((x + x * x * x * 0.044715) * _SQRT_2_OVER_PI).tanh())


@op(domain=MS)
def QuickGelu(X, alpha=1.702):
    return X * (X * alpha).sigmoid()


# -- matmul -----------------------------------------------------------------------------------------

def _batch_first(x):
    """transBatch: (D0, D1, ..., Dn-2, Dn-1) read as (D1, ..., Dn-2, D0, Dn-1)."""
    n = x.ndim
    return x.permute(tuple(range(1, n - 1)) + (0, n - 1)) if n > 2 else x


@op(domain=MS)
def FusedMatMul(A, B, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    """alpha * op(A) @ op(B); transposes are ignored for 1-D operands, as in onnxruntime."""
    a = _batch_first(A) if transBatchA else A
    b = _batch_first(B) if transBatchB else B
    if transA and a.ndim > 1:
        a = a.transpose(-2, -1)
    if transB and b.ndim > 1:
        b = b.transpose(-2, -1)
    out = a @ b
    return out * alpha if alpha != 1.0 else out


# -- normalisation ----------------------------------------------------------------------------------

def _rms(x, epsilon):
    """(x normalised by its root mean square over the last axis, the inverse RMS (..., 1))."""
    inv = 1.0 / ((x * x).mean(-1, keepdim=True) + epsilon).sqrt()
    return x * inv, inv


def _skip_sum(input, skip, bias):
    total = input + skip
    return total + bias if bias is not None else total


@op(domain=MS, multi=True)
def SkipLayerNormalization(input, skip, gamma, beta=None, bias=None, epsilon=1e-12, outputs=1):
    """LayerNorm(input + skip + bias) * gamma + beta; outputs (y, mean, inv_std_var, the sum)."""
    total = _skip_sum(input, skip, bias)
    if outputs == 1:
        return layer_norm(total, total.shape[-1:], gamma, beta, epsilon)
    mean = total.mean(-1, keepdim=True)
    centred, inv = _rms(total - mean, epsilon)
    y = centred * gamma + beta if beta is not None else centred * gamma
    return (y, mean, inv, total)[:outputs]


@op(domain=MS, multi=True)
def SkipSimplifiedLayerNormalization(input, skip, gamma, bias=None, epsilon=1e-12, outputs=1):
    """RMSNorm(input + skip + bias) * gamma; outputs (y, mean (zeros, as onnxruntime gives), inv_std_var,
    the sum)."""
    total = _skip_sum(input, skip, bias)
    normed, inv = _rms(total, epsilon)
    y = normed * gamma
    return (y, cn.zeros_like(inv), inv, total)[:outputs] if outputs > 1 else y


@op(multi=True)   # onnxruntime registers this one in the default domain
def SimplifiedLayerNormalization(X, scale, axis=-1, epsilon=1e-5, stash_type=1, outputs=1):
    """RMS normalisation over axes axis..rank-1: X / sqrt(mean(X^2) + epsilon) * scale."""
    a = axis + X.ndim if axis < 0 else axis
    axes = tuple(range(a, X.ndim))
    inv = 1.0 / ((X * X).mean(axes, keepdim=True) + epsilon).sqrt()
    y = X * inv * scale
    return (y, inv)[:outputs] if outputs > 1 else y


@op(domain=MS, multi=True)
def EmbedLayerNormalization(input_ids, segment_ids=None, word_embedding=None, position_embedding=None,
                            segment_embedding=None, gamma=None, beta=None, mask=None, position_ids=None,
                            epsilon=1e-12, mask_index_type=1, outputs=1):
    """BERT's embeddings: LayerNorm(word[ids] + position[pos] + segment[seg]) * gamma + beta;
    outputs (y, mask_index: the number of ones in each mask row, the sum before the norm)."""
    _refuse(word_embedding is None or position_embedding is None or gamma is None or beta is None,
            "EmbedLayerNormalization needs word_embedding, position_embedding, gamma and beta")
    ids = input_ids.cast(int32)
    total = _take(word_embedding, 0, ids)
    if position_ids is None:
        total = total + position_embedding[:ids.shape[1]]
    else:
        total = total + _take(position_embedding, 0, position_ids.cast(int32))
    if segment_ids is not None and segment_embedding is not None:
        total = total + _take(segment_embedding, 0, segment_ids.cast(int32))
    y = layer_norm(total, total.shape[-1:], gamma, beta, epsilon)
    if outputs == 1:
        return y
    if mask is None:
        mask_index = cn.zeros(ids.shape[0], backend=ids.backend, dtype=int32)
    else:
        mask_index = (mask.cast(int32) == 1).cast(int32).sum(1)
    return (y, mask_index, total)[:outputs]


# -- attention --------------------------------------------------------------------------------------

def _heads(x, n):
    """(B, S, n*H) -> (B, n, S, H)."""
    b, s, d = x.shape
    return x.reshape(b, s, n, d // n).transpose(1, 2)


def _merge_heads(x):
    """(B, n, S, H) -> (B, S, n*H)."""
    b, n, s, h = x.shape
    return x.transpose(1, 2).reshape(b, s, n * h)


def _mask_bias(mask, batch, seq, total, filter_value, op_name):
    """onnxruntime's key mask as an additive bias broadcastable to (B, N, S, T): 0 where a key is
    kept, filter_value where it is masked. Forms: (B) valid lengths (right padding), (2B) end then
    start positions (left padding), (B, T) or (B, S, T) of 1 kept / 0 masked."""
    if mask is None:
        return None
    cols = cn.arange(total, backend=mask.backend).reshape(1, total)
    m = mask.cast(int32)
    if m.ndim == 1 and m.shape[0] in (batch, 2 * batch):
        keep = cols < m[:batch].reshape(batch, 1)
        if m.shape[0] == 2 * batch:
            keep = keep & (cols >= m[batch:].reshape(batch, 1))
        return cn.where(keep, 0.0, filter_value).reshape(batch, 1, 1, total)
    if m.ndim == 2 and m.shape[1] == 1 and total != 1:   # onnxruntime's "dummy" mask: no effect
        return None
    if m.ndim == 2 and m.shape == (batch, total):
        return cn.where(m > 0, 0.0, filter_value).reshape(batch, 1, 1, total)
    if m.ndim == 3 and m.shape == (batch, seq, total):
        return cn.where(m > 0, 0.0, filter_value).reshape(batch, 1, seq, total)
    raise OnnxError("%s: mask of shape %s is not supported (supported: (B), (2B), (B, T), (B, S, T) with "
                    "B=%d, S=%d, T=%d)" % (op_name, list(mask.shape), batch, seq, total))


def _causal_bias(seq, total, past, backend):
    """The lowest float32 where key j lies after query i's position past + i: unlike padding, a
    future key is excluded entirely (as in onnxruntime, which skips this for one query)."""
    if seq == 1:
        return None
    rows = cn.arange(seq, backend=backend).reshape(seq, 1)
    cols = cn.arange(total, backend=backend).reshape(1, total)
    return cn.where(cols > rows + past, _LOWEST, 0.0)


def _add(a, b):
    return b if a is None else a if b is None else a + b


def _attend(q, k, v, bias, scale):
    """softmax(q @ k^T * scale + bias) @ v on (B, N, S, H) heads; also the pre-softmax scores."""
    scores = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias
    return softmax(scores, -1) @ v, scores


@op(domain=MS, multi=True)
def Attention(input, weights, bias=None, mask_index=None, past=None, attention_bias=None,
              past_sequence_length=None, num_heads=0, unidirectional=0, qkv_hidden_sizes=None,
              mask_filter_value=-10000.0, scale=0.0, do_rotary=0, past_present_share_buffer=0,
              rotary_embedding_dim=0, outputs=1):
    """Self-attention with the Q/K/V projection merged into one weight (input_hidden, D+D+Dv);
    outputs (y (B, S, Dv), present (2, B, N, P+S, H) = past and this step's keys/values)."""
    _refuse(do_rotary, "Attention: do_rotary=1 is not supported (use RotaryEmbedding before it)")
    _refuse(past_present_share_buffer or past_sequence_length is not None,
            "Attention: shared past/present buffers (past_present_share_buffer) are not supported")
    _refuse(num_heads <= 0, "Attention needs num_heads")
    qh, kh, vh = qkv_hidden_sizes or [weights.shape[1] // 3] * 3
    qkv = input @ weights
    if bias is not None:
        qkv = qkv + bias
    q, k, v = (_heads(qkv[..., lo:lo + n], num_heads) for lo, n in ((0, qh), (qh, kh), (qh + kh, vh)))
    past_len = 0
    if past is not None:
        past_len = past.shape[3]
        k, v = cn.cat([past[0], k], 2), cn.cat([past[1], v], 2)
    batch, seq, total = q.shape[0], q.shape[2], k.shape[2]
    mask = _mask_bias(mask_index, batch, seq, total, mask_filter_value, "Attention")
    if unidirectional:
        mask = _add(mask, _causal_bias(seq, total, past_len, q.backend))
    y, _ = _attend(q, k, v, _add(mask, attention_bias), scale or 1.0 / math.sqrt(q.shape[-1]))
    y = _merge_heads(y)
    return (y, cn.stack([k, v], 0))[:outputs] if outputs > 1 else y


@op(domain=MS, multi=True)
def MultiHeadAttention(query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
                       past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None,
                       num_heads=0, unidirectional=0, scale=0.0, mask_filter_value=-10000.0, outputs=1):
    """Attention over separate (already projected) Q, K, V of shape (B, L, D), with an optional
    projection bias (D+D+Dv); key/value may also be given as heads (B, N, L, H), used as they are
    (cross-attention reusing a cache). Outputs (y, present_key, present_value, qk: the scores
    before softmax)."""
    _refuse(num_heads <= 0, "MultiHeadAttention needs num_heads")
    _refuse(query.ndim != 3 or key is None or value is None,
            "MultiHeadAttention: packed QKV / KV inputs are not supported (give query, key, value)")
    _refuse(past_sequence_length is not None or cache_indirection is not None,
            "MultiHeadAttention: shared past/present buffers and beam cache_indirection are not supported")
    d = query.shape[2]   # hidden size of Q and K; bias is (D + D + Dv)
    if bias is not None:
        query = query + bias[:d]
    q = _heads(query, num_heads)
    if key.ndim == 4:    # (B, N, L, H): keys/values as heads, no bias, no past
        _refuse(past_key is not None, "MultiHeadAttention: past_key with key given as heads")
        k, v = key, value
    else:
        if bias is not None:
            key, value = key + bias[d:2 * d], value + bias[2 * d:]
        k, v = _heads(key, num_heads), _heads(value, num_heads)
    past_len = 0
    if past_key is not None:
        past_len = past_key.shape[2]
        k, v = cn.cat([past_key, k], 2), cn.cat([past_value, v], 2)
    batch, seq, total = q.shape[0], q.shape[2], k.shape[2]
    mask = _mask_bias(key_padding_mask, batch, seq, total, mask_filter_value, "MultiHeadAttention")
    if unidirectional:
        mask = _add(mask, _causal_bias(seq, total, past_len, q.backend))
    y, scores = _attend(q, k, v, _add(attention_bias, mask), scale or 1.0 / math.sqrt(q.shape[-1]))
    y = _merge_heads(y)
    return (y, k, v, scores)[:outputs] if outputs > 1 else y


@op(domain=MS)
def RotaryEmbedding(input, position_ids, cos_cache, sin_cache, interleaved=0, is_packed_batching=0, num_heads=0,
                    rotary_embedding_dim=0, scale=1.0):
    """Rotary position embedding on (B, S, N*H) or (B, N, S, H); position_ids (B, S), or (1): the
    position of the first token (the others follow it). The ai.onnx RotaryEmbedding does the rest."""
    _refuse(is_packed_batching, "RotaryEmbedding: is_packed_batching=1 is not supported")
    _refuse(scale != 1.0, "RotaryEmbedding: scale other than 1.0 is not supported")
    seq = input.shape[2] if input.ndim == 4 else input.shape[1]
    positions = position_ids.cast(int32)
    if positions.ndim == 1:
        positions = positions.reshape(1, 1) + cn.arange(seq, backend=positions.backend).reshape(1, seq)
    if input.ndim == 3 and not num_heads:   # the whole head rotates: its size from the caches
        _refuse(rotary_embedding_dim, "RotaryEmbedding: rotary_embedding_dim needs num_heads")
        num_heads = input.shape[2] // (2 * cos_cache.shape[1])
    return onnx_attention.RotaryEmbedding(input, cos_cache, sin_cache, positions, interleaved=interleaved,
                                          num_heads=num_heads, rotary_embedding_dim=rotary_embedding_dim)


def _repeat_heads(x, n):
    """(B, kv, L, H) -> (B, n, L, H): each key/value head serves n // kv query heads."""
    b, kv, length, h = x.shape
    return x if kv == n else x.unsqueeze(2).expand(b, kv, n // kv, length, h).reshape(b, n, length, h)


@op(domain=MS, multi=True, host=("total_sequence_length",))
def GroupQueryAttention(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
                        total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
                        attention_bias=None, head_sink=None, k_scale=None, v_scale=None, q_norm_weight=None,
                        k_norm_weight=None, query_seqlens=None, num_heads=0, kv_num_heads=0, scale=0.0,
                        softcap=0.0, local_window_size=-1, do_rotary=0, rotary_interleaved=0, smooth_softmax=-1,
                        qk_output=0, causal=1, sliding_window_cache=0, kv_cache_bit_width=0, k_quant_type="NONE",
                        v_quant_type="NONE", qk_norm_epsilon=1e-6, q_norm_epsilon=None, k_norm_epsilon=None,
                        outputs=1):
    """Grouped-query attention with a KV cache in (B, kv_num_heads, C, H). Batch entry b holds
    T = seqlens_k[b] + 1 tokens after this step, P = max(T - S, 0) of them from the past: this
    step's keys/values go to cache rows [P, P + S) and query row s sits at position P + s (causal
    mask, local window, rotary positions). Outputs (y (B, S, D), present_key, present_value) with
    C = max(total_sequence_length, past length) rows, zero from row P + S on, and with qk_output
    the scores (B, N, S, total_sequence_length) before (1) or after (2) softmax. A first prompt
    (total_sequence_length == S) has P = 0."""
    _refuse(num_heads <= 0 or kv_num_heads <= 0 or seqlens_k is None or total_sequence_length is None,
            "GroupQueryAttention needs num_heads, kv_num_heads, seqlens_k and total_sequence_length")
    _refuse(any(t is not None for t in (head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight, query_seqlens))
            or smooth_softmax > 0 or sliding_window_cache or kv_cache_bit_width
            or k_quant_type != "NONE" or v_quant_type != "NONE",
            "GroupQueryAttention: head_sink/smooth_softmax, quantized caches, q/k norms, query_seqlens and "
            "sliding_window_cache are not supported")
    _refuse((outputs > 3) != bool(qk_output), "GroupQueryAttention: qk_output needs its output (and the reverse)")
    _refuse(do_rotary and (cos_cache is None or sin_cache is None), "GroupQueryAttention: do_rotary needs caches")
    if key is None:   # packed (B, S, (N + 2 kv) H)
        h = query.shape[2] // (num_heads + 2 * kv_num_heads)
        query, key, value = (query[..., :num_heads * h], query[..., num_heads * h:(num_heads + kv_num_heads) * h],
                             query[..., (num_heads + kv_num_heads) * h:])
    q, k, v = _heads(query, num_heads), _heads(key, kv_num_heads), _heads(value, kv_num_heads)
    batch, seq, head = q.shape[0], q.shape[2], q.shape[3]
    lengths = seqlens_k.cast(int32).reshape(batch, 1) + 1                           # T per batch entry
    past_len = (lengths - seq).maximum(cn.zeros_like(lengths))                      # P per batch entry
    steps = cn.arange(seq, backend=q.backend).reshape(1, seq)
    total = int(scalar(total_sequence_length))
    first_prompt = total == seq
    if do_rotary:
        positions = past_len + steps
        if position_ids is not None:   # a first prompt counts from the very first id on, as onnxruntime does
            ids = position_ids.cast(int32)
            positions = ids[:1, :1] + steps if first_prompt else ids
        rotate = onnx_attention.RotaryEmbedding
        q = rotate(q, cos_cache, sin_cache, positions, interleaved=rotary_interleaved)
        k = rotate(k, cos_cache, sin_cache, positions, interleaved=rotary_interleaved)
    buffer = 0 if past_key is None else past_key.shape[2]
    cache = max(total, buffer)
    k, v = _place(past_key, k, past_len, cache), _place(past_value, v, past_len, cache)
    rows = cn.arange(cache, backend=q.backend).reshape(1, 1, cache)                  # key positions j
    position = (past_len + steps).reshape(batch, seq, 1)                            # query positions
    allowed = rows < lengths.reshape(batch, 1, 1)
    if causal:
        allowed = allowed & (rows <= position)
    if local_window_size >= 0:
        allowed = allowed & (rows > position - local_window_size)
    bias = cn.where(allowed, 0.0, _LOWEST).unsqueeze(1)                            # (B, 1, S or 1, C)
    scores = (q @ _repeat_heads(k, num_heads).transpose(-2, -1)) * (scale or 1.0 / math.sqrt(head))
    if softcap:
        scores = (scores / softcap).tanh() * softcap
    if attention_bias is not None:   # (B or 1, N or 1, S, total): the columns of keys [0, total)
        scores = scores + cn.pad(attention_bias, [0, cache - attention_bias.shape[-1]], 0.0)
    probs = softmax(scores + bias, -1)
    y = _merge_heads(probs @ _repeat_heads(v, num_heads))
    if outputs <= 3:
        return (y, k, v)[:outputs] if outputs > 1 else y
    # qk_output 1: the scores before softmax, 2: after; masked keys 0; the first `total` keys
    qk = cn.where(allowed.unsqueeze(1), scores, 0.0) if qk_output == 1 else probs
    return y, k, v, qk[..., :total]


def _place(past, new, past_len, cache):
    """The cache (B, kv, cache, H) after this step: past rows [0, P) kept, the S new rows at
    [P, P + S) (P per batch entry), later rows zero (as onnxruntime leaves them)."""
    batch, kv, seq, h = new.shape
    buffer = 0 if past is None else past.shape[2]
    joined = new if past is None else cn.cat([past, new], 2)                        # rows: past, then new
    j = cn.arange(cache, backend=new.backend).reshape(1, cache)
    last = cn.full((1, cache), buffer + seq - 1, backend=new.backend, dtype=int32)
    source = cn.where(j >= past_len, j - past_len + buffer, j).minimum(last)
    index = source.reshape(batch, 1, cache, 1).expand(batch, kv, cache, h)
    kept = (j < past_len + seq).reshape(batch, 1, cache, 1)
    return cn.where(kept, joined.gather(2, index), 0.0)


from .quantization_contrib import *  # noqa: F401,F403,E402  (the quantized com.microsoft ops)
