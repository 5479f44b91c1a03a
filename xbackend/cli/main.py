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
import os
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
from xbackend.files.owned import reset as reset_forced
from xbackend.files.textfmt import CONTROL, visible

__all__ = ["app", "main"]


_RECEIVED: list[int] = []  # the signal that stopped this command (typer turns it into exit 130)


def received(signum: int) -> None:
    """A signal that stops this command, noted for its exit code (128 + signum)."""
    _RECEIVED.append(signum)


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
        for s, value in old.items():
            signal.signal(s, value)


class _StreamError(OSError):
    """A write to standard output or error the system refused."""


class _Visible:
    """A terminal stream that writes every C1 or bidirectional control out (U+009B, a terminal's
    CSI; U+202E, a right-to-left override): a name from a file neither controls nor reorders
    what the user sees. Everything else is the stream's own."""

    def __init__(self, stream: TextIO, errors: bool = False) -> None:
        self._stream = stream
        self._errors = errors

    def write(self, text: str) -> int:
        try:
            self._stream.write(visible(text))
        except OSError as error:  # stdout at /dev/full, or a pipe closed early
            if self._errors:
                return len(text)  # stderr that takes nothing: the exit code still says it
            raise _StreamError(error.errno or 0, error.strerror or str(error)) from None
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _visible_streams() -> Iterator[None]:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Visible(out), _Visible(err, errors=True)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on `argv` (sys.argv when None) with names shown inert on the terminal; its exit code."""
    if sys.stdout is None or sys.stderr is None:  # started with a standard stream closed (`>&-`)
        if sys.stderr is not None:
            print("xbackend: error: standard output is closed; run it with stdout open", file=sys.stderr)
        return EXIT_USAGE
    with _visible_streams():
        code = _main(argv)
    return _flushed(code)


def _flushed(code: int) -> int:
    """stdout flushed here, where a full disk or a closed pipe (`> /dev/full`, `| head -0`) is
    one line and exit 2, not a message from the interpreter's last flush."""
    try:
        sys.stdout.flush()
    except OSError as error:
        _drop_stdout()
        print(
            f"xbackend: error: cannot write to standard output ({error.strerror or error})", file=sys.stderr
        )
        return EXIT_USAGE if code == 0 else code
    return code


def _drop_stdout() -> None:
    """What is left in stdout's buffer goes nowhere (the interpreter would flush it at exit)."""
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)


def _main(argv: Sequence[str] | None) -> int:
    reset_cancel()
    reset_forced()
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
    except XbackendError as error:
        print(f"xbackend: error: {_one_line(str(error))}", file=sys.stderr)
        return error.exit_code
    except typer.Exit as error:
        return _stopped() if _RECEIVED else int(error.exit_code)
    except typer.TyperException as error:  # typer's own usage errors: unknown option, missing argument
        msg = error.format_message() if hasattr(error, "format_message") else str(error)
        hint = _help_hint(argv)
        print(
            f"xbackend: error: {_one_line(' '.join(msg.split()).rstrip('.'))}; see `{hint}`", file=sys.stderr
        )
        return int(getattr(error, "exit_code", EXIT_USAGE))
    except OSError as error:  # the system refused a path or a stream: the user's to fix, not a bug
        print(f"xbackend: error: {_one_line(_os_error(error))}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # a bug in xbackend, not in the user's input
        said = _users_path(error)
        if said:
            print(f"xbackend: error: {_one_line(said)}", file=sys.stderr)
            return EXIT_USAGE
        print(
            f"xbackend: internal error: {type(error).__name__}: {_one_line(str(error))}; please report it",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _os_error(os_error: OSError) -> str:
    if isinstance(os_error, _StreamError):
        _drop_stdout()
        return f"cannot write to standard output ({os_error.strerror or os_error})"
    if os_error.filename is None:
        return (
            f"the system refused a read or write ({os_error.strerror or os_error}); check free disk space, "
            "`ulimit -f` and permissions"
        )
    name = os.fsdecode(os_error.filename) if isinstance(os_error.filename, bytes) else str(os_error.filename)
    shown = name if len(name) <= 120 else name[:60] + "..." + name[-40:]
    reason = os_error.strerror or os_error
    return f"{shown!a}: {reason}; check the path (its length, its links) and its permissions"


def _users_path(exception: Exception) -> str:
    """The sentence for a path the system cannot take that no earlier check named."""
    if isinstance(exception, RuntimeError) and str(exception).startswith(
        "Symlink loop"
    ):  # pathlib's resolve()
        return f"{exception}: a symbolic link leads back to itself; fix the link or give another path"
    if isinstance(exception, UnicodeEncodeError) and "surrogates not allowed" in str(exception):
        return "a file name given is not valid UTF-8; rename the file (or link it under a UTF-8 name)"
    return ""


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
    first = next((arg for arg in args if not arg.startswith("-")), None)
    if first in cmds:
        sub = " torch" if first == "export" and "torch" in args else ""
        return f"xbackend {first}{sub} --help"
    return "xbackend --help"
