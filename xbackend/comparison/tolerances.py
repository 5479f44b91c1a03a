"""Each comparison with its backend's judgment attached: its local errors and, under --max-ulp
auto, the tolerance of each tensor and what decided it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from xbackend.results import CrossBackendResult
from xbackend.results.explanation import Explanation

__all__ = ["attach"]


def attach(
    cross: Sequence[CrossBackendResult], ex: Explanation, op_types: Mapping[str, str], auto: bool
) -> tuple[CrossBackendResult, ...]:
    """Each comparison with its backend's local errors and, under --max-ulp auto, each tensor's
    tolerance: the allowance its node's local error is judged by, where the backend was judged
    against float64; MARGIN x the floor where it could not be (a loaded capture, a failed run)."""
    if not ex.ok:
        return tuple(replace(compared, not_judged=ex.reason or "no explanation ran") for compared in cross)
    floor_tol = tuple(ex.tolerances(op_types).items()) if auto else ()
    out = []
    for cross_backend_result in cross:
        le = ex.local_for(cross_backend_result.backend)
        if le is None or le.status != "ok":
            why = (le.reason or le.status) if le is not None else "its local errors were not measured"
            out.append(
                replace(
                    cross_backend_result,
                    tolerances=floor_tol,
                    not_judged=why,
                    tolerance_by=_by_floor(ex, cross_backend_result, auto),
                )
            )
            continue
        tol = tuple((node.tensor, node.allowed_scaled_ulp) for node in le.nodes) if auto else ()
        local = tuple((node.tensor, node.local_scaled_ulp) for node in le.nodes)
        by = (
            "its nodes' allowances against float64"
            if auto
            else f"--max-ulp {cross_backend_result.max_ulp_tolerance:g}"
        )
        out.append(
            replace(
                cross_backend_result,
                tolerances=tol,
                explained=le.explained,
                origins=le.origins,
                local_errors=local,
                tolerance_by=by,
            )
        )
    return tuple(out)


def _by_floor(ex: Explanation, cross: CrossBackendResult, auto: bool) -> str:
    """What decides the tolerance of a backend that was not judged against float64."""
    if not auto:
        return f"--max-ulp {cross.max_ulp_tolerance:g}"
    if ex.floors:
        return f"{ex.margin:g}x its noise floor ({ex.samples} orders on {ex.engine})"
    return f"the fixed {cross.max_ulp_tolerance:g} scaled ULP (no noise floor: {ex.floor_note})"
