"""The report's own Markdown: tables, bold, folded sections, code blocks, and a probe's section
rendered from its data (xbackend.results.sections). Names inside are made inert by
xbackend.files.textfmt."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from xbackend.files.textfmt import CONTROL, cell_text, inert, prose, visible, with_module
from xbackend.results.sections import Bullets, Paragraph, Said, Section, Strong, Table, TensorName

__all__ = [
    "Ours",
    "cell",
    "fenced",
    "fold",
    "only_our_html",
    "render_section",
    "strong",
    "table",
    "yes",
]


def fenced(text: str, info: str = "", lines: bool = False) -> list[str]:
    """`text` as a fenced code block that nothing inside can close or escape: each control written
    out, the fence longer than any run of backticks in it. Its line breaks are written out too,
    unless `lines` (code of the report's own, to be copied and run as printed: its lines kept)."""
    parts = text.split("\n") if lines else [text]
    body = [visible(CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", part)) for part in parts]
    longest = max((len(run) for block in body for run in re.findall("`+", block)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", *body, fence]


class Ours(str):
    """Markdown the report writes itself into a table cell (a link to its own file, its bold,
    built from inert names): cell() leaves it as it is, but for pipes."""


def strong(head: str, rest: object = "") -> Ours:
    """A cell that opens with the report's own bold: `head` (a status, a name) in bold, then
    `rest` (a reason quoting names), each made inert."""
    return Ours(f"**{inert(head)}**{prose(rest)}" if rest != "" else f"**{inert(head)}**")


def cell(text: object) -> str:
    """One table cell: a pipe or a line break would end it, raw HTML would render, a URL, an
    e-mail address or [text](target) would become a link, an asterisk emphasis. A code span
    stays whole. The report's own markup in a cell (its bold) comes as Ours, built from inert
    names: only its pipes are escaped."""
    if isinstance(text, Ours):
        return str(text).replace("|", "\\|")
    return cell_text(text)


_OURS = re.compile(r"<(?!/?(?:details|summary)>)")
_TARGET = re.compile(r"\]\(([^)\n]*)(\)?)")
_LOCAL = re.compile(r"(?!/)(?!.*\.\.)[\w.@+/-]+|#[a-z-]+")  # a file the report wrote beside itself


def only_our_html(markdown: str) -> str:
    """Whatever a name held, the only HTML in a report is the <details>/<summary> it writes
    itself, and its only links and images point at files beside it: every other `<` and `](`
    is made inert."""

    def link(m: re.Match[str]) -> str:
        target, closed = m.group(1), m.group(2)
        before = m.string[: m.start()]
        escaped = (len(before) - len(before.rstrip("\\"))) % 2 == 1  # an odd run of backslashes
        if escaped or (closed and _LOCAL.fullmatch(target)):
            return m.group(0)
        return "\\](" + target + closed

    return _TARGET.sub(link, _OURS.sub("&lt;", markdown))


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A Markdown table: the header, its rule, each row's cells made inert, a blank line after."""
    out = [
        "| " + " | ".join(cell(heading) for heading in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def yes(flag: bool | None) -> str:
    """A yes/no cell: yes, a bold no, or a dash where nothing was measured."""
    return "–" if flag is None else ("yes" if flag else strong("no"))


def fold(title: str, summary: str, body: list[str]) -> list[str]:
    """A section whose body is folded: the heading stays visible for navigation."""
    return [f"## {title}", "", f"<details><summary>{summary}</summary>", "", *body, "</details>", ""]


def _cell_of(value: object, modules: dict[str, str]) -> object:
    if isinstance(value, Strong):
        return strong(value.head, value.rest)
    if isinstance(value, TensorName):
        return with_module(value.name, modules)
    return value


def render_section(section: Section | None, modules: dict[str, str] | None = None) -> list[str]:
    """A section's Markdown lines: its heading, then each paragraph, list and table, a blank line
    after each ([] for None)."""
    if section is None:
        return []
    names = modules or {}
    out = [f"### {section.title}", ""]
    for block in section.blocks:
        if isinstance(block, Paragraph):
            out += ["".join(prose(part.text) if isinstance(part, Said) else part for part in block.parts), ""]
        elif isinstance(block, Bullets):
            out += [*(f"- {item}" for item in block.items), *([""] if block.items else [])]
        elif isinstance(block, Table):
            out += table(block.header, [[_cell_of(value, names) for value in row] for row in block.rows])
    return out
