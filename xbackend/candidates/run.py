"""`--candidate`: each release candidate compared on its own backends, fed the original's inputs
(cast where its inputs are another dtype), its nodes judged at the precision they declare, its
tensors matched to the original's and measured against them, its numerical events named.

The candidate's comparison is the same comparison the original had (a run of its own in a folder
of this run, asked of the session's ComparesModels), so its builds, runs and explanation are
those of any model; this module matches the two and says what moved, and where."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from xbackend.candidates.advise import advise, causes, sensitivities
from xbackend.candidates.convert import converted, converter_of, weighted
from xbackend.candidates.match import match_graphs, precision_of
from xbackend.candidates.stretches import judge_stretches, stretches
from xbackend.candidates.values import decision_tensors, findings, measure
from xbackend.comparison.decisions import decisions_all
from xbackend.comparison.decode import Against
from xbackend.comparison.request import Ran, Role, RunRequest
from xbackend.errors import UsageError, XbackendError
from xbackend.export.gguf import file_type
from xbackend.files.owned import file_digest as file_sha256
from xbackend.files.storage import ValueFile
from xbackend.files.userfile import user_file
from xbackend.model.graphorder import sort_nodes
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec, load_model, load_proto
from xbackend.planning.builds import Builds
from xbackend.results import DEFAULT_BACKENDS, CompareOptions, Result
from xbackend.results.candidate_spec import QUICK_TABLE
from xbackend.results.candidates import Advice, CandidateResult, TensorMatch, Unmatched
from xbackend.results.decode import Decisions
from xbackend.results.explanation import GGUF_DECLINED, Explanation
from xbackend.runners.registry import runner_names, split_instance

__all__ = [
    "ComparesModels",
    "candidate_backends",
    "candidate_feeds",
    "candidate_options",
    "check_candidates",
    "quick_options",
    "run_candidates",
    "started_ahead",
]

_JUDGES = ("reference", "oracle")  # the original's judges: a candidate runs on the engines that ship it
LLAMA_CPP = "llama.cpp"  # the backend a GGUF candidate runs on


class ComparesModels(Protocol):
    """Who runs a candidate's comparisons (xbackend.candidates.session.CandidateRuns)."""

    def run(self, request: RunRequest) -> Ran:
        """Compare the model `request` names; what ran (its result and the work folder's runs)."""
        ...


def _candidate_run(
    model: str,
    options: CompareOptions,
    work: Path,
    feeds: Feeds | None = None,
    against: Against | None = None,
) -> RunRequest:
    """A candidate's comparison (or the original's at a candidate's step): its tensors kept."""
    return RunRequest(model, options, work, role=Role.CANDIDATE, feeds=feeds, against=against)


def candidate_backends(opts: CompareOptions, given: Sequence[str]) -> tuple[str, ...]:
    """The candidate's backends: those given, else the original's engines (not its judges), else
    ort-cpu."""
    if given:
        return tuple(given)
    return tuple(backend for backend in opts.backends if backend not in _JUDGES) or ("ort-cpu",)


def candidate_options(opts: CompareOptions, backends: Sequence[str]) -> CompareOptions:
    """The original's options for a candidate: its backends (the first its reference), fed the
    original's inputs, no captures loaded, saved or held against a baseline, no gate of its own."""
    chosen = tuple(backends)
    return replace(
        opts,
        backends=chosen,
        reference=chosen[0],
        runner_options=tuple(option for option in opts.runner_options if option[0] in chosen),
        probes=("batch",) if opts.batch_invariance else ("none",),
        loads=(),
        baseline=None,
        save_captures=None,
        fail_on=(),
        candidates=(),
        inputs=None,
        decisions=(),
        timed_runs=0,
    )


def quick_options(opts: CompareOptions) -> tuple[CompareOptions, str] | None:
    """The quick table: --candidate with --probes none and --runs 1, nothing decoded, decided,
    advised, loaded or held against a baseline. Each model runs one build, every tensor exposed;
    with the default backends the original runs on ort-cpu alone (not the reference) and, unless
    --noise-samples asks, neither model is explained against float64 (backends named, judges
    among them, run and explain as asked): the per-tensor SQNR, the events and the candidate's
    stretches at its declared precision stay. The options it runs with, and the NOTE that says
    what was left out; None where not quick."""
    if not (opts.candidates and opts.probes is not None and set(opts.probes) == {"none"}):
        return None
    busy = opts.decode or opts.decisions or opts.advise or opts.loads or opts.baseline
    if opts.runs != 1 or opts.builds != 1 or busy or opts.timed_runs or opts.batch_invariance:
        return None
    named = opts.backends != DEFAULT_BACKENDS  # backends the user named all run, judges too
    engines = (
        opts.backends if named else tuple(backend for backend in opts.backends if backend not in _JUDGES)
    )
    dropped = [backend for backend in opts.backends if backend not in engines]
    judged = any(engine in _JUDGES for engine in engines)
    noise = opts.noise_samples if opts.noise_samples is not None or judged else 0
    quick = replace(
        opts,
        backends=engines,
        reference=engines[0] if opts.reference not in engines else opts.reference,
        runner_options=tuple(option for option in opts.runner_options if option[0] in engines),
        noise_samples=noise,
    )
    skipped = [f"the original's {' and '.join(dropped)} did not run"] if dropped else []
    skipped += [] if noise != 0 else ["no tensor was explained against float64 (no origins)"]
    skipped += [
        "each model ran one build, every tensor exposed, its outputs from it (no plain build: for a "
        "QDQ model the engine's fused integer kernels did not run, as with qdq_loss_debug)"
    ]
    note = (
        QUICK_TABLE
        + "; ".join(skipped)
        + "; the SQNR per tensor, the numerical events and the candidate's stretches at its declared "
        "precision are measured as always; drop --runs 1 for the full comparison"
    )
    return quick, note


def started_ahead(opts: CompareOptions, work: Path, feeds: Feeds) -> list[RunRequest]:
    """Each candidate's own comparison as run_candidates asks for it without --decode, the model
    as read: started ahead, beside the original's, it is the same run."""
    out = []
    for k, (path, given) in enumerate(opts.candidates):
        spec, proto = load_model(path)
        cfeeds, _ = candidate_feeds(feeds, spec)
        copts = candidate_options(opts, candidate_backends(opts, given))
        out.append(replace(_candidate_run(path, copts, _folder(work, k), cfeeds), read=(spec, proto)))
    return out


def _folder(work: Path, k: int) -> Path:
    return work / f"candidate-{k}"


def candidate_feeds(feeds: Feeds, spec: ModelSpec) -> tuple[Feeds, list[str]]:
    """The original's feeds by name, each cast to the dtype the candidate's input declares; and
    what was cast or left out, in words."""
    arrays = dict(feeds.arrays)
    notes = []
    out: dict[str, object] = {}
    for t in spec.inputs:
        if t.name not in arrays:
            raise XbackendError(
                f"the candidate takes an input {t.name!r} the original does not "
                f"(the original's: {', '.join(sorted(arrays)) or 'none'}); rename it to match"
            )
        array = arrays[t.name]
        if isinstance(array, np.ndarray) and t.dtype and str(array.dtype) != t.dtype:
            out[t.name] = array.astype(t.dtype)
            notes.append(f"{t.name} cast from {array.dtype} to {t.dtype}")
        else:
            out[t.name] = array
    extra = sorted(set(arrays) - set(out))
    if extra:
        notes.append(f"the original's input(s) {', '.join(extra)} are not the candidate's: not fed")
    return Feeds.from_arrays(out, feeds.seed, feeds.source, feeds.ranges, feeds.made), notes


def check_candidates(opts: CompareOptions) -> None:
    """Before anything runs: each --candidate a regular file, each backend it names a known one (a
    typo is a usage error, exit 2, not a comparison that ends in a WARN)."""
    known = set(runner_names())
    for path, backends in opts.candidates:
        user_file(
            path, "--candidate", "give the candidate's model file: --candidate CANDIDATE.onnx[@BACKEND,...]"
        )
        for backend in backends:
            if split_instance(backend)[0] not in known:
                raise UsageError(
                    f"--candidate {path}@{backend}: unknown backend {backend!r}; known backends: "
                    f"{', '.join(sorted(known))}"
                )


def run_candidates(
    original: Ran, opts: CompareOptions, work: Path, runs: ComparesModels
) -> tuple[CandidateResult, ...]:
    """Each --candidate, compared with the original; one that cannot run is said, never fatal."""
    out = []
    for k, (path, given) in enumerate(opts.candidates):
        try:
            out.append(_one(original, opts, path, given, work, k, runs))
        except XbackendError as error:
            out.append(
                CandidateResult(path=path, sha256="", precision="", status="failed", reason=str(error))
            )
        except Exception as error:  # a fault of ours in one candidate: said, the comparison stands
            why = (
                f"its analysis failed: {type(error).__name__}: {error} (an xbackend fault: please report it)"
            )
            out.append(CandidateResult(path=path, sha256="", precision="", status="failed", reason=why))
    return tuple(out)


def _one(
    original: Ran,
    opts: CompareOptions,
    path: str,
    given: Sequence[str],
    work: Path,
    k: int,
    runs: ComparesModels,
) -> CandidateResult:
    folder = _folder(work, k)
    gguf = is_gguf(path)
    if gguf:  # the original's graph says what is fed; llama.cpp computes from the file
        kind = file_type(path)  # not a GGUF file: one line, this candidate only
        source = str(original.result.model.path)
        spec = original.result.model
        backends = gguf_backends(given)
        copts = _with_gguf(candidate_options(opts, backends), path)
    else:
        source = path
        spec, _ = load_model(path)  # a corrupt or unsupported file: one line, this candidate only
        backends = candidate_backends(opts, given)
        copts = candidate_options(opts, backends)
    ref = original.result.reference_used
    vs = Against.of(original.result.decode, work) if original.result.decode is not None else None
    obuild = original.builds.get(ref)
    if vs is None:
        feeds, notes = candidate_feeds(original.feeds, spec)
        ran = runs.run(_candidate_run(source, copts, folder, feeds))
    else:  # decoded against the original's tokens, compared layer by layer where it first left them
        ran = runs.run(_candidate_run(source, copts, folder, against=vs))
        feeds, notes = (
            ran.feeds,
            [f"compared layer by layer at {ran.feeds.source.removeprefix('--decode: ')}"],
        )
        back, _ = candidate_feeds(ran.feeds, original.result.model)  # the original's values there
        step = replace(candidate_options(opts, (ref,)), noise_samples=0, decode=0)
        at_step = _candidate_run(original.result.model.path, step, work / f"candidate-{k}-original", back)
        obuild = runs.run(at_step).builds.get(ref)
    cres = ran.result
    held = f"original:{ref}"  # the original's reference, beside the candidate's builds
    decided = (
        decisions_all(spec, opts.decisions, {**ran.builds, held: obuild}, cres.backends, held)
        if opts.decisions and obuild is not None
        else ()
    )
    graph = _graph(source)
    precision = f"{kind or 'unknown type'} (GGUF)" if gguf else precision_of(graph)
    base = CandidateResult(
        path=path,
        sha256=file_sha256(Path(path)) if gguf else spec.sha256,
        precision=precision,
        backends=cres.backends,
        explanation=Explanation("unavailable", GGUF_DECLINED) if gguf else cres.explanation,
        probes=tuple(probe for probe in cres.probes if probe.name != "builds"),  # one build: nothing to vary
        decode=cres.decode,
        decisions=decided,
        notes=tuple(notes),
    )
    mine = next((backend.name for backend in cres.backends if backend.ok), "")
    if not mine:
        why = "; ".join(f"{backend.name} {backend.status}: {backend.reason}" for backend in cres.backends)
        hint = _CAST_BUG if _CAST_TYPE.search(why) else ""
        return replace(base, status="failed", reason=f"no backend of the candidate ran ({why}){hint}")
    ocap, ccap = _layers(obuild), _layers(ran.builds[mine])
    if ocap is None or ccap is None:
        who = f"the original's {ref}" if ocap is None else f"the candidate's {mine}"
        return replace(base, status="failed", reason=f"{who} has no per-layer capture", compared_on=mine)
    ograph = _graph(original.result.model.path)
    pairs, unmatched = match_graphs(ograph, graph)
    if gguf:  # the same graph: a tensor is matched where llama.cpp's graph holds it
        with ValueFile(ccap) as c:
            kept = set(c.tensors())
        hidden = dict(next(backend.not_exposed for backend in cres.backends if backend.name == mine))
        unmatched += [
            Unmatched(original=pair.original, reason=hidden.get(pair.original, "not in llama.cpp's graph"))
            for pair in pairs
            if pair.candidate not in kept
        ]
        pairs = [pair for pair in pairs if pair.candidate in kept]
    target = "tokens" if vs is not None else "decisions"  # what the answers are
    with ValueFile(ocap) as o, ValueFile(ccap) as c:
        matches = measure(pairs, o, c)
        events = findings(graph, c, feeds.arrays, o)
        # an inf the original holds as a sentinel (float32's limit, a mask's fill) is no overflow
        sentinel = {
            match.candidate
            for match in matches
            if match.status == "ok" and not match.nonfinite and match.how != "dequantized"
        }
        events = [event for event in events if not (event.kind == "overflow" and event.tensor in sentinel)]
        found = [] if gguf else stretches(ograph, graph, pairs)  # a GGUF declares no arithmetic
        crossed, judged = judge_stretches(
            found, graph, Path(source).resolve().parent, c, feeds.arrays, spec.opset() or 1, _working(c)
        )
        opath = Path(original.result.model.path)
        scores = (
            sensitivities(
                ograph, opath.resolve().parent, pairs, c, o, feeds.arrays, original.result.model.opset() or 1
            )
            if opts.advise
            else []
        )
        events += decision_tensors(graph, _margins(cres, decided), o, events, target)
    base = replace(base, stretch_origins=tuple(crossed), stretches_judged=judged, findings=tuple(events))
    flips = (
        cres.decode.token_flips if cres.decode is not None else tuple(d.backend for d in decided if d.flipped)
    )
    if opts.advise and gguf:
        why = "a GGUF file's types are llama.cpp's quantizer's (one per file): no keep-list to print"
        base = replace(base, advice=Advice(status="not-found", reason=why, target=target))
    elif opts.advise and not flips:
        why = f"the candidate's {target} already match the original's: nothing to keep in float32"
        base = replace(base, advice=Advice(status="ok", reason=why, target=target))
    elif opts.advise:
        confirm = _confirmer(original, opts, backends, work / f"candidate-{k}-advise", vs, obuild, runs)
        conv = converter_of(graph, Path(path).resolve().parent, ograph)
        changed = converted(conv, ograph, graph) if conv is not None else ()
        ours = set(changed)
        mine_scores = [score for score in scores if score.node in ours]
        said = [
            finding
            for finding in base.findings
            if finding in base.events or finding.kind == "decision-tensor"
        ]
        clipping = [finding.node for finding in base.findings if finding.kind == "saturation"]
        named = causes(graph, said, mine_scores, changed, clipping)
        advice = advise(
            conv,
            changed,
            mine_scores,
            named,
            (opath, Path(path)),
            work / f"candidate-{k}",
            confirm,
            target,
            opts.advise_budget,
            {node.name: node.op_type for node in ograph.node},
            weighted(ograph),
        )
        base = replace(base, sensitivities=tuple(mine_scores[:_SHOWN_SCORES]), advice=advice)
    departure, why = _departure(matches, graph, base)
    return replace(
        base,
        compared_on=mine,
        original_on=ref,
        matches=tuple(matches),
        unmatched=tuple(unmatched),
        departure=departure,
        departure_why=why,
    )


def is_gguf(path: str) -> bool:
    """Whether `path` names a GGUF file (by its suffix)."""
    return Path(path).suffix.lower() == ".gguf"


def gguf_backends(given: Sequence[str]) -> tuple[str, ...]:
    """A GGUF candidate's backends: those given (each a llama.cpp), else llama.cpp."""
    for b in given:
        if split_instance(b)[0] != LLAMA_CPP:
            raise UsageError(f"a GGUF candidate runs on llama.cpp, not {b}: --candidate FILE.gguf@llama.cpp")
    return tuple(given) or (LLAMA_CPP,)


def _with_gguf(copts: CompareOptions, path: str) -> CompareOptions:
    """The candidate's options: each backend reads the candidate's GGUF file, judged by nothing."""
    gguf = str(Path(path).resolve())
    kept = tuple(option for option in copts.runner_options if option[1] != "gguf")
    return replace(
        copts,
        runner_options=(*kept, *((backend, "gguf", gguf) for backend in copts.backends)),
        noise_samples=0,
    )


# onnxconverter-common 1.15+ marks a Cast(to=float)'s output float16 (its issue #320)
_CAST_TYPE = re.compile(
    r"Type \(tensor\(float16\)\) of output arg \(.*\) of node \(.*Cast.*\) does not match"
)
_CAST_BUG = (
    "; a Cast that writes float16 where it casts to float is onnxconverter-common's float16 bug "
    "(microsoft/onnxconverter-common#320): convert with onnxruntime.transformers.float16."
    "convert_float_to_float16 instead"
)
_SHOWN_SCORES = 20  # the most sensitive nodes kept in the result


def _confirmer(
    original: Ran,
    opts: CompareOptions,
    backends: Sequence[str],
    folder: Path,
    vs: Against | None,
    obuild: Builds | None,
    runs: ComparesModels,
) -> Callable[[Path], tuple[bool, str, tuple[int, int]]]:
    """A run of a re-converted candidate, light (its outputs, one run, no explanation): whether
    its tokens (or decisions) match the original's, and what differed."""
    light = replace(
        candidate_options(opts, backends), noise_samples=0, tensors="outputs", outputs_only=True, runs=1
    )
    tries = iter(range(1_000))

    def confirm(path: Path) -> tuple[bool, str, tuple[int, int]]:
        where = folder / f"try-{next(tries)}"
        spec, _ = load_model(path)
        if vs is not None:
            ran = runs.run(_candidate_run(str(path), light, where, against=vs))
            d = ran.result.decode
            if d is None or not all(backend.ok for backend in d.backends):
                why = "; ".join(f"{b.backend} {b.status}: {b.reason}" for b in (d.backends if d else ()))
                return False, why, (0, 0)
            same = [
                prompt.first_divergent_step is None for backend in d.backends for prompt in backend.prompts
            ]
            return not d.token_flips, "; ".join(d.flips()), (sum(same), len(same))
        feeds, _ = candidate_feeds(original.feeds, spec)
        ran = runs.run(_candidate_run(str(path), light, where, feeds))
        held = f"original:{original.result.reference_used}"
        if obuild is None:
            return False, "the original's outputs are not on disk", (0, 0)
        decided = decisions_all(spec, opts.decisions, {**ran.builds, held: obuild}, ran.result.backends, held)
        flipped = [
            f"{decisions.backend} flips {decisions.flipped} of {decisions.decisions} at {decisions.output}"
            for decisions in decided
            if decisions.flipped
        ]
        failed = [f"{d.backend}: {d.reason}" for d in decided if d.status != "ok"]
        answers = (sum(decisions.agree for decisions in decided), sum(d.decisions for d in decided))
        return not flipped and not failed and bool(decided), "; ".join(flipped + failed), answers

    return confirm


def _margins(result: Result, decided: Sequence[Decisions]) -> dict[str, float | None]:
    """Each output the answers are read from, with the original's smallest margin where the
    candidate's answers left the original's (None where none did)."""
    if result.decode is not None:
        at = [
            prompt.margin_at_divergence
            for backend in result.decode.backends
            if backend.ok
            for prompt in backend.prompts
            if prompt.first_divergent_step is not None and prompt.margin_at_divergence is not None
        ]
        return {"logits": min(at) if at else None}
    out: dict[str, float | None] = {}
    for decisions in decided:
        m = [flip.reference_margin for flip in decisions.flips]
        was = out.get(decisions.output)
        out[decisions.output] = min([*m, *([was] if was is not None else [])]) if m else was
    return out


def _graph(path: str) -> onnx.GraphProto:
    """A model's graph in topological order, its external weights left on disk (read when a
    judgment needs one, from inside the model's folder)."""
    proto = load_proto(path, load_external=False)
    sort_nodes(proto.graph)
    return proto.graph


def _working(values: ValueFile) -> str:
    """The float type most of the candidate's tensors hold (float16 for a float16 conversion)."""
    kinds = Counter(d for d, _ in values.tensors().values() if d in ("float16", "bfloat16", "float32"))
    return kinds.most_common(1)[0][0] if kinds else "float32"


def _layers(builds: Builds | None) -> str | None:
    if builds is None or not builds.ok or builds.first.layers is None:
        return None
    return str(builds.first.layers.capture)


def _departure(
    matches: Sequence[TensorMatch], graph: onnx.GraphProto, candidate: CandidateResult
) -> tuple[str, str]:
    """The first matched tensor, in the original's order, that the candidate's origins reach (or
    that turned inf or NaN): where it leaves the original by more than its precision explains."""
    origins = {o.tensor: (b, o) for b, o in candidate.origins}
    reached = _below(graph, set(origins))
    crossed = {origin.tensor: origin for origin in candidate.stretch_origins}
    events = {event.tensor: event for event in candidate.events}
    for m in sorted(matches, key=lambda m: m.depth):
        numerical_event = events.get(m.candidate) or (events.get(m.original) if m.how == "name" else None)
        if numerical_event is not None:
            return m.original, f"{numerical_event.kind} at {numerical_event.node}: {numerical_event.detail}"
        if m.original in crossed and m.how != "dequantized":
            o = crossed[m.original]
            return (
                m.original,
                f"the candidate's stretch for {o.op_type} is past its declared precision ({o.detail})",
            )
        if m.nonfinite:
            return m.original, f"{m.nonfinite} element(s) inf or NaN where the original is finite"
        if m.candidate in reached:
            src = reached[m.candidate]
            b, o = origins[src]
            return m.original, (
                f"below the origin {o.tensor} ({o.op_type}) on {b}, past what its declared precision allows"
                if src != m.candidate
                else f"an origin ({o.op_type}) on {b}, past what its declared precision allows"
            )
    return "", ""


def _below(graph: onnx.GraphProto, starts: set[str]) -> dict[str, str]:
    """Each tensor at or below `starts`, with the first start above it (graph order)."""
    out = {start: start for start in starts}
    for node in graph.node:
        src = next((out[input_name] for input_name in node.input if input_name in out), None)
        if src is not None:
            for output_name in node.output:
                out.setdefault(output_name, src)
    return out
