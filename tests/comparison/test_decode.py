"""compare --decode: greedy decoding on every backend, on random-init GPT-2-style and Llama-style
models exported with dynamic axes, with and without a KV cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from roots import ROOT, TESTS

import xbackend
from tests.cli_helpers import one_line_error, run
from tests.decoder_lm import export
from xbackend.comparison.decode import compositions, convention_of, step_feeds
from xbackend.errors import UsageError
from xbackend.model.load import load_model

STEPS = 24
# Prompts of lengths 6, 5 and 4, left-padded in one array: what --inputs hands --decode.
LENGTHS = (6, 5, 4)


@pytest.fixture(scope="module")
def lms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Llama-style with a KV cache, GPT-2-style without; vocabulary 512, 2 layers, seed 0."""
    out = tmp_path_factory.mktemp("lms")
    paths = {"llama-kv": out / "llama_kv.onnx", "gpt2": out / "gpt2.onnx"}
    export(str(paths["llama-kv"]), "llama", cache=True)
    export(str(paths["gpt2"]), "gpt2", cache=False)
    return paths


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(7)
    width = max(LENGTHS)
    ids = np.zeros((len(LENGTHS), width), np.int64)
    mask = np.zeros((len(LENGTHS), width), np.int64)
    for r, n in enumerate(LENGTHS):
        ids[r, width - n :] = rng.integers(0, 512, n)
        mask[r, width - n :] = 1
    path = tmp_path_factory.mktemp("prompts") / "prompts.npz"
    np.savez(path, input_ids=ids, attention_mask=mask)
    return path


def _greedy(model: Path, prompt: np.ndarray, steps: int) -> tuple[list[int], list[float]]:
    """An independent greedy loop on a plain onnxruntime session: tokens and top-1/top-2 margins."""
    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    seq = list(prompt)
    past: dict[str, np.ndarray] = {
        n: np.zeros((1, 2, 0, 16), np.float32) for n in names if n.startswith("past")
    }
    tokens, margins = [], []
    for _ in range(steps):
        fed = seq if not past else (seq if not tokens else [tokens[-1]])
        start = len(seq) - len(fed)
        feeds = {
            "input_ids": np.array([fed], np.int64),
            "attention_mask": np.ones((1, len(seq)), np.int64),
            "position_ids": np.arange(start, len(seq), dtype=np.int64)[None],
            **past,
        }
        out = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds), strict=True))
        row = out["logits"][0, -1].astype(np.float64)
        top = np.sort(row)[-2:]
        tokens.append(int(np.argmax(out["logits"][0, -1])))
        margins.append(float(top[1] - top[0]))
        past = {n: out[n.replace("past_key_values", "present")] for n in past}
        seq.append(tokens[-1])
    return tokens, margins


def _prompt_rows(path: Path) -> list[np.ndarray]:
    data = np.load(path)
    return [data["input_ids"][r][data["attention_mask"][r] > 0] for r in range(len(LENGTHS))]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["llama-kv", "gpt2"])
def test_ort_cpu_tokens_equal_an_independent_onnxruntime_loop(
    which: str, lms: dict[str, Path], prompts: Path
) -> None:
    r = xbackend.compare(
        lms[which], backends="ort-cpu,reference", decode=STEPS, inputs=str(prompts), probes="none", runs=1
    )
    assert r.decode is not None and r.decode.cached == (which == "llama-kv")
    ort_cpu, ref = r.decode.backend("ort-cpu"), r.decode.backend("reference")
    for k, prompt in enumerate(_prompt_rows(prompts)):
        tokens, margins = _greedy(lms[which], prompt, STEPS)
        assert list(ort_cpu.prompts[k].tokens) == tokens
        assert np.allclose(ort_cpu.prompts[k].margins, margins, rtol=1e-5, atol=1e-6)
        assert ref.prompts[k].tokens == ort_cpu.prompts[k].tokens  # float32 rounding flips no token here
    assert r.decode.prompt_lengths == LENGTHS
    assert r.decode.layers_step is not None and r.decode.layers_step[0] == "reference"
    # the per-layer comparison ran on the reference's closest call, as one sequence
    _, prompt, step = r.decode.layers_step
    assert {n: shape for n, _, shape in r.feeds.shapes}["input_ids"] == f"[1,{LENGTHS[prompt] + step}]"


@pytest.mark.slow
@pytest.mark.parametrize("which", ["llama-kv", "gpt2"])
def test_a_planted_change_flips_the_token_at_its_step(
    which: str,
    lms: dict[str, Path],
    prompts: Path,
    plugins: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """test-logit-flip raises the runner-up logit past the top one by 0.5 where the position id is
    8: prompt k (length n) flips at step 8 - (n - 1), with a logit difference of margin + 0.5."""
    js = tmp_path / "r.json"
    code, out, _ = run(
        capsys,
        "compare", str(lms[which]), "--backends", "ort-cpu,test-logit-flip", "--reference", "ort-cpu",
        "--decode", str(STEPS), "--inputs", str(prompts), "--probes", "none", "--runs", "1",
        "--set", "test-logit-flip.position=8", "--fail-on", "token-flip", "--json", str(js), "--no-progress",
    )  # fmt: skip
    assert code == 20, out
    d = json.loads(js.read_text("utf-8"))["decode"]
    ref = d["backends"]["ort-cpu"]["prompts"]
    flipped = d["backends"]["test-logit-flip"]
    for k, n in enumerate(LENGTHS):
        step = 8 - (n - 1)
        p = flipped["prompts"][k]
        assert p["first_divergent_step"] == step
        assert p["margin_at_divergence"] == ref[k]["margins"][step]
        assert p["logit_difference"] == pytest.approx(ref[k]["margins"][step] + 0.5, abs=1e-5)
        assert p["logit_differences"][:step] == [0.0] * step  # the same engine before the plant
    assert flipped["first_divergent_step"] == 8 - (LENGTHS[0] - 1)
    assert d["layers_step"] == {"backend": "test-logit-flip", "prompt": 0, "step": 8 - (LENGTHS[0] - 1)}
    assert "token-flip" in out and "test-logit-flip leaves ort-cpu's tokens at step 3 of prompt 0" in out
    # that step, compared layer by layer: the planted change is an origin at the logits' MatMul
    assert "at step 3 of prompt 0 test-logit-flip has 1 origin(s), first logits (MatMul)" in out


@pytest.mark.slow
def test_batch_composition_counts_distinct_completions(
    lms: dict[str, Path], prompts: Path, plugins: None
) -> None:
    """A change planted only in batches: each prompt decodes alone like the reference, and differs
    in every batch at the step its position reaches 9; the engine without it stays at one completion."""
    r = xbackend.compare(
        lms["gpt2"],
        backends="ort-cpu,test-logit-flip",
        reference="ort-cpu",
        decode=STEPS,
        batch_invariance=2,
        inputs=str(prompts),
        probes="none",
        runs=1,
        runner_options=["test-logit-flip.position=9", "test-logit-flip.batched=true"],
    )
    assert r.decode is not None
    planted = r.decode.backend("test-logit-flip")
    assert planted.first_divergent_step is None  # alone, it is the reference
    for k, n in enumerate(LENGTHS):
        p = planted.prompts[k]
        assert p.compositions == 3  # alone, and in a batch of 2 twice
        assert p.distinct_completions in (2, 3)  # the two batches may go on apart after the flip
        # left-padded: the row's positions are its own; the flip is at position 9 in every batch
        assert p.first_batch_divergence == 9 - (n - 1)
    assert r.decode.batch_dependent == ("test-logit-flip",)
    assert r.decode.backend("ort-cpu").distinct_completions == 1
    # the JSON holds what a user needs to check a figure: the prompts as fed, each composition's tokens
    assert r.decode.prompts == tuple(tuple(int(x) for x in row) for row in _prompt_rows(prompts))
    p0 = planted.prompts[0]
    assert {c for c, _ in p0.batch_tokens} == {(0,), (0, 1), (2, 0)}
    assert dict(p0.batch_tokens)[(0,)] == p0.tokens
    js = json.loads(xbackend.to_json(r))["decode"]
    assert js["prompts"] == [list(p) for p in r.decode.prompts]
    assert js["backends"]["test-logit-flip"]["first_divergent_steps"] == [None, None, None]
    assert js["backends"]["test-logit-flip"]["prompts"][0]["batch_tokens"][0][0] in ([0], [0, 1], [2, 0])
    assert any(
        line.startswith("WARN: decode: test-logit-flip's completions depend on the batch")
        for line in r.verdict()
    )


def test_the_convention_is_read_from_the_names(lms: dict[str, Path]) -> None:
    kv = convention_of(load_model(lms["llama-kv"])[0])
    assert kv.cached and (kv.past_heads, kv.past_dim) == (2, 16) and len(kv.past) == 2
    assert kv.past[1] == (
        "past_key_values.1.key",
        "past_key_values.1.value",
        "present.1.key",
        "present.1.value",
    )
    plain = convention_of(load_model(lms["gpt2"])[0])
    assert not plain.cached and (plain.attention_mask, plain.position_ids) == (
        "attention_mask",
        "position_ids",
    )
    feeds = step_feeds(kv, np.array([5, 6, 7]))
    assert feeds["past_key_values.0.key"].shape == (1, 2, 0, 16)
    assert feeds["position_ids"].tolist() == [[0, 1, 2]]
    assert compositions(3, 2) == ((0,), (1,), (2,), (0, 1), (1, 2), (2, 0))


def test_a_model_that_is_not_a_causal_lm_is_refused(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "compare", str(models["mlp_layernorm"]), "--decode", "4", "--no-progress")
    assert code == 2
    one_line_error(err, "--decode needs an input named input_ids [batch, sequence]; see docs/decode.md")
    with pytest.raises(UsageError, match="--decode must be >= 0"):
        xbackend.CompareOptions.create(decode=-1)


@pytest.mark.slow
def test_decisions_find_a_planted_flip_and_its_margin(
    plugins: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """test-class-flip raises row 5's runner-up class past its top one by 0.25: that one decision
    of 8 flips, with the reference's margin there and a score difference of margin + 0.25; the
    float64 reference evaluator flips none; --fail-on decision-flip exits 21."""
    from xbackend.model.inputs import generate_feeds

    convnet = ROOT / "models" / "convnet.onnx"
    js = tmp_path / "r.json"
    code, out, _ = run(
        capsys,
        "compare", str(convnet), "--shape", "image=8,3,32,32",
        "--backends", "ort-cpu,test-class-flip,reference",
        "--reference", "ort-cpu", "--set", "test-class-flip.output=logits", "--set", "test-class-flip.row=5",
        "--decisions", "logits:1", "--fail-on", "decision-flip", "--probes", "none", "--runs", "1",
        "--json", str(js), "--no-progress",
    )  # fmt: skip
    assert code == 21, out
    spec, _ = load_model(convnet)
    feeds = generate_feeds(spec, 0, {"image": (8, 3, 32, 32)}, {}).arrays
    sess = ort.InferenceSession(str(convnet), providers=["CPUExecutionProvider"])
    logits = sess.run(None, dict(feeds))[0].astype(np.float64)
    top = np.sort(logits, axis=1)
    by = {d["backend"]: d for d in json.loads(js.read_text("utf-8"))["decisions"]}
    planted = by["test-class-flip"]
    assert (planted["decisions"], planted["agree"], planted["flipped"]) == (8, 7, 1)
    (flip,) = planted["flips"]
    assert flip["index"] == [5] and flip["reference_class"] == int(np.argmax(logits[5]))
    assert flip["backend_class"] == int(np.argsort(logits[5])[-2])
    assert flip["reference_margin"] == pytest.approx(top[5, -1] - top[5, -2], abs=1e-6)
    assert flip["score_difference"] == pytest.approx(flip["reference_margin"] + 0.25, abs=1e-5)
    assert planted["smallest_margin"] == pytest.approx(float(np.min(top[:, -1] - top[:, -2])), abs=1e-6)
    assert (by["reference"]["flipped"], by["reference"]["agree"]) == (0, 8)
    assert "decision-flip" in out and "test-class-flip makes 1 of 8 choice(s) at logits otherwise" in out
    # without --fail-on, a flipped decision is a finding (exit 1), as an origin is: here it is the
    # only one (no judgment asked for, a tolerance nothing passes)
    quiet = [
        "compare", str(convnet), "--shape", "image=8,3,32,32", "--reference", "ort-cpu", "--decisions",
        "logits:1", "--probes", "none", "--runs", "1", "--noise-samples", "0", "--max-ulp", "1e12",
        "--no-progress",
    ]  # fmt: skip
    plant = ["--set", "test-class-flip.output=logits", "--set", "test-class-flip.row=5"]
    code, out, _ = run(capsys, *quiet, *plant, "--backends", "ort-cpu,test-class-flip")
    assert code == 1 and "WARN: decisions: test-class-flip makes 1 of 8 choice(s) at logits" in out, out
    code, out, _ = run(capsys, *quiet, "--backends", "ort-cpu,reference")
    assert code == 0, out


def test_decisions_name_outputs_the_model_has(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        capsys, "compare", str(models["mlp_layernorm"]), "--decisions", "scores", "--no-progress"
    )
    assert code == 2
    one_line_error(
        err, "--decisions scores: the model has no output 'scores'; its outputs: y (or --decisions auto)"
    )


# Measured on this instruction set (AVX-512 with bf16, Zen 4): Inductor's CPU kernels for a batch
# of 3 sum prompt 0's logits in another order than for the prompt alone; ONNX Runtime's do not.
# Elsewhere the kernels chosen differ, and only the measurement's consistency is asserted.
BATCH_ISA = "sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16"


@pytest.mark.slow
def test_batch_composition_on_torch_compile(lms: dict[str, Path], tmp_path: Path) -> None:
    """Equal-length prompts (no padding) decoded alone and in batches of 3: torch-compile's logits
    move with the batch, onnxruntime's do not (here); every completion is counted."""
    from xbackend.host.environment import collect_environment

    rng = np.random.default_rng(3)
    npz = tmp_path / "equal.npz"
    np.savez(npz, input_ids=rng.integers(0, 512, (3, 8)).astype(np.int64))
    module = f"{TESTS / 'decoder_lm.py'}:gpt2_module"
    r = xbackend.compare(
        lms["gpt2"], backends="torch-compile,ort-cpu", reference="ort-cpu", decode=6, batch_invariance=3,
        inputs=str(npz), torch_module=module, probes="none", noise_samples=0, outputs_only=True,
    )  # fmt: skip
    assert r.decode is not None
    tc, oc = r.decode.backend("torch-compile"), r.decode.backend("ort-cpu")
    assert tc.ok and oc.ok, (tc.reason, oc.reason)
    for b in (tc, oc):
        assert [p.compositions for p in b.prompts] == [4, 4, 4]  # alone, and at each of 3 positions
        assert all(p.distinct_completions >= 1 for p in b.prompts)
    moved = max(p.batch_logit_difference for p in tc.prompts)
    if collect_environment()["cpu.isa"] == BATCH_ISA:
        assert moved > 0.0 and max(p.batch_logit_difference for p in oc.prompts) == 0.0
    else:
        assert moved >= 0.0


def test_a_batch_that_fails_keeps_the_prompts_alone() -> None:
    """The worker's loop on a stand-in engine that refuses batches of 2: every prompt alone is
    decoded, and the failed composition is named with its reason."""
    from xbackend.execution.decoding import Convention, DecodeTask, decode

    conv = Convention(attention_mask="attention_mask", position_ids="position_ids")

    def engine(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = feeds["input_ids"]
        if ids.shape[0] > 1:
            raise ValueError("Got invalid dimensions for input: input_ids")
        logits = np.zeros((1, ids.shape[1], 8), np.float32)
        logits[0, -1, (int(ids[0, -1]) + 1) % 8] = 1.0  # next token: the last one plus 1
        return {"logits": logits}

    task = DecodeTask(conv, 3, "", compositions(2, 2))
    rows, logits, seconds, failed = decode(engine, task, [np.array([1, 2]), np.array([5])])
    assert [(r.prompt, r.tokens) for r in rows] == [(0, (3, 4, 5)), (1, (6, 7, 0))]
    assert [m for r in rows for m in r.margins] == [1.0] * 6
    assert sorted(logits) == ["logits.0", "logits.1"] and len(seconds) == 6
    assert failed == [
        ("batch [0, 1]", "ValueError: Got invalid dimensions for input: input_ids"),
        ("batch [1, 0]", "ValueError: Got invalid dimensions for input: input_ids"),
    ]


def _decoded(margin: float, diff: float) -> object:
    from xbackend.results.decode import BackendDecode, DecodeResult, PromptDecode

    ref = BackendDecode(
        backend="ort-cpu", prompts=(PromptDecode(prompt=0, tokens=(1, 2), margins=(1.0, margin)),)
    )
    flip = PromptDecode(
        prompt=0, tokens=(1, 3), margins=(1.0, 0.1), first_divergent_step=1, margin_at_divergence=margin,
        logit_difference=diff,
    )  # fmt: skip
    return DecodeResult(
        steps=2, cached=False, reference="ort-cpu", batch=0, prompt_lengths=(4,),
        backends=(ref, BackendDecode(backend="b", prompts=(flip,))), layers_step=("b", 0, 1),
    )  # fmt: skip


def test_a_near_tie_is_a_difference_at_most_twice_the_margin() -> None:
    """docs/decode.md's rule: a logit difference about the size of the margin (at most twice it)
    flipped a near tie; 0.00823 against a margin of 0.000822 (10x) is no near tie, even where
    every node is within rounding."""
    from types import SimpleNamespace

    from xbackend.results.decode import flip_cause, near_tie

    assert near_tie(0.000822, 0.0015) and near_tie(0.0, 1e-6)
    assert not near_tie(0.000822, 0.00823) and not near_tie(None, 1.0)
    # a candidate's int8 logits moved by 9.3 across a margin of 7.41 (odds of 1650 to 1): no tie,
    # though the difference is within twice the margin
    assert not near_tie(7.41, 9.3) and near_tie(0.4, 0.7) and not near_tie(0.6, 0.7)
    explained = [SimpleNamespace(backend="b", status="ok", explained=True, origins=())]
    (found,) = flip_cause(_decoded(0.000822, 0.00823), explained)  # type: ignore[arg-type]
    line = found.line
    assert "no near tie" in line and "10x the reference's margin 0.000822" in line
    (found,) = flip_cause(_decoded(0.000822, 0.0012), explained)  # type: ignore[arg-type]
    assert found.line.endswith("rounding-sized differences flipped a near tie")


def test_without_the_reference_no_token_is_said_to_agree(lms: dict[str, Path], plugins: None) -> None:
    """The reference could not decode (an int8 model it cannot run): the others' tokens are held
    against nothing, a WARN that says why, never 'chose the reference's token at every step'."""
    r = xbackend.compare(
        lms["gpt2"], backends="ort-cpu,test-crash", reference="test-crash", decode=4, probes="none", runs=1,
    )  # fmt: skip
    assert r.decode is not None
    lines = [f.line for f in r.decode.findings()]
    assert not any("at every step" in line for line in lines)
    assert any(
        line.startswith(
            "WARN: decode: ort-cpu's tokens were not compared: the reference test-crash gave none"
        )
        for line in lines
    ), lines
