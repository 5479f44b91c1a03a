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
        parent = self._parent
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def join(self, a: int, b: int) -> None:
        ra, rb = self.root(a), self.root(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)


def sort_nodes(g: onnx.GraphProto) -> bool:
    """Put `g`'s nodes in a topological order, in place, keeping the file's order wherever it
    already is one; whether they moved. A graph with a cycle, or a node reading what nothing
    makes, is left as it is (the checker says what is wrong with it)."""
    made = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    if all(made.get(i, -1) < k for k, n in enumerate(g.node) for i in n.input if i in made):
        return False
    waiting = [sum(1 for i in set(n.input) if i in made) for n in g.node]
    readers: dict[int, list[int]] = {}
    for k, n in enumerate(g.node):
        for i in set(n.input):
            if i in made:
                readers.setdefault(made[i], []).append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)  # the earliest in the file first: its order kept where it can be
        order.append(k)
        for r in readers.get(k, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) != len(g.node):
        return False
    nodes = [g.node[k] for k in order]
    out = [onnx.NodeProto() for _ in nodes]
    for o, n in zip(out, nodes, strict=True):
        o.CopyFrom(n)
    del g.node[:]
    g.node.extend(out)
    return True


def index_bounds(g: onnx.GraphProto, init_names: set[str]) -> dict[str, int]:
    """Graph inputs used directly as Gather indices into an initializer: the table's row count
    along the gathered axis (a token-id input's vocabulary size)."""
    inputs = {v.name for v in g.input} - init_names
    dims = {t.name: list(t.dims) for t in g.initializer}
    # the input a tensor carries unchanged in value (a Reshape, an Unsqueeze, a Squeeze, a Cast to
    # an integer type: optimum reshapes T5's input_ids before its embedding's Gather)
    carries = {name: name for name in inputs}
    for n in g.node:
        to = next((int(a.i) for a in n.attribute if a.name == "to"), TensorProto.INT64)
        if n.op_type in _SAME_VALUES and n.input and n.input[0] in carries and to in _INDEX_TYPES:
            carries[n.output[0]] = carries[n.input[0]]
    out: dict[str, int] = {}
    for ids, table, axis in _lookups(g):
        shape = dims.get(table)
        if ids in carries and shape and -len(shape) <= axis < len(shape):
            rows, source = int(shape[axis]), carries[ids]
            out[source] = min(rows, out.get(source, rows))
    return out


# ONNX Runtime's EmbedLayerNormalization: (ids input, the table it indexes), by position
_EMBED_LOOKUPS = ((0, 2), (1, 4), (8, 3))


def _lookups(g: onnx.GraphProto) -> list[tuple[str, str, int]]:
    """(indices, table, axis) of each Gather, and of each embedding EmbedLayerNormalization does."""
    out = []
    for n in g.node:
        if n.op_type == "Gather" and len(n.input) >= 2:
            out.append((n.input[1], n.input[0], next((int(a.i) for a in n.attribute if a.name == "axis"), 0)))
        elif n.op_type == "EmbedLayerNormalization" and n.domain == "com.microsoft":
            ins = [*n.input, *[""] * 9]
            out += [(ins[i], ins[t], 0) for i, t in _EMBED_LOOKUPS if ins[i] and ins[t]]
    return out


_SAME_VALUES = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast"})
_INDEX_TYPES = frozenset({TensorProto.INT32, TensorProto.INT64})
