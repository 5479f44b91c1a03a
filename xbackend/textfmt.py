"""Markdown building blocks shared by the report and the probes' own sections."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from xbackend.values import value_name

__all__ = ["cell", "fold", "gib", "module_note", "num", "short", "table", "with_module", "yes"]


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


def short(x: float | None) -> str:
    """Three significant digits for prose; 'n/a' when there is no figure."""
    return "n/a" if x is None else f"{x:.3g}"


def with_module(tensor: str, modules: Mapping[str, str]) -> str:
    """`tensor (module)` where the model records the tensor's source module, else `tensor`."""
    module = modules.get(value_name(tensor), "")
    return f"{tensor} ({module})" if module else tensor


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def gib(n: int) -> str:
    """Bytes as GiB (MiB below one GiB), three significant digits."""
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def yes(b: bool | None) -> str:
    return "–" if b is None else ("yes" if b else "**no**")


def module_note(tensor: str | None, modules: Mapping[str, str]) -> str:
    """'tensor (module)', or a dash when there is no tensor."""
    return with_module(tensor, modules) if tensor else "–"


def fold(title: str, summary: str, body: list[str]) -> list[str]:
    """A section whose body is folded: the heading stays visible for navigation."""
    return [f"## {title}", "", f"<details><summary>{summary}</summary>", "", *body, "</details>", ""]
