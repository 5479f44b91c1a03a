"""Why an export failed, in words a user can act on: the exception torch's exporter wrapped, cut at
a word, and the --dynamic flags a shared size is missing."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from xbackend.export.example_inputs import InputDecl

__all__ = ["cut_words", "root_cause", "static_peers"]


def root_cause(e: BaseException) -> BaseException:
    """The exception torch's exporter wrapped (its own message is a page of next steps)."""
    seen = {id(e)}
    while e.__cause__ is not None and id(e.__cause__) not in seen:
        e = e.__cause__
        seen.add(id(e))
    return e


def cut_words(text: str, limit: int) -> str:
    """One line of at most `limit` characters, cut at a word, never inside one."""
    line = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0] + " …"


def static_peers(inputs: Sequence[InputDecl], dynamic: Mapping[str, Mapping[int, str]]) -> list[str]:
    """The --dynamic flags that would give every input of a named size's length that name: an
    input left static at the same axis and size as a dynamic one pins it."""
    out = []
    for name, axes in dynamic.items():
        mine = next((i for i in inputs if i.name == name), None)
        if mine is None:
            continue
        for axis, dim in axes.items():
            if axis >= len(mine.shape):
                continue
            for other in inputs:
                if (
                    other.name != name
                    and axis < len(other.shape) and other.shape[axis] == mine.shape[axis]
                    and axis not in dynamic.get(other.name, {})
                ):  # fmt: skip
                    flag = f"--dynamic {other.name}={axis}:{dim}"
                    if flag not in out:
                        out.append(flag)
    return out
