"""The Learner: the training loop most people want, with the chores done.

    learner = Learner(model, cn.optim.Adam(1e-3), loss=cn.nn.cross_entropy,
                      metrics=[Accuracy(), Loss()], out_dir="runs/mnist")
    history = learner.fit(train_loader, valid_loader, epochs=10)

Each epoch: train on every batch (loss -> backward -> optimizer step), evaluate on the
validation loader without recording gradients, append a row to the history, write
metrics.csv/metrics.json and checkpoint.safetensors in out_dir. At the end: curves.png.

Ctrl-C (SIGINT) asks for a stop: the current step finishes, a checkpoint of exactly that point
is written (epoch, batch index within it, metric sums) and KeyboardInterrupt is raised after it.
`fit(..., resume=True)` continues from out_dir's checkpoint: a stop mid-epoch resumes at the
next batch of the same epoch, with the same shuffled order.

The model is trained on the backend its parameters live on, which must record gradients
(`model.to(cn.Autodiff(cn.NumPy()))`).

On a GPU (cn.Wgpu under Autodiff, with or without Fusion) the step runs through cn.capture by
default (`capture="auto"`): after three ordinary steps per batch shape it replays the recorded
kernels in one submit, with no Python per kernel. The Learner says whether it does, and why not
(grad_clip reads the gradient norm on the host; a CaptureError falls back to plain steps).
capture=True insists (an error if the step cannot be captured), False never captures.

`devices=[b1, b2, ...]` trains data-parallel (core/train/data_parallel.py): each batch is split
over the devices, forward and backward run per device in threads, the gradients are averaged
weighted by shard size and the optimizer steps once; the same result as one device with the
same batch, up to float rounding. Such a step is not captured.
"""

import itertools
import math
import os
import signal
import threading
import time

from ..autodiff import no_grad
from ..capture import CaptureError, capture as _capture
from ..optim import clip_grad_norm
from .checkpoint import load_checkpoint, save_checkpoint
from .dashboard import dashboard_for
from .data_parallel import DataParallel
from .log import plot_curves, write_logs
from .metrics import Accuracy, Loss

CHECKPOINT = "checkpoint.safetensors"
BEST = "best.safetensors"


class EarlyStopping:
    """Stop when `monitor` (e.g. "valid_loss") has not improved by min_delta for `patience`
    epochs. restore_best loads the best epoch's weights back at the end (needs out_dir)."""

    def __init__(self, monitor="valid_loss", patience=3, min_delta=0.0, mode=None, restore_best=False):
        self.monitor, self.patience, self.min_delta = monitor, patience, min_delta
        self.mode = mode or ("max" if "acc" in monitor else "min")
        self.restore_best = restore_best
        self.best, self.bad_epochs = None, 0

    def improved(self, value):
        """Record an epoch's value; True when it is the best so far."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            self.bad_epochs += 1
            return False
        better = self.best is None or (
            value > self.best + self.min_delta if self.mode == "max" else value < self.best - self.min_delta)
        if better:
            self.best, self.bad_epochs = value, 0
        else:
            self.bad_epochs += 1
        return better

    @property
    def should_stop(self):
        return self.bad_epochs >= self.patience

    def state(self):
        return {"best": self.best, "bad_epochs": self.bad_epochs}

    def load_state(self, state):
        self.best, self.bad_epochs = state["best"], state["bad_epochs"]


class _StopRequest:
    """Turns SIGINT into a flag the loop checks between steps (main thread only)."""

    def __init__(self, on_first):
        self.requested = False
        self.on_first = on_first
        self.previous = None

    def _handler(self, signum, frame):
        if not self.requested:
            self.on_first()
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


class Learner:
    def __init__(self, model, optimizer, loss, metrics=None, out_dir=None, early_stopping=None,
                 grad_clip=None, dashboard="auto", title="training", capture="auto", devices=None):
        self.model = model
        self.optimizer = optimizer
        self.loss = loss
        self.metrics = list(metrics) if metrics is not None else [Accuracy(), Loss()]
        self.out_dir = out_dir
        self.early_stopping = early_stopping
        self.grad_clip = grad_clip
        self.dashboard_kind = dashboard
        self.title = title
        self.history = []
        if capture not in ("auto", True, False):
            raise ValueError("Learner: capture must be 'auto', True or False, got %r" % (capture,))
        self.capture = capture
        self._captured = None  # the cn.capture of the step, once decided
        self.parallel = DataParallel(model, devices) if devices is not None else None

    # -- the step ------------------------------------------------------------------------------

    def _step(self, inputs, targets):
        if self.parallel is not None:
            self.model, output, loss = self.parallel.step(self.model, self.optimizer, self.loss, inputs,
                                                          targets, self.grad_clip)
            return output, loss
        output = self.model(inputs)
        loss = self.loss(output, targets)
        grads = loss.backward()
        if self.grad_clip:
            grads, _ = clip_grad_norm(grads, self.grad_clip)
        self.model = self.optimizer.step(self.model, grads)
        return output, loss

    def _capture_decision(self, dash):
        """Whether the step runs captured, and the message that says so."""
        backend = next((p.backend for _, p in self.model.named_parameters()), None)
        base = backend
        while base is not None and base.inner is not None:
            base = base.inner
        if self.parallel is not None:
            why = "a data-parallel step runs on several devices, in threads"
        elif base is None or not base.capturable:
            why = "%r launches no GPU kernels" % (base,)
        elif self.grad_clip:
            why = "grad_clip reads the gradient norm on the host every step"
        else:
            dash.message("training step captured (cn.capture): from the third step of each batch "
                         "shape on, one GPU submit per step, no Python per kernel")
            return _capture(self._step)
        if self.capture is True:
            raise CaptureError("Learner(capture=True): the step cannot be captured: " + why)
        if base is not None and base.capturable:  # on CPU backends there is nothing to say
            dash.message("training step not captured: " + why)
        return None

    def _run_step(self, inputs, targets, dash):
        if self._captured is None and self.capture:
            self._captured = self._capture_decision(dash) or False
        if not self._captured:
            return self._step(inputs, targets)
        try:
            return self._captured(inputs, targets)
        except CaptureError as e:
            if self.capture is True:
                raise
            dash.message("training step no longer captured: %s" % (e,))
            self._captured = False
            # A mismatch found after the step ran has its results; anything else runs it again.
            return e.result if getattr(e, "result", None) is not None else self._step(inputs, targets)

    # -- one epoch -------------------------------------------------------------------------------

    def _metric_values(self, prefix=""):
        return {prefix + m.name: m.value() for m in self.metrics}

    def _train_epoch(self, loader, epoch, start_batch, stop, dash):
        n = len(loader)
        self.model.train()
        dash.start_epoch(epoch, n, start_batch)
        index = start_batch - 1
        if hasattr(loader, "batches"):  # a DataLoader: the epoch's own order, from start_batch
            batches = loader.batches(epoch, start_batch)
        else:  # any re-iterable of (inputs, targets)
            batches = itertools.islice(iter(loader), start_batch, None)
        for index, (inputs, targets) in enumerate(batches, start_batch):
            lr = self.optimizer.lr
            output, loss = self._run_step(inputs, targets, dash)
            loss_value = loss.item()
            for m in self.metrics:
                m.update(output, targets, loss_value)
            dash.batch(index, self._metric_values(), lr)
            if stop.requested:
                return index + 1
        return index + 1

    def evaluate(self, loader, dash=None):
        """{metric name: value} over a loader, without recording gradients."""
        for m in self.metrics:
            m.reset()
        self.model.eval()
        if dash is not None:
            dash.start_valid(len(loader))
        with no_grad():
            for index, (inputs, targets) in enumerate(loader):
                output = self.model(inputs)
                loss = self.loss(output, targets).item()
                for m in self.metrics:
                    m.update(output, targets, loss)
                if dash is not None:
                    dash.valid_batch(index)
        self.model.train()
        return self._metric_values()

    # -- checkpoints -----------------------------------------------------------------------------

    def _path(self, name):
        return os.path.join(self.out_dir, name) if self.out_dir else None

    def _checkpoint(self, epoch, batch, elapsed):
        if not self.out_dir:
            return
        progress = {"epoch": epoch, "batch": batch, "history": self.history, "elapsed": elapsed,
                    "metrics": [m.state() for m in self.metrics],
                    "early_stopping": self.early_stopping.state() if self.early_stopping else None}
        save_checkpoint(self._path(CHECKPOINT), self.model, self.optimizer, progress)

    def _resume(self):
        path = self._path(CHECKPOINT)
        if path is None:
            raise ValueError("Learner.fit(resume=True) needs out_dir, where the checkpoint lives")
        if not os.path.exists(path):
            return 0, 0, 0.0
        progress = load_checkpoint(path, self.model, self.optimizer)
        self.history = progress["history"]
        for m, state in zip(self.metrics, progress["metrics"]):
            m.load_state(state)
        if self.early_stopping and progress.get("early_stopping"):
            self.early_stopping.load_state(progress["early_stopping"])
        return progress["epoch"], progress["batch"], progress.get("elapsed", 0.0)

    # -- the loop --------------------------------------------------------------------------------

    def fit(self, train, valid=None, epochs=1, resume=False):
        """Train until `epochs` epochs are done (counting those of a resumed run); returns the
        history, one dict of metrics per epoch."""
        if self.out_dir:
            os.makedirs(self.out_dir, exist_ok=True)
        epoch, batch, elapsed = self._resume() if resume else (0, 0, 0.0)
        if batch == 0:
            for m in self.metrics:
                m.reset()
        dash = dashboard_for(self.dashboard_kind)
        stop = _StopRequest(lambda: dash.message(
            "stopping: finishing this step and writing the checkpoint (Ctrl-C again does not abort it)"))
        started = time.time() - elapsed
        dash.start(epochs, epoch, self.title)
        try:
            with stop:
                while epoch < epochs:
                    t0 = time.time()
                    batch = self._train_epoch(train, epoch, batch, stop, dash)
                    if stop.requested and batch < len(train):
                        break
                    row = {"epoch": epoch + 1}
                    row.update(self._metric_values("train_"))
                    if valid is not None:
                        if stop.requested:
                            break
                        row.update({"valid_" + k: v for k, v in self.evaluate(valid, dash).items()})
                    row["lr"] = self.optimizer.lr
                    row["seconds"] = round(time.time() - t0, 2)
                    self.history.append(row)
                    epoch, batch = epoch + 1, 0
                    for m in self.metrics:
                        m.reset()
                    stop_early = self._early_stopping(row, dash)
                    self._checkpoint(epoch, 0, time.time() - started)
                    if self.out_dir:
                        write_logs(self.out_dir, self.history)
                    dash.end_epoch(row)
                    if stop_early or stop.requested:
                        break
                if stop.requested:
                    if batch:
                        self._checkpoint(epoch, batch, time.time() - started)
                    if self.out_dir:
                        dash.message("checkpoint written to %s; continue with resume" % self._path(CHECKPOINT))
                    raise KeyboardInterrupt
        finally:
            dash.close()
        self._finish()
        return self.history

    def _early_stopping(self, row, dash):
        es = self.early_stopping
        if es is None:
            return False
        if es.monitor not in row:
            raise KeyError("EarlyStopping monitors %r but the epoch row has only %s"
                           % (es.monitor, ", ".join(row)))
        if es.improved(row[es.monitor]) and es.restore_best and self.out_dir:
            self.model.save(self._path(BEST))
        if es.should_stop:
            dash.message("early stopping: %s has not improved for %d epochs (best %s)"
                         % (es.monitor, es.patience, es.best))
            return True
        return False

    def _finish(self):
        es = self.early_stopping
        if es is not None and es.restore_best and self.out_dir and os.path.exists(self._path(BEST)):
            self.model.load(self._path(BEST))
        if self.out_dir and self.history:
            plot_curves(self._path("curves.png"), self.history)
