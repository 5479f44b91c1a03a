"""Compare a model across backends: the orchestration layer (see xbackend.compare.run)."""

from __future__ import annotations

from xbackend.compare.plan import make_feeds
from xbackend.compare.run import ORACLE, compare, compare_with_options

__all__ = ["ORACLE", "compare", "compare_with_options", "make_feeds"]
