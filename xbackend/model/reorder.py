"""Reductions summed in another order: the graph rewrite behind the noise floor.

A reduction's result depends on the order of its terms, and every engine picks
its own. To measure how far legitimate orders move each tensor, the model is
rewritten so the engine itself sums in a permuted order: the reduced axis of
every operand is gathered through a permutation (and the output gathered back
where the reduced axis survives, as in a softmax). The permutations are graph
inputs, so one build runs any number of orders; feeding the identity runs the
rewritten graph in its original order.

The rewrite keeps weights where they are (an initializer is gathered by a node,
never copied), so models past 2 GiB stay external. Covered: MatMul, Gemm, Conv,
ConvTranspose, Einsum, the summing Reduce* ops, Softmax/LogSoftmax,
LayerNormalization, Group/InstanceNormalization, Attention and the scatters that add or
multiply colliding updates; every reduction
left as it is comes back in `Reordered.skipped` with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["PREFIX", "Reordered", "Site", "index_feeds", "reorder", "static_shapes"]

PREFIX = "xb.perm."  # graph inputs and tensors the rewrite adds
Shape = tuple[int, ...]

_SUMMING_REDUCE = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceProd",
    }
)


@dataclass(frozen=True)
class Site:
    """One reduction whose terms the rewrite permutes.

    `indices`: the index inputs it added, each (graph input, "perm" | "inverse", groups): a
    permutation q of `length` terms, or its inverse, repeated for each of `groups` blocks."""

    node: str
    op_type: str
    output: str
    length: int
    indices: tuple[tuple[str, str, int], ...]


@dataclass(frozen=True)
class Reordered:
    """The rewritten model, the reductions it permutes and those it leaves (node, op, why)."""

    proto: onnx.ModelProto
    sites: tuple[Site, ...]
    skipped: tuple[tuple[str, str, str], ...]


def static_shapes(proto: onnx.ModelProto) -> dict[str, Shape]:
    """Shapes the model states with every dimension known: initializers, inputs, value_info."""
    graph = proto.graph
    out: dict[str, Shape] = {
        initializer.name: tuple(int(dim) for dim in initializer.dims) for initializer in graph.initializer
    }
    for vi in (*graph.input, *graph.value_info, *graph.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        dims = tt.shape.dim
        if all(dim.HasField("dim_value") for dim in dims):
            out.setdefault(vi.name, tuple(int(dim.dim_value) for dim in dims))
    return out


def index_feeds(reordered: Reordered, rng: np.random.Generator | None) -> dict[str, np.ndarray]:
    """Values for the rewrite's index inputs: one random order per site (the identity when
    `rng` is None)."""
    out: dict[str, np.ndarray] = {}
    for site in reordered.sites:
        order = np.arange(site.length, dtype=np.int64) if rng is None else rng.permutation(site.length)
        inv = np.empty_like(order)
        inv[order] = np.arange(site.length, dtype=np.int64)
        for name, kind, groups in site.indices:
            base = order if kind == "perm" else inv
            out[name] = np.concatenate([base + g * site.length for g in range(groups)]).astype(np.int64)
    return out


class _Rewriter:
    def __init__(self, proto: onnx.ModelProto, shapes: Mapping[str, Shape]) -> None:
        self.proto = proto
        self.g = proto.graph
        self.shapes = dict(shapes)
        self.opset = next(
            (opset.version for opset in proto.opset_import if opset.domain in ("", "ai.onnx")),
            onnx.defs.onnx_opset_version(),
        )
        self.consts = {initializer.name: initializer for initializer in self.g.initializer}
        for node in self.g.node:
            if (
                node.op_type == "Constant"
                and node.output
                and node.attribute
                and node.attribute[0].name == "value"
            ):
                self.consts[node.output[0]] = node.attribute[0].t
        self.sites: list[Site] = []
        self.skipped: list[tuple[str, str, str]] = []
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    # -- helpers -----------------------------------------------------------------------------

    def rank(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return None if shape is None else len(shape)

    def dim(self, name: str, axis: int) -> int | None:
        shape = self.shapes.get(name)
        if shape is None or not -len(shape) <= axis < len(shape):
            return None
        return shape[axis]

    def _new_site(self) -> tuple[str, list[tuple[str, str, int]]]:
        """A fresh name prefix for one site's index inputs, and the list they go into."""
        self.count += 1
        return f"{PREFIX}{self.count}", []

    def _index(self, base: str, idx: list[tuple[str, str, int]], kind: str, groups: int, length: int) -> str:
        name = f"{base}.{kind}" + (f".g{groups}" if groups > 1 else "")
        if all(i[0] != name for i in idx):
            idx.append((name, kind, groups))
            self.g.input.append(helper.make_tensor_value_info(name, TensorProto.INT64, [groups * length]))
        return name

    def _gather(self, src: str, index: str, axis: int) -> str:
        out = f"{index}.of.{src}.a{axis}"
        self.nodes.append(helper.make_node("Gather", [src, index], [out], axis=axis, name=f"{out}.gather"))
        return out

    def _finish(self, node: onnx.NodeProto, length: int, idx: list[tuple[str, str, int]]) -> None:
        self.sites.append(
            Site(node.name, node.op_type, node.output[0] if node.output else "", length, tuple(idx))
        )

    def skip(self, node: onnx.NodeProto, why: str) -> None:
        self.skipped.append((node.name, node.op_type, why))
        self.nodes.append(node)

    def permute_inputs(self, node: onnx.NodeProto, axes: Mapping[int, tuple[int, int]], n: int) -> None:
        """Gather input i of `node` on axes[i] = (axis, groups) through one permutation of n terms."""
        base, idx = self._new_site()
        new = onnx.NodeProto()
        new.CopyFrom(node)
        for i, (axis, groups) in axes.items():
            index = self._index(base, idx, "perm", groups, n)
            new.input[i] = self._gather(node.input[i], index, axis)
        self.nodes.append(new)
        self._finish(node, n, idx)

    def permute_through(self, node: onnx.NodeProto, axes: Mapping[int, int], out_axis: int, n: int) -> None:
        """Gather the inputs named in `axes` along their axis, then output 0 back along out_axis."""
        base, idx = self._new_site()
        perm = self._index(base, idx, "perm", 1, n)
        inv = self._index(base, idx, "inverse", 1, n)
        new = onnx.NodeProto()
        new.CopyFrom(node)
        for key, axis in axes.items():
            new.input[key] = self._gather(node.input[key], perm, axis)
        output_name = node.output[0]
        new.output[0] = f"{base}.out.{output_name}"
        self.nodes.append(new)
        self.nodes.append(
            helper.make_node(
                "Gather", [new.output[0], inv], [output_name], axis=out_axis, name=f"{base}.back"
            )
        )
        self._finish(node, n, idx)

    # -- one op each ---------------------------------------------------------------------------

    def matmul(self, node: onnx.NodeProto) -> None:
        left, right = node.input[0], node.input[1]
        ra, rb = self.rank(left), self.rank(right)
        if ra is None or rb is None:
            return self.skip(node, "operand shapes unknown")
        inner = self.dim(left, -1)
        if not inner or inner < 2:
            return self.skip(node, "fewer than 2 terms")
        self.permute_inputs(node, {0: (ra - 1, 1), 1: (rb - 2 if rb >= 2 else 0, 1)}, inner)

    def gemm(self, node: onnx.NodeProto) -> None:
        at = {attribute.name: attribute.i for attribute in node.attribute}
        a_axis = 0 if at.get("transA", 0) else 1
        b_axis = 1 if at.get("transB", 0) else 0
        inner = self.dim(node.input[0], a_axis)
        if not inner or inner < 2:
            return self.skip(node, "operand shapes unknown" if inner is None else "fewer than 2 terms")
        self.permute_inputs(node, {0: (a_axis, 1), 1: (b_axis, 1)}, inner)

    def conv(self, node: onnx.NodeProto, transpose: bool) -> None:
        groups = next((attribute.i for attribute in node.attribute if attribute.name == "group"), 1)
        channels = self.dim(node.input[0], 1)
        if channels is None or self.rank(node.input[1]) is None:
            return self.skip(node, "operand shapes unknown")
        per_group = channels // groups
        if per_group < 2:
            return self.skip(node, "one input channel per group: the sum over kernel taps is not gathered")
        w_axis, w_groups = (0, groups) if transpose else (1, 1)
        self.permute_inputs(node, {0: (1, groups), 1: (w_axis, w_groups)}, per_group)

    def einsum(self, node: onnx.NodeProto) -> None:
        eq = next(
            (attribute.s.decode() for attribute in node.attribute if attribute.name == "equation"), ""
        ).replace(" ", "")
        if "..." in eq:
            return self.skip(node, "an equation with an ellipsis")
        lhs, _, rhs = eq.partition("->")
        terms = lhs.split(",")
        if not _:
            letters = "".join(terms)
            rhs = "".join(sorted(letter for letter in set(letters) if letters.count(letter) == 1))
        summed = [fromkey for fromkey in dict.fromkeys("".join(terms)) if fromkey not in rhs]
        if not summed or any(term.count(summed[0]) > 1 for term in terms):
            return self.skip(node, "no contracted index" if not summed else "a repeated index")
        c = summed[0]
        axes = {index: (term.index(c), 1) for index, term in enumerate(terms) if c in term}
        i0, (ax0, _g) = next(iter(axes.items()))
        length = self.dim(node.input[i0], ax0)
        if not length or length < 2:
            return self.skip(node, "operand shapes unknown" if length is None else "fewer than 2 terms")
        self.permute_inputs(node, axes, length)

    def reduce(self, node: onnx.NodeProto) -> None:
        source = node.input[0]
        rank_of = self.rank(source)
        if rank_of is None:
            return self.skip(node, "input shape unknown")
        attrs = {attribute.name: attribute for attribute in node.attribute}
        if len(node.input) > 1 and node.input[1]:
            axes_const = self.consts.get(node.input[1])
            if axes_const is None:
                return self.skip(node, "axes computed at run time")
            axes = [int(v) for v in numpy_helper.to_array(axes_const).reshape(-1)]
        else:
            axes = list(attrs["axes"].ints) if "axes" in attrs else []
        if not axes:
            if "noop_with_empty_axes" in attrs and attrs["noop_with_empty_axes"].i:
                return self.skip(node, "no axes: the op reduces nothing")
            axes = list(range(rank_of))
        long = [axis % rank_of for axis in axes if (self.dim(source, axis) or 0) >= 2]
        if not long:
            return self.skip(node, "fewer than 2 terms")
        # One permutation per reduced axis: chain a site per axis through the same node.
        current = node
        for k, axis in enumerate(long):
            length = self.dim(source, axis)
            assert length is not None
            base, idx = self._new_site()
            index = self._index(base, idx, "perm", 1, length)
            new = onnx.NodeProto()
            new.CopyFrom(current)
            new.input[0] = self._gather(current.input[0], index, axis)
            current = new
            self._finish(node, length, idx)
            if k == len(long) - 1:
                self.nodes.append(new)

    def softmax(self, node: onnx.NodeProto) -> None:
        source = node.input[0]
        r = self.rank(source)
        if r is None:
            return self.skip(node, "input shape unknown")
        default = -1 if self.opset >= 13 else 1
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), default)
        axis = axis % r if self.opset >= 13 else r - 1  # before 13: every axis from `axis` on; the last
        n = self.dim(source, axis)
        if not n or n < 2:
            return self.skip(node, "fewer than 2 terms")
        self.permute_through(node, {0: axis}, axis, n)

    def layer_norm(self, node: onnx.NodeProto) -> None:
        x = node.input[0]
        r = self.rank(x)
        n = self.dim(x, -1)
        if r is None or not n or n < 2:
            return self.skip(node, "input shape unknown" if r is None else "fewer than 2 terms")
        axes = {0: r - 1}
        for i in (1, 2):  # scale and bias follow the normalized axes (or broadcast along them)
            if len(node.input) > i and node.input[i]:
                ri = self.rank(node.input[i])
                if ri is None:
                    return self.skip(node, "scale or bias shape unknown")
                if self.dim(node.input[i], -1) == n:
                    axes[i] = ri - 1
        self.permute_through(node, axes, r - 1, n)

    def spatial_norm(self, node: onnx.NodeProto) -> None:
        x = node.input[0]
        r = self.rank(x)
        n = self.dim(x, 2) if r and r >= 3 else None
        if not n or n < 2:
            return self.skip(node, "no spatial axis of 2 or more")
        self.permute_through(node, {0: 2}, 2, n)

    def scatter(self, node: onnx.NodeProto) -> None:
        """Colliding updates are summed in the order they come: permute the updates (and their
        indices) along their first axis."""
        red = next(
            (attribute.s.decode() for attribute in node.attribute if attribute.name == "reduction"), "none"
        )
        if red not in ("add", "mul"):
            return self.nodes.append(node)
        n = self.dim(node.input[2], 0)
        if not n or n < 2 or self.rank(node.input[1]) is None:
            return self.skip(node, "updates shape unknown" if n is None else "fewer than 2 updates")
        self.permute_inputs(node, {1: (0, 1), 2: (0, 1)}, n)

    def attention(self, node: onnx.NodeProto) -> None:
        ins = list(node.input)
        if (len(ins) > 4 and any(ins[4:])) or any(node.output[1:]):
            return self.skip(node, "a key/value cache or extra outputs")
        q, k, v = ins[:3]
        if any(self.rank(t) != 4 for t in (q, k, v)):
            return self.skip(node, "3-D (packed heads) operands")
        causal = any(attribute.name == "is_causal" and attribute.i for attribute in node.attribute)
        d = self.dim(q, 3)
        if not d or d < 2:
            return self.skip(node, "fewer than 2 terms")
        # Q.K over the head dimension; then (without causal masking) the keys of softmax and P.V.
        base, idx = self._new_site()
        pd = self._index(base, idx, "perm", 1, d)
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.input[0] = self._gather(q, pd, 3)
        new.input[1] = self._gather(k, pd, 3)
        self._finish(node, d, idx)
        keys = self.dim(k, 2)
        mask = ins[3] if len(ins) > 3 else ""
        if not causal and keys and keys >= 2 and (not mask or self.dim(mask, -1) == keys):
            base, idx = self._new_site()
            pk = self._index(base, idx, "perm", 1, keys)
            new.input[1] = self._gather(new.input[1], pk, 2)
            new.input[2] = self._gather(v, pk, 2)
            if mask:
                mr = self.rank(mask)
                assert mr is not None
                new.input[3] = self._gather(mask, pk, mr - 1)
            self._finish(node, keys, idx)
        elif causal:
            self.skipped.append((node.name, node.op_type, "causal: the keys' order is the mask"))
        self.nodes.append(new)


def reorder(proto: onnx.ModelProto, shapes: Mapping[str, Shape]) -> Reordered:
    """`proto` (top-level graph; subgraphs stay as they are) with every reduction it can permute
    gathered through index inputs; `shapes` holds the run's tensor shapes (a capture's)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    rw = _Rewriter(out, {**static_shapes(proto), **shapes})
    for index, node in enumerate(out.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
        domain = node.domain or "ai.onnx"
        op = node.op_type
        if domain != "ai.onnx":
            if any(w in op for w in ("Attention", "MatMul", "Norm", "Softmax", "Gemm", "Conv")):
                rw.skip(node, f"{domain} op: its reduction is not gathered")
            else:
                rw.nodes.append(node)
        elif op == "MatMul":
            rw.matmul(node)
        elif op == "Gemm":
            rw.gemm(node)
        elif op in ("Conv", "ConvTranspose"):
            rw.conv(node, op == "ConvTranspose")
        elif op == "Einsum":
            rw.einsum(node)
        elif op in _SUMMING_REDUCE:
            rw.reduce(node)
        elif op in ("Softmax", "LogSoftmax"):
            rw.softmax(node)
        elif op == "LayerNormalization":
            rw.layer_norm(node)
        elif op in ("GroupNormalization", "InstanceNormalization"):
            rw.spatial_norm(node)
        elif op == "Attention":
            rw.attention(node)
        elif op in ("ScatterND", "ScatterElements"):
            rw.scatter(node)
        else:
            rw.nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(rw.nodes)
    return Reordered(out, tuple(rw.sites), tuple(rw.skipped))
