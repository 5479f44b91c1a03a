"""--candidate FILE[@BACKEND,...]: the file and the backends it runs on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xbackend.errors import UsageError
from xbackend.results.flags import comma_list

__all__ = ["QUICK_TABLE", "candidate_spec", "candidate_words", "candidates_of"]

# how the quick table's note begins (what it left out follows; the verdict shows it first)
QUICK_TABLE = "the quick table (--candidate with --probes none --runs 1): "


def candidate_spec(text: str) -> tuple[str, tuple[str, ...]]:
    """--candidate FILE[@BACKEND,...]: the file, and the backends it runs on (() : the default).
    The backends follow the first '@' after the file's .onnx suffix (or the first '@')."""
    text = str(text)
    cut = text.find(".onnx@")
    at = cut + 5 if cut >= 0 else text.find("@")
    path, backends = (text, "") if at < 0 else (text[:at], text[at + 1 :])
    if not path:
        raise UsageError(f"--candidate {text!r} names no file; give CANDIDATE.onnx[@BACKEND,...]")
    return path, tuple(comma_list(backends)) if backends else ()


def candidates_of(value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Candidates as (model, backends) pairs from a string, a list, or a mapping of model to backends."""
    if isinstance(value, (str, Mapping)):
        value = [value] if isinstance(value, str) else list(value.items())
    return tuple(
        candidate_spec(x) if isinstance(x, str) else (str(x[0]), tuple(comma_list(x[1] or ()))) for x in value
    )


def candidate_words(spec: tuple[str, tuple[str, ...]]) -> str:
    """A candidate as --candidate writes it: MODEL or MODEL@BACKEND,...."""
    return spec[0] + ("@" + ",".join(spec[1]) if spec[1] else "")
