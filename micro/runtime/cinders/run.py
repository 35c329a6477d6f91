"""What a bundle's predict.py runs: load the record, read the input, print one JSON line.
Kept in lib (compiled with the runtime) so the script the board compiles from source is tiny.

The input file is a JSON list of numbers, flat or nested, holding one sample of the model's
input shape (the record's `input_shape`, written by `cinders export-micro`, or
`--input-shape 1,28,28`) or a batch of them (neither: cinders.nested). Output, like `cinders
predict` on the desktop: a classifier (one vector per sample) gives {"class": k, "logits":
[...]} (lists of them for a batch); any other model {"output": nested lists}.
"""
import gc
import json

import cinders
from cinders import record
from cinders._tensor import Tensor, empty


def _scan(path, out):
    """How many numbers the JSON file holds (flat or nested), stored into `out` when given. Read
    a chunk at a time: json.load would hold every number boxed plus lists (~19 KB for a digit,
    a third of a 64 KB heap)."""
    k = 0
    tail = ""
    with open(path) as f:
        while True:
            chunk = f.read(256)
            parts = (tail + chunk).replace("[", ",").replace("]", ",").split(",")
            tail = parts.pop() if chunk else ""
            for p in parts:
                p = p.strip()
                if p:
                    v = float(p)  # raises on anything but a number: read_input names the file
                    if out is not None:
                        out[k] = v
                    k += 1
            if not chunk:
                break
    return k


def read_input(path, shape, buf=None):
    """(flat values, batch shape) of the input file: one sample of `shape` or a batch."""
    n = 1
    for d in shape:  # [0] would divide by zero, [1e9] ask for gigabytes
        n = n * d if type(d) is int and d > 0 else 0
    if not 0 < n <= 1 << 24:
        raise ValueError("input_shape %r: not positive ints of at most 2**24 elements" % (shape,))
    try:
        k = _scan(path, None)
    except ValueError:  # float() of a word: name the file, not the word
        raise ValueError("%s is not a JSON list of numbers" % path)
    if k == 0 or k % n:
        raise ValueError("%s holds %d numbers, expected %d (one input of shape %s) or a "
                         "multiple of it (a batch)" % (path, k, n, shape))
    if buf is None or len(buf) != k:
        buf = None
        gc.collect()
        buf = empty("f", k)
    _scan(path, buf)
    return buf, (k // n,) + tuple(shape)


def result(y):
    """The JSON-ready result of a batch's output tensor y (see the module docstring)."""
    B = y.shape[0]
    m = y.numel() // B
    if len(y.shape) != 2 or m < 2:
        out = y.tolist()
        return {"output": out[0] if B == 1 else out}
    v = cinders.engine.to_list(y.data)
    if any(x != x for x in v):  # NaN: max() and index() would say "object not in sequence"
        raise ValueError("the model's output holds NaN: the record's weights or the input are not finite")
    rows = [v[b * m:(b + 1) * m] for b in range(B)]
    k = [r.index(max(r)) for r in rows]  # the first of equal maxima, like argmax
    return {"class": k[0], "logits": rows[0]} if B == 1 else {"class": k, "logits": rows}


def predict(net, values, shape=(1, 1, 28, 28)):
    """(class, logits) of one sample given as flat floats (a 28x28 image by default)."""
    r = result(net(Tensor(cinders.engine.from_flat(values, shape), shape)))
    return r["class"], r["logits"]


def main(argv, model, path="model.safetensors", pixels=None, shape=None):
    """model: the model's module; path: the record; shape: one sample's shape (predict.py reads it from --input-shape or the record; None:
    the record's);
    pixels: an array for one sample allocated before the modules were compiled, used when the
    file holds one sample."""
    if len(argv) < 2:
        print("usage: micropython predict.py INPUT.json [--input-shape A,B,...]")
        return 2
    if shape is None:  # called without predict.py: the record's
        from cinders.safetensors import Reader
        with open(path, "rb") as f:
            shape = json.loads(Reader(f).metadata.get("input_shape") or "[]")
    if not shape:
        # Only here, and few new names in this module: MicroPython interns every name in
        # blocks that double, and the next block does not fit the int8 MLP's 64 KB heap.
        from cinders import nested
        shape = nested.shape(argv[1])
    gc.collect()
    values, full = read_input(argv[1], shape, pixels)
    gc.collect()
    net = record.load_model(path, model)
    x = Tensor(cinders.engine.from_flat(values, full), full)
    gc.collect()  # the loader's garbage, before the first layer asks for its buffers
    out = result(net(x))
    out["engine"] = cinders.ENGINE
    print(json.dumps(out))
    return 0
