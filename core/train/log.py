"""What a training run leaves behind: metrics.csv, metrics.json and curves.png."""

import csv
import json
import math
import os
import sys


def _columns(history):
    cols = []
    for row in history:
        for k in row:
            if k not in cols:
                cols.append(k)
    return cols


def write_logs(out_dir, history):
    """metrics.csv and metrics.json: one row per finished epoch."""
    cols = _columns(history)
    tmp = os.path.join(out_dir, "metrics.csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cols)
        writer.writeheader()
        for row in history:
            writer.writerow(row)
    os.replace(tmp, os.path.join(out_dir, "metrics.csv"))
    tmp = os.path.join(out_dir, "metrics.json.tmp")
    with open(tmp, "w") as f:
        json.dump(history, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, "metrics.json"))


def plot_curves(path, history):
    """A PNG with one panel per metric (loss, accuracy, ...), train and valid curves; skipped,
    with a note, without matplotlib (the `train` extra): metrics.csv holds the same numbers."""
    try:
        import matplotlib
    except ImportError:
        print("cinders: %s not drawn (needs matplotlib: pip install 'cinders[train]')" % path,
              file=sys.stderr, flush=True)
        return
    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt
    names = []
    for col in _columns(history):
        for split in ("train_", "valid_"):
            if col.startswith(split) and col[len(split):] not in names:
                names.append(col[len(split):])
    epochs = [row["epoch"] for row in history]
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(5 * max(1, len(names)), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        for split in ("train", "valid"):
            values = [row.get(split + "_" + name) for row in history]
            if any(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in values):
                ax.plot(epochs, [float("nan") if v is None else v for v in values], marker="o", label=split)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
