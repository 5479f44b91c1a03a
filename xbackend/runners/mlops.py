"""ai.onnx.ml ops that onnx's reference evaluator lacks and scikit-learn exports emit: ZipMap
(class probabilities as one map per row) and CategoryMapper (strings to integers and back).

The reference backend and the float64 oracle hand these to the evaluator as custom ops. The
values keep the input's float type: float32 on the reference, as ZipMap declares, float64 on
the oracle (rounded back to float32 like every other tensor).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ml_ops"]


def ml_ops() -> list[type]:
    """The op classes, for ReferenceEvaluator(new_ops=...); built on first use, since their base
    class loads the evaluator."""
    from onnx.reference.op_run import OpRun  # engine: onnx's reference evaluator

    class ZipMap(OpRun):
        op_domain = "ai.onnx.ml"

        def _run(self, x: Any, classlabels_int64s: Any = None, classlabels_strings: Any = None) -> Any:
            labels = (
                list(classlabels_int64s)
                if classlabels_int64s is not None
                else list(classlabels_strings or [])
            )
            rows = np.asarray(x)
            rows = rows.reshape(1, -1) if rows.ndim == 1 else rows
            if rows.shape[-1] != len(labels):
                raise ValueError(f"ZipMap: {rows.shape[-1]} columns for {len(labels)} class labels")
            keys = [int(label) if classlabels_int64s is not None else _text(label) for label in labels]
            return ([{key: np.asarray(v) for key, v in zip(keys, row, strict=True)} for row in rows],)

    class CategoryMapper(OpRun):
        op_domain = "ai.onnx.ml"

        def _run(
            self,
            x: Any,
            cats_int64s: Any = None,
            cats_strings: Any = None,
            default_int64: Any = None,
            default_string: Any = None,
        ) -> Any:
            strings = [_text(s) for s in cats_strings or []]
            ints = [int(i) for i in cats_int64s or []]
            a = np.asarray(x)
            if a.dtype.kind in "OUS":  # strings to integers
                to_int = dict(zip(strings, ints, strict=True))
                default = -1 if default_int64 is None else int(default_int64)
                flat = [to_int.get(_text(s), default) for s in a.reshape(-1)]
                return (np.array(flat, np.int64).reshape(a.shape),)
            to_str = dict(zip(ints, strings, strict=True))
            fallback = "_Unused" if default_string is None else _text(default_string)
            flat_s = [to_str.get(int(i), fallback) for i in a.reshape(-1)]
            return (np.array(flat_s, dtype=object).reshape(a.shape),)

    return [ZipMap, CategoryMapper]


def _text(s: Any) -> str:
    return s.decode() if isinstance(s, bytes) else str(s)
