"""Correct engines are explained with no origin on the families users export with optimum
(issue 46, item 6): ONNX Runtime on the graph its session runs (SimplifiedLayerNormalization,
FusedMatMul, QuickGelu, FastGelu, BiasGelu, com.microsoft Gelu; ViT's NCHWc patch convolution
judged as the nodes it replaces), OpenVINO on its runtime graph, the reference and the oracle.

The models are random-init configs exported by optimum in an environment of its own
(tests/optimum/export.py says how; optimum pins an older transformers than xbackend's)."""

from __future__ import annotations

from pathlib import Path

import pytest

import xbackend

HERE = Path(__file__).resolve().parent / "optimum"
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
