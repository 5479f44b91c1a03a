"""Baselines: a previous release's captures or JSON report, matched to this run's backends."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from xbackend.comparison.saved_report import read_result
from xbackend.errors import InputError
from xbackend.files.capture_folder import is_capture, recorded_name
from xbackend.files.untrusted import contained
from xbackend.results import BackendResult
from xbackend.results.capture_record import LoadedCapture, open_capture

__all__ = ["Baseline", "BaselineBackend", "load_baseline"]


@dataclass(frozen=True)
class BaselineBackend:
    name: str
    result: BackendResult
    feeds_sha256: str
    capture: LoadedCapture | None  # values, when the baseline kept them


@dataclass(frozen=True)
class Baseline:
    source: str
    backends: tuple[BaselineBackend, ...]
    environment: tuple[tuple[str, str], ...]

    def match(self, name: str) -> BaselineBackend | None:
        """The same backend: by name, else by the runner name before '@' (a loaded capture)."""
        by_name = {backend.name: backend for backend in self.backends}
        if name in by_name:
            return by_name[name]
        base = name.split("@")[0]
        return next((backend for backend in self.backends if backend.name.split("@")[0] == base), None)


def _from_captures(source: str, folders: list[Path]) -> Baseline:
    caps = [open_capture(folder, recorded_name(folder)) for folder in folders]
    return Baseline(
        source,
        tuple(BaselineBackend(cap.name, cap.backend, cap.feeds.sha256, cap) for cap in caps),
        caps[0].environment,
    )


def _captures_in(folder: Path) -> list[Path]:
    return (
        sorted(path for path in folder.iterdir() if path.is_dir() and is_capture(path))
        if folder.is_dir()
        else []
    )


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """A capture folder, a folder of captures (--save-captures), or a JSON report (with the
    captures it names beside it, when they are there)."""
    p = Path(path)
    if p.is_dir():
        if is_capture(p):
            return _from_captures(str(p), [p])
        found = _captures_in(p)
        if not found:
            raise InputError(
                f"--baseline {p} holds no captures; pass a capture folder (xbackend capture), a folder "
                "of them (--save-captures), or a JSON report (--json)"
            )
        return _from_captures(str(p), found)
    if not p.is_file():
        raise InputError(f"--baseline {p} not found; pass a previous release's JSON report or capture folder")
    result = read_result(p, "--baseline")
    caps: dict[str, LoadedCapture] = {}
    if result.options.save_captures:
        # the captures' folder, by its name alone, beside the report and never outside its folder
        beside = contained(
            p.parent,
            Path(result.options.save_captures).name,
            f"--baseline {p}: save_captures",
            "pass the capture folder itself as --baseline",
        )
        for d in _captures_in(beside):
            cap = open_capture(d, recorded_name(d))
            caps[cap.name] = cap
    return Baseline(
        str(p),
        tuple(
            BaselineBackend(backend.name, backend, result.feeds.sha256, caps.get(backend.name))
            for backend in result.backends
            if backend.ok and not backend.loaded_from
        ),
        result.environment,
    )
