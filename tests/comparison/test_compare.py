"""End to end through worker processes, on real engines and on test runners with known behaviour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import xbackend
from xbackend.errors import BackendUnavailableError, ModelLoadError, UsageError
from xbackend.runners.ort_cpu import physical_cores

pytestmark = pytest.mark.slow


def test_mlp_is_deterministic_and_close_to_reference(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["mlp_layernorm"], runs=3, builds=2)
    ort, ref = r.backend("ort-cpu"), r.backend("reference")
    assert ort.deterministic and ref.deterministic
    assert (ort.distinct_outputs, ort.runs, ort.builds, ort.exposed) == (1, 3, 2, 49)
    cross = r.cross("ort-cpu")
    assert cross.reference == "reference" and not cross.bitwise_equal
    # LayerNorm is the first op and both engines reduce in a different order.
    assert cross.first_divergence == "block0.ln.out"
    assert cross.first_violation is None
    assert cross.scaled_ulp is not None and 1 <= cross.scaled_ulp <= 32
    assert r.exit_code == 0 and r.verdict()[0].startswith("PASS")
    assert dict(ort.options) == {
        "deterministic_compute": "False",
        "inter_op_threads": "1",
        "opt_level": "all",
        "threads": str(physical_cores()),
    }
    assert dict(ort.info)["providers"] == "CPUExecutionProvider"
    assert dict(ref.info)["threads"] == "1"
    assert dict(ref.info)["env.OPENBLAS_NUM_THREADS"] == "1"  # pinned in its own process


def test_scatter_add_is_nondeterministic_on_ort_with_several_threads(tmp_path: Path) -> None:
    """A real race, made overwhelming: 2048 updates into 2 cells, more threads than this
    machine has cores, 8 runs, and up to 3 tries (a loaded machine may serialize the threads)."""
    import onnx

    from xbackend.model.samples import scatter_add

    path = tmp_path / "scatter_race.onnx"
    onnx.save(scatter_add(points=2048), path)
    for _ in range(3):
        r = xbackend.compare(path, backends=["ort-cpu"], runs=8, runner_options={"ort-cpu": {"threads": "4"}})
        if r.backend("ort-cpu").deterministic is False:
            break
    ort = r.backend("ort-cpu")
    assert ort.deterministic is False
    # the race may land in the per-layer build's runs only: then the outputs agree
    assert ort.distinct_outputs >= 2 or ort.first_nondeterministic == "pooled"
    # The race shows at the scatter ('pooled') and what follows it; features (MatMul) before it
    # stay identical. Races are random per build: the plain build's outputs may race while the
    # instrumented build's runs happen to agree, so the first varying tensor is 'pooled' or 'y'.
    assert ort.first_nondeterministic in ("pooled", "y")
    varying = {d.name for d in ort.varying()}
    assert "y" in varying and varying <= {"pooled", "y"}
    assert r.exit_code == 1 and r.verdict()[0].startswith("FAIL: ort-cpu: nondeterministic")


def test_scatter_add_is_deterministic_with_one_thread(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["scatter_add"], runs=4, runner_options={"ort-cpu": {"threads": "1"}})
    assert r.backend("ort-cpu").deterministic
    assert r.backend("ort-cpu").distinct_outputs == 1
    cross = r.cross("ort-cpu")
    # Whether MLAS's MatMul and numpy's OpenBLAS sgemm agree bit for bit depends on the kernel
    # OpenBLAS picks for the CPU (numpy 2.4.6's OpenBLAS 0.3.31 agrees on Zen 4, earlier builds
    # did not); with one thread the scatter adds in index order, as the reference does, so
    # nothing diverges first after the MatMul.
    assert cross.first_divergence in (None, "features")
    assert cross.first_violation is None


def test_known_ulp_nudge_is_found_at_the_right_tensor(models: dict[str, Path], plugins: None) -> None:
    """3 ULP on one Add, which IEEE 754 rounds correctly: the first divergence is there, and the
    node is an origin there (its local error against float64 is 2.5 to 3.5 ULP where half of one
    to one is allowed); the outputs are untouched."""
    r = xbackend.compare(
        models["mlp_layernorm"],
        backends=["test-nudge", "reference"],
        runs=1,
        runner_options={"test-nudge": {"tensor": "block2.fc1.out", "ulps": "3"}},
    )
    c = r.cross("test-nudge")
    assert c.first_divergence == "block2.fc1.out"
    nudged = next(d for d in c.tensors if d.name == "block2.fc1.out")
    assert nudged.max_ulp == 3 and nudged.mismatch_fraction == 1.0
    assert sum(not d.bitwise_equal for d in c.tensors) == 1
    assert c.bitwise_equal is True and c.max_ulp == 0  # outputs (what bitwise_equal is about) untouched
    assert [o.tensor for o in c.origins][:1] == ["block2.fc1.out"] and c.first_violation == "block2.fc1.out"
    assert r.exit_code == 1


def test_nudge_past_tolerance_at_the_output(models: dict[str, Path], plugins: None) -> None:
    r = xbackend.compare(
        models["mlp_layernorm"],
        backends=["test-nudge", "reference"],
        runs=1,
        max_ulp=2,
        runner_options={"test-nudge": {"tensor": "y", "ulps": "5"}},
    )
    c = r.cross("test-nudge")
    assert c.max_ulp == 5 and c.first_violation == "y" and c.violates
    assert r.exit_code == 1


def test_a_crash_a_hang_and_a_missing_library_do_not_stop_the_others(
    models: dict[str, Path], plugins: None
) -> None:
    r = xbackend.compare(
        models["attention"],
        backends=["ort-cpu", "test-crash", "test-hang", "test-missing", "reference"],
        runs=1,
        timeout=20,
    )
    crash, hang, missing = r.backend("test-crash"), r.backend("test-hang"), r.backend("test-missing")
    assert crash.status == "failed" and "crashed with SIGABRT" in crash.reason
    assert hang.status == "failed" and "timed out after 20 s" in hang.reason
    assert missing.status == "unavailable" and missing.reason == "libtest.so not installed"
    assert r.backend("ort-cpu").ok and r.cross("ort-cpu").status == "ok"
    assert r.cross("test-crash").status == "skipped"
    assert r.exit_code == 1


def test_every_backend_failing_exits_3(models: dict[str, Path], plugins: None) -> None:
    r = xbackend.compare(models["attention"], backends=["test-crash"], runs=1)
    assert r.exit_code == 3 and r.verdict() == [
        "FAIL: every backend failed; nothing was compared",
        "FAIL: test-crash failed: crashed with SIGABRT",
    ]


def test_partial_exposure_compares_common_tensors(models: dict[str, Path], plugins: None) -> None:
    r = xbackend.compare(models["attention"], backends=["test-outputs-only", "reference"], runs=1)
    b = r.backend("test-outputs-only")
    assert b.exposed == 1 and len(b.not_exposed) == len(r.model.tensors) - 1
    assert dict(b.not_exposed)["probs"] == "fused away"
    c = r.cross("test-outputs-only")
    assert [d.name for d in c.tensors] == ["y"] and c.bitwise_equal
    assert "probs" in c.only_in_reference


def test_outputs_only(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["attention"], runs=1, outputs_only=True)
    c = r.cross("ort-cpu")
    assert [d.name for d in c.output_tensors] == ["y"] and c.tensors == ()
    assert c.layers_note == "graph outputs only"
    assert r.backend("ort-cpu").exposed == 1


def test_ir14_model_is_downgraded_for_ort_and_says_so(tmp_path: Path) -> None:
    g = helper.make_graph(
        [helper.make_node("Sqrt", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    assert m.ir_version == 14
    p = tmp_path / "ir14.onnx"
    onnx.save(m, str(p))
    np.savez(tmp_path / "in.npz", x=np.arange(8, dtype=np.float32))
    r = xbackend.compare(p, runs=1, inputs=tmp_path / "in.npz")
    assert r.backend("ort-cpu").ok
    assert dict(r.backend("ort-cpu").info)["ir_version"].startswith("14 -> 13")
    assert r.notes == (
        "ort-cpu: model IR version 14 was downgraded to 13 for this backend; "
        "the model uses nothing newer, so the graph is unchanged",
    )
    assert r.cross("ort-cpu").bitwise_equal  # sqrt is correctly rounded on both


def test_ir14_model_with_new_opset_is_refused(tmp_path: Path) -> None:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
    )
    p = tmp_path / "ir14.onnx"
    onnx.save(helper.make_model(g), str(p))
    # Only ort-cpu asked for: nothing can load it, so the run is refused.
    with pytest.raises(
        ModelLoadError,
        match=r"no backend can load .*ort-cpu: reads ONNX IR version <= 13 .* opset ai.onnx 28",
    ):
        xbackend.compare(p, backends=["ort-cpu"])
    # With the reference evaluator beside it, ort-cpu is unavailable for this model and the rest runs.
    r = xbackend.compare(p, runs=1, probes="none")
    assert r.backend("ort-cpu").status == "unavailable"
    assert "opset ai.onnx 28 (IR 13 allows at most 27)" in r.backend("ort-cpu").reason
    assert r.backend("reference").ok and r.exit_code == 1


def _flex_attention(path: Path) -> Path:
    """onnx 1.23's preview-domain FlexAttention between two standard ops: onnx's reference
    evaluator runs it, ONNX Runtime 1.31 and OpenVINO do not."""
    shape = [1, 2, 8, 16]
    g = helper.make_graph(
        [
            helper.make_node("Mul", ["q", "two"], ["q2"]),
            helper.make_node("FlexAttention", ["q2", "k", "v"], ["a"], domain="ai.onnx.preview"),
            helper.make_node("Add", ["a", "q"], ["y"]),
        ],
        "flex",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("ai.onnx.preview", 1)]
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 11
    onnx.save(m, str(path))
    return path


def test_a_preview_domain_op_runs_where_a_listed_backend_implements_it(tmp_path: Path) -> None:
    p = _flex_attention(tmp_path / "flex.onnx")
    r = xbackend.compare(
        p, backends=["ort-cpu", "openvino-cpu", "reference", "oracle"], runs=2, probes="none"
    )
    for engine in ("ort-cpu", "openvino-cpu"):
        assert r.backend(engine).status == "unavailable"
        assert r.backend(engine).reason == "it does not implement op(s) ai.onnx.preview:FlexAttention"
    assert r.backend("reference").ok and r.backend("oracle").ok
    oracle = r.cross("oracle")  # FlexAttention in float64 beside the reference
    assert oracle.status == "ok" and oracle.scaled_ulp is not None and oracle.scaled_ulp <= 2
    # Only engines without the domain listed: refused, saying what works.
    with pytest.raises(
        ModelLoadError, match=r"no backend can load .*FlexAttention; add reference to --backends"
    ):
        xbackend.compare(p, backends=["ort-cpu"])


def test_opset_newer_than_the_engine_makes_it_unavailable_for_the_model(tmp_path: Path) -> None:
    # Opset 27 is valid for IR 13 but newer than onnxruntime 1.31 supports.
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 27)])
    m.ir_version = 13
    p = tmp_path / "opset27.onnx"
    onnx.save(m, str(p))
    r = xbackend.compare(p, runs=1)
    ort = r.backend("ort-cpu")
    assert ort.status == "unavailable"
    assert ort.reason.startswith("onnxruntime 1.31.1 cannot load this model:")
    assert "support for domain ai.onnx is till opset 26" in ort.reason
    assert r.backend("reference").ok
    assert r.backend("reference").ok and r.exit_code == 1


def test_external_data_model_runs(tmp_path: Path, models: dict[str, Path]) -> None:
    p = tmp_path / "ext.onnx"
    onnx.save(
        onnx.load(str(models["attention"])),
        str(p),
        save_as_external_data=True,
        location="attention.bin",
        size_threshold=1024,  # weights out, shape constants in (as exporters do)
    )
    r = xbackend.compare(p, runs=1)
    assert r.model.external_data and r.backend("ort-cpu").ok and r.backend("reference").ok
    assert r.cross("ort-cpu").first_divergence == "ln.out"  # as for the same model stored inline


def test_unknown_backend_lists_the_known_ones(models: dict[str, Path], plugins: None) -> None:
    with pytest.raises(
        BackendUnavailableError,
        match=r"unknown backend 'tensorrt'; known backends: executorch, executorch-xnnpack, expected, groq "
        r"\(unavailable\), llama.cpp, openvino-cpu, openvino-cpu-default, "
        r"oracle, "
        r"ort-cpu, .*reference, .*"
        r"test-missing \(unavailable\).*`xbackend backends` says why",
    ):
        xbackend.compare(models["attention"], backends=["tensorrt"])


def test_bad_options(models: dict[str, Path]) -> None:
    with pytest.raises(
        UsageError,
        match="ort-cpu has no option thread; its options are: deterministic_compute, "
        "inter_op_threads, opt_level, python, save_optimized, threads",
    ):
        xbackend.compare(models["attention"], runner_options={"ort-cpu": {"thread": "1"}})
    with pytest.raises(
        UsageError, match=r"opt_level='max' is not one of disable, basic, extended, layout, all"
    ):
        xbackend.compare(models["attention"], runner_options={"ort-cpu": {"opt_level": "max"}})
    with pytest.raises(UsageError, match="unknown compare option"):
        xbackend.compare(models["attention"], rusn=3)


def test_reference_and_oracle_map_external_weights_and_compute_the_same(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    """The reference and the oracle read weights in external files (one file per weight here)
    as read-only maps, the oracle's promoted to float64 into files of its own: the same bits as
    the same model with its weights inline."""
    inline = tmp_path / "inline" / "m.onnx"
    ext = tmp_path / "ext" / "m.onnx"
    for p in (inline, ext):
        p.parent.mkdir()
    proto = onnx.load(str(models["mlp_layernorm"]))
    onnx.save(proto, str(inline))
    onnx.save(proto, str(ext), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)
    assert len(list(ext.parent.iterdir())) > 3  # a file per weight
    got = {}
    for p in (inline, ext):
        r = xbackend.compare(p, backends=["reference", "oracle"], runs=1, probes="none", noise_samples=0)
        assert r.backend("reference").ok and r.backend("oracle").ok, r.verdict()
        got[p] = {b.name: b.digests() for b in r.backends}
    assert got[inline] == got[ext]


def test_map_external_maps_plain_weights_and_reads_the_rest(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    from xbackend.model.extdata import IN_MEMORY, map_external
    from xbackend.model.load import load_proto

    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    packed = helper.make_tensor("q", TensorProto.INT4, [4], bytes([0xE1, 0xC3]), raw=True)  # 1,-2,3,-4
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Identity", ["q"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(w, "w"), packed],
    )
    path = tmp_path / "m.onnx"
    onnx.save(
        helper.make_model(g), str(path), save_as_external_data=True, location="m.data", size_threshold=0
    )
    proto = load_proto(path, load_external=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer)
    weights = map_external(proto, path)
    (key,) = weights
    assert key.startswith(IN_MEMORY) and isinstance(weights[key], np.memmap)
    assert not weights[key].flags.writeable and np.array_equal(weights[key], w)
    by = {t.name: t for t in proto.graph.initializer}
    assert [e.value for e in by["w"].external_data if e.key == "location"] == [key]
    # 4-bit weights pack two to a byte: read into the proto as before
    assert by["q"].data_location == TensorProto.DEFAULT and by["q"].raw_data == bytes([0xE1, 0xC3])
