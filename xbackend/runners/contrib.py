"""ONNX Runtime's fused kernels (domain com.microsoft) for onnx's reference evaluator, computed
from their definitions in ONNX Runtime's ContribOperators.md, in whatever precision they are fed:
float64 on the oracle, so the graph ORT really runs (its optimized model) can be judged node by
node against float64.

Here: the fusions ONNX Runtime's CPU graph optimizer makes by default, and (from
xbackend.runners.contrib_transformer) the kernels its transformer optimizer and quantizers write
into models (attention, rotary, MatMulNBits, ...), each with BOUND_OP, the judged graph's
magnitude of such a kernel. `CONTRIB_OPS` names them; an optimized graph holding any other
com.microsoft op is judged on its unfused form.

Also here: standard ops onnx's evaluator has no kernel for at the opset a model declares
(DequantizeLinear before opset 19: QDQ models from ONNX Runtime's quantizer at opset 13 to 18);
standard ops it computes below the precision it is fed (its Erf rounds
every result to float32), evaluated in the dtype they are fed instead; standard ops its kernel
gets wrong (GatherElements along an axis of over 32 entries: its np.choose fallback returns one
value, as torch.onnx's BERT position gather has); and `BELOW_FLOAT64_OPS`,
those it computes in float32 whatever it is fed, which the oracle names and does not rank.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from xbackend.runners.contrib_transformer import KERNELS, TRANSFORMER_OPS

__all__ = ["BELOW_FLOAT64_OPS", "CONTRIB_DOMAIN", "CONTRIB_OPS", "contrib_ops", "legacy_ops"]

# onnx 1.23's evaluator computes these in float32 internally, whatever it is fed
BELOW_FLOAT64_OPS = frozenset({"LinearAttention", "CausalConvWithState"})

CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_OPS = frozenset(
    {
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "FusedMatMul",
        "FusedGemm",
        "FastGelu",
        "QuickGelu",
        "BiasGelu",
        "Gelu",
        "SimplifiedLayerNormalization",  # ONNX Runtime registers it in the ONNX domain (see judge.shipped)
        *TRANSFORMER_OPS,
    }
)


def _layer_norm(s: np.ndarray, gamma: Any, beta: Any, eps: float, simplified: bool) -> Any:
    if simplified:
        rms = np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps)
        y = s / rms * gamma
    else:
        mu = np.mean(s, axis=-1, keepdims=True)
        d = s - mu
        y = d / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + eps) * gamma
    return y if beta is None else y + beta


def _stats(s: np.ndarray, eps: float, simplified: bool) -> tuple[np.ndarray, np.ndarray]:
    mu = np.zeros((*s.shape[:-1], 1), s.dtype) if simplified else np.mean(s, axis=-1, keepdims=True)
    d = s - mu
    return mu, 1 / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + eps)


def _erf(x: np.ndarray) -> Any:
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x


def _activation(y: np.ndarray, name: str, alpha: float | None, beta: float | None) -> Any:
    if not name:
        return y
    if name == "Relu":
        return np.maximum(y, 0)
    if name == "LeakyRelu":
        return np.where(y >= 0, y, (0.01 if alpha is None else alpha) * y)
    if name == "Sigmoid":
        return 1 / (1 + np.exp(-y))
    if name == "Tanh":
        return np.tanh(y)
    if name == "HardSigmoid":
        return np.clip((0.2 if alpha is None else alpha) * y + (0.5 if beta is None else beta), 0, 1)
    raise ValueError(f"activation {name} is not implemented in xbackend's float64 FusedGemm")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def contrib_ops() -> list[type]:
    """The op classes, for ReferenceEvaluator(new_ops=...); built on first use, since their base
    class loads the evaluator."""
    from onnx.reference.op_run import OpRun  # engine: onnx's reference evaluator

    from xbackend.bounds.rules import BOUND_OP  # heavy: it imports onnx (foreign workers)

    class Erf(OpRun):  # onnx's own rounds every result to float32 (np.vectorize, otypes "f")
        op_domain = ""

        def _run(self, x: Any) -> Any:
            return (_erf(x),)

    class SimplifiedLayerNormalization(OpRun):  # RMSNorm: x / sqrt(mean(x²) + eps) * scale
        op_domain = CONTRIB_DOMAIN

        def _run(
            self, x: Any, scale: Any, axis: Any = None, epsilon: Any = None, stash_type: Any = None
        ) -> Any:
            axes = tuple(range((-1 if axis is None else int(axis)) % x.ndim, x.ndim))
            eps = 1e-5 if epsilon is None else float(epsilon)
            inv = 1 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
            return _named(self, ((x * inv * scale).astype(x.dtype), inv.astype(x.dtype)))

    class Gelu(OpRun):  # com.microsoft's: the exact (erf) form
        op_domain = CONTRIB_DOMAIN

        def _run(self, x: Any, **_: Any) -> Any:  # onnx binds the standard Gelu's approximate
            return ((0.5 * x * (1 + _erf(x / math.sqrt(2)))).astype(x.dtype),)

    class SkipLayerNormalization(OpRun):
        op_domain = CONTRIB_DOMAIN

        def _run(
            self, x: Any, skip: Any, gamma: Any, beta: Any = None, bias: Any = None, epsilon: Any = None
        ) -> Any:
            eps = 1e-12 if epsilon is None else float(epsilon)
            s = x + skip + (0 if bias is None else bias)
            y = _layer_norm(s, gamma, beta, eps, False)
            return _named(self, (y, *_stats(s, eps, False), s))

    class SkipSimplifiedLayerNormalization(OpRun):
        op_domain = CONTRIB_DOMAIN

        def _run(self, x: Any, skip: Any, gamma: Any, bias: Any = None, epsilon: Any = None) -> Any:
            eps = 1e-12 if epsilon is None else float(epsilon)
            s = x + skip + (0 if bias is None else bias)
            y = _layer_norm(s, gamma, None, eps, True)
            return _named(self, (y, *_stats(s, eps, True), s))

    class FusedMatMul(OpRun):
        op_domain = CONTRIB_DOMAIN

        def _run(
            self,
            a: Any,
            b: Any,
            alpha: Any = None,
            transA: Any = None,
            transB: Any = None,
            transBatchA: Any = None,
            transBatchB: Any = None,
        ) -> Any:
            if transBatchA or transBatchB:
                raise ValueError(
                    "FusedMatMul with transBatchA/B is not implemented in xbackend's float64 kernels"
                )
            if transA:
                a = np.swapaxes(a, -1, -2)
            if transB:
                b = np.swapaxes(b, -1, -2)
            return (np.matmul(a, b) * (1.0 if alpha is None else float(alpha)),)

    class FusedGemm(OpRun):
        op_domain = CONTRIB_DOMAIN

        def _run(
            self,
            a: Any,
            b: Any,
            c: Any = None,
            alpha: Any = None,
            beta: Any = None,
            transA: Any = None,
            transB: Any = None,
            activation: Any = None,
            activation_alpha: Any = None,
            activation_beta: Any = None,
            activation_gamma: Any = None,
        ) -> Any:
            a = a.T if transA else a
            b = b.T if transB else b
            y = (1.0 if alpha is None else float(alpha)) * (a @ b)
            if c is not None:
                y = y + (1.0 if beta is None else float(beta)) * c
            return (_activation(y, _text(activation), activation_alpha, activation_beta),)

    class FastGelu(OpRun):
        op_domain = CONTRIB_DOMAIN

        def _run(self, x: Any, bias: Any = None) -> Any:
            v = x if bias is None else x + bias
            cube = v * v * v  # v**3 calls pow: five times slower
            return (0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * cube))),)

    class QuickGelu(OpRun):
        op_domain = CONTRIB_DOMAIN

        def _run(self, x: Any, alpha: Any = None) -> Any:
            a = 1.702 if alpha is None else float(alpha)
            return (x / (1 + np.exp(-a * x)),)

    class BiasGelu(OpRun):
        op_domain = CONTRIB_DOMAIN

        def _run(self, a: Any, b: Any) -> Any:
            v = a + b
            return (0.5 * v * (1 + _erf(v / math.sqrt(2))),)

    class GatherElements(OpRun):  # onnx 1.23's fails past 32 entries on the axis (np.choose)
        op_domain = ""

        def _run(self, data: Any, indices: Any, axis: Any = None) -> Any:
            ax = int(axis or 0) % data.ndim
            idx = np.where(indices < 0, indices + data.shape[ax], indices)
            return (np.take_along_axis(data, idx.astype(np.int64), axis=ax),)

    def _bound(self: Any, *inputs: Any, of: Any = None, **attrs: Any) -> Any:
        return (KERNELS[_text(of)](*inputs, want=True, **attrs)[1],)

    # a kernel's bound (or EmbedLayerNormalization's sum), for the judged graph
    bound = type(BOUND_OP, (OpRun,), {"op_domain": CONTRIB_DOMAIN, "_run": _bound})

    return [
        *(_kernel(OpRun, name) for name in sorted(KERNELS)),
        bound,
        Erf,
        GatherElements,
        SimplifiedLayerNormalization,
        Gelu,
        SkipLayerNormalization,
        SkipSimplifiedLayerNormalization,
        FusedMatMul,
        FusedGemm,
        FastGelu,
        QuickGelu,
        BiasGelu,
    ]


def _named(op: Any, outs: Any) -> tuple[Any, ...]:
    """As many outputs as the node lists."""
    return tuple(outs[: len(op.onnx_node.output)])


def _kernel(base: type, name: str) -> type:
    """An evaluator op for KERNELS[name]: float results in the dtype of its first float input."""
    kernel = KERNELS[name]

    def _run(self: Any, *inputs: Any, **attrs: Any) -> Any:
        floats = [i.dtype for i in inputs if isinstance(i, np.ndarray) and i.dtype.kind == "f"]
        outs = [np.asarray(o) for o in kernel(*inputs, **attrs)[0]]
        return _named(
            self, [out.astype(floats[0]) if floats and out.dtype.kind == "f" else out for out in outs]
        )

    return type(name, (base,), {"op_domain": CONTRIB_DOMAIN, "_run": _run})


def legacy_ops(opset: int) -> list[type]:
    """Kernels for the model's opset where onnx's evaluator has none: DequantizeLinear 10-18 as
    its opset-19 kernel, whose integer inputs, per-tensor and per-axis scales are the same op (19
    added float8 inputs, which older models cannot hold)."""
    if opset >= 19:
        return []
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_19  # engine: onnx's evaluator

    class DequantizeLinear(DequantizeLinear_19):
        op_domain = ""

        # the evaluator binds the newest schema's attributes; 10-18 have only axis
        def _run(self, x: Any, x_scale: Any, x_zero_point: Any = None, axis: int = 1, **_: Any) -> Any:  # type: ignore[override]
            return super()._run(x, x_scale, x_zero_point, axis)

    return [DequantizeLinear]
