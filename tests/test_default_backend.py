"""cn.default_backend(): NumPy when it imports, else Python; `import cinders` never needs NumPy."""

import subprocess
import sys
import textwrap

import cinders as cn


def test_default_is_numpy_when_installed():
    assert isinstance(cn.default_backend(), cn.NumPy)
    assert cn.tensor([1.0]).backend == cn.default_backend()


def test_set_default_backend_is_used_by_creation():
    before = cn.default_backend()
    try:
        cn.set_default_backend(cn.Python())
        assert isinstance(cn.zeros(2).backend, cn.Python) and isinstance(cn.arange(3).backend, cn.Python)
    finally:
        cn.set_default_backend(before)


def test_without_numpy_the_default_is_python():
    # A fresh interpreter in which `import numpy` fails, as in Pyodide without the numpy package.
    code = textwrap.dedent("""
        import sys
        sys.modules["numpy"] = None
        import cinders as cn
        t = (cn.tensor([[1.0, 2.0]]) * 3).softmax(-1)
        assert type(cn.default_backend()).__name__ == "Python", cn.default_backend()
        assert "cinders.backends.numpy_backend" not in sys.modules
        print(t.shape, round(sum(t.tolist()[0]), 5))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["(1,", "2)", "1.0"]
