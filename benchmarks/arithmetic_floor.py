"""The arithmetic floor of the float64 judge: what a plain numpy float64 script takes to do each
MatMul and Gemm node's product, and its magnitude's (|A|·|B|), on the operands one run of the
model produces. No judge can cost less than this; benchmarks/explain_cost.py prints it beside
the judge's time.

Usage: python benchmarks/arithmetic_floor.py MODEL.onnx [--shape NAME=D1,D2,...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

__all__ = ["gemm_operands", "seconds"]


def gemm_operands(model: Path, shapes: Mapping[str, tuple[int, ...]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each MatMul and Gemm node's two operands (Gemm's transposes applied) in float64, from one
    ONNX Runtime run on random feeds of `shapes` (a dynamic input's sizes)."""
    import onnxruntime as ort

    proto = onnx.load(str(model))
    nodes = [n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm")]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    wanted = sorted({i for n in nodes for i in n.input[:2] if i not in inits})
    known = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.ValueInfoProto(name=t) for t in wanted if t not in known)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for i in session.get_inputs():
        dims = shapes.get(i.name) or tuple(d if isinstance(d, int) else 1 for d in i.shape)
        kind = np.int64 if "int" in i.type else np.float32
        feeds[i.name] = (
            rng.integers(0, 2, dims).astype(kind)
            if kind is np.int64
            else rng.standard_normal(dims).astype(kind)
        )
    outs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    values = {**inits, **outs}
    pairs = []
    for n in nodes:
        a, b = (np.asarray(values[i], np.float64) for i in n.input[:2])
        attrs = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        if attrs.get("transA"):
            a = a.T
        if attrs.get("transB"):
            b = b.T
        pairs.append((a, b))
    return pairs


def seconds(pairs: list[tuple[np.ndarray, np.ndarray]], repeat: int = 3) -> float:
    """Best of `repeat`: every product and its magnitude's, in float64."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for a, b in pairs:
            np.matmul(a, b)
            np.matmul(np.abs(a), np.abs(b))
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    shapes = {}
    for s in a.shape:
        name, _, dims = s.partition("=")
        shapes[name] = tuple(int(d) for d in dims.split(","))
    pairs = gemm_operands(a.model, shapes)
    flops = sum(2 * a_.size * b.shape[-1] for a_, b in pairs) * 2
    took = seconds(pairs, a.repeat)
    print(
        f"{a.model.name}: {len(pairs)} products, {flops / 1e9:.2f} GFLOP with magnitudes, "
        f"{took:.3f} s in float64"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
