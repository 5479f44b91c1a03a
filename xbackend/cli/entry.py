"""The console entry point: signals are handled from the first instant.

Importing the CLI takes a while (typer, numpy, onnx). A Ctrl-C, SIGTERM or SIGHUP in that
time would give a traceback or exit without a word; here each ends the command with its one
line and exit code (nothing has run, so nothing is left to remove). Then xbackend.cli.main
installs the handlers that stop workers and remove the run's temp folder.
"""

from __future__ import annotations

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

        return cli_main()
    except _Early as e:  # while importing, or before the CLI's own handlers were in place
        signum = int(e.args[0])
        what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print(f"xbackend: {what} before anything ran", file=sys.stderr)
        return 128 + signum
