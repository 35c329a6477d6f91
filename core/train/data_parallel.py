"""Data-parallel training: one step's batch split over several devices, one optimizer step.

    learner = Learner(model, optim.Adam(1e-3), nn.cross_entropy,
                      devices=[cn.Autodiff(cn.Wgpu(adapter=0)), cn.Autodiff(cn.Wgpu(adapter=1))])

Each step (`DataParallel.step`):
  1. every device holds a replica of the model (the model itself on a device equal to its own
     backend; elsewhere a structural copy moved there once), whose weights are set from the
     model's before the step (through the host: `load_state_dict`);
  2. the batch is split along dim 0 into one shard per device (sizes differ by at most one);
  3. each device runs forward, loss and backward on its shard, in its own thread (gradients
     are values, never stored on tensors, so the passes cannot interfere);
  4. the gradients come to the model's device and are averaged weighted by shard size:
     g = sum_k (n_k / N) g_k, the gradient of the mean loss over the whole batch when the loss
     is a mean over its batch (cross_entropy, mse_loss: the default reduction);
  5. the optimizer steps once, on the model.
So the result equals single-device training on the same global batch up to float rounding.
Buffers (BatchNorm's running statistics) are those of the model's own shard, as in PyTorch's
DataParallel. Devices may be any backends that record gradients: several cn.Wgpu adapters,
CPU backends, cn.Remote backends.

Every move of the step (weights to the replicas, shards to the devices, gradients and outputs
back) goes through `moved`: between two cn.Remote devices the model's server and the
replica's send the tensors to each other (`Remote.send_to`), so with the model itself on a
Remote (`model.to(cn.Autodiff(cn.Remote(a)))`, devices on Remote(a), Remote(b), ...) weights and
gradients never cross the client, only the losses do; with the model here, a Remote device's
gradients come through the host.
"""

import copy
from concurrent.futures import ThreadPoolExecutor

from ..autodiff import Gradients
from ..creation import tensor
from ..errors import ArgumentError, ArgumentTypeError
from ..optim import clip_grad_norm
from ..tensor import Tensor, cat


def shard_sizes(n, parts):
    """Sizes of `parts` contiguous shards of n rows, differing by at most one (larger first)."""
    base, extra = divmod(n, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def on(tensor, backend):
    """`tensor` on `backend`: the same handle when the backends are the same device, else a copy."""
    if tensor.backend is backend:
        return tensor
    if tensor.backend == backend:
        return Tensor(backend, tensor.handle, tensor.shape, tensor.dtype)
    return tensor.to(backend)


def _undecorated(backend):
    return backend.inner if backend.differentiable else backend


def moved(tensors, backend):
    """`tensors` (all on one backend) on `backend`, without history: the same handles on one
    device (with or without Autodiff); sent from server to server when both are devices that
    send to their peers (cn.Remote, `sends_to_peers`), so the bytes never cross this machine;
    else as `on` moves them."""
    if not tensors:
        return []
    source, target = tensors[0].backend, backend
    src, dst = _undecorated(source), _undecorated(target)
    if source == target or (src != dst and not (src.sends_to_peers and dst.sends_to_peers)):
        return [on(t.detach() if source.differentiable else t, backend) for t in tensors]
    plain = [source.to_inner(t) if source.differentiable else t for t in tensors]
    handles = [t.handle for t in plain] if src == dst else src.send_to([t.handle for t in plain], dst)
    out = [Tensor(dst, h, t.shape, t.dtype) for h, t in zip(handles, plain)]
    return [target.from_inner(t) for t in out] if target.differentiable else out


class DataParallel:
    """The step of a model trained on several devices at once (see the module docstring)."""

    def __init__(self, model, devices):
        devices = list(devices)
        if not devices:
            raise ArgumentError("devices: give at least one backend, e.g. [cn.Autodiff(cn.NumPy())]")
        for d in devices:
            if not d.differentiable:
                raise ArgumentTypeError("devices: %r does not record gradients; wrap it: cn.Autodiff(%r)"
                                        % (d, d))
        self.devices = devices
        self.replicas = [None] * len(devices)
        self._threads = ThreadPoolExecutor(len(devices), thread_name_prefix="cinders-device")

    def _replicas(self, model):
        """One module per device with the model's current weights."""
        home = model.parameters()[0].backend
        own = next((k for k, d in enumerate(self.devices) if d == home), None)
        for k, device in enumerate(self.devices):
            if k == own:
                self.replicas[k] = model
                continue
            state = model.state_dict()
            weights = dict(zip(state, moved(list(state.values()), device)))
            if self.replicas[k] is None or self.replicas[k] is model:
                # A copy of the module structure that shares the tensors, given the weights
                # already on the device (`to` then only marks the parameters as leaves there).
                shared = {id(t): t for t in state.values()}
                self.replicas[k] = copy.deepcopy(model, shared).replace_tensors(weights).to(device)
            else:
                self.replicas[k].load_state_dict(weights)
            self.replicas[k].train(model.training)
        return self.replicas

    def step(self, model, optimizer, loss_fn, inputs, targets, grad_clip=None):
        """One training step over the devices; returns (model after the step, output, loss),
        output and loss on the model's device like a single-device step's."""
        if not isinstance(inputs, Tensor) or not isinstance(targets, Tensor):
            raise ArgumentTypeError("data-parallel training splits tensors along dim 0; got inputs %s "
                                    "and targets %s" % (type(inputs).__name__, type(targets).__name__))
        n = inputs.shape[0]
        if targets.shape[0] != n:
            raise ArgumentError("inputs have %d rows but targets %d" % (n, targets.shape[0]))
        sizes = [s for s in shard_sizes(n, len(self.devices)) if s]
        replicas = self._replicas(model)[:len(sizes)]
        starts = [sum(sizes[:k]) for k in range(len(sizes))]

        home = model.parameters()[0].backend
        inner = home.inner

        def run(k):
            device, replica, a, b = self.devices[k], replicas[k], starts[k], starts[k] + sizes[k]
            x, y = moved([inputs[a:b], targets[a:b]], device)
            output = replica(x)
            loss = loss_fn(output, y)
            grads = loss.backward()
            grads = [p.grad(grads) for p in replica.parameters()]
            present = [g for g in grads if g is not None]
            arrived = iter(moved(present, inner))  # the gradients on the model's device
            return (moved([output], home)[0], loss.item(),
                    [None if g is None else next(arrived) for g in grads])

        results = list(self._threads.map(run, range(len(sizes))))
        pairs = []
        for j, p in enumerate(model.parameters()):
            total = None
            for (_, _, grads), size in zip(results, sizes):
                g = grads[j]
                if g is not None:
                    g = g * (size / n)
                    total = g if total is None else total + g
            if total is not None:
                pairs.append((p, total))
        grads = Gradients.of(pairs)
        if grad_clip:
            grads, _ = clip_grad_norm(grads, grad_clip)
        model = optimizer.step(model, grads)
        output = cat([out for out, _, _ in results], 0)
        loss = sum(value * size for (_, value, _), size in zip(results, sizes)) / n
        return model, output, tensor(loss, backend=home)
