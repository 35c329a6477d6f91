# micropython predict.py INPUT.json [--input-shape A,B,...]  (from inside the bundle) -> one
# JSON line: {"class": k, "logits": [...], "engine": "ulab" | "array"} for a classifier, else
# {"output": [...], "engine": ...}. INPUT: one sample of the record's input shape, or a batch.
import gc
import sys

sys.path.insert(0, "lib")  # boards search /lib already; the unix port needs it spelled out
from array import array  # noqa: E402

# The record reader and binder first, while the heap is empty: compiling their source (a .py
# bundle) is the largest peak of the start-up. cinders.record drops the reader again once the
# weights are bound.
import cinders.safetensors  # noqa: E402
import cinders.record  # noqa: E402,F401

# Then one sample's input buffer, before the other modules: compiling them leaves the heap in
# pieces too small for a 28x28 image on a 64 KB heap.
a = sys.argv
if "--input-shape" in a:
    s = a.pop(a.index("--input-shape") + 1)
    a.remove("--input-shape")
else:
    with open("model.safetensors", "rb") as f:
        s = cinders.safetensors.Reader(f).metadata.get("input_shape") or ""
shape = cinders.record.input_shape(s)  # RecordError for [1e400], [0], [1e9], ...
n = 1
for d in shape:
    n *= d
pixels = array("f", range(n)) if n < 16777216 else None  # larger: cinders.run names the shape
gc.collect()  # the metadata's garbage, before compiling the model's modules
import model  # noqa: E402

gc.collect()  # each compile leaves garbage between the heap's free pieces: collect before the next
from cinders.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(a, model, pixels=pixels, shape=shape))
