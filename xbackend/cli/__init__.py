"""Command line (typer): parse, call the library, print. No logic lives here.

app (the typer application) -> params (options declared once) -> one module per group of
commands (run: compare, capture; release: certify, verify, report, diff; fleet: sweep; tools:
backends, export) -> main (the entry point and its exit codes) -> entry (the console script:
signals handled while the rest imports, so this package's names load on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xbackend.facade import lazy_names

if TYPE_CHECKING:
    from xbackend.cli.main import app, main

__all__ = ["app", "main"]

__getattr__, __dir__ = lazy_names(__name__, dict.fromkeys(__all__, "xbackend.cli.main"), globals())
