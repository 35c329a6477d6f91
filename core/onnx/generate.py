"""Text generation with an imported decoder that carries its KV cache as inputs and outputs.

    model = cinders.onnx.load("decoder.onnx", backend=cn.Wgpu())
    tokens = cinders.onnx.generate(model, [[5, 7, 9]], max_new_tokens=20)              # greedy
    tokens = cinders.onnx.generate(model, [[5, 7, 9]], 20, temperature=0.8, top_k=40, seed=1)

The model's first input is the token ids (batch, seq); the others are past keys and values
(batch, heads, past, head_dim) and, optionally, `attention_mask` (batch, past + seq) and
`position_ids` (batch, seq) (optimum's names). Its first output is the logits (batch, seq, vocab);
the others are the present keys and values, in the order of the past inputs.

Two ways to run the steps, chosen by the model's inputs:
  window   with attention_mask and position_ids: the pasts have a fixed length (the prompt plus
           max_new_tokens, rounded up by `window_length`), filled from the right and masked
           where empty; each step drops the oldest (empty) slots of the presents it is given.
           Every decode step then has the same shapes, so one cn.capture program replays them
           (no Python per kernel on a GPU), and greedy steps feed their argmax straight back,
           reading nothing until the end. The prompt step (its own shapes) runs uncaptured.
  growing  otherwise: the pasts start empty and grow by one position per step (each step a new
           shape: not captured).

The captured programs are kept between calls, per model: decode steps per (batch, window) and
picks per (batch, temperature, top_k), the KEPT most recently used of each (a program holds its
workspace on the device). A second call with the same batch and window records nothing: every
decode step replays. Replacing the model's weights (load_state_dict) drops them, as does
`drop_programs(model)` or the model's death.

The next tokens are picked on the device by `pick` (its own cn.capture program: its shapes never
change), so nothing is read back until the caller reads the tokens (`await to_data_async()` in
the browser, where a blocking read is impossible). Greedy is the argmax of the last logits;
sampling is a Gumbel-max draw, the same tokens on every backend for one seed:
    kept    = logits where logits >= the top_k-th largest of their row (all when top_k is None)
    token   = argmax(kept / temperature - log(E)),  E = -log(1 - u), u = cn.random((batch, vocab),
              seed=seed * 1000003 + step)  (step 0, 1, ...: what cn.manual_seed(seed) then draws)
argmax of logits/T plus Gumbel noise is a draw from softmax(logits/T). seed=None draws the step
seeds from cn.random's counter.
"""

import math
import weakref

from ..capture import capture
from ..creation import random, tensor, zeros
from ..dtypes import int32
from ..tensor import Tensor, where
from .ops import TopK, backend_of
from .proto import OnnxError

_MADE_HERE = ("attention_mask", "position_ids")


def _pasts(model):
    """[(name, past axis, declared dims)] of the model's past inputs, in input order."""
    pasts = []
    for name, dims in zip(model.input_names[1:], model.input_shapes[1:]):
        if name in _MADE_HERE:
            continue
        symbolic = [i for i, d in enumerate(dims) if i and not isinstance(d, int)]
        if len(dims) < 3 or len(symbolic) != 1:
            raise OnnxError("generate: input %s %s is not a past key/value (batch, heads, past, head_dim: "
                            "one symbolic length past the batch)" % (ascii(name), dims))
        pasts.append((name, symbolic[0], dims))
    if not pasts or len(model.output_names) != 1 + len(pasts):
        raise OnnxError("generate: the model has %d past inputs and %d outputs; it needs past keys/values "
                        "and, as outputs, the logits and one present per past" % (len(pasts), len(model.output_names)))
    return pasts


SEED_STRIDE = 1000003      # step n of seed s draws with seed s * SEED_STRIDE + n, as cn.manual_seed(s) does
SERIES_BELOW = 1.0 / 32    # E = -log(1 - u) by its series below this: GPU logs are exact only to 2**-21
SMALLEST_E = 2.0 ** -25    # below the least nonzero E (2**-24, u = 2**-24): u = 0 stays finite


def pick(last, temperature=0.0, top_k=None, uniform=None):
    """The next token ids (batch, 1) from the last logits rows (batch, vocab): the argmax when
    temperature is 0, else the Gumbel-max draw of the module docstring with `uniform` as its u."""
    if not temperature:
        return last.argmax(-1).reshape(last.shape[0], 1)
    if top_k is not None and top_k < last.shape[-1]:
        kth = TopK(last, top_k, outputs=1)[:, top_k - 1:]
        last = where(last >= kth, last, -math.inf)
    u = uniform
    series = u * (1 + u * (1 / 2 + u * (1 / 3 + u * (1 / 4 + u / 5))))   # -log(1 - u), to u**6
    e = where(u < SERIES_BELOW, series, -(1 - u).log()).clamp(min=SMALLEST_E)
    return (last / temperature - e.log()).argmax(-1).reshape(last.shape[0], 1)


def window_length(tokens):
    """The past slots of a window run of `tokens` (prompt + max_new_tokens): rounded up to a
    multiple of 16, or of a sixteenth of the power of two above, so that prompts of nearby
    lengths share one captured step program, for at most 1/8 more (masked) slots."""
    grain = max(16, 1 << max(0, tokens.bit_length() - 4))
    return -(-tokens // grain) * grain


KEPT = 4   # step programs (per batch and window) and pick programs (per batch and sampling) kept per model


class _Kept:
    """The captured programs generate keeps for one model, and the weights they read in place
    (weights replaced by new tensors would leave a replay reading the old ones)."""

    def __init__(self, weights):
        self.weights = weights
        self.steps = {}   # (batch, window) -> cn.capture(step), least recently used first
        self.picks = {}   # (batch, temperature, top_k) -> cn.capture(pick)


_KEPT_BY_MODEL = weakref.WeakKeyDictionary()   # model -> _Kept (the programs hold no reference to the model)


def _kept(model):
    weights = list(model.state_dict().values())
    kept = _KEPT_BY_MODEL.get(model)
    if kept is None or len(kept.weights) != len(weights) or any(a is not b for a, b in zip(kept.weights, weights)):
        kept = _KEPT_BY_MODEL[model] = _Kept(weights)
    return kept


def drop_programs(model):
    """Forget the captured programs generate keeps for `model` (their device buffers go with them)."""
    _KEPT_BY_MODEL.pop(model, None)


def _recent(table, key, make):
    """table[key], made by make() if missing, now the most recently used; beyond KEPT entries the
    least recently used goes (a chat of ever new prompt lengths must not hold memory without bound)."""
    value = table.pop(key, None)
    if value is None:
        value = make()
        if len(table) >= KEPT:
            del table[next(iter(table))]
    table[key] = value
    return value


def _keep_last(t, axis, n):
    key = [slice(None)] * t.ndim
    key[axis] = slice(t.shape[axis] - n, None)
    return t[tuple(key)]


def is_decoder(model):
    """Whether generate can drive `model`: past keys/values as inputs, presents as outputs."""
    try:
        _pasts(model)
    except OnnxError:
        return False
    return True


def generate(model, input_ids, max_new_tokens, temperature=0.0, top_k=None, seed=None):
    """The prompt rows of input_ids (nested lists or a (batch, seq) int Tensor) followed by
    max_new_tokens generated tokens each, as lists of ints. temperature 0 is greedy (argmax);
    above 0 tokens are sampled (from the top_k most likely when given; seed makes it repeatable)."""
    rows = input_ids.tolist() if isinstance(input_ids, Tensor) else [list(r) for r in input_ids]
    tokens = list(generate_steps(model, rows, max_new_tokens, temperature, top_k, seed))
    out = [list(r) for r in rows]
    for picked in tokens:   # read at the end: the steps never wait for the device
        for r, (token,) in zip(out, picked.tolist()):
            r.append(int(token))
    return out


def generate_steps(model, input_ids, max_new_tokens, temperature=0.0, top_k=None, seed=None):
    """generate's steps: yields each step's picked tokens as a (batch, 1) int tensor, unread
    (a page reads each as it comes, to show it; generate reads them all at the end)."""
    rows = input_ids.tolist() if isinstance(input_ids, Tensor) else [list(r) for r in input_ids]
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        raise OnnxError("generate: input_ids must be a non-empty (batch, seq) table of token ids")
    if temperature < 0 or (top_k is not None and top_k < 1) or max_new_tokens < 0:
        raise OnnxError("generate: temperature >= 0, top_k >= 1 and max_new_tokens >= 0 are required")
    backend = backend_of(model)
    pasts = _pasts(model)
    batch, prompt = len(rows), len(rows[0])
    window = set(_MADE_HERE) <= set(model.input_names)
    size = window_length(prompt + max_new_tokens) if window else 0   # past slots (window: fixed; growing: start)
    state = [zeros(*[batch if i == 0 else size if i == axis else d for i, d in enumerate(dims)], backend=backend)
             for _, axis, dims in pasts]
    # kept programs hold `step`, which must not keep the model alive: it names neither model nor size
    model_ref, names = weakref.ref(model), model.input_names

    def step(ids, mask, positions, *past):
        """One forward: (the last logits rows (batch, vocab); presents)."""
        if window:   # the last `size` slots: the oldest (empty) ones are dropped, the length kept
            past = [_keep_last(p, axis, mask.shape[1] - ids.shape[1]) for p, (_, axis, _) in zip(past, pasts)]
        feed = dict(zip([n for n, _, _ in pasts], past), attention_mask=mask, position_ids=positions)
        feed[names[0]] = ids
        results = model_ref()(*[feed[n] for n in names])
        # (the presents are returned whole: a captured program's inputs are whole buffers)
        return (results[0][:, -1, :],) + tuple(results[1:])

    def next_tokens(last, *uniform):
        return pick(last, temperature, top_k, *uniform)

    kept = _kept(model)
    decode = _recent(kept.steps, (batch, size), lambda: capture(step, backend)) if window else step
    choose = _recent(kept.picks, (batch, temperature, top_k), lambda: capture(next_tokens, backend))
    ids, filled = tensor(rows, backend=backend, dtype=int32), 0
    for n in range(max_new_tokens):
        new = ids.shape[1]
        mask = tensor([[0] * (size - filled) + [1] * (filled + new)] * batch, backend=backend, dtype=int32)
        positions = tensor([list(range(filled, filled + new))] * batch, backend=backend, dtype=int32)
        # The prompt step has shapes of its own (and its last logits are a view): run as it is.
        # Its presents, cut to the decode steps' size + 1 slots, give every later step one shape.
        last, *state = (decode if n else step)(ids, mask, positions, *state)
        if window and not n:
            state = [_keep_last(p, axis, size + 1) for p, (_, axis, _) in zip(state, pasts)]
        filled += new
        # the draw is an input of the captured pick: a seed inside it would be replayed unchanged
        uniform = () if not temperature else (random(last.shape, backend=backend, seed=None if seed is None else
                                                     (seed * SEED_STRIDE + n) & 0xFFFFFFFF),)
        ids = (choose if n else next_tokens)(last, *uniform)
        yield ids
