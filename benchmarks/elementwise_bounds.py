"""Measure how far each engine's elementwise math functions are from the correctly rounded
result (float64 evaluated, rounded to float32), in ULP of the result (of 1.0 for results smaller than that).

Prints one row per op: the largest ULP error of numpy (the reference evaluator's kernels),
ONNX Runtime and OpenVINO (when installed) over the same inputs, and the bound
xbackend.rounding uses for two engines' difference (checked: never below the two largest
measured errors added). Run: .venv/bin/python benchmarks/elementwise_bounds.py
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

from xbackend.rounding import ROUNDING, bound_for

N = 1 << 18
FLOOR = 1.0


def _inputs(op: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    if op in ("Log", "Sqrt", "Reciprocal"):
        x = np.exp(rng.uniform(-20, 20, N))
    elif op in ("Exp",):
        x = rng.uniform(-80, 80, N)
    elif op in ("Sin", "Cos"):
        x = rng.uniform(-100, 100, N)
    else:
        x = np.concatenate([rng.uniform(-10, 10, N // 2), rng.normal(0, 1, N // 2)])
    return x.astype(np.float32)


def _truth(op: str, x: np.ndarray) -> np.ndarray:
    import math

    d = x.astype(np.float64)
    erf = np.vectorize(math.erf)
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
    return np.asarray(f(d)).astype(np.float32)


def _model(op: str) -> bytes:
    opset = 20 if op == "Gelu" else 17
    node = helper.make_node(op, ["x"], ["y"])
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])],
    )
    return helper.make_model(
        g, ir_version=9, opset_imports=[helper.make_opsetid("", opset)]
    ).SerializeToString()


def _numpy(op: str, x: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return np.asarray(ReferenceEvaluator(onnx.load_from_string(_model(op))).run(None, {"x": x})[0])


def _ort(op: str, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    s = ort.InferenceSession(_model(op), providers=["CPUExecutionProvider"])
    return np.asarray(s.run(None, {"x": x})[0])


def _openvino(op: str, x: np.ndarray) -> np.ndarray | None:
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    m = core.read_model(_model(op), b"")
    c = core.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return np.asarray(c({"x": x})[0])


def _ulps(a: np.ndarray, t: np.ndarray) -> float:
    """Largest error in ULP of each element's magnitude, or of FLOOR for smaller elements: the
    unit the scaled ULP of any tensor whose largest element reaches FLOOR is measured in."""
    ok = np.isfinite(a) & np.isfinite(t)
    unit = np.spacing(np.maximum(np.abs(t[ok]), np.float32(FLOOR)))
    err = np.abs(a[ok].astype(np.float64) - t[ok].astype(np.float64))
    return float(np.ceil((err / unit).max())) if ok.any() else 0.0


def main() -> int:
    print(f"{'op':11s} {'numpy':>6s} {'ort':>6s} {'openvino':>9s}  {'bound':>5s}  source")
    bad = 0
    for op in (
        "Exp",
        "Log",
        "Tanh",
        "Sigmoid",
        "Erf",
        "Gelu",
        "Softplus",
        "Sqrt",
        "Reciprocal",
        "Sin",
        "Cos",
    ):
        x = _inputs(op)
        t = _truth(op, x)
        errs = [_ulps(_numpy(op, x), t), _ulps(_ort(op, x), t)]
        ov = _openvino(op, x)
        errs.append(_ulps(ov, t) if ov is not None else -1)
        top = sorted(e for e in errs if e >= 0)[-2:]
        b, src = bound_for(op)
        flag = "" if b >= sum(top) else "  <- bound below the measured pair"
        bad += bool(flag)
        ovs = f"{errs[2]:9g}" if errs[2] >= 0 else f"{'-':>9s}"
        print(f"{op:11s} {errs[0]:6g} {errs[1]:6g} {ovs}  {b:5g}  {src[:60]}{flag}")
    print(f"{len(ROUNDING)} op types have a stated bound")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
