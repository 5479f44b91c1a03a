"""Markdown building blocks shared by the report and the probes' own sections."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from xbackend.numerics.values import value_name

__all__ = [
    "CONTROL",
    "HIDDEN",
    "Ours",
    "cell",
    "code_span",
    "fenced",
    "fold",
    "gib",
    "inert",
    "module_note",
    "num",
    "only_our_html",
    "prose",
    "short",
    "strong",
    "table",
    "visible",
    "with_module",
    "yes",
]


def num(number: float | int | None) -> str:
    """A number as the report shows it: integers whole, others to three significant digits, a dash
    for None."""
    if number is None:
        return "–"
    if isinstance(number, int) and not isinstance(number, bool):
        return str(number)
    if math.isinf(number) or math.isnan(number):
        return str(number)
    if number == 0:
        return "0"
    return f"{number:.3g}"


def short(number: float | None) -> str:
    """Three significant digits for prose; 'n/a' when there is no figure."""
    return "n/a" if number is None else f"{number:.3g}"


def with_module(tensor: str, modules: Mapping[str, str]) -> str:
    """`tensor (module)` where the model records the tensor's source module, else `tensor`;
    both names inert (they come from the model)."""
    module = modules.get(value_name(tensor), "")
    return f"{inert(tensor)} ({inert(module)})" if module else inert(tensor)


# a line break or control character: in a name it would start a line of its own
CONTROL = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")
# C1 controls (U+009B is a terminal's CSI) and the bidirectional controls that reorder what is
# shown: written out as \uXXXX wherever a name is printed
HIDDEN = re.compile("[\x80-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# what GitHub's autolink extension turns into a link: a scheme's ://, www., an e-mail address
_SCHEME = re.compile(r"(?<=\w)://")
_WWW = re.compile(r"(?i)(?<![a-z0-9])(www)\.")  # GitHub links www. after _, * or ~ too
_EMAIL = re.compile(r"[\w.+-]@[\w-]+\.[\w-]")
_EMAIL_WHOLE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_TICKS = re.compile(r"`+")


def visible(text: str) -> str:
    """`text` with every C1 or bidirectional control written out (\u009b): on a terminal and in a
    report it neither controls nor reorders anything."""
    return HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def fenced(text: str, info: str = "", lines: bool = False) -> list[str]:
    """`text` as a fenced code block that nothing inside can close or escape: each control written
    out, the fence longer than any run of backticks in it. Its line breaks are written out too,
    unless `lines` (code of the report's own, to be copied and run as printed: its lines kept)."""
    parts = text.split("\n") if lines else [text]
    body = [visible(CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", part)) for part in parts]
    longest = max((len(run) for block in body for run in re.findall("`+", block)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", *body, fence]


def code_span(text: str) -> str:
    """`text` as a Markdown code span: shown as it is, building nothing (its fence is longer than
    any run of backticks inside)."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _unlinked(text: str) -> str:
    """Text with no scheme's :// and no www. that GitHub would make a link of."""
    return _WWW.sub(r"\1\\.", _SCHEME.sub(r"\\://", text))


def inert(text: object) -> str:
    """A name from a model, a capture or a label, as Markdown that shows it and builds nothing:
    no line break (a heading of its own), no link, autolink or image, no HTML tag, no emphasis,
    no control a terminal obeys (in a table, cell() keeps its pipes inside the cell). A name
    holding a backtick or an e-mail address is a code span."""
    s = visible(CONTROL.sub(" ", str(text)))
    if "`" in s or _EMAIL.search(s):
        return code_span(s)
    return _unlinked(_escaped(s))


def prose(text: object) -> str:
    """A line of the report's own text that quotes names (a verdict, a note): its code spans
    stay, and what lies between them is made inert (an e-mail address becomes a code span)."""
    return _between_spans(visible(CONTROL.sub(" ", str(text))), _prose_text)


def _code_spans(text: str) -> Iterable[tuple[int, int]]:
    """Where `text` holds code spans as CommonMark reads them: a run of backticks that no backslash
    escapes opens one, the next run of the same length closes it (inside, a backslash is text)."""
    at = 0
    while (opening := _TICKS.search(text, at)) is not None:
        before = text[: opening.start()]
        if (len(before) - len(before.rstrip("\\"))) % 2:  # an escaped backtick: text, one shorter run
            at = opening.start() + 1
            continue
        close = next(
            (
                cell
                for cell in _TICKS.finditer(text, opening.end())
                if len(cell.group()) == len(opening.group())
            ),
            None,
        )
        if close is None:
            at = opening.end()
            continue
        yield opening.start(), close.end()
        at = close.end()


def _between_spans(text: str, made_inert: Callable[[str], str]) -> str:
    """`text` with `made_inert` applied to the text between its code spans (the spans kept whole)."""
    out, at = [], 0
    for start, end in _code_spans(text):
        out += [made_inert(text[at:start]), text[start:end]]
        at = end
    out.append(made_inert(text[at:]))
    return _joined(out)


def _joined(pieces: list[str]) -> str:
    """Markdown pieces side by side, a space where two backtick fences would touch (they would
    read as one longer fence, and what one span held would no longer be code)."""
    out = ""
    for piece in pieces:
        out += " " + piece if out.endswith("`") and piece.startswith("`") else piece
    return out


def _prose_text(text: str) -> str:
    """Text between code spans made inert: an e-mail address a code span of its own (GitHub would
    link it), every backtick its entity."""
    out, at = [], 0
    for m in _EMAIL_WHOLE.finditer(text):
        out += [_no_ticks(text[at : m.start()]), code_span(m.group(0))]
        at = m.end()
    out.append(_no_ticks(text[at:]))
    return _joined(out)


def _no_ticks(text: str) -> str:
    """Text with no e-mail address made inert, a backtick in it written as its entity: it shows
    as one and pairs with nothing (a backslash before it would not hold: a name's own backslash
    can cancel one)."""
    return "&#96;".join(_unlinked(_escaped(part)) for part in text.split("`"))


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
    return _between_spans(visible(CONTROL.sub(" ", str(text))), _cell_text).replace("|", "\\|")


def _cell_text(text: str) -> str:
    """A cell's names made inert: every bracket, tilde, asterisk and underscore at a word's edge
    escaped, a backtick its entity, an e-mail address a code span."""
    return _prose_text(text)


_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_ENTITIES = ("&amp;", "&lt;")
_ALNUM = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def _escaped(text: str) -> str:
    """`text` with what builds Markdown escaped: & and <, brackets, tildes, underscores at a word's
    edge (layer_norm stays as it is), and asterisks. An escape already there (a backslash before
    punctuation, &amp;, &lt;) is kept as one piece: escaping twice changes nothing, and a name's
    own backslash can never cancel an escape added here (a lone one before a letter stays a
    backslash)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in _PUNCT:
            out.append(text[i : i + 2])
            i += 2
            continue
        if c == "\\" and i + 1 == n:  # last: it would escape the markup that follows the name
            out.append("\\\\")
            break
        entity = next((entity for entity in _ENTITIES if text.startswith(entity, i)), "")
        if entity:
            out.append(entity)
            i += len(entity)
            continue
        prev, nxt = text[i - 1] if i else "", text[i + 1] if i + 1 < n else ""
        if c == "&":
            out.append("&amp;")
        elif c == "<":
            out.append("&lt;")
        elif c in "[]~":
            out.append("\\" + c)
        elif c == "_" and not (prev in _ALNUM and nxt in _ALNUM):
            out.append("\\_")
        elif c == "*":
            out.append("\\*")
        else:
            out.append(c)
        i += 1
    return "".join(out)


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


def gib(size: int) -> str:
    """Bytes as GiB (MiB below one GiB), three significant digits."""
    return f"{size / 2**30:.3g} GiB" if size >= 2**30 else f"{size / 2**20:.3g} MiB"


def yes(flag: bool | None) -> str:
    """A yes/no cell: yes, a bold no, or a dash where nothing was measured."""
    return "–" if flag is None else ("yes" if flag else strong("no"))


def module_note(tensor: str | None, modules: Mapping[str, str]) -> str:
    """'tensor (module)', or a dash when there is no tensor."""
    return with_module(tensor, modules) if tensor else "–"


def fold(title: str, summary: str, body: list[str]) -> list[str]:
    """A section whose body is folded: the heading stays visible for navigation."""
    return [f"## {title}", "", f"<details><summary>{summary}</summary>", "", *body, "</details>", ""]
