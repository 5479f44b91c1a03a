"""Every exception xbackend raises, named by the stage that raised it.

Each carries the process exit code the CLI uses for it; messages are one line
that says what was expected, what was found and what to do next.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ExportError",
    "InputError",
    "ModelLoadError",
    "NotInResultError",
    "ReportError",
    "RunnerFailedError",
    "UsageError",
    "XbackendError",
    "first_line",
]

EXIT_OK = 0
EXIT_DIFFERENCES = 1
EXIT_USAGE = 2
EXIT_ALL_FAILED = 3
EXIT_INTERNAL = 4


class XbackendError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code: int = EXIT_USAGE


class UsageError(XbackendError):
    """A bad option or combination of options."""


class ModelLoadError(XbackendError):
    """The model file is missing, corrupt, unsupported or cannot be prepared."""


class InputError(XbackendError):
    """Input feeds are missing, malformed or do not match the model."""


class BackendUnavailableError(XbackendError):
    """A requested backend is unknown or cannot run on this machine."""


class RunnerFailedError(XbackendError):
    """A backend crashed, hung or rejected the model while preparing or running."""

    exit_code = EXIT_ALL_FAILED


class ExportError(XbackendError):
    """Exporting a framework model to ONNX failed."""


class ReportError(XbackendError):
    """A report could not be written."""


class NotInResultError(XbackendError, KeyError):
    """A name asked of a Result that it does not hold (a backend, a comparison, a probe); the
    message names those it holds. A KeyError too, as these lookups raised before."""

    def __str__(self) -> str:  # KeyError's own quotes its message
        return str(self.args[0]) if self.args else ""


def first_line(base_exception: BaseException) -> str:
    """An exception's message cut to its first line (300 characters at most), for one-line errors."""
    text = str(base_exception).strip() or type(base_exception).__name__
    return text.splitlines()[0][:300]
