"""xbackend's version: recorded in captures, sweeps and reports."""

from __future__ import annotations

__all__ = ["VERSION"]

VERSION = "0.1.0"
