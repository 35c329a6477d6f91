"""How many kernel windows fit along a dim: the desktop's unfold2d_output_size (core/backend.py),
for every engine's conv and pooling. A module of its own so that only models with image layers
load it (a 64 KB heap has no bytes to spare)."""


def window_count(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1
