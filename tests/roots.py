"""The folders tests read from, wherever under tests/ a test file lives."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
