"""Small sample models built in code, each with what it is known to do.

`models/build.py` writes them to models/; tests build them in memory. Weights
come from fixed seeds, so the same onnx version writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["SAMPLES", "Sample", "build"]

OPSET = 17
IR_VERSION = 10  # onnxruntime 1.31 reads IR <= 13; onnx 1.23 would write 14


@dataclass(frozen=True)
class Sample:
    name: str
    builder: Callable[[], onnx.ModelProto]
    known: str


class _Graph:
    """Tiny helper to add nodes and seeded initializers with readable names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def weight(self, name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
        s = scale if scale is not None else 1.0 / np.sqrt(max(1, fan_in))
        self.inits.append(
            numpy_helper.from_array((self.rng.standard_normal(shape) * s).astype(np.float32), name)
        )
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def model(
        self,
        name: str,
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
        doc: str,
        opset: int = OPSET,
    ) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        m = helper.make_model(
            g,
            opset_imports=[helper.make_opsetid("", opset)],
            producer_name="xbackend-samples",
            producer_version="1",
        )
        m.ir_version = IR_VERSION
        m.doc_string = doc
        onnx.checker.check_model(m)
        return m


def _layernorm(g: _Graph, x: str, width: int, prefix: str) -> str:
    scale = g.const(f"{prefix}.gamma", (1.0 + 0.1 * g.rng.standard_normal(width)).astype(np.float32))
    bias = g.const(f"{prefix}.beta", (0.1 * g.rng.standard_normal(width)).astype(np.float32))
    return g.op("LayerNormalization", [x, scale, bias], f"{prefix}.out", axis=-1, epsilon=1e-5)


def _linear(g: _Graph, x: str, n_in: int, n_out: int, prefix: str) -> str:
    w = g.weight(f"{prefix}.weight", (n_in, n_out))
    b = g.const(f"{prefix}.bias", (0.02 * g.rng.standard_normal(n_out)).astype(np.float32))
    return g.op("Add", [g.op("MatMul", [x, w], f"{prefix}.matmul"), b], f"{prefix}.out")


def mlp_layernorm(
    blocks: int = 6, width: int = 64, hidden: int = 128, seq: int | None = 16, batch: int | str = 1
) -> onnx.ModelProto:
    """Pre-norm residual MLP stack: x + W2·SiLU(W1·LN(x)), then a final LayerNorm.

    With `seq=None` the input is [batch, width]: one matrix product per layer whose row
    count is the batch size, which is where BLAS switches kernels (gemv vs gemm).
    """
    g = _Graph(seed=1)
    x = "x"
    for i in range(blocks):
        h = _layernorm(g, x, width, f"block{i}.ln")
        h = _linear(g, h, width, hidden, f"block{i}.fc1")
        h = g.op("Mul", [h, g.op("Sigmoid", [h], f"block{i}.sigmoid")], f"block{i}.silu")
        h = _linear(g, h, hidden, width, f"block{i}.fc2")
        x = g.op("Add", [x, h], f"block{i}.residual")
    g.op(
        "LayerNormalization",
        [
            x,
            g.const("final.gamma", np.ones(width, np.float32)),
            g.const("final.beta", np.zeros(width, np.float32)),
        ],
        "y",
        axis=-1,
    )
    dims = [batch, width] if seq is None else [batch, seq, width]
    return g.model(
        "mlp_layernorm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        f"residual MLP + LayerNorm stack, {blocks} blocks, width {width}",
    )


def convnet() -> onnx.ModelProto:
    """Two 3x3 convolutions, global average pool and a classifier; dynamic batch 'N'."""
    g = _Graph(seed=2)
    h = g.op(
        "Conv",
        ["image", g.weight("conv1.weight", (16, 3, 3, 3)), g.weight("conv1.bias", (16,), 0.05)],
        "conv1",
        pads=[1, 1, 1, 1],
    )
    h = g.op("Relu", [h], "relu1")
    h = g.op(
        "Conv",
        [h, g.weight("conv2.weight", (32, 16, 3, 3)), g.weight("conv2.bias", (32,), 0.05)],
        "conv2",
        pads=[1, 1, 1, 1],
        strides=[2, 2],
    )
    h = g.op("Relu", [h], "relu2")
    h = g.op("Flatten", [g.op("GlobalAveragePool", [h], "pool")], "flatten")
    g.op("Gemm", [h, g.weight("fc.weight", (32, 10)), g.weight("fc.bias", (10,), 0.05)], "logits")
    return g.model(
        "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        "small conv net with a dynamic batch dimension",
    )


def attention(seq: int = 32, width: int = 64, heads: int = 4) -> onnx.ModelProto:
    """One pre-norm multi-head self-attention block with a residual connection."""
    g = _Graph(seed=3)
    dh = width // heads
    h = _layernorm(g, "x", width, "ln")
    shape = g.const("heads_shape", np.array([1, seq, heads, dh], np.int64))
    qkv = {}
    for name in ("q", "k", "v"):
        p = _linear(g, h, width, width, name)
        qkv[name] = g.op(
            "Transpose", [g.op("Reshape", [p, shape], f"{name}.heads")], f"{name}.t", perm=[0, 2, 1, 3]
        )
    kt = g.op("Transpose", [qkv["k"]], "k.tt", perm=[0, 1, 3, 2])
    scores = g.op(
        "Mul",
        [
            g.op("MatMul", [qkv["q"], kt], "scores.raw"),
            g.const("scale", np.array(1.0 / np.sqrt(dh), np.float32)),
        ],
        "scores",
    )
    probs = g.op("Softmax", [scores], "probs", axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, qkv["v"]], "context")], "context.t", perm=[0, 2, 1, 3])
    merged = g.op(
        "Reshape", [ctx, g.const("merge_shape", np.array([1, seq, width], np.int64))], "context.merged"
    )
    out = _linear(g, merged, width, width, "proj")
    g.op("Add", ["x", out], "y")
    return g.model(
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, width])],
        "multi-head self-attention block",
    )


def scatter_add(points: int = 256, width: int = 4096, cells: int = 2) -> onnx.ModelProto:
    """Per-point features summed into a few cells with ScatterND(reduction='add').

    ONNX Runtime's CPU kernel splits the updates across intra-op threads and adds
    into shared cells without ordering, so with 2+ threads results vary run to run.
    """
    g = _Graph(seed=4)
    feats = g.op("MatMul", ["points", g.weight("proj.weight", (8, width))], "features")
    idx = g.const("cell_index", (np.arange(points) % cells).astype(np.int64).reshape(points, 1))
    zeros = g.const("cells_init", np.zeros((cells, width), np.float32))
    pooled = g.op("ScatterND", [zeros, idx, feats], "pooled", reduction="add")
    g.op("Relu", [pooled], "y")
    return g.model(
        "scatter_add",
        [helper.make_tensor_value_info("points", TensorProto.FLOAT, [points, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [cells, width])],
        "scatter-add pooling; nondeterministic on ONNX Runtime CPU with 2+ threads",
    )


def dot_products(k: int = 1024, n: int = 256) -> onnx.ModelProto:
    """One wide MatMul: 256 dot products of length 1024 with unit-variance weights.

    Engines block and order these sums differently; each lands a few ULPs from the
    true value, in different directions, so they differ more from each other than
    from the float64 oracle.
    """
    g = _Graph(seed=5)
    g.op("MatMul", ["x", g.weight("W", (k, n), 1.0)], "y")
    return g.model(
        "dot_products",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        "256 dot products of length 1024",
    )


def mlp_batch() -> onnx.ModelProto:
    """A deep (12-block) residual LayerNorm/MLP stack on [batch, 128] inputs, dynamic batch."""
    return mlp_layernorm(blocks=12, width=128, hidden=256, seq=None, batch="batch")


def _vi(name: str, elem: int, shape: list[Any] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _small(
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto] | None = None,
    opset: int = OPSET,
    ir: int = IR_VERSION,
) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=inits or [])
    m = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid("", opset)],
        producer_name="xbackend-samples",
        producer_version="1",
    )
    m.ir_version = ir
    onnx.checker.check_model(m)
    return m


def scalar_scale() -> onnx.ModelProto:
    """y = x * s + 1 with a 0-d scalar input s."""
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["scaled"], name="scaled"),
        helper.make_node("Add", ["scaled", "one"], ["y"], name="y"),
    ]
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    return _small(
        "scalar_scale",
        nodes,
        [_vi("x", TensorProto.FLOAT, [4, 8]), _vi("s", TensorProto.FLOAT, [])],
        [_vi("y", TensorProto.FLOAT, [4, 8])],
        [one],
    )


def bf16_chain() -> onnx.ModelProto:
    """float32 -> bfloat16 (an intermediate and an output) -> float32: ORT's run() cannot return bf16."""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["scaled"], name="scaled"),
        helper.make_node("Cast", ["scaled"], ["as_bf16"], name="as_bf16", to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["as_bf16"], ["back"], name="back", to=TensorProto.FLOAT),
        helper.make_node("Relu", ["back"], ["y"], name="y"),
        helper.make_node("Cast", ["y"], ["y_bf16"], name="y_bf16", to=TensorProto.BFLOAT16),
    ]
    w = numpy_helper.from_array(np.linspace(-2, 2, 16, dtype=np.float32).reshape(1, 16), "w")
    return _small(
        "bf16_chain",
        nodes,
        [_vi("x", TensorProto.FLOAT, [2, 16])],
        [_vi("y", TensorProto.FLOAT, [2, 16]), _vi("y_bf16", TensorProto.BFLOAT16, [2, 16])],
        [w],
    )


def fp8_chain() -> onnx.ModelProto:
    """float32 -> float8 e4m3fn (saturating) -> float32, and the float8 tensor as an output."""
    nodes = [
        helper.make_node("Cast", ["x"], ["q"], name="q", to=TensorProto.FLOAT8E4M3FN),
        helper.make_node("Cast", ["q"], ["y"], name="y", to=TensorProto.FLOAT),
    ]
    return _small(
        "fp8_chain",
        nodes,
        [_vi("x", TensorProto.FLOAT, [3, 8])],
        [_vi("y", TensorProto.FLOAT, [3, 8]), _vi("q", TensorProto.FLOAT8E4M3FN, [3, 8])],
        opset=19,
    )


def strings() -> onnx.ModelProto:
    """Lower-cases and filters a string tensor (StringNormalizer): string input and output."""
    node = helper.make_node(
        "StringNormalizer",
        ["words"],
        ["normalized"],
        name="normalized",
        case_change_action="LOWER",
        stopwords=["the"],
        locale="C",
    )
    return _small(
        "strings",
        [node],
        [_vi("words", TensorProto.STRING, [5])],
        [_vi("normalized", TensorProto.STRING, ["n"])],
    )


def split_sequence() -> onnx.ModelProto:
    """Splits rows into a sequence output (compared element by element) and counts them."""
    nodes = [
        helper.make_node("Tanh", ["x"], ["t"], name="t"),
        helper.make_node("SplitToSequence", ["t"], ["rows"], name="rows", axis=0, keepdims=0),
        helper.make_node("SequenceLength", ["rows"], ["count"], name="count"),
    ]
    seq = helper.make_value_info(
        "rows", helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    )
    return _small(
        "split_sequence",
        nodes,
        [_vi("x", TensorProto.FLOAT, [3, 5])],
        [seq, _vi("count", TensorProto.INT64, [])],
    )


def zeros_out() -> onnx.ModelProto:
    """Multiplies by zero: every output element is 0 whatever the input (a vacuous comparison)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="h"),
        helper.make_node("Mul", ["h", "zero"], ["y"], name="y"),
    ]
    w = numpy_helper.from_array(np.random.default_rng(7).standard_normal((8, 4)).astype(np.float32), "w")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    return _small(
        "zeros_out",
        nodes,
        [_vi("x", TensorProto.FLOAT, [2, 8])],
        [_vi("y", TensorProto.FLOAT, [2, 4])],
        [w, zero],
    )


def opset_future() -> onnx.ModelProto:
    """A tiny model stamped with the newest opset onnx knows (28 with onnx 1.23), IR 14."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="y")]
    return _small(
        "opset_future",
        nodes,
        [_vi("x", TensorProto.FLOAT, [4])],
        [_vi("y", TensorProto.FLOAT, [4])],
        opset=onnx.defs.onnx_opset_version(),
        ir=onnx.IR_VERSION,
    )


def gpt_batch(vocab: int = 64, width: int = 32, seq: int = 8) -> onnx.ModelProto:
    """Token + position embeddings, a causal self-attention score, and a per-row index made by a
    Range over the batch size (a shape-derived tensor that follows the batch, not the sample).

    Inputs: ids [batch, seq] int64 in [0, vocab)."""
    g = _Graph(seed=8)
    tok = g.weight("tok_emb", (vocab, width), 0.5)
    pos = g.weight("pos_emb", (seq, width), 0.5)
    g.op("Shape", ["ids"], "ids_shape")
    zero = g.const("zero_i", np.array(0, np.int64))
    one = g.const("one_i", np.array(1, np.int64))
    g.op("Gather", ["ids_shape", zero], "batch_size", axis=0)
    g.op("Gather", ["ids_shape", one], "seq_len", axis=0)
    g.op("Range", [zero, "batch_size", one], "row_index")
    g.op("Range", [zero, "seq_len", one], "positions")
    g.op("Gather", [tok, "ids"], "tok")
    g.op("Gather", [pos, "positions"], "pos")
    h = g.op("Add", ["tok", "pos"], "embed")
    row = g.op("Cast", ["row_index"], "row_f", to=TensorProto.FLOAT)
    row = g.op("Unsqueeze", [row, g.const("axes12", np.array([1, 2], np.int64))], "row_f3")
    row = g.op("Mul", [row, g.const("zero_f", np.array(0.0, np.float32))], "row_zero")
    h = g.op("Add", [h, row], "embed_rows")
    ln = _layernorm(g, h, width, "ln")
    q = _linear(g, ln, width, width, "q")
    k = _linear(g, ln, width, width, "k")
    kt = g.op("Transpose", [k], "k_t", perm=[0, 2, 1])
    scores = g.op("MatMul", [q, kt], "scores")
    probs = g.op("Softmax", [scores], "probs", axis=-1)
    ctx_ = g.op("MatMul", [probs, ln], "context")
    g.op("MatMul", [ctx_, g.weight("head", (width, vocab))], "logits")
    return g.model(
        "gpt_batch",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", seq, vocab])],
        "GPT-style embeddings and attention with a Range over the batch size",
    )


def gelu_mlp(rows: int = 16, width: int = 64, blocks: int = 3) -> onnx.ModelProto:
    """Linear layers with exact (erf) GELU between them: opset 20's Gelu op."""
    g = _Graph(7)
    x = "x"
    for i in range(blocks):
        x = g.op("Gelu", [_linear(g, x, width, width, f"l{i}")], f"l{i}.gelu")
    y = g.op("Identity", [_linear(g, x, width, width, "head")], "y")
    f = TensorProto.FLOAT
    return g.model(
        "gelu_mlp",
        [helper.make_tensor_value_info("x", f, [rows, width])],
        [helper.make_tensor_value_info(y, f, [rows, width])],
        gelu_mlp.__doc__ or "",
        opset=20,
    )


def _variance(two_pass: bool) -> onnx.ModelProto:
    g = _Graph(11)
    x = g.op("Add", ["x", g.const("offset", np.array(1000.0, np.float32))], "shifted")
    mean = g.op("ReduceMean", [x], "mean", axes=[-1], keepdims=1)
    if two_pass:
        d = g.op("Sub", [x, mean], "centered")
        var = g.op("ReduceMean", [g.op("Mul", [d, d], "centered.sq")], "var", axes=[-1], keepdims=1)
    else:
        sq = g.op("ReduceMean", [g.op("Mul", [x, x], "x.sq")], "mean.sq", axes=[-1], keepdims=1)
        var = g.op("Sub", [sq, g.op("Mul", [mean, mean], "mean.squared")], "var")
    eps = g.const("eps", np.array(1e-5, np.float32))
    inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, eps], "var.eps")], "std")], "inv.std")
    y = g.op("Mul", [g.op("Sub", [x, mean], "x.centered"), inv], "y")
    f = TensorProto.FLOAT
    name = "variance_two_pass" if two_pass else "variance_naive"
    return g.model(
        name,
        [helper.make_tensor_value_info("x", f, [32, 256])],
        [helper.make_tensor_value_info(y, f, [32, 256]), helper.make_tensor_value_info(var, f, [32, 1])],
        f"{name}: rows of mean 1000 normalized",
    )


def variance_naive() -> onnx.ModelProto:
    """Normalizes rows of mean ~1000 with the variance computed as E[x²]−E[x]² (cancels)."""
    return _variance(two_pass=False)


def variance_two_pass() -> onnx.ModelProto:
    """The same normalization with the variance computed two-pass: E[(x−E[x])²]."""
    return _variance(two_pass=True)


def layernorm_offset(rows: int = 32, width: int = 256, offset: float = 300.0) -> onnx.ModelProto:
    """LayerNormalization over rows whose mean (300) is 300x their spread, between two Linears: a
    one-pass variance (E[x²]−E[x]²) loses most of its digits there, a two-pass one does not."""
    g = _Graph(13)
    h = g.op("Add", ["x", g.const("offset", np.array(offset, np.float32))], "shifted")
    h = _layernorm(g, h, width, "ln")
    y = g.op("Identity", [_linear(g, h, width, width, "head")], "y")
    f = TensorProto.FLOAT
    return g.model(
        "layernorm_offset",
        [helper.make_tensor_value_info("x", f, [rows, width])],
        [helper.make_tensor_value_info(y, f, [rows, width])],
        layernorm_offset.__doc__ or "",
    )


SAMPLES: dict[str, Sample] = {
    s.name: s
    for s in (
        Sample(
            "mlp_layernorm",
            mlp_layernorm,
            "deterministic on ort-cpu and reference; ort-cpu differs from reference by a few ULPs",
        ),
        Sample("convnet", convnet, "dynamic batch 'N': needs --shape image=N,3,32,32"),
        Sample("attention", attention, "deterministic on ort-cpu; Softmax/MatMul differ from reference"),
        Sample(
            "scatter_add",
            scatter_add,
            "nondeterministic run to run on ort-cpu with 2 threads (ScatterND add race)",
        ),
        Sample(
            "mlp_batch",
            mlp_batch,
            "dynamic batch: ort-cpu and openvino-cpu are batch-invariant; reference is not, and its "
            "error grows with depth",
        ),
        Sample(
            "dot_products",
            dot_products,
            "ort-cpu and openvino-cpu differ more from each other than from the float64 oracle",
        ),
        Sample("scalar_scale", scalar_scale, "a 0-d scalar input: fed with shape (), not [1]"),
        Sample(
            "bf16_chain",
            bf16_chain,
            "bfloat16 intermediate and output: ort-cpu reads them through OrtValues; equals the reference",
        ),
        Sample("fp8_chain", fp8_chain, "float8 e4m3fn output: stored and compared bit for bit"),
        Sample("strings", strings, "string input and output (StringNormalizer): compared exactly"),
        Sample("split_sequence", split_sequence, "a sequence output, compared element by element (rows[i])"),
        Sample("zeros_out", zeros_out, "every output is 0: agreement is vacuous and the verdict says so"),
        Sample(
            "opset_future",
            opset_future,
            "stamped with onnx's newest opset: ONNX Runtime cannot load it, the reference evaluator runs it",
        ),
        Sample(
            "gelu_mlp", gelu_mlp, "exact GELU: a tanh-approximating engine has its origins at the Gelu nodes"
        ),
        Sample(
            "variance_naive",
            variance_naive,
            "E[x²]−E[x]² on rows of mean 1000: ill-conditioned at var on every engine",
        ),
        Sample(
            "variance_two_pass", variance_two_pass, "the two-pass twin of variance_naive: well conditioned"
        ),
        Sample(
            "layernorm_offset",
            layernorm_offset,
            "LayerNormalization over rows of mean 300x their spread: a one-pass variance is an origin there",
        ),
        Sample(
            "gpt_batch",
            gpt_batch,
            "dynamic batch; a Range over the batch size is shape-derived: the batch probe leaves it out",
        ),
    )
}


def build(name: str) -> onnx.ModelProto:
    """Build the sample model called `name`."""
    return SAMPLES[name].builder()
