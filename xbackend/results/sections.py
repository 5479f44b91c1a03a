"""A probe's section of the report as data: its title, paragraphs, lists and tables. The report
renders it (xbackend.report.markup.render_section); a probe, built in or a plugin's, writes no
Markdown of its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Block",
    "Bullets",
    "Cell",
    "Paragraph",
    "Said",
    "Section",
    "Strong",
    "Table",
    "TensorName",
    "yes_no",
]


@dataclass(frozen=True)
class Strong:
    """A cell that opens in bold: `head` (a status, a name), then `rest` (a reason that may quote
    names), both made inert when rendered."""

    head: str
    rest: str = ""


@dataclass(frozen=True)
class TensorName:
    """A cell naming a tensor: rendered as `tensor (module)` where the model records its module."""

    name: str


Cell = str | int | float | Strong | TensorName


@dataclass(frozen=True)
class Said:
    """A piece of a paragraph that quotes what others wrote (a reason, an engine's message): made
    inert when rendered."""

    text: str


@dataclass(frozen=True)
class Paragraph:
    """A paragraph: xbackend's own words, written as they are, and pieces it quotes (Said)."""

    parts: tuple[str | Said, ...]

    @classmethod
    def of(cls, *parts: str | Said) -> Paragraph:
        """A paragraph of these pieces, in order."""
        return cls(tuple(parts))


@dataclass(frozen=True)
class Bullets:
    """A list, one item per line (xbackend's own words)."""

    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table: its header, then each row's cells."""

    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]

    @classmethod
    def of(cls, header: Sequence[str], rows: Sequence[Sequence[Cell]]) -> Table:
        """A table of `header` and `rows`, held as tuples."""
        return cls(tuple(header), tuple(tuple(row) for row in rows))


Block = Paragraph | Bullets | Table


@dataclass(frozen=True)
class Section:
    """A probe's section: its title, then its blocks in order."""

    title: str
    blocks: tuple[Block, ...]


def yes_no(flag: bool | None) -> Cell:
    """A yes/no cell: yes, a bold no, or a dash where nothing was measured."""
    return "–" if flag is None else ("yes" if flag else Strong("no"))
