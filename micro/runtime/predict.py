# micropython predict.py INPUT.json  (from inside the bundle) -> one JSON line:
# {"class": k, "logits": [...], "engine": "ulab" | "array"}; INPUT is 784 floats in [0, 1].
import sys

sys.path.insert(0, "lib")  # boards search /lib already; the unix port needs it spelled out
from array import array  # noqa: E402

# The record reader first, while the heap is empty: compiling its source (a .py bundle) is the
# largest peak of the start-up. cinders.record drops it again once the weights are bound.
import cinders.safetensors  # noqa: E402,F401

# Then the input buffer, before the other modules: compiling them leaves the heap in pieces too
# small for 784 floats on a 64 KB heap.
pixels = array("f", range(784))
import model  # noqa: E402
from cinders.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv, model, pixels=pixels))
