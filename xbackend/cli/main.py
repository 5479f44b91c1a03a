"""The entry point: every command registered, errors turned into one line and an exit code.

Exit codes: 0 ran and nothing failed; 1 a backend was nondeterministic, a
cross-backend difference exceeded --max-ulp, a judgment could not be made, or a backend failed or was
unavailable while others ran (`diff`: the two reports differ); 2 usage or input
error; 3 every backend failed; 4 internal error; 10-15, 17-19 the --fail-on policy
that fired (xbackend.results.gating); 16 a runner broke a promise; 130 interrupted (Ctrl-C), 143
stopped by SIGTERM, 129 by SIGHUP: the workers are stopped and the temp folders removed.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import typer

import xbackend.cli.fleet
import xbackend.cli.release
import xbackend.cli.run
import xbackend.cli.tools  # noqa: F401  (these four register their commands with the app)
from xbackend.cli.app import app
from xbackend.errors import EXIT_INTERNAL, EXIT_USAGE, XbackendError
from xbackend.execution.isolation import cancel_all, reset_cancel
from xbackend.files.textfmt import CONTROL, visible

__all__ = ["app", "main"]


_RECEIVED: list[int] = []  # the signal that stopped this command (typer turns it into exit 130)


def _on_signal(signum: int, _frame: object) -> None:
    cancel_all()  # the workers first: lane threads waiting on them return, temp folders go
    _RECEIVED.append(signum)
    raise KeyboardInterrupt  # SIGTERM and SIGHUP (a cancelled CI job, a closed terminal) unwind like Ctrl-C


@contextlib.contextmanager
def _handlers() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the workers and unwind, so every temp folder is removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, _on_signal) for s in wanted}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class _Visible:
    """A terminal stream that writes every C1 or bidirectional control out (U+009B, a terminal's
    CSI; U+202E, a right-to-left override): a name from a file neither controls nor reorders
    what the user sees. Everything else is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(visible(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _visible_streams() -> Iterator[None]:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Visible(out), _Visible(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def main(argv: Sequence[str] | None = None) -> int:
    with _visible_streams():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    reset_cancel()
    _RECEIVED.clear()
    try:
        with _handlers():
            code = app(
                args=_routed(sys.argv[1:] if argv is None else argv),
                prog_name="xbackend",
                standalone_mode=False,
            )
        return _stopped() if _RECEIVED else int(code or 0)
    except (KeyboardInterrupt, typer.Abort):
        return _stopped()
    except XbackendError as e:
        print(f"xbackend: error: {_one_line(str(e))}", file=sys.stderr)
        return e.exit_code
    except typer.Exit as e:
        return _stopped() if _RECEIVED else int(e.exit_code)
    except typer.TyperException as e:  # typer's own usage errors: unknown option, missing argument
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        hint = _help_hint(argv)
        print(
            f"xbackend: error: {_one_line(' '.join(msg.split()).rstrip('.'))}; see `{hint}`", file=sys.stderr
        )
        return int(getattr(e, "exit_code", EXIT_USAGE))
    except Exception as e:  # a bug in xbackend, not in the user's input
        print(
            f"xbackend: internal error: {type(e).__name__}: {_one_line(str(e))}; please report it",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _one_line(text: str) -> str:
    """An error is one line whatever it quotes: a control character a user or a file put in
    it is shown escaped."""
    return CONTROL.sub(lambda m: repr(m.group(0))[1:-1], text.strip())


def _stopped() -> int:
    """The exit of a command a signal stopped: 128 + its number (130 for Ctrl-C)."""
    signum = _RECEIVED[0] if _RECEIVED else signal.SIGINT
    if signum == signal.SIGINT:
        print("xbackend: interrupted; the run's temp files were removed", file=sys.stderr)
    else:
        name = signal.Signals(signum).name
        print(f"xbackend: stopped by {name}; the run's temp files were removed", file=sys.stderr)
    return 128 + int(signum)


def _routed(argv: Sequence[str]) -> list[str]:
    """`capture export DIR ...` is the capture-export command (capture's first argument is a
    model path: a model file named export is ./export)."""
    args = list(argv)
    if args[:2] == ["capture", "export"]:
        return ["capture-export", *args[2:]]
    return args


def _help_hint(argv: Sequence[str] | None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    cmds = {"compare", "capture", "certify", "verify", "report", "diff", "backends", "export", "sweep"}
    cmds.add("keygen")
    first = next((a for a in args if not a.startswith("-")), None)
    if first in cmds:
        sub = " torch" if first == "export" and "torch" in args else ""
        return f"xbackend {first}{sub} --help"
    return "xbackend --help"
