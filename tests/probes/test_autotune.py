"""TorchInductor runners and autotune pinning: the mechanism, deterministically.

Which kernel a timing-driven build picks is left to chance (benchmarks/autotune_variance.py
measures that); here pin files decide, so every outcome is known.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from roots import TESTS

import xbackend
from xbackend.execution.executor import Executor, Job, JobOutcome, standard_phases
from xbackend.execution.progress import NullProgress
from xbackend.files.run_values import CaptureFile, diff_captures
from xbackend.model.inputs import generate_feeds
from xbackend.model.load import load_model
from xbackend.probes.builds import BuildVariance
from xbackend.report.jsonreport import to_json
from xbackend.report.markup import render_section
from xbackend.runners.inductor_pin import choice_names, code_digest, module_path
from xbackend.runners.registry import get_runner

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="torch not installed: pip install 'xbackend[torch]'"
    ),
]

SPEC = f"{TESTS / 'wide_mlp.py'}:build"
OP = "packed_linear(64x512) -> 64x1024 float32 #0"  # the first Linear, module path 0.0


class Builder:
    """Builds of torch-compile-autotune on torch_mlp in fresh worker processes, as compare does."""

    def __init__(self, work: Path) -> None:
        from xbackend.export.torch_onnx import InputDecl, export_torch

        model = work / "wide_mlp.onnx"
        export_torch(SPEC, [InputDecl.parse("x=64,512")], model, output_names=["y"])
        self.model = model
        self.spec, _ = load_model(model)
        self.work = work
        self.feeds = work / "feeds.xbv"
        generate_feeds(self.spec, 0).save(self.feeds)
        self.ex = Executor(self.spec, work / "jobs", 600, NullProgress())
        self.n = 0

    def build(
        self, backend: str = "torch-compile-autotune", layers: bool = False, **options: str
    ) -> JobOutcome:
        """One build; with `layers`, the instrumented build (every mapped module output) after it."""
        cls = get_runner(backend)
        self.n += 1
        raw = tuple(sorted({"module": SPEC, **options}.items()))
        phases = standard_phases(cls, self.spec, 1, layers=layers, options=dict(raw))
        return self.ex.run(Job(f"build{self.n}", backend, cls, raw, self.feeds, phases, fingerprint=True))


def output(o: JobOutcome) -> np.ndarray:
    with CaptureFile(o.outputs.capture) as c:
        return np.asarray(c["y"])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Builder, dict, JobOutcome]:
    """One autotuned build that records its choices."""
    b = Builder(tmp_path_factory.mktemp("autotune"))
    pin = b.work / "recorded.json"
    o = b.build(pin=str(pin))
    assert o.ok, o.reason
    return b, json.loads(pin.read_text("utf-8")), o


def write(path: Path, pin: dict) -> str:
    path.write_text(json.dumps(pin))
    return str(path)


def test_first_build_records_every_tuned_op_with_its_module_and_timings(recorded: tuple) -> None:
    _, pin, o = recorded
    assert pin["version"] == 1
    # 2 blocks x 2 Linears, each a packed_linear tuned between the C++ micro-GEMM and MKL
    assert [(c["op"], c["module"]) for c in pin["choices"]] == [
        (OP, "0.0"),
        ("packed_linear(64x1024) -> 64x512 float32 #0", "0.2"),
        ("packed_linear(64x512) -> 64x1024 float32 #1", "1.0"),
        ("packed_linear(64x1024) -> 64x512 float32 #1", "1.2"),
    ]
    first = pin["choices"][0]
    assert first["op"] == OP
    assert set(first["timings_ms"]) == {"_mkl_linear", "cpp_CppMicroGemmFP32Vec"}
    assert first["chosen"] == min(first["timings_ms"], key=first["timings_ms"].get)
    items = dict(o.outputs.fingerprint.layers)
    assert items[f"tuned {OP} (0.0)"] == first["chosen"]
    assert dict(o.result.info)["pin_state"].startswith("recorded to ")


def test_pins_decide_the_kernels_and_the_bits(recorded: tuple, tmp_path: Path) -> None:
    b, pin, _ = recorded
    cpp = {**pin, "choices": [{**c, "chosen": "cpp_CppMicroGemmFP32Vec"} for c in pin["choices"]]}
    mkl_first = {**cpp, "choices": [{**cpp["choices"][0], "chosen": "_mkl_linear"}, *cpp["choices"][1:]]}
    a1 = b.build(pin=write(tmp_path / "cpp.json", cpp))
    a2 = b.build(pin=write(tmp_path / "cpp.json", cpp))
    m = b.build(pin=write(tmp_path / "mkl_first.json", mkl_first))
    assert a1.ok and a2.ok and m.ok, (a1.reason, a2.reason, m.reason)
    # K pinned builds: the same engine and the same bits
    assert a1.outputs.fingerprint.digest == a2.outputs.fingerprint.digest
    assert np.array_equal(output(a1), output(a2))
    assert dict(a1.result.info)["pin_state"].startswith("replayed from ")
    # one op's kernel changed: the fingerprint names it (and the code it generated), the bits move
    v = BuildVariance.from_fingerprints("t", [a1.outputs.fingerprint, m.outputs.fingerprint], True)
    assert [k for k, _ in v.varying_layers] == ["generated code", f"tuned {OP} (0.0)"]
    assert dict(v.varying_layers)[f"tuned {OP} (0.0)"] == ("cpp_CppMicroGemmFP32Vec", "_mkl_linear")
    assert not np.array_equal(output(a1), output(m))


def test_a_pin_without_the_op_fails_the_build_and_says_what_to_do(recorded: tuple, tmp_path: Path) -> None:
    b, pin, _ = recorded
    short = {**pin, "choices": pin["choices"][1:]}
    path = write(tmp_path / "short.json", short)
    o = b.build(pin=path)
    assert not o.ok
    assert o.reason == (  # the phase that failed, then the reason
        f"outputs: the pin file {path} records no kernel for {OP}; it was recorded for another model or "
        "shape: delete it and build once to record it again"
    )
    gone = {**pin, "choices": [{**pin["choices"][0], "chosen": "cpp_Retired"}, *pin["choices"][1:]]}
    o = b.build(pin=write(tmp_path / "gone.json", gone))
    assert not o.ok and "chose 'cpp_Retired' for packed_linear" in o.reason


def test_a_corrupt_pin_file_is_one_line(recorded: tuple, tmp_path: Path) -> None:
    b, _, _ = recorded
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    o = b.build(pin=str(path))
    assert not o.ok
    assert o.reason.startswith(f"outputs: cannot read the pin file {path}: ")
    assert o.reason.endswith("delete it and build once to record it again")


def test_autotune_off_builds_are_stable(recorded: tuple) -> None:
    b, _, _ = recorded
    r = xbackend.compare(
        b.model,
        backends=["torch-compile"],
        runs=2,
        builds=2,
        probes="none",  # the builds probe runs all the same; the thread counts' builds are not asserted
        runner_options={"torch-compile": {"module": SPEC}},
        noise_samples=0,  # build to build, not the explanation
    )
    t = r.backend("torch-compile")
    assert t.ok and t.deterministic, t.reason
    (v,) = r.probe("builds").backends  # type: ignore[attr-defined]
    assert v.distinct_fingerprints == 1 and not v.outputs_differ
    assert dict(t.info)["tuned_ops"] == "0"  # the default mode benchmarks nothing
    # per layer from the instrumented compiles, stable across builds too: 5 mapped module outputs
    assert t.exposed == 6 and t.observer is not None
    assert t.varying() == [] and len(t.build_diffs) == 6


LAYERS = {"linear": "0.0", "gelu": "0.1", "linear_1": "0.2", "linear_2": "1.0", "gelu_1": "1.1"}


def test_instrumented_build_returns_module_outputs_with_the_plain_builds_kernels(
    recorded: tuple, tmp_path: Path
) -> None:
    b, pin, _ = recorded
    path = write(tmp_path / "both.json", pin)  # the plain section only, as an --outputs-only run left it
    o = b.build(pin=path, layers=True)
    assert o.ok and o.separate_layers and o.layers is not None, o.reason
    assert sorted(o.layers.capture_names) == sorted([*LAYERS, "y"])
    plain, inst = dict(o.outputs.fingerprint.layers), dict(o.layers.fingerprint.layers)
    # the same tuned ops (module paths of the user's module, not the wrapper's), the same kernels:
    # the instrumented compile carried the plain one's choices over; its generated code differs
    assert {k: v for k, v in inst.items() if k.startswith("tuned ")} == {
        k: v for k, v in plain.items() if k.startswith("tuned ")
    }
    assert len([k for k in inst if k.startswith("tuned ")]) == 4
    assert inst["generated code"] != plain["generated code"]
    saved = json.loads(Path(path).read_text("utf-8"))
    assert saved["choices"] == pin["choices"]  # the plain section is never rewritten
    assert [(c["op"], c["module"], c["chosen"]) for c in saved["instrumented"]] == [
        (c["op"], c["module"], c["chosen"]) for c in pin["choices"]
    ]
    assert dict(o.layers.info)["pin_state"] == f"recorded to {path} (instrumented section)"
    # the next build replays both sections: the same engines, the same bits at every layer
    again = b.build(pin=path, layers=True)
    assert again.ok and again.layers is not None, again.reason
    assert dict(again.layers.info)["pin_state"] == f"replayed from {path} (instrumented section)"
    assert again.layers.fingerprint.digest == o.layers.fingerprint.digest
    assert again.layers.capture_hashes == o.layers.capture_hashes
    # the captured layers are the module's: within the default tolerance of eager torch at each.
    # Which GEMM the pin holds is decided by timing, and the two candidates sum in different
    # orders: 1-8 scaled ULP with one, up to 20 with the other (seen on this 2-core CPU)
    eager = b.build("torch", layers=True)
    assert eager.ok and eager.layers is not None
    with CaptureFile(o.layers.capture) as c, CaptureFile(eager.layers.capture) as e:
        diffs = diff_captures(c, e, list(LAYERS), b.spec.op_types())
    assert [d.name for d in diffs] == list(LAYERS)
    assert all(d.scaled_ulp is not None and d.scaled_ulp <= 64 for d in diffs), [d.scaled_ulp for d in diffs]


def test_observer_effect_of_an_instrumented_half_precision_compile(tmp_path: Path) -> None:
    from xbackend.export.torch_onnx import InputDecl, export_torch

    spec = f"{TESTS / 'half_chain.py'}:build"
    model = tmp_path / "half.onnx"
    res = export_torch(spec, [InputDecl.parse("x=32,64:float16")], model, output_names=["y"])
    assert sorted(res.module_outputs) == ["act", "act2", "fc"]
    r = xbackend.compare(
        model,
        backends=["torch", "torch-compile"],
        runs=1,
        probes="none",
        runner_options={"torch": {"module": spec}, "torch-compile": {"module": spec}},
        noise_samples=0,  # the observer effect, not the explanation
    )
    t = r.backend("torch-compile")
    assert t.ok and t.exposed == 4, t.reason
    # Returning the GELU output makes Inductor round it to half before the LayerNorm, which the
    # fused compile does in float32 (tests/half_chain.py): the outputs move, and the report says so
    assert t.observer is not None and t.observer.outputs_changed
    assert t.observer.scaled_ulp is not None and t.observer.scaled_ulp >= 0.5
    assert any(w.startswith("WARN: observer effect on torch-compile") for w in r.verdict())
    assert r.backend("torch").observer is None  # eager: one run serves both


def test_autotune_probe_tables_off_on_and_pinned(recorded: tuple) -> None:
    b, _, _ = recorded
    r = xbackend.compare(
        b.model,
        backends=["torch-compile-autotune"],
        runs=1,
        builds=2,
        probes="autotune",
        runner_options={"torch-compile-autotune": {"module": SPEC}},
        timings=True,
    )
    seconds = json.loads(to_json(r))["probe_build_seconds"]
    assert {k: len(v) for k, v in seconds.items()} == {
        f"autotune: torch-compile-autotune (autotune {v})": 2 for v in ("off", "on", "pinned")
    }
    rows = {row.variant: row for row in r.probe("autotune").rows}  # type: ignore[attr-defined]
    assert [(v, row.runner, row.status, row.builds) for v, row in rows.items()] == [
        ("off", "torch-compile", "ok", 2),
        ("on", "torch-compile-autotune", "ok", 2),
        ("pinned", "torch-compile-autotune", "ok", 2),
    ]
    # the main builds are 'on' with K builds already: the probe takes them rather than build again
    assert rows["on"].build_s == r.backend("torch-compile-autotune").build_s
    for v in ("off", "pinned"):  # no timing decides anything in a second build
        assert (rows[v].distinct_outputs, rows[v].distinct_fingerprints, rows[v].moved) == (1, 1, ())
        assert rows[v].scaled_ulp == 0
    # 'on' re-tunes in each build: whether a kernel moves is up to the timings (see the benchmark),
    # but every op that moved is a tuned Linear, and moved outputs come with a nonzero distance
    on = rows["on"]
    assert all(op.startswith("packed_linear(") for op, _ in on.moved)
    assert (on.distinct_outputs > 1) == ((on.scaled_ulp or 0) > 0)
    md = "\n".join(render_section(r.probe("autotune").section()))
    assert (
        "### Autotune variance" in md
        and "| torch-compile-autotune | pinned (torch-compile-autotune) | 2 | 1 | 1 | 0 | 0 |" in md
    )


def test_choice_names_drop_counters_and_keep_what_tells_candidates_apart() -> None:
    class C:
        def __init__(self, name: str, description: str = "") -> None:
            self.name, self.description = name, description

    names = choice_names([C("cpp_CppMicroGemmFP32Vec_3"), C("_mkl_linear"), C("triton_mm_17", "BLOCK_M=64")])
    assert names == ["cpp_CppMicroGemmFP32Vec", "_mkl_linear", "triton_mm [BLOCK_M=64]"]
    assert choice_names([C("cpp_A_1"), C("cpp_A_2")]) == ["cpp_A #0", "cpp_A #1"]


def test_module_paths_read_as_named_modules_writes_them() -> None:
    assert module_path("L['self'].blocks[0].fc1") == "blocks.0.fc1"
    assert module_path("L['fn'][0][2]") == "0.2"
    assert module_path("L['self']._modules['blocks']._modules['3'].ln") == "blocks.3.ln"


def test_code_digest_ignores_cache_paths_hashes_addresses_and_counters() -> None:
    a = "# /tmp/c1/ab/cabcdefabcdefabcdefabcdef.py\nbuf3 = x  # 7fdfd1952670\ncpp_fused_add_4(buf3)\n"
    b = "# /tmp/c2/ab/czyxwvzyxwvzyxwvzyxwvzyxw.py\nbuf7 = x  # 7f0000aa0000\ncpp_fused_add_9(buf7)\n"
    assert code_digest("/tmp/c1", [a]) == code_digest("/tmp/c2", [b])
    assert code_digest("/tmp/c1", [a]) != code_digest("/tmp/c2", [b.replace("add", "mul")])


def test_deterministic_mode_times_nothing_and_is_read_back(recorded: tuple) -> None:
    """Inductor's deterministic mode picks each tuned op's kernel without timing it, so two fresh
    builds decide the same; what was in force is read back from Inductor and torch."""
    b, _, default = recorded
    info = dict(default.result.info)
    assert info["in_force.inductor.deterministic"] == "False" and info["tuned_ops"] == "4"
    assert info["in_force.inductor.max_autotune"] == "True"
    assert info["in_force.use_deterministic_algorithms"] == "False"
    o1, o2 = b.build(deterministic="true"), b.build(deterministic="true")
    assert o1.ok and o2.ok, (o1.reason, o2.reason)
    info = dict(o1.result.info)
    assert info["in_force.inductor.deterministic"] == "True"
    assert info["in_force.inductor.batch_invariant"] == "False"
    assert info["in_force.use_deterministic_algorithms"] == "True"
    assert info["in_force.inductor.max_autotune"] == "True"
    assert info["tuned_ops"] == "0"  # no op went through timing
    assert o1.outputs.fingerprint.digest == o2.outputs.fingerprint.digest
    assert np.array_equal(output(o1), output(o2))


def test_batch_invariant_mode_implies_deterministic_and_is_read_back(recorded: tuple) -> None:
    b, _, _ = recorded
    o = b.build(batch_invariant="true")
    assert o.ok, o.reason
    info = dict(o.result.info)
    assert info["in_force.inductor.batch_invariant"] == "True"
    assert info["in_force.inductor.deterministic"] == "True"
    assert info["in_force.use_deterministic_algorithms"] == "True"


def test_a_switch_the_installed_inductor_lacks_makes_that_mode_unavailable(
    recorded: tuple, plugins: None
) -> None:
    """Under an Inductor without batch_invariant (torch 2.11, as GPU images carry), the @bi mode
    is unavailable with the torch version and the reason; the other mode still runs."""
    b, _, _ = recorded
    module = {"module": SPEC}
    r = xbackend.compare(
        b.model,
        backends=["test-old-inductor", "test-old-inductor@bi"],
        runs=1,
        probes="none",
        tensors="outputs",
        runner_options={
            "test-old-inductor": module,
            "test-old-inductor@bi": {**module, "batch_invariant": "true"},
        },
    )
    plain, bi = r.backend("test-old-inductor"), r.backend("test-old-inductor@bi")
    assert plain.ok, plain.reason
    assert bi.status == "unavailable"
    assert "unavailable in torch 2.11.0: it has no torch._inductor.config.batch_invariant" in bi.reason
