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
