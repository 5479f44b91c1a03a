"""Portable captures of the backends that ran (xbackend capture, --save-captures)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from xbackend.execution.protocol import LAYERS, OUTPUTS
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec
from xbackend.planning.builds import Builds
from xbackend.planning.plan import feeds_info
from xbackend.results import EXPECTED, BackendResult, CompareOptions
from xbackend.results.capture_record import write_capture
from xbackend.version import VERSION

__all__ = ["save_captures"]


def save_captures(
    opts: CompareOptions,
    spec: ModelSpec,
    feeds: Feeds,
    feeds_path: Path,
    builds: Mapping[str, Builds],
    backends: Sequence[BackendResult],
    env: Sequence[tuple[str, str]],
    capture_to: str | os.PathLike[str] | None,
) -> None:
    """Portable captures: `capture_to` for the first backend (xbackend capture), and one folder per
    backend that ran under --save-captures."""
    todo: list[tuple[Path, BackendResult]] = []
    ran = [
        backend for backend in backends if backend.ok and not backend.loaded_from and backend.name != EXPECTED
    ]
    if capture_to is not None and ran and ran[0].name == opts.backends[0]:
        todo.append((Path(capture_to), ran[0]))
    if opts.save_captures:
        todo += [(Path(opts.save_captures) / backend.name, backend) for backend in ran]
    model = {"name": Path(spec.path).name, "sha256": spec.sha256, "outputs": list(spec.output_names)}
    info = feeds_info(feeds, False)
    for dest, b in todo:
        first = builds[b.name].first
        phases = {OUTPUTS: first.outputs} if first.outputs.name == OUTPUTS else {}
        if first.layers is not None:
            phases[LAYERS] = first.layers
        write_capture(dest, b, model, info, feeds_path, phases, dict(env), VERSION)
