"""`--candidate`: release candidates of models/torch_mlp.onnx made by their real converters (ONNX
Runtime's float16 tool, its static QDQ and dynamic quantizers), correct ones explained, and each
planted defect named at the node where it was planted."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from roots import TESTS

import xbackend
from tests import candidate_models as cm
from xbackend.candidates.match import match_graphs, precision_of
from xbackend.candidates.run import candidate_backends, candidate_feeds
from xbackend.cli import main
from xbackend.model.inputs import Feeds
from xbackend.model.load import load_model
from xbackend.results import CompareOptions
from xbackend.results.candidate_spec import candidate_spec


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("candidates")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f16 = cm.fp16(cm.MLP, d / "fp16.onnx")
        q = cm.qdq(d / "qdq.onnx")
        big = cm.big_weights(d / "big.onnx")
        return {
            "fp16": f16,
            "fp16_io": cm.fp16(cm.MLP, d / "fp16_io.onnx", keep_io_types=False),
            "bf16_node": cm.bf16_node(f16, d / "bf16_node.onnx"),
            "qdq": q,
            "qdq_small": cm.scaled_q(q, d / "qdq_small.onnx", 0.1),
            "qdq_large": cm.scaled_q(q, d / "qdq_large.onnx", 100.0),
            "dynamic": cm.dynamic_int8(d / "dynamic.onnx"),
            "big": big,
            "big_fp16": cm.fp16(big, d / "big_fp16.onnx"),
        }


@pytest.fixture(scope="module")
def mlp(made: dict[str, Path]) -> xbackend.Result:
    """One comparison of the original with every candidate of it (each on ort-cpu, the bfloat16
    one on onnx's evaluator: ONNX Runtime's CPU has no bfloat16 Add)."""
    names = ["fp16", "fp16_io", "qdq", "qdq_small", "qdq_large", "dynamic"]
    return xbackend.compare(
        cm.MLP,
        candidates=[str(made[n]) for n in names] + [f"{made['bf16_node']}@reference", str(made["bf16_node"])],
        decisions="auto",
    )


def _cand(r: xbackend.Result, path: Path, backend: str = "ort-cpu") -> object:
    return next(c for c in r.candidates if c.path == str(path) and c.compared_on in (backend, ""))


def test_a_float16_conversion_is_explained(mlp: xbackend.Result, made: dict[str, Path]) -> None:
    for key in ("fp16", "fp16_io"):
        c = _cand(mlp, made[key])
        assert c.ok and c.precision == "float16" and c.coverage == (49, 49)
        assert not c.origins and not c.stretch_origins and not c.findings and c.departure == ""
        assert c.explanation.status == "ok" and c.faulted is False
        # float16's rounding carried through the model: 60-75 dB everywhere
        sqnr = [m.sqnr_db for m in c.matches if m.how == "name" and m.original != "y"]
        assert all(55 < s < 80 for s in sqnr), sqnr
    assert _cand(mlp, made["fp16"]).matches[-1].dtype == "float32"  # y, cast back by keep_io_types
    io = _cand(mlp, made["fp16_io"])
    assert io.notes == ("x cast from float32 to float16",) and io.matches[-1].dtype == "float16"
    # the stretches through the inserted casts (the input cast, the output cast) are judged too
    assert _cand(mlp, made["fp16"]).stretches_judged == 3
    assert any(line.startswith("EXPLAINED: candidate") for line in mlp.verdict())


def test_a_bfloat16_node_in_a_float16_model_is_an_origin_at_its_node(
    mlp: xbackend.Result, made: dict[str, Path]
) -> None:
    c = _cand(mlp, made["bf16_node"], "reference")
    assert c.ok and c.precision == "float16 + bfloat16"
    assert [o.tensor for o in c.stretch_origins] == [cm.BF16_TENSOR]
    o = c.stretch_origins[0]
    assert o.op_type == "Add" and "cast to bfloat16 inside a float16 stretch" in o.detail
    assert o.ratio > 2.0
    assert c.departure == cm.BF16_TENSOR and c.faulted
    # on ONNX Runtime's CPU (no bfloat16 Add) the candidate is not compared, with the reason; the
    # original's comparison and the other candidates stand
    failed = next(x for x in mlp.candidates if x.path == str(made["bf16_node"]) and not x.ok)
    assert "Could not find an implementation for Add" in failed.reason
    assert all(b.ok for b in mlp.backends)


def test_a_qdq_scale_ten_times_too_small_saturates_at_its_node(
    mlp: xbackend.Result, made: dict[str, Path]
) -> None:
    c = _cand(mlp, made["qdq_small"])
    planted = [f for f in c.events if f.node == cm.SCALED_Q]
    assert [f.kind for f in planted] == ["saturation"] and planted[0].tensor == cm.OVERFLOW_TENSOR
    assert planted[0].count > 0.5 * planted[0].of  # most of val_3 is clipped
    # its decisions left the original's: the output they are read from, quantized, is its own finding
    (out,) = [f for f in c.events if f.kind == "decision-tensor"]
    assert out.tensor == "y" and "the decisions are read from y, held as int8" in out.detail
    assert c.events == (*planted, out) and c.departure == cm.OVERFLOW_TENSOR
    # the verdict names the module that computes it, as the original's export scopes say
    assert any("departure" in line and "at val_3 (blocks.0.fc1)" in line for line in mlp.verdict())
    # the range the input spans, as it is (never "±" for values of one sign)
    spans = re.search(r"the input spans (\S+) to (\S+), the scale", planted[0].detail)
    assert spans is not None and float(spans[1]) < float(spans[2]), planted[0].detail
    if not c.origins:  # its section never says "every node within" under "first departure past"
        md = xbackend.to_markdown(mlp)
        assert (
            "No node of the candidate is past the precision it declares on its own: the departure above "
            "is their errors carried through the model and the events below." in md
        )
    # the correct QDQ model: a few outliers clipped (min/max calibration on other data), a note each
    ok = _cand(mlp, made["qdq"])
    assert ok.events == () and not ok.faulted and ok.explanation.status == "ok" and not ok.origins
    assert all(f.kind == "saturation" and f.count <= 4 for f in ok.findings)
    assert any(m.how == "dequantized" for m in ok.matches)


def test_a_qdq_scale_a_hundred_times_too_large_is_coarse(mlp: xbackend.Result, made: dict[str, Path]) -> None:
    c = _cand(mlp, made["qdq_large"])
    # and where its decisions left the original's, the clipped output they are read from
    assert [(f.kind, f.node) for f in c.events] == [
        ("coarse-scale", cm.SCALED_Q),
        ("decision-tensor", "y_QuantizeLinear"),
    ]
    assert c.events[0].count == c.events[0].of  # every element in 3 levels


def test_dynamic_int8_is_explained(mlp: xbackend.Result, made: dict[str, Path]) -> None:
    c = _cand(mlp, made["dynamic"])
    assert c.precision == "int8 (dynamic)" and c.coverage == (49, 49) and not c.faulted
    assert all(25 < (m.sqnr_db or 0) < 160 for m in c.matches)


def test_candidates_decisions_are_held_against_the_original(
    mlp: xbackend.Result, made: dict[str, Path]
) -> None:
    for key in ("fp16", "qdq_small"):
        decided = _cand(mlp, made[key]).decisions
        assert [(d.reference, d.output, d.status) for d in decided] == [("original:reference", "y", "ok")]
    # the clipped val_3 moves the answers; a float16 conversion moves far fewer of them
    assert (
        _cand(mlp, made["qdq_small"]).decisions[0].flipped
        > 10 * _cand(mlp, made["fp16"]).decisions[0].flipped
    )


def test_a_float16_overflow_is_named_at_its_node(made: dict[str, Path]) -> None:
    r = xbackend.compare(made["big"], candidates=[str(made["big_fp16"])], fail_on="candidate-origin")
    (c,) = r.candidates
    over = [f for f in c.findings if f.kind == "overflow"]
    assert [(f.tensor, f.node) for f in over] == [(cm.OVERFLOW_TENSOR, cm.OVERFLOW_NODE)]
    assert over[0].count > 0 and "65504" in over[0].detail
    assert c.departure == cm.OVERFLOW_TENSOR
    assert next(m for m in c.matches if m.original == cm.OVERFLOW_TENSOR).nonfinite == over[0].count
    assert r.exit_code == 22 and r.gates()[0].policy == "candidate-origin"


def test_bad_candidates_are_said_and_the_comparison_stands(tmp_path: Path) -> None:
    other = tmp_path / "other.onnx"
    g = helper.make_graph(
        [helper.make_node("Relu", ["z"], ["w"])],
        "g",
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), other)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    # a missing file is a typo: a usage error before anything runs
    with pytest.raises(xbackend.InputError, match=r"--candidate .*missing\.onnx does not exist"):
        xbackend.compare(cm.MLP, candidates=[str(tmp_path / "missing.onnx"), str(other)])
    r = xbackend.compare(cm.MLP, candidates=[str(broken), str(other)])
    assert all(b.ok for b in r.backends) and [c.status for c in r.candidates] == ["failed"] * 2
    bad, wrong = r.candidates
    assert bad.reason
    assert "takes an input 'z' the original does not" in wrong.reason
    assert r.exit_code == 1
    assert sum(line.startswith("WARN: candidate") for line in r.verdict()) == 2


def test_candidate_spec_and_defaults() -> None:
    assert candidate_spec("int8.onnx@ort-cpu,openvino-cpu") == ("int8.onnx", ("ort-cpu", "openvino-cpu"))
    assert candidate_spec("dir@v2/m.onnx@ort-cpu@fast") == ("dir@v2/m.onnx", ("ort-cpu@fast",))
    assert candidate_spec("m.onnx") == ("m.onnx", ())
    opts = CompareOptions.create(backends="ort-cpu,openvino-cpu,reference,oracle")
    assert candidate_backends(opts, ()) == ("ort-cpu", "openvino-cpu")
    assert candidate_backends(CompareOptions.create(backends="reference"), ()) == ("ort-cpu",)
    with pytest.raises(xbackend.UsageError, match="--candidate"):
        CompareOptions.create(candidates=["@ort-cpu"])
    with pytest.raises(xbackend.UsageError):
        CompareOptions.create(candidates=["m.onnx@no-such-runner@x@y"])


def test_feeds_are_cast_to_the_candidates_inputs(made: dict[str, Path]) -> None:
    import numpy as np

    spec, _ = load_model(made["fp16_io"])
    feeds = Feeds.from_arrays({"x": np.ones((2, 8, 32), np.float32), "extra": np.zeros(2)}, 0, "generated")
    cast, notes = candidate_feeds(feeds, spec)
    assert cast.arrays["x"].dtype == np.float16 and set(cast.arrays) == {"x"}
    assert notes == [
        "x cast from float32 to float16",
        "the original's input(s) extra are not the candidate's: not fed",
    ]


def _graph(nodes: list[onnx.NodeProto], inits: list[str] = ()) -> onnx.GraphProto:  # type: ignore[assignment]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor(n, TensorProto.FLOAT, [2, 2], [1.0] * 4) for n in inits],
    )
    return g


def test_matching_names_each_way_and_why_not() -> None:
    original = _graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm_node"),
            helper.make_node("Add", ["mm", "b"], ["lin"], name="add_node"),
            helper.make_node("Relu", ["lin"], ["act"], name="relu_node"),
            helper.make_node("Mul", ["act", "w"], ["y"], name="mul_node"),
        ],
        ["w", "b"],
    )
    candidate = _graph(
        [
            helper.make_node("Gemm", ["x", "w", "b"], ["lin"], name="fused"),  # mm inside it
            helper.make_node("Relu", ["lin"], ["act16"], name="relu_node"),  # renamed output
            helper.make_node("QuantizeLinear", ["act16", "s"], ["q"], name="q"),
            helper.make_node("DequantizeLinear", ["q", "s"], ["dq"], name="dq"),
            helper.make_node("Mul", ["dq", "w"], ["y"], name="mul_node"),
        ],
        ["w", "b", "s"],
    )
    pairs, unmatched = match_graphs(original, candidate)
    assert [(p.original, p.candidate, p.how) for p in pairs] == [
        ("lin", "lin", "name"),
        ("act", "act16", "node"),
        ("act", "dq", "dequantized"),
        ("y", "y", "name"),
    ]
    assert [u.original for u in unmatched] == ["mm"]
    assert "inside the candidate's Gemm node fused" in unmatched[0].reason
    assert precision_of(candidate) == "int8 (QDQ)" and precision_of(original) == "float32"


def test_the_cli_reports_a_candidate(made: dict[str, Path], tmp_path: Path) -> None:
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    argv = ["compare", str(cm.MLP), "--candidate", f"{made['bf16_node']}@reference", "--no-progress"]
    argv += ["--fail-on", "candidate-origin"]
    code = main([*argv, "--report", str(md), "--json", str(js)])
    assert code == 22
    text = md.read_text("utf-8")
    assert "## Release candidates against the original" in text and "cast to bfloat16" in text
    assert (tmp_path / "r.candidate-sqnr.png").is_file()
    (c,) = json.loads(js.read_text("utf-8"))["candidates"]
    assert c["coverage"] == {"matched": 49, "tensors": 49} and c["departure"] == cm.BF16_TENSOR
    # the same comparison again: the same bytes
    code = main([*argv, "--report", str(tmp_path / "s.md"), "--json", str(tmp_path / "s.json")])
    assert code == 22
    assert (tmp_path / "s.json").read_text("utf-8") == js.read_text("utf-8")


OPTIMUM = TESTS / "optimum"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[xbackend.Result, dict[str, Path]]:
    """optimum's Llama (KV cache, random weights) as float16 (ONNX Runtime's tool, I/O kept in
    float32) and dynamic int8, each decoded 24 steps against the original."""
    d = tmp_path_factory.mktemp("llama")
    src = OPTIMUM / "llama.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = {"fp16": cm.fp16(src, d / "fp16.onnx"), "int8": cm.dynamic_int8(d / "int8.onnx", src)}
    r = xbackend.compare(src, decode=24, candidates=[str(made["fp16"]), str(made["int8"])])
    return r, made


def test_a_kv_cache_llama_candidate_decodes_against_the_original(
    llama: tuple[xbackend.Result, dict[str, Path]],
) -> None:
    r, made = llama
    original = r.decode
    assert original is not None and original.cached
    ref = original.backend("reference")
    for key, precision in (("fp16", "float16"), ("int8", "int8 (dynamic)")):
        c = _cand(r, made[key])
        assert c.ok and c.precision == precision and c.coverage[0] == c.coverage[1] > 600
        d = c.decode
        assert d is not None and d.reference == "the original" and d.prompts == original.prompts
        (b,) = d.backends
        assert b.backend == "ort-cpu" and b.ok and len(b.prompts) == len(ref.prompts) == 4
        for p, q in zip(b.prompts, ref.prompts, strict=True):
            step = p.first_divergent_step
            assert len(p.tokens) == 24
            if step is None:
                assert p.tokens == q.tokens and p.logit_difference is None
            else:  # the same tokens before it, the original's margin and the difference there
                assert p.tokens[:step] == q.tokens[:step] and p.tokens[step] != q.tokens[step]
                assert p.margin_at_divergence == q.margins[step] and p.logit_difference is not None
        # no KV-cache tensor or mask constant turns into an overflow; each node within its precision
        assert not c.events and not c.origins and not c.stretch_origins
        lines = [f.line for f in c.verdict_findings()]
        if b.first_divergence is not None:  # compared layer by layer where it first left the tokens
            f = b.first_divergence
            where = f"step {f.first_divergent_step} of prompt {f.prompt}"
            assert any(where in n for n in c.notes)
            assert any(line.startswith("NOTE:") and "the flip" in line and where in line for line in lines)


def test_advise_keeps_the_planted_node_of_a_qdq_model(made: dict[str, Path], tmp_path: Path) -> None:
    """The scale planted 10x too small clips val_3 and flips decisions; keeping its reader in
    float32 (its Q/DQ pair removed, as nodes_to_exclude does) restores them, in one try."""
    r = xbackend.compare(
        cm.MLP, decisions="auto", candidates=[str(made["qdq_small"]), str(made["fp16"])], advise=True
    )
    small, f16 = r.candidates
    a = small.advice
    assert a is not None and a.status == "ok" and a.converter.endswith("quantize_static")
    assert a.keep == ("node_linear",) and a.tried[0].step == "events" and a.tried[-1].matched
    assert "keep_float32(" in a.command and "    'node_linear',\n" in a.command
    assert "nodes_to_exclude=KEEP" in a.requantize and "READER" in a.requantize
    assert small.sensitivities[0].node == "node_linear" and small.decisions[0].flipped > 0
    # a candidate that already makes the original's choices keeps nothing
    assert f16.advice is not None and f16.advice.keep == () and "already match" in f16.advice.reason
    assert any(line.startswith("ADVICE: candidate") and "node_linear" in line for line in r.verdict())
    # the report's head: the advice and the flipped decisions before any NOTE; the title names both
    md = xbackend.to_markdown(r)
    names = f"{made['qdq_small'].name}, {made['fp16'].name}"
    assert md.startswith(f"# xbackend report: {Path(cm.MLP).name}, candidates {names}\n")
    verdict = md.split("## Verdict\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    advice = next(i for i, x in enumerate(verdict) if x.startswith("- ADVICE: ") and "node_linear" in x)
    flips = next(i for i, x in enumerate(verdict) if " decisions: " in x and "otherwise than the" in x)
    notes = [i for i, x in enumerate(verdict) if x.startswith("- NOTE")]
    assert all(advice < i and flips < i for i in notes), verdict


def test_advise_for_a_float16_llama_is_confirmed_by_its_converter(
    llama: tuple[xbackend.Result, dict[str, Path]], tmp_path: Path
) -> None:
    """The advice for the float16 Llama names only nodes the tool converted; a list it gives,
    made by the code it prints (run here as a user runs it), decodes the original's tokens; where
    none saves weight it says so, with the nodes that matter most."""
    _, made = llama
    r = xbackend.compare(OPTIMUM / "llama.onnx", decode=24, candidates=[str(made["fp16"])], advise=True)
    (c,) = r.candidates
    a = c.advice
    assert a is not None and a.target == "tokens" and len(a.tried) <= 8
    if not c.token_flips:  # this machine's float16 run already decodes like the original
        assert a.keep == () and a.status == "ok"
        return
    assert a.tried and all(t.step in ("events", "whole", "weightless", "bisect", "drop") for t in a.tried)
    if a.status == "none-holds":
        assert "no partial conversion" in a.reason and a.matters and not a.command
        return
    assert (a.status == "ok" and a.keep and a.tried[-1].matched) or any(t.matched for t in a.tried)
    kept = made["fp16"].with_name(made["fp16"].stem + "_kept.onnx")
    exec(compile(a.command, "advice", "exec"), {})  # the command as a user runs it
    again = xbackend.compare(OPTIMUM / "llama.onnx", decode=24, candidates=[str(kept)])
    (k,) = again.candidates
    assert k.ok and k.decode is not None and k.token_flips == ()


def test_advise_needs_a_target() -> None:
    with pytest.raises(xbackend.UsageError, match="--advise finds the nodes"):
        CompareOptions.create(candidates=["c.onnx"], advise=True)
    with pytest.raises(xbackend.UsageError, match="--advise finds the nodes"):
        CompareOptions.create(decode=4, advise=True)


def test_a_cnn_in_qdq_int8_folds_its_relus(tmp_path: Path) -> None:
    """ONNX Runtime's QDQ quantizer drops each Relu after a Conv (the range starts at 0) and
    names the Conv's output as the Relu's: the Conv is matched as its node, the Relu after its
    Q/DQ pair, and the values below 0 the range drops are the Relu's, not a saturation."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = cm.qdq(tmp_path / "convnet_qdq.onnx", cm.CONVNET)
    r = xbackend.compare(cm.CONVNET, shapes={"image": (4, 3, 32, 32)}, candidates=[str(q)], decisions="auto")
    (c,) = r.candidates
    got = {(m.original, m.candidate, m.how) for m in c.matches}
    assert ("conv1", "relu1", "node") in got and (
        "relu1",
        "relu1_DequantizeLinear_Output",
        "dequantized",
    ) in got
    assert ("relu1", "relu1", "name") not in got and (
        "conv1",
        "relu1_DequantizeLinear_Output",
        "dequantized",
    ) not in got
    assert c.coverage == (7, 7) and not c.findings and not c.faulted
    assert all(m.sqnr_db is not None and m.sqnr_db > 25 for m in c.matches)  # int8: 30-45 dB


def test_an_optimized_bert_is_matched_through_its_fused_kernels() -> None:
    """onnxruntime.transformers.optimizer's BERT (tests/optimum/bert-opt.onnx): most tensors live
    inside its fused kernels, each said with the kernels that replaced it."""
    shapes = {"batch_size": (2,), "sequence_length": (16,)}
    r = xbackend.compare(
        OPTIMUM / "bert.onnx", shapes=[f"{k}={v[0]}" for k, v in shapes.items()],
        candidates=[str(OPTIMUM / "bert-opt.onnx")],
    )  # fmt: skip
    (c,) = r.candidates
    matched, total = c.coverage
    assert 0 < matched < total // 4 and c.precision == "float32"
    why = " ".join(u.reason for u in c.unmatched)
    for kernel in ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu"):
        assert f"{kernel}" in why
    inside = [u for u in c.unmatched if u.reason.startswith("computed inside the candidate's")]
    assert len(inside) > total // 2
    assert not c.origins and not c.faulted  # float32 kernels, each within rounding of float64
    assert all(m.sqnr_db is None or m.sqnr_db > 100 for m in c.matches)


def test_a_vit_through_onnxslim(tmp_path: Path) -> None:
    import onnxslim

    slim = tmp_path / "vit-slim.onnx"
    onnx.save(onnxslim.slim(onnx.load(OPTIMUM / "vit.onnx")), slim)
    r = xbackend.compare(
        OPTIMUM / "vit.onnx", shapes=["pixel_values=2,3,32,32"], candidates=[str(slim)], decisions="auto"
    )
    (c,) = r.candidates
    matched, total = c.coverage
    assert matched > total // 2 and not c.faulted
    assert c.decisions[0].flipped == 0
    kinds = {u.reason.split(":")[0] for u in c.unmatched}
    assert "folded into the candidate's weights" in kinds


def test_batch_invariance_on_the_candidate_too(tmp_path: Path) -> None:
    mlp = cm.MLP.parent / "mlp_batch.onnx"
    f16 = cm.fp16(mlp, tmp_path / "mlp_batch_fp16.onnx")
    r = xbackend.compare(mlp, shapes=["x=4,128"], batch_invariance=4, candidates=[str(f16)])
    (c,) = r.candidates
    assert [p.name for p in c.probes] == ["batch"]
    assert c.probes[0].to_json()  # the candidate's own probe result, in its JSON
    lines = [
        line
        for line in [f.line for f in c.verdict_findings()]
        if "batch probe" in line or "batch-invariant" in line
    ]
    assert lines and all(line.split(":")[0] in ("WARN", "NOTE") for line in lines)


def test_a_qdq_model_on_onnx_runtime_is_within_its_requantization(made: dict[str, Path]) -> None:
    """ONNX Runtime fuses each Q/DQ MatMul into a QLinearMatMul whose integer result may sit one
    level off the float64 one where float32's rounding of its requantization scale reaches a half
    step; that, and the dequantized value it hands on, are within rounding."""
    r = xbackend.compare(made["qdq"], backends="ort-cpu,reference")
    ort = r.cross("ort-cpu")
    assert ort.status == "ok" and not ort.origins, [o.tensor for o in ort.origins]
    assert r.exit_code == 0
