"""Markdown building blocks shared by the report and the probes' own sections."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

from xbackend.numerics.values import value_name

__all__ = [
    "CONTROL",
    "cell",
    "fold",
    "gib",
    "inert",
    "module_note",
    "num",
    "only_our_html",
    "short",
    "table",
    "with_module",
    "yes",
]


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
    """`tensor (module)` where the model records the tensor's source module, else `tensor`;
    both names inert (they come from the model)."""
    module = modules.get(value_name(tensor), "")
    return f"{inert(tensor)} ({inert(module)})" if module else inert(tensor)


# a line break or control character: in a name it would start a line of its own
CONTROL = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


def inert(text: object) -> str:
    """A name from a model, a capture or a label, as Markdown that shows it and builds nothing:
    no line break (a heading of its own), no link or image, no HTML tag (in a table, cell()
    keeps its pipes inside the cell)."""
    out = CONTROL.sub(" ", str(text))
    return out.replace("<", "&lt;").replace("[", "\\[").replace("]", "\\]")


def cell(text: object) -> str:
    """One table cell: a pipe or a line break would end it, raw HTML would render."""
    return CONTROL.sub(" ", str(text)).replace("|", "\\|").replace("<", "&lt;")


_OURS = re.compile(r"<(?!/?(?:details|summary)>)")
_TARGET = re.compile(r"\]\(([^)\n]*)(\)?)")
_LOCAL = re.compile(r"(?!/)(?!.*\.\.)[\w.@+/-]+")  # a file the report wrote beside itself


def only_our_html(markdown: str) -> str:
    """Whatever a name held, the only HTML in a report is the <details>/<summary> it writes
    itself, and its only links and images point at files beside it: every other `<` and `](`
    is made inert."""

    def link(m: re.Match[str]) -> str:
        target, closed = m.group(1), m.group(2)
        return m.group(0) if closed and _LOCAL.fullmatch(target) else "\\](" + target + closed

    return _TARGET.sub(link, _OURS.sub("&lt;", markdown))


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
