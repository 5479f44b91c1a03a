"""Text made inert: names from models, captures and labels shown as they are, building nothing
(Markdown escaping, code spans, controls written out), and numbers and sizes as xbackend writes
them. The report's Markdown structure (tables, bold, folds) is xbackend.report.markup's."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping

from xbackend.numerics.values import value_name

__all__ = [
    "CONTROL",
    "HIDDEN",
    "cell_text",
    "code_span",
    "gib",
    "inert",
    "module_note",
    "num",
    "prose",
    "short",
    "visible",
    "with_module",
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


def gib(size: int) -> str:
    """Bytes as GiB (MiB below one GiB), three significant digits."""
    return f"{size / 2**30:.3g} GiB" if size >= 2**30 else f"{size / 2**20:.3g} MiB"


def module_note(tensor: str | None, modules: Mapping[str, str]) -> str:
    """'tensor (module)', or a dash when there is no tensor."""
    return with_module(tensor, modules) if tensor else "–"


def cell_text(text: object) -> str:
    """A table cell's text made inert: a pipe or a line break would end the cell, raw HTML would
    render, a URL, an e-mail address or [text](target) would become a link, an asterisk
    emphasis; a code span stays whole."""
    return _between_spans(visible(CONTROL.sub(" ", str(text))), _prose_text).replace("|", "\\|")
