"""Runs ONNX's own backend node tests (`onnx.backend.test.case.node.collect_testcases()`) through
cinders.onnx on one backend, and writes the table docs/onnx-ops.md.

    python tests/onnx_node_cases.py --write-docs     # NumPy all, Python and Wgpu on samples

Each case is a model plus inputs and expected outputs that `onnx` generates offline. cinders
computes in float32/int32/bool, so float64/int64 inputs and expectations are compared as float32
/int32 (the case's own rtol/atol, atol at least 1e-6 for float32 rounding).
"""

import argparse
import collections
import os
import sys
import warnings

import numpy as np

import cinders as cn
from cinders.onnx import OnnxError, load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def collect():
    """[(name, op types, model bytes, data sets)] of every node test case, sorted by name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases
        cases = collect_testcases()
    out = []
    for c in sorted(cases, key=lambda c: c.name):
        ops = sorted({n.op_type for n in c.model.graph.node})
        out.append((c.name, ops, c.model.SerializeToString(), c.data_sets, c.rtol, c.atol, c.model))
    return out


def main_op(name, model):
    """The op a case tests: the one named in the case (test_<op>_...) among its nodes."""
    nodes = [n.op_type for n in model.graph.node]
    key = name[len("test_"):].replace("_", "").lower()
    best = None
    for op in set(nodes):
        if key.startswith(op.lower()) and (best is None or len(op) > len(best)):
            best = op
    return best or (nodes[0] if len(set(nodes)) == 1 else nodes[-1])


def _array(value):
    """A data-set entry as a NumPy array (the generator gives TensorProtos for some dtypes)."""
    if type(value).__name__ == "TensorProto":
        from onnx import numpy_helper
        return numpy_helper.to_array(value)
    return value


def _as_input(array, backend):
    array = _array(array)
    if isinstance(array, np.ndarray) and array.dtype.kind in "biuf":
        return cn.tensor(array, backend=backend)
    if isinstance(array, (np.generic,)) and array.dtype.kind in "biuf":
        return cn.tensor(np.asarray(array), backend=backend)
    raise TypeError("input of type %s" % getattr(array, "dtype", type(array).__name__))


def compare(got, expected, rtol, atol):
    """None when equal enough, else the reason."""
    if isinstance(expected, np.generic):
        expected = np.asarray(expected)
    if not isinstance(expected, np.ndarray) or expected.dtype.kind not in "biuf":
        return "expected output of type %s" % getattr(expected, "dtype", type(expected).__name__)
    values = got.numpy()
    if tuple(values.shape) != tuple(expected.shape):
        return "shape %s, expected %s" % (tuple(values.shape), tuple(expected.shape))
    if expected.dtype.kind == "f":
        exp = expected.astype(np.float32).astype(np.float64)
        ok = np.allclose(values.astype(np.float64), exp, rtol=max(rtol, 1e-5), atol=max(atol, 1e-6), equal_nan=True)
        return None if ok else "max abs diff %.3g" % np.nanmax(np.abs(values - exp)) if values.size else None
    if expected.dtype.kind == "b":
        return None if np.array_equal(values.astype(bool), expected) else "bool values differ"
    exp = expected.astype(np.int64)
    if exp.size and (exp.max() > 2 ** 31 - 1 or exp.min() < -2 ** 31):
        return "expected ints beyond int32"
    return None if np.array_equal(values.astype(np.int64), exp) else "int values differ"


def run_case(case, backend):
    """('pass' | 'fail' | 'unsupported', reason)."""
    name, ops, data, data_sets, rtol, atol, _ = case
    try:
        model = load(data, backend=backend)
    except OnnxError as e:
        return "unsupported", str(e).splitlines()[-1].strip()
    except Exception as e:  # noqa: BLE001  (a crash while importing counts as a failure, with its reason)
        return "fail", "import: %s: %s" % (type(e).__name__, e)
    for inputs, expected in data_sets:
        try:
            args = [_as_input(a, backend) for a in inputs]
        except TypeError as e:
            return "unsupported", str(e)
        try:
            out = model(*args)
        except Exception as e:  # noqa: BLE001
            return "fail", "run: %s: %s" % (type(e).__name__, str(e)[:200])
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) != len(expected):
            return "fail", "%d outputs, expected %d" % (len(outs), len(expected))
        for got, exp in zip(outs, expected):
            reason = compare(got, _array(exp), rtol, atol)
            if reason:
                return "fail", reason
    return "pass", ""


def float32_only(case):
    """True when every input and output of the case is float32 (the GPU backend's cases)."""
    for inputs, outputs in case[3]:
        for a in list(inputs) + list(outputs):
            if not isinstance(a, np.ndarray) or a.dtype != np.float32:
                return False
    return True


def run(cases, backend):
    with np.errstate(all="ignore"):
        return {c[0]: run_case(c, backend) for c in cases}


def write_table(path, cases, results_by_backend):
    per_op = collections.OrderedDict()
    for case in cases:
        per_op.setdefault(main_op(case[0], case[6]), []).append(case[0])
    names = list(results_by_backend)
    lines = ["# ONNX node tests on cinders", "",
             "Generated by `python tests/onnx_node_cases.py --write-docs` from",
             "`onnx.backend.test.case.node.collect_testcases()` (onnx %s): each op's cases as"
             % __import__("onnx").__version__,
             "passed / failed / unsupported per backend. NumPy runs every case; Python and Wgpu",
             "(lavapipe) run the float32 cases of a sample (blank: not run). See docs/onnx.md for deviations.", ""]
    totals = {b: collections.Counter(r for r, _ in res.values()) for b, res in results_by_backend.items()}
    lines.append("Totals: " + "; ".join("%s %d passed, %d failed, %d unsupported (of %d run)"
                                         % (b, t["pass"], t["fail"], t["unsupported"], sum(t.values()))
                                         for b, t in totals.items()))
    lines += ["", "| op | cases | " + " | ".join(names) + " |", "| --- | --- |" + " --- |" * len(names)]
    for op_name in sorted(per_op):
        row = ["`%s`" % op_name, str(len(per_op[op_name]))]
        for b in names:
            res = results_by_backend[b]
            c = collections.Counter(res[n][0] for n in per_op[op_name] if n in res)
            row.append("%d / %d / %d" % (c["pass"], c["fail"], c["unsupported"]) if c else "")
        lines.append("| " + " | ".join(row) + " |")
    failures = [(n, r) for n, (s, r) in sorted(results_by_backend[names[0]].items()) if s == "fail"]
    lines += ["", "## Failing cases on %s" % names[0], ""]
    lines += ["- `%s`: %s" % (n, r.replace("|", "/")) for n, r in failures]
    kept = ""   # sections other generators append below a "<!-- ... -->" line (test_onnx_contrib.py)
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        kept = old[old.index("\n<!-- "):] if "\n<!-- " in old else ""
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n" + kept)


def sample(cases, every):
    return [c for i, c in enumerate(cases) if i % every == 0]


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--write-docs", action="store_true")
    p.add_argument("--backend", default="numpy")
    p.add_argument("--show", default="fail")
    args = p.parse_args(argv)
    cases = collect()
    results = {"NumPy": run(cases, cn.NumPy())}
    if args.write_docs:
        f32 = [c for c in cases if float32_only(c)]
        results["Python"] = run(sample(f32, 4), cn.Python())
        results["Wgpu"] = run(sample(f32, 4), cn.Wgpu())
        write_table(os.path.join(ROOT, "docs", "onnx-ops.md"), cases, results)
    for b, res in results.items():
        c = collections.Counter(s for s, _ in res.values())
        print(b, dict(c))
    for name, (status, reason) in sorted(results["NumPy"].items()):
        if status in args.show.split(","):
            print(status, name, reason)


if __name__ == "__main__":
    sys.exit(main())
