"""A synthetic model past protobuf's 2 GiB limit: a stack of float32 MatMul+Add+Tanh layers
whose weights live in several external-data files. Weights are generated block by block, so
writing it never holds more than one layer's matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

WIDTH = 4096  # a 4096x4096 float32 matrix is 64 MiB
LAYERS = 36  # 36 x 64 MiB = 2.25 GiB, past the 2 GiB a protobuf may hold
FILES = 3  # weights split across this many external-data files


def make_big(path: Path, layers: int = LAYERS, width: int = WIDTH, files: int = FILES) -> int:
    """Write the model to `path` (weights in path.stem + '.dataK' beside it); its weight bytes."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []
    offsets = [0] * files
    handles = [open(path.parent / f"{path.stem}.data{k}", "wb") for k in range(files)]  # noqa: SIM115
    try:
        h = "x"
        for i in range(layers):
            k = i % files
            for name, shape in ((f"w{i}", (width, width)), (f"b{i}", (width,))):
                arr = (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(width))).astype(
                    "<f4"
                )
                data = arr.tobytes()
                tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
                tensor.data_location = TensorProto.EXTERNAL
                for key, value in (
                    ("location", f"{path.stem}.data{k}"),
                    ("offset", str(offsets[k])),
                    ("length", str(len(data))),
                ):
                    tensor.external_data.add(key=key, value=value)
                handles[k].write(data)
                offsets[k] += len(data)
                inits.append(tensor)
                del arr, data
            nodes += [
                helper.make_node("MatMul", [h, f"w{i}"], [f"mm{i}"], name=f"layers.{i}.matmul"),
                helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"pre{i}"], name=f"layers.{i}.bias"),
                helper.make_node("Tanh", [f"pre{i}"], [f"h{i}"], name=f"layers.{i}.act"),
            ]
            h = f"h{i}"
    finally:
        for f in handles:
            f.close()
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return sum(offsets)
