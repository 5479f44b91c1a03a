"""Running the CLI in-process from tests, and the one-line error every failure must give."""

from __future__ import annotations

import re

import pytest

from xbackend.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, pattern: str) -> None:
    """One line on stderr, holding `pattern` as text or, failing that, as a regular expression."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("xbackend: error: ")
    assert pattern in lines[0] or re.search(pattern, lines[0]), lines[0]
