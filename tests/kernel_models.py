"""Small models of the kernels ONNX Runtime's transformer optimizer and quantizers write
(com.microsoft), each with the feeds' ranges it needs: built here, random weights (seed 0)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

F = TensorProto.FLOAT
B, S, P, N, NK, H = 2, 5, 3, 4, 2, 8
D = N * H
Ranges = dict[str, tuple[int, int]]


def _model(
    nodes: list[onnx.NodeProto],
    ins: list[onnx.ValueInfoProto],
    outs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto],
    opset: int = 17,
) -> onnx.ModelProto:
    g = oh.make_graph(nodes, "kernel", ins, outs, inits)
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m


def _in(name: str, shape: list[int], dtype: int = F) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, dtype, shape)


def _out(name: str, rank: int) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, F, [f"{name}_{i}" for i in range(rank)])


def _w(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def _rope(h: int) -> list[onnx.TensorProto]:
    angle = np.arange(64)[:, None] * 10000.0 ** (-np.arange(h // 2) / (h // 2))
    return [
        numpy_helper.from_array(np.cos(angle).astype(np.float32), "cos"),
        numpy_helper.from_array(np.sin(angle).astype(np.float32), "sin"),
    ]


def attention() -> tuple[onnx.ModelProto, Ranges]:
    """BERT/GPT-2's fused attention: packed QKV weights, a 2D mask, past, causal."""
    rng = np.random.default_rng(0)
    n = oh.make_node(
        "Attention",
        ["x", "wqkv", "bqkv", "mask", "past"],
        ["y", "present"],
        domain="com.microsoft",
        num_heads=N,
        unidirectional=1,
    )
    ins = [_in("x", [B, S, D]), _in("mask", [B, P + S], TensorProto.INT32), _in("past", [2, B, N, P, H])]
    return _model(
        [n], ins, [_out("y", 3), _out("present", 5)], [_w(rng, "wqkv", D, 3 * D), _w(rng, "bqkv", 3 * D)]
    ), {"mask": (1, 2)}


def multihead_attention() -> tuple[onnx.ModelProto, Ranges]:
    """Q, K, V with a bias, a key padding mask and past, causal."""
    rng = np.random.default_rng(1)
    n = oh.make_node(
        "MultiHeadAttention",
        ["q", "k", "v", "bias", "mask", "", "pk", "pv"],
        ["y", "pko", "pvo"],
        domain="com.microsoft",
        num_heads=N,
        unidirectional=1,
    )
    ins = [
        _in("q", [B, S, D]),
        _in("k", [B, S, D]),
        _in("v", [B, S, D]),
        _in("mask", [B, P + S], TensorProto.INT32),
        _in("pk", [B, N, P, H]),
        _in("pv", [B, N, P, H]),
    ]
    outs = [_out("y", 3), _out("pko", 4), _out("pvo", 4)]
    return _model([n], ins, outs, [_w(rng, "bias", 3 * D)]), {"mask": (1, 2)}


def group_query_attention(b: int = 1, s: int = S, p: int = P) -> tuple[onnx.ModelProto, Ranges]:
    """Llama's: 4 query heads over 2 KV heads of 16 (ONNX Runtime's CPU kernel takes multiples of
    16), rotary, past; a prompt (batch 1) or a step."""
    h = 16
    n = oh.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin"],
        ["y", "pko", "pvo"],
        domain="com.microsoft",
        num_heads=N,
        kv_num_heads=NK,
        do_rotary=1,
    )
    ins = [
        _in("q", [b, s, N * h]),
        _in("k", [b, s, NK * h]),
        _in("v", [b, s, NK * h]),
        _in("pk", [b, NK, p, h]),
        _in("pv", [b, NK, p, h]),
        _in("seqlens", [b], TensorProto.INT32),
        _in("total", [], TensorProto.INT32),
    ]
    outs = [_out("y", 3), _out("pko", 4), _out("pvo", 4)]
    return _model([n], ins, outs, _rope(h)), {"seqlens": (p + s - 1, p + s), "total": (p + s, p + s + 1)}


def rotary_embedding() -> tuple[onnx.ModelProto, Ranges]:
    """4D interleaved, and 3D with num_heads."""
    n1 = oh.make_node(
        "RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y1"], domain="com.microsoft", interleaved=1
    )
    n2 = oh.make_node(
        "RotaryEmbedding", ["x3", "pos", "cos", "sin"], ["y2"], domain="com.microsoft", num_heads=N
    )
    ins = [_in("x", [B, N, S, H]), _in("x3", [B, S, D]), _in("pos", [B, S], TensorProto.INT64)]
    return _model([n1, n2], ins, [_out("y1", 4), _out("y2", 3)], _rope(H)), {"pos": (0, 40)}


def matmul_nbits(level: int = 0) -> tuple[onnx.ModelProto, Ranges]:
    """A MatMul quantized to 4 bits by ONNX Runtime's quantizer (blocks of 32, zero points)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer  # heavy: ORT's quantizer

    rng = np.random.default_rng(2)
    m = _model(
        [oh.make_node("MatMul", ["x", "W"], ["y"])],
        [_in("x", [B, S, 64])],
        [_out("y", 3)],
        [_w(rng, "W", 64, 24)],
        opset=21,
    )
    q = MatMulNBitsQuantizer(m, block_size=32, is_symmetric=False, accuracy_level=level)
    q.process()
    return q.model.model, {}


KERNELS: dict[str, Callable[[], tuple[onnx.ModelProto, Ranges]]] = {
    "Attention": attention,
    "MultiHeadAttention": multihead_attention,
    "GroupQueryAttention": group_query_attention,
    "GroupQueryAttention-step": lambda: group_query_attention(2, 1, 6),
    "RotaryEmbedding": rotary_embedding,
    "MatMulNBits": matmul_nbits,
    "MatMulNBits-int8": lambda: matmul_nbits(4),
}
