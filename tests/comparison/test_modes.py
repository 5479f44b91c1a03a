"""Determinism modes as checked promises, and what each costs: option translation, the promises
each mode declares, latency from the compared runs, the Cost of determinism table, and Triton's
configuration choice as a pin file records it (no GPU needed for any of it)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from roots import TESTS

import xbackend
from tests.cli_helpers import one_line_error, run
from xbackend.errors import UsageError
from xbackend.report import to_json, to_markdown
from xbackend.results import BackendResult, Latency
from xbackend.results.cost import families
from xbackend.results.options import MODES_TIMED_RUNS, CompareOptions, expand_modes
from xbackend.runners.inductor_pin import TIMINGS_ATTR, PinMiss, Tuning, triton_config_name, triton_key
from xbackend.runners.registry import get_runner

# (runner, options set, what that configuration promises)
PROMISES = [
    ("ort-cpu", {}, set()),
    ("ort-cpu", {"deterministic_compute": "true"}, {"run-to-run"}),
    ("ort-cuda", {"deterministic_compute": "true"}, {"run-to-run"}),
    ("ort-cuda", {"autotune": "pinned"}, {"build-to-build"}),
    ("ort-cuda", {"autotune": "on"}, set()),
    ("ort-trt", {"autotune": "pinned"}, {"build-to-build"}),
    ("torch", {"deterministic": "true"}, {"run-to-run"}),
    ("torch-cuda", {"deterministic": "true"}, {"run-to-run"}),
    ("torch-cuda", {"autotune": "pinned"}, {"build-to-build"}),
    ("torch-cuda", {"autotune": "on"}, set()),
    ("torch-compile", {}, set()),
    ("torch-compile", {"deterministic": "true"}, {"run-to-run", "build-to-build"}),
    ("torch-compile-autotune", {"deterministic": "true"}, {"run-to-run", "build-to-build"}),
    (
        "torch-compile-autotune",
        {"batch_invariant": "true"},
        {"run-to-run", "build-to-build", "batch-position"},
    ),
    ("torch-compile-autotune", {"pin": "choices.json"}, {"build-to-build"}),
    ("trt-autotune", {}, set()),
    ("trt-pinned", {}, {"build-to-build"}),
    ("reference", {}, set()),
]


@pytest.mark.parametrize(("runner", "options", "promised"), PROMISES)
def test_each_mode_declares_its_promise(runner: str, options: dict[str, str], promised: set[str]) -> None:
    cls = get_runner(runner)
    assert cls.promises_for(cls.resolve_options(options)) == promised


def test_modes_expand_into_instances_with_their_options() -> None:
    listed, sets = expand_modes(("reference",), ("torch-compile-autotune",))
    assert listed == (
        "reference",
        "torch-compile-autotune",
        "torch-compile-autotune@det",
        "torch-compile-autotune@bi",
    )
    assert sets == (
        ("torch-compile-autotune@det", "deterministic", "true"),
        ("torch-compile-autotune@bi", "batch_invariant", "true"),
    )
    opts = CompareOptions.create(modes="ort-cpu")
    assert opts.backends == ("ort-cpu", "ort-cpu@det")
    assert opts.options_for("ort-cpu@det") == {"deterministic_compute": "true"}
    assert opts.timed_runs == MODES_TIMED_RUNS and opts.shows_times
    assert opts.reference_name == "ort-cpu"  # the default mode: every other mode against it
    # a --set for a mode's instance wins over the mode's own options
    opts = CompareOptions.create(
        modes="ort-cpu", runner_options={"ort-cpu@det": {"threads": "1"}}, timed_runs=0
    )
    assert opts.options_for("ort-cpu@det") == {"deterministic_compute": "true", "threads": "1"}
    assert not opts.shows_times
    with pytest.raises(UsageError, match="reference declares no determinism modes; compare its settings"):
        expand_modes((), ("reference",))


def test_modes_of_a_runner_without_any_is_one_line(models: dict[str, Path], capsys: Any) -> None:
    code, _, err = run(capsys, "compare", str(models["mlp_layernorm"]), "--modes", "reference")
    assert code == 2
    one_line_error(err, "reference declares no determinism modes")


def test_latency_is_median_min_max_of_the_runs() -> None:
    lat = Latency.of([0.003, 0.001, 0.002])
    assert lat == Latency(2.0, 1.0, 3.0, 3)
    even = Latency.of([0.004, 0.001, 0.002, 0.003])
    assert even is not None and even.median_ms == pytest.approx(2.5) and even.runs == 4
    assert Latency.of([]) is None


def _backend(
    name: str, options: dict[str, str], median: float, promises: tuple[str, ...] = ()
) -> BackendResult:
    return BackendResult(
        name,
        "ok",
        options=tuple(sorted(options.items())),
        runs=3,
        builds=2,
        distinct_run_outputs=1,
        distinct_build_outputs=1,
        promises=promises,
        latency=Latency(median, median / 2, median * 2, 4),
    )


def test_families_group_instances_and_price_each_mode_against_the_default() -> None:
    backends = [
        _backend("ort-cpu@det", {"deterministic_compute": "True", "threads": "2"}, 3.0, ("run-to-run",)),
        _backend("reference", {"threads": "1"}, 50.0),
        _backend("ort-cpu", {"deterministic_compute": "False", "threads": "2"}, 2.0),
        BackendResult("ort-cpu@far", "ok", options=(("threads", "2"),), loaded_from="far"),  # another host
    ]
    fams = families(backends, [])
    assert [f.runner for f in fams] == ["ort-cpu"]
    f = fams[0]
    assert f.default == "ort-cpu"  # the runner's own name, though listed second
    det = next(r for r in f.rows if r.backend == "ort-cpu@det")
    assert det.mode == "deterministic_compute=True"
    assert det.ratio == pytest.approx(1.5)
    assert det.unchecked == () and det.promise_words() == "none"  # no checks passed in
    assert [r.backend for r in f.rows] == ["ort-cpu@det", "ort-cpu"]


@pytest.fixture(scope="module")
def moded(models: dict[str, Path], plugin_path: Path) -> Any:
    """test-moded under its three modes on the scatter model, 2 timed runs per build, 2 builds."""
    mp = pytest.MonkeyPatch()
    import os
    import sys

    tests = str(TESTS)
    mp.syspath_prepend(tests)
    mp.syspath_prepend(str(plugin_path))
    mp.setenv("PYTHONPATH", os.pathsep.join([str(plugin_path), tests, os.environ.get("PYTHONPATH", "")]))
    try:
        r = xbackend.compare(
            models["scatter_add"], modes="test-moded", runs=3, builds=2, timed_runs=2, probes=["none"]
        )
    finally:
        mp.undo()
        sys.modules.pop("plugin_runners", None)
    return r


def test_a_mode_that_breaks_its_promise_fails_and_the_cost_table_says_so(moded: Any) -> None:
    r = moded
    assert [b.name for b in r.backends] == ["test-moded", "test-moded@det", "test-moded@hollow"]
    assert r.exit_code == 16
    assert r.verdict()[0].startswith("FAIL: test-moded@hollow broke its promise of run-to-run determinism")
    by = {b.name: b for b in r.backends}
    assert by["test-moded"].promises == ()
    assert by["test-moded@det"].promises == ("run-to-run",)
    # 3 runs + 2 timed per build: every run hashed and compared, 4 timed per build (run 0 is warm-up)
    assert by["test-moded"].runs == 5 and by["test-moded"].distinct_run_outputs == 5
    assert by["test-moded@det"].distinct_outputs == 1
    for b in r.backends:
        assert b.latency is not None and b.latency.runs == 2 * 4
        assert b.latency.min_ms <= b.latency.median_ms <= b.latency.max_ms
        # a worker imports numpy and onnx: tens of MiB at least, and far below this machine's memory
        assert 20 * 2**20 < b.peak_rss_bytes < 8 * 2**30
    (fam,) = r.cost_of_determinism()
    rows = {m.backend: m for m in fam.rows}
    assert (
        rows["test-moded@det"].held == ("run-to-run",) and rows["test-moded@det"].mode == "deterministic=True"
    )
    assert rows["test-moded@hollow"].broken == ("run-to-run",)
    assert rows["test-moded@hollow"].mode == "deterministic=True, keeps=False"
    assert rows["test-moded"].ratio == 1.0
    assert isinstance(rows["test-moded@det"].ratio, float)

    md = to_markdown(r, "rep")
    assert "## Cost of determinism" in md
    assert (
        "| test-moded | deterministic=True, keeps=False (test-moded@hollow) | **run-to-run BROKEN** | 5 / 1 |"
        in md
    )
    assert "![Cost of determinism: test-moded](rep.cost-test-moded.png)" in md
    assert (
        "| latency (median) | peak memory (planned) |" in md
    )  # the backend table's columns, times being asked for
    assert " MiB |" in md

    js = json.loads(to_json(r))
    lat = js["backends"][0]["latency"]
    assert set(lat) == {"median_ms", "min_ms", "max_ms", "runs", "tensors_exposed"} and lat["runs"] == 8
    assert js["backends"][0]["peak_rss_bytes"] == r.backends[0].peak_rss_bytes
    modes = js["cost_of_determinism"][0]["modes"]
    assert [m["backend"] for m in modes] == ["test-moded", "test-moded@det", "test-moded@hollow"]
    assert modes[2]["promises_broken"] == ["run-to-run"] and modes[0]["latency_ratio"] == 1.0


def test_reports_leave_latency_out_unless_asked(moded: Any) -> None:
    from dataclasses import replace

    quiet = replace(moded, options=replace(moded.options, timed_runs=0, timings=False))
    js = json.loads(to_json(quiet))
    assert all(b["latency"] is None and b["peak_rss_bytes"] is None for b in js["backends"])
    assert all(m["latency"] is None for m in js["cost_of_determinism"][0]["modes"])
    assert "latency" not in json.dumps(js["result"]["backends"][0]).replace('"latency": null', "")
    md = to_markdown(quiet, "rep")
    assert "| latency (median) |" not in md and "pass `--timed-runs N` or `--timings` for them" in md
    assert "cost-test-moded.png" not in md  # no figure without times


def test_triton_kernel_key_and_config_names_are_stable() -> None:
    cfg = SimpleNamespace(
        kwargs={"XBLOCK": 64, "R0_BLOCK": 8}, num_warps=4, num_stages=1, num_ctas=1, maxnreg=None
    )
    assert triton_config_name(cfg) == "R0_BLOCK=8, XBLOCK=64, num_warps=4, num_stages=1, num_ctas=1"
    tuner = SimpleNamespace(
        heuristic_type=SimpleNamespace(name="REDUCTION"),
        inductor_meta={"kernel_name": "triton_red_fused_sum_0"},
        size_hints={"x": 64, "r0_": 4096},
    )
    assert triton_key(tuner) == "triton reduction triton_red_fused_sum_0 [r0_=4096,x=64]"


class _Launcher:
    def __init__(self, block: int) -> None:
        self.config = SimpleNamespace(kwargs={"R0_BLOCK": block}, num_warps=4)


def _tuner(*blocks: int) -> Any:
    return SimpleNamespace(
        heuristic_type=SimpleNamespace(name="REDUCTION"),
        inductor_meta={"kernel_name": "triton_red_fused_sum_0"},
        size_hints={"x": 64, "r0_": 4096},
        launchers=[_Launcher(b) for b in blocks],
    )


def _timed_autotune(tuner: Any) -> None:
    """Triton's own choice as autotune_to_one_config makes it: time each, keep the fastest."""
    timings = {launcher: 1.0 / launcher.config.kwargs["R0_BLOCK"] for launcher in tuner.launchers}
    setattr(tuner, TIMINGS_ATTR, timings)
    tuner.launchers = [min(timings, key=timings.__getitem__)]


OP = "triton reduction triton_red_fused_sum_0 [r0_=4096,x=64] #0"


def test_triton_choices_are_recorded_replayed_and_a_miss_fails() -> None:
    rec = Tuning()
    tuner = _tuner(32, 128, 64)
    rec.select_triton(tuner, lambda t: _timed_autotune(t), (), {})
    assert tuner.launchers[0].config.kwargs == {"R0_BLOCK": 128}
    (choice,) = rec.choices
    assert (choice.op, choice.chosen) == (OP, "R0_BLOCK=128, num_warps=4")
    assert dict(choice.timings_ms) == {
        "R0_BLOCK=32, num_warps=4": 1 / 32,
        "R0_BLOCK=64, num_warps=4": 1 / 64,
        "R0_BLOCK=128, num_warps=4": 1 / 128,
    }

    def never(_: Any) -> None:
        raise AssertionError("a pinned build times nothing")

    pinned = Tuning({OP: "R0_BLOCK=32, num_warps=4"}, "pin.json")
    tuner = _tuner(32, 128, 64)
    pinned.select_triton(tuner, never, (), {})
    assert [x.config.kwargs["R0_BLOCK"] for x in tuner.launchers] == [32]
    assert pinned.choices[0].chosen == "R0_BLOCK=32, num_warps=4"

    with pytest.raises(PinMiss, match="records no kernel for triton reduction triton_red_fused_sum_0"):
        Tuning({}, "pin.json").select_triton(_tuner(32, 64), never, (), {})
    with pytest.raises(PinMiss, match="which this build does not offer"):
        Tuning({OP: "R0_BLOCK=256, num_warps=4"}, "pin.json").select_triton(_tuner(32, 64), never, (), {})


def test_triton_choices_carry_the_module_path_of_their_kernel() -> None:
    """Inductor's schedule of a kernel still knows its FX nodes and their module stack: the
    kernel is noted under the module of its first op, and Triton's choice for it carries that
    path (as the user's module names it, without the instrumented wrapper's prefix)."""
    from xbackend.runners.inductor_pin import KERNEL_MODULES, schedule_module

    def fx(name: str, source: str) -> Any:
        return SimpleNamespace(name=name, meta={"nn_module_stack": {"k": (source, "LayerNorm")}})

    ops = [fx("var", "L['self'].inner.blocks[1].ln"), fx("add_1", "L['self'].inner.blocks[2].fc")]
    buf = SimpleNamespace(origins=ops)  # Inductor's is a set: read in name order
    snode = SimpleNamespace(get_nodes=lambda: [SimpleNamespace(node=buf)])
    marker = SimpleNamespace()  # DisableReduction / EnableReduction: no nodes
    assert schedule_module([marker, snode]) == "inner.blocks.2.fc"  # add_1 sorts first
    assert schedule_module([marker]) == ""
    KERNEL_MODULES["triton_red_fused_sum_0"] = schedule_module([snode])
    try:
        rec = Tuning(module_prefix="inner")
        rec.select_triton(_tuner(32, 64), lambda t: _timed_autotune(t), (), {})
        assert rec.choices[0].module == "blocks.2.fc"
    finally:
        del KERNEL_MODULES["triton_red_fused_sum_0"]


def test_ort_deterministic_compute_is_read_back_and_its_promise_checked(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["mlp_layernorm"], modes="ort-cpu", runs=2, timed_runs=0, probes=["none"])
    assert dict(r.backend("ort-cpu@det").info)["in_force.use_deterministic_compute"] == "True"
    assert dict(r.backend("ort-cpu").info)["in_force.use_deterministic_compute"] == "False"
    (check,) = r.promise_checks()
    assert (check.backend, check.name, check.status) == ("ort-cpu@det", "run-to-run", "held")
    assert check.evidence.startswith("bit-identical over 2 runs in each of 1 session(s)")


def test_cli_modes_time_the_runs_and_reproduce(models: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    js = tmp_path / "r.json"
    argv = [
        "compare",
        str(models["mlp_layernorm"]),
        "--modes",
        "ort-cpu",
        "--timed-runs",
        "3",
        "--runs",
        "2",
        "--probes",
        "none",
        "--json",
        str(js),
        "--no-progress",
    ]
    _, out, _ = run(capsys, *argv)
    data = json.loads(js.read_text("utf-8"))
    assert [b["name"] for b in data["backends"]] == ["ort-cpu", "ort-cpu@det"]
    # the terminal says each mode's cost too, in the same figures as the JSON
    lines = out.splitlines()
    at = lines.index("  modes of ort-cpu (latency against ort-cpu's):")
    det = data["cost_of_determinism"][0]["modes"][1]
    assert lines[at + 1].startswith("    default: ") and lines[at + 1].endswith("; promises none")
    assert lines[at + 2].startswith("    deterministic_compute=True: ")
    assert f", {det['latency_ratio']:.2f}x; promises run-to-run held" in lines[at + 2]
    assert data["backends"][1]["runs"] == 5 and data["backends"][1]["latency"]["runs"] == 4
    assert (
        "--timed-runs 3" in data["command"]
        and "--set ort-cpu@det.deterministic_compute=true" in data["command"]
    )
    modes = data["cost_of_determinism"][0]["modes"]
    assert modes[1]["promises_held"] == ["run-to-run"] and modes[1]["latency_ratio"] > 0


def test_the_cost_table_re_renders_from_the_json(moded: Any) -> None:
    """`xbackend report` draws the same bytes from the JSON twin, latency included."""
    from xbackend.report import from_json

    again = from_json(to_json(moded))
    assert again.backend("test-moded").latency == moded.backend("test-moded").latency
    assert to_markdown(again, "rep") == to_markdown(moded, "rep")
    assert to_json(again) == to_json(moded)
