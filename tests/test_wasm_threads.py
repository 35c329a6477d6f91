"""cn.Wasm()'s threaded build (wasm_backend/build.py, runtime.h parallel_for, wasm/kernel_threads.mjs)
against its single-threaded module, both in Node: matmuls, convolutions and a whole imported CNN
give the same bits, and the products were really shared among the threads (the pool's job and
join counts).
The page's side (a cross-origin isolated page starts the pool) is e2e/test_wasm_threads_page.py."""
import numpy as np
import pytest

import cinders as cn
from cinders import onnx as cn_onnx
from cinders.wasm import build
from cinders.wasm.engines import NodeEngine

import onnx_models

THREADS = 4
RNG = np.random.default_rng(23)


@pytest.fixture(scope="module")
def single():
    engine = NodeEngine()
    yield cn.Wasm(engine=engine)
    engine.close()


@pytest.fixture(scope="module")
def threaded():
    engine = NodeEngine(threads=THREADS)
    yield cn.Wasm(engine=engine)
    engine.close()


def _bits(t):
    return np.asarray(t.numpy()).view(np.uint32)


def _same_bits(fn, single, threaded, *arrays):
    """fn(*tensors) on both builds: the same bits; returns how many jobs the threads shared."""
    jobs = threaded.engine.call("pool_jobs")
    want = fn(*(cn.tensor(a, backend=single) for a in arrays))
    got = fn(*(cn.tensor(a, backend=threaded) for a in arrays))
    np.testing.assert_array_equal(_bits(got), _bits(want))
    return threaded.engine.call("pool_jobs") - jobs


def _normal(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_the_threaded_build_is_its_own_module_with_a_pool(threaded):
    assert build.module_path(threaded=True) != build.module_path()
    assert threaded.threads == threaded.engine.call("pool_threads") == THREADS
    assert {"pool_worker", "pool_stack_top"} <= threaded.engine.kernels
    assert cn.Wasm().threads == 1   # the desktop's native build: one thread


# (a shape, b shape): row blocks, a batch with a broadcast operand, rows not a multiple of 4,
# transposed b with few rows (column blocks: Linear at batch 1) and with many (row blocks)
MATMULS = [((37, 96), (96, 45)), ((3, 21, 50), (50, 70)), ((2, 1, 9, 40), (3, 40, 66))]
MATMULS_TRANSPOSED = [((1, 512), (300, 512)), ((5, 256), (130, 256)), ((33, 128), (100, 128))]


@pytest.mark.parametrize("a_shape, b_shape", MATMULS)
def test_matmul_same_bits(single, threaded, a_shape, b_shape):
    assert _same_bits(lambda a, b: a @ b, single, threaded, _normal(*a_shape), _normal(*b_shape)) >= 1


@pytest.mark.parametrize("a_shape, w_shape", MATMULS_TRANSPOSED)
def test_matmul_of_a_transposed_weight_same_bits(single, threaded, a_shape, w_shape):
    assert _same_bits(lambda a, w: a @ w.T, single, threaded, _normal(*a_shape), _normal(*w_shape)) >= 1


def test_small_products_stay_on_the_calling_thread(single, threaded):
    assert _same_bits(lambda a, b: a @ b, single, threaded, _normal(6, 8), _normal(8, 5)) == 0


# (x shape, w shape, stride, padding, groups): pixel panels, a 1x1 convolution (one product),
# grouped and strided with asymmetric padding
CONVS = [((2, 8, 30, 30), (16, 8, 3, 3), 1, 1, 1), ((1, 32, 20, 20), (48, 32, 1, 1), 1, 0, 1),
         ((1, 16, 23, 19), (24, 8, 3, 5), (2, 1), ((1, 0), (2, 1)), 2)]


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, groups", CONVS)
def test_conv2d_same_bits(single, threaded, x_shape, w_shape, stride, padding, groups):
    def conv(x, w, b):
        return cn.conv2d(x, w, b, stride=stride, padding=padding, groups=groups, activation="relu")
    jobs = _same_bits(conv, single, threaded, _normal(*x_shape), _normal(*w_shape), _normal(w_shape[0]))
    assert jobs >= 1


def test_an_imported_cnn_same_bits(single, threaded):
    path = onnx_models.export("squeezenet1_1")
    image = onnx_models.inputs_for("squeezenet1_1", 1)[0]
    models = [cn_onnx.load(path, backend=backend) for backend in (single, threaded)]
    want = models[0](cn.tensor(image, backend=single))
    jobs, joins = threaded.engine.call("pool_jobs"), threaded.engine.call("pool_joins")
    got = models[1](cn.tensor(image, backend=threaded))
    assert threaded.engine.call("pool_jobs") - jobs > 10
    assert threaded.engine.call("pool_joins") > joins   # the workers took items, not only the caller
    np.testing.assert_array_equal(_bits(got), _bits(want))
