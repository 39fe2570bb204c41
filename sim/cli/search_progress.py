"""The line a search command shows while it runs (not a command itself): a spinner, the point being
probed (``sim.planning.progress``), a bar over the current run's requests, the runs so far and
the time elapsed. It is transient: the answer's table replaces it."""

from __future__ import annotations

from sim.planning.progress import Reporter


class SearchProgress(Reporter):
    """A rich progress line for ``plan``, ``plan --disaggregated`` and ``capacity``."""

    def __init__(self, console, title: str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.table import Column

        self.title = title
        self.runs = 0
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", table_column=Column(overflow="ellipsis", no_wrap=True, ratio=2)),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=10)),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TextColumn("· run {task.fields[runs]}", table_column=Column(no_wrap=True)),
            TimeElapsedColumn(table_column=Column(no_wrap=True)),
            console=console, transient=True)
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        self.task = self.progress.add_task(self.title, total=None, runs=0)
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def probe(self, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=text, completed=0, total=None)

    def run_bar(self, total: int):
        if self.task is None:
            return None
        self.runs += 1
        self.progress.update(self.task, completed=0, total=total, runs=self.runs)
        return _RunBar(self.progress, self.task)


class _RunBar:
    """What ``sim.runner.run`` ticks: requests ended in the current run."""

    def __init__(self, progress, task) -> None:
        self.progress, self.task, self.pending = progress, task, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.flush()
        return False

    def ticker(self, label: str):
        def tick(n: int) -> None:
            self.pending += n
            if self.pending >= 64:
                self.flush()

        return tick

    def flush(self) -> None:
        if self.pending:
            self.progress.advance(self.task, self.pending)
            self.pending = 0
