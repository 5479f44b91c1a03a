"""EXPLAINED holds for what ships: the precision the model declares, whatever dtype a backend
hands back; the plain run's outputs; no vacuous judgment; no false origins on correct engines.
Each judgment is proven by a planted loss caught at exactly its nodes (issue 46's battery)."""

from __future__ import annotations

from pathlib import Path

import pytest

import xbackend

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "models" / "mlp_layernorm.onnx"
MATMULS = [f"block{k}.{fc}.matmul" for k in range(6) for fc in ("fc1", "fc2")]


@pytest.mark.usefixtures("plugins")
def test_a_float16_return_is_judged_at_the_declared_float32() -> None:
    r = xbackend.compare(
        MLP,
        backends="test-dtype,ort-cpu,reference",
        runs=1,
        probes="none",
        runner_options={"test-dtype": {"returned": "float16-matmul"}},
    )
    c = r.cross("test-dtype")
    # every MatMul rounded to float16 is past float32's allowance, and nothing else is
    assert [o.tensor for o in c.origins] == MATMULS
    assert all(o.ratio > 2 for o in c.origins), [(o.tensor, o.ratio) for o in c.origins]
    assert all("handed back as float16 where the model declares float32" in o.detail for o in c.origins)
    assert c.explained is False and r.exit_code == 1
    assert r.cross("ort-cpu").explained is True


@pytest.mark.usefixtures("plugins")
def test_a_float64_return_of_correct_values_is_rounded_to_float32_and_explained() -> None:
    r = xbackend.compare(
        MLP,
        backends="test-dtype,reference",
        runs=1,
        probes="none",
        runner_options={"test-dtype": {"returned": "float64"}},
    )
    c = r.cross("test-dtype")
    assert c.origins == () and c.explained is True
    assert r.exit_code == 0


@pytest.mark.usefixtures("plugins")
def test_a_fusion_made_only_where_unexposed_is_caught_at_its_stretch() -> None:
    # test-fuse computes block2's fc1 MatMul and its bias in float16 only where the MatMul's
    # output is not exposed: its severed and instrumented runs are exact, its plain run is not.
    # test-fuse@ort fuses nothing of its own: ONNX Runtime's own fusions (Gemm, SkipLayerNorm)
    # give it an observer effect too, judged the same way without a graph of its own.
    r = xbackend.compare(
        MLP,
        backends="test-fuse,test-fuse@ort,ort-cpu,reference",
        runs=1,
        probes="none",
        runner_options={"test-fuse": {"at": "block2.fc1.matmul"}, "test-fuse@ort": {"at": "none"}},
    )
    assert dict(r.backend("test-fuse").info)["fused"] == "block2.fc1.matmul"
    c = r.cross("test-fuse")
    (o,) = c.origins
    # the stretch past its composed bound in both cuttings, narrowed to the nodes they share
    assert o.covers == ("block2.ln.out", "block2.fc1.matmul", "block2.fc1.out")
    assert o.op_type == "stretch of 3 node(s)" and o.ratio > 2
    assert c.explained is False and r.exit_code == 1
    le = r.explanation.local_for("test-fuse")
    assert le.plain is not None and le.plain.status == "unexplained" and le.plain.ratio > 10
    warn = next(v for v in r.verdict() if v.startswith("WARN: observer effect on test-fuse"))
    assert "its plain run is past the bound" in warn
    # the correct engines: ONNX Runtime judged stretch by stretch, and on its optimized graph
    ort = r.explanation.local_for("test-fuse@ort")
    assert ort.plain is not None and ort.plain.status == "explained" and ort.plain.ratio <= 1
    assert r.cross("test-fuse@ort").explained is True
    shipped = r.explanation.local_for("ort-cpu").plain
    assert shipped is not None and shipped.status == "shipped-graph"
    assert r.cross("ort-cpu").explained is True
