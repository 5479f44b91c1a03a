"""Nothing passes unjudged: an op the judge once could not evaluate in float64 is judged, and a
judgment that could not be made is a FAIL that sets exit 1 by default, as an origin does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from roots import ROOT

import xbackend
from xbackend.model.samples import build


def _pow_model(path: Path) -> Path:
    """x @ w, squared by Pow with an int64 exponent (as exporters write x**2), times x @ w."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    two = numpy_helper.from_array(np.array(2, np.int64), "two")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Pow", ["h", "two"], ["p"]),
        helper.make_node("Mul", ["p", "h"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "pow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
        [w, two],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return path


def test_pow_with_an_integer_exponent_is_judged(tmp_path: Path) -> None:
    """It made the whole model unjudged ('a Mul node does not take float64 values'), PASS exit 0."""
    r = xbackend.compare(_pow_model(tmp_path / "pow.onnx"), runs=1, probes="none")
    le = r.explanation.local_for("ort-cpu")
    assert r.explanation.ok and le is not None and le.status == "ok"
    assert le.node("p") is not None and le.origins == ()
    assert r.exit_code == 0 and r.verdict()[0].startswith("PASS")


@pytest.mark.usefixtures("plugins")
def test_a_loss_at_an_integer_pow_is_caught_there(tmp_path: Path) -> None:
    """Planted: the Pow's result 64 ULP up (its allowance is about 10): the origin is p alone."""
    from test_false_origins import nudged

    r = nudged(_pow_model(tmp_path / "pow.onnx"), "p", 64)
    assert [o.tensor for o in r.cross("test-nudge").origins] == ["p"]
    assert r.exit_code == 1


def test_an_unjudged_backend_fails_the_default_gate(tmp_path: Path) -> None:
    """--tensors outputs leaves no node to judge: the verdict says 'not judged' as a FAIL, exit 1;
    --noise-samples 0 declines the judgment, a NOTE, exit 0."""
    m = tmp_path / "mlp.onnx"
    onnx.save(build("mlp_layernorm"), str(m))
    r = xbackend.compare(m, runs=1, outputs_only=True, probes="none")
    assert not any(v.startswith("PASS") for v in r.verdict())
    assert any(v.startswith("FAIL: not judged: ") for v in r.verdict())
    assert r.exit_code == 1
    declined = xbackend.compare(m, runs=1, probes="none", noise_samples=0)
    assert declined.exit_code == 0 and declined.verdict()[0].startswith("PASS")
    assert any(v.startswith("NOTE: no explanation") for v in declined.verdict())


def _torch_with(tmp_path: Path, source: str, grain: str = "module") -> xbackend.Result:
    path = tmp_path / "copy.py"
    path.write_text(source)
    options = {"torch": {"module": f"{path}:build", "grain": grain}}
    return xbackend.compare(
        ROOT / "models" / "torch_mlp.onnx", backends="torch,reference", runs=1, probes="none",
        runner_options=options,
    )  # fmt: skip


def test_a_torch_module_other_than_the_recorded_file_keeps_its_map_by_name(tmp_path: Path) -> None:
    """A copy of the recorded file elsewhere: every module found by name, each judged (it lost
    its map, and was 'not judged', PASS exit 0, under the 64-ULP fallback)."""
    pytest.importorskip("torch")
    source = (ROOT / "models" / "torch_mlp.py").read_text("utf-8")
    r = _torch_with(tmp_path, source)
    info = dict(r.backend("torch").info)
    assert info["mapped_from"].startswith("the recorded module's map, by name")
    assert info["mapped_from"].endswith("; 30 of 30 of its modules found by name")
    le = r.explanation.local_for("torch")
    assert le is not None and le.status == "ok" and le.origins == ()
    assert le.compared == int(info["mapped_intermediates"]) + 1  # and the graph output
    assert r.exit_code == 0
    # each LayerNorm renamed: those modules are said, their tensors not exposed, the rest judged
    r = _torch_with(tmp_path, source.replace("self.ln", "self.norm1"))
    info = dict(r.backend("torch").info)
    assert info["mapped_from"].endswith(
        "24 of 30 of its modules found by name, not found: " + ", ".join(f"blocks.{k}.ln" for k in range(6))
    )
    unmapped = dict(r.backend("torch").not_exposed)
    assert "no module of it has the name the recorded map gives" in unmapped["layer_norm"]
    le = r.explanation.local_for("torch")
    assert le is not None and le.status == "ok" and le.origins == ()
