"""Compare a model across backends: the orchestration layer (see xbackend.compare.run).

Its names load on first use (xbackend.facade): the judge's explanation jobs read compare's plan
and memory modules, and must not pull in compare.run, which calls them, while it loads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xbackend.facade import lazy_names

if TYPE_CHECKING:
    from xbackend.compare.plan import make_feeds
    from xbackend.compare.run import ORACLE, compare, compare_with_options

__all__ = ["ORACLE", "compare", "compare_with_options", "make_feeds"]

_WHERE = {
    "make_feeds": "xbackend.compare.plan",
    **dict.fromkeys(("ORACLE", "compare", "compare_with_options"), "xbackend.compare.run"),
}

__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
