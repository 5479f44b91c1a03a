"""Verdicts on real ONNX value kinds and failure modes: each test asserts a known outcome."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import xbackend
from xbackend.cli import main
from xbackend.errors import InputError
from xbackend.model.inputs import load_feeds
from xbackend.model.load import load_model

pytestmark = pytest.mark.slow
PAIR = ["ort-cpu", "reference"]


def test_scalar_input_keeps_shape_0d(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["scalar_scale"], backends=PAIR, runs=2, probes="none")
    assert dict((n, s) for n, _, s in r.feeds.shapes) == {"s": "[]", "x": "[4,8]"}
    assert r.backend("ort-cpu").ok and r.cross("ort-cpu").bitwise_equal
    assert r.exit_code == 0


def test_bfloat16_intermediate_and_output_on_ort_per_layer(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["bf16_chain"], backends=PAIR, runs=2, probes="none")
    ort = r.backend("ort-cpu")
    assert ort.ok and ort.layers_error == "" and ort.not_exposed == ()
    c = r.cross("ort-cpu")
    by_name = {d.name: d for d in c.tensors}
    assert by_name["as_bf16"].dtype == "bfloat16" and by_name["as_bf16"].bitwise_equal
    outs = {d.name: d for d in c.output_tensors}
    assert outs["y_bf16"].dtype == "bfloat16" and outs["y_bf16"].elements == 32
    assert c.bitwise_equal and r.exit_code == 0


def test_float8_output_bit_for_bit(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["fp8_chain"], backends=PAIR, runs=1, probes="none")
    q = next(d for d in r.cross("ort-cpu").output_tensors if d.name == "q")
    assert q.dtype == "float8_e4m3fn" and q.bitwise_equal and q.max_ulp == 0


def test_string_inputs_and_every_suggestion_works(models: dict[str, Path], tmp_path: Path) -> None:
    spec, _ = load_model(models["strings"])
    words = ["The", "Cat", "the", "SAT", "ok"]
    np.savez(tmp_path / "obj.npz", words=np.array(words, dtype=object))
    with pytest.raises(InputError, match=r"save strings as np.array\(values, dtype=str\)") as e:
        load_feeds(tmp_path / "obj.npz", spec)
    assert "--inputs DIR with input_N.pb" in str(e.value)
    np.savez(tmp_path / "str.npz", words=np.array(words, dtype=str))  # the first suggestion
    r = xbackend.compare(models["strings"], backends=PAIR, runs=1, inputs=tmp_path / "str.npz", probes="none")
    (d,) = r.cross("ort-cpu").output_tensors
    assert d.dtype == "object" and d.shape == (3,) and d.bitwise_equal  # 'the' x2 removed, lower-cased
    d_dir = tmp_path / "data"  # the second suggestion: ONNX test-data layout
    d_dir.mkdir()
    (d_dir / "input_0.pb").write_bytes(
        numpy_helper.from_array(np.array(words, dtype=object), "words").SerializeToString()
    )
    r = xbackend.compare(models["strings"], backends=PAIR, runs=1, inputs=d_dir, probes="none")
    assert r.cross("ort-cpu").bitwise_equal and r.feeds.source == str(d_dir)
    with pytest.raises(InputError, match=r"cannot generate; pass real data with --inputs DIR"):
        xbackend.compare(models["strings"], backends=PAIR, runs=1)


def test_sequence_output_compared_element_by_element(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["split_sequence"], backends=PAIR, runs=2, probes="none")
    c = r.cross("ort-cpu")
    assert [d.name for d in c.output_tensors] == ["rows[0]", "rows[1]", "rows[2]", "count"]
    assert all(d.shape == (5,) for d in c.output_tensors[:3])
    assert r.backend("ort-cpu").deterministic and r.exit_code == 0


def test_opset_ort_lacks_leaves_the_reference_running_and_falls_back(models: dict[str, Path]) -> None:
    r = xbackend.compare(
        models["opset_future"], backends=["ort-cpu", "reference", "oracle"], reference="ort-cpu", runs=1
    )
    assert r.backend("ort-cpu").status == "unavailable"
    assert r.backend("reference").ok and r.backend("oracle").ok
    assert r.reference_used == "reference"
    assert r.cross("oracle").reference == "reference" and r.cross("oracle").status == "ok"
    assert any(
        line.startswith(
            "WARN: the reference (ort-cpu) did not run; every backend is compared against reference"
        )
        for line in r.verdict()
    )


def test_gpt_batch_probe_leaves_shape_derived_tensors_out(models: dict[str, Path]) -> None:
    r = xbackend.compare(
        models["gpt_batch"],
        backends=["ort-cpu"],
        shapes={"ids": (1, 8)},
        runs=1,
        probes="batch",
        batch_invariance=4,
    )
    assert dict(r.feeds.ranges) == {"ids": "[0, 64)"}  # the vocabulary size, read off the Gather
    (b,) = r.probe("batch").rows  # type: ignore[attr-defined]
    assert b.invariant is True and b.compared > 10
    assert "row_index" in b.shape_derived and "batch_size" not in {t for t, *_ in b.by_depth}
    assert not any("batch-invariant" in line for line in r.verdict())


def test_range_option_bounds_generated_ids(models: dict[str, Path], tmp_path: Path) -> None:
    code = main(
        [
            "compare",
            str(models["gpt_batch"]),
            "--backends",
            "ort-cpu",
            "--shape",
            "ids=2,8",
            "--range",
            "ids=0:5",
            "--runs",
            "1",
            "--probes",
            "none",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 0
    data = json.loads((tmp_path / "r.json").read_text("utf-8"))
    assert data["inputs"]["ranges"] == {"ids": "[0, 5)"}
    assert "--range ids=0:5" in data["command"]


def test_all_zero_outputs_are_a_vacuous_pass(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["zeros_out"], backends=PAIR, runs=1, probes="none")
    lines = r.verdict()
    assert lines[0].startswith("PASS (vacuous):")
    assert "WARN: vacuous comparison: every graph output of reference is constant (y is all" in lines[1]
    assert r.backend("reference").constant_outputs[0][0] == "y"


def test_output_figures_come_from_the_plain_model(models: dict[str, Path]) -> None:
    full = xbackend.compare(models["mlp_layernorm"], backends=PAIR, runs=1, probes="none")
    plain = xbackend.compare(models["mlp_layernorm"], backends=PAIR, runs=1, probes="none", outputs_only=True)
    a, b = full.cross("ort-cpu"), plain.cross("ort-cpu")
    assert (a.max_ulp, a.scaled_ulp) == (b.max_ulp, b.scaled_ulp)
    # ORT fuses Add + LayerNormalization only when the sums are not exposed: the instrumented
    # build's output figures differ, and the report says so and shows both.
    obs = full.backend("ort-cpu").observer
    assert obs is not None and obs.outputs_changed and a.observer_differs
    inst = next(d for d in a.instrumented_output_diffs() if d.name == "y")
    assert (inst.max_ulp, inst.scaled_ulp) != (a.max_ulp, a.scaled_ulp)
    md = xbackend.to_markdown(full)
    assert "**The instrumented builds (every intermediate exposed) give other figures" in md


def test_a_failing_probe_is_a_warning(models: dict[str, Path], plugins: None) -> None:
    r = xbackend.compare(
        models["attention"], backends=["test-threads-crash"], runs=1, probes="threads", probe_threads=3
    )
    assert any(
        line == "WARN: threads probe failed on test-threads-crash at 3 thread(s): crashed with SIGABRT"
        for line in r.verdict()
    )
    assert r.backend("test-threads-crash").ok


def _golden_dir(tmp: Path, model: Path, scale: float = 1.0) -> Path:
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(3).standard_normal((1, 16, 64)).astype(np.float32)
    (y,) = ReferenceEvaluator(str(model)).run(None, {"x": x})
    d = tmp / f"golden{scale}"
    d.mkdir()
    (d / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    (d / "output_0.pb").write_bytes(numpy_helper.from_array(y * np.float32(scale), "y").SerializeToString())
    return d


def test_expected_outputs_join_the_comparison(models: dict[str, Path], tmp_path: Path) -> None:
    good = _golden_dir(tmp_path, models["mlp_layernorm"])
    r = xbackend.compare(models["mlp_layernorm"], backends=PAIR, runs=1, inputs=good, probes="none")
    assert r.backend("expected").ok and r.feeds.expected
    assert r.expected("reference").bitwise_equal  # the golden file was written by the reference
    assert (r.expected("ort-cpu").scaled_ulp or 0) > 0 and r.exit_code == 0
    bad = _golden_dir(tmp_path, models["mlp_layernorm"], scale=1.01)
    r = xbackend.compare(models["mlp_layernorm"], backends=PAIR, runs=1, inputs=bad, probes="none")
    assert r.exit_code == 1
    assert any(
        line.startswith("FAIL: ort-cpu differs from the expected outputs beyond 64") for line in r.verdict()
    )


def test_reference_failure_names_the_node_and_op(tmp_path: Path) -> None:
    g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Reshape", ["r", "shape"], ["y"], name="bad_reshape"),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    m.graph.output[0].type.tensor_type.shape.dim.add().dim_param = "a"
    m.graph.output[0].type.tensor_type.shape.dim.add().dim_param = "b"
    onnx.save(m, str(tmp_path / "reshape.onnx"))
    np.savez(tmp_path / "in.npz", x=np.arange(6, dtype=np.float32), shape=np.array([4, 4], np.int64))
    r = xbackend.compare(
        tmp_path / "reshape.onnx", backends=["reference"], runs=1, inputs=tmp_path / "in.npz"
    )
    reason = r.backend("reference").reason
    assert "node 'bad_reshape' (op Reshape, output 'y')" in reason


def test_npz_keeps_ml_dtypes(tmp_path: Path) -> None:
    g = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.save(m, str(tmp_path / "bf16_in.onnx"))
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16).astype(ml_dtypes.bfloat16)
    np.savez(tmp_path / "x.npz", x=x)  # numpy writes bfloat16 as raw 2-byte voids
    spec, _ = load_model(tmp_path / "bf16_in.onnx")
    feeds = load_feeds(tmp_path / "x.npz", spec)
    assert str(feeds.arrays["x"].dtype) == "bfloat16" and feeds.arrays["x"].tobytes() == x.tobytes()  # type: ignore[union-attr]
    r = xbackend.compare(
        tmp_path / "bf16_in.onnx", backends=PAIR, runs=1, inputs=tmp_path / "x.npz", probes="none"
    )
    assert r.cross("ort-cpu").bitwise_equal  # ORT takes bfloat16 feeds as OrtValues


torch_only = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")

UNSEEDED = """
import torch
from torch import nn

def build():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
"""

DICT_OUT = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"logits": self.head(h), "hidden": h}

def build():
    torch.manual_seed(0)
    return Net().eval()
"""


@torch_only
def test_unseeded_factory_is_named_not_blamed_on_torch(tmp_path: Path) -> None:
    from xbackend.export.torch_onnx import InputDecl, export_torch

    (tmp_path / "unseeded.py").write_text(UNSEEDED)
    spec = f"{tmp_path / 'unseeded.py'}:build"
    export_torch(spec, [InputDecl.parse("x=2,8")], tmp_path / "u.onnx")
    r = xbackend.compare(
        tmp_path / "u.onnx",
        backends=["ort-cpu", "torch"],
        runs=1,
        probes="none",
        runner_options={"torch": {"module": spec}},
    )
    t = r.backend("torch")
    assert t.status == "failed" and not any("NONDETERMINISTIC" in line for line in r.verdict())
    assert "the torch module's weights differ from the model's" in t.reason
    assert "a factory without a seed makes new random weights" in t.reason


@torch_only
def test_dict_output_module_keeps_its_key_names(tmp_path: Path) -> None:
    from xbackend.export.torch_onnx import InputDecl, export_torch

    (tmp_path / "dictnet.py").write_text(DICT_OUT)
    res = export_torch(f"{tmp_path / 'dictnet.py'}:build", [InputDecl.parse("x=2,8")], tmp_path / "d.onnx")
    assert res.outputs == ("logits", "hidden")
    r = xbackend.compare(
        tmp_path / "d.onnx",
        backends=["ort-cpu", "torch"],
        runs=1,
        probes="none",
        reference="ort-cpu",
        runner_options={"torch": {"trust_model_code": "true"}},
        noise_samples=0,  # the outputs' names, not the explanation
    )
    t = r.backend("torch")
    assert t.ok and dict(t.info)["weights_checked"] == "4 of 4 non-constant float tensors found in the model"
    assert {d.name for d in r.cross("torch").output_tensors} == {"logits", "hidden"}
    assert (r.cross("torch").scaled_ulp or 0) <= 8


@torch_only
def test_model_metadata_never_makes_xbackend_run_code(tmp_path: Path) -> None:
    from xbackend.export.torch_onnx import InputDecl, export_torch

    (tmp_path / "dictnet.py").write_text(DICT_OUT)
    export_torch(f"{tmp_path / 'dictnet.py'}:build", [InputDecl.parse("x=2,8")], tmp_path / "d.onnx")
    model = tmp_path / "d.onnx"
    r = xbackend.compare(model, backends=["ort-cpu", "torch"], runs=1, probes="none", noise_samples=0)
    t = r.backend("torch")
    assert t.status == "unavailable"
    assert "xbackend never runs code a model points to" in t.reason
    # The suggestion is a path relative to the working directory that works as given.
    suggestion = t.reason.split("pass --torch-module ")[1].split(" ")[0]
    r = xbackend.compare(
        tmp_path / "d.onnx",
        backends=["ort-cpu", "torch"],
        runs=1,
        probes="none",
        runner_options={"torch": {"module": suggestion}},
        noise_samples=0,  # whether the suggestion works, not the explanation
    )
    assert r.backend("torch").ok


@torch_only
def test_dynamic_axis_the_module_bakes_in_is_an_export_error(tmp_path: Path) -> None:
    from xbackend.errors import ExportError
    from xbackend.export.torch_onnx import InputDecl, export_torch, parse_dynamic

    (tmp_path / "fixed.py").write_text(
        "import torch\nfrom torch import nn\n\nclass F(nn.Module):\n"
        "    def forward(self, x):\n        return x.reshape(2, 32) * 2\n\n"
        "def build():\n    return F()\n"
    )
    with pytest.raises(
        ExportError, match=r"asked for --dynamic x=0:batch: the module fixes that size somewhere"
    ):
        export_torch(
            f"{tmp_path / 'fixed.py'}:build",
            [InputDecl.parse("x=2,4,8")],
            tmp_path / "f.onnx",
            dynamic=parse_dynamic(["x=0:batch"]),
        )


def _threads_probe(
    backend: str, log: str, model: Path, state: Path, timeout: float = 600, **options: str
) -> tuple[xbackend.Result, list[tuple[int, int]]]:
    """The threads probe (1 and 3 threads) on a state-noting test runner at 2 threads by default;
    the result, and the two numbers each build noted in `state/log`, in build order."""
    opts = {backend: {"state_dir": str(state), "threads": "2", **options}}
    r = xbackend.compare(
        model,
        backends=[backend],
        runs=1,
        probes="threads",
        probe_threads=3,
        runner_options=opts,
        timeout=timeout,
    )
    lines = (state / log).read_text("utf-8").splitlines()
    return r, [(int(a), int(b)) for a, b in (ln.split() for ln in lines)]


def _shared(
    model: Path, state: Path, timeout: float = 600, **options: str
) -> tuple[xbackend.Result, list[tuple[int, int]]]:
    """`test-shared`: each build's (threads, process id)."""
    return _threads_probe("test-shared", "builds", model, state, timeout, **options)


def test_probe_variants_share_one_process_when_the_runner_allows(
    models: dict[str, Path], plugins: None, tmp_path: Path
) -> None:
    r, builds = _shared(models["attention"], tmp_path)
    (main_t, main_pid), (t1, pid1), (t3, pid3) = builds
    assert (main_t, t1, t3) == (2, 1, 3)
    assert pid1 == pid3 != main_pid  # both variants in one fresh process, apart from the main build
    assert [(row.threads, row.status) for row in r.probe("threads").rows] == [
        ("2 (default)", "ok"),
        ("3", "ok"),
    ]


def test_a_crash_in_a_shared_process_costs_only_that_variant(
    models: dict[str, Path], plugins: None, tmp_path: Path
) -> None:
    r, builds = _shared(models["attention"], tmp_path, crash_threads="1")
    (_, main_pid), (t1, pid1), (t3, pid3) = builds
    assert (t1, t3) == (1, 3)
    assert len({main_pid, pid1, pid3}) == 3  # the variant after the crash: a new process
    assert "WARN: threads probe failed on test-shared at 1 thread(s): crashed with SIGABRT" in r.verdict()
    assert r.backend("test-shared").ok


def test_a_hang_in_a_shared_process_times_out_that_variant_only(
    models: dict[str, Path], plugins: None, tmp_path: Path
) -> None:
    r, builds = _shared(models["attention"], tmp_path, timeout=8, hang_threads="1")
    (_, main_pid), (t1, pid1), (t3, pid3) = builds
    assert (t1, t3) == (1, 3)
    assert len({main_pid, pid1, pid3}) == 3
    timed_out = (
        "WARN: threads probe failed on test-shared at 1 thread(s): timed out after 8 s (raise --timeout)"
    )
    assert timed_out in r.verdict()


def _drift(model: Path, state: Path, **options: str) -> tuple[xbackend.Result, list[tuple[int, int]]]:
    """`test-drift`: each build's (threads, tensors exposed)."""
    return _threads_probe("test-drift", "exposed", model, state, **options)


def test_threads_probe_builds_no_per_layer_engines_when_outputs_agree(
    models: dict[str, Path], plugins: None, tmp_path: Path
) -> None:
    r, builds = _drift(models["attention"], tmp_path)
    # main: plain (1 output) and per-layer (23 tensors); the variants at 1 and 3: plain only
    assert builds == [(2, 1), (2, 23), (1, 1), (3, 1)]
    assert [(t.threads, t.invariant, t.first_divergence) for t in r.probe("threads").rows] == [  # type: ignore[attr-defined]
        ("2 (default)", True, None),
        ("3", True, None),
    ]


def test_threads_probe_locates_a_divergence_with_per_layer_builds(
    models: dict[str, Path], plugins: None, tmp_path: Path
) -> None:
    r, builds = _drift(models["attention"], tmp_path, drift_threads="3", drift_from="scores")
    # the outputs at 3 threads moved: a second round builds per-layer engines at 1 and 3 threads
    assert builds == [(2, 1), (2, 23), (1, 1), (3, 1), (1, 23), (3, 23)]
    rows = r.probe("threads").rows  # type: ignore[attr-defined]
    assert [(t.threads, t.invariant, t.max_ulp, t.first_divergence) for t in rows] == [
        ("2 (default)", True, 0, None),
        ("3", False, 1, "scores"),
    ]
    assert (
        "WARN: test-drift changes with threads (3 vs 1): from scores on "
        "(1 scaled ULP at worst at the outputs)" in r.verdict()
    )
