"""Where one sample sits in each tensor of a batched run, for the batch probe.

A sample's elements are found by shape: the batched tensor equals the single-sample one
except along one axis, B times longer. There sample i is the block [i*n, (i+1)*n) of that
axis: n = 1 for a batch axis of its own, n = T where a view merged the batch with the next
axis (HF GPT-2 runs its MLP on `[B*T, C]` rows). Transposes move the axis; elementwise ops,
matmuls and normalizations keep it.

Shapes alone cannot tell batch-major rows from interleaved ones (`[T, B, C]` reshaped to
`[T*B, C]`), nor a concat along the batch from a merge. So the graph is followed: a Reshape
or Flatten keeps the sample's elements in blocks only when it keeps the number of elements
before the batch axis; any other op may change the block only to 1. Past a node that breaks
this rule, the probe cannot locate the sample: those tensors are listed with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from xbackend.model.load import ModelSpec

__all__ = ["VIEWS", "Layout", "batch_layouts", "computed_by", "sample"]

# Ops that only move or copy bits: a difference in their output was made upstream.
VIEWS = frozenset(
    {
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Identity",
        "Split",
        "Slice",
        "Concat",
        "Gather",
        "GatherElements",
        "GatherND",
        "Expand",
        "Tile",
        "Pad",
        "DepthToSpace",
        "SpaceToDepth",
    }
)
_MERGING = frozenset({"Reshape", "Flatten"})


@dataclass(frozen=True)
class Layout:
    """Sample i is the block [i*block, (i+1)*block) along `axis` of the batched tensor."""

    axis: int
    block: int


def _axis(single: tuple[int, ...], batched: tuple[int, ...], batch: int) -> Layout | None:
    """The one axis along which `batched` is `batch` times `single`, the rest equal."""
    if len(single) != len(batched) or batch < 2:
        return None
    for k, (s, b) in enumerate(zip(single, batched, strict=True)):
        if s > 0 and b == batch * s and single[:k] == batched[:k] and single[k + 1 :] == batched[k + 1 :]:
            return Layout(k, s)
    return None


def batch_layouts(
    spec: ModelSpec,
    single: Mapping[str, tuple[int, ...]],
    batched: Mapping[str, tuple[int, ...]],
    batch: int,
    carries: set[str],
) -> tuple[dict[str, Layout], dict[str, str]]:
    """(tensor -> where the sample sits, tensor -> why the probe cannot compare it) for every
    tensor captured on both sides; graph inputs in `carries` have the batch on axis 0."""
    layouts: dict[str, Layout] = {
        input_name: Layout(0, 1) for input_name in spec.input_names if input_name in carries
    }
    downstream = set(carries)  # computed from the batched inputs at all, their shapes included
    for tensor in spec.tensors:
        if tensor.subgraph or any(input_name in downstream for input_name in tensor.inputs):
            downstream.add(tensor.name)
    lost: dict[str, str] = {}  # tensors past a node that broke the sample's blocks: why
    left_out: dict[str, str] = {}
    for tensor in spec.tensors:
        name = tensor.name
        data_in = [input_name for input_name in tensor.inputs if input_name in carries]
        broken = next((lost[input_name] for input_name in data_in if input_name in lost), None)
        if name not in single or name not in batched:
            if broken is not None:
                lost[name] = broken
            continue
        s, b = single[name], batched[name]
        if name not in carries:
            left_out[name] = (
                "shape-derived: follows the batch size, not the sample"
                if name in downstream
                else "does not depend on the batched inputs"
            )
            continue
        if broken is not None:
            lost[name] = left_out[name] = broken
            continue
        lay = _axis(s, b, batch)
        if lay is None:
            left_out[name] = (
                f"no axis holds the batch ({list(s)} alone, {list(b)} batched): samples mixed or selected"
            )
            continue
        known = [(input_name, layouts[input_name]) for input_name in data_in if input_name in layouts]
        if known and not _keeps_blocks(tensor.op_type, lay, b, known, batched):
            why = f"from {name} ({tensor.op_type}) on, the batch is interleaved with another axis"
            lost[name] = left_out[name] = why
            continue
        layouts[name] = lay
    return layouts, left_out


def _keeps_blocks(
    op: str,
    out: Layout,
    out_shape: tuple[int, ...],
    inputs: list[tuple[str, Layout]],
    batched: Mapping[str, tuple[int, ...]],
) -> bool:
    if op in _MERGING:
        name, lay = inputs[0]
        if name not in batched:
            return True
        # flat order is kept: the blocks line up when the elements before the batch axis do
        return math.prod(batched[name][: lay.axis]) == math.prod(out_shape[: out.axis])
    return out.block == 1 or any(lay.block == out.block for _, lay in inputs)


def sample(a: np.ndarray, lay: Layout, pos: int) -> np.ndarray:
    """The block of sample `pos` in batched `a` (a view)."""
    idx: list[slice] = [slice(None)] * a.ndim
    idx[lay.axis] = slice(pos * lay.block, (pos + 1) * lay.block)
    return a[tuple(idx)]


def computed_by(spec: ModelSpec, name: str, compared: set[str]) -> str:
    """The tensor whose op computed the bits of `name`: up through views whose input the
    probe did not compare (a view copies bits; the difference was made where they came from)."""
    producer = {tensor.name: tensor for tensor in spec.tensors}
    x = name
    while x in producer and producer[x].op_type in VIEWS and producer[x].inputs:
        up = producer[x].inputs[0]
        if up in compared or up not in producer:
            break
        x = up
    return x
