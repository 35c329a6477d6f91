"""What a person watching training sees.

RichDashboard (a terminal): a live table of finished epochs and progress bars with ETA for the
epochs, the current epoch's batches and validation. PlainDashboard (a log file, CI, a pipe):
one line per finished epoch, and inside an epoch a progress line at most every
`progress_seconds` (30 s), so a log stays readable however small the epochs.
`dashboard_for("auto")` picks by isatty().
"""

import sys
import time


def _fmt(value):
    if isinstance(value, float):
        return "%.4g" % value
    return str(value)


def _fmt_metrics(metrics):
    return "  ".join("%s %s" % (k, _fmt(v)) for k, v in metrics.items())


def _duration(seconds):
    seconds = int(seconds)
    return "%d:%02d" % (seconds // 60, seconds % 60) if seconds < 3600 else \
        "%d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)


class PlainDashboard:
    def __init__(self, stream=None, progress_seconds=30.0):
        self.stream = stream or sys.stdout
        self.progress_seconds = progress_seconds

    def _print(self, text):
        print(text, file=self.stream, flush=True)

    def start(self, epochs, start_epoch, title):
        self.epochs = epochs
        self._print("%s: epochs %d..%d" % (title, start_epoch + 1, epochs))

    def start_epoch(self, epoch, batches, start_batch):
        self.epoch, self.batches = epoch, batches
        self.t0, self.first = time.time(), start_batch
        self.last_line = self.t0

    def batch(self, index, metrics, lr):
        done = index + 1
        now = time.time()
        if now - self.last_line < self.progress_seconds:
            return  # one line per progress_seconds: the epoch's own line says the rest
        self.last_line = now
        rate = (time.time() - self.t0) / max(1, done - self.first)
        self._print("epoch %d/%d  batch %d/%d  %s  lr %.2e  eta %s" % (
            self.epoch + 1, self.epochs, done, self.batches, _fmt_metrics(metrics), lr,
            _duration(rate * (self.batches - done))))

    def start_valid(self, batches):
        pass

    def valid_batch(self, index):
        pass

    def end_epoch(self, row):
        shown = {k: v for k, v in row.items() if k not in ("epoch",)}
        self._print("epoch %d/%d done  %s" % (row["epoch"], self.epochs, _fmt_metrics(shown)))

    def message(self, text):
        self._print(text)

    def close(self):
        pass


class RichDashboard:
    def __init__(self, console=None):
        from rich.console import Console
        self.console = console or Console()
        self.rows = []

    def start(self, epochs, start_epoch, title):
        from rich.live import Live
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        self.title, self.epochs = title, epochs
        self.progress = Progress(
            TextColumn("[bold]{task.description:<8}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
            console=self.console)
        self.epoch_task = self.progress.add_task("epochs", total=epochs, completed=start_epoch, info="")
        self.train_task = self.progress.add_task("train", total=1, info="")
        self.valid_task = self.progress.add_task("valid", total=1, info="", visible=False)
        self.live = Live(self._render(), console=self.console, refresh_per_second=4)
        self.live.start()

    def _render(self):
        from rich.console import Group
        from rich.table import Table
        table = Table(title=self.title, title_justify="left", expand=False)
        cols = []
        for row in self.rows:
            cols.extend(k for k in row if k not in cols)
        for c in cols:
            table.add_column(c, justify="right")
        for row in self.rows[-12:]:
            table.add_row(*[_fmt(row.get(c, "")) for c in cols])
        return Group(table, self.progress) if self.rows else Group(self.progress)

    def start_epoch(self, epoch, batches, start_batch):
        self.progress.reset(self.train_task, total=batches, completed=start_batch,
                            description="epoch %d" % (epoch + 1), info="")
        self.progress.update(self.valid_task, visible=False)

    def batch(self, index, metrics, lr):
        self.progress.update(self.train_task, completed=index + 1,
                             info="%s  lr %.2e" % (_fmt_metrics(metrics), lr))

    def start_valid(self, batches):
        self.progress.reset(self.valid_task, total=batches, completed=0, visible=True, info="")

    def valid_batch(self, index):
        self.progress.update(self.valid_task, completed=index + 1)

    def end_epoch(self, row):
        self.rows.append(row)
        self.progress.update(self.epoch_task, completed=row["epoch"])
        self.live.update(self._render())

    def message(self, text):
        self.console.print(text)

    def close(self):
        self.live.update(self._render())
        self.live.stop()


def dashboard_for(kind="auto"):
    """"auto": rich on a terminal, plain lines otherwise; "rich" | "plain" | None (silent)."""
    if kind is None or kind is False:
        return SilentDashboard()
    if kind == "auto":
        kind = "rich" if sys.stdout.isatty() else "plain"
    if kind == "rich":
        try:
            return RichDashboard()
        except ImportError:
            return PlainDashboard()
    if kind == "plain":
        return PlainDashboard()
    if hasattr(kind, "end_epoch"):
        return kind
    raise ValueError("dashboard must be 'auto', 'rich', 'plain', None or a dashboard object, got %r" % (kind,))


class SilentDashboard(PlainDashboard):
    def _print(self, text):
        pass
