"""Markdown building blocks shared by the report and the probes' own sections."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["cell", "num", "table", "yes"]


def num(x: float | int | None) -> str:
    if x is None:
        return "–"
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    if math.isinf(x) or math.isnan(x):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.3g}"


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def yes(b: bool | None) -> str:
    return "–" if b is None else ("yes" if b else "**no**")
