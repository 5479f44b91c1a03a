"""Correct engines are explained with no origin on the families users export with optimum
(issue 46, item 6): ONNX Runtime on the graph its session runs (SimplifiedLayerNormalization,
FusedMatMul, QuickGelu, FastGelu, BiasGelu, com.microsoft Gelu; ViT's NCHWc patch convolution
judged as the nodes it replaces), OpenVINO on its runtime graph, the reference and the oracle.

The models are random-init configs exported by optimum in an environment of its own
(tests/optimum/export.py says how; optimum pins an older transformers than xbackend's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from roots import ROOT, TESTS

import xbackend

HERE = TESTS / "optimum"
Shapes = dict[str, tuple[int, ...]]
Ranges = dict[str, tuple[int, int]]
LLM: Shapes = {
    "batch_size": (1,),
    "sequence_length": (8,),
    "past_sequence_length": (4,),
    "past_sequence_length + sequence_length": (12,),
}
IDS: Ranges = {"input_ids": (0, 256)}
MASK: Ranges = {"attention_mask": (1, 2)}
CACHED: Ranges = {**IDS, **MASK, "position_ids": (4, 12)}
SEQ2SEQ: Shapes = {"batch_size": (1,), "decoder_sequence_length": (1,), "past_decoder_sequence_length": (6,)}
NORM = "SimplifiedLayerNormalization"
# family: (shapes, ranges, the kernels ONNX Runtime's session fuses into it)
CASES: dict[str, tuple[Shapes, Ranges, tuple[str, ...]]] = {
    "llama": (LLM, CACHED, (NORM, "FusedMatMul", "QuickGelu")),
    "llama-nocache": (
        {"batch_size": (1,), "sequence_length": (8,)},
        {**IDS, **MASK, "position_ids": (0, 8)},
        (NORM,),
    ),
    "qwen2": (LLM, CACHED, (NORM, "QuickGelu")),
    "gpt2": (LLM, CACHED, ("FastGelu",)),
    "bert": (
        {"batch_size": (2,), "sequence_length": (16,)},
        {**IDS, **MASK, "token_type_ids": (0, 2)},
        ("BiasGelu",),
    ),
    "vit": ({"pixel_values": (2, 3, 32, 32)}, {}, ("BiasGelu",)),
    "t5-encoder": ({"batch_size": (1,), "encoder_sequence_length": (16,)}, {**IDS, **MASK}, (NORM,)),
    "t5-decoder-past": (
        {**SEQ2SEQ, "encoder_sequence_length": (16,)},
        {**IDS, "encoder_attention_mask": (1, 2)},
        (NORM,),
    ),
    "whisper-encoder": ({"batch_size": (1,)}, {}, ("BiasGelu",)),
    "whisper-decoder-past": ({**SEQ2SEQ, "encoder_sequence_length": (1500,)}, IDS, ("BiasGelu",)),
}
ENGINES = ("ort-cpu", "openvino-cpu", "reference", "oracle")


@pytest.mark.parametrize("family", sorted(CASES))
def test_correct_engines_are_explained_on_optimum_exports(family: str) -> None:
    shapes, ranges, fused = CASES[family]
    model = HERE / f"{family}.onnx"
    r = xbackend.compare(
        model, backends=",".join(ENGINES), runs=1, probes="none", shapes=shapes, ranges=ranges
    )
    for name in ENGINES:
        le = r.explanation.local_for(name)
        assert le is not None and le.status == "ok", (name, le and le.reason)
        assert le.origins == () and not le.unjudged, (name, le.origins[:3], le.unjudged[:3])
    # ONNX Runtime was judged on the graph its session runs, kernels and all
    graph = r.explanation.local_for("ort-cpu").graph
    assert graph.startswith("ONNX Runtime's optimized graph") and all(k in graph for k in fused), graph
    assert r.exit_code == 0, r.verdict()


@pytest.mark.parametrize("name", sorted(p.stem for p in HERE.glob("*.onnx")))
def test_every_suggested_shape_runs(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each export, run with no --shape: the error suggests only dimensions that can be set (never
    optimum's computed `past_sequence_length + sequence_length`), quoted for the shell, with
    consistent values, and the command it suggests runs."""
    import shlex

    from tests.cli_helpers import run

    model = str(HERE / f"{name}.onnx")
    base = ["compare", model, "--backends", "reference", "--runs", "1", "--probes", "none", "--no-progress"]
    code, _, err = run(capsys, *base)
    if code == 0:
        return
    if "unset; pass " not in err:  # one input's own --shape
        assert code == 2 and "pass --shape " in err, err
        if name == "vit":  # an image's channels and size are asked for, never guessed
            assert "pass --shape pixel_values=BATCH_SIZE,NUM_CHANNELS,HEIGHT,WIDTH with the " in err
            flag = "pixel_values=1,3,32,32"  # its config's
        else:
            flag = err.split("pass --shape ", 1)[1].split()[0]
        code, _, err = run(capsys, *base, "--shape", flag)
        assert code == 0, err
        return
    flags = shlex.split(err.split("unset; pass ", 1)[1].split(", or a --shape", 1)[0])
    assert not any(" + " in f for f in flags), flags
    code, _, err = run(capsys, *base, *flags)
    assert code == 0, err


def test_a_computed_dimension_is_derived_and_a_contrary_one_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.cli_helpers import one_line_error, run
    from xbackend.model.dims import computed_dim

    assert (
        computed_dim(
            "past_sequence_length + sequence_length", {"past_sequence_length": 4, "sequence_length": 8}
        )
        == 12
    )
    assert computed_dim("sequence_length", {"sequence_length": 8}) is None
    code, _, err = run(
        capsys, "compare", str(HERE / "llama.onnx"), "--backends", "reference", "--no-progress",
        "--shape", "batch_size=1", "--shape", "sequence_length=8", "--shape", "past_sequence_length=4",
        "--shape", "past_sequence_length + sequence_length=5",
    )  # fmt: skip
    assert code == 2
    one_line_error(
        err,
        "--shape 'past_sequence_length + sequence_length=5' disagrees with its operands "
        "(past_sequence_length + sequence_length = 12); leave it out",
    )


def test_token_ids_follow_a_reshape_to_the_embedding(tmp_path: Path) -> None:
    """optimum reshapes T5's input_ids before its embedding's Gather: the ids are still drawn from
    the vocabulary (256 rows), not [0, 16)."""
    from xbackend.model.inputs import generate_feeds
    from xbackend.model.load import load_model

    spec, _ = load_model(HERE / "t5-encoder.onnx")
    assert dict(spec.index_bounds) == {"input_ids": 256}
    feeds = generate_feeds(spec, 0, {"batch_size": (2,), "encoder_sequence_length": (64,)})
    ids = feeds.arrays["input_ids"]
    assert ids.max() >= 16 and ids.max() < 256


def test_onnx_runtimes_float16_converter_output_runs(tmp_path: Path) -> None:
    """ONNX Runtime's float16 tool appends its input Casts after the nodes that read them; ONNX
    Runtime loads that, so xbackend does: every backend runs the graph sorted, and the report
    names the file the user gave."""
    import onnx

    float16 = pytest.importorskip("onnxruntime.transformers.float16")
    src = ROOT / "models" / "mlp_layernorm.onnx"
    half = float16.convert_float_to_float16(onnx.load(src), keep_io_types=True)
    path = tmp_path / "mlp16.onnx"
    onnx.save(half, path)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(half)
    r = xbackend.compare(path, backends="ort-cpu,openvino-cpu,reference", runs=1, probes="none")
    assert all(b.ok for b in r.backends), [b.reason for b in r.backends]
    assert r.model.path == str(path) and r.model.unsorted
    assert any("out of topological order" in n for n in r.notes)
    assert r.cross("ort-cpu").explained is True


def _llama_torch(factory: str) -> xbackend.Result:
    """The KV-cache Llama export beside torch built by tests/optimum/llama_torch.py's `factory`."""
    return xbackend.compare(
        HERE / "llama.onnx",
        backends="ort-cpu,torch,reference",
        runs=1,
        probes="none",
        torch_module=f"{HERE / 'llama_torch.py'}:{factory}",
        shapes={k: v for k, v in LLM.items() if "+" not in k},
        ranges=CACHED,
    )


def test_a_torch_module_takes_an_optimum_kv_cache_export_positionally() -> None:
    """docs/recipes.md's adapter: xbackend hands the torch module the ONNX model's inputs in their
    order (input_ids, attention_mask, position_ids, then each layer's past key and value) and
    reads its outputs in the model's (logits, then each layer's present key and value)."""
    pytest.importorskip("transformers")
    r = _llama_torch("build")
    t = r.backend("torch")
    assert t.ok and t.deterministic, t.reason
    assert dict(t.info)["weights_checked"] == "16 of 16 non-constant float tensors found in the model"
    # judged at its modules, which optimum's node names map (/model/layers.0/self_attn/q_proj/...)
    assert dict(t.info)["mapped_from"] == "the exporter's node names (unverified)"
    le = r.explanation.local_for("torch")
    assert le is not None and le.status == "ok" and le.origins == () and not le.unjudged, le
    assert "/model/layers.1/self_attn/o_proj/MatMul_output_0" in {n.tensor for n in le.nodes}
    assert len(le.nodes) >= 25 and r.cross("torch").explained is True
    c = r.cross("torch")
    assert {d.name for d in c.output_tensors} == {
        "logits",
        "present.0.key",
        "present.0.value",
        "present.1.key",
        "present.1.value",
    }
    assert (c.scaled_ulp or 0) <= 16


def test_a_loss_inside_one_torch_module_is_an_origin_at_its_tensor() -> None:
    """tests/optimum/llama_torch.py:build_lossy rounds layer 1's o_proj output to bfloat16: torch
    is judged at the module outputs optimum's node names map, so the origin is exactly there."""
    pytest.importorskip("transformers")
    r = _llama_torch("build_lossy")
    c = r.cross("torch")
    assert [o.tensor for o in c.origins] == ["/model/layers.1/self_attn/o_proj/MatMul_output_0"], c.origins
    assert c.origins[0].ratio > 4 and r.cross("ort-cpu").explained is True and r.exit_code == 1


@pytest.mark.parametrize("family", sorted(set(CASES) - {"llama-nocache"}))
def test_torch_is_explained_on_optimum_exports(family: str) -> None:
    """tests/optimum/optimum_torch.py's adapters (the ONNX file's weights in the Hugging Face model,
    the ONNX inputs positionally; a seq2seq decoder's cross-attention keys and values as given):
    torch is judged at the module outputs optimum's node names map (ViT's fewer: transformers 5
    renamed its modules) and EXPLAINED with no origin."""
    pytest.importorskip("transformers")
    shapes, ranges, _ = CASES[family]
    r = xbackend.compare(
        HERE / f"{family}.onnx",
        backends="ort-cpu,torch,reference",
        runs=1,
        probes="none",
        torch_module=f"{HERE / 'optimum_torch.py'}:{family.replace('-', '_')}",
        shapes={k: v for k, v in shapes.items() if "+" not in k},
        ranges=ranges,
    )
    t = r.backend("torch")
    assert t.ok and dict(t.info)["mapped_from"] == "the exporter's node names (unverified)", t.reason
    found, total = dict(t.info)["weights_checked"].split(" non-constant")[0].split(" of ")
    # BERT's pooler is not in its export, nor a seq2seq model's other half in each of its files
    assert int(found) >= (int(total) // 2 if "-" in family else int(total) - 1), t.info
    le = r.explanation.local_for("torch")
    assert le is not None and le.status == "ok", le
    assert le.origins == () and not le.unjudged and len(le.nodes) >= (5 if family == "vit" else 20), le
    assert r.exit_code == 0, r.verdict()
