"""Orchestration: load, feed, run every backend in isolation, compare captures, run probes.

Never imports a backend: runners are found by name and run in worker processes. Never
names a probe: it runs those the registry selects. Captures are compared one value at a
time from disk. Each step is a module of this package; this one puts them in order.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from xbackend.candidates.run import Ran, candidate_runs, check_candidates, quick_options, run_candidates
from xbackend.compare.builds import Builds, run_builds
from xbackend.compare.cross import against, cross_all, effective_reference, pairs
from xbackend.compare.decisions import decision_outputs, decisions_all
from xbackend.compare.decode import Against, decode_backends
from xbackend.compare.drift import baseline_drifts
from xbackend.compare.memory import (
    explanation_room,
    measure_unsized,
    memory_plan,
    side_by_side,
    sizing_note,
    window_note,
)
from xbackend.compare.plan import (
    executor_for,
    feeds_for,
    feeds_info,
    load_captures,
    main_jobs,
    plan_backend,
    preflight,
    with_expected,
)
from xbackend.compare.probing import analyze_probe, run_followups, run_probe_jobs
from xbackend.compare.save_captures import save_captures
from xbackend.compare.summary import summarize_backend
from xbackend.compare.tolerances import attach
from xbackend.errors import UsageError, XbackendError
from xbackend.execution.executor import Job, JobOutcome
from xbackend.execution.isolation import NEARLY_FULL, drop_spares, prestart
from xbackend.execution.progress import NullProgress, ProgressSink
from xbackend.files.runfolders import run_temp_folder
from xbackend.host.environment import collect_environment
from xbackend.judge.conditioning import far_from_float64
from xbackend.judge.explain_jobs import explain
from xbackend.model.extdata import write_rewritten
from xbackend.model.footprint import available_memory
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec, load_model
from xbackend.model.selection import with_selection
from xbackend.probes.base import PlannedBackend, Probe, ProbeContext
from xbackend.probes.registry import PROBES, select_probes
from xbackend.results import EXPECTED, BackendResult, CompareOptions, FailedProbe, ProbeResult, Result
from xbackend.results.capture_record import LoadedCapture
from xbackend.results.comparisons import CrossBackendResult, Drift, PairResult
from xbackend.results.explanation import DECLINED, NOT_MEASURED, QUICK_DECLINED, Explanation
from xbackend.runners.registry import runner_target

__all__ = ["ORACLE", "compare", "compare_with_options"]

ORACLE = "oracle"


def compare(model: str | os.PathLike[str], progress: ProgressSink | None = None, **options: Any) -> Result:
    """Compare `model` across backends; keyword options are CompareOptions fields.

    Example: ``xbackend.compare("model.onnx", backends=["ort-cpu", "reference"], runs=5)``.
    """
    return compare_with_options(model, CompareOptions.create(**options), progress)


def compare_with_options(
    model: str | os.PathLike[str],
    opts: CompareOptions,
    progress: ProgressSink | None = None,
    capture_to: str | os.PathLike[str] | None = None,
    judge_alone: bool = False,
) -> Result:
    """`capture_to`: write the first backend's portable capture to this folder (xbackend capture);
    `judge_alone`: a backend that runs alone is judged against float64 as a reference is (a
    sweep's job: the fleet's comparison of captures keeps its judgment)."""
    check_candidates(opts)  # a missing candidate or a backend typo: exit 2 before anything runs
    quick = quick_options(opts)
    if quick is not None:
        opts = quick[0]
    with (
        run_folder() as tmp,
        contextlib.ExitStack() as stack,
        ThreadPoolExecutor(1, thread_name_prefix="xbackend-candidate") as pool,
    ):
        stack.callback(drop_spares)  # the spare workers no batch took (the quick table's)
        work = Path(tmp)
        if _nearly_full(work):  # before any worker starts: one line, not a failure per backend
            raise UsageError(
                f"no space left on the disk that holds {work.parent} (set TMPDIR to a folder on a "
                "larger disk)"
            )
        given: Feeds | None = None
        ahead: _Ahead = {}
        loaded = None
        if quick is not None and capture_to is None and not judge_alone:
            given, ahead, loaded = _ahead(model, opts, work, pool)
        ran = _compare_in(
            work,
            model,
            opts,
            progress,
            capture_to,
            given,
            keep_layers=bool(opts.candidates),
            judge_alone=judge_alone,
            quick=quick is not None,
            plain=quick is None,
            read=loaded,
        )
        del loaded  # the original's proto goes once it is planned
        if not opts.candidates:
            return ran.result

        def again(
            path: str, copts: CompareOptions, feeds: Feeds | None, folder: Path, vs: Against | None
        ) -> Ran:
            early = ahead.pop((path, folder), None)
            if early is not None:
                started, result = early
                if vs is None and feeds is not None and started == (copts, feeds.sha256):
                    return result.result()
                result.exception()  # another run than the one asked for: finished, then set aside
            folder.mkdir(parents=True, exist_ok=True)
            fast = quick is not None
            return _compare_in(
                folder,
                path,
                copts,
                progress,
                None,
                feeds,
                keep_layers=True,
                against=vs,
                quick=fast,
                plain=not fast,
            )

        result = replace(ran.result, candidates=run_candidates(ran, opts, work, again))
        if quick is not None:  # what it left out, said as the quick table's, not as a flag's
            said = tuple(
                replace(c, explanation=replace(c.explanation, reason=QUICK_DECLINED))
                if c.explanation.reason == DECLINED
                else c
                for c in result.candidates
            )
            result = replace(result, notes=(*result.notes, quick[1]), candidates=said)
        return result


_Ahead = dict[tuple[str, Path], tuple[tuple[CompareOptions, str], "Future[Ran]"]]


def _ahead(
    model: str | os.PathLike[str], opts: CompareOptions, work: Path, pool: ThreadPoolExecutor
) -> tuple[Feeds | None, _Ahead, tuple[ModelSpec, onnx.ModelProto] | None]:
    """The quick table's candidates started beside the original (each its own worker), fed the
    original's feeds, made here once; where the two models do not fit in memory side by side,
    or anything about them is amiss (said by the run that follows), nothing is started."""
    _prestart(opts, work)
    try:
        spec, proto = load_model(model)
        feeds, expected = feeds_for(with_selection(spec, opts.tensors), opts, ())
        runs = candidate_runs(opts, work, feeds)
        sizes = spec.weight_bytes + sum(r[4][0].weight_bytes for r in runs)
    except Exception:
        return None, {}, None
    room = available_memory()
    if expected is not None or room is None or 8 * sizes > room:
        return None, {}, None
    out: _Ahead = {}
    for path, copts, cfeeds, folder, loaded in runs:
        folder.mkdir(parents=True, exist_ok=True)
        _prestart(copts, folder)
        job = pool.submit(
            _compare_in,
            folder,
            path,
            copts,
            None,
            None,
            cfeeds,
            keep_layers=True,
            quick=True,
            plain=False,
            read=loaded,
        )
        out[(path, folder)] = ((copts, cfeeds.sha256), job)
    return feeds, out, (spec, proto)


def _prestart(opts: CompareOptions, work: Path) -> None:
    """A worker for each engine of `opts` started now, for the first batch under `work`: its
    interpreter and engine load while this process reads the models and plans."""
    for name in opts.backends:
        try:
            p = plan_backend(name, opts, work, None)
        except XbackendError:  # said by the run that follows
            continue
        if p.cls is not None and p.interpreter is None:
            prestart(p.cls.process_env(p.cls.resolve_options(dict(p.variant()))), runner_target(name), work)


# Past this many nodes a layer-by-layer comparison is refused in seconds: ONNX Runtime's builds
# grow faster than linearly in the tensors they expose and the inputs a severed graph takes
# (measured on a 2-core EPYC: every tensor of a 100,000-node chain exposed, 35 s to build
# against 0.44 s at 10,000; a severed graph of 20,000 inputs, 104 s against 14 s at 10,000).
LAYER_NODE_LIMIT = 25_000


def _check_size(path: str, nodes: int, opts: CompareOptions) -> None:
    if nodes > LAYER_NODE_LIMIT and not opts.outputs_only:
        raise UsageError(
            f"{path} has {nodes:,} nodes, more than the {LAYER_NODE_LIMIT:,} xbackend compares layer by "
            "layer (the engines' builds with every tensor exposed grow faster than linearly past that); "
            f"compare its graph outputs with `xbackend compare {shlex.quote(path)} --outputs-only` (36 s "
            "for 100,000 nodes on a 2-core machine; capture takes --outputs-only too)"
        )


def _compare_in(
    work: Path,
    model: str | os.PathLike[str],
    opts: CompareOptions,
    progress: ProgressSink | None,
    capture_to: str | os.PathLike[str] | None,
    given: Feeds | None = None,
    keep_layers: bool = False,
    against: Against | None = None,
    judge_alone: bool = False,
    quick: bool = False,
    plain: bool = True,
    read: tuple[ModelSpec, onnx.ModelProto] | None = None,
) -> Ran:
    """One model compared in the run folder `work` (`given`: its feeds, else made or read as
    the options say; `keep_layers`: every backend's tensors stay on disk after, for a candidate's
    comparison; `against`: with --decode, the decoding its tokens are held against; `quick`: the
    quick table's, its memory sized no further than the budget asks; `plain` False: its engines'
    outputs come from the build that exposes every tensor, no plain build of their own; `read`:
    the model as already read from `model`)."""
    wanted = select_probes(opts.probes, opts.batch_invariance)  # unknown names: UsageError, first
    spec, proto = read or load_model(model)
    read = None  # the proto is let go below, after planning
    _check_size(spec.path, len(proto.graph.node), opts)
    spec = with_selection(spec, opts.tensors)
    decision_outputs(spec, opts.decisions)  # a name the model lacks: UsageError before anything runs
    loaded = load_captures(spec, opts)
    # --decode: the feeds are a decoding step's, known once every backend has decoded
    feeds: Feeds | None
    if given is not None:
        feeds, expected = given, None
    else:
        feeds, expected = feeds_for(spec, opts, loaded) if not opts.decode else (None, None)
    opts = with_expected(opts, expected)
    shipped_path = spec.path
    if spec.unsorted:  # every engine and judge reads the same graph, its nodes in order
        sorted_path = work / "sorted" / Path(spec.path).name
        write_rewritten(proto, spec.path, sorted_path)
        spec = replace(spec, path=str(sorted_path))
    planned = [plan_backend(name, opts, work, expected) for name in opts.backends]
    planned, notes = preflight(spec, proto, planned)
    decoded = None
    if feeds is None:  # a candidate's (`against`): its tokens against its original's
        decoded, feeds = decode_backends(spec, opts, planned, work, progress or NullProgress(), against)
    memory = memory_plan(spec, proto, feeds, opts, quick)
    del proto
    feeds_path = work / "feeds.xbv"
    feeds.save(feeds_path)
    memory = measure_unsized(memory, spec, planned, work, feeds_path, opts.timeout)
    planned, windows = memory.plan_all(planned, spec, opts)
    notes += [window_note(p, w, spec, opts, memory) for p, w in windows.items() if w]
    notes += [n for n in [sizing_note(memory)] if n]
    feed_bytes = sum(getattr(v, "nbytes", 0) for v in feeds.arrays.values())
    planned = [
        replace(p, planned_bytes=memory.planned_bytes(p, spec, opts, windows.get(p.name, ()), feed_bytes))
        for p in planned
    ]
    ctx = ProbeContext(
        spec,
        opts,
        feeds,
        feeds_path,
        work,
        run_bytes=memory.run_bytes(spec),
        budget=memory.budget,
        judge_alone=keep_layers or judge_alone,
    )
    probes = [PROBES[n](ctx) for n in wanted]
    # One backend, one build, nothing saved or compared after: its per-layer tensors cross no
    # process, so the worker compares them run to run by digest and writes the outputs only.
    running = [pr for pr in probes if not pr.always]  # the builds probe reads fingerprints only
    alone = len(planned) == 1 and opts.builds == 1 and not (running or loaded or opts.baseline)
    spill = not (alone and capture_to is None and not opts.save_captures and not keep_layers)
    done = _execute(
        ctx,
        planned,
        probes,
        loaded,
        progress or NullProgress(),
        windows,
        spill,
        memory.explanation_blocker(spec, bool(opts.noise_samples)),
        lambda builds, backends, ref: _comparisons(ctx, builds, backends, ref, capture_to),
        plain,
    )
    if spec.unsorted:
        notes.append(
            "the model file lists its nodes out of topological order (as ONNX Runtime's float16 "
            "converter writes them); every backend ran the same graph with its nodes sorted"
        )
    result = _result(ctx, planned, probes, (*notes, *ctx.notes), done)
    decided = decisions_all(spec, opts.decisions, done.builds, result.backends, result.reference_used)
    named = replace(result.model, path=shipped_path)  # the file the user named, never the sorted copy
    result = replace(result, model=named, decode=decoded, decisions=decided)
    return Ran(result, done.builds, feeds)


def _nearly_full(folder: Path) -> bool:
    """The filesystem itself, asked directly (what planning reads through shutil may be a
    smaller budget than the disk)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < NEARLY_FULL


def run_folder() -> tempfile.TemporaryDirectory[str]:
    """The run's temp folder (every capture lives under it; removed on exit or interrupt, and by
    the next run where this process is killed outright)."""
    return run_temp_folder()


@dataclass(frozen=True)
class _Executed:
    """Everything the worker processes produced, summarized per backend."""

    builds: Mapping[str, Builds]  # loaded captures included
    backends: tuple[BackendResult, ...]  # loaded captures included
    probe_outcomes: Mapping[tuple[str, str], Mapping[str, JobOutcome]]
    broken_probes: Mapping[str, str]  # probe -> why it failed to plan its follow-ups
    reference: str
    explanation: Explanation
    compared: _Compared
    probes: tuple[ProbeResult, ...] | None = None  # analyzed before the explanation ran (None: after)


@dataclass(frozen=True)
class _Compared:
    """The comparisons of the captures, made while the explanation runs (its tolerances are
    attached after)."""

    environment: tuple[tuple[str, str], ...]
    drift: tuple[Drift, ...]
    baseline_environment: tuple[tuple[str, str], ...]
    oracle: tuple[CrossBackendResult, ...]
    cross: tuple[CrossBackendResult, ...]
    expected: tuple[CrossBackendResult, ...]
    pairs: tuple[PairResult, ...]


def _comparisons(
    ctx: ProbeContext,
    builds: Mapping[str, Builds],
    backends: Sequence[BackendResult],
    ref: str,
    capture_to: str | os.PathLike[str] | None,
) -> _Compared:
    """Every comparison between the backends that ran and the captures loaded."""
    spec, opts, feeds = ctx.spec, ctx.opts, ctx.feeds
    env = tuple(collect_environment().items())
    save_captures(opts, spec, feeds, ctx.feeds_path, builds, backends, env, capture_to)
    drift, baseline_env = baseline_drifts(opts, spec, feeds, builds, backends)
    compared = [b for b in backends if b.name != EXPECTED]
    return _Compared(
        env,
        drift,
        baseline_env,
        tuple(against(ORACLE, builds, compared, spec, opts)),
        tuple(cross_all(builds, compared, ref, spec, opts)),
        tuple(against(EXPECTED, builds, compared, spec, opts, layers=False)),
        tuple(pairs(builds, backends, spec)),
    )


_NONE = _Compared((), (), (), (), (), (), ())  # nothing compared (the probes' analysis before)


def _execute(
    ctx: ProbeContext,
    planned: Sequence[PlannedBackend],
    probes: Sequence[Probe],
    loaded: Sequence[LoadedCapture],
    bar: ProgressSink,
    windows: Mapping[str, tuple[tuple[str, ...], ...]],
    spill: bool = True,
    too_big: str = "",
    meanwhile: Callable[[Mapping[str, Builds], tuple[BackendResult, ...], str], _Compared] | None = None,
    plain: bool = True,
) -> _Executed:
    """Every backend's builds, every probe's jobs, the follow-ups they ask for, then the
    explanation (floor and local errors), under one bar, the captures compared (`meanwhile`)
    while it runs. The model and options are the context's."""
    spec, opts = ctx.spec, ctx.opts
    ex = executor_for(spec, ctx.work, opts.timeout, bar, planned)
    mains = {
        p.name: main_jobs(p, spec, opts, ctx.feeds_path, windows.get(p.name, ()), spill, plain)
        for p in planned
    }
    probe_jobs = {(pr.name, p.name): pr.jobs(p) for pr in probes for p in planned if p.cls is not None}
    bar.start(_steps([*mains.values(), *probe_jobs.values()]))
    try:
        builds = {p.name: run_builds(ex, p, mains[p.name]) for p in planned}
        backends = tuple(summarize_backend(builds[p.name], spec, opts) for p in planned)
        results = {b.name: b for b in backends}
        everything = dict(builds)
        for cap in loaded:
            everything[cap.name] = Builds(PlannedBackend(cap.name, None, {}, {}), (), cap)
            backends += (replace(cap.backend, loaded_from=str(cap.path)),)
        ref = effective_reference(opts, backends)
        named = {b.name: b for b in backends}
        # The explanation needs only the builds: it runs beside the probes where memory holds
        # both (their workers leave cores idle while they start and write), else after them.
        beside = bool(probe_jobs) and opts.noise_samples != 0 and side_by_side(ctx, 2, processes=3)
        with ex.shared() as shared, ThreadPoolExecutor(1, thread_name_prefix="xbackend-explain") as pool:
            args = (ex, ctx, planned, everything, named, ref, shared, too_big)
            later = pool.submit(explain, *args) if beside else None
            try:
                outcomes = run_probe_jobs(ex, planned, probe_jobs, builds)
                broken = run_followups(ex, probes, planned, builds, outcomes, results, shared)
            except BaseException:  # interrupted: the explanation starts nothing more
                ex.cancelled.set()
                raise
            analyzed = None
            if later is None and probe_jobs:  # analyzed now, their captures deleted: room on disk
                # (their captures still on disk, it plans its files in what is left)
                others = [b for n, b in everything.items() if n not in (ref, EXPECTED) and b.ok]
                if not explanation_room(ctx, others)[0]:
                    later = pool.submit(explain, *args)  # room beside them: it starts meanwhile
                partial = _Executed(everything, backends, outcomes, broken, ref, NOT_MEASURED, _NONE)
                analyzed = _probe_results(probes, planned, partial)
                for by_job in outcomes.values():
                    for o in by_job.values():
                        o.drop_captures()
            if later is None:
                later = pool.submit(explain, *args)
            # the comparisons read the builds' captures on this core while the explanation's
            # workers run; its tolerances are attached to them after
            try:
                compared = meanwhile(everything, backends, ref) if meanwhile is not None else _NONE
            except BaseException:
                ex.cancelled.set()
                raise
            explanation = later.result()
    finally:
        bar.stop()
    return _Executed(everything, backends, outcomes, broken, ref, explanation, compared, analyzed)


def _steps(jobs: Sequence[Sequence[Job]]) -> int:
    return sum(j.steps for js in jobs for j in js)


def _result(
    ctx: ProbeContext,
    planned: Sequence[PlannedBackend],
    probes: Sequence[Probe],
    notes: tuple[str, ...],
    done: _Executed,
) -> Result:
    """The comparisons made, with the explanation's tolerances attached."""
    spec, opts, feeds = ctx.spec, ctx.opts, ctx.feeds
    builds, ref, c = done.builds, done.reference, done.compared
    ref_layers = builds[ref].first.layers if ref in builds and builds[ref].ok else None
    ref_capture = ref_layers.capture if ref_layers is not None else None
    cross = attach(c.cross, done.explanation, spec.op_types(), opts.auto_tolerance)
    return Result(
        model=spec,
        feeds=feeds_info(feeds, c.expected != ()),
        options=opts,
        backends=done.backends,
        cross_backend=cross,
        environment=c.environment,
        notes=notes,
        pairs=c.pairs,
        oracle_error=c.oracle,
        probes=done.probes if done.probes is not None else _probe_results(probes, planned, done),
        probes_ran=tuple(pr.name for pr in probes),
        reference=ref,
        expected_error=c.expected,
        baseline=c.drift,
        baseline_environment=c.baseline_environment,
        explanation=far_from_float64(
            done.explanation, spec, [x for x in cross if x.backend != ORACLE], c.oracle, ref_capture
        ),
    )


def _probe_results(
    probes: Sequence[Probe], planned: Sequence[PlannedBackend], done: _Executed
) -> tuple[ProbeResult, ...]:
    results = {b.name: b for b in done.backends}
    return tuple(
        FailedProbe(pr.name, done.broken_probes[pr.name])
        if pr.name in done.broken_probes
        else analyze_probe(pr, planned, done.builds, done.probe_outcomes, results)
        for pr in probes
    )
