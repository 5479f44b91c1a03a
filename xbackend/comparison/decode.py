"""`--decode N`: greedy decoding of a causal language model on every backend, against the
reference and over batch compositions; the step to compare layer by layer.

Decoding runs in the backends' worker processes (xbackend.execution.decoding), each prompt alone
and, with --batch-invariance B, inside batches of B prompts. Nothing is exposed while decoding:
the per-layer comparison that follows is of one step, the first where a backend left the
reference's tokens (else the reference's closest call), fed as the whole sequence so far.
"""

from __future__ import annotations

import math
import re
import statistics
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from xbackend.errors import InputError, UsageError, first_line
from xbackend.execution.decoding import Convention, DecodeTask, prompt_key
from xbackend.execution.executor import Job, JobOutcome
from xbackend.execution.progress import ProgressSink
from xbackend.execution.protocol import RunStatus
from xbackend.files.npz import NpzError, read_npz
from xbackend.files.storage import ValueFile, save_values
from xbackend.files.userfile import user_file
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec
from xbackend.planning.context import PlannedBackend
from xbackend.planning.plan import executor_for
from xbackend.results import CompareOptions
from xbackend.results.decode import BackendDecode, DecodeResult, PromptDecode, first_difference

__all__ = [
    "DEFAULT_PROMPTS",
    "Against",
    "compositions",
    "convention_of",
    "decode_backends",
    "make_prompts",
    "step_feeds",
]

PROMPT_TOKENS = 1 << 24  # prompts x tokens: 16M token ids (128 MiB as int64) at most

DEFAULT_PROMPTS = (4, 16)  # prompts, tokens: without --shape input_ids=P,T
_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)")
_PRESENT = re.compile(r"present\.(\d+)\.(key|value)")
_HOW = "see docs/decode.md for the names --decode reads, and how to rename a model's"


def convention_of(spec: ModelSpec) -> Convention:
    """The model's decoding I/O, by the names optimum and torch.onnx exports use."""
    inputs = {t.name: t for t in spec.inputs}
    outputs = {output.name: output for output in spec.outputs}
    if "input_ids" not in inputs:
        raise UsageError(f"--decode needs an input named input_ids [batch, sequence]; {_HOW}")
    logits = "logits" if "logits" in outputs else ""
    if not logits:
        raise UsageError(f"--decode needs an output named logits [batch, sequence, vocabulary]; {_HOW}")
    ids = inputs["input_ids"]
    if ids.shape is not None and len(ids.shape) != 2:
        raise UsageError(f"--decode: input_ids must be [batch, sequence], it is {list(ids.shape)}; {_HOW}")
    past_in = {m.groups(): input_name for input_name in inputs if (m := _PAST.fullmatch(input_name))}
    past_out = {m.groups(): output for output in outputs if (m := _PRESENT.fullmatch(output))}
    if set(past_in) != set(past_out):
        raise UsageError(
            "--decode: the model's past_key_values.N.* inputs and present.N.* outputs do not pair up "
            f"({len(past_in)} inputs, {len(past_out)} outputs); {_HOW}"
        )
    layers = sorted({int(k) for k, _ in past_in})
    past = tuple(
        (
            past_in[(str(layer), "key")],
            past_in[(str(layer), "value")],
            past_out[(str(layer), "key")],
            past_out[(str(layer), "value")],
        )
        for layer in layers
    )
    heads = dim = 0
    dtype = "float32"
    if past:
        first = inputs[past[0][0]]
        shape = first.shape or ()
        if len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(shape[3], int):
            raise UsageError(
                f"--decode: {first.name} must be [batch, heads, past, head_dim] with heads and head_dim "
                f"fixed, it is {list(shape)}"
            )
        heads, dim, dtype = int(shape[1]), int(shape[3]), first.dtype
    known = {"input_ids", "attention_mask", "position_ids", *(n for p in past for n in p[:2])}
    other = sorted(set(inputs) - known)
    if other:
        raise UsageError(f"--decode cannot feed the model's input(s) {', '.join(other)}; {_HOW}")
    return Convention(
        input_ids="input_ids",
        logits=logits,
        attention_mask="attention_mask" if "attention_mask" in inputs else "",
        position_ids="position_ids" if "position_ids" in inputs else "",
        past=past,
        past_heads=heads,
        past_dim=dim,
        past_dtype=dtype,
        ids_dtype=ids.dtype,
        mask_dtype=inputs["attention_mask"].dtype if "attention_mask" in inputs else "int64",
    )


def _vocabulary(spec: ModelSpec, opts: CompareOptions) -> tuple[int, int]:
    given = [(lo, hi) for n, lo, hi in opts.ranges if n == "input_ids"]
    if given:
        return int(given[0][0]), int(given[0][1])
    rows = dict(spec.index_bounds).get("input_ids")
    logits = next(output for output in spec.outputs if output.name == "logits").shape or ()
    vocab = rows or (logits[-1] if logits and isinstance(logits[-1], int) else None)
    if not vocab:
        raise UsageError("--decode: the vocabulary size is not in the model; pass --range input_ids=0:VOCAB")
    return 0, int(vocab)


def make_prompts(spec: ModelSpec, opts: CompareOptions, conv: Convention) -> list[np.ndarray]:
    """The prompts: --inputs' input_ids rows (their attention_mask's ones), else generated from
    the seed, --shape input_ids=P,T giving their number and longest length. Lengths differ (by
    up to 3 tokens) where the model takes an attention mask and positions, so batches pad."""
    if opts.inputs:
        return _given_prompts(opts.inputs, conv)
    count, length = DEFAULT_PROMPTS
    shapes = dict(opts.shapes)
    if "input_ids" in shapes:
        if len(shapes["input_ids"]) != 2:
            raise UsageError("--decode: --shape input_ids=PROMPTS,TOKENS (two numbers)")
        count, length = shapes["input_ids"]
    count = max(count, opts.batch_invariance)
    if length < 1 or count < 1:
        raise UsageError(
            f"--decode: --shape input_ids needs at least 1 prompt of 1 token, got {count},{length}"
        )
    lo, hi = _vocabulary(spec, opts)
    rng = np.random.default_rng(opts.seed)
    varied = bool(conv.attention_mask and conv.position_ids)
    lengths = [max(1, length - (k * 3) % 4) if varied else length for k in range(count)]
    return [rng.integers(lo, hi, size=length).astype(conv.ids_dtype) for length in lengths]


def _given_prompts(path: str, conv: Convention) -> list[np.ndarray]:
    """--inputs PROMPTS.npz: input_ids [prompts, tokens], and attention_mask marking each row's
    tokens where rows are padded (either side)."""
    what = "--decode reads its prompts from an .npz holding input_ids [prompts, tokens] (and attention_mask)"
    if not path.endswith(".npz"):
        raise InputError(f"--inputs {path}: {what}")

    def check(name: str, shape: tuple[int, ...], dtype: np.dtype[np.generic]) -> None:
        """Before a byte is decoded: token ids and a mask, of a size prompts have."""
        if name in ("input_ids", "attention_mask") and math.prod(shape) > PROMPT_TOKENS:
            raise InputError(
                f"--inputs {path}: {name} declares {math.prod(shape)} tokens, more than "
                f"{PROMPT_TOKENS} prompts x tokens; {what}"
            )

    # the reader compare's --inputs uses: a regular file, headers judged before anything is read
    user_file(path, "--inputs", what)
    try:
        arrays = {
            key: value
            for key, value in read_npz(Path(path), check).items()
            if key in ("input_ids", "attention_mask")
        }
    except NpzError as error:
        raise InputError(f"--inputs {path} is not a readable .npz ({error}); {what}") from None
    except (OSError, zipfile.BadZipFile, RuntimeError, NotImplementedError) as error:
        raise InputError(f"--inputs {path} is not a readable .npz ({first_line(error)}); {what}") from None
    ids = arrays.get("input_ids")
    if ids is None or ids.ndim != 2 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise InputError(f"--inputs {path}: {what}")
    mask = arrays.get("attention_mask")
    if mask is not None and mask.shape != ids.shape:
        raise InputError(
            f"--inputs {path}: attention_mask is {list(mask.shape)}, input_ids {list(ids.shape)}"
        )
    keep = mask > 0 if mask is not None else np.ones(ids.shape, bool)
    rows = [ids[r][keep[r]].astype(conv.ids_dtype) for r in range(ids.shape[0])]
    if any(len(row) == 0 for row in rows):
        raise InputError(f"--inputs {path}: a prompt has no tokens (its attention_mask is all 0)")
    return rows


def compositions(prompts: int, batch: int) -> tuple[tuple[int, ...], ...]:
    """Each prompt alone, then with --batch-invariance B each rotation of the prompts taken B at
    a time: every prompt sits at every batch position once, beside other prompts each time."""
    out: list[tuple[int, ...]] = [(p,) for p in range(prompts)]
    if batch >= 2:
        out += [tuple((j + r) % prompts for r in range(batch)) for j in range(prompts)]
    return tuple(out)


def step_feeds(conv: Convention, sequence: np.ndarray) -> dict[str, np.ndarray]:
    """One step as the whole sequence so far (an empty cache): what the per-layer comparison
    feeds every backend."""
    n = len(sequence)
    out: dict[str, np.ndarray] = {conv.input_ids: sequence.astype(conv.ids_dtype)[None, :]}
    if conv.attention_mask:
        out[conv.attention_mask] = np.ones((1, n), dtype=conv.mask_dtype)
    if conv.position_ids:
        out[conv.position_ids] = np.arange(n, dtype=np.int64)[None, :]
    empty = np.zeros((1, conv.past_heads, 0, conv.past_dim), dtype=conv.past_dtype)
    out.update({name: empty for p in conv.past for name in p[:2]})
    return out


@dataclass(frozen=True)
class Against:
    """Another model's decoding the backends are held against (a candidate's original): its
    prompts, its reference's tokens and margins, and the logits file its worker wrote."""

    name: str  # what the candidate's tokens are held against, in its report: "the original"
    result: DecodeResult
    logits: Path

    @classmethod
    def of(cls, result: DecodeResult, work: Path) -> Against:
        """The original model's decoding, held against a candidate's (its logits in `work`)."""
        ref = result.reference
        return cls("the original", result, work / f"{ref}-decode" / "logits.xbv")


def decode_backends(
    spec: ModelSpec,
    opts: CompareOptions,
    planned: Sequence[PlannedBackend],
    work: Path,
    bar: ProgressSink,
    against: Against | None = None,
) -> tuple[DecodeResult, Feeds]:
    """Decode on every planned backend, compare with the reference (`against`: another model's,
    on its prompts), and the feeds of the step the per-layer comparison is of."""
    conv = convention_of(spec)
    if against is not None:
        prompts = [np.asarray(prompt, dtype=conv.ids_dtype) for prompt in against.result.prompts]
    else:
        prompts = make_prompts(spec, opts, conv)
    warnings: list[str] = []
    batch = opts.batch_invariance
    fixed = next(t.shape for t in spec.inputs if t.name == conv.input_ids)
    if batch >= 2 and fixed and isinstance(fixed[0], int) and fixed[0] < batch:
        warnings.append(
            f"no batch compositions: the model's {conv.input_ids} takes batches of {fixed[0]} only "
            "(export it with a dynamic batch axis); each prompt was decoded alone"
        )
        batch = 0
    comps = compositions(len(prompts), batch)
    path = work / "prompts.xbv"
    save_values(path, {prompt_key(index): prompt for index, prompt in enumerate(prompts)})
    task = DecodeTask(conv, opts.decode, str(path), comps)
    ex = executor_for(spec, work, opts.timeout, bar, planned)  # python=: the IR that engine reads
    jobs = {
        planned_backend.name: Job(
            f"{planned_backend.name}-decode",
            planned_backend.name,
            planned_backend.cls,
            planned_backend.variant(),
            path,
            (),
            "decode",
            decode=task,
        )
        for planned_backend in planned
        if planned_backend.cls is not None
    }
    bar.start(sum(job.steps for job in jobs.values()))
    try:
        done = {name: ex.run(job) for name, job in jobs.items()}
    finally:
        bar.stop()
    given = None
    held = None
    if against is not None:
        ref_b = next(
            (backend for backend in against.result.backends if backend.backend == against.result.reference),
            None,
        )
        held = ref_b if ref_b is not None and ref_b.ok and against.logits.is_file() else None
        given = (
            against.name,
            {prompt.prompt: (prompt.tokens, prompt.margins) for prompt in held.prompts} if held else None,
        )
    result = _analyze(opts, planned, done, work, prompts, given, against.logits if against else None)
    layers_step, feeds = _layers_feeds(result, prompts, conv, opts, held)
    warnings += [
        f"{name}: {what} failed: {why}"
        for name, value in done.items()
        if value.ok
        for what, why in value.result.phase_errors
    ]
    return replace(
        result, cached=conv.cached, batch=batch, layers_step=layers_step, warnings=tuple(warnings)
    ), feeds


def _logits(work: Path, job_outcome: JobOutcome) -> dict[str, np.ndarray]:
    """Each prompt's chosen-position logits, step by step (the worker wrote them in its job folder)."""
    return _read_logits(work / job_outcome.job.label / "logits.xbv")


def _read_logits(path: Path) -> dict[str, np.ndarray]:
    with ValueFile(str(path)) as value_file:
        return {key: np.asarray(value) for key, value in value_file.load_all().items()}


def _analyze(
    opts: CompareOptions,
    planned: Sequence[PlannedBackend],
    done: Mapping[str, JobOutcome],
    work: Path,
    prompts: Sequence[np.ndarray],
    given: tuple[str, dict[int, tuple[tuple[int, ...], tuple[float, ...]]] | None] | None = None,
    given_logits: Path | None = None,
) -> DecodeResult:
    if given is not None:  # held against another model's reference (None: it did not decode)
        ref, alone_given = given
        ref_ok = alone_given is not None
        ref_alone = alone_given or {}
        ref_logits = _read_logits(given_logits) if ref_ok and given_logits is not None else {}
    else:
        ref = opts.reference_name
        ref_out = done.get(ref)
        ref_ok = ref_out is not None and ref_out.ok
        ref_alone = _alone(ref_out) if ref_out is not None and ref_ok else {}
        ref_logits = _logits(work, ref_out) if ref_out is not None and ref_ok else {}
    backends = []
    for planned_backend in planned:
        job_outcome = done.get(planned_backend.name)
        if job_outcome is None or not job_outcome.ok:
            status: RunStatus
            if job_outcome is None:
                status, reason = "unavailable", planned_backend.unavailable
            else:
                status, reason = job_outcome.outcome.status, job_outcome.reason
            backends.append(BackendDecode(backend=planned_backend.name, status=status, reason=reason))
            continue
        alone = _alone(job_outcome)
        logits = _logits(work, job_outcome) if ref_ok else {}
        rows = job_outcome.result.decode_rows
        out = []
        for k in range(len(prompts)):
            tokens, margins = alone[k]
            step = first_difference(tokens, ref_alone[k][0]) if ref_ok else None
            margin = diff = None
            diffs: tuple[float, ...] = ()
            if ref_ok:
                mine_l, ref_l = logits[f"logits.{k}"], ref_logits[f"logits.{k}"]
                upto = len(tokens) if step is None else step + 1
                diffs = tuple(
                    float(np.max(np.abs(mine_l[s].astype(np.float64) - ref_l[s].astype(np.float64))))
                    for s in range(upto)
                )
            if step is not None:
                margin, diff = ref_alone[k][1][step], diffs[step]
            mine = [row for row in rows if row.prompt == k]
            seen = [row.tokens for row in mine]
            departs = [first_difference(t, tokens) for t in seen]
            out.append(
                PromptDecode(
                    prompt=k,
                    tokens=tokens,
                    margins=margins,
                    first_divergent_step=step,
                    margin_at_divergence=margin,
                    logit_difference=diff,
                    logit_differences=diffs,
                    compositions=len(seen),
                    distinct_completions=len(set(seen)),
                    first_batch_divergence=min(
                        (depart for depart in departs if depart is not None), default=None
                    ),
                    batch_logit_difference=max((row.moved for row in mine), default=0.0),
                    batch_tokens=tuple((_comp(job_outcome, row.composition), row.tokens) for row in mine),
                )
            )
        secs = job_outcome.result.decode_seconds
        backends.append(
            BackendDecode(
                backend=planned_backend.name,
                prompts=tuple(out),
                step_ms=statistics.median(secs) * 1e3 if secs and opts.shows_times else None,
            )
        )
    return DecodeResult(
        steps=opts.decode,
        cached=False,
        reference=ref,
        batch=opts.batch_invariance,
        prompt_lengths=tuple(len(prompt) for prompt in prompts),
        backends=tuple(backends),
        prompts=tuple(tuple(int(x) for x in prompt.reshape(-1)) for prompt in prompts),
    )


def _alone(job_outcome: JobOutcome) -> dict[int, tuple[tuple[int, ...], tuple[float, ...]]]:
    return {
        row.prompt: (row.tokens, row.margins)
        for row in job_outcome.result.decode_rows
        if len(_comp(job_outcome, row.composition)) == 1
    }


def _comp(job_outcome: JobOutcome, index: int) -> tuple[int, ...]:
    assert job_outcome.job.decode is not None
    return job_outcome.job.decode.compositions[index]


def _layers_feeds(
    result: DecodeResult,
    prompts: Sequence[np.ndarray],
    conv: Convention,
    opts: CompareOptions,
    held: BackendDecode | None = None,
) -> tuple[tuple[str, int, int], Feeds]:
    """The step the per-layer comparison is of: the first divergence, else the reference's
    smallest margin; fed as the prompt and the reference's tokens before that step."""
    diverged = [
        (d.first_divergent_step, d.prompt, backend.backend)
        for backend in result.backends
        if backend.ok and (d := backend.first_divergence) is not None and d.first_divergent_step is not None
    ]
    ref = held or next(
        (backend for backend in result.backends if backend.backend == result.reference and backend.ok), None
    )
    if diverged:
        step, prompt, who = min(diverged)
        why = f"where {who} first left {'the original' if held else 'the reference'}'s tokens"
    elif ref is not None and ref.prompts:
        margins = {
            (index, prompt.prompt): margin
            for prompt in ref.prompts
            for index, margin in enumerate(prompt.margins)
        }
        step, prompt = min(margins, key=lambda sp: (margins[sp], sp))
        who = result.reference
        why = "the reference's closest call (no backend left its tokens)"
    else:
        step, prompt, who = 0, 0, result.reference
        why = f"the prompt as given ({result.reference} did not decode)"
    tokens = ref.prompts[prompt].tokens if ref is not None and ref.prompts else ()
    sequence = np.concatenate([prompts[prompt], np.asarray(tokens[:step], dtype=prompts[prompt].dtype)])
    source = f"--decode: step {step} of prompt {prompt}, {why}"
    return (who, prompt, step), Feeds.from_arrays(step_feeds(conv, sequence), opts.seed, source)
