"""Which tensor each module of a torch model computes, from the names exporters leave on an
ONNX graph's nodes: the name scopes torch.onnx's dynamo exporter records, or the node names its
TorchScript exporter (and so optimum) writes. Unverified, unlike an xbackend export's map."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Mapping

import onnx

__all__ = ["NAME_SCOPES", "aligned", "last_in_scope", "name_scope_map", "scope_map"]

NAME_SCOPES = "pkg.torch.onnx.name_scopes"  # torch.onnx (dynamo) records each node's module path


def scope_map(proto: onnx.ModelProto) -> dict[str, str]:
    """Module name -> tensor, from the name scopes torch.onnx.export(dynamo=True) records on every
    node: the output of the last node each module computed (unverified, unlike an export's map)."""
    return last_in_scope(
        (next((prop.value for prop in node.metadata_props if prop.key == NAME_SCOPES), None), node.output[0])
        for node in proto.graph.node
        if node.output and node.output[0]
    )


def name_scope_map(proto: onnx.ModelProto) -> dict[str, str]:
    """Module name -> tensor, from the node names torch.onnx.export's TorchScript exporter (and so
    optimum) writes, "/model/layers.0/self_attn/q_proj/MatMul": the output of the last node in
    each module's scope (unverified: the runner checks each against the reference's value)."""
    nodes = []
    for node in proto.graph.node:
        parts = node.name.split("/")
        if len(parts) > 2 and not parts[0] and node.output and node.output[0]:
            scopes = [".".join(parts[1:k]) for k in range(2, len(parts))]
            nodes.append((repr(["", *scopes, node.op_type]), node.output[0]))
    return last_in_scope(nodes)


def aligned(mapped: Mapping[str, str], names: Collection[str]) -> dict[str, str]:
    """`mapped` (scope -> tensor) keyed by the module names `names` holds: the scopes are the
    exported module's, and the module in hand may wrap it (an adapter's `self.model`), so the
    prefix that names the most of them is put before each."""
    have = set(names)
    best, hits = "", sum(m in have for m in mapped)
    for name in sorted(have, key=len):
        if name.count(".") > 1:
            continue
        k = sum(f"{name}.{m}" in have for m in mapped)
        if k > hits:
            best, hits = f"{name}.", k
    return {best + key: value for key, value in mapped.items() if best + key in have}


def last_in_scope(nodes: Iterable[tuple[str | None, str]]) -> dict[str, str]:
    """Per module scope that torch.onnx recorded on the nodes, the output of its last node (the module's
    output)."""
    last: dict[str, str] = {}
    for raw, output in nodes:
        if not raw:
            continue
        try:
            scopes = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
        if not isinstance(scopes, list):
            continue
        for scope in scopes[1:-1]:  # [root, modules..., fx node]
            last[str(scope)] = output
    # A tensor reached by several nested modules belongs to the innermost one.
    by_tensor: dict[str, str] = {}
    for module_name, tensor in last.items():
        if tensor not in by_tensor or len(module_name) > len(by_tensor[tensor]):
            by_tensor[tensor] = module_name
    return {value: tensor for tensor, value in by_tensor.items()}
