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
        std = scale if scale is not None else 1.0 / np.sqrt(max(1, fan_in))
        self.inits.append(
            numpy_helper.from_array((self.rng.standard_normal(shape) * std).astype(np.float32), name)
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
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset)],
            producer_name="xbackend-samples",
            producer_version="1",
        )
        model.ir_version = IR_VERSION
        model.doc_string = doc
        onnx.checker.check_model(model)
        return model


def _layernorm(graph: _Graph, source: str, width: int, prefix: str) -> str:
    scale = graph.const(f"{prefix}.gamma", (1.0 + 0.1 * graph.rng.standard_normal(width)).astype(np.float32))
    bias = graph.const(f"{prefix}.beta", (0.1 * graph.rng.standard_normal(width)).astype(np.float32))
    return graph.op("LayerNormalization", [source, scale, bias], f"{prefix}.out", axis=-1, epsilon=1e-5)


def _linear(graph: _Graph, source: str, n_in: int, n_out: int, prefix: str) -> str:
    weight = graph.weight(f"{prefix}.weight", (n_in, n_out))
    bias = graph.const(f"{prefix}.bias", (0.02 * graph.rng.standard_normal(n_out)).astype(np.float32))
    return graph.op("Add", [graph.op("MatMul", [source, weight], f"{prefix}.matmul"), bias], f"{prefix}.out")


def mlp_layernorm(
    blocks: int = 6, width: int = 64, hidden: int = 128, seq: int | None = 16, batch: int | str = 1
) -> onnx.ModelProto:
    """Pre-norm residual MLP stack: x + W2·SiLU(W1·LN(x)), then a final LayerNorm.

    With `seq=None` the input is [batch, width]: one matrix product per layer whose row
    count is the batch size, which is where BLAS switches kernels (gemv vs gemm).
    """
    graph = _Graph(seed=1)
    x = "x"
    for i in range(blocks):
        normed = _layernorm(graph, x, width, f"block{i}.ln")
        normed = _linear(graph, normed, width, hidden, f"block{i}.fc1")
        normed = graph.op(
            "Mul", [normed, graph.op("Sigmoid", [normed], f"block{i}.sigmoid")], f"block{i}.silu"
        )
        normed = _linear(graph, normed, hidden, width, f"block{i}.fc2")
        x = graph.op("Add", [x, normed], f"block{i}.residual")
    graph.op(
        "LayerNormalization",
        [
            x,
            graph.const("final.gamma", np.ones(width, np.float32)),
            graph.const("final.beta", np.zeros(width, np.float32)),
        ],
        "y",
        axis=-1,
    )
    dims = [batch, width] if seq is None else [batch, seq, width]
    return graph.model(
        "mlp_layernorm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        f"residual MLP + LayerNorm stack, {blocks} blocks, width {width}",
    )


def convnet() -> onnx.ModelProto:
    """Two 3x3 convolutions, global average pool and a classifier; dynamic batch 'N'."""
    graph = _Graph(seed=2)
    hidden = graph.op(
        "Conv",
        ["image", graph.weight("conv1.weight", (16, 3, 3, 3)), graph.weight("conv1.bias", (16,), 0.05)],
        "conv1",
        pads=[1, 1, 1, 1],
    )
    hidden = graph.op("Relu", [hidden], "relu1")
    hidden = graph.op(
        "Conv",
        [hidden, graph.weight("conv2.weight", (32, 16, 3, 3)), graph.weight("conv2.bias", (32,), 0.05)],
        "conv2",
        pads=[1, 1, 1, 1],
        strides=[2, 2],
    )
    hidden = graph.op("Relu", [hidden], "relu2")
    hidden = graph.op("Flatten", [graph.op("GlobalAveragePool", [hidden], "pool")], "flatten")
    graph.op(
        "Gemm", [hidden, graph.weight("fc.weight", (32, 10)), graph.weight("fc.bias", (10,), 0.05)], "logits"
    )
    return graph.model(
        "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        "small conv net with a dynamic batch dimension",
    )


def attention(seq: int = 32, width: int = 64, heads: int = 4) -> onnx.ModelProto:
    """One pre-norm multi-head self-attention block with a residual connection."""
    graph = _Graph(seed=3)
    dh = width // heads
    normed = _layernorm(graph, "x", width, "ln")
    shape = graph.const("heads_shape", np.array([1, seq, heads, dh], np.int64))
    qkv = {}
    for name in ("q", "k", "v"):
        projected = _linear(graph, normed, width, width, name)
        qkv[name] = graph.op(
            "Transpose",
            [graph.op("Reshape", [projected, shape], f"{name}.heads")],
            f"{name}.t",
            perm=[0, 2, 1, 3],
        )
    kt = graph.op("Transpose", [qkv["k"]], "k.tt", perm=[0, 1, 3, 2])
    scores = graph.op(
        "Mul",
        [
            graph.op("MatMul", [qkv["q"], kt], "scores.raw"),
            graph.const("scale", np.array(1.0 / np.sqrt(dh), np.float32)),
        ],
        "scores",
    )
    probs = graph.op("Softmax", [scores], "probs", axis=-1)
    ctx = graph.op(
        "Transpose", [graph.op("MatMul", [probs, qkv["v"]], "context")], "context.t", perm=[0, 2, 1, 3]
    )
    merged = graph.op(
        "Reshape", [ctx, graph.const("merge_shape", np.array([1, seq, width], np.int64))], "context.merged"
    )
    out = _linear(graph, merged, width, width, "proj")
    graph.op("Add", ["x", out], "y")
    return graph.model(
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
    graph = _Graph(seed=4)
    feats = graph.op("MatMul", ["points", graph.weight("proj.weight", (8, width))], "features")
    idx = graph.const("cell_index", (np.arange(points) % cells).astype(np.int64).reshape(points, 1))
    zeros = graph.const("cells_init", np.zeros((cells, width), np.float32))
    pooled = graph.op("ScatterND", [zeros, idx, feats], "pooled", reduction="add")
    graph.op("Relu", [pooled], "y")
    return graph.model(
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
    graph = _Graph(seed=5)
    graph.op("MatMul", ["x", graph.weight("W", (k, n), 1.0)], "y")
    return graph.model(
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
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits or [])
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset)],
        producer_name="xbackend-samples",
        producer_version="1",
    )
    model.ir_version = ir
    onnx.checker.check_model(model)
    return model


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
    weight = numpy_helper.from_array(np.linspace(-2, 2, 16, dtype=np.float32).reshape(1, 16), "w")
    return _small(
        "bf16_chain",
        nodes,
        [_vi("x", TensorProto.FLOAT, [2, 16])],
        [_vi("y", TensorProto.FLOAT, [2, 16]), _vi("y_bf16", TensorProto.BFLOAT16, [2, 16])],
        [weight],
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
    weight = numpy_helper.from_array(np.random.default_rng(7).standard_normal((8, 4)).astype(np.float32), "w")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    return _small(
        "zeros_out",
        nodes,
        [_vi("x", TensorProto.FLOAT, [2, 8])],
        [_vi("y", TensorProto.FLOAT, [2, 4])],
        [weight, zero],
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
    graph = _Graph(seed=8)
    tok = graph.weight("tok_emb", (vocab, width), 0.5)
    pos = graph.weight("pos_emb", (seq, width), 0.5)
    graph.op("Shape", ["ids"], "ids_shape")
    zero = graph.const("zero_i", np.array(0, np.int64))
    one = graph.const("one_i", np.array(1, np.int64))
    graph.op("Gather", ["ids_shape", zero], "batch_size", axis=0)
    graph.op("Gather", ["ids_shape", one], "seq_len", axis=0)
    graph.op("Range", [zero, "batch_size", one], "row_index")
    graph.op("Range", [zero, "seq_len", one], "positions")
    graph.op("Gather", [tok, "ids"], "tok")
    graph.op("Gather", [pos, "positions"], "pos")
    hidden = graph.op("Add", ["tok", "pos"], "embed")
    row = graph.op("Cast", ["row_index"], "row_f", to=TensorProto.FLOAT)
    row = graph.op("Unsqueeze", [row, graph.const("axes12", np.array([1, 2], np.int64))], "row_f3")
    row = graph.op("Mul", [row, graph.const("zero_f", np.array(0.0, np.float32))], "row_zero")
    hidden = graph.op("Add", [hidden, row], "embed_rows")
    ln = _layernorm(graph, hidden, width, "ln")
    query = _linear(graph, ln, width, width, "q")
    key = _linear(graph, ln, width, width, "k")
    kt = graph.op("Transpose", [key], "k_t", perm=[0, 2, 1])
    scores = graph.op("MatMul", [query, kt], "scores")
    probs = graph.op("Softmax", [scores], "probs", axis=-1)
    ctx_ = graph.op("MatMul", [probs, ln], "context")
    graph.op("MatMul", [ctx_, graph.weight("head", (width, vocab))], "logits")
    return graph.model(
        "gpt_batch",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", seq, vocab])],
        "GPT-style embeddings and attention with a Range over the batch size",
    )


def gelu_mlp(rows: int = 16, width: int = 64, blocks: int = 3) -> onnx.ModelProto:
    """Linear layers with exact (erf) GELU between them: opset 20's Gelu op."""
    graph = _Graph(7)
    hidden = "x"
    for i in range(blocks):
        hidden = graph.op("Gelu", [_linear(graph, hidden, width, width, f"l{i}")], f"l{i}.gelu")
    out_name = graph.op("Identity", [_linear(graph, hidden, width, width, "head")], "y")
    FLOAT = TensorProto.FLOAT
    return graph.model(
        "gelu_mlp",
        [helper.make_tensor_value_info("x", FLOAT, [rows, width])],
        [helper.make_tensor_value_info(out_name, FLOAT, [rows, width])],
        gelu_mlp.__doc__ or "",
        opset=20,
    )


def _variance(two_pass: bool) -> onnx.ModelProto:
    graph = _Graph(11)
    shifted = graph.op("Add", ["x", graph.const("offset", np.array(1000.0, np.float32))], "shifted")
    mean = graph.op("ReduceMean", [shifted], "mean", axes=[-1], keepdims=1)
    if two_pass:
        centered = graph.op("Sub", [shifted, mean], "centered")
        var = graph.op(
            "ReduceMean", [graph.op("Mul", [centered, centered], "centered.sq")], "var", axes=[-1], keepdims=1
        )
    else:
        sq = graph.op(
            "ReduceMean", [graph.op("Mul", [shifted, shifted], "x.sq")], "mean.sq", axes=[-1], keepdims=1
        )
        var = graph.op("Sub", [sq, graph.op("Mul", [mean, mean], "mean.squared")], "var")
    eps = graph.const("eps", np.array(1e-5, np.float32))
    inv = graph.op(
        "Reciprocal", [graph.op("Sqrt", [graph.op("Add", [var, eps], "var.eps")], "std")], "inv.std"
    )
    squared = graph.op("Mul", [graph.op("Sub", [shifted, mean], "x.centered"), inv], "y")
    FLOAT = TensorProto.FLOAT
    name = "variance_two_pass" if two_pass else "variance_naive"
    return graph.model(
        name,
        [helper.make_tensor_value_info("x", FLOAT, [32, 256])],
        [
            helper.make_tensor_value_info(squared, FLOAT, [32, 256]),
            helper.make_tensor_value_info(var, FLOAT, [32, 1]),
        ],
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
    graph = _Graph(13)
    shifted = graph.op("Add", ["x", graph.const("offset", np.array(offset, np.float32))], "shifted")
    shifted = _layernorm(graph, shifted, width, "ln")
    out_name = graph.op("Identity", [_linear(graph, shifted, width, width, "head")], "y")
    FLOAT = TensorProto.FLOAT
    return graph.model(
        "layernorm_offset",
        [helper.make_tensor_value_info("x", FLOAT, [rows, width])],
        [helper.make_tensor_value_info(out_name, FLOAT, [rows, width])],
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
