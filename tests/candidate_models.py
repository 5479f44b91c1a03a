"""Release candidates of models/torch_mlp.onnx, each made as its converter makes it, and each
planted defect at a known node (tests/candidates/test_candidates.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MLP = Path(__file__).resolve().parents[1] / "models" / "torch_mlp.onnx"
BF16_NODE = "node_linear"  # an Add (val_3 + bias): planted in bfloat16 inside the float16 model
BF16_TENSOR = "linear"
OVERFLOW_TENSOR = "val_3"  # the first MatMul's output, past float16's 65504 once its weight is scaled
OVERFLOW_NODE = "node_MatMul_1"
SCALED_Q = "val_3_QuantizeLinear"  # its scale planted 10x too small (saturation) or 100x too large


def fp16(src: Path, dest: Path, keep_io_types: bool = True) -> Path:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(src), keep_io_types=keep_io_types), dest)
    return dest


def bf16_node(fp16_model: Path, dest: Path) -> Path:
    """One node of a float16 model computed in bfloat16: its inputs cast down, its output cast back."""
    m = onnx.load(fp16_model)
    g = m.graph
    k = next(i for i, n in enumerate(g.node) if n.name == BF16_NODE)
    node = g.node[k]
    casts = []
    for j, t in enumerate(list(node.input)):
        casts.append(
            helper.make_node("Cast", [t], [f"{t}_bf16"], to=TensorProto.BFLOAT16, name=f"{t}_to_bf16")
        )
        node.input[j] = f"{t}_bf16"
    out = node.output[0]
    node.output[0] = f"{out}_bf16"
    back = helper.make_node("Cast", [f"{out}_bf16"], [out], to=TensorProto.FLOAT16, name=f"{out}_to_fp16")
    for n in reversed(casts):
        g.node.insert(k, n)
    g.node.insert(k + len(casts) + 1, back)
    onnx.save(m, dest)
    return dest


def _scaled(src: Path, dest: Path, node: str, k: int, factor: float) -> Path:
    """`src` with input `k` of its node `node` (an initializer) times `factor`."""
    m = onnx.load(src)
    name = next(n for n in m.graph.node if n.name == node).input[k]
    t = next(t for t in m.graph.initializer if t.name == name)
    t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(factor), t.name))
    onnx.save(m, dest)
    return dest


def big_weights(dest: Path, factor: float = 1e5) -> Path:
    """The original with the first MatMul's weight scaled: finite in float32, past float16's range."""
    return _scaled(MLP, dest, OVERFLOW_NODE, 1, factor)


CONVNET = MLP.parent / "convnet.onnx"


class _Reader:
    def __init__(self, src: Path, n: int = 8) -> None:
        i = onnx.load(src).graph.input[0]
        shape = [d.dim_value or 2 for d in i.type.tensor_type.shape.dim]
        rng = np.random.default_rng(1)
        self._data: Iterator[dict[str, np.ndarray]] = iter(
            [{i.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._data, None)


def qdq(dest: Path, src: Path = MLP) -> Path:
    """Static int8 in QDQ format, calibrated with min/max on 8 seeded batches."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(_Reader, CalibrationDataReader):
        pass

    quantize_static(
        str(src), str(dest), Reader(src), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    return dest


def scaled_q(qdq_model: Path, dest: Path, factor: float) -> Path:
    """The QDQ model with SCALED_Q's scale (shared by its DequantizeLinear) times `factor`."""
    return _scaled(qdq_model, dest, SCALED_Q, 1, factor)


def dynamic_int8(dest: Path, src: Path = MLP) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dest), weight_type=QuantType.QInt8)
    return dest


def qdq_decoder(src: Path, dest: Path, ops: list[str] | None = None, tokens: int = 12) -> Path:
    """Static QDQ int8 of an optimum decoder (`ops`: op_types_to_quantize, None: every op),
    calibrated with min/max on six seeded prompts of `tokens` tokens and an empty cache (so the
    positions it sees stop short of those a 24-step decode reaches)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    g = onnx.load(src, load_external_data=False).graph
    rng = np.random.default_rng(3)
    feeds = []
    for _ in range(6):
        f: dict[str, np.ndarray] = {
            "input_ids": rng.integers(0, 256, (1, tokens), dtype=np.int64),
            "attention_mask": np.ones((1, tokens), np.int64),
            "position_ids": np.arange(tokens, dtype=np.int64)[None],
        }
        for i in g.input:
            if i.name.startswith("past_key_values"):
                dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
                f[i.name] = np.zeros((1, dims[1], 0, dims[3]), np.float32)
        feeds.append({k: v for k, v in f.items() if k in {i.name for i in g.input}})

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    quantize_static(
        str(src), str(dest), Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=ops,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip
    return dest
