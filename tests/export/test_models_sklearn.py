"""scikit-learn models exported by skl2onnx: the ai.onnx.ml ops, ZipMap's typed maps, and
golden outputs in ONNX's test-data layout."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import xbackend

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("skl2onnx") is None,
        reason="skl2onnx not installed: pip install 'xbackend[models]'",
    ),
]
HAS_OV = importlib.util.find_spec("openvino") is not None


def _export(kind: str, zipmap: bool, path: Path) -> tuple[Path, np.ndarray]:
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 1)
    model: Any = (
        LogisticRegression(max_iter=500)
        if kind == "lr"
        else RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0)
    )
    model.fit(x, y)
    options = None if zipmap else {id(model): {"zipmap": False}}
    onx = to_onnx(model, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
    path.write_bytes(onx.SerializeToString())
    return path, x[:8]


@pytest.mark.parametrize("kind", ["lr", "rf"])
@pytest.mark.parametrize("zipmap", [True, False])
def test_sklearn_classifiers_run_on_reference_and_oracle(kind: str, zipmap: bool, tmp_path: Path) -> None:
    path, x = _export(kind, zipmap, tmp_path / f"{kind}.onnx")
    np.savez(tmp_path / "x.npz", X=x)
    r = xbackend.compare(
        path, backends=["ort-cpu", "reference", "oracle"], inputs=str(tmp_path / "x.npz"), runs=1
    )
    assert r.exit_code == 0, r.verdict()
    for b in ("ort-cpu", "oracle"):
        c = r.cross(b)
        assert c.status == "ok" and c.explained is True, r.verdict()
        probs = [d for d in c.output_tensors if d.name.startswith(("output_probability", "probabilities"))]
        assert probs and all(d.dtype == "float32" for d in probs)  # ZipMap's values stay float32
        assert all(d.scaled_ulp is not None and d.scaled_ulp <= 8 for d in probs)
    if zipmap:
        maps = [d for d in r.cross("ort-cpu").output_tensors if d.name.startswith("output_probability[")]
        assert len(maps) == 8 * 3  # 8 rows x 3 classes, each a float32 map value
    below = dict(r.backend("oracle").info).get("computed_below_float64", "")
    # onnx's evaluator sums a tree ensemble in float32: the oracle says so instead of posing as float64,
    # and is not ranked there; a linear classifier it computes in float64 although its schema says float
    assert ("probabilities" in below) == (kind == "rf")
    out = "probabilities" if not zipmap else "output_probability"
    noted = any(v.startswith("NOTE: oracle: ") and "not ranked there" in v for v in r.verdict())
    assert noted == (kind == "rf")
    if kind == "rf":
        assert out in r.oracle_below_float64
        assert (
            "precision" in dict(r.backend("oracle").info)
            and "except" in dict(r.backend("oracle").info)["precision"]
        )


def test_golden_zipmap_outputs_compare_as_float32(tmp_path: Path) -> None:
    """Expected outputs from ONNX Runtime in the test-data layout: maps of float32 values, matched
    value for value (they were all dtype_mismatch when map values were captured as float64)."""
    import onnxruntime as ort
    from onnx import numpy_helper

    path, x = _export("lr", True, tmp_path / "lr.onnx")
    data = tmp_path / "test_data_set_0"
    data.mkdir()
    (data / "input_0.pb").write_bytes(numpy_helper.from_array(x, "X").SerializeToString())
    label, probs = ort.InferenceSession(str(path)).run(None, {"X": x})
    typed = [{k: np.float32(v) for k, v in row.items()} for row in probs]
    (data / "output_0.pb").write_bytes(numpy_helper.from_array(label, "output_label").SerializeToString())
    seq = numpy_helper.from_list(typed, "output_probability")
    (data / "output_1.pb").write_bytes(seq.SerializeToString())
    r = xbackend.compare(path, backends=["ort-cpu", "reference"], inputs=str(tmp_path), runs=1)
    ort_golden = r.expected("ort-cpu")  # ORT wrote them: the same bits, float32 map values and all
    assert ort_golden.status == "ok" and ort_golden.bitwise_equal, [d.detail for d in ort_golden.tensors]
    ref_golden = r.expected("reference")
    assert all(d.comparable and d.dtype != "float64" for d in ref_golden.tensors), ref_golden.tensors
    assert (ref_golden.scaled_ulp or 0) <= 8 and r.exit_code == 0, r.verdict()


@pytest.mark.skipif(not HAS_OV, reason="openvino not installed")
def test_openvino_refuses_zipmap_in_one_plain_line(tmp_path: Path) -> None:
    path, x = _export("lr", True, tmp_path / "lr.onnx")
    np.savez(tmp_path / "x.npz", X=x)
    r = xbackend.compare(path, backends=["openvino-cpu", "ort-cpu"], inputs=str(tmp_path / "x.npz"), runs=1)
    ov = r.backend("openvino-cpu")
    assert ov.status == "unavailable"
    assert ov.reason == (
        "OpenVINO cannot read the model: output_probability is a sequence or map (e.g. ZipMap's class "
        "probabilities), and OpenVINO takes tensors only; export without it (skl2onnx: "
        "options={'zipmap': False})"
    )


def test_category_mapper_both_ways() -> None:
    import onnx
    from onnx import TensorProto, helper

    def model(strings_in: bool) -> onnx.ModelProto:
        node = helper.make_node(
            "CategoryMapper", ["x"], ["y"], domain="ai.onnx.ml",
            cats_strings=["cat", "dog"], cats_int64s=[7, 9], default_int64=-5, default_string="none",
        )  # fmt: skip
        x_t, y_t = (
            (TensorProto.STRING, TensorProto.INT64) if strings_in else (TensorProto.INT64, TensorProto.STRING)
        )
        g = helper.make_graph(
            [node],
            "cm",
            [helper.make_tensor_value_info("x", x_t, [3])],
            [helper.make_tensor_value_info("y", y_t, [3])],
        )
        return helper.make_model(
            g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
        )

    from onnx.reference import ReferenceEvaluator

    from xbackend.runners.mlops import ml_ops

    to_int = ReferenceEvaluator(model(True), new_ops=ml_ops()).run(
        None, {"x": np.array(["dog", "cow", "cat"])}
    )
    assert to_int[0].tolist() == [9, -5, 7]
    to_str = ReferenceEvaluator(model(False), new_ops=ml_ops()).run(None, {"x": np.array([7, 8, 9])})
    assert to_str[0].tolist() == ["cat", "none", "dog"]
