"""Text generation with an imported decoder that carries its KV cache as inputs and outputs.

    model = cinders.onnx.load("decoder.onnx", backend=cn.NumPy())
    tokens = cinders.onnx.generate(model, [[5, 7, 9]], max_new_tokens=20)              # greedy
    tokens = cinders.onnx.generate(model, [[5, 7, 9]], 20, temperature=0.8, top_k=40, seed=1)

The model's first input is the token ids (batch, seq); every other input is a past key or value
(batch, heads, past, head_dim), except `attention_mask` (batch, past + seq) and `position_ids`
(batch, seq), which are made here when the graph has them (optimum's names). Its first output is
the logits (batch, seq, vocab); the others are the present keys and values, in the order of the
past inputs, fed back at the next step. The first step runs the prompt with empty pasts.
"""

import math
import random

from ..creation import ones, tensor, zeros
from ..dtypes import int32
from ..tensor import Tensor
from .ops import backend_of
from .proto import OnnxError

_MADE_HERE = ("attention_mask", "position_ids")


def _pasts(model):
    """The names and empty shapes (past length 0) of the model's past inputs, by position."""
    pasts = []
    for name, dims in zip(model.input_names[1:], model.input_shapes[1:]):
        if name in _MADE_HERE:
            continue
        symbolic = [i for i, d in enumerate(dims) if i and not isinstance(d, int)]
        if len(dims) < 3 or len(symbolic) != 1:
            raise OnnxError("generate: input %s %s is not a past key/value (batch, heads, past, head_dim: "
                            "one symbolic length past the batch)" % (ascii(name), dims))
        pasts.append((name, symbolic[0], dims))
    if len(model.output_names) != 1 + len(pasts):
        raise OnnxError("generate: the model has %d past inputs but %d outputs (logits and one present "
                        "per past)" % (len(pasts), len(model.output_names)))
    return pasts


def _pick(row, temperature, top_k, rng):
    """The next token from one row of logits: argmax, or a sample of softmax(row / temperature)
    over the top_k largest."""
    order = sorted(range(len(row)), key=lambda i: -row[i])
    if top_k:
        order = order[:top_k]
    if not temperature:
        return order[0]
    top = row[order[0]] / temperature
    weights = [math.exp(row[i] / temperature - top) for i in order]
    return rng.choices(order, weights=weights)[0]


def generate(model, input_ids, max_new_tokens, temperature=0.0, top_k=None, seed=None):
    """The prompt rows of input_ids (nested lists or a (batch, seq) int Tensor) followed by
    max_new_tokens generated tokens each, as lists of ints. temperature 0 is greedy (argmax);
    above 0 tokens are sampled (from the top_k most likely when given; seed makes it repeatable)."""
    rows = input_ids.tolist() if isinstance(input_ids, Tensor) else [list(r) for r in input_ids]
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        raise OnnxError("generate: input_ids must be a non-empty (batch, seq) table of token ids")
    if temperature < 0 or (top_k is not None and top_k < 1) or max_new_tokens < 0:
        raise OnnxError("generate: temperature >= 0, top_k >= 1 and max_new_tokens >= 0 are required")
    backend = backend_of(model)
    batch, rng = len(rows), random.Random(seed)
    pasts = _pasts(model)
    state = {name: zeros(*[batch if i == 0 else 0 if i == axis else d for i, d in enumerate(dims)], backend=backend)
             for name, axis, dims in pasts}
    out, step, done = [list(r) for r in rows], rows, 0
    while done < max_new_tokens:
        length = next(iter(state.values())).shape[pasts[0][1]] if pasts else 0
        feed = {model.input_names[0]: tensor(step, backend=backend, dtype=int32),
                "attention_mask": ones(batch, length + len(step[0]), backend=backend, dtype=int32),
                "position_ids": tensor([list(range(length, length + len(step[0])))] * batch, backend=backend,
                                       dtype=int32)}
        feed.update(state)
        results = model(*[feed[n] for n in model.input_names])
        logits, presents = results[0], results[1:]
        last = logits[:, -1, :]
        if not temperature:
            picked = last.argmax(-1).tolist()   # (a few ints read, not the vocabulary)
        else:
            picked = [_pick(row, temperature, top_k, rng) for row in last.tolist()]
        for r, token in zip(out, picked):
            r.append(int(token))
        state = {name: t for (name, _, _), t in zip(pasts, presents)}
        step, done = [[int(t)] for t in picked], done + 1
    return out
