"""The full per-layer table as CSV, beside the Markdown (which shows a capped, folded part)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from xbackend.numerics.metrics import TensorDiff
from xbackend.numerics.values import value_name
from xbackend.results import Result

__all__ = ["HEADER", "layer_rows", "to_csv"]

HEADER = (
    "comparison",
    "position",
    "tensor",
    "module",
    "op",
    "dtype",
    "shape",
    "status",
    "bitwise",
    "mismatch_fraction",
    "max_ulp",
    "scaled_ulp",
    "max_abs",
    "max_rel",
    "v_ermv",
    "nan_mismatch",
    "inf_mismatch",
    "ftz_mismatch",
    "fill_mismatch",
)


def _cell(x: object) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return "true" if x else "false"
    return repr(x) if isinstance(x, float) else str(x)


def layer_rows(result: Result) -> Iterator[tuple[str, list[TensorDiff]]]:
    """(comparison, tensors in model order) for every per-layer table the result holds."""
    for cross in result.cross_backend:
        if cross.status == "ok":
            yield f"{cross.backend} vs {cross.reference}", list(cross.tensors or cross.output_tensors)
    for cross in result.oracle_error:
        yield f"{cross.backend} vs oracle", list(cross.tensors or cross.output_tensors)
    for cross in result.expected_error:
        yield f"{cross.backend} vs expected", list(cross.output_tensors)
    for backend in result.backends:
        if backend.ok and (backend.run_diffs or backend.build_diffs):
            yield f"{backend.name} run to run", list(backend.run_diffs)
            if backend.build_diffs:
                yield f"{backend.name} build to build", list(backend.build_diffs)
    for drift in result.baseline:
        if drift.measured:
            yield f"{drift.backend} vs baseline", list(drift.tensors or drift.outputs)


def to_csv(result: Result) -> str:
    """Every tensor of every comparison as CSV rows, in model order."""
    modules = result.model.modules()
    position = {
        n: index for index, n in enumerate(result.model.tensor_order())
    }  # model order, whatever the backend
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    for what, tensors in layer_rows(result):
        for tensor in tensors:
            w.writerow(
                [
                    _cell(x)
                    for x in (
                        what,
                        position.get(value_name(tensor.name)),
                        tensor.name,
                        modules.get(value_name(tensor.name), ""),
                        tensor.op_type,
                        tensor.dtype,
                        "x".join(map(str, tensor.shape)),
                        tensor.status,
                        tensor.bitwise_equal,
                        tensor.mismatch_fraction,
                        tensor.max_ulp,
                        tensor.scaled_ulp,
                        tensor.max_abs,
                        tensor.max_rel,
                        tensor.v_ermv,
                        tensor.nan_mismatch,
                        tensor.inf_mismatch,
                        tensor.ftz_mismatch,
                        tensor.fill_mismatch,
                    )
                ]
            )
    return buf.getvalue()
