"""Peak memory of each file reader as a factor of the file's size (issue 26: memory bounded by the
bytes present). Each case writes a file of about SIZE bytes, then loads it in a fresh Python
process and reports the peak of tracemalloc (Python objects, arrays and NumPy buffers) over the
file's size. One JSON line per case:

    .venv/bin/python benchmarks/reader_memory.py [--mb 4] [CASE ...]

Graphs of tiny nodes (issue 26): `onnx_empty_nodes` (a node per 2 bytes: a million in 2 MB),
`onnx_empty_attributes` (one node, an empty attribute per 2 bytes) and `onnx_node_chain` (a chain
of Relu nodes, ~24 bytes each: 100k in 2.3 MB) are refused by cn.limits.max_graph_nodes() from a
count of their bytes; `onnx_chain_5k` is one that loads (5,000 nodes) and says what a node costs
(`peak_per_node`). A refused file prints `"refused": true`.

tests/test_hardening_memory.py runs the same cases at 2 MB and holds each under its factor.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


# case: (what writes the file, what loads it)
CASES = ("onnx_float32", "onnx_float16", "onnx_bfloat16", "onnx_int64", "onnx_external",
         "onnx_empty_nodes", "onnx_empty_attributes", "onnx_node_chain", "onnx_chain_5k",
         "safetensors_float32", "safetensors_float16", "pytorch_zip", "pytorch_legacy", "pytorch_plain")
GRAPH_CASES = {"onnx_empty_nodes", "onnx_empty_attributes", "onnx_node_chain", "onnx_chain_5k"}


def write_graph(case, path, nbytes):
    """A model whose bytes are nodes (or attributes), not weights; returns (path, node count)."""
    import onnx
    from onnx import TensorProto, helper
    if case == "onnx_empty_nodes":
        graph = helper.make_graph([], "g", [], [])
        for _ in range(nbytes // 2):
            graph.node.add()   # 2 bytes each: the field's tag and a zero length
    elif case == "onnx_empty_attributes":
        node = helper.make_node("Relu", ["x"], ["y"])
        for _ in range(nbytes // 2):
            node.attribute.add()
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    else:
        n = 5000 if case == "onnx_chain_5k" else nbytes // 21
        nodes = [helper.make_node("Relu", ["v%d" % i], ["v%d" % (i + 1)]) for i in range(n)]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
                                  [helper.make_tensor_value_info("v%d" % n, TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, path)
    return path, len(graph.node)


def write(case, path, nbytes):
    """Write the file of `case` holding about `nbytes` bytes of tensor data; returns its path
    (the file whose size the factor divides by: for external data, model + data file)."""
    import numpy as np
    if case in GRAPH_CASES:
        return write_graph(case, path, nbytes)[0]
    if case.startswith("onnx_"):
        import onnx
        from onnx import TensorProto, helper, numpy_helper
        kind = case[len("onnx_"):]
        np_dtype = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "external": np.float32,
                    "bfloat16": np.uint16}[kind]
        n = nbytes // np.dtype(np_dtype).itemsize
        values = (np.arange(n) * 7919 % 30011).astype(np_dtype)  # fits float16; ints beyond the small-int cache
        if kind == "bfloat16":
            init = helper.make_tensor("w", TensorProto.BFLOAT16, [n], values.tobytes(), raw=True)
        else:
            init = numpy_helper.from_array(values, "w")
        elem = init.data_type
        graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                                  [helper.make_tensor_value_info("y", elem, [n])], [init])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        if kind == "external":
            onnx.save_model(model, path, save_as_external_data=True, location="w.bin", size_threshold=0)
        else:
            onnx.save_model(model, path)
        return path
    if case.startswith("safetensors_"):
        import cinders as cn
        from cinders import record
        t = cn.tensor((np.arange(nbytes // 4) % 251).astype(np.float32).tolist(), backend=cn.NumPy())
        record.save_tensors(path, {"w": t}, {"format": record.FORMAT}, dtype=case[len("safetensors_"):])
        return path
    if case.startswith("pytorch_"):
        import pickle
        import torch
        state = {"w": torch.arange(nbytes // 4, dtype=torch.float32)}
        if case == "pytorch_plain":  # pickle.dump: the storage is a _load_from_bytes blob
            with open(path, "wb") as f:
                pickle.dump(state, f)
        else:
            torch.save(state, path, _use_new_zipfile_serialization=case == "pytorch_zip")
        return path
    raise SystemExit("unknown case %r" % case)


def load(case, path):
    import cinders as cn
    backend = cn.NumPy()
    if case.startswith("onnx_"):
        import cinders.onnx
        return cinders.onnx.load(path, backend=backend)
    if case.startswith("safetensors_"):
        from cinders import record
        return record.read_tensors(path, backend)
    from cinders.record.pytorch import load_pytorch
    return load_pytorch(path, backend=backend)


def _child(case, path):
    """In a fresh process: import everything first, then measure only the load."""
    import tracemalloc
    import cinders  # noqa: F401  (imports are not the reader's cost)
    import numpy  # noqa: F401
    from cinders.onnx import OnnxError
    tracemalloc.start()
    try:
        load(case, path)
        refused = False
    except OnnxError:
        refused = True   # the graph cases: refused by a limit, at a cost that counts too
    peak = tracemalloc.get_traced_memory()[1]
    print(json.dumps({"peak_bytes": peak, "refused": refused}))


def measure(case, nbytes, folder):
    """{"case", "file_bytes", "peak_bytes", "factor"} of one case, measured in a subprocess."""
    path = write(case, os.path.join(folder, case + {"s": ".safetensors", "p": ".pt"}.get(case[0], ".onnx")), nbytes)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f == os.path.basename(path) or (case == "onnx_external" and f == "w.bin"))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, __file__, "--child", case, path], capture_output=True, text=True,
                         env=env, timeout=300)
    if out.returncode:
        raise RuntimeError("%s: %s" % (case, out.stderr[-2000:]))
    child = json.loads(out.stdout.strip().splitlines()[-1])
    peak = child["peak_bytes"]
    result = {"case": case, "file_bytes": size, "peak_bytes": peak, "factor": round(peak / size, 2),
              "refused": child["refused"]}
    if case == "onnx_chain_5k":
        result["peak_per_node"] = peak // 5000
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", default=CASES)
    parser.add_argument("--mb", type=float, default=4)
    parser.add_argument("--child", nargs=2, metavar=("CASE", "PATH"))
    args = parser.parse_args()
    if args.child:
        return _child(*args.child)
    for case in args.cases:
        with tempfile.TemporaryDirectory() as folder:
            print(json.dumps(measure(case, int(args.mb * (1 << 20)), folder)), flush=True)


if __name__ == "__main__":
    main()
