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


_PHASE = ["import"]  # import, run (the CLI is running), done (it returned its code)
_LATE: list[int] = []  # signals that arrived once the command was done


def _early(signum: int, _frame: object) -> None:
    if _PHASE[0] == "done":
        _LATE.append(signum)  # noted: the command's code becomes 128 + signum, with its line
    elif _PHASE[0] == "run":  # the CLI's own handlers are not (or no longer) in place
        from xbackend.cli.main import received  # heavy: the CLI, imported already by now

        received(signum)
        raise KeyboardInterrupt
    else:
        raise _Early(signum)


def main() -> int:
    """The `xbackend` command: signals handled before the CLI is imported (an early Ctrl-C is one line); its
    exit code."""
    wanted = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    for s in wanted:
        signal.signal(s, _early)
    if hasattr(signal, "SIGXFSZ"):  # past `ulimit -f` a write fails (EFBIG, one line), never kills
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        from xbackend.cli.main import main as cli_main  # heavy: the CLI, imported under the early handlers

        _PHASE[0] = "run"
        code = cli_main()
        _PHASE[0] = "done"
    except _Early as error:  # while importing, or before the CLI's own handlers were in place
        signum = int(error.args[0])
        what = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print(f"xbackend: {what} before anything ran", file=sys.stderr)
        return 128 + signum
    except KeyboardInterrupt:  # between the CLI's start and its own handlers
        print("xbackend: interrupted; the run's temp files were removed", file=sys.stderr)
        return 130
    return _finish(code, wanted)


def _finish(code: int, wanted: list[signal.Signals]) -> int:
    """The command has ended: its exit functions (temp folders) run now, under handlers that note
    a signal rather than die of it; a signal in these last moments is one line and 128 + its
    number, never a death with no word (the handlers stay for the interpreter's last steps)."""
    _PHASE[0] = "done"
    late = _LATE
    for signals in wanted:
        signal.signal(signals, _early)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if late:
        name = signal.Signals(late[0]).name
        with contextlib.suppress(Exception):
            line = f"xbackend: {name} as the command ended; what it wrote is whole"
            print(line, file=sys.stderr, flush=True)
        os._exit(128 + late[0])
    # everything is written and flushed, the exit functions ran: the interpreter's teardown of
    # numpy, onnx and the engines' modules (0.1 to 0.3 s) would only free memory the OS frees
    os._exit(code)
