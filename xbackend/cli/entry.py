"""The console entry point: signals are handled from the first instant.

Importing the CLI takes a while (typer, numpy, onnx). A Ctrl-C, SIGTERM or SIGHUP in that
time would give a traceback or exit without a word; here each ends the command with its one
line and exit code (nothing has run, so nothing is left to remove). Then xbackend.cli.main
installs the handlers that stop workers and remove the run's temp folder.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys

__all__ = ["main"]


class _Early(BaseException):
    """A signal before the CLI was imported."""


def _early(signum: int, _frame: object) -> None:
    raise _Early(signum)


def main() -> int:
    wanted = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    for s in wanted:
        signal.signal(s, _early)
    try:
        from xbackend.cli.main import main as cli_main  # heavy: the CLI, imported under the early handlers

        code = cli_main()
    except _Early as e:  # while importing, or before the CLI's own handlers were in place
        signum = int(e.args[0])
        what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print(f"xbackend: {what} before anything ran", file=sys.stderr)
        return 128 + signum
    return _finish(code, wanted)


def _finish(code: int, wanted: list[signal.Signals]) -> int:
    """The command has ended: its exit functions (temp folders) run now, under handlers that note
    a signal rather than die of it, and the process exits at once with its code; a signal in
    these last moments is one line and 128 + its number, never a death with no word."""
    late: list[int] = []
    for s in wanted:
        signal.signal(s, lambda signum, _frame: late.append(signum))
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if late:
        name = signal.Signals(late[0]).name
        with contextlib.suppress(Exception):
            print(
                f"xbackend: {name} as the command ended; what it wrote is whole", file=sys.stderr, flush=True
            )
        code = 128 + late[0]
    os._exit(code)
