"""The graph's order and what it feeds: nodes sorted topologically where a file lists them
otherwise (ONNX Runtime's float16 converter appends its input Casts; ONNX Runtime and OpenVINO
accept that, onnx's checker and reference evaluator do not), and the tables input ids index."""

from __future__ import annotations

import heapq

import onnx
from onnx import TensorProto

__all__ = ["NodeSets", "index_bounds", "sort_nodes"]


class NodeSets:
    """Disjoint sets of node indices (union-find, path halving): nodes grouped through the tensors
    that join them (a fusion's, a candidate's kernels). Each set's root is its first node."""

    def __init__(self, n: int) -> None:
        self._parent = list(range(n))

    def root(self, k: int) -> int:
        """The representative of node `k`'s set (paths halved on the way)."""
        parent = self._parent
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def join(self, a: int, b: int) -> None:
        """Put nodes `a` and `b` in one set."""
        ra, rb = self.root(a), self.root(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)


def sort_nodes(graph: onnx.GraphProto) -> bool:
    """Put `graph`'s nodes in a topological order, in place, keeping the file's order wherever it
    already is one; whether they moved. A graph with a cycle, or a node reading what nothing
    makes, is left as it is (the checker says what is wrong with it)."""
    made = {
        output_name: index
        for index, node in enumerate(graph.node)
        for output_name in node.output
        if output_name
    }
    if all(
        made.get(input_name, -1) < index
        for index, node in enumerate(graph.node)
        for input_name in node.input
        if input_name in made
    ):
        return False
    waiting = [sum(1 for input_name in set(node.input) if input_name in made) for node in graph.node]
    readers: dict[int, list[int]] = {}
    for k, n in enumerate(graph.node):
        for i in set(n.input):
            if i in made:
                readers.setdefault(made[i], []).append(k)
    ready = [index for index, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)  # the earliest in the file first: its order kept where it can be
        order.append(k)
        for r in readers.get(k, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) != len(graph.node):
        return False
    nodes = [graph.node[k] for k in order]
    out = [onnx.NodeProto() for _ in nodes]
    for o, n in zip(out, nodes, strict=True):
        o.CopyFrom(n)
    del graph.node[:]
    graph.node.extend(out)
    return True


def index_bounds(graph: onnx.GraphProto, init_names: set[str]) -> dict[str, int]:
    """Graph inputs used directly as Gather indices into an initializer: the table's row count
    along the gathered axis (a token-id input's vocabulary size)."""
    inputs = {input_name.name for input_name in graph.input} - init_names
    dims = {initializer.name: list(initializer.dims) for initializer in graph.initializer}
    # the input a tensor carries unchanged in value (a Reshape, an Unsqueeze, a Squeeze, a Cast to
    # an integer type: optimum reshapes T5's input_ids before its embedding's Gather)
    carries = {name: name for name in inputs}
    for node in graph.node:
        to = next(
            (int(attribute.i) for attribute in node.attribute if attribute.name == "to"), TensorProto.INT64
        )
        if node.op_type in _SAME_VALUES and node.input and node.input[0] in carries and to in _INDEX_TYPES:
            carries[node.output[0]] = carries[node.input[0]]
    out: dict[str, int] = {}
    for ids, table, axis in _lookups(graph):
        shape = dims.get(table)
        if ids in carries and shape and -len(shape) <= axis < len(shape):
            rows, source = int(shape[axis]), carries[ids]
            out[source] = min(rows, out.get(source, rows))
    return out


# ONNX Runtime's EmbedLayerNormalization: (ids input, the table it indexes), by position
_EMBED_LOOKUPS = ((0, 2), (1, 4), (8, 3))


def _lookups(graph: onnx.GraphProto) -> list[tuple[str, str, int]]:
    """(indices, table, axis) of each Gather, and of each embedding EmbedLayerNormalization does."""
    out = []
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) >= 2:
            out.append(
                (
                    node.input[1],
                    node.input[0],
                    next((int(attribute.i) for attribute in node.attribute if attribute.name == "axis"), 0),
                )
            )
        elif node.op_type == "EmbedLayerNormalization" and node.domain == "com.microsoft":
            ins = [*node.input, *[""] * 9]
            out += [(ins[i], ins[t], 0) for i, t in _EMBED_LOOKUPS if ins[i] and ins[t]]
    return out


_SAME_VALUES = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast"})
_INDEX_TYPES = frozenset({TensorProto.INT32, TensorProto.INT64})
