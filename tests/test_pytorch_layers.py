"""The layers torchvision's resnet18 / mobilenet_v2 need, against torch.nn on every registered
backend: AdaptiveAvgPool2d (equal and unequal windows), ReLU6, Hardswish, Hardsigmoid,
BatchNorm2d with momentum=None, depthwise Conv2d."""

import numpy as np
import pytest
import torch

import backends as registry
import cinders as cn
from cinders import nn


@pytest.fixture(scope="module", params=registry.selected_names())
def backend(request):
    return registry.BACKENDS[request.param]()


def _x(shape, seed=0, scale=4.0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale


@pytest.mark.parametrize("ours, theirs", [
    (nn.ReLU6(), torch.nn.ReLU6()), (nn.Hardswish(), torch.nn.Hardswish()),
    (nn.Hardsigmoid(), torch.nn.Hardsigmoid()), (nn.Identity(), torch.nn.Identity()),
    (nn.AdaptiveAvgPool2d(1), torch.nn.AdaptiveAvgPool2d(1)),
    (nn.AdaptiveAvgPool2d((2, 3)), torch.nn.AdaptiveAvgPool2d((2, 3))),   # equal windows
    (nn.AdaptiveAvgPool2d((3, 4)), torch.nn.AdaptiveAvgPool2d((3, 4))),   # overlapping windows
    (nn.AdaptiveAvgPool2d((None, 2)), torch.nn.AdaptiveAvgPool2d((None, 2))),
], ids=["relu6", "hardswish", "hardsigmoid", "identity", "adaptive1", "adaptive2x3", "adaptive3x4",
        "adaptiveNone"])
def test_layer_matches_torch(backend, ours, theirs):
    x = _x((2, 3, 4, 6))
    got = ours(cn.tensor(x, backend=backend)).numpy()
    want = theirs(torch.tensor(x)).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_adaptive_avg_pool_gradient_matches_torch():
    x = _x((1, 2, 5, 7))
    ad = cn.Autodiff(cn.NumPy())
    xc = cn.tensor(x, backend=ad).require_grad()
    weights = cn.arange(12, backend=ad).reshape(1, 1, 3, 4)
    grads = (nn.functional.adaptive_avg_pool2d(xc, (3, 4)) * weights).sum().backward()
    xt = torch.tensor(x, requires_grad=True)
    (torch.nn.functional.adaptive_avg_pool2d(xt, (3, 4)) * torch.arange(12.0).reshape(1, 1, 3, 4)).sum().backward()
    np.testing.assert_allclose(xc.grad(grads).numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_adaptive_avg_pool_rejects_bad_sizes():
    with pytest.raises(cn.ShapeError):
        nn.functional.adaptive_avg_pool2d(cn.zeros(1, 1, 4, 4), 0)
    with pytest.raises(cn.ShapeError):
        nn.functional.adaptive_avg_pool2d(cn.zeros(4, 4), 2)


def test_batchnorm_cumulative_average_momentum_none():
    torch.manual_seed(0)
    twin = torch.nn.BatchNorm2d(3, momentum=None)
    layer = nn.BatchNorm2d(3, momentum=None, backend=cn.NumPy())
    for seed in range(3):
        x = _x((4, 3, 2, 2), seed)
        layer(cn.tensor(x, backend=cn.NumPy())), twin(torch.tensor(x))
    np.testing.assert_allclose(layer.running_mean.numpy(), twin.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.running_var.numpy(), twin.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert layer.num_batches_tracked.item() == 3


def test_depthwise_conv_matches_torch(backend):
    torch.manual_seed(0)
    twin = torch.nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4, bias=False)
    layer = nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4, bias=False, backend=backend)
    layer.load_state_dict({k: v.detach().numpy() for k, v in twin.state_dict().items()})
    x = _x((2, 4, 7, 7))
    np.testing.assert_allclose(layer(cn.tensor(x, backend=backend)).numpy(),
                               twin(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-4)
