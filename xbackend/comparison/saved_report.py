"""JSON reports read back: the Result a report written by `compare --json` holds.

What `xbackend report` renders, and what baselines and `xbackend diff` compare. The
Result sits losslessly under "result" (xbackend.files.codec); probe results are rebuilt only as
the classes the probe registry defines.
"""

from __future__ import annotations

import os
from pathlib import Path

import xbackend.probes.registry  # noqa: F401  (registers every probe's result class with the codec)
from xbackend.errors import InputError
from xbackend.files.codec import CodecError, decode
from xbackend.files.untrusted import json_loads
from xbackend.results import Result

__all__ = ["SCHEMA", "from_json", "read_result"]

SCHEMA = "xbackend.report/2"


def from_json(text: str, what: str = "report") -> Result:
    """The Result a JSON report holds; InputError (one line) when it holds none this version reads."""
    try:
        data = json_loads(text)
    except ValueError as error:
        raise InputError(
            f"{what} is not JSON ({error}); pass a report written by `xbackend compare --json`"
        ) from error
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA or "result" not in data:
        raise InputError(
            f"{what} has schema {schema!r}, this xbackend reads {SCHEMA!r}; re-run the comparison with "
            "this version (`xbackend compare ... --json OUT.json`)"
        )
    try:
        return decode(Result, data["result"])  # type: ignore[no-any-return]
    except CodecError as error:
        raise InputError(f"{what} is damaged or was edited: {error}; re-run the comparison") from error


def read_result(path: str | os.PathLike[str], flag: str = "") -> Result:
    """The Result of a JSON report at `path` (`flag` names the option in errors); an InputError that says what
    to pass where it cannot be read."""
    p = Path(path)
    what = f"{flag} {p}".strip()
    try:
        text = p.read_text("utf-8")
    except FileNotFoundError as error:
        raise InputError(
            f"{what} not found; pass a JSON report written by `xbackend compare --json`"
        ) from error
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{what} cannot be read ({type(error).__name__}); pass a JSON report") from error
    return from_json(text, what)
