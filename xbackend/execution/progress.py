"""Progress over the whole plan of builds and runs, on stderr: a rich bar on a terminal, a
line per finished build elsewhere (a CI log, a pipe)."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["QUIET_S", "LineProgress", "NullProgress", "ProgressSink", "RichProgress"]

QUIET_S = 15.0  # a log line at most this often while one job works through its stages


class ProgressSink(Protocol):
    """Where a comparison reports its progress: steps of the whole plan (a build, a run, a probe's
    job), what is being done now, and each finished piece."""

    def start(self, total: int) -> None:
        """The plan is `total` steps; drawing starts."""
        ...

    def grow(self, steps: int) -> None:
        """The plan has `steps` more than it said (a probe or the judge added jobs)."""
        ...

    def describe(self, text: str) -> None:
        """`text` is what is being done now (a backend's build, a probe's runs)."""
        ...

    def detail(self, text: str) -> None:
        """`text` is the stage inside it (loading, a run's number); shown at most every QUIET_S in a log."""
        ...

    def done(self, text: str) -> None:
        """A piece of the plan finished; `text` says which and how it went."""
        ...

    def advance(self, steps: int = 1) -> None:
        """`steps` of the plan are done."""
        ...

    def stop(self) -> None:
        """The comparison is over: the bar is taken down (the log says nothing more)."""
        ...


class NullProgress(ProgressSink):
    """Draws nothing (the Python API's default)."""

    def start(self, total: int) -> None:
        pass

    def grow(self, steps: int) -> None:
        pass

    def describe(self, text: str) -> None:
        pass

    def detail(self, text: str) -> None:
        pass

    def done(self, text: str) -> None:
        pass

    def advance(self, steps: int = 1) -> None:
        pass

    def stop(self) -> None:
        pass


class RichProgress(ProgressSink):
    """A rich progress bar with elapsed and remaining time, on stderr only."""

    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._progress.add_task("starting", total=None)
        self._total = self._done = 0

    def start(self, total: int) -> None:
        self._total = total
        self._progress.update(self._task, total=total)
        self._progress.start()

    def grow(self, steps: int) -> None:
        """Work planned late (follow-up probe jobs) joins the total."""
        self._total += steps
        self._progress.update(self._task, total=self._total)

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)

    def detail(self, text: str) -> None:
        """What the job described last does now (loading, building, a run, a window)."""
        self._progress.update(self._task, description=text)

    def done(self, text: str) -> None:
        pass

    def advance(self, steps: int = 1) -> None:
        self._done += steps
        if self._done > self._total:  # work the plan did not count (a retry): the total says so
            self.grow(self._done - self._total)
        self._progress.advance(self._task, steps)

    def stop(self) -> None:
        self._progress.stop()

    def __enter__(self) -> RichProgress:
        return self

    def __exit__(
        self, t: type[BaseException] | None, base_exception: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class LineProgress(ProgressSink):
    """A line on stderr per finished build (each worker job): what a log keeps of a bar. Jobs may
    run side by side: each is timed from its own start."""

    def __init__(self) -> None:
        self._total = self._done = 0
        self._started: dict[str, float] = {}
        self._said = 0.0

    def start(self, total: int) -> None:
        self._total = total

    def grow(self, steps: int) -> None:
        self._total += steps

    def describe(self, text: str) -> None:
        self._started[text] = self._said = time.monotonic()

    def detail(self, text: str) -> None:
        """A stage of a long job, once it has gone QUIET_S without a line: a log never sits
        silent for long, and short jobs stay one line each."""
        now = time.monotonic()
        if now - self._said >= QUIET_S:
            since = next((value for job, value in self._started.items() if text.startswith(job)), now)
            print(
                f"xbackend: [{self._done}/{self._total}] {text} ({now - since:.0f} s in)",
                file=sys.stderr,
                flush=True,
            )
            self._said = now

    def done(self, text: str) -> None:
        took = time.monotonic() - self._started.pop(text, time.monotonic())
        print(
            f"xbackend: [{self._done}/{self._total}] {text}: done in {took:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    def advance(self, steps: int = 1) -> None:
        self._done += steps
        self._total = max(self._total, self._done)  # never [86/80]: work the plan did not count

    def stop(self) -> None:
        pass
