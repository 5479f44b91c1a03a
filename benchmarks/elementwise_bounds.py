"""Measure each engine's elementwise math functions against float64, element by element.

For every op and engine (numpy through onnx's reference evaluator, ONNX Runtime, OpenVINO f32),
over 2^18 float32 inputs per range, the largest error of the float32 result against the float64
value of the same function on the same (exact) float32 input, in units of u·|f(x)| (u = 2^-24,
the unit roundoff of float32: a correctly rounded result is within 1 of them). This is the
relative accuracy xbackend.bounds.element allows each op (the largest engine's, doubled for other
instruction sets and rounded up to a power of 2); the script fails when a measured error is
past the bound in use. Elements where the float64 value is below float32's smallest normal
are left out (flushing them is an engine's right).

Run: .venv/bin/python benchmarks/elementwise_bounds.py [--json OUT]
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

from xbackend.bounds.element import ELEMENTWISE, U32

N = 1 << 18

# Input ranges per op: where models put them (activations, attention logits, rotary angles).
RANGES: dict[str, tuple[tuple[float, float], ...]] = {
    "Exp": ((-87, 88), (-1, 1)),
    "Log": ((1e-30, 1e30), (0.5, 2)),
    "Tanh": ((-10, 10), (-1e-3, 1e-3)),
    "Sigmoid": ((-80, 80), (-1, 1)),
    "Erf": ((-6, 6), (-1e-3, 1e-3)),
    "Gelu": ((-10, 10), (-1e-3, 1e-3)),
    "Softplus": ((-80, 80), (-1, 1)),
    "Sqrt": ((1e-30, 1e30), (0.5, 2)),
    "Reciprocal": ((1e-30, 1e30), (-2, 2)),
    "Sin": ((-2048, 2048), (-1, 1)),
    "Cos": ((-2048, 2048), (-1, 1)),
}


def _inputs(op: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    parts = []
    for lo, hi in RANGES[op]:
        if lo > 0 and hi / lo > 1e3:  # log-uniform over a wide positive range
            parts.append(np.exp(rng.uniform(math.log(lo), math.log(hi), N)))
        else:
            parts.append(rng.uniform(lo, hi, N))
    return np.concatenate(parts).astype(np.float32)


def _truth(op: str, x: np.ndarray) -> np.ndarray:
    d = x.astype(np.float64)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    f = {
        "Exp": np.exp,
        "Log": np.log,
        "Tanh": np.tanh,
        "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
        "Erf": erf,
        "Gelu": lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))),
        "Softplus": lambda v: np.log1p(np.exp(v)),
        "Sqrt": np.sqrt,
        "Reciprocal": lambda v: 1 / v,
        "Sin": np.sin,
        "Cos": np.cos,
    }[op]
    with np.errstate(over="ignore"):
        return np.asarray(f(d), np.float64)


def _model(op: str, n: int) -> bytes:
    opset = 20 if op == "Gelu" else 17
    node = helper.make_node(op, ["x"], ["y"])
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
    )
    return helper.make_model(
        g, ir_version=9, opset_imports=[helper.make_opsetid("", opset)]
    ).SerializeToString()


def _numpy(op: str, x: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return np.asarray(ReferenceEvaluator(onnx.load_from_string(_model(op, x.size))).run(None, {"x": x})[0])


def _ort(op: str, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    s = ort.InferenceSession(_model(op, x.size), providers=["CPUExecutionProvider"])
    return np.asarray(s.run(None, {"x": x})[0])


def _openvino(op: str, x: np.ndarray) -> np.ndarray | None:
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    m = core.read_model(_model(op, x.size), b"")
    c = core.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return np.asarray(c({"x": x})[0])


def relative_error(a: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Largest |a - t| / (u·|t|) over elements whose float64 value is a finite normal float32,
    and the input position of it (index)."""
    ok = np.isfinite(t) & (np.abs(t) >= np.finfo(np.float32).tiny) & (np.abs(t) <= np.finfo(np.float32).max)
    if not ok.any():
        return 0.0, -1
    err = np.abs(a.astype(np.float64) - t) / (U32 * np.abs(t))
    err[~ok] = 0.0
    i = int(np.argmax(err))
    return float(err[i]), i


def main() -> int:
    out: dict[str, dict[str, float]] = {}
    print(f"{'op':11s} {'numpy':>8s} {'ort':>8s} {'openvino':>9s}  {'bound':>6s}  (units of u·|f(x)|)")
    bad = 0
    for op in RANGES:
        x = _inputs(op)
        t = _truth(op, x)
        row: dict[str, float] = {}
        for engine, fn in (("numpy", _numpy), ("ort", _ort), ("openvino", _openvino)):
            y = fn(op, x)
            if y is not None:
                row[engine], _ = relative_error(y, t)
        bound = ELEMENTWISE[op][0]
        worst = max(row.values())
        flag = "" if worst <= bound else "  <-- past the bound"
        bad += bool(flag)
        cells = " ".join(f"{row.get(e, float('nan')):8.2f}" for e in ("numpy", "ort")) + (
            f" {row.get('openvino', float('nan')):9.2f}"
        )
        print(f"{op:11s} {cells}  {bound:6g}{flag}")
        out[op] = {**row, "bound": bound}
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        with open(sys.argv[2], "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
