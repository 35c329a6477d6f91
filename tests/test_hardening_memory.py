"""Issue 26: peak memory of loading a file, as a factor of the file's size, per reader. Each case
loads a 2 MB file in a fresh process (benchmarks/reader_memory.py measures the same at any size:
`.venv/bin/python benchmarks/reader_memory.py --mb 4`). The factors below are the documented
allowances (docs/records.md, docs/onnx.md): float32 data costs its bytes a few times over (the
file's bytes, the decoded array, the backend's copy); float16/bfloat16 double on widening to
float32; ONNX int64 initializers are lists of Python ints in the importer."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import reader_memory  # noqa: E402

FACTORS = {"onnx_float32": 4, "onnx_float16": 6, "onnx_bfloat16": 7, "onnx_int64": 9, "onnx_external": 4,
           "safetensors_float32": 3, "safetensors_float16": 5, "pytorch_zip": 2, "pytorch_legacy": 2,
           "pytorch_plain": 3}


def test_every_reader_has_a_factor():
    assert set(FACTORS) == set(reader_memory.CASES)


@pytest.mark.parametrize("case", sorted(FACTORS))
def test_peak_memory_is_a_small_factor_of_the_file(case, tmp_path):
    result = reader_memory.measure(case, 2 << 20, str(tmp_path))
    assert result["factor"] <= FACTORS[case], result
