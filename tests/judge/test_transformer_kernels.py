"""The kernels ONNX Runtime's transformer optimizer and quantizers write into models (issue 46,
item 6): each evaluated in float64 from its definition and judged with its composed bound.
Correct engines (ONNX Runtime's own kernels, OpenVINO's conversions, the reference, the oracle)
are EXPLAINED with no origin; attention probabilities rounded to float16 inside one fused node
are an origin exactly at that node; what has no float64 form is named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from roots import TESTS

import xbackend
from tests.kernel_models import KERNELS, group_query_attention
from xbackend.model.ortdomain import as_contrib
from xbackend.runners.contrib import contrib_ops

OPTIMUM = TESTS / "optimum"
ENGINES = ("ort-cpu", "reference", "oracle")


def _save(proto: onnx.ModelProto, tmp_path: Path) -> Path:
    path = tmp_path / "kernel.onnx"
    onnx.save(proto, str(path))
    return path


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_each_kernel_is_explained_against_onnx_runtimes_own(kernel: str, tmp_path: Path) -> None:
    proto, ranges = KERNELS[kernel]()
    op = kernel.split("-")[0]
    r = xbackend.compare(
        _save(proto, tmp_path), backends=",".join(ENGINES), runs=1, probes="none", ranges=ranges
    )
    for name in ENGINES:
        le = r.explanation.local_for(name)
        assert le is not None and le.status == "ok", (name, le and le.reason)
        assert le.origins == () and not le.unjudged, (name, le.origins, le.unjudged)
        first = next(n for n in le.nodes if n.op_type == op)
        # judged by its own bound (not the 32-ULP default, not vacuous), well inside it
        assert first.ratio < 0.7, (name, first)
        if kernel == "MatMulNBits-int8":  # accuracy_level 4: the int8 activations' steps are allowed
            assert first.allowed_scaled_ulp > 1e4, first
        else:
            assert 0.1 < first.allowed_scaled_ulp < 1e3, (name, first)
    assert r.exit_code == 0, r.verdict()


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize("kernel", ["Attention", "MultiHeadAttention", "GroupQueryAttention"])
def test_half_precision_probabilities_are_an_origin_at_the_attention_node(
    kernel: str, tmp_path: Path
) -> None:
    proto, ranges = KERNELS[kernel]()
    r = xbackend.compare(
        _save(proto, tmp_path),
        backends="test-half-probs,ort-cpu,reference",
        runs=1,
        probes="none",
        ranges=ranges,
    )
    c = r.cross("test-half-probs")
    # the attention output, never the present keys and values the kernel copies
    assert [o.tensor for o in c.origins] == ["y"], c.origins
    assert c.origins[0].ratio > 4, c.origins[0].ratio
    assert r.cross("ort-cpu").explained is True and r.exit_code == 1


@pytest.mark.parametrize(
    ("family", "shapes", "ranges", "kernels"),
    [
        (
            "bert",
            {"batch_size": (2,), "sequence_length": (16,)},
            {"input_ids": (0, 256), "attention_mask": (1, 2), "token_type_ids": (0, 2)},
            ("EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"),
        ),
        (
            "llama",
            {
                "batch_size": (1,),
                "sequence_length": (8,),
                "past_sequence_length": (4,),
                "past_sequence_length + sequence_length": (12,),
            },
            {"input_ids": (0, 256), "attention_mask": (1, 2), "position_ids": (4, 12)},
            ("RotaryEmbedding", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"),
        ),
    ],
)
def test_correct_engines_are_explained_on_optimized_exports(
    family: str,
    shapes: dict[str, tuple[int, ...]],
    ranges: dict[str, tuple[int, int]],
    kernels: tuple[str, ...],
) -> None:
    engines = ("ort-cpu", "openvino-cpu", "reference", "oracle")
    r = xbackend.compare(
        OPTIMUM / f"{family}-opt.onnx",
        backends=",".join(engines),
        runs=1,
        probes="none",
        shapes=shapes,
        ranges=ranges,
    )
    for name in engines:
        le = r.explanation.local_for(name)
        assert le is not None and le.status == "ok", (name, le and le.reason)
        assert le.origins == () and not le.unjudged, (name, le.origins[:3], le.unjudged[:3])
    ops = {n.op_type for n in r.explanation.local_for("reference").nodes}
    assert set(kernels) <= ops, ops
    assert r.exit_code == 0, r.verdict()


@pytest.mark.usefixtures("plugins")
def test_half_precision_probabilities_are_origins_at_bert_attention_nodes() -> None:
    model = OPTIMUM / "bert-opt.onnx"
    r = xbackend.compare(
        model,
        backends="test-half-probs,ort-cpu,reference",
        runs=1,
        probes="none",
        shapes={"batch_size": (2,), "sequence_length": (16,)},
        ranges={"input_ids": (0, 256), "attention_mask": (1, 2), "token_type_ids": (0, 2)},
    )
    attention = [n.output[0] for n in onnx.load(str(model)).graph.node if n.op_type == "Attention"]
    assert len(attention) == 2
    assert [o.tensor for o in r.cross("test-half-probs").origins] == attention
    assert r.cross("ort-cpu").explained is True


def test_t5_relative_position_bias_and_attention_match_the_unfused_model() -> None:
    """RelativePositionBias runs on ONNX Runtime's CUDA provider only: its float64 form (and
    Attention's with a bias and a raw mask) is checked against the model before the optimizer
    fused it, on ONNX Runtime."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 256, (2, 40)), "attention_mask": np.ones((2, 40), np.int64)}
    feeds["attention_mask"][1, 30:] = 0
    plain = ort.InferenceSession(str(OPTIMUM / "t5-encoder.onnx"), providers=["CPUExecutionProvider"])
    want = plain.run(None, feeds)[0]
    fused = as_contrib(onnx.load(str(OPTIMUM / "t5-encoder-opt.onnx")))
    assert {"RelativePositionBias", "Attention"} <= {n.op_type for n in fused.graph.node}
    for i, n in enumerate(fused.graph.node):  # onnx's own loop binds an omitted output to ""
        n.output[:] = [o or f"omitted.{i}.{k}" for k, o in enumerate(n.output)]
    got = ReferenceEvaluator(fused, new_ops=contrib_ops()).run(None, feeds)[0]
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


def test_an_omitted_output_never_feeds_an_omitted_input() -> None:
    """The fused T5 encoder omits outputs of SkipSimplifiedLayerNormalization and then inputs of
    Attention (its bias and past): the reference binds no value to the omitted name."""
    r = xbackend.compare(
        OPTIMUM / "t5-encoder-opt.onnx",
        backends="reference,oracle",
        runs=1,
        probes="none",
        shapes={"batch_size": (1,), "encoder_sequence_length": (16,)},
        ranges={"input_ids": (0, 256), "attention_mask": (1, 2)},
    )
    assert [b.status for b in r.backends] == ["ok", "ok"], [b.reason for b in r.backends]
    assert r.exit_code == 0, r.verdict()


def test_an_option_outside_the_float64_forms_is_named(tmp_path: Path) -> None:
    """ONNX Runtime runs a softcapped GroupQueryAttention; xbackend has no float64 form of it:
    the reference fails naming the option, and ONNX Runtime is not judged, with a WARN."""
    proto, ranges = group_query_attention()
    proto.graph.node[0].attribute.append(onnx.helper.make_attribute("softcap", 30.0))
    r = xbackend.compare(
        _save(proto, tmp_path), backends="ort-cpu,reference", runs=1, probes="none", ranges=ranges
    )
    assert r.backend("ort-cpu").status == "ok"
    assert (
        "GroupQueryAttention with softcap or smooth_softmax is not covered" in r.backend("reference").reason
    )
    assert (
        "FAIL: not judged: no explanation of the differences: reference did not run: no backend was "
        "judged against float64, ort-cpu included" in r.verdict()
    )
    assert r.exit_code == 1


def test_a_kernel_with_no_float64_form_is_named(tmp_path: Path) -> None:
    proto, ranges = group_query_attention()
    proto.graph.node[0].op_type = "SparseAttention"
    r = xbackend.compare(_save(proto, tmp_path), backends="reference", runs=1, probes="none", ranges=ranges)
    assert (
        "xbackend has no float64 form of com.microsoft.SparseAttention, an ONNX Runtime kernel"
        in r.backend("reference").reason
    )
