"""ONNX operators: recurrent layers."""

import cinders as cn
from ...functional import gru_cell, lstm_cell, stack
from ..proto import OnnxError
from .base import ints, op
from .elementwise import Softplus


_ACTIVATIONS = {
    "Sigmoid": lambda x, a, b: x.sigmoid(), "Tanh": lambda x, a, b: x.tanh(), "Relu": lambda x, a, b: x.relu(),
    "HardSigmoid": lambda x, a, b: (x * a + b).maximum(0.0).minimum(1.0),
    "LeakyRelu": lambda x, a, b: cn.where(x < 0, x * a, x), "Affine": lambda x, a, b: x * a + b,
    "ThresholdedRelu": lambda x, a, b: cn.where(x > a, x, 0.0), "ScaledTanh": lambda x, a, b: (x * b).tanh() * a,
    "Elu": lambda x, a, b: cn.where(x < 0, (x.exp() - 1.0) * a, x), "Softsign": lambda x, a, b: x / (x.abs() + 1.0),
    "Softplus": lambda x, a, b: Softplus(x),
}
_DEFAULT_ALPHA = {"HardSigmoid": 0.2, "LeakyRelu": 0.01, "Affine": 1.0, "ThresholdedRelu": 1.0, "Elu": 1.0,
                  "ScaledTanh": 1.0}
_DEFAULT_BETA = {"HardSigmoid": 0.5, "ScaledTanh": 1.0}


def _activations(names, alphas, betas, defaults, directions):
    names = list(names) if names else defaults * directions
    alphas, betas = list(alphas or []), list(betas or [])
    out = []
    for i, name in enumerate(names):
        canonical = {n.lower(): n for n in _ACTIVATIONS}.get(name.lower())
        if canonical is None:
            raise OnnxError("RNN activation %r is not supported" % (name,))
        a = alphas.pop(0) if alphas and canonical in _DEFAULT_ALPHA else _DEFAULT_ALPHA.get(canonical, 0.0)
        b = betas.pop(0) if betas and canonical in _DEFAULT_BETA else _DEFAULT_BETA.get(canonical, 0.0)
        out.append(lambda x, f=_ACTIVATIONS[canonical], a=a, b=b: f(x, a, b))
    return out


def _recurrent(kind, X, W, R, B, sequence_lens, initial_h, initial_c, P, activations, activation_alpha,
               activation_beta, clip, direction, hidden_size, layout, linear_before_reset, input_forget, outputs,
               product=None):
    """product(a, d, recurrent): a @ W[d]^T (or R[d]^T) computed another way, for LSTM and RNN
    (DynamicQuantizeLSTM's quantized weights); by default the float matmul."""
    if layout:
        X = X.transpose(0, 1)
        initial_h = initial_h.transpose(0, 1) if initial_h is not None else None
        initial_c = initial_c.transpose(0, 1) if initial_c is not None else None
    seq, batch = X.shape[0], X.shape[1]
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    dirs = 2 if direction == "bidirectional" else 1
    hidden = hidden_size or R.shape[-1]
    defaults = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}[kind]
    acts = _activations(activations, activation_alpha, activation_beta, defaults, dirs)
    per = len(defaults)
    # The step as one primitive (a kernel where the backend has one) when it is the common cell:
    # default activations, no clip, no peepholes; a GRU as PyTorch exports it.
    plain = (not activations or [a.lower() for a in activations] == [d.lower() for d in defaults * dirs]) \
        and not activation_alpha and not activation_beta and clip is None and P is None \
        and not input_forget and (kind != "GRU" or linear_before_reset)
    lens = ints(sequence_lens) if sequence_lens is not None else None
    if lens is not None and any(n != seq for n in lens):
        mask_steps = [cn.tensor([[1.0] if t < n else [0.0] for n in lens], backend=X.backend) for t in range(seq)]
    else:
        mask_steps = None
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        f = acts[d * per:(d + 1) * per]
        w, r = W[d].transpose(0, 1), R[d].transpose(0, 1)        # (I, G*H), (H, G*H)
        wb = B[d, :gates * hidden] if B is not None else None
        rb = B[d, gates * hidden:] if B is not None else None
        h = initial_h[d] if initial_h is not None else cn.zeros(batch, hidden, backend=X.backend)
        c = initial_c[d] if initial_c is not None else cn.zeros(batch, hidden, backend=X.backend)
        p = P[d] if P is not None else None
        xw = X @ w if product is None else product(X, d, False)
        if wb is not None:
            xw = xw + wb
        steps = [None] * seq
        order = range(seq - 1, -1, -1) if reverse else range(seq)
        for t in order:
            gx = xw[t]
            if kind == "GRU" and plain:
                gh = h @ r
                new_h, new_c = gru_cell(gx, gh + rb if rb is not None else gh, h), c
            elif kind == "GRU":
                hz = h @ r
                gz, gr, gh = (gx[:, i * hidden:(i + 1) * hidden] for i in range(3))
                rz, rr, rh = (hz[:, i * hidden:(i + 1) * hidden] for i in range(3))
                bz = br = bh = None
                if rb is not None:
                    bz, br, bh = (rb[i * hidden:(i + 1) * hidden] for i in range(3))
                z = f[0](_clip(gz + rz + (bz if bz is not None else 0.0), clip))
                rg = f[0](_clip(gr + rr + (br if br is not None else 0.0), clip))
                if linear_before_reset:
                    cand = gh + rg * (rh + (bh if bh is not None else 0.0))
                else:
                    rw = r[:, 2 * hidden:]
                    cand = gh + (rg * h) @ rw + (bh if bh is not None else 0.0)
                hn = f[1](_clip(cand, clip))
                new_h = (1.0 - z) * hn + z * h
                new_c = c
            else:
                g = gx + (h @ r if product is None else product(h, d, True))
                if rb is not None:
                    g = g + rb
                if kind == "RNN":
                    new_h = f[0](_clip(g, clip))
                    new_c = c
                elif plain:
                    new_h, new_c = lstm_cell(g, c)
                else:
                    gi, go, gf, gc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
                    if p is not None:
                        gi = gi + c * p[:hidden]
                        gf = gf + c * p[2 * hidden:]
                    i_ = f[0](_clip(gi, clip))
                    f_ = f[0](_clip(gf, clip))
                    if input_forget:
                        f_ = 1.0 - i_
                    new_c = f_ * c + i_ * f[1](_clip(gc, clip))
                    if p is not None:
                        go = go + new_c * p[hidden:2 * hidden]
                    o_ = f[0](_clip(go, clip))
                    new_h = o_ * f[2](new_c)
            if mask_steps is not None:
                m = mask_steps[t]
                new_h = new_h * m + h * (1.0 - m)
                new_c = new_c * m + c * (1.0 - m)
                steps[t] = new_h * m
            else:
                steps[t] = new_h
            h, c = new_h, new_c
        ys.append(stack(steps, 0))             # (seq, batch, hidden)
        hs.append(h)
        cs.append(c)
    Y = stack(ys, 1)                           # (seq, dirs, batch, hidden)
    Y_h, Y_c = stack(hs, 0), stack(cs, 0)
    if layout:
        Y = Y.permute(2, 0, 1, 3)
        Y_h, Y_c = Y_h.transpose(0, 1), Y_c.transpose(0, 1)
    results = (Y, Y_h, Y_c)[:outputs]
    return results if outputs > 1 else results[0]


def _clip(x, clip):
    return x if clip is None else x.maximum(-clip).minimum(clip)


@op(host=("sequence_lens",), multi=True)
def LSTM(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, activation_alpha=None,
         activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
         input_forget=0, layout=0, outputs=1):
    return _recurrent("LSTM", X, W, R, B, sequence_lens, initial_h, initial_c, P, activations, activation_alpha,
                      activation_beta, clip, direction, hidden_size, layout, 0, input_forget, outputs)


@op(host=("sequence_lens",), multi=True)
def GRU(X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, linear_before_reset=0,
        outputs=1):
    return _recurrent("GRU", X, W, R, B, sequence_lens, initial_h, None, None, activations, activation_alpha,
                      activation_beta, clip, direction, hidden_size, layout, linear_before_reset, 0, outputs)


@op(host=("sequence_lens",), multi=True)
def RNN(X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, outputs=1):
    return _recurrent("RNN", X, W, R, B, sequence_lens, initial_h, None, None, activations, activation_alpha,
                      activation_beta, clip, direction, hidden_size, layout, 0, 0, outputs)
