"""Which engine runs without ulab: `wasm` in MicroPython WebAssembly on a page that loaded
cn.Wasm()'s kernels (wasm/micro_kernels.mjs), else `array`. Its own module so that a board's
import of cinders compiles none of this choice's code it does not run (a 64 KB heap is tight)."""
try:
    import js  # noqa: F401  (MicroPython WebAssembly only: a board never compiles _wasm.py)
    from cinders import _wasm as engine  # ImportError when the page has no kernels
    ENGINE = "wasm"
except ImportError:
    from cinders import _array as engine
    ENGINE = "array"
