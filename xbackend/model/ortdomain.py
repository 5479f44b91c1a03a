"""Kernels ONNX Runtime registers in the ONNX domain though ONNX has no such op: its optimizer
turns RMSNorm into SimplifiedLayerNormalization there, and models it optimized ship it. onnx's
checker and evaluator know them as the com.microsoft ops they are."""

from __future__ import annotations

import onnx

__all__ = ["ORT_IN_ONNX_DOMAIN", "as_contrib", "has_ort_onnx_ops"]

ORT_IN_ONNX_DOMAIN = frozenset({"SimplifiedLayerNormalization"})
_STANDARD = frozenset({"", "ai.onnx"})
_CONTRIB = "com.microsoft"


def has_ort_onnx_ops(proto: onnx.ModelProto) -> bool:
    """Whether the model uses ONNX Runtime's own ops written in the standard domain."""
    return any(node.domain in _STANDARD and node.op_type in ORT_IN_ONNX_DOMAIN for node in proto.graph.node)


def as_contrib(proto: onnx.ModelProto) -> onnx.ModelProto:
    """`proto` (itself, when it holds none) with those kernels moved to com.microsoft, keeping
    their ONNX-domain default epsilon (1e-5; com.microsoft's is 1e-12)."""
    if not has_ort_onnx_ops(proto):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for node in out.graph.node:
        if node.domain in _STANDARD and node.op_type in ORT_IN_ONNX_DOMAIN:
            node.domain = _CONTRIB
            if not any(attribute.name == "epsilon" for attribute in node.attribute):
                node.attribute.append(onnx.helper.make_attribute("epsilon", 1e-5))
    if not any(opset.domain == _CONTRIB for opset in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(_CONTRIB, 1))
    return out
