"""One float64 evaluation serving several judgments: the oracle's severed run is the judge's own
evaluation, and ONNX Runtime's shipped graph reads the reference grain's values where its nodes
coincide with the model's. Each shared judgment is held to the one it replaces, value for value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from roots import ROOT

import xbackend
from xbackend.judge import backend_judgment, explain_jobs
from xbackend.judge.judge_plan import OWN_JUDGE

MLP = ROOT / "models" / "torch_mlp.onnx"


def _nodes(r: xbackend.Result, backend: str) -> list[tuple[str, float | None, float | None]]:
    le = r.explanation.local_for(backend)
    assert le is not None and le.status == "ok", le
    return [(n.tensor, n.local_scaled_ulp, n.allowed_scaled_ulp) for n in le.nodes]


def _with_and_without_sharing(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[frozenset[str]], xbackend.Result, xbackend.Result]:
    """What shared_nodes found for ort-cpu, and the comparison with and without that sharing."""
    kw = {"backends": "ort-cpu,reference", "runs": 1, "probes": "none"}
    seen: list[frozenset[str]] = []
    real = explain_jobs.shared_nodes

    def spy(*a: object) -> frozenset[str]:
        seen.append(real(*a))  # type: ignore[arg-type]
        return seen[-1]

    monkeypatch.setattr(explain_jobs, "shared_nodes", spy)
    shared = xbackend.compare(model, **kw)
    monkeypatch.setattr(explain_jobs, "shared_nodes", lambda *a: frozenset())
    return seen, shared, xbackend.compare(model, **kw)


def test_the_oracle_is_judged_on_the_judges_own_evaluation_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kw = {"backends": "ort-cpu,reference,oracle", "runs": 1, "probes": "none"}
    shared = xbackend.compare(MLP, **kw)
    le = shared.explanation.local_for("oracle")
    assert le is not None and le.graph == OWN_JUDGE and le.explained
    monkeypatch.setattr(backend_judgment, "_judges_evaluation", lambda b: False)
    ran = xbackend.compare(MLP, **kw)
    mine = ran.explanation.local_for("oracle")
    assert mine is not None and mine.graph != OWN_JUDGE
    # the oracle's own severed run, judged, gives every node the same local error and allowance
    assert _nodes(shared, "oracle") == _nodes(ran, "oracle")
    assert len(_nodes(ran, "oracle")) == 49
    assert max(n[1] or 0.0 for n in _nodes(ran, "oracle")) > 0  # rounding to float32 was measured


def test_ort_nodes_its_optimizer_left_are_judged_on_the_reference_grains_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch_mlp on ONNX Runtime: 12 Gemm, 6 QuickGelu and a SkipLayerNormalization are fused
    # kernels; its other LayerNorms and residual Adds are the model's own nodes
    seen, shared, alone = _with_and_without_sharing(MLP, monkeypatch)
    # the six LayerNorms and five of the six residual Adds (the last is in the SkipLayerNorm)
    assert sorted(seen[0]) == sorted(
        [f"add{s}" for s in ("", "_1", "_2", "_3", "_4")]
        + [f"layer_norm{s}" for s in ("", "_1", "_2", "_3", "_4", "_5")]
    )
    # the same judgment, node for node, in the optimized graph's order
    assert _nodes(shared, "ort-cpu") == _nodes(alone, "ort-cpu")
    assert len(_nodes(alone, "ort-cpu")) == 54


def test_a_weight_the_optimizer_folded_is_shared_where_it_equals_the_reference_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # y = LayerNorm(x) @ W^T with W^T computed (a tied LM head): ONNX Runtime folds the Transpose
    # into a weight of the same name, whose values are the reference's of that tensor
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "w")
    g = numpy_helper.from_array(np.ones(16, np.float32), "g")
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g"], ["ln"], axis=-1),
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["ln", "wt"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32])],
        [w, g],
    )
    path = tmp_path / "tied.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    seen, shared, alone = _with_and_without_sharing(path, monkeypatch)
    assert seen == [frozenset({"ln", "y"})]
    assert _nodes(shared, "ort-cpu") == _nodes(alone, "ort-cpu")
    assert [n[0] for n in _nodes(alone, "ort-cpu")] == ["ln", "y"]
