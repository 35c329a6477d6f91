"""Metrics: running sums over the batches of an epoch.

A metric has a `name`, `reset()`, `update(output, target, loss)` (output: the model's output
tensor, target: the batch's targets, loss: the batch's mean loss as a float), `value()` and
`state()/load_state(state)` (JSON values, so a checkpoint taken mid-epoch resumes the sums).
"""


class Metric:
    name = "metric"
    better = "max"  # or "min": which way is an improvement (early stopping)

    def __init__(self):
        self.reset()

    def reset(self):
        self.total = 0.0
        self.count = 0

    def value(self):
        return self.total / self.count if self.count else float("nan")

    def state(self):
        return {"total": self.total, "count": self.count}

    def load_state(self, state):
        self.total = float(state["total"])
        self.count = int(state["count"])


class Accuracy(Metric):
    """Share of rows whose highest output is the target class."""

    name = "accuracy"
    better = "max"

    def update(self, output, target, loss):
        hits = (output.argmax(axis=-1) == target).sum().item()
        self.total += hits
        self.count += target.shape[0]


class Loss(Metric):
    """The loss averaged over examples (batches weighted by their size)."""

    name = "loss"
    better = "min"

    def update(self, output, target, loss):
        n = target.shape[0]
        self.total += loss * n
        self.count += n
