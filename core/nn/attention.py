"""Attention layers with PyTorch's parameter names (in_proj_weight, out_proj, linear1, norm1...),
so torch.nn.MultiheadAttention / TransformerEncoderLayer state dicts load 1:1."""

import math

from ..dtypes import float32
from ..errors import ShapeError
from ..creation import arange
from ..tensor import where
from . import functional as F
from .layers import Dropout, LayerNorm, Linear, _constant, _seed, _uniform
from .module import Module


class MultiHeadAttention(Module):
    """torch.nn.MultiheadAttention: inputs (L, N, E), or (N, L, E) with batch_first=True.

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    is_causal=False) -> (output, weights averaged over heads or None). As in torch, a boolean
    mask marks with True the positions that may NOT be attended; a float mask is added."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, batch_first=False,
                 backend=None, seed=None):
        super().__init__()
        if embed_dim % num_heads:
            raise ShapeError("MultiHeadAttention: embed_dim %d is not divisible by num_heads %d"
                             % (embed_dim, num_heads))
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.batch_first = batch_first
        self.dropout = dropout
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))  # xavier_uniform over (3E, E)
        self.in_proj_weight = _uniform((3 * embed_dim, embed_dim), bound, backend, seed)
        self.in_proj_bias = _constant((3 * embed_dim,), 0.0, backend) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, backend=backend, seed=_seed(seed, 1))
        if bias:  # torch zeroes the output projection's bias
            self.out_proj.bias = _constant((embed_dim,), 0.0, backend)
        self._attn_dropout = Dropout(dropout, seed=_seed(seed, 2))

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                is_causal=False):
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        n, tq, e = query.shape
        ts = key.shape[1]
        if e != self.embed_dim:
            raise ShapeError("MultiHeadAttention: query's last dim %d is not embed_dim %d" % (e, self.embed_dim))
        h, d = self.num_heads, e // self.num_heads
        w, b = self.in_proj_weight, self.in_proj_bias

        def project(x, i, t):
            out = F.linear(x, w[i * e:(i + 1) * e], None if b is None else b[i * e:(i + 1) * e])
            return out.reshape(n, t, h, d).transpose(1, 2)  # (N, H, T, D)

        q, k, v = project(query, 0, tq), project(key, 1, ts), project(value, 2, ts)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # (N, H, Tq, Ts)
        blocked = _mask(attn_mask, key_padding_mask, is_causal, n, tq, ts, query.backend)
        if blocked is not None:
            scores = where(blocked, -math.inf, scores) if blocked.dtype is not float32 else scores + blocked
        weights = scores.softmax(-1)
        self._attn_dropout.training = self.training
        out = self._attn_dropout(weights) @ v  # (N, H, Tq, D)
        out = self.out_proj(out.transpose(1, 2).reshape(n, tq, e))
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, (weights.mean(1) if need_weights else None)


MultiheadAttention = MultiHeadAttention  # torch's spelling


def _mask(attn_mask, key_padding_mask, is_causal, n, tq, ts, backend):
    """One mask broadcastable to (N, H, Tq, Ts): bool (True = blocked) or float (added)."""
    mask = None
    if is_causal and attn_mask is None:  # query i may attend keys j <= i
        mask = arange(ts, backend=backend).reshape(1, ts) > arange(tq, backend=backend).reshape(tq, 1)
    elif attn_mask is not None:
        mask = attn_mask
        if mask.ndim == 3:  # (N*H, Tq, Ts) like torch
            mask = mask.reshape(n, -1, tq, ts)
    if key_padding_mask is not None:
        pad = key_padding_mask.reshape(n, 1, 1, ts)
        if mask is None:
            mask = pad
        elif mask.dtype is float32 and pad.dtype is float32:
            mask = mask + pad
        elif mask.dtype is float32:
            mask = where(pad, -math.inf, mask)
        elif pad.dtype is float32:
            mask = where(mask, -math.inf, pad)
        else:
            mask = mask | pad
    return mask


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block, each with a
    residual connection and LayerNorm (after, or before with norm_first=True)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, backend=None,
                 seed=None):
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError("TransformerEncoderLayer: activation must be 'relu' or 'gelu', got %r" % (activation,))
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout, bias, batch_first, backend, seed)
        self.linear1 = Linear(d_model, dim_feedforward, bias, backend, _seed(seed, 10))
        self.dropout = Dropout(dropout, _seed(seed, 20))
        self.linear2 = Linear(dim_feedforward, d_model, bias, backend, _seed(seed, 30))
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, backend=backend)
        self.dropout1 = Dropout(dropout, _seed(seed, 40))
        self.dropout2 = Dropout(dropout, _seed(seed, 50))
        self.activation = activation

    def _self_attention(self, x, mask, padding, is_causal):
        out, _ = self.self_attn(x, x, x, key_padding_mask=padding, need_weights=False, attn_mask=mask,
                                is_causal=is_causal)
        return self.dropout1(out)

    def _feed_forward(self, x):
        hidden = self.linear1(x)
        hidden = hidden.relu() if self.activation == "relu" else hidden.gelu()
        return self.dropout2(self.linear2(self.dropout(hidden)))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._feed_forward(self.norm2(x))
        x = self.norm1(x + self._self_attention(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._feed_forward(x))
