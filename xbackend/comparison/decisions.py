"""`--decisions`: each backend's top-1 choices along an output's class axis (a classifier's
logits, a detector's scores) against the reference's: agreement, the reference's smallest margin,
and the decisions that flipped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from xbackend.errors import UsageError
from xbackend.execution.decoding import top_two
from xbackend.files.storage import ValueFile
from xbackend.model.load import ModelSpec
from xbackend.planning.builds import Builds
from xbackend.results import BackendResult
from xbackend.results.decode import FLIPS_KEPT, Decisions, Flip

__all__ = ["decision_outputs", "decisions_all"]


def decision_outputs(spec: ModelSpec, asked: Sequence[str]) -> list[tuple[str, int]]:
    """(output, class axis) for `--decisions`: `auto` takes every floating-point output whose last
    axis has at least 2 entries; NAME or NAME:AXIS names one."""
    outputs = {output.name: output for output in spec.outputs}
    out: list[tuple[str, int]] = []
    for item in asked:
        if item == "auto":
            for t in spec.outputs:
                last = t.shape[-1] if t.shape else None
                scores = t.kind == "tensor" and t.dtype.startswith(("float", "bfloat"))
                if scores and t.shape and (not isinstance(last, int) or last >= 2):
                    out.append((t.name, -1))
            continue
        name, _, axis = item.rpartition(":") if ":" in item else (item, "", "-1")
        if name not in outputs:
            raise UsageError(
                f"--decisions {item}: the model has no output {name!r}; its outputs: {', '.join(outputs)} "
                "(or --decisions auto)"
            )
        try:
            out.append((name, int(axis)))
        except ValueError:
            raise UsageError(
                f"--decisions {item}: the axis after ':' must be a number, e.g. {name}:1"
            ) from None
    return list(dict.fromkeys(out))


def _values(builds: Builds, name: str) -> np.ndarray | None:
    phase = builds.first.outputs
    if name not in phase.capture_names:
        return None
    with ValueFile(phase.capture) as f:
        v = f[name]
    return v if isinstance(v, np.ndarray) else None


def _one(name: str, axis: int, builds: Builds, ref: Builds, backend: str, reference: str) -> Decisions:
    mine, theirs = _values(builds, name), _values(ref, name)
    why = ""
    if mine is None or theirs is None:
        why = "not captured"
    elif mine.shape != theirs.shape or mine.ndim == 0:
        why = f"shapes {list(mine.shape)} and {list(theirs.shape)}"
    elif not -mine.ndim <= axis < mine.ndim or mine.shape[axis] < 2:
        why = f"axis {axis} of shape {list(mine.shape)} holds no choice between classes"
    if why or mine is None or theirs is None:
        return Decisions(
            backend=backend, reference=reference, output=name, axis=axis, decisions=0, agree=0,
            smallest_margin=float("nan"), status="not-compared", reason=why,
        )  # fmt: skip
    a, r = np.moveaxis(mine, axis, -1), np.moveaxis(theirs, axis, -1)
    mine_c, _ = top_two(a)
    ref_c, margin = top_two(r)
    diff = np.max(np.abs(a.astype(np.float64) - r.astype(np.float64)), axis=-1)
    flipped = np.argwhere(mine_c != ref_c)
    order = sorted((tuple(int(i) for i in idx) for idx in flipped), key=lambda i: (float(margin[i]), i))
    flips = tuple(
        Flip(
            index=index,
            reference_class=int(ref_c[index]),
            backend_class=int(mine_c[index]),
            reference_margin=float(margin[index]),
            score_difference=float(diff[index]),
        )
        for index in order[:FLIPS_KEPT]
    )
    return Decisions(
        backend=backend,
        reference=reference,
        output=name,
        axis=axis,
        decisions=int(ref_c.size),
        agree=int(ref_c.size - len(flipped)),
        smallest_margin=float(np.min(margin)) if margin.size else float("nan"),
        flips=flips,
    )


def decisions_all(
    spec: ModelSpec,
    asked: Sequence[str],
    builds: Mapping[str, Builds],
    backends: Sequence[BackendResult],
    ref: str,
) -> tuple[Decisions, ...]:
    """Every backend that ran against the reference, at each output `--decisions` names."""
    if not asked or ref not in builds or not builds[ref].ok:
        return ()
    wanted = decision_outputs(spec, asked)
    return tuple(
        _one(name, axis, builds[backend.name], builds[ref], backend.name, ref)
        for name, axis in wanted
        for backend in backends
        if backend.ok and backend.name != ref and backend.name in builds and builds[backend.name].ok
    )
