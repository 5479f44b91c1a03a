"""The element types a graph declares, checked against ONNX's own enum before anything reads one
(a damaged or hostile file may declare 999, which onnx's helpers fail on with a ValueError)."""

from __future__ import annotations

from pathlib import Path

import onnx

from xbackend.errors import ModelLoadError

__all__ = ["check_elem_types"]


def check_elem_types(proto: onnx.ModelProto, path: Path) -> None:
    """Every tensor type the graph declares is one ONNX defines (a damaged or hostile file may
    declare 999): one line naming the tensor, before anything reads the type."""
    known = set(onnx.TensorProto.DataType.values())
    graph = proto.graph
    for where, values in (("input", graph.input), ("output", graph.output), ("value_info", graph.value_info)):
        for value in values:
            t = value.type.tensor_type if value.type.HasField("tensor_type") else None
            if t is not None and t.elem_type not in known:
                raise ModelLoadError(
                    f"{path}: graph {where} {value.name!r} declares element type {t.elem_type}, which ONNX "
                    "does "
                    "not define; the file is damaged or not from an exporter: export the model again"
                )
