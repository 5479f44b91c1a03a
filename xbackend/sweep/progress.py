"""Progress over a whole sweep: jobs done, failed, and running on each node (stderr only)."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from xbackend.sweep.outcomes import FleetProgress

__all__ = ["Counts", "LineProgress", "RichFleetProgress"]


class Counts:
    """The sweep's tally: jobs in all, done (resumed ones included), failed, running per node."""

    def __init__(self) -> None:
        self.total = 0
        self.done = 0
        self.failed = 0
        self.resumed = 0
        self.running: dict[str, str] = {}  # job -> node

    def start(self, total: int, resumed: int) -> None:
        """`total` jobs, `resumed` of them already done."""
        self.total, self.resumed, self.done = total, resumed, resumed

    def started(self, job: str, node: str) -> None:
        """`job` is running on `node`."""
        self.running[job] = node

    def finished(self, job: str, status: str) -> None:
        """`job` is done; a failure where `status` is not `ok`."""
        self.running.pop(job, None)
        self.done += 1
        self.failed += status != "ok"

    def text(self) -> str:
        """The tally in words: failures, resumed jobs, and how many run on each node."""
        per_node = Counter(self.running.values())
        running = ", ".join(f"{key}: {value}" for key, value in sorted(per_node.items())) or "none"
        resumed = f", {self.resumed} resumed" if self.resumed else ""
        return f"{self.failed} failed{resumed}; running on {running}"


class RichFleetProgress(FleetProgress):
    """A bar over the sweep's jobs, with failures and the jobs running on each node."""

    def __init__(self) -> None:
        self._c = Counts()
        self._progress = Progress(
            TextColumn("jobs"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._progress.add_task("", total=None)

    def _draw(self) -> None:
        self._progress.update(self._task, completed=self._c.done, description=self._c.text())

    def start(self, total: int, resumed: int) -> None:
        self._c.start(total, resumed)
        self._progress.update(self._task, total=total)
        self._draw()
        self._progress.start()

    def started(self, job: str, node: str) -> None:
        self._c.started(job, node)
        self._draw()

    def finished(self, job: str, node: str, status: str) -> None:
        self._c.finished(job, status)
        self._draw()

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)

    def stop(self) -> None:
        self._progress.stop()


class LineProgress(FleetProgress):
    """A line per finished job, for logs (stderr is not a terminal)."""

    def __init__(self, stream: Any = None) -> None:
        self._c = Counts()
        self._out = stream or sys.stderr

    def start(self, total: int, resumed: int) -> None:
        self._c.start(total, resumed)
        if resumed:
            print(f"xbackend: sweep: {resumed} of {total} jobs already done, resuming", file=self._out)

    def started(self, job: str, node: str) -> None:
        self._c.started(job, node)

    def finished(self, job: str, node: str, status: str) -> None:
        self._c.finished(job, status)
        print(
            f"xbackend: [{self._c.done}/{self._c.total}] {job}: {status} on {node}",
            file=self._out,
            flush=True,
        )

    def describe(self, text: str) -> None:
        pass

    def stop(self) -> None:
        pass
