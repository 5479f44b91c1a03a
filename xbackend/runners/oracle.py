"""A float64 accuracy oracle: the model promoted to double, run by the reference evaluator.

Every floating-point input, initializer, Constant, Cast target and dtype
attribute is promoted to float64; results are rounded (to nearest even) back to
each tensor's original dtype, so every fp32 engine can be measured against the
correctly-rounded-as-far-as-float64-goes answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from xbackend.errors import BackendUnavailableError
from xbackend.model import kind_of, np_dtype
from xbackend.runners.reference import ReferenceRunner
from xbackend.values import Value

__all__ = ["PROMOTED", "OracleRunner", "promote_to_float64"]

PROMOTED = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16})
_DTYPE_ATTRS = frozenset({"to", "dtype", "output_dtype"})
_PROMOTED_NP = frozenset({"float32", "float16", "bfloat16"})
ML_DOMAIN = "ai.onnx.ml"


def _promote_tensor(t: TensorProto) -> TensorProto:
    if t.data_type not in PROMOTED:
        return t
    arr = numpy_helper.to_array(t).astype(np.float64)
    out = numpy_helper.from_array(arr, t.name)
    return out


def _value_infos(g: onnx.GraphProto) -> Iterator[onnx.ValueInfoProto]:
    yield from g.input
    yield from g.output
    yield from g.value_info


def _promote_graph(g: onnx.GraphProto) -> None:
    for vi in _value_infos(g):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.elem_type in PROMOTED:
            tt.elem_type = TensorProto.DOUBLE
    promoted = [_promote_tensor(t) for t in g.initializer]
    del g.initializer[:]
    g.initializer.extend(promoted)
    for node in g.node:
        for attr in node.attribute:
            if attr.name in _DTYPE_ATTRS and attr.type == onnx.AttributeProto.INT and attr.i in PROMOTED:
                attr.i = TensorProto.DOUBLE
            if attr.HasField("t"):
                attr.t.CopyFrom(_promote_tensor(attr.t))
            if attr.HasField("g"):
                _promote_graph(attr.g)
            for sub in attr.graphs:
                _promote_graph(sub)


def promote_to_float64(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A float64 copy of the model; BackendUnavailableError naming the op that cannot take doubles."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.value_info[:]  # stale fp32 types; re-inferred below
    _promote_graph(out.graph)
    # ai.onnx.ml ops declare float outputs only, so type inference refuses their doubles; the
    # evaluator computes them in numpy all the same: for those, the structure is checked.
    ml = sorted({n.op_type for n in out.graph.node if n.domain == ML_DOMAIN})
    try:
        onnx.checker.check_model(out, full_check=not ml)
    except Exception as e:
        text = " ".join(str(e).split())
        raise BackendUnavailableError(
            f"the model cannot be promoted to float64: {text[:300]}; the oracle is unavailable for this model"
        ) from e
    return out


def original_dtypes(proto: onnx.ModelProto) -> dict[str, str]:
    """Tensor name -> numpy dtype name in the original model, from shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:
        inferred = proto
    out: dict[str, str] = {}
    for vi in _value_infos(inferred.graph):
        inner = kind_of(vi.type)[1]
        et = inner.tensor_type.elem_type if inner is not None else 0
        if et:
            out[vi.name] = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(et)).name)
    return out


def _widen(v: Value) -> Value:
    if isinstance(v, list):
        return [_widen(x) for x in v]
    if isinstance(v, dict):
        return {k: _widen(x) for k, x in v.items()}
    if isinstance(v, np.ndarray) and str(v.dtype) in _PROMOTED_NP:
        return v.astype(np.float64)
    return v


class OracleRunner(ReferenceRunner):
    name = "oracle"
    description = "float64 oracle: the model promoted to double, reference evaluator, 1 BLAS thread"

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._dtypes: dict[str, str] = {}
        self._assumed: set[str] = set()
        self._narrow: set[str] = set()  # float tensors the evaluator computed below float64

    def transform(self, proto: onnx.ModelProto) -> onnx.ModelProto:
        self._dtypes = original_dtypes(proto)
        return promote_to_float64(proto)

    def widen(self, feeds: Mapping[str, Value]) -> dict[str, Value]:
        return {k: _widen(v) for k, v in feeds.items()}

    def narrow(self, name: str, value: Value) -> Value:
        """Back to the tensor's original dtype (round to nearest even); float32 where unknown."""
        if isinstance(value, list):
            return [self.narrow(name, v) for v in value]
        if isinstance(value, dict):
            return {k: self.narrow(name, v) for k, v in value.items()}
        if value is not None and str(value.dtype) in _PROMOTED_NP:
            self._narrow.add(name)  # e.g. TreeEnsemble*: the evaluator sums trees in float32
        if value is None or value.dtype != np.float64:
            return value
        target = self._dtypes.get(name)
        if target is None:
            self._assumed.add(name)
            return value.astype(np.float32)
        return value if target == "float64" else value.astype(np_dtype(target))

    def info(self) -> dict[str, str]:
        out = super().info()
        out["precision"] = "float64, rounded to each tensor's original dtype"
        if self._assumed:
            out["dtype_assumed_float32"] = str(len(self._assumed))
        if self._narrow:
            out["computed_below_float64"] = ", ".join(sorted(self._narrow))
        return dict(sorted(out.items()))
