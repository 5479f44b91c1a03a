"""llama.cpp as a backend: optimum's Llama export beside its GGUF file (llama.cpp's own converter),
compared with ONNX Runtime in logits, in tokens and layer by layer, and held against an independent
llama-cpp-python loop on the same file."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
from roots import TESTS

import xbackend
from tests.gguf_models import dynamo_llama, with_gguf
from xbackend.errors import UsageError
from xbackend.export.gguf import write_gguf
from xbackend.host.environment import cpu_flags

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("sentencepiece") is None,
    reason="llama-cpp-python or sentencepiece not installed (pip install 'xbackend[llama]')",
)
F32_CACHE = {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}
SHAPES = {"batch_size": 1, "sequence_length": 12, "past_sequence_length": 0}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return with_gguf("llama", tmp_path_factory.mktemp("llama_cpp"), ("f32", "q8_0", "q4_k_m"))


# llama.cpp's AMX kernels of quantized weights crashed with SIGSEGV on the first decode on an
# Intel Xeon with amx_int8 (a 2-core VM); llama.cpp's plain CPU kernels ran. Elsewhere its default
QUANTIZED = {"extra_buffers": "false"} if "amx_int8" in cpu_flags() else {}


def _opts(**kw: str) -> dict[str, dict[str, str]]:
    return {"llama.cpp": {"threads": "2", **kw}}


def test_every_role_matches_onnx_runtime_to_float32_rounding(llama: Path) -> None:
    """With a float32 KV cache and no flash attention, all 33 tensors llama.cpp's graph names
    (per layer: the norms, Q/K/V and their rotations, the attention's merged heads, the output
    projection, both residuals, the MLP's gate, up, SwiGLU and down) sit within float32 rounding
    of ONNX Runtime's: the matching by role, and the Q/K rows interleaved back, are right."""
    r = xbackend.compare(
        llama, backends=["ort-cpu", "llama.cpp"], runner_options=_opts(**F32_CACHE), probes=["none"],
        runs=1, shapes=SHAPES, noise_samples=0,
    )  # fmt: skip
    b = next(x for x in r.backends if x.name == "llama.cpp")
    assert b.ok, b.reason
    (c,) = [x for x in r.cross_backend if x.backend == "llama.cpp"]
    layers = {d.name: d for d in c.tensors}
    assert len(layers) == 33  # logits + 15 roles x 2 layers + embedding + final norm
    assert {
        "/model/layers.1/self_attn/Add_1_output_0",
        "/model/layers.0/self_attn/Reshape_7_output_0",
    } <= set(layers)
    assert max(d.scaled_ulp or 0.0 for d in layers.values()) < 16
    said = dict(b.not_exposed)
    assert said["present.0.key"].startswith("llama.cpp keeps its KV cache inside")
    assert "interleaved back" in dict(b.info)["layout"]


def test_its_float16_cache_is_the_first_layer_past_tolerance(llama: Path) -> None:
    """By default llama.cpp keeps its KV cache in float16 and, with flash attention, reads it so:
    the first tensor past tolerance is layer 0's attention (its heads merged), not the projections
    that feed it."""
    r = xbackend.compare(
        llama, backends=["ort-cpu", "llama.cpp"], runner_options=_opts(), probes=["none"], runs=1,
        shapes=SHAPES, noise_samples=0,
    )  # fmt: skip
    (c,) = [x for x in r.cross_backend if x.backend == "llama.cpp"]
    layers = {d.name: d for d in c.tensors}
    assert (layers["/model/layers.0/self_attn/Add_1_output_0"].scaled_ulp or 0) < 16  # the rotated keys
    assert (layers["/model/layers.0/self_attn/Reshape_7_output_0"].scaled_ulp or 0) > 100  # read in float16
    assert c.first_violation == "/model/layers.0/self_attn/Reshape_7_output_0"


_LOOP = """
import json, sys
import numpy as np
from llama_cpp import Llama

gguf, prompts = sys.argv[1], json.loads(sys.argv[2])
llm = Llama(
    gguf, n_ctx=512, n_batch=512, n_threads=2, n_threads_batch=2, logits_all=True, flash_attn=False,
    verbose=False,
)
out = []
for prompt in prompts:
    llm.reset()
    llm.eval(prompt)
    tokens, margins = [], []
    for _ in range(16):
        scores = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        t = int(np.argmax(scores))
        top2 = np.sort(scores.astype(np.float64))[-2:]
        tokens.append(t)
        margins.append(float(top2[1] - top2[0]))
        llm.eval([t])
    out.append([tokens, margins])
print(json.dumps(out))
"""


def test_tokens_and_logits_equal_an_independent_llama_cpp_python_loop(llama: Path) -> None:
    """llama-cpp-python's own Llama class on the same GGUF, the same prompts and knobs, in a
    process of its own (ggml sets OpenMP's variables in the process that loads it): greedy, its KV
    cache, token after token; every token and every step's top-two logits alike, bit for bit."""
    import json
    import subprocess
    import sys

    r = xbackend.compare(
        llama, backends=["ort-cpu", "llama.cpp"], runner_options=_opts(flash_attn="off"), probes=["none"],
        runs=1, decode=16, noise_samples=0,
    )  # fmt: skip
    d = r.decode
    assert d is not None and d.cached
    mine = d.backend("llama.cpp")
    assert mine.ok, mine.reason
    prompts = json.dumps([list(p) for p in d.prompts])
    done = subprocess.run(
        [sys.executable, "-c", _LOOP, str(llama.with_suffix(".gguf")), prompts],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for k, (tokens, margins) in enumerate(theirs):
        assert tuple(tokens) == mine.prompts[k].tokens, k
        assert tuple(margins) == mine.prompts[k].margins, k  # the top two logits, bit for bit
    assert not d.token_flips  # and ONNX Runtime chose the same tokens


def test_without_a_gguf_it_says_how_to_make_one(tmp_path: Path) -> None:
    import shutil

    model = tmp_path / "llama.onnx"
    shutil.copy(TESTS / "optimum" / "llama.onnx", model)
    r = xbackend.compare(model, backends=["ort-cpu", "llama.cpp"], probes=["none"], runs=1, shapes=SHAPES)
    b = next(x for x in r.backends if x.name == "llama.cpp")
    assert b.status == "unavailable"
    assert "no llama.gguf beside" in b.reason and "--set llama.cpp.gguf=FILE" in b.reason
    assert next(x for x in r.backends if x.name == "ort-cpu").ok  # the comparison stands


def test_the_gguf_writer_refuses_before_it_converts(tmp_path: Path) -> None:
    (tmp_path / "someone.gguf").write_bytes(b"not ours")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(UsageError, match="xbackend never overwrites it"):
        write_gguf(tmp_path / "hf", tmp_path / "someone.gguf")
    with pytest.raises(UsageError, match="choose one of f32, f16, bf16, q8_0, q4_k_m, q4_0"):
        write_gguf(tmp_path / "hf", tmp_path / "new.gguf", "q3")
    with pytest.raises(UsageError, match="not a Hugging Face model folder"):
        write_gguf(tmp_path, tmp_path / "new.gguf")
    assert (tmp_path / "someone.gguf").read_bytes() == b"not ours"


@pytest.mark.parametrize("order", [("llama.cpp", "ort-cpu"), ("ort-cpu", "llama.cpp")])
def test_judged_from_its_own_tensors_its_float16_cache_is_the_origin(
    llama: Path, order: tuple[str, ...]
) -> None:
    """llama.cpp is judged against float64 from its own 33 tensors, as the reference and beside
    one (it cannot be fed another backend's values: each stretch between its tensors is evaluated
    from its own inputs): by default its attention reads a float16 KV cache, an origin made at
    layer 0's attention-weights times values MatMul; with a float32 cache and no flash attention,
    every node is within rounding (no false origin)."""
    common = {"probes": ["none"], "runs": 1, "shapes": SHAPES}
    r = xbackend.compare(llama, backends=list(order), runner_options=_opts(), **common)
    (line,) = [ln for ln in r.verdict() if ln.startswith("FAIL: llama.cpp: ")]
    assert "origins" in line and "first /model/layers.0/self_attn/Reshape_7_output_0" in line
    assert "made by MatMul at /model/layers.0/self_attn/MatMul_1_output_0" in line
    clean = xbackend.compare(llama, backends=list(order), runner_options=_opts(**F32_CACHE), **common)
    assert (
        clean.verdict()[0].startswith("PASS: ")
        and "within rounding of its float64 value" in clean.verdict()[0]
    )
    assert not [ln for ln in clean.verdict() if ln.startswith("FAIL")]


def test_token_by_token_against_one_batch(llama: Path) -> None:
    """The prompt fed one token per decode against one batch (llama.cpp issue #4479), as two
    instances of the backend: each reproducible; on AVX-512 their logits differ, first at layer
    0's query projection: a one-token batch takes ggml's vector-matrix product, a longer one
    llamafile's tiled sgemm, which sums in another order. Micro-batches of 4 (n_ubatch) and
    batches of 5 keep the bits of one batch of 12."""
    opts = {
        "llama.cpp": {"threads": "2"},
        "llama.cpp@token": {"threads": "2", "feed": "token"},
        "llama.cpp@ubatch4": {"threads": "2", "n_ubatch": "4"},
        "llama.cpp@batch5": {"threads": "2", "n_batch": "5"},
    }
    r = xbackend.compare(
        llama,
        backends=list(opts),
        runner_options=opts,
        probes=["none"],
        runs=2,
        shapes=SHAPES,
        noise_samples=0,
    )
    assert all(b.ok and b.deterministic for b in r.backends)
    cross = {c.backend: c for c in r.cross_backend}
    for same in ("llama.cpp@ubatch4", "llama.cpp@batch5"):
        assert cross[same].bitwise_equal and not any(not d.bitwise_equal for d in cross[same].tensors)
    token = cross["llama.cpp@token"]
    if "avx512f" in cpu_flags():  # the kernels measured here; AVX2 machines have their own sgemm tiles
        assert not token.bitwise_equal
        assert token.first_divergence == "/model/layers.0/self_attn/q_proj/MatMul_output_0"
    elif not token.bitwise_equal:
        assert token.first_divergence is not None and "/model/layers.0/" in token.first_divergence


# measured here (AVX-512): sample alone vs in a batch of 4 prompts, the 4 as sequences of one
# context (a server's slots), at the logits: (invariant, scaled ULP at worst)
SLOTS = {
    "own caches, one batch": ({}, True, 0.0),
    "own caches, a token of each per decode": ({"feed": "token"}, False, 1.5),
    "one shared cache, one batch, float32 cache": (
        {"kv_unified": "true", **F32_CACHE},
        False,
        1.0,
    ),
    "one shared cache, one batch": ({"kv_unified": "true"}, True, 0.0),
}


@pytest.mark.parametrize("case", sorted(SLOTS))
def test_several_prompts_as_slots_against_one_alone(llama: Path, case: str) -> None:
    """The batch probe on llama.cpp (llama.cpp #7052: a server's slots give other logits than
    one prompt alone): 4 prompts decoded as 4 sequences of one context. With a cache per
    sequence and each prompt in one batch, each sample keeps its bits; decoding a token of each
    per call (as slots do) takes the matrix product where one alone takes the vector-matrix one
    (#4479), and one cache shared by all (kv_unified) has attention read every sequence's rows
    (masked) where flash attention is off."""
    opts, invariant, worst = SLOTS[case]
    r = xbackend.compare(
        llama, backends=["llama.cpp"], runner_options=_opts(**opts), probes=["batch"], batch_invariance=4,
        runs=1, shapes={**SHAPES}, noise_samples=0,
    )  # fmt: skip
    (p,) = r.probe("batch").rows  # type: ignore[attr-defined]
    assert p.status == "ok" and p.compared == 1 and len(p.positions) == 3, p.reason  # logits, 3 positions
    if "avx512f" in cpu_flags():  # the kernels measured here; AVX2 machines have their own sgemm tiles
        assert p.invariant == invariant and (p.scaled_ulp or 0.0) == worst
    if not p.invariant:
        assert p.first_divergence == "logits"


@pytest.mark.parametrize("original_on", ["ort-cpu", "llama.cpp"])
def test_gguf_quantizations_as_candidates(llama: Path, original_on: str) -> None:
    """`--candidate FILE.gguf@llama.cpp` against the ONNX original on ONNX Runtime, or against the
    F32 GGUF on llama.cpp: per-layer SQNR over the 33 tensors llama.cpp's graph holds (the rest
    listed with llama.cpp's reason), tokens decoded against the original's, and no judgment at a
    precision the format does not declare. Measured here: Q8_0 34-45 dB, Q4_K_M 18-28 dB."""
    lowest = {}
    for kind in ("q8_0", "q4_k_m"):
        r = xbackend.compare(
            llama, backends=[original_on], candidates=[f"{llama.parent / f'llama-{kind}.gguf'}@llama.cpp"],
            decode=16, runner_options={"llama.cpp": {"threads": "2", **QUANTIZED}},
        )  # fmt: skip
        (c,) = r.candidates
        assert c.status == "ok", c.reason
        assert c.precision == f"{kind.upper()} (GGUF)" and c.coverage == (33, 625)
        assert c.compared_on == "llama.cpp" and c.original_on == original_on
        why = dict((u.original, u.reason) for u in c.unmatched)
        assert why["present.0.key"].startswith("llama.cpp keeps its KV cache inside")
        assert (
            "no tensor of its own in llama.cpp's graph" in why["/model/layers.0/input_layernorm/Pow_output_0"]
        )
        assert c.decode is not None and len(c.decode.backend("llama.cpp").prompts) == 4
        lines = [f.line for f in c.verdict_findings(r.model.modules())]
        assert any("a GGUF file declares its weights' types" in ln for ln in lines)
        assert not any(ln.startswith("FAIL") for ln in lines)  # nothing judged at a precision it lacks
        lowest[kind] = min(m.sqnr_db for m in c.matches if m.sqnr_db is not None)
    assert lowest["q8_0"] > 30 and lowest["q4_k_m"] < 25 and lowest["q8_0"] - lowest["q4_k_m"] > 10


def test_qwen2_rotates_halves_and_names_no_output_projection(tmp_path: Path) -> None:
    """Qwen2's GGUF keeps Hugging Face's Q/K order (llama.cpp rotates halves for it, NEOX): its 31
    named tensors sit within float32 rounding with no interleaving undone; its graph names no
    output projection, and that tensor is said not exposed with the reason."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = with_gguf("qwen2", tmp_path)
    r = xbackend.compare(
        model, backends=["ort-cpu", "llama.cpp"], runner_options=_opts(**F32_CACHE), probes=["none"],
        runs=1, shapes=SHAPES, noise_samples=0,
    )  # fmt: skip
    b = next(x for x in r.backends if x.name == "llama.cpp")
    (c,) = [x for x in r.cross_backend if x.backend == "llama.cpp"]
    assert len(c.tensors) == 31 and max(d.scaled_ulp or 0.0 for d in c.tensors) < 16
    assert "/model/layers.0/self_attn/q_proj/Add_output_0" in {d.name for d in c.tensors}  # its bias added
    assert dict(b.not_exposed)["/model/layers.0/self_attn/o_proj/MatMul_output_0"] == (
        "llama.cpp's qwen2 graph names no tensor attn_out-0 (PROJ): not handed out"
    )
    assert "layout" not in dict(b.info)


# measured here (trained 300 steps, --decode 24, 4 prompts): the smallest greedy margin, and the
# prompts each quantization leaves (Q8_0 34-35 dB at worst, Q4_K_M 18-19 dB, both families)
TRAINED = {"llama": (0.3, 0, 1), "qwen2": (0.02, 1, 1)}


@pytest.mark.parametrize("family", sorted(TRAINED))
def test_a_trained_model_in_onnx_and_gguf(tmp_path: Path, family: str) -> None:
    """optimum's Llama and Qwen2 trained 300 steps (tests/trained_lm.py: greedy margins of 0.3
    and 0.03 at their smallest, not a random model's 1e-3), in ONNX and GGUF from the same
    weights: llama.cpp's F32 file chooses ONNX Runtime's tokens on every prompt and step; its
    Q8_0 file sits near 35 dB at worst, Q4_K_M near 18 dB; each leaves at most the prompts
    measured."""
    margin, q8_left, q4_left = TRAINED[family]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = with_gguf(family, tmp_path, ("f32", "q8_0", "q4_k_m"), trained_steps=300)
    lowest, left = {}, {}
    for kind in ("q8_0", "q4_k_m"):
        candidate = f"{tmp_path / f'{family}-{kind}.gguf'}@llama.cpp"
        r = xbackend.compare(
            model,
            backends=["ort-cpu", "llama.cpp"],
            candidates=[candidate],
            decode=24,
            runner_options=_opts(**QUANTIZED),
        )
        assert r.decode is not None and not r.decode.token_flips  # the F32 file: every token ONNX Runtime's
        assert min(min(p.margins) for p in r.decode.backend("ort-cpu").prompts) > margin
        (c,) = r.candidates
        assert c.status == "ok" and c.decode is not None
        lowest[kind] = min(m.sqnr_db for m in c.matches if m.sqnr_db is not None)
        left[kind] = c.decode.backend("llama.cpp").flipped_prompts
    assert lowest["q8_0"] > 30 and 12 < lowest["q4_k_m"] < 25
    assert left["q8_0"] <= q8_left and left["q4_k_m"] <= q4_left + 1


def test_a_torch_onnx_export_matched_by_its_recorded_modules(tmp_path: Path) -> None:
    """A Llama exported by torch.onnx's dynamo exporter (`xbackend export torch`): its nodes are
    node_linear_3 and so on, their modules recorded in metadata, its logits output named by the
    exporter. llama.cpp hands its logits back under that name, and every role of both layers
    is found through the recorded module paths (the residual Adds as the layer's own), each
    within float32 rounding of ONNX Runtime's with a float32 cache, and judged within rounding
    (its rotary cos and sin, which the exporter folded into constants, are its own: allowed as
    recomputed); its default float16 cache is the origin at the attention."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = dynamo_llama(tmp_path)
    r = xbackend.compare(
        model, backends=["ort-cpu", "llama.cpp"], runner_options=_opts(**F32_CACHE), probes=["none"], runs=1,
    )  # fmt: skip
    b = next(x for x in r.backends if x.name == "llama.cpp")
    assert b.ok, b.reason
    (c,) = [x for x in r.cross_backend if x.backend == "llama.cpp"]
    (out,) = c.outputs
    assert out != "logits" and out in {d.name for d in c.tensors}
    assert len(c.tensors) == 33 and max(d.scaled_ulp or 0.0 for d in c.tensors) < 16
    assert not [ln for ln in r.verdict() if ln.startswith(("FAIL", "WARN: llama.cpp"))], r.verdict()
    # its rotary constants (cos and sin, folded by the exporter) are ones it computes again
    assert dict(b.info)["recomputes_constants"] == "unsqueeze_14,unsqueeze_15"
    # its default float16 cache: the origin at the attention's weights-times-values product
    r = xbackend.compare(
        model, backends=["ort-cpu", "llama.cpp"], runner_options=_opts(), probes=["none"], runs=1
    )
    (line,) = [ln for ln in r.verdict() if ln.startswith("FAIL: llama.cpp: ")]
    assert "first view_4 (model.model.layers.0.self_attn)" in line
    assert "made by MatMul at scaled_dot_product_attention" in line


def test_extra_buffers_off_is_a_build_of_its_own(llama: Path) -> None:
    """llama.cpp's extra weight buffers are a knob of the build: off (its --no-repack), the
    quantized file runs on ggml's plain CPU kernels, and the fingerprint says which ran."""
    quantized = str(llama.parent / "llama-q8_0.gguf")
    options = {"llama.cpp": {"threads": "2", "gguf": quantized, "extra_buffers": "false"}}
    r = xbackend.compare(
        llama, backends=["llama.cpp"], runner_options=options, probes=["none"], runs=2,
        tensors="outputs", noise_samples=0, shapes={**SHAPES},
    )  # fmt: skip
    b = r.backend("llama.cpp")
    assert b.ok and b.deterministic, b.reason
    assert dict(b.info)["extra_buffers"] == "False"
