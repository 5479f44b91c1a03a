"""Each node judged against its own float64 value, element by element: planted losses of known
size are caught exactly at their nodes, correct engines stay explained, and the text, the JSON and
the exit code agree."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import BERT_RANGES, BERT_SHAPES
from onnx import helper
from roots import TESTS

import xbackend
from xbackend.bounds.element import DELTA, allowance, lam, unit_roundoff
from xbackend.bounds.rules import node_bound
from xbackend.model.samples import build
from xbackend.report.jsonreport import to_json


def test_exact_ops_are_allowed_nothing() -> None:
    for op in ("Reshape", "Transpose", "Gather", "Concat", "Unsqueeze", "Relu", "Where"):
        bound, nodes, _ = node_bound(helper.make_node(op, ["x", "y"], ["z"]), {}, 21)
        assert bound.exact and nodes == []
        v = np.array([1.0, -3.5, 1e-30])
        assert not allowance(bound, v, None, unit_roundoff("float32")).any()


def test_correct_rounding_is_allowed_half_an_ulp_and_no_more() -> None:
    """An Add of float32 values: the float64 sum is exact; its correctly rounded float32 passes, the
    next float32 does not."""
    bound, _, _ = node_bound(helper.make_node("Add", ["a", "b"], ["c"]), {}, 21)
    a, b = np.float32(1.0), np.float32(2.0**-24 + 2.0**-30)  # the sum lies just past a half-ULP tie
    v = np.array([float(a) + float(b)])
    allowed = allowance(bound, v, None, unit_roundoff("float32"))[0]
    right = np.float32(a + b)
    assert abs(float(right) - v[0]) <= allowed
    assert abs(float(np.nextafter(right, np.float32(0))) - v[0]) > allowed


def test_lambda_holds_each_node_at_its_stated_confidence() -> None:
    """Higham & Mary: each element fails with probability at most 2n·exp(-λ²/2)."""
    for n, e in ((16, 1), (768, 10**6), (50257, 10**8)):
        lm = lam(n, e)
        assert math.isclose(2 * n * e * math.exp(-(lm**2) / 2), DELTA, rel_tol=1e-9)
    assert 7 < lam(64, 2048) < 8


def test_matmul_bound_is_per_element_from_its_operands() -> None:
    """A row of large products and a row of tiny ones get allowances in proportion to Σ|a||b|, not
    to the tensor's largest element."""
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    bound, nodes, _ = node_bound(node, {"a": (2, 8), "b": (8, 3), "y": (2, 3)}, 21)
    assert (
        bound.kind == "reduction"
        and bound.terms == 8
        and [n.op_type for n in nodes] == ["Abs", "Abs", "MatMul"]
    )
    a = np.array([[1e3] * 8, [1e-3] * 8])
    b = np.ones((8, 3))
    m = np.abs(a) @ np.abs(b)
    allowed = allowance(bound, a @ b, m, unit_roundoff("float32"))
    assert math.isclose(allowed[0, 0] / allowed[1, 0], 1e6, rel_tol=1e-9)
    assert math.isclose(bound.b, lam(8, 6) * math.sqrt(9) + 1)


# The planted losses: (plant, model, the op it is planted at).
PLANTS = {
    "softmax-recip14": "bert",
    "erf-as": "bert",
    "tf32": "bert",
    "bf16-acc": "bert",
    "onepass-var": "layernorm_offset",
}


def _model(which: str, bert: Path, tmp_path: Path) -> tuple[Path, dict[str, object]]:
    if which == "bert":
        return bert, {"shapes": BERT_SHAPES, "ranges": BERT_RANGES}
    path = tmp_path / f"{which}.onnx"
    onnx.save(build(which), str(path))
    return path, {}


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_loss_is_an_origin_exactly_at_its_nodes(plant: str, bert: Path, tmp_path: Path) -> None:
    model, extra = _model(PLANTS[plant], bert, tmp_path)
    r = xbackend.compare(
        model,
        backends="test-plant,ort-cpu,reference",
        runs=1,
        runner_options={"test-plant": {"plant": plant}},
        **extra,  # type: ignore[arg-type]
    )
    planted = dict(r.backend("test-plant").info)["planted"].split(",")
    c = r.cross("test-plant")
    assert planted and [o.tensor for o in c.origins] == [t for t in r.model.tensor_order() if t in planted]
    assert all(o.ratio > 2 for o in c.origins), [(o.tensor, o.ratio) for o in c.origins]
    assert c.explained is False and r.exit_code == 1
    # the correct engine and the reference stay clean, on the same model and inputs
    assert r.cross("ort-cpu").explained is True
    assert r.explanation.local_for("reference").origins == ()


def test_correct_engines_are_explained_on_bert(bert: Path) -> None:
    r = xbackend.compare(
        bert,
        backends="ort-cpu,openvino-cpu,reference",
        runs=1,
        shapes=BERT_SHAPES,
        ranges=BERT_RANGES,
        runner_options={"openvino-cpu": {"precision": "f32"}},
    )
    for name in ("ort-cpu", "openvino-cpu", "reference"):
        le = r.explanation.local_for(name)
        assert le is not None and le.status == "ok" and le.origins == (), (name, le)
        # every node, not a sample; OpenVINO at each of its kernels' outputs
        kernels = re.search(r"judged at (\d+) kernel outputs", le.graph)
        assert le.compared == int(kernels.group(1)) > 60 if kernels else le.compared >= 100, le.graph
    assert r.explanation.local_for("openvino-cpu").graph.startswith("OpenVINO's runtime graph: ")
    assert r.exit_code == 0
    # the grain it was judged at, on the verdict line itself
    nodes = r.explanation.local_for("reference").compared
    ov = r.explanation.local_for("openvino-cpu").compared
    assert (
        f"EXPLAINED: openvino-cpu: judged at {ov} tensors of the model's {nodes} nodes (its kernels' outputs)"
        in ("\n".join(r.verdict()))
    )


@pytest.mark.usefixtures("plugins")
def test_text_json_and_exit_code_agree(bert: Path, tmp_path: Path) -> None:
    """The allowance printed is the one that decided; no violation sits beside 'explained'."""
    r = xbackend.compare(
        bert,
        backends="test-plant,ort-cpu,reference",
        runs=1,
        shapes=BERT_SHAPES,
        ranges=BERT_RANGES,
        runner_options={"test-plant": {"plant": "softmax-recip14"}},
    )
    doc = json.loads(to_json(r))
    rows = {c["backend"]: c for c in doc["cross_backend"]}
    bad, good = rows["test-plant"], rows["ort-cpu"]
    assert bad["explained"] is False and bad["within_tolerance"] is False
    assert bad["first_violation"] == bad["origins"][0]["tensor"]
    first = bad["origins"][0]
    tensor = next(t for t in bad["tensors"] if t["name"] == first["tensor"])
    assert (
        tensor["tolerance"] == first["allowed_scaled_ulp"]
        and tensor["local_scaled_ulp"] == first["local_scaled_ulp"]
    )
    line = next(v for v in r.verdict() if v.startswith("FAIL: test-plant"))
    assert f"where rounding allows {first['allowed_scaled_ulp']:.3g}" in line
    assert good["explained"] is True and good["within_tolerance"] is True and good["first_violation"] is None
    for c in doc["cross_backend"]:
        if c["explained"] is True:
            assert c["within_tolerance"] is True and c["first_violation"] is None and not c["origins"]


@pytest.mark.usefixtures("plugins")
def test_the_reference_is_judged_like_any_backend(tmp_path: Path) -> None:
    """A reference that moves one Add by 3 ULP fails at that node, and the engine compared with it
    is not blamed for it. (test-nudge edits the reported tensor after the run, so the node that read
    the unedited value, block2.silu, disagrees with the edited input it is judged on: its origin
    too.)"""
    path = tmp_path / "m.onnx"
    onnx.save(build("mlp_layernorm"), str(path))
    r = xbackend.compare(
        path,
        backends="ort-cpu,test-nudge",
        reference="test-nudge",
        runs=1,
        runner_options={"test-nudge": {"tensor": "block2.fc1.out", "ulps": "3"}},
    )
    ref = r.explanation.local_for("test-nudge")
    assert [o.tensor for o in ref.origins] == ["block2.fc1.out", "block2.silu"] and ref.origins[0].certain
    # 3 ULP from the rounded sum, so 2.5 to 3.5 from the exact one, where u·|v| is 1/2 to 1 ULP
    assert 2.5 < ref.origins[0].ratio <= 7
    assert r.cross("ort-cpu").explained is True
    assert r.exit_code == 1
    assert any(v.startswith("FAIL: test-nudge: 2 origins") and "block2.fc1.out" in v for v in r.verdict())


def test_cos_of_large_angles_is_named_as_conditioning_not_an_error(tmp_path: Path) -> None:
    """Rotary embeddings take cos of float32 angles up to the sequence length: half an ULP of a
    511-radian angle moves cos by about 128 ULP of 1. Every backend is explained; the float64
    oracle, which keeps the angle's digits, differs there, and the verdict says why."""
    g = helper.make_graph(
        [helper.make_node("Mul", ["pos", "freq"], ["angle"]), helper.make_node("Cos", ["angle"], ["y"])],
        "rotary",
        [helper.make_tensor_value_info("pos", onnx.TensorProto.FLOAT, [512])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [512])],
        [onnx.numpy_helper.from_array(np.array(0.999, np.float32), "freq")],
    )
    path = tmp_path / "rotary.onnx"
    onnx.save(helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    np.savez(tmp_path / "pos.npz", pos=np.arange(512, dtype=np.float32))
    r = xbackend.compare(path, backends="ort-cpu,reference,oracle", runs=1, inputs=str(tmp_path / "pos.npz"))
    amp = r.explanation.amplifiers
    assert [(a.tensor, a.op_type) for a in amp] == [("y", "Cos")]
    assert 32 < amp[0].gain_scaled_ulp < 140 and amp[0].input_max == pytest.approx(510.5, abs=0.1)
    assert r.oracle("ort-cpu").scaled_ulp > 8  # float32 angles, against the float64 ones
    assert r.oracle("ort-cpu").scaled_ulp <= amp[0].gain_scaled_ulp + 2
    assert all(c.explained is True for c in r.cross_backend) and r.exit_code == 0
    assert any(
        v.startswith("NOTE: y: Cos of inputs up to 510.5 is ill-conditioned in float32") for v in r.verdict()
    )


def _skip_norm_output(bert: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """A SkipLayerNormalization's output in ORT's optimized BERT, and the original nodes it fuses."""
    import onnxruntime as ort

    from xbackend.judge.shipped import covered_nodes

    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(bert), so, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    node = next(n for n in optimized.graph.node if n.op_type == "SkipLayerNormalization")
    return node.output[0], list(covered_nodes(onnx.load(str(bert)), optimized)[node.output[0]])


@pytest.mark.usefixtures("plugins")
def test_ort_is_judged_on_the_graph_its_sessions_run(bert: Path, tmp_path: Path) -> None:
    """ORT's sessions run fused kernels an unfused graph never shows: they are judged, and an error
    made inside one is an origin naming the kernel and the nodes and modules it fuses."""
    target, fused = _skip_norm_output(bert, tmp_path)
    r = xbackend.compare(
        bert,
        backends="ort-cpu,test-ort-nudge,reference",
        runs=1,
        shapes=BERT_SHAPES,
        ranges=BERT_RANGES,
        runner_options={"test-ort-nudge": {"tensor": target, "ulps": "64"}},
    )
    ort_le = r.explanation.local_for("ort-cpu")
    judged_ops = {n.op_type for n in ort_le.nodes}
    assert {"SkipLayerNormalization", "FusedMatMul"} <= judged_ops
    assert (
        ort_le.graph.startswith("ONNX Runtime's optimized graph") and "SkipLayerNormalization" in ort_le.graph
    )
    assert ort_le.origins == ()
    bad = r.explanation.local_for("test-ort-nudge")
    assert [o.tensor for o in bad.origins] == [target]
    o = bad.origins[0]
    assert o.op_type == "SkipLayerNormalization" and o.covers == tuple(fused) and len(fused) >= 2
    line = next(v for v in r.verdict() if v.startswith("FAIL: test-ort-nudge"))
    assert "(SkipLayerNormalization, fusing " in line and r.exit_code == 1


@pytest.mark.usefixtures("plugins")
def test_kernels_xbackend_cannot_evaluate_are_judged_as_the_nodes_they_replace() -> None:
    """ONNX Runtime lays a convnet out in NCHWc blocks (com.microsoft.nchwc): no float64 definition
    here, so its graph is severed at the tensors it computes under the model's names (the pooled
    features, after its ReorderOutput) and each piece is judged as the model's nodes it replaces,
    their bounds composed. A correct engine stays explained; 8192 ULP planted at the pooled
    features is an origin there, naming the convolutions its kernels computed."""
    r = xbackend.compare(
        TESTS.parent / "models" / "convnet.onnx",
        backends="ort-cpu,test-ort-nudge,reference",
        runs=1,
        shapes={"image": (2, 3, 32, 32)},
        runner_options={"test-ort-nudge": {"tensor": "pool", "ulps": "8192"}},
    )
    le = r.explanation.local_for("ort-cpu")
    assert le.status == "ok" and le.origins == (), le.origins
    assert le.graph.startswith("ONNX Runtime's optimized graph") and "com.microsoft.nchwc.Conv" in le.graph
    assert {n.tensor for n in le.nodes} == {"pool", "flatten", "logits"}
    assert not any("judged on the unfused graph" in v for v in r.verdict())
    bad = r.explanation.local_for("test-ort-nudge")
    (o,) = bad.origins
    assert o.tensor == "pool" and {"conv1", "relu1", "conv2", "relu2"} <= set(o.covers), o.covers


def _export_family(name: str, out: Path) -> dict[str, object]:
    """Export a random-init model of the family `name`; the compare keywords it needs."""
    from xbackend.export.example_inputs import InputDecl
    from xbackend.export.torch_onnx import export_torch

    shutil.copy(TESTS / "hf_models.py", out.parent / "hf_models.py")  # beside it: --trust-model-code
    factory = f"{out.parent / 'hf_models.py'}:{name}"
    if name == "unet":
        decls = [
            InputDecl("sample", (1, 4, 8, 8), "float32"),
            InputDecl("timestep", (1,), "int64"),
            InputDecl("encoder_hidden_states", (1, 6, 32), "float32"),
        ]
        export_torch(factory, decls, out, ranges={"timestep": (0, 1000)})
        return {"ranges": {"timestep": (0, 1000)}}
    if name == "whisper":
        export_torch(factory, [InputDecl("input_features", (1, 16, 64), "float32")], out)
        return {}
    names = ("input_ids", "attention_mask")
    export_torch(
        factory,
        [InputDecl(n, (1, 16), "int64") for n in names],
        out,
        dynamic={n: {0: "batch", 1: "sequence"} for n in names},
        ranges={"input_ids": (0, 512), "attention_mask": (1, 2)},
    )
    return {"shapes": {"batch": (1,), "sequence": (16,)}, "ranges": {"attention_mask": (1, 2)}}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "whisper", "llama", "unet"])
def test_correct_engines_are_explained_on_every_family(family: str, tmp_path: Path) -> None:
    """ONNX Runtime (on its optimized graph, or unfused where it uses NCHWc), OpenVINO f32, the
    reference, the float64 oracle and torch eager (at its module grain; diffusers' ResnetBlock2D
    calls one SiLU three times) are explained with no origin, and the oracle runs on each."""
    pytest.importorskip("diffusers" if family == "unet" else "transformers")
    model = tmp_path / f"{family}.onnx"
    extra = _export_family(family, model)
    r = xbackend.compare(
        model,
        backends="ort-cpu,openvino-cpu,reference,oracle,torch",
        runs=1,
        runner_options={"torch": {"trust_model_code": "true"}},
        **extra,  # type: ignore[arg-type]
    )
    assert r.backend("oracle").ok, r.backend("oracle").reason
    assert r.explanation.local_for("openvino-cpu").graph.startswith("OpenVINO's runtime graph: ")
    for name in ("ort-cpu", "openvino-cpu", "reference", "oracle", "torch"):
        le = r.explanation.local_for(name)
        assert le is not None and le.status == "ok" and le.origins == (), (
            name,
            le and le.reason,
            le and le.origins,
        )
    assert r.exit_code == 0, r.verdict()


def test_the_optimized_graph_path_cannot_come_from_outside(tmp_path: Path) -> None:
    """save_optimized writes a file: only xbackend's own explanation jobs set it. From the command
    line (or a replayed certificate's runner options) it is refused before anything runs, and the
    file it names is left as it was."""
    model = TESTS.parent / "models" / "mlp_layernorm.onnx"
    victim = tmp_path / "precious.onnx"
    victim.write_bytes(b"not to be overwritten")
    with pytest.raises(xbackend.UsageError, match="save_optimized is set by xbackend itself"):
        xbackend.compare(
            model, backends="ort-cpu,reference", runner_options={"ort-cpu": {"save_optimized": str(victim)}}
        )
    assert victim.read_bytes() == b"not to be overwritten"


# torch_mlp's FullyConnected kernels on OpenVINO's CPU plugin: fc1 with its bias and SiLU (out
# silu_k), fc2 with its bias (out linear_{2k+1}); the LayerNorm's scale and shift go into fc1's weights
_FC_OUTPUTS = {f"silu_{k}" if k else "silu" for k in range(6)} | {f"linear_{2 * k + 1}" for k in range(6)}


@pytest.mark.slow
def test_openvino_is_judged_on_its_runtime_graph_and_bf16_is_caught_at_its_kernels() -> None:
    """OpenVINO's own kernels, not the ONNX nodes: the model is severed at the outputs of the
    kernels its runtime graph runs. In f32 every kernel is within its composed allowance. At
    precision bf16, where the CPU computes in bf16 (avx512_bf16 or AMX; elsewhere OpenVINO keeps
    f32 and says so), the error is made at the matrix products: every FullyConnected kernel's
    output is an origin, and nothing else is."""
    model = TESTS.parent / "models" / "torch_mlp.onnx"
    r = xbackend.compare(
        model,
        backends="openvino-cpu,openvino-cpu@bf16,reference",
        runner_options={"openvino-cpu@bf16": {"precision": "bf16"}},
        runs=1,
        probes="none",
    )
    f32, bf16 = r.explanation.local_for("openvino-cpu"), r.explanation.local_for("openvino-cpu@bf16")
    assert f32 is not None and f32.status == "ok" and f32.origins == (), f32 and f32.origins
    assert f32.graph.startswith("OpenVINO's runtime graph: ") and "FullyConnected" in f32.graph, f32.graph
    judged = {n.tensor for n in f32.nodes}
    assert judged >= _FC_OUTPUTS and "val_3" not in judged  # fc1's MatMul is inside its kernel
    in_force = dict(r.backend("openvino-cpu@bf16").info)["in_force.INFERENCE_PRECISION_HINT"]
    assert bf16 is not None and bf16.status == "ok"
    if in_force == "bf16":
        assert {o.tensor for o in bf16.origins} == _FC_OUTPUTS, bf16.origins
        # the kernel that ends at silu computes the LayerNorm, fc1's MatMul and bias, and the SiLU
        silu = next(o for o in bf16.origins if o.tensor == "silu")
        assert {"layer_norm", "val_3", "linear", "val_4", "silu"} <= set(silu.covers), silu.covers
        assert r.exit_code != 0
    else:  # no bf16 arithmetic on this CPU: OpenVINO computes in f32
        assert in_force == "f32" and bf16.origins == (), bf16.origins


def test_the_explanation_is_the_same_with_its_jobs_side_by_side_or_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The floor engine's jobs and the float64 judge run in two lanes where two cores allow: the
    report cannot depend on it."""
    from xbackend.judge import explain_jobs as explain

    model = TESTS.parent / "models" / "torch_mlp.onnx"
    reports = []
    for lanes in (True, False):
        monkeypatch.setattr(explain, "side_by_side", lambda ctx, n, lanes=lanes: lanes)
        r = xbackend.compare(model, backends="ort-cpu,openvino-cpu,reference", runs=1, probes="none")
        assert r.explanation.ok and r.explanation.local_for("ort-cpu").nodes
        reports.append(xbackend.to_json(r))
    assert reports[0] == reports[1]


def test_each_part_of_a_split_inherits_its_slice_of_an_uncaptured_error() -> None:
    """A kernel that ends in a Split (OpenVINO's QKV projection, a torch module returning q, k, v):
    the Split reads an uncaptured MatMul, and each of its parts inherits exactly its slice of that
    MatMul's allowance, the parts after the first included (they were allowed nothing before)."""
    from onnx.reference import ReferenceEvaluator

    from xbackend.bounds.propagation import PROP
    from xbackend.judge.judged_graph import judged_model
    from xbackend.runners.oracle import promote_to_float64

    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 6)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Split", ["h"], ["p0", "p1", "p2"], axis=1, num_outputs=3),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info(p, onnx.TensorProto.FLOAT, [2, 2]) for p in ("p0", "p1", "p2")],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    shapes = {"x": (2, 6), "h": (2, 6), **{p: (2, 2) for p in ("p0", "p1", "p2")}}
    judged = judged_model(proto, shapes, dict.fromkeys(("p0", "p1", "p2"), "float32"))
    assert {PROP + p for p in ("p0", "p1", "p2")} <= set(judged.tensors)
    x = rng.standard_normal((2, 6))
    run = ReferenceEvaluator(promote_to_float64(judged.proto))
    names = [o.name for o in judged.proto.graph.output]
    got = dict(zip(names, run.run(names, {"x": x}), strict=True))
    bound, _, _ = node_bound(proto.graph.node[0], shapes, 18)
    h = x @ w.astype(np.float64)
    expected = allowance(bound, h, np.abs(x) @ np.abs(w.astype(np.float64)), unit_roundoff("float32"))
    for k, p in enumerate(("p0", "p1", "p2")):
        # rtol: the judged graph holds the rule's constants (u·b) as float32
        np.testing.assert_allclose(got[PROP + p], expected[:, 2 * k : 2 * k + 2], rtol=1e-7)


def _affine_grid(path: Path) -> None:
    """AffineGrid (opset 20): onnx's reference kernel computes it in float32 whatever its input."""
    g = helper.make_graph(
        [helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=1)],
        "affine",
        [helper.make_tensor_value_info("theta", onnx.TensorProto.FLOAT, [2, 2, 3])],
        [helper.make_tensor_value_info("grid", onnx.TensorProto.FLOAT, [2, 16, 16, 2])],
        [onnx.numpy_helper.from_array(np.array([2, 3, 16, 16], np.int64), "size")],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    proto.ir_version = 10
    onnx.save(proto, str(path))


@pytest.mark.usefixtures("plugins")
def test_an_op_the_evaluator_computes_in_float32_is_judged_with_its_rounding_added(tmp_path: Path) -> None:
    """onnx's AffineGrid kernel computes in float32: its 'float64' value is a float32 one. Correct
    engines are judged against it with 32 ULP of its largest element added (they were exact-
    compared, and failed, before); a bf16 rounding of its output is still an origin there."""
    model = tmp_path / "affine.onnx"
    _affine_grid(model)
    r = xbackend.compare(
        model,
        backends="test-plant,ort-cpu,reference",
        runner_options={"test-plant": {"plant": "affine-bf16"}},
        runs=1,
        probes="none",
    )
    assert dict(r.backend("test-plant").info)["planted"] == "grid"
    for name in ("ort-cpu", "reference"):
        le = r.explanation.local_for(name)
        assert le is not None and le.status == "ok" and le.origins == (), (name, le and le.origins)
    planted = r.explanation.local_for("test-plant")
    assert [o.tensor for o in planted.origins] == ["grid"]
    (o,) = planted.origins
    assert "its float64 value was computed in float32: 32 ULP added" in o.rule
    assert 4 < o.ratio < 1000, o.ratio  # bf16 keeps 8 bits: about 2^15 ULP of float32 at worst


def test_an_integer_result_is_compared_exactly_without_a_float_magnitude() -> None:
    """CumSum and Pow on int32 (ONNX's node tests): their results are compared exactly, so no
    float magnitude is built for them (it made the judged graph invalid: the float64 evaluation
    failed and nothing was judged)."""
    from xbackend.bounds.element import AUX
    from xbackend.judge.judged_graph import judged_model
    from xbackend.runners.oracle import promote_to_float64

    g = helper.make_graph(
        [helper.make_node("CumSum", ["x", "axis"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.INT32, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT32, [2, 3])],
        [onnx.numpy_helper.from_array(np.array(1, np.int32), "axis")],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    judged = judged_model(proto, {"x": (2, 3), "y": (2, 3)}, {"y": "int32"})
    assert AUX + "y" not in judged.tensors and "y" in judged.tensors
    from onnx.reference import ReferenceEvaluator

    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    (y,) = ReferenceEvaluator(promote_to_float64(judged.proto)).run(["y"], {"x": x})
    assert y.dtype == np.int32 and y.tolist() == [[0, 1, 3], [3, 7, 12]]


def test_pieces_are_cut_only_where_the_engine_reads_the_tensor_by_its_name() -> None:
    """ONNX Runtime's NCHWc kernels may read a blocked copy of a tensor, not the tensor it also
    writes under the model's name: severing the model there would feed the judged piece the
    reference's value while the engine computes its own from further up (a false origin at a
    UNet's Concat). Such a tensor is no cut point: the judged piece grows to match."""
    from xbackend.judge.shipped import coinciding

    def graph(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
        g = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 4, 4])],
            [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in ("t", "y")],
        )
        return helper.make_model(g)

    model = graph([helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Neg", ["t"], ["y"])])
    blocked = graph(
        [
            helper.make_node("ReorderInput", ["x"], ["xb"], domain="com.microsoft.nchwc"),
            helper.make_node("Relu", ["xb"], ["tb"]),
            helper.make_node("ReorderOutput", ["tb"], ["t"], domain="com.microsoft.nchwc"),
            helper.make_node("Neg", ["tb"], ["yb"]),
            helper.make_node("ReorderOutput", ["yb"], ["y"], domain="com.microsoft.nchwc"),
        ]
    )
    assert coinciding(blocked, model, {"t", "y"}) == {"y"}  # Neg reads tb, not t
    by_name = graph(
        [
            helper.make_node("Relu", ["x"], ["t"]),
            helper.make_node("ReorderInput", ["t"], ["tb"], domain="com.microsoft.nchwc"),
            helper.make_node("Neg", ["tb"], ["yb"]),
            helper.make_node("ReorderOutput", ["yb"], ["y"], domain="com.microsoft.nchwc"),
        ]
    )
    assert coinciding(by_name, model, {"t", "y"}) == {"t", "y"}  # read by its name, then reordered


def test_the_compiled_pass_judges_as_numpy_does() -> None:
    """xbackend.numerics.jitjudge judges a node output in one pass: the same ratio, element,
    allowance and flushed count as the numpy form, bit for bit, for every kind of bound, both
    dtypes, magnitudes in float32 or float64, exact values, rounding errors, a flushed subnormal
    and a zero where float64 is nonzero; and it declines a non-finite element."""
    from unittest import mock

    from xbackend.bounds.element import NodeBound, unit_roundoff
    from xbackend.judge import judge_nodes as jn

    rng = np.random.default_rng(1)
    bounds = [
        NodeBound("MatMul", "reduction", a=1.0, b=30.5, terms=64, lam=7.0, deterministic_b=64.0),
        NodeBound("Add", "elementwise", a=1.0),
        NodeBound("Foo", "default", scaled=64.0),
        NodeBound("Reshape", "exact"),
        NodeBound("Exp", "elementwise", a=2.0, c=3.0),
    ]
    seen = set()
    for trial in range(200):
        b = bounds[trial % len(bounds)]
        dt = np.float32 if trial % 3 else np.float64
        v = rng.standard_normal((7, 13)) * 10.0 ** int(rng.integers(-40, 5))
        y = v.astype(dt)
        kind = int(rng.integers(0, 4))
        if kind == 1:  # rounding errors past or within the allowance
            y = (v * (1 + rng.standard_normal(v.shape) * 1e-6)).astype(dt)
        elif kind == 2:  # one element lost
            y.flat[int(rng.integers(0, y.size))] = 0
        elif kind == 3:  # a subnormal flushed to zero
            v.flat[3], y.flat[3] = 1e-39, 0
        mag = np.abs(v) * rng.uniform(1, 30, v.shape) if b.b else None
        if mag is not None and trial % 2:
            mag = mag.astype(np.float32)
        fast = jn._measure_compiled(y, v, mag, b, unit_roundoff(np.dtype(dt)))
        with mock.patch.object(jn, "_COMPILED", frozenset()):
            slow = jn._measure(y, v, mag, b, None)
        assert fast == slow, (b.op, dt, kind)
        seen.add((slow.ratio > 1, slow.flushed > 0, bool(slow.vacuous)))
    assert {(True, False, False), (False, False, False), (True, True, False)} <= seen
    y = np.ones(4, np.float32)
    y[1] = np.inf
    assert jn._measure_compiled(y, np.ones(4), None, bounds[1], 2.0**-24) is None


def test_the_detection_formulas_hold_at_two_shapes() -> None:
    """docs/explanations.md's thresholds as formulas of the shape: within 1.5x of the measured ones
    at width 768 x 128 tokens and 256 x 32 (the benchmark exits 1 otherwise)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "thresholds", TESTS.parent / "benchmarks" / "detection_threshold.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for t, d in bench.SHAPES:
        for op in ("MatMul", "Softmax", "LayerNormalization"):
            got = bench.threshold(op, t, d)[0] / 2.0**-24
            assert 1 / 1.5 < got / bench.formula(op, t, d) < 1.5, (op, t, d)
    # a MatMul of 256 terms catches what one of 768 misses
    assert bench.threshold("MatMul", 32, 256)[0] < 0.5 * bench.threshold("MatMul", 128, 768)[0]


def test_each_report_says_the_smallest_loss_caught_per_backend_and_op(tmp_path: Path) -> None:
    p = tmp_path / "mlp.onnx"
    onnx.save(build("mlp_layernorm"), str(p))
    r = xbackend.compare(p, runs=1, probes="none")
    ref = dict((op, v) for op, v, _ in r.explanation.local_for("reference").detection())
    # a correctly rounded Add catches one u (with the judge's float64 slack); a 64-term sum far more
    assert ref["Add"] == pytest.approx(2.0**-24 * (1 + 2.0**-20), rel=1e-9)
    assert 50 * ref["Add"] < ref["MatMul"] < 1000 * ref["Add"]
    md = xbackend.report.to_markdown(r)
    assert "Smallest loss caught" in md and "| ort-cpu | ONNX Runtime's optimized graph" in md
    doc = json.loads(to_json(r))
    (ort,) = [x for x in doc["explanation"]["local_errors"] if x["backend"] == "ort-cpu"]
    assert {d["op_type"] for d in ort["detection"]} >= {"Add", "Gemm", "LayerNormalization"}
