"""Reading files that come from others: paths kept inside their own folder, fields of the type
the reader expects.

Models, captures, certificates, baselines and sweep files are untrusted input. A path read from
one resolves inside the folder that holds it (no absolute path, no `..`, no symlink out), and a
refusal names the entry alone: nothing about a file outside is looked at or told.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xbackend.errors import InputError

__all__ = ["MAX_DEPTH", "contained", "field", "json_loads", "number"]


def contained(folder: Path, entry: object, what: str, fix: str) -> Path:
    """`entry` (a path written in a file in `folder`) as a path inside `folder`, or an InputError
    naming the entry and saying what to do (`fix`)."""
    text = entry if isinstance(entry, str) else ""
    shown = repr(text[:120]) if text else repr(entry)[:120]
    if not text or "\0" in text or os.path.isabs(text) or text.startswith("~"):
        raise InputError(f"{what} names {shown}, which is not a path inside its own folder; {fix}")
    parts = Path(text).parts
    if ".." in parts:
        raise InputError(f"{what} names {shown}, which leads out of its own folder; {fix}")
    base = folder.resolve()
    try:
        real = _inside(base, text)
    except RecursionError:  # every link it followed lies inside: a loop there
        raise InputError(f"{what} names {shown}, which cannot be resolved inside its folder; {fix}") from None
    if real is None:
        raise InputError(f"{what} names {shown}, which leads out of its own folder; {fix}")
    return base / text


def _inside(base: Path, rel: str) -> Path | None:
    """`rel` resolved from `base`, following links only while they lie inside it: None as soon as
    it leads out, so nothing outside is ever looked at (what lies there cannot change the answer)."""
    parts = list(Path(rel).parts)
    cur, hops = base, 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            cur = cur.parent
            if cur != base and base not in cur.parents:
                return None
            continue
        nxt = cur / part
        if not nxt.is_symlink():  # an lstat of a path inside `base`
            cur = nxt
            continue
        hops += 1
        if hops > 40:
            raise RecursionError(rel)
        target = Path(os.readlink(nxt))
        if target.is_absolute():
            if target.parts[: len(base.parts)] != base.parts:
                return None
            cur, parts = base, [*target.parts[len(base.parts) :], *parts]
        else:
            parts = [*target.parts, *parts]
    return cur


def field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, fix: str) -> Any:
    """data[key] of the expected type (bool is not an int here), or a one-line InputError."""
    value = data.get(key) if isinstance(data, Mapping) else None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    is_bool = isinstance(value, bool)
    if value is None and type(None) in kinds:
        return value
    if not isinstance(value, kinds) or (is_bool and bool not in kinds):
        want = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
        raise InputError(f"{where}: {key} must be {want}, not {_shown(value)}; {fix}")
    return value


def number(
    data: Mapping[str, Any], key: str, where: str, fix: str, lo: float, hi: float, integer: bool = True
) -> Any:
    """`data[key]` held to a finite number (an integer unless `integer` is False) in [lo, hi]; an
    InputError naming `where` and the `fix` otherwise."""
    value = field(data, key, int if integer else (int, float), where, fix)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{where}: {key} must be a finite number, not {value}; {fix}")
    if not lo <= value <= hi:
        raise InputError(f"{where}: {key} must be between {lo:g} and {hi:g}, not {_shown(value)}; {fix}")
    return value


def _shown(value: object) -> str:
    if value is None:
        return "missing"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


MAX_DEPTH = 64  # nesting no file xbackend writes comes near (a report: 12); deeper is refused
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def json_loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads for a file from others: nesting past `max_depth` is a ValueError before it is
    parsed (json's recursion would end in a RecursionError), as is anything else json refuses."""
    # bytes not UTF-8: a UnicodeDecodeError, a ValueError, refused alike
    s = text if isinstance(text, str) else bytes(text).decode("utf-8")
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub("", s)):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > max_depth:
        raise ValueError(f"nested {deepest} levels deep (at most {max_depth})")
    try:
        return json.loads(s)
    except RecursionError:
        raise ValueError(f"nested too deep (at most {max_depth} levels)") from None
