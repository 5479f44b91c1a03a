"""GPU backends on a real GPU. Each test skips, with the reason, where its backend cannot run
(`xbackend backends` gives the same reason); tests of what needs no GPU are in
test_gpu_options.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from roots import ROOT

import xbackend
from xbackend.host import gpu
from xbackend.runners.registry import get_runner

MLP_SPEC = f"{ROOT / 'models' / 'torch_mlp.py'}:build"


def needs(backend: str) -> Any:
    avail = get_runner(backend).availability()
    return pytest.mark.skipif(not avail.available, reason=f"{backend} unavailable here: {avail.reason}")


@needs("ort-cuda")
def test_ort_cuda_runs_convnet_with_tf32_off_and_the_probe_measures_tf32(models: dict[str, Path]) -> None:
    r = xbackend.compare(
        models["convnet"],
        backends=["ort-cpu", "ort-cuda"],
        runs=2,
        shapes=(("image", (8, 3, 32, 32)),),
        probes="tf32,autotune",
    )
    b = r.backend("ort-cuda")
    assert b.ok and b.deterministic, b.reason
    info = dict(b.info)
    # read back from the session, not assumed
    assert info["in_force.use_tf32"] == "0"
    assert info["in_force.cudnn_conv_algo_search"] == "EXHAUSTIVE"
    assert info["providers"].startswith("CUDAExecutionProvider")
    assert info["gpu"] == gpu.driver_info().devices[0]
    env = dict(r.environment)
    assert env["gpu.driver"] == gpu.driver_info().driver and env["gpu.cudnn"] != "not found"
    cross = next(c for c in r.cross_backend if c.backend == "ort-cuda")
    assert cross.status == "ok" and all(d.scaled_ulp is not None for d in cross.output_tensors)

    tf32 = r.probe("tf32").rows  # type: ignore[attr-defined]
    assert [(t.backend, t.tf32, t.status) for t in tf32] == [("ort-cuda", True, "ok")]
    # TF32 rounds the convolutions' multiplicands to 10 mantissa bits
    assert tf32[0].same_bits is False and tf32[0].scaled_ulp > 1

    rows = {row.variant: row for row in r.probe("autotune").rows}  # type: ignore[attr-defined]
    assert set(rows) == {"off", "on", "pinned"}
    assert all(row.status == "ok" for row in rows.values()), [row.reason for row in rows.values()]
    assert rows["pinned"].distinct_outputs == 1


@needs("torch-cuda")
def test_torch_cuda_maps_layers_and_reads_back_its_switches(tmp_path: Path) -> None:
    model = ROOT / "models" / "torch_mlp.onnx"
    r = xbackend.compare(
        model,
        backends=["ort-cpu", "torch-cuda"],
        runs=2,
        probes="tf32,autotune",
        runner_options={"torch-cuda": {"module": MLP_SPEC}},
    )
    b = r.backend("torch-cuda")
    assert b.ok and b.deterministic, b.reason
    info = dict(b.info)
    assert info["torch.backends.cuda.matmul.allow_tf32"] == "False"
    assert info["torch.backends.cudnn.allow_tf32"] == "False"
    assert info["torch.backends.cudnn.benchmark"] == "False"
    assert int(info["mapped_intermediates"]) > 0
    cross = next(c for c in r.cross_backend if c.backend == "torch-cuda")
    assert cross.status == "ok" and len(cross.tensors) > len(cross.output_tensors)

    tf32 = r.probe("tf32").rows  # type: ignore[attr-defined]
    assert tf32[0].status == "ok" and tf32[0].same_bits is False
    rows = {row.variant: row for row in r.probe("autotune").rows}  # type: ignore[attr-defined]
    assert all(row.status == "ok" for row in rows.values()), [row.reason for row in rows.values()]


@needs("ort-trt")
def test_ort_trt_pinned_reuses_its_engine(models: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / "ort-trt-cache"
    r = xbackend.compare(
        models["convnet"],
        backends=["ort-trt"],
        runs=1,
        builds=2,
        shapes=(("image", (8, 3, 32, 32)),),
        probes="none",
        runner_options={"ort-trt": {"autotune": "pinned", "cache": str(cache)}},
    )
    b = r.backend("ort-trt")
    assert b.ok and b.distinct_build_outputs == 1, b.reason
    assert any(p.suffix == ".engine" for p in cache.iterdir())


@needs("trt-pinned")
def test_trt_pinned_records_then_replays_its_timing_cache(models: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / "convnet.timing-cache"
    opts = {"trt-pinned": {"cache": str(cache)}}
    shapes = (("image", (8, 3, 32, 32)),)
    first = xbackend.compare(
        models["convnet"], backends=["trt-pinned"], runs=1, shapes=shapes, probes="none", runner_options=opts
    )
    assert first.backend("trt-pinned").ok, first.backend("trt-pinned").reason
    assert cache.exists()
    again = xbackend.compare(
        models["convnet"], backends=["trt-pinned"], runs=1, builds=2, shapes=shapes, probes="none",
        runner_options=opts,
    )  # fmt: skip
    b = again.backend("trt-pinned")
    info = dict(b.info)
    assert info["timing_cache"] == f"replayed from {cache}"
    assert info["timing_cache_after_build"] == "unchanged"
    assert b.distinct_build_outputs == 1


@needs("trt-autotune")
def test_trt_autotune_names_each_layers_tactic(models: dict[str, Path]) -> None:
    r = xbackend.compare(
        models["convnet"],
        backends=["trt-autotune"],
        runs=1,
        builds=2,
        shapes=(("image", (8, 3, 32, 32)),),
        probes="builds,tf32",
    )
    b = r.backend("trt-autotune")
    assert b.ok, b.reason
    info = dict(b.info)
    assert "clear_flag(TF32)" in info["builder_config"]
    assert int(info["engine_layers"]) > 0


@needs("ort-cuda")
def test_tf32_makes_origins_at_the_matmuls_and_convs_and_off_is_explained(models: dict[str, Path]) -> None:
    """TF32 rounds the multiplicands of every float32 MatMul and Conv to 10 mantissa bits: a
    real precision change, made at those nodes; with TF32 off, cuBLAS and cuDNN only reorder."""
    r = xbackend.compare(
        models["convnet"],
        backends=["ort-cuda@tf32", "ort-cuda", "reference"],
        runner_options={"ort-cuda@tf32": {"tf32": "true"}},
        runs=1,
        shapes=(("image", (8, 3, 32, 32)),),
        probes="none",
    )
    on, off = r.cross("ort-cuda@tf32"), r.cross("ort-cuda")
    assert on.origins and {o.op_type for o in on.origins} <= {"Conv", "MatMul", "Gemm"}, on.origins
    assert off.explained is True, off.origins


@needs("ort-cuda")
@needs("torch-cuda")
def test_cuda_engines_are_judged_per_node_on_attention_and_an_mlp() -> None:
    """Each CUDA engine's nodes against float64 on the graph it runs: ORT CUDA's optimized graph
    (or the unfused one, with the reason), torch-cuda at its modules. TF32 off only reorders, so
    every node is within its allowance; TF32 on is a real loss, caught at the matrix products."""
    r = xbackend.compare(
        ROOT / "models" / "attention.onnx",
        backends=["ort-cuda@tf32", "ort-cuda", "reference"],
        runner_options={"ort-cuda@tf32": {"tf32": "true"}},
        runs=1,
        probes="none",
    )
    off, on = r.explanation.local_for("ort-cuda"), r.explanation.local_for("ort-cuda@tf32")
    assert off is not None and off.status == "ok" and off.origins == (), (
        off and off.reason,
        off and off.origins,
    )
    assert on is not None and on.origins, on and on.reason
    assert {o.op_type for o in on.origins} <= {"MatMul", "Gemm", "FusedMatMul"}, on.origins
    print("ort-cuda judged on:", off.graph)
    t = xbackend.compare(
        ROOT / "models" / "torch_mlp.onnx",
        backends=["torch-cuda", "reference"],
        runs=1,
        probes="none",
        runner_options={"torch-cuda": {"module": MLP_SPEC}},
    )
    le = t.explanation.local_for("torch-cuda")
    assert le is not None and le.status == "ok" and le.origins == (), (le and le.reason, le and le.origins)
    assert t.exit_code == 0, t.verdict()


def _mode_rows(r: Any) -> dict[str, Any]:
    (fam,) = r.cost_of_determinism()
    return {m.backend: m for m in fam.rows}


@needs("ort-cuda")
def test_scatter_add_atomics_on_ort_cuda_and_what_deterministic_compute_costs(
    models: dict[str, Path],
) -> None:
    """ScatterND(reduction=add) with 128 points per cell: CUDA atomics. Whether
    use_deterministic_compute covers it is what this measures; either way the promise is
    checked, a break is exit 16 at the scatter, and every mode is timed."""
    r = xbackend.compare(models["scatter_add"], modes="ort-cuda", runs=10, timed_runs=10, probes=["none"])
    rows = _mode_rows(r)
    assert set(rows) == {"ort-cuda", "ort-cuda@det", "ort-cuda@pinned", "ort-cuda@det-pinned"}
    det = rows["ort-cuda@det"]
    assert det.promised == ("run-to-run",)
    if det.broken:
        assert r.exit_code == 16
        broken = next(c for c in r.broken_promises if c.backend == "ort-cuda@det")
        assert broken.first_layer == "pooled"
    else:
        assert det.held == ("run-to-run",) and det.distinct_run_outputs == 1
    # every compared run is timed: 10 runs + 10 timed runs, less the build's first as warm-up
    # (asserting 10 failed on an H200: the runs are 19)
    assert all(m.latency is not None and m.latency.runs == 19 and m.ratio for m in rows.values())


@needs("torch-cuda")
def test_index_add_on_torch_cuda_is_deterministic_in_deterministic_mode() -> None:
    """torch documents index_add_ on CUDA among the ops use_deterministic_algorithms(True) makes
    deterministic; the default uses atomics."""
    model = ROOT / "models" / "torch_index_add.onnx"
    trust = {"trust_model_code": "true"}
    r = xbackend.compare(
        model,
        modes="torch-cuda",
        runs=10,
        timed_runs=10,
        probes=["none"],
        runner_options={b: trust for b in ("torch-cuda", "torch-cuda@det", "torch-cuda@pinned")},
    )
    rows = _mode_rows(r)
    det = rows["torch-cuda@det"]
    assert det.held == ("run-to-run",) and det.distinct_run_outputs == 1
    assert dict(r.backend("torch-cuda@det").info)["in_force.CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert dict(r.backend("torch-cuda@det").info)["in_force.use_deterministic_algorithms"] == "True"
    assert all(m.latency is not None and m.ratio for m in rows.values())


@needs("torch-cuda")
def test_batch_probe_on_cuda_with_and_without_batch_invariant(tmp_path: Path) -> None:
    """The batch probe on torch-cuda and on Inductor's CUDA kernels, default and batch-invariant:
    the batch-invariant mode's promise is checked by the probe, not assumed."""
    from xbackend.export.torch_onnx import InputDecl, export_torch

    model = tmp_path / "mlp.onnx"
    spec = f"{ROOT / 'tests' / 'wide_mlp.py'}:build"
    export_torch(spec, [InputDecl.parse("x=4,512")], model, output_names=["y"], dynamic={"x": {0: "batch"}})
    cuda = {"module": spec, "device": "cuda"}
    r = xbackend.compare(
        model,
        backends=["torch-cuda", "torch-compile", "torch-compile@bi"],
        runner_options={
            "torch-cuda": {"module": spec},
            "torch-compile": cuda,
            "torch-compile@bi": {**cuda, "batch_invariant": "true"},
        },
        shapes=(("x", (4, 512)),),
        batch_invariance=4,
        probes=["batch"],
        runs=2,
    )
    from torch._inductor import config

    rows = {row.backend: row for row in r.probe("batch").rows}  # type: ignore[attr-defined]
    if not hasattr(config, "batch_invariant"):  # torch 2.11 (the GPU hosts' image): no such mode
        assert set(rows) == {"torch-cuda", "torch-compile"}
        assert "has no torch._inductor.config.batch_invariant" in r.backend("torch-compile@bi").reason
        return
    assert set(rows) == {"torch-cuda", "torch-compile", "torch-compile@bi"}
    assert all(row.status == "ok" for row in rows.values()), [row.reason for row in rows.values()]
    (check,) = [c for c in r.promise_checks() if c.name == "batch-position"]
    assert check.backend == "torch-compile@bi" and check.status in ("held", "broken")
    assert (check.status == "broken") == (r.exit_code == 16)
