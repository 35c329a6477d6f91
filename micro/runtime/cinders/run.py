"""What a bundle's predict.py runs: load the record, read one input, print one JSON line.
Kept in lib (compiled with the runtime) so the script the board compiles from source is tiny."""
import gc
import json

import cinders
from cinders import record
from cinders.tensor import empty


def read_floats(path, n, out=None):
    """The n numbers of a JSON list, parsed a chunk at a time into an array (`out`, or a new
    one): json.load would hold n boxed floats plus a list (~19 KB for a digit), a third of a
    64 KB heap."""
    if out is None:
        out = empty("f", n)
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
                    if k == n:
                        raise ValueError("%s holds more than %d numbers" % (path, n))
                    out[k] = float(p)
                    k += 1
            if not chunk:
                break
    if k != n:
        raise ValueError("%s holds %d numbers, expected %d (a JSON list of 28x28 pixels)"
                         % (path, k, n))
    return out


def predict(net, pixels):
    """(class, logits) of one 28x28 image given as 784 floats."""
    logits = net(cinders.tensor(pixels, (1, 1, 28, 28))).tolist()
    best = 0
    for i in range(len(logits)):
        if logits[i] > logits[best]:
            best = i
    return best, logits


def main(argv, model_module, record_path="model.safetensors", pixels=None):
    """pixels: an array('f') of 784 items allocated before the modules were compiled (compiling
    leaves the heap in small pieces; a 64 KB heap then has no 3 KB hole left)."""
    if len(argv) < 2:
        print("usage: micropython predict.py INPUT.json")
        return 2
    gc.collect()
    pixels = read_floats(argv[1], 28 * 28, pixels)
    gc.collect()
    net = record.load_model(record_path, model_module)
    k, logits = predict(net, pixels)
    print(json.dumps({"class": k, "logits": logits, "engine": cinders.ENGINE}))
    return 0
