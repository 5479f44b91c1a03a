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
    g = proto.graph
    for where, values in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        for v in values:
            t = v.type.tensor_type if v.type.HasField("tensor_type") else None
            if t is not None and t.elem_type not in known:
                raise ModelLoadError(
                    f"{path}: graph {where} {v.name!r} declares element type {t.elem_type}, which ONNX does "
                    "not define; the file is damaged or not from an exporter: export the model again"
                )
