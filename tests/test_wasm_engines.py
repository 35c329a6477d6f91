"""cn.Wasm()'s desktop engines: in-process Wasmtime (the default) and the Node child process
run the same module to the same numbers; Wasmtime's memory accesses are bounds-checked."""

import numpy as np
import pytest

import cinders as cn
import cinders.nn.functional as F
from cinders.models.mnist import MnistCNN
from cinders.wasm.engines import NodeEngine, WasmEngineError, WasmtimeEngine, default_engine


def test_the_desktop_default_is_wasmtime():
    assert isinstance(default_engine(), WasmtimeEngine)
    assert isinstance(cn.Wasm().engine, WasmtimeEngine)


def test_node_and_wasmtime_compute_the_same_training_step():
    def losses(engine):
        cn.manual_seed(0)
        backend = cn.Autodiff(cn.Wasm(engine=engine))
        model = MnistCNN().to(backend)
        opt = cn.optim.AdamW(lr=1e-3)
        rng = np.random.default_rng(0)
        out = []
        for _ in range(3):
            x = cn.tensor(rng.random((4, 1, 28, 28), dtype=np.float32), backend=backend)
            y = cn.tensor(rng.integers(0, 10, 4).astype(np.int32), backend=backend)
            loss = F.cross_entropy(model(x), y)
            opt.step(model, loss.backward())
            out.append(loss.item())
        return out, model.layers[0].weight.numpy()

    node, wasmtime = losses(NodeEngine()), losses(WasmtimeEngine())
    assert node[0] == wasmtime[0]  # the same module: the same bits
    np.testing.assert_array_equal(node[1], wasmtime[1])


def test_wasmtime_memory_access_out_of_bounds_is_an_error():
    engine = WasmtimeEngine()  # its own memory: no backend's data at the end of it
    size = engine.size
    with pytest.raises(WasmEngineError, match="outside the module's memory"):
        engine.write(size - 2, b"abcd")
    with pytest.raises(WasmEngineError, match="outside the module's memory"):
        engine.read(-1, 4)
    engine.write(size - 4, b"abcd")
    assert engine.read(size - 4, 4) == b"abcd"
