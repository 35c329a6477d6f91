"""The check the quantized models' capture tests share: a captured forward replays the
uncaptured call's answer."""

import numpy as np

import cinders as cn


def assert_replays_match_eager(model, inputs, calls, min_replays):
    """cn.capture(model) called `calls` times on `inputs` (recordings, then replays): each answer
    the uncaptured call's, bit for bit, with at least `min_replays` replays among them."""
    expected = model(*inputs).numpy()
    forward = cn.capture(model)
    outs = [forward(*inputs).numpy() for _ in range(calls)]
    assert forward.replays >= min_replays
    for out in outs:
        np.testing.assert_array_equal(out, expected)
