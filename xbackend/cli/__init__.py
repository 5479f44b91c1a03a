"""Command line (typer): parse, call the library, print. No logic lives here.

app (the typer application) -> params (options declared once) -> one module per group of
commands (run: compare, capture; release: certify, verify, report, diff; fleet: sweep; tools:
backends, export) -> main (the entry point and its exit codes).
"""

from __future__ import annotations

from xbackend.cli.main import app, main

__all__ = ["app", "main"]
