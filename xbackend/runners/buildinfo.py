"""What a build decided, as runners report it across the worker boundary: its fingerprint,
and (for the opt-levels job) how each graph optimization level moved the outputs.

Plain data below both the runner contract and the worker protocol; Python 3.8 (foreign workers).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BuildFingerprint", "OptLevelRow"]


@dataclass(frozen=True)
class BuildFingerprint:
    """What an engine decided when it was built: a digest plus per-layer items."""

    backend: str
    digest: str
    layers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_items(cls, backend: str, items: Sequence[tuple[str, str]]) -> BuildFingerprint:
        """A fingerprint of (what, how) items: their digest, the items kept to say what differs."""
        digest = hashlib.sha256()
        for k, v in items:
            digest.update(f"{k}\x00{v}\x00".encode())
        return cls(backend, digest.hexdigest(), tuple(items))


@dataclass(frozen=True)
class OptLevelRow:
    """One graph optimization level against none (the opt-levels job's answer)."""

    level: str
    bitwise_equal: bool
    max_ulp: int
    scaled_ulp: float
    changed_by: tuple[str, ...]
    modified_graph: tuple[str, ...]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OptLevelRow:
        """The row as to_dict wrote it."""
        return cls(
            str(d["level"]),
            bool(d["bitwise_equal"]),
            int(d["max_ulp"]),
            float(d["scaled_ulp"]),
            tuple(d["changed_by"]),
            tuple(d["modified_graph"]),
        )
