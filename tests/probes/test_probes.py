"""Probes: each on a bundled model where its answer is known on this machine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import xbackend
from xbackend.errors import UsageError
from xbackend.host.environment import collect_environment
from xbackend.probes import select_probes
from xbackend.probes.builds import BuildVariance
from xbackend.runners.base import BuildFingerprint

pytestmark = pytest.mark.slow
HAS_OV = importlib.util.find_spec("openvino") is not None
ISA = collect_environment()["cpu.isa"].split()


def test_probe_selection() -> None:
    # opt-levels explains a gap: opt-in; tf32 plans nothing without a GPU backend
    assert select_probes(None, 0) == ("builds", "threads", "tf32")
    assert select_probes(None, 8) == ("builds", "threads", "batch", "tf32")
    assert select_probes(["batch", "threads"], 0) == ("builds", "threads", "batch")
    assert select_probes(["none"], 0) == ("builds",)  # it spawns no jobs: always on
    assert select_probes(["all"], 0) == ("builds", "threads", "opt-levels", "batch", "autotune", "tf32")
    with pytest.raises(UsageError, match=r"unknown probe.s. speed; choose from builds, threads"):
        select_probes(["speed"], 0)


def test_build_variance_from_fingerprints() -> None:
    fps = [
        BuildFingerprint("x", "a", (("conv", "k1"), ("relu", "r"))),
        BuildFingerprint("x", "b", (("conv", "k2"), ("relu", "r"))),
        BuildFingerprint("x", "a", (("conv", "k1"), ("relu", "r"))),
    ]
    bv = BuildVariance.from_fingerprints("x", fps, outputs_differ=True)
    assert bv.builds_vary and bv.distinct_fingerprints == 2
    assert bv.varying_layers == (("conv", ("k1", "k2", "k1")),)


def test_optimization_level_that_changes_a_convolution(models: dict[str, Path]) -> None:
    r = xbackend.compare(
        models["convnet"], shapes={"image": (2, 3, 32, 32)}, backends=["ort-cpu"], runs=1, probes="opt-levels"
    )
    rows = r.probe("opt-levels").rows  # type: ignore[attr-defined]
    levels = {o.level: o for o in rows}
    assert [o.level for o in rows] == ["basic", "extended", "layout", "all"]
    assert levels["basic"].bitwise_equal and levels["extended"].bitwise_equal
    assert "ConvActivationFusion" in levels["extended"].modified_graph  # rewrites, same bits
    for lvl in ("layout", "all"):
        assert not levels[lvl].bitwise_equal
        assert levels[lvl].changed_by == ("NchwcTransformer",)
        assert levels[lvl].max_ulp >= 10  # tens of ULPs on a convolution
    assert any("changed by NchwcTransformer" in line for line in r.verdict())
    assert r.exit_code == 0  # probes explain; they do not fail the run


def test_batch_invariance_known_engines(models: dict[str, Path]) -> None:
    backends = ["ort-cpu", "reference"] + (["openvino-cpu"] if HAS_OV else [])
    r = xbackend.compare(
        models["mlp_batch"],
        shapes={"x": (1, 128)},
        backends=backends,
        runs=1,
        probes="batch",
        batch_invariance=8,
    )
    res = {b.backend: b for b in r.probe("batch").rows}  # type: ignore[attr-defined]
    assert res["ort-cpu"].invariant is True and res["ort-cpu"].max_ulp == 0
    if HAS_OV:
        assert res["openvino-cpu"].invariant is True
    ref = res["reference"]
    assert ref.invariant is False and ref.positions == (0, 4, 7)
    # numpy's BLAS uses a matrix-vector kernel for one row and a matrix-matrix one for eight:
    # the first MatMul is where the sample parts ways with itself.
    assert ref.first_divergence == "block0.fc1.matmul"
    by_name = {t: (d, u, s) for t, d, u, s in ref.by_depth}
    assert by_name["block0.ln.out"][1] == 0
    residual = [by_name[f"block{i}.residual"][2] or 0.0 for i in range(12)]
    assert sum(residual[-3:]) / 3 > sum(residual[:3]) / 3  # the error grows along the residual stream
    data = json.loads(xbackend.to_json(r))["probes"]["batch"]
    assert {d["backend"]: d["invariant"] for d in data}["reference"] is False
    assert data[0]["by_depth"][0] == {"tensor": "block0.ln.out", "depth": 0, "max_ulp": 0, "scaled_ulp": 0.0}


def _rows_model(path: Path) -> Path:
    """x [B, 4, 8] viewed as rows [B*4, 8] for a MatMul, viewed back; and a branch that
    transposes the batch behind the sequence before merging ([4*B, 8]: interleaved)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32), "w")
    flat = numpy_helper.from_array(np.array([-1, 8], np.int64), "flat")
    back = numpy_helper.from_array(np.array([-1, 4, 6], np.int64), "back_shape")
    nodes = [
        helper.make_node("Reshape", ["x", "flat"], ["rows"], name="rows"),
        helper.make_node("MatMul", ["rows", "w"], ["mm"], name="mm"),
        helper.make_node("Reshape", ["mm", "back_shape"], ["back"], name="back"),
        helper.make_node("Relu", ["back"], ["y"], name="y"),
        helper.make_node("Transpose", ["x"], ["xt"], name="xt", perm=[1, 0, 2]),
        helper.make_node("Reshape", ["xt", "flat"], ["trows"], name="trows"),
        helper.make_node("MatMul", ["trows", "w"], ["z"], name="z"),
    ]
    g = helper.make_graph(
        nodes,
        "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 6]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["rows", 6]),
        ],
        initializer=[w, flat, back],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, path)
    return path


def test_batch_probe_follows_the_batch_through_reshapes(tmp_path: Path, plugins: None) -> None:
    """HF GPT-2 runs its MLP on [B*T, C] rows: the probe compares the sample's rows there and
    blames the MatMul that made the bits, not the Reshape after it."""
    model = _rows_model(tmp_path / "rows.onnx")
    r = xbackend.compare(
        model,
        backends=["test-batch-nudge", "ort-cpu"],
        reference="ort-cpu",
        runs=1,
        probes="batch",
        batch_invariance=4,
        shapes={"x": (1, 4, 8)},
        runner_options={"test-batch-nudge": {"tensor": "mm", "ulps": "2"}},
    )
    row = {b.backend: b for b in r.probe("batch").rows}["test-batch-nudge"]  # type: ignore[attr-defined]
    compared = {t: u for t, _, u, _ in row.by_depth}
    assert row.invariant is False and row.first_divergence == "mm" and row.seen_at == ""
    # the nudge moves the captured mm only; back is computed from the true one
    assert compared["rows"] == 0 and compared["mm"] == 2 and compared["back"] == 0
    assert compared["xt"] == 0  # the batch moved to axis 1: still compared
    interleaved = "from trows (Reshape) on, the batch is interleaved with another axis"
    assert dict(row.left_out) == {"trows": interleaved, "z": interleaved}
    assert any("differs from mm on" in line for line in r.verdict())


def test_a_view_is_not_blamed_for_bits_it_copied(tmp_path: Path) -> None:
    from xbackend.model.load import load_model
    from xbackend.probes.batchaxis import computed_by

    spec, _ = load_model(_rows_model(tmp_path / "rows.onnx"))
    # the MatMul was not compared (not exposed): the Reshape after it only copied its bits
    assert computed_by(spec, "back", {"x", "rows"}) == "mm"
    # the MatMul was compared and agreed: the view itself changed the bits
    assert computed_by(spec, "back", {"x", "rows", "mm"}) == "back"


def test_batch_probe_needs_a_batch_dimension(models: dict[str, Path]) -> None:
    r = xbackend.compare(
        models["attention"], backends=["ort-cpu"], runs=1, probes="batch", batch_invariance=4
    )
    batch = r.probe("batch")
    assert batch.rows == ()  # type: ignore[attr-defined]
    why = (
        "batch invariance not probed: no model input has a dynamic first (batch) dimension "
        "(x [1,32,64]); export the model with a dynamic batch axis to probe it"
    )
    assert batch.notes == (why,)  # type: ignore[attr-defined]
    assert f"WARN: {why}" in r.verdict()  # asked for and not run: a warning, not silence


def test_thread_invariance(models: dict[str, Path]) -> None:
    r = xbackend.compare(
        models["mlp_layernorm"], backends=["ort-cpu", "reference"], runs=1, probes="threads", probe_threads=4
    )
    threads = r.probe("threads").rows  # type: ignore[attr-defined]
    ort = [t for t in threads if t.backend == "ort-cpu"]
    assert {t.threads for t in ort} >= {"4"}
    assert all(t.invariant for t in ort)  # ONNX Runtime CPU gives the same bits at 1, default and 4 threads
    ref = [t for t in threads if t.backend == "reference"]
    assert [t.threads for t in ref] == ["4"]  # its default is already 1 BLAS thread
    data = json.loads(xbackend.to_json(r))["probes"]["threads"]
    assert {"backend", "threads", "invariant", "max_ulp"} <= set(data[0])


def test_thread_probe_catches_a_race(models: dict[str, Path], plugins: None) -> None:
    r = xbackend.compare(
        models["scatter_add"],
        backends=["test-racy"],
        runs=1,
        probes="threads",
        probe_threads=2,
        runner_options={"test-racy": {"threads": "1"}},
    )
    (t,) = r.probe("threads").rows  # type: ignore[attr-defined]
    # the injected race lands on the scatter ('pooled') and the output at 2 threads
    assert t.threads == "2" and t.invariant is False and t.first_divergence == "pooled"
    assert t.outputs_equal is False and t.max_ulp == 1
    assert any(
        line.startswith("WARN: test-racy changes with threads (2 vs 1): from pooled") for line in r.verdict()
    )


def test_observer_effect_on_ort_from_a_blocked_fusion(models: dict[str, Path]) -> None:
    backends = ["ort-cpu", "reference"] + (["openvino-cpu"] if HAS_OV else [])
    r = xbackend.compare(models["mlp_layernorm"], backends=backends, runs=1, probes="opt-levels")
    ort = r.backend("ort-cpu").observer
    # With every residual sum exposed, ONNX Runtime cannot fuse Add + LayerNormalization:
    # the shipped (fused) engine gives different outputs than the instrumented one.
    assert ort is not None and ort.outputs_changed is True and (ort.max_ulp or 0) > 0
    assert r.backend("reference").observer is None  # one build serves both: nothing to compare
    if HAS_OV:
        ov = r.backend("openvino-cpu").observer
        assert ov is not None and ov.outputs_changed is False
    extended = next(o for o in r.probe("opt-levels").rows if o.level == "extended")  # type: ignore[attr-defined]
    assert extended.changed_by == ("SkipLayerNormFusion",)
    assert any(line.startswith("WARN: observer effect on ort-cpu") for line in r.verdict())
    md = xbackend.to_markdown(r)
    assert "**Exposing intermediates changed the outputs of ort-cpu" in md
    data = json.loads(xbackend.to_json(r))["backends"][0]["observer_effect"]
    assert data["outputs_changed"] is True and data["max_ulp"] == ort.max_ulp


@pytest.mark.skipif(not HAS_OV, reason="openvino not installed")
def test_observer_effect_on_openvino_attention(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["attention"], backends=["ort-cpu", "openvino-cpu"], runs=1, probes="none")
    ort, ov = r.backend("ort-cpu").observer, r.backend("openvino-cpu").observer
    assert ort is not None and ort.outputs_changed is False
    assert ov is not None
    # Instruction-set dependent, measured: on AVX2-only CPUs OpenVINO's f32 attention picks other
    # kernels when its intermediates are exposed (128 ULP at the output); on AVX-512 CPUs the
    # fused and unfused paths agree bit for bit. Either way output figures come from the plain build.
    assert ov.outputs_changed is ("avx512f" not in ISA)
    cross = r.cross("openvino-cpu") if r.reference_used == "ort-cpu" else r.cross("ort-cpu")
    assert cross.observer_differs is ov.outputs_changed


def test_real_backends_build_the_same_engine(models: dict[str, Path]) -> None:
    backends = ["ort-cpu"] + (["openvino-cpu"] if HAS_OV else [])
    r = xbackend.compare(
        models["convnet"],
        shapes={"image": (1, 3, 32, 32)},
        backends=backends,
        runs=1,
        builds=3,
        probes="none",
    )
    builds = r.probe("builds").backends  # type: ignore[attr-defined]
    for b in builds:
        assert (b.builds, b.distinct_fingerprints, b.builds_vary, b.outputs_differ) == (3, 1, False, False)
    assert {b.backend for b in builds} == set(backends)
    ort_fp = r.backend("ort-cpu").fingerprints
    assert len(set(ort_fp)) == 1 and len(ort_fp[0]) == 64


def test_builds_that_vary_are_flagged_with_their_layers(
    models: dict[str, Path], plugins: None, tmp_path: Path
) -> None:
    r = xbackend.compare(
        models["mlp_layernorm"],
        backends=["test-flaky-build"],
        runs=2,
        builds=3,
        probes="none",
        runner_options={"test-flaky-build": {"state_dir": str(tmp_path), "tensor": "block3.silu"}},
    )
    (bv,) = r.probe("builds").backends  # type: ignore[attr-defined]
    assert bv.builds_vary and bv.distinct_fingerprints == 2
    assert bv.varying_layers == (("block3.silu", ("kernel_a", "kernel_b", "kernel_a")),)
    assert bv.outputs_differ is False  # only an intermediate moved
    b = r.backend("test-flaky-build")
    assert b.deterministic is False and b.distinct_build_outputs == 1
    assert b.first_nondeterministic == "block3.silu"
    assert any(
        line.startswith("WARN: test-flaky-build builds vary: 2 distinct engines in 3 builds")
        for line in r.verdict()
    )
    md = xbackend.to_markdown(r)
    assert "| block3.silu | kernel_a | kernel_b | kernel_a |" in md
    data = json.loads(xbackend.to_json(r))["probes"]["builds"][0]
    assert data["varying_layers"] == [
        {"layer": "block3.silu", "implementations": ["kernel_a", "kernel_b", "kernel_a"]}
    ]


def test_threads_probe_warns_only_when_outputs_move() -> None:
    """As docs/probes.md says: graph outputs that move are a WARN; intermediates alone, a NOTE."""
    from xbackend.probes.threads import ThreadResult, ThreadsResult

    inner = ThreadResult("ort-cpu", "4", "ok", "", False, 1, 0.5, "val_49", outputs_equal=True)
    outer = ThreadResult("openvino-cpu", "4", "ok", "", False, 3, 2.0, "val_7", outputs_equal=False)
    res = ThreadsResult((inner, outer))
    modules = {"val_49": "blocks.3.mlp", "val_7": "blocks.0.attn"}
    found = res.findings(modules)
    assert [f.line for f in found] == [
        "WARN: openvino-cpu changes with threads (4 vs 1): from val_7 (blocks.0.attn) on "
        "(2 scaled ULP at worst at the outputs)",
        "NOTE: ort-cpu at 4 vs 1 thread(s): graph outputs bit-identical; intermediates move from "
        "val_49 (blocks.3.mlp) on",
    ]
    assert [(f.kind.value, f.backend, f.tensor, f.probe) for f in found] == [
        ("threads-vary", "openvino-cpu", "val_7", "threads"),
        ("probe", "ort-cpu", "val_49", "threads"),
    ]
    assert found[0].figure("scaled_ulp") == 2.0
    assert res.promise("thread-count", "ort-cpu")[0] == "broken"  # bits moved: the promise is about bits
