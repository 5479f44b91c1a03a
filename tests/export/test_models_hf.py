"""Real model families as a user brings them: transformers BERT and GPT-2 (random init from
their configs), exported by xbackend's own exporter, through the README's recipe."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from roots import TESTS

import xbackend
from tests.cli_helpers import one_line_error, run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None,
        reason="transformers not installed: pip install 'xbackend[torch,models]'",
    ),
]
FACTORIES = TESTS / "hf_models.py"
SEQ_DIMS = ["--dynamic", "input_ids=0:batch", "--dynamic", "input_ids=1:sequence"]
MASK_DIMS = ["--dynamic", "attention_mask=0:batch", "--dynamic", "attention_mask=1:sequence"]


def test_export_names_the_input_the_module_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """BERT's 2-row token_type_ids table rejects the default example values [0, 16): exit 2,
    naming that input and the flag that fixes it; the flag then works."""
    base = ["export", "torch", f"{FACTORIES}:bert", "-o", str(tmp_path / "b.onnx")]
    ids = ["--input", "input_ids=2,8:int64", "--input", "attention_mask=2,8:int64"]
    code, _, err = run(capsys, *base, *ids, "--input", "token_type_ids=2,8:int64")
    assert code == 2
    one_line_error(err, "forward failed on input token_type_ids (integers in [0, 16))")
    assert "--range token_type_ids=LO:HI" in err
    code, out, _ = run(
        capsys, *base, *ids, "--input", "token_type_ids=2,8:int64", "--range", "token_type_ids=0:2"
    )
    assert code == 0 and out.startswith("wrote ")


def test_bert_on_every_cpu_engine_is_explained_with_module_paths(bert: Path) -> None:
    r = xbackend.compare(
        bert,
        backends=["ort-cpu", "torch", "reference"],
        shapes={"batch": (2,), "sequence": (16,)},  # one size per named dimension, for all inputs
        ranges={"attention_mask": (0, 2), "token_type_ids": (0, 2)},
        runs=1,
        runner_options={"torch": {"trust_model_code": "true"}},
    )
    assert r.exit_code == 0, r.verdict()
    for b in ("ort-cpu", "torch"):
        c = r.cross(b)
        assert c.explained is True
        # the additive attention mask (finfo.min) is fill, not the scale: no meaningless 1e-38
        assert all(d.scaled_ulp is None or d.bitwise_equal or d.scaled_ulp > 1e-6 for d in c.tensors)
    assert any(ln.startswith("EXPLAINED: ort-cpu") for ln in r.verdict())
    # the tensor where the difference starts is named with its module path, in the answer
    across = next(ln for ln in xbackend.to_markdown(r).splitlines() if ln.startswith("- **Across backends:"))
    assert "first at " in across and "(model." in across.split("first at ", 1)[1], across


def test_named_dimensions_are_set_once(bert: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "compare", str(bert), "--backends", "ort-cpu", "--runs", "1")
    assert code == 2
    one_line_error(err, "dynamic dimension(s) batch (of input_ids, attention_mask, token_type_ids)")
    assert "pass --shape batch=1 --shape sequence=1" in err


def test_gpt2_batch_probe_follows_rows_through_views(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HF GPT-2 runs its projections on [B*T, C] rows (view, then addmm): the probe compares
    those Gemms and names every tensor it leaves out."""
    path = tmp_path / "gpt2.onnx"
    code, _, _ = run(
        capsys, "export", "torch", f"{FACTORIES}:gpt2", "-o", str(path),
        "--input", "input_ids=2,16:int64", "--input", "attention_mask=2,16:int64",
        "--range", "input_ids=0:512", "--range", "attention_mask=1:2", *SEQ_DIMS, *MASK_DIMS,
    )  # fmt: skip
    assert code == 0
    r = xbackend.compare(
        path,
        backends=["reference"],
        shapes={"batch": (1,), "sequence": (16,)},
        ranges={"attention_mask": (1, 2)},
        runs=1,
        probes="batch",
        batch_invariance=3,
    )
    (row,) = r.probe("batch").rows  # type: ignore[attr-defined]
    compared = {t for t, *_ in row.by_depth}
    left_out = dict(row.left_out)
    gemms = [t.name for t in r.model.tensors if t.op_type == "Gemm"]
    assert gemms and set(gemms) <= compared  # the [B*T, C] rows, sample by sample
    exposed = {t.name for t in r.model.tensors}
    assert exposed <= compared | set(left_out)  # compared, or listed with the reason
    if row.invariant is False:  # numpy's BLAS may block 16 and 48 rows differently
        ops = r.model.op_types()
        assert ops[row.first_divergence] not in ("Reshape", "Transpose", "Slice", "Concat")
    data = json.loads(xbackend.to_json(r))["probes"]["batch"][0]
    assert {x["tensor"] for x in data["left_out"]} == set(left_out)


def test_torch_as_the_reference_explains_what_it_does_not_expose(bert: Path) -> None:
    """torch exposes module outputs only: the nodes between them run from the last tensor it
    holds, so a node's local error covers the Gemms above it and is allowed what they are; the
    floor's reductions (asked for: no backend needs them) take their shapes from ort-cpu's
    capture. Before, this was 'origins at Reshape, allowed 0'."""
    r = xbackend.compare(
        bert,
        backends=["torch", "ort-cpu"],
        shapes={"batch": (2,), "sequence": (16,)},
        ranges={"attention_mask": (0, 2), "token_type_ids": (0, 2)},
        runs=1,
        probes="none",
        noise_samples=8,
        runner_options={"torch": {"trust_model_code": "true"}},
    )
    assert r.reference_used == "torch"
    assert r.explanation.ok and r.explanation.permuted > 0, r.explanation.reason
    assert not r.explanation.skipped or all("unknown" not in why for *_, why in r.explanation.skipped)
    assert r.cross("ort-cpu").explained is True, r.verdict()


def _dynamo_export(factory: str, out: Path) -> None:
    """What a user does without xbackend: torch.onnx.export(dynamo=True) with dynamic batch and
    sequence on every input."""
    import importlib.util as iu

    import torch

    spec = iu.spec_from_file_location("hf_models_direct", FACTORIES)
    assert spec is not None and spec.loader is not None
    mod = iu.module_from_spec(spec)
    spec.loader.exec_module(mod)
    module = getattr(mod, factory)()
    ids = torch.randint(0, 512, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    b, t = torch.export.Dim("batch"), torch.export.Dim("sequence", max=1024)
    dims = {0: b, 1: t}
    torch.onnx.export(
        module,
        (ids, mask),
        str(out),
        dynamo=True,
        input_names=["input_ids", "attention_mask"],
        dynamic_shapes={"input_ids": dims, "attention_mask": dims},
    )


@pytest.mark.parametrize("factory", ["gpt2_long", "llama"])
def test_dynamic_axis_language_models_at_long_sequences(factory: str, tmp_path: Path) -> None:
    """GPT-2- and Llama-style models exported with dynamic batch and sequence, by xbackend and by
    torch's dynamo exporter directly, compared at sequence 512: every tensor is sized from the
    real shapes (symbolic shape inference; the rotary and mask tables onnx's inference leaves
    open were once counted at the largest input dimension), the mask is ones, the comparison
    runs whole under the default budget with ONNX Runtime explained against the reference, and
    in windows under a --max-memory that holds a third of a run. The memory plan's peak is within
    1.5x of the measured one."""
    import onnx

    from xbackend.export.example_inputs import InputDecl
    from xbackend.export.torch_onnx import export_torch
    from xbackend.model.footprint import tensor_bytes
    from xbackend.model.load import load_model
    from xbackend.planning.memory import OVERHEAD

    names = ("input_ids", "attention_mask")
    ours = tmp_path / "xbackend.onnx"
    export_torch(
        f"{FACTORIES}:{factory}",
        [InputDecl(n, (2, 16), "int64") for n in names],
        ours,
        dynamic={n: {0: "batch", 1: "sequence"} for n in names},
        ranges={"input_ids": (0, 512)},
    )
    direct = tmp_path / "dynamo.onnx"
    _dynamo_export(factory, direct)
    for path in (ours, direct):
        spec, proto = load_model(path)
        assert [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim] == ["batch", "sequence"]
        sizes = tensor_bytes(proto, {n: (1, 512) for n in names})
        assert sizes.unsized == () and set(spec.all_tensors()) <= set(sizes)
        per_run = sum(sizes[t] for t in spec.all_tensors())
        assert per_run < 2**30, per_run  # the guess made it several GiB
        unsized = onnx.shape_inference.infer_shapes(proto, data_prop=True)
        assert any(
            not all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)
            for v in unsized.graph.value_info
        )  # onnx alone leaves dimensions open on these exports
        kw = dict(backends=["ort-cpu", "reference"], shapes={"batch": (1,), "sequence": (512,)}, runs=1)
        whole = xbackend.compare(path, probes="none", timings=True, **kw)  # type: ignore[arg-type]
        assert whole.exit_code == 0, whole.verdict()
        for b in whole.backends:  # the plan's peak against the measured one (RSS, not a timing)
            assert 1 / 1.5 <= b.peak_rss_bytes / b.planned_peak <= 1.5, (
                b.name,
                b.peak_rss_bytes,
                b.planned_peak,
            )
        assert dict(whole.feeds.made)["attention_mask"] == "ones (a mask: no position padded)"
        assert not any("windows" in n or "memory plan" in n for n in whole.notes), whole.notes
        assert whole.cross("ort-cpu").explained is True
        # a budget that holds ort-cpu's weights and a third of a run: its tensors in windows
        budget = OVERHEAD + 3 * spec.weight_bytes + per_run // 3
        tight = xbackend.compare(
            path, backends=["ort-cpu"], shapes=kw["shapes"], runs=2, probes="none", max_memory=budget
        )
        note = next((n for n in tight.notes if "windows" in n), "")
        assert note.startswith("ort-cpu: its ") and "every tensor was still compared" in note, tight.notes
        assert tight.exit_code == 0 and tight.backend("ort-cpu").deterministic, tight.verdict()
