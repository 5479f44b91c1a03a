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


def layer_rows(r: Result) -> Iterator[tuple[str, list[TensorDiff]]]:
    """(comparison, tensors in model order) for every per-layer table the result holds."""
    for c in r.cross_backend:
        if c.status == "ok":
            yield f"{c.backend} vs {c.reference}", list(c.tensors or c.output_tensors)
    for c in r.oracle_error:
        yield f"{c.backend} vs oracle", list(c.tensors or c.output_tensors)
    for c in r.expected_error:
        yield f"{c.backend} vs expected", list(c.output_tensors)
    for b in r.backends:
        if b.ok and (b.run_diffs or b.build_diffs):
            yield f"{b.name} run to run", list(b.run_diffs)
            if b.build_diffs:
                yield f"{b.name} build to build", list(b.build_diffs)
    for d in r.baseline:
        if d.measured:
            yield f"{d.backend} vs baseline", list(d.tensors or d.outputs)


def to_csv(r: Result) -> str:
    modules = r.model.modules()
    position = {n: i for i, n in enumerate(r.model.tensor_order())}  # model order, whatever the backend
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    for what, tensors in layer_rows(r):
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
