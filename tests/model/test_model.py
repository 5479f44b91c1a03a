"""Model loading, checking, IR downgrade and instrumentation."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xbackend.errors import ModelLoadError
from xbackend.model.load import ModelRef, downgrade_blockers, downgrade_ir, load_model, load_proto
from xbackend.model.samples import build, mlp_layernorm

pytestmark = pytest.mark.unit  # the unit tier: make check


def tiny(opset: int = 21, ir: int | None = None, dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("Neg", ["a"], ["y"], name="neg"),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", dtype, ["batch", 4])],
        [helper.make_tensor_value_info("y", dtype, ["batch", 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if ir is not None:
        m.ir_version = ir
    return m


def test_spec_describes_the_model(tmp_path: Path) -> None:
    p = tmp_path / "m.onnx"
    onnx.save(build("mlp_layernorm"), str(p))
    spec, _ = load_model(p)
    assert spec.ir_version == 10 and spec.opset() == 17
    assert [i.name for i in spec.inputs] == ["x"] and spec.inputs[0].shape == (1, 16, 64)
    assert spec.output_names == ("y",)
    assert spec.tensors[0].name == "block0.ln.out" and spec.tensors[0].op_type == "LayerNormalization"
    assert spec.tensor_order()[-1] == "y" and spec.output_order() == ("y",)
    assert len(spec.sha256) == 64 and not spec.external_data


def test_missing_file() -> None:
    with pytest.raises(ModelLoadError, match=r"model file not found: nope\.onnx; check the path"):
        load_model("nope.onnx")


def test_corrupt_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x08\x07this is not a protobuf\xff\xff\xff")
    with pytest.raises(ModelLoadError, match=r"not a readable ONNX model|holds no ONNX graph"):
        load_model(p)


def test_text_file_is_not_a_model(tmp_path: Path) -> None:
    p = tmp_path / "notes.onnx"
    p.write_text("hello")
    with pytest.raises(ModelLoadError, match=r"pass a \.onnx"):
        load_model(p)


def test_invalid_graph_is_rejected(tmp_path: Path) -> None:
    m = tiny(opset=17, ir=10)
    m.graph.node[1].input[0] = "undefined_tensor"
    p = tmp_path / "invalid.onnx"
    onnx.save(m, str(p))
    with pytest.raises(ModelLoadError, match="is not a valid ONNX model"):
        load_model(p)


def test_large_weight_of_the_wrong_size_is_rejected(tmp_path: Path) -> None:
    # the checker sees large weights emptied, so their byte counts are checked beforehand
    m = mlp_layernorm(blocks=1, width=128, hidden=256)
    w = next(t for t in m.graph.initializer if len(t.raw_data) > 65536)
    dims = list(w.dims)
    w.raw_data = w.raw_data[:-4]
    p = tmp_path / "short.onnx"
    onnx.save(m, str(p))
    want = (
        f"initializer '{w.name}' holds {len(w.raw_data)} bytes, its shape {dims} needs {len(w.raw_data) + 4}"
    )
    with pytest.raises(ModelLoadError, match=re.escape(want)):
        load_model(p)


def test_external_data_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "ext.onnx"
    onnx.save(
        build("mlp_layernorm"), str(p), save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    spec, proto = load_model(p)
    assert spec.external_data
    assert not proto.graph.initializer[0].raw_data  # the planner never reads the weights
    assert load_proto(p).graph.initializer[0].raw_data  # a backend's process does
    (tmp_path / "weights.bin").rename(tmp_path / "moved.bin")
    with pytest.raises(ModelLoadError, match=r"external data file\(s\) weights.bin .*copy them there"):
        load_model(p)


def test_ir14_with_old_opset_downgrades_safely() -> None:
    m = tiny(opset=21)
    assert m.ir_version == 14  # what onnx 1.23 writes by default
    assert downgrade_blockers(m, 13) == []
    assert downgrade_ir(m, 13).ir_version == 13


def test_ir14_with_new_opset_cannot_downgrade() -> None:
    m = tiny(opset=28)
    assert downgrade_blockers(m, 13) == ["opset ai.onnx 28 (IR 13 allows at most 27)"]
    with pytest.raises(ModelLoadError, match=r"cannot be safely downgraded to IR 13; re-export"):
        downgrade_ir(m, 13)


def test_new_dtype_blocks_downgrade() -> None:
    m = tiny(opset=21, dtype=TensorProto.FLOAT4E2M1)
    assert downgrade_blockers(m, 10) == ["element type FLOAT4E2M1 (needs IR 11)"]


def test_appended_outputs_expose_every_node_output_in_order(tmp_path: Path) -> None:
    import numpy as np
    import onnxruntime as ort

    from xbackend.runners.ort_cpu import OrtCpuRunner

    p = tmp_path / "tiny.onnx"
    onnx.save(tiny(opset=17, ir=10), str(p))
    original = p.read_bytes()
    ref = ModelRef(str(p), 10, ("x",), ("y",), False)
    data = original + OrtCpuRunner()._suffix(ref, ("a", "y"))
    assert [o.name for o in onnx.load_model_from_string(data).graph.output] == ["y", "a"]  # protobuf merge
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    y, a = sess.run(["y", "a"], {"x": x})
    assert a.tolist() == [[0.0, 2.0, 0.0, 4.0]] and y.tolist() == [[-0.0, -2.0, -0.0, -4.0]]
    assert p.read_bytes() == original  # the user's file is untouched


def test_a_truncated_external_data_file_is_a_one_line_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.cli_helpers import one_line_error, run

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    m = helper.make_model(
        helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    )
    m.ir_version = 9
    path = tmp_path / "m.onnx"
    onnx.save(
        m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="m.data", size_threshold=0
    )
    data = tmp_path / "m.data"
    data.write_bytes(data.read_bytes()[:1000])
    code, out, err = run(capsys, "compare", str(path), "--runs", "1")
    assert code == 2 and out == ""
    one_line_error(err, "external data file m.data ends at byte 1000, but weight 'w' needs bytes up to 16384")
    assert "copy it again in full" in err
