"""The severed model: every node reads its inputs from graph inputs, so one run of it on an
engine, fed the reference's values of those inputs, gives each node's own (local) error.

A node's output keeps its name, so the severed run's capture lines up with the
reference's tensor by tensor. Each computed tensor a node reads becomes a graph
input named `SEVERED + tensor`. Subgraphs (If, Loop, Scan) still read the
outer tensors their parents compute; a tensor the reference did not capture
stays connected.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import onnx
from onnx import helper

__all__ = ["SEVERED", "Severed", "sever"]

SEVERED = "xb.in."


@dataclass(frozen=True)
class Severed:
    """The severed model and the tensors it reads as inputs (original names, model order)."""

    proto: onnx.ModelProto
    inputs: tuple[str, ...]


def sever(
    proto: onnx.ModelProto,
    available: Mapping[str, tuple[int, tuple[int, ...]]],
    reads_fed: Callable[[str, int], bool] | None = None,
    exposed: Collection[str] | None = None,
) -> Severed:
    """`proto` with each node input that another node computes, and that `available` holds
    (name -> (ONNX element type, shape)), read from a graph input instead: every such read, or
    those `reads_fed(tensor, node index)` chooses (a stretch reads its own tensors itself). The
    computed tensors of `available` are outputs (`exposed`: only those)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    order = [output_name for node in graph.node for output_name in node.output if output_name]
    computed = set(order)
    fed: dict[str, None] = {}
    for index, node in enumerate(graph.node):
        for i, name in enumerate(node.input):
            if name in computed and name in available and (reads_fed is None or reads_fed(name, index)):
                node.input[i] = SEVERED + name
                fed[name] = None
    for name in fed:
        elem, shape = available[name]
        graph.input.append(helper.make_tensor_value_info(SEVERED + name, elem, list(shape)))
    # Every computed tensor the reference holds an output: a node whose output nothing reads any
    # more would be dropped as dead code by engines that prune on import (OpenVINO).
    have = {output_name.name for output_name in graph.output}
    for n in order:
        if n not in have and n in available and (exposed is None or n in exposed):
            elem, shape = available[n]  # typed: checkers (the oracle's) want a type
            graph.output.append(helper.make_tensor_value_info(n, elem, list(shape)))
    return Severed(out, tuple(fed))
