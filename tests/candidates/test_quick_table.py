"""The quick table: `--candidate C --probes none --runs 1` with nothing decoded, decided or
advised. Its SQNR per tensor is the full comparison's and ONNX Runtime's qdq_loss_debug's; what it
leaves out is said; the spare workers it starts are used or stopped; its memory plan sizes no
further than the budget asks (benchmarks/candidates.py times it beside qdq_loss_debug)."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from roots import ROOT

import xbackend
from tests import candidate_models as cm
from xbackend.candidates.run import quick_options
from xbackend.model import footprint
from xbackend.results import CompareOptions
from xbackend.results.explanation import QUICK_DECLINED
from xbackend.runners import registry

LLAMA = ROOT / "tests" / "optimum" / "llama.onnx"
session_module = importlib.import_module("xbackend.candidates.session")


@pytest.fixture(scope="module")
def qdq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cm.qdq(tmp_path_factory.mktemp("quick") / "qdq.onnx")


def _sqnr(r: xbackend.Result) -> dict[str, float | None]:
    (c,) = r.candidates
    assert c.status == "ok", c.reason
    return {m.original: m.sqnr_db for m in c.matches}


def test_the_quick_table_is_the_full_comparisons_and_says_what_it_left_out(qdq: Path) -> None:
    """Same SQNR on every matched tensor, same events, as the comparison with its plain builds and
    its explanation (--runs 2); the reference and the explanation are left out, and said."""
    quick = xbackend.compare(cm.MLP, candidates=[str(qdq)], probes=["none"], runs=1, seed=3)
    full = xbackend.compare(
        cm.MLP, candidates=[str(qdq)], probes=["none"], runs=2, seed=3, backends=["ort-cpu"]
    )
    assert [b.name for b in quick.backends] == ["ort-cpu"]  # the default reference did not run
    assert _sqnr(quick) == _sqnr(full)
    assert len(_sqnr(quick)) == 49 and min(v for v in _sqnr(quick).values() if v is not None) > 20
    assert quick.candidates[0].events == full.candidates[0].events
    (note,) = [n for n in quick.notes if n.startswith("the quick table")]
    assert "the original's reference did not run" in note
    assert "no tensor was explained against float64" in note and "drop --runs 1" in note
    assert not any(n.startswith("the quick table") for n in full.notes)
    assert f"NOTE: {note}" in quick.verdict()  # in place of "no explanation: --noise-samples 0"
    assert f"NOTE: candidate {qdq}: its nodes were not judged at their precision: {QUICK_DECLINED}" in (
        [f.line for f in quick.candidates[0].verdict_findings()]
    )
    assert quick.backends[0].observer is None  # one build: nothing to hold its outputs against
    assert full.backends[0].observer is not None


def test_the_quick_tables_sqnr_is_qdq_loss_debugs(qdq: Path, tmp_path: Path) -> None:
    """ONNX Runtime's own per-tensor SQNR of the same float model and QDQ candidate on the same
    feed: every tensor both report agrees to 1e-3 dB."""
    from onnxruntime.quantization import CalibrationDataReader, qdq_loss_debug

    feeds = {"x": np.random.default_rng(5).standard_normal((1, 16, 64)).astype(np.float32)}
    np.savez(tmp_path / "feed.npz", **feeds)

    class Once(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([feeds])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    qdq_loss_debug.modify_model_output_intermediate_tensors(str(cm.MLP), str(tmp_path / "f.onnx"))
    qdq_loss_debug.modify_model_output_intermediate_tensors(str(qdq), str(tmp_path / "q.onnx"))
    pairs = qdq_loss_debug.create_activation_matching(
        qdq_loss_debug.collect_activations(str(tmp_path / "q.onnx"), Once()),
        qdq_loss_debug.collect_activations(str(tmp_path / "f.onnx"), Once()),
    )
    theirs = {k: float(v["xmodel_err"]) for k, v in qdq_loss_debug.compute_activation_error(pairs).items()}
    ours = _sqnr(
        xbackend.compare(
            cm.MLP, candidates=[str(qdq)], probes=["none"], runs=1, inputs=str(tmp_path / "feed.npz")
        )
    )
    both = sorted(set(theirs) & set(ours))
    assert len(both) >= 8
    assert {t: round(ours[t] or 0, 3) for t in both} == {t: round(theirs[t], 3) for t in both}


def test_what_makes_the_table_quick() -> None:
    base: dict[str, Any] = {"candidates": ["c.onnx"], "probes": ["none"], "runs": 1}
    got = quick_options(CompareOptions.create(**base))
    assert got is not None
    opts, note = got
    assert opts.backends == ("ort-cpu",) and opts.reference == "ort-cpu" and opts.noise_samples == 0
    for other in ({"runs": 3}, {"probes": None}, {"decode": 4}, {"decisions": ["auto"]}, {"builds": 2}):
        assert quick_options(CompareOptions.create(**{**base, **other})) is None, other
    assert quick_options(CompareOptions.create(**{**base, "candidates": []})) is None
    # an explanation asked for is kept, and not said to be missing
    kept = quick_options(CompareOptions.create(**base, noise_samples=8))
    assert kept is not None and kept[0].noise_samples == 8 and "explained" not in kept[1]
    # backends named all run, a judge among them explains as asked
    named = quick_options(CompareOptions.create(**base, backends=["ort-cpu", "ort-cpu@1t", "oracle"]))
    assert named is not None and named[0].backends == ("ort-cpu", "ort-cpu@1t", "oracle")
    assert named[0].noise_samples is None and "original's" not in named[1] and "explained" not in named[1]
    assert "the original's reference did not run" in note and "no tensor was explained" in note


def test_spare_workers_take_the_jobs_and_none_outlives_the_run(
    qdq: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two spares (the original's and the candidate's) start ahead; each takes its model's build,
    no other worker starts, and none is left running after."""
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    class Counted(real):  # type: ignore[misc,valid-type]
        def __init__(self, args: list[str], **kw: Any) -> None:
            super().__init__(args, **kw)
            if "xbackend.execution.worker" in args:
                started.append(self)

    monkeypatch.setattr(subprocess, "Popen", Counted)
    r = xbackend.compare(cm.MLP, candidates=[str(qdq)], probes=["none"], runs=1)
    assert r.candidates[0].status == "ok"
    assert [("--wait" in p.args) for p in started] == [True, True]
    assert all(p.poll() is not None for p in started)


def test_a_spare_that_died_waiting_leaves_the_job_to_a_fresh_worker(
    qdq: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = session_module.prestart

    def dying(env: Any, target: str, folder: Path) -> None:
        real(env, target, folder)
        from xbackend.execution import isolation

        for procs in isolation._SPARE.values():
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()

    monkeypatch.setattr(session_module, "prestart", dying)
    r = xbackend.compare(cm.MLP, candidates=[str(qdq)], probes=["none"], runs=1, seed=3)
    full = xbackend.compare(
        cm.MLP, candidates=[str(qdq)], probes=["none"], runs=2, seed=3, backends=["ort-cpu"]
    )
    assert r.backends[0].ok and _sqnr(r) == _sqnr(full)


def _llama_shapes(proto: onnx.ModelProto, tokens: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {
        n: (1, tokens) for n in ("input_ids", "attention_mask", "position_ids")
    }
    for i in proto.graph.input:
        if i.name.startswith("past"):
            d = [x.dim_value for x in i.type.tensor_type.shape.dim]
            shapes[i.name] = (1, d[1], 0, d[3])
    return shapes


def test_the_quick_table_sizes_memory_no_further_than_its_budget_asks() -> None:
    """onnx's inference leaves the Llama's mask and rotary tensors open (Range): under a budget
    16x what they could take, counted at the largest sized tensor, they stay open (no symbolic
    pass, no sizing run) and the plan says so; under a small budget, or outside the quick table,
    ONNX Runtime's symbolic inference sizes every one."""
    proto = onnx.load(LLAMA)
    shapes = _llama_shapes(proto, 12)
    quick = footprint.tensor_bytes(proto, shapes, budget=16 << 30)
    assert (quick.symbolic, quick.onnx, len(quick.unsized), quick.bounded) == (0, 534, 91, 16 << 30)
    assert "/model/Range_output_0" in quick.unsized
    assert "takes under 1/16 of 16 GiB" in quick.describe()
    for full in (
        footprint.tensor_bytes(proto, shapes, budget=1 << 20),
        footprint.tensor_bytes(proto, shapes),
    ):
        assert (full.symbolic, len(full.unsized), full.bounded) == (625, 0, 0)
        assert {t: quick[t] for t in quick} == {t: full[t] for t in quick}  # where both sized, alike


def test_symbolic_shape_inference_loads_without_torch() -> None:
    """ONNX Runtime's tools package imports torch where it is installed (1.3 s, 300 MB); the
    class is read from its file instead."""
    code = (
        "import sys; from xbackend.model import footprint as f; "
        "assert f._symbolic_shape_inference() is not None; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_runners_installed_while_running_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry points are read once per state of the import folders: a plugin installed (its
    folder changes) is found, and gone once removed."""
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "quick-plugin" not in registry.runner_names()
    info = tmp_path / "quick_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: quick-plugin\nVersion: 1.0\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(
        "[xbackend.runners]\nquick-plugin = tests.plugin_runners:Nothing\n", encoding="utf-8"
    )
    os.utime(tmp_path, ns=(0, os.stat(tmp_path).st_mtime_ns + 1))  # a coarse clock: the change shows
    assert "quick-plugin" in registry.runner_names()
    for f in info.iterdir():
        f.unlink()
    info.rmdir()
    os.utime(tmp_path, ns=(0, os.stat(tmp_path).st_mtime_ns + 1))
    assert "quick-plugin" not in registry.runner_names()
