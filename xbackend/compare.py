"""Orchestration: load, feed, run every backend in isolation, compare captures, run probes.

Never imports a backend: runners are found by name and run in worker
processes. Never names a probe: it runs those the registry selects. Captures
are compared one value at a time from disk.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

from xbackend.baseline import Baseline, load_baseline
from xbackend.capture import CaptureFile, common_names, diff_captures
from xbackend.environment import collect_environment
from xbackend.errors import BackendUnavailableError, InputError, ModelLoadError, UsageError
from xbackend.executor import Executor, Job, JobOutcome, standard_phases
from xbackend.foreign import probe_interpreter
from xbackend.inputs import Feeds, capture_feeds, generate_feeds, load_expected, load_feeds
from xbackend.metrics import TensorDiff, is_constant, worst_per_tensor
from xbackend.model import ModelSpec, downgrade_blockers, load_model
from xbackend.portable import LoadedCapture, load_capture, write_capture
from xbackend.probes import (
    PROBES,
    BackendRuns,
    PlannedBackend,
    Probe,
    ProbeContext,
    ProbeResult,
    select_probes,
)
from xbackend.probes.base import summarize
from xbackend.progress import NullProgress, ProgressSink
from xbackend.promises import PROPERTIES, validate
from xbackend.protocol import LAYERS, OUTPUTS, PhaseResult
from xbackend.results import (
    EXPECTED,
    BackendResult,
    CompareOptions,
    CrossBackendResult,
    Drift,
    FeedsInfo,
    ObserverEffect,
    PairResult,
    Result,
)
from xbackend.runners.base import PYTHON_OPTION
from xbackend.runners.registry import get_runner, runner_target
from xbackend.storage import save_values
from xbackend.values import Value, value_name, value_sha256

__all__ = ["ORACLE", "compare", "compare_with_options"]

ORACLE = "oracle"


class _FirstRun(Protocol):
    """What comparisons read of a backend: build 0's phases (a live job, or a loaded capture)."""

    @property
    def outputs(self) -> PhaseResult: ...

    @property
    def layers(self) -> PhaseResult | None: ...

    @property
    def separate_layers(self) -> bool: ...


@dataclass(frozen=True)
class _Builds:
    """A backend's main jobs, one per build; or a capture loaded in their place."""

    planned: PlannedBackend
    outcomes: tuple[JobOutcome, ...]
    loaded: LoadedCapture | None = None

    @property
    def ok(self) -> bool:
        return self.loaded is not None or (bool(self.outcomes) and all(o.ok for o in self.outcomes))

    @property
    def first(self) -> _FirstRun:
        return self.loaded.run if self.loaded is not None else self.outcomes[0]


def compare(model: str | os.PathLike[str], progress: ProgressSink | None = None, **options: Any) -> Result:
    """Compare `model` across backends; keyword options are CompareOptions fields.

    Example: ``xbackend.compare("model.onnx", backends=["ort-cpu", "reference"], runs=5)``.
    """
    return compare_with_options(model, CompareOptions.create(**options), progress)


def _feeds(spec: ModelSpec, opts: CompareOptions) -> tuple[Feeds, dict[str, Value] | None]:
    if opts.inputs:
        return load_feeds(opts.inputs, spec), load_expected(opts.inputs, spec)
    ranges = {n: (lo, hi) for n, lo, hi in opts.ranges}
    return generate_feeds(spec, opts.seed, dict(opts.shapes), ranges), None


def _with_expected(opts: CompareOptions, expected: Mapping[str, Value] | None) -> CompareOptions:
    if expected is None:
        if EXPECTED in opts.backends:
            raise UsageError(
                f"backend {EXPECTED} compares against golden outputs: pass --inputs DIR holding "
                "output_N.pb files beside input_N.pb"
            )
        return opts
    if EXPECTED in opts.backends:
        return opts
    return replace(opts, backends=(*opts.backends, EXPECTED))


def compare_with_options(
    model: str | os.PathLike[str],
    opts: CompareOptions,
    progress: ProgressSink | None = None,
    capture_to: str | os.PathLike[str] | None = None,
) -> Result:
    """`capture_to`: write the first backend's portable capture to this folder (xbackend capture)."""
    spec, proto = load_model(model)
    loaded = _load_captures(spec, opts)
    feeds, expected = _feeds_for(spec, opts, loaded)
    opts = _with_expected(opts, expected)
    with tempfile.TemporaryDirectory(prefix="xbackend-") as tmp:
        work = Path(tmp)
        planned = [_plan(name, opts, work, expected) for name in opts.backends]
        planned, notes = _preflight(spec, proto, planned)
        del proto
        feeds_path = work / "feeds.xbv"
        feeds.save(feeds_path)
        ctx = ProbeContext(spec, opts, feeds, feeds_path, work)
        wanted = select_probes(opts.probes, opts.batch_invariance)
        probes = [PROBES[n](ctx) for n in wanted]
        return _run(
            spec, opts, feeds, ctx, planned, probes, notes, progress or NullProgress(), loaded, capture_to
        )


def _load_captures(spec: ModelSpec, opts: CompareOptions) -> list[LoadedCapture]:
    out = []
    for name, path in opts.loads:
        cap = load_capture(path, name)
        if cap.model_sha256 != spec.sha256:
            raise InputError(
                f"capture {path} was made from another model ({cap.model_name}, sha256 "
                f"{cap.model_sha256[:12]}; {Path(spec.path).name} is {spec.sha256[:12]}): load it with that "
                "model, or pass it as --baseline to measure drift between the two"
            )
        out.append(cap)
    return out


def _feeds_for(
    spec: ModelSpec, opts: CompareOptions, loaded: Sequence[LoadedCapture]
) -> tuple[Feeds, dict[str, Value] | None]:
    """The comparison's feeds; with --load, the first capture's inputs unless others were asked for,
    and every capture must have been fed the same bytes."""
    if loaded and not (opts.inputs or opts.shapes or opts.ranges or opts.seed):
        feeds, expected = capture_feeds(loaded[0], spec), None  # already checked: not hashed again
    else:
        feeds, expected = _feeds(spec, opts)
    for cap in loaded:
        if cap.feeds.sha256 != feeds.sha256:
            raise InputError(
                f"capture {cap.path} was fed other inputs (sha256 {cap.feeds.sha256[:12]}) than this "
                f"comparison (sha256 {feeds.sha256[:12]}); pass --inputs {cap.path} to feed every "
                "backend the capture's inputs"
            )
    return feeds, expected


def _run(
    spec: ModelSpec,
    opts: CompareOptions,
    feeds: Feeds,
    ctx: ProbeContext,
    planned: Sequence[PlannedBackend],
    probes: Sequence[Probe],
    notes: Sequence[str],
    bar: ProgressSink,
    loaded: Sequence[LoadedCapture] = (),
    capture_to: str | os.PathLike[str] | None = None,
) -> Result:
    max_ir = {p.interpreter.path: p.interpreter.max_ir for p in planned if p.interpreter}
    ex = Executor(spec, ctx.work, opts.timeout, bar, max_ir)
    mains = {p.name: _main_jobs(p, spec, opts, ctx.feeds_path) for p in planned}
    probe_jobs = {(pr.name, p.name): pr.jobs(p) for pr in probes for p in planned if p.cls is not None}
    bar.start(sum(j.steps for js in [*mains.values(), *probe_jobs.values()] for j in js))
    try:
        builds = {p.name: _run_builds(ex, p, mains[p.name]) for p in planned}
        probe_outcomes = _run_probe_jobs(ex, planned, probe_jobs, builds)
        backends = tuple(_summarize(builds[p.name], spec, opts) for p in planned)
        results = {b.name: b for b in backends}
        broken = _run_followups(ex, probes, planned, builds, probe_outcomes, results, bar)
    finally:
        bar.stop()
    for cap in loaded:
        builds[cap.name] = _Builds(PlannedBackend(cap.name, None, {}, {}), (), cap)
        backends += (replace(cap.backend, loaded_from=str(cap.path)),)
    env = tuple(collect_environment().items())
    _save_captures(opts, spec, feeds, ctx.feeds_path, builds, backends, env, capture_to)
    drift, baseline_env = _baseline(opts, spec, feeds, builds, backends)
    ref = _effective_reference(opts, backends)
    compared = [b for b in backends if b.name != EXPECTED]
    cross = tuple(_cross_all(builds, compared, ref, spec, opts))
    pairs = tuple(_pairs(builds, backends, spec))
    oracle = tuple(_against(ORACLE, builds, compared, spec, opts))
    expected = tuple(_against(EXPECTED, builds, compared, spec, opts, layers=False))
    probe_results = tuple(
        _FailedProbe(pr.name, broken[pr.name])
        if pr.name in broken
        else _analyze(pr, planned, builds, probe_outcomes, results)
        for pr in probes
    )
    return Result(
        spec,
        _feeds_info(feeds, expected != ()),
        opts,
        backends,
        cross,
        env,
        (*notes, *ctx.notes),
        pairs,
        oracle,
        probe_results,
        tuple(pr.name for pr in probes),
        ref,
        expected,
        drift,
        baseline_env,
    )


def _run_probe_jobs(
    ex: Executor,
    planned: Sequence[PlannedBackend],
    probe_jobs: Mapping[tuple[str, str], Sequence[Job]],
    builds: Mapping[str, _Builds],
) -> dict[tuple[str, str], dict[str, JobOutcome]]:
    """Every probe's jobs for a backend in one go (variants that can share a process do)."""
    out: dict[tuple[str, str], dict[str, JobOutcome]] = {k: {} for k in probe_jobs}
    for p in planned:
        keys = [k for k in probe_jobs if k[1] == p.name]
        done = ex.run_all([j for k in keys for j in probe_jobs[k]], builds[p.name].ok)
        for k in keys:
            out[k] = {j.label: done[j.label] for j in probe_jobs[k] if j.label in done}
    return out


def _backend_runs(
    probe: Probe,
    planned: Sequence[PlannedBackend],
    builds: Mapping[str, _Builds],
    outcomes: Mapping[tuple[str, str], Mapping[str, JobOutcome]],
    results: Mapping[str, BackendResult],
) -> list[BackendRuns]:
    return [
        BackendRuns(p, builds[p.name].outcomes, outcomes.get((probe.name, p.name), {}), results[p.name])
        for p in planned
        if results[p.name].ok and p.name != EXPECTED
    ]


def _run_followups(
    ex: Executor,
    probes: Sequence[Probe],
    planned: Sequence[PlannedBackend],
    builds: Mapping[str, _Builds],
    outcomes: dict[tuple[str, str], dict[str, JobOutcome]],
    results: Mapping[str, BackendResult],
    bar: ProgressSink,
) -> dict[str, str]:
    """The second round: jobs a probe asks for after reading the first round's outcomes, all of
    a backend's together; they join that probe's outcomes. Returns the probes that failed to
    plan it, with the reason."""
    wanted: dict[tuple[str, str], list[Job]] = {}
    broken: dict[str, str] = {}
    for pr in probes:
        for r in _backend_runs(pr, planned, builds, outcomes, results):
            try:
                wanted[(pr.name, r.planned.name)] = pr.followup_jobs(r)
            except Exception as e:  # a broken probe is a warning, never a silent pass
                broken.setdefault(pr.name, f"{type(e).__name__}: {e}")
    bar.grow(sum(j.steps for js in wanted.values() for j in js))
    for key, done in _run_probe_jobs(ex, planned, wanted, builds).items():
        outcomes.setdefault(key, {}).update(done)
    return broken


def _analyze(
    probe: Probe,
    planned: Sequence[PlannedBackend],
    builds: Mapping[str, _Builds],
    outcomes: Mapping[tuple[str, str], Mapping[str, JobOutcome]],
    results: Mapping[str, BackendResult],
) -> ProbeResult:
    try:
        return probe.analyze(_backend_runs(probe, planned, builds, outcomes, results))
    except Exception as e:  # a broken probe is a warning, never a silent pass or a crash
        return _FailedProbe(probe.name, f"{type(e).__name__}: {e}")


@dataclass(frozen=True)
class _FailedProbe(ProbeResult):
    probe: str
    reason: str

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.probe

    def warnings(self) -> list[str]:
        return [f"WARN: probe {self.probe} failed: {self.reason}"]

    def markdown(self) -> list[str]:
        return [f"### Probe {self.probe}", "", f"Failed: {self.reason}.", ""]

    def to_json(self) -> Any:
        return {"status": "failed", "reason": self.reason}


def _feeds_info(feeds: Feeds, expected: bool) -> FeedsInfo:
    return FeedsInfo(feeds.sha256, feeds.seed, feeds.source, tuple(feeds.describe()), feeds.ranges, expected)


def _plan(
    name: str, opts: CompareOptions, work: Path, expected: Mapping[str, Value] | None
) -> PlannedBackend:
    cls = get_runner(name)  # unknown name: BackendUnavailableError listing the known ones
    raw = opts.options_for(name)
    if name == EXPECTED and expected is not None:
        path = work / "expected.xbv"
        save_values(path, expected)
        raw = {**raw, "file": str(path)}
    resolved = cls.resolve_options(raw)  # bad option: UsageError before anything runs
    if resolved[PYTHON_OPTION.name]:  # another environment: ask it, not this one
        it = probe_interpreter(resolved[PYTHON_OPTION.name], runner_target(name))
        if not it.available:
            return PlannedBackend(name, None, resolved, raw, it.reason, it)
        return PlannedBackend(name, cls, resolved, raw, interpreter=it)
    avail = cls.availability()
    if not avail.available:
        return PlannedBackend(name, None, resolved, raw, avail.reason)
    return PlannedBackend(name, cls, resolved, raw)


def _preflight(
    spec: ModelSpec, proto: onnx.ModelProto, planned: Sequence[PlannedBackend]
) -> tuple[list[PlannedBackend], list[str]]:
    """Backends that cannot read the model's IR version become unavailable for this model; note
    downgrades. Refuse the run only when no backend can load the model."""
    out: list[PlannedBackend] = []
    notes: list[str] = []
    blocked: list[str] = []
    for p in planned:
        why = _ir_blocker(spec, proto, p, notes)
        if why:
            blocked.append(f"{p.name}: {why}")
            p = replace(p, cls=None, unavailable=why)
        out.append(p)
    if blocked and all(p.cls is None for p in out) and len(blocked) == len(out):
        raise ModelLoadError(
            f"no backend can load {spec.path}: {'; '.join(blocked)}; re-export it with an older opset/IR"
        )
    return out, notes


def _ir_blocker(spec: ModelSpec, proto: onnx.ModelProto, p: PlannedBackend, notes: list[str]) -> str:
    if p.cls is None:
        return ""
    try:
        max_ir = p.interpreter.max_ir if p.interpreter else p.cls.max_ir_version()
    except Exception:  # the worker will report the real problem
        return ""
    if max_ir is None or spec.ir_version <= max_ir:
        return ""
    blockers = downgrade_blockers(proto, max_ir)
    if blockers:
        return (
            f"reads ONNX IR version <= {max_ir} but the model is IR {spec.ir_version} and uses "
            f"{'; '.join(blockers)}"
        )
    notes.append(
        f"{p.name}: model IR version {spec.ir_version} was downgraded to {max_ir} for this "
        "backend; the model uses nothing newer, so the graph is unchanged"
    )
    return ""


def _main_jobs(p: PlannedBackend, spec: ModelSpec, opts: CompareOptions, feeds: Path) -> list[Job]:
    if p.cls is None:
        return []
    phases = standard_phases(p.cls, spec, opts.runs, opts.outputs_only, options=p.raw_options)
    return [
        Job(f"{p.name}-build{k}", p.name, p.cls, p.variant(), feeds, phases, fingerprint=opts.builds > 1)
        for k in range(opts.builds)
    ]


def _run_builds(ex: Executor, p: PlannedBackend, jobs: Sequence[Job]) -> _Builds:
    outcomes: list[JobOutcome] = []
    for job in jobs:
        if outcomes and not outcomes[-1].ok:
            ex.skip(job)  # a backend that fails to build once is failed; don't spend K timeouts on it
            continue
        outcomes.append(ex.run(job))
    return _Builds(p, tuple(outcomes))


def _summarize(b: _Builds, spec: ModelSpec, opts: CompareOptions) -> BackendResult:
    p = b.planned
    options = tuple(
        sorted(
            (k, str(v))
            for k, v in p.options.items()
            if (k != "file" or p.name != EXPECTED) and (k != PYTHON_OPTION.name or v)
        )
    )
    if p.cls is None:
        return BackendResult(
            p.name, "unavailable", p.unavailable, options, p.interpreter_info(), promises=_promises(p.name)
        )
    failed = next((o for o in b.outcomes if not o.ok), None)
    if failed is not None:
        info = tuple(sorted({**dict(failed.result.info), **dict(p.interpreter_info())}.items()))
        return BackendResult(
            p.name,
            failed.outcome.status,
            failed.reason,
            options,
            info,
            opts.runs,
            len(b.outcomes),
            promises=_promises(p.name),
        )
    first = b.outcomes[0]
    outs = [o.outputs for o in b.outcomes]
    layers = [o.layers for o in b.outcomes if o.separate_layers]
    shown = first.layers or first.outputs
    order = {n: i for i, n in enumerate(spec.tensor_order())}
    run_diffs = worst_per_tensor([d for ph in [*outs, *layers] if ph for d in ph.run_diffs], order)
    out_hashes = [h for ph in outs for h in ph.output_hashes]
    cap_hashes = {
        ph.name: [h for o in b.outcomes if (x := o.phase(ph.name)) for h in x.capture_hashes]
        for ph in first.result.phases
    }
    return BackendResult(
        name=p.name,
        status="ok",
        options=options,
        info=tuple(sorted({**dict(first.outputs.info), **dict(p.interpreter_info())}.items())),
        runs=opts.runs,
        builds=len(b.outcomes),
        deterministic=all(len(set(hs)) == 1 for hs in cap_hashes.values()),
        distinct_outputs=len(set(out_hashes)),
        distinct_run_outputs=max(len(set(ph.output_hashes)) for ph in outs),
        distinct_build_outputs=len({ph.output_hashes[0] for ph in outs}),
        exposed=len(shown.capture_names),
        not_exposed=shown.not_exposed,
        run_diffs=tuple(run_diffs),
        build_diffs=tuple(_build_diffs(b, spec)),
        fingerprints=tuple(ph.fingerprint.digest for ph in outs),
        build_s=tuple(o.outcome.elapsed_s for o in b.outcomes),
        timings=(
            ("prepare_s", first.outputs.prepare_s),
            ("run_s", float(sum(first.outputs.run_s) / max(1, len(first.outputs.run_s)))),
        ),
        observer=_observer(first, spec),
        layers_error="; ".join(f"{ph}: {why}" for ph, why in first.result.phase_errors),
        constant_outputs=_constant_outputs(first.outputs, spec),
        output_digests=_digests(first.outputs, spec.output_names),
        layer_digests=_digests(first.layers),
        promises=_promises(p.name),
    )


def _promises(name: str) -> tuple[str, ...]:
    try:
        cls = get_runner(name)
    except BackendUnavailableError:
        return ()
    validate(cls.promises, cls.name)
    return tuple(p for p in PROPERTIES if p in cls.promises)


def _digests(ph: PhaseResult | None, names: Sequence[str] | None = None) -> tuple[tuple[str, str], ...]:
    """Each captured tensor's digest (64 bits of its value hash): enough to tell, in a later
    release's report, which tensors moved."""
    if ph is None:
        return ()
    keep = ph.capture_names if names is None else [n for n in ph.capture_names if n in set(names)]
    with CaptureFile(ph.capture) as c:
        return tuple((n, value_sha256({n: c[n]})[:16]) for n in keep if n in c)


def _save_captures(
    opts: CompareOptions,
    spec: ModelSpec,
    feeds: Feeds,
    feeds_path: Path,
    builds: Mapping[str, _Builds],
    backends: Sequence[BackendResult],
    env: Sequence[tuple[str, str]],
    capture_to: str | os.PathLike[str] | None,
) -> None:
    """Portable captures: `capture_to` for the first backend (xbackend capture), and one folder per
    backend that ran under --save-captures."""
    from xbackend import __version__

    todo: list[tuple[Path, BackendResult]] = []
    ran = [b for b in backends if b.ok and not b.loaded_from and b.name != EXPECTED]
    if capture_to is not None and ran and ran[0].name == opts.backends[0]:
        todo.append((Path(capture_to), ran[0]))
    if opts.save_captures:
        todo += [(Path(opts.save_captures) / b.name, b) for b in ran]
    model = {"name": Path(spec.path).name, "sha256": spec.sha256}
    info = _feeds_info(feeds, False)
    for dest, b in todo:
        first = builds[b.name].first
        phases = {OUTPUTS: first.outputs} if first.outputs.name == OUTPUTS else {}
        if first.layers is not None:
            phases[LAYERS] = first.layers
        write_capture(dest, b, model, info, feeds_path, phases, dict(env), __version__)


def _baseline(
    opts: CompareOptions,
    spec: ModelSpec,
    feeds: Feeds,
    builds: Mapping[str, _Builds],
    backends: Sequence[BackendResult],
) -> tuple[tuple[Drift, ...], tuple[tuple[str, str], ...]]:
    if opts.baseline is None:
        return (), ()
    base = load_baseline(opts.baseline)
    out = []
    for b in backends:
        if not b.ok or b.name == EXPECTED:
            continue
        out.append(_drift(b, builds[b.name], base, spec, feeds))
    return tuple(out), base.environment


def _drift(b: BackendResult, mine: _Builds, base: Baseline, spec: ModelSpec, feeds: Feeds) -> Drift:
    theirs = base.match(b.name)
    if theirs is None:
        return Drift(b.name, base.source, "no-baseline", f"the baseline has no {b.name.split('@')[0]}")
    label = f"{theirs.name} in {base.source}"
    if theirs.feeds_sha256 != feeds.sha256:
        return Drift(
            b.name,
            label,
            "not-comparable",
            f"the baseline was fed other inputs (sha256 {theirs.feeds_sha256[:12]}, "
            f"now {feeds.sha256[:12]}); "
            + (
                f"pass --inputs {theirs.capture.path} to feed the baseline's inputs"
                if theirs.capture is not None
                else "compare with the baseline's inputs (--seed, --shape, --range, --inputs)"
            ),
        )
    order = spec.tensor_order()
    rank = {n: i for i, n in enumerate(order)}
    if theirs.capture is not None:
        run = theirs.capture.run
        outs = _diff_phases(mine.first.outputs, run.outputs, spec, outputs=True)
        layers: list[TensorDiff] = []
        if mine.first.layers is not None and run.layers is not None:
            layers = _diff_phases(mine.first.layers, run.layers, spec, outputs=False)
        moved = [d.name for d in (layers or outs) if not d.bitwise_equal]
        moved += [d.name for d in outs if not d.bitwise_equal and d.name not in moved]
        moved.sort(key=lambda n: rank.get(value_name(n), len(rank)))
        status = "drifted" if moved else "identical"
        return Drift(b.name, label, status, "", True, tuple(outs), tuple(layers), tuple(moved))
    if not theirs.result.digests():
        return Drift(b.name, label, "not-comparable", "the baseline report records no tensor digests")
    moved = b.moved_since(theirs.result, rank)
    return Drift(b.name, label, "drifted" if moved else "identical", "", False, (), (), tuple(moved))


def _constant_outputs(ph: PhaseResult, spec: ModelSpec) -> tuple[tuple[str, str], ...]:
    out = []
    with CaptureFile(ph.capture) as c:
        for n in spec.output_names:
            v = c.get(n, None)
            if isinstance(v, np.ndarray) and v.size >= 2 and is_constant(v):
                out.append((n, f"all {v.reshape(-1)[0]!s}"))
    return tuple(out)


def _observer(o: JobOutcome, spec: ModelSpec) -> ObserverEffect | None:
    """Graph outputs of the instrumented build against the plain one (same process, same feeds)."""
    if not o.separate_layers or o.layers is None:
        return None
    diffs = _diff_phases(o.layers, o.outputs, spec, outputs=True)
    equal, max_ulp, scaled, first = summarize(diffs)
    return ObserverEffect(not equal, max_ulp, scaled, first)


def _diff_phases(a: PhaseResult, b: PhaseResult, spec: ModelSpec, outputs: bool) -> list[TensorDiff]:
    """a's run-0 capture against b's, over the tensors both hold, in topological order."""
    with CaptureFile(a.capture) as ca, CaptureFile(b.capture) as cb:
        names = common_names(ca, cb, spec.tensor_order(outputs_only=outputs))
        return diff_captures(ca, cb, names, spec.op_types())


def _build_diffs(b: _Builds, spec: ModelSpec) -> list[TensorDiff]:
    """Each later build's first run against build 0's: outputs (plain) and layers (instrumented)."""
    if len(b.outcomes) < 2:
        return []
    order = {n: i for i, n in enumerate(spec.tensor_order())}
    diffs: list[TensorDiff] = []
    for o in b.outcomes[1:]:
        diffs += _diff_phases(o.outputs, b.first.outputs, spec, outputs=True)
        if b.first.layers is not None and o.layers is not None:
            diffs += _diff_phases(o.layers, b.first.layers, spec, outputs=False)
    return worst_per_tensor(diffs, order)


def _effective_reference(opts: CompareOptions, results: Sequence[BackendResult]) -> str:
    """--reference when it ran, else the first backend in --backends order that did."""
    by_name = {r.name: r for r in results}
    ref = opts.reference_name
    if by_name[ref].ok:
        return ref
    return next((r.name for r in results if r.ok and r.name != EXPECTED), ref)


def _cross_all(
    builds: Mapping[str, _Builds],
    results: Sequence[BackendResult],
    ref: str,
    spec: ModelSpec,
    opts: CompareOptions,
) -> list[CrossBackendResult]:
    by_name = {r.name: r for r in results}
    out = []
    for r in results:
        if r.name == ref:
            continue
        if not r.ok:
            out.append(CrossBackendResult(r.name, ref, "skipped", f"{r.name} {r.status}"))
        elif not by_name[ref].ok:
            out.append(CrossBackendResult(r.name, ref, "skipped", f"reference {ref} {by_name[ref].status}"))
        else:
            out.append(_cross_one(builds[r.name], builds[ref], spec, opts))
    return out


def _pairs(
    builds: Mapping[str, _Builds], results: Sequence[BackendResult], spec: ModelSpec
) -> list[PairResult]:
    """Every pair of backends that ran, at the graph outputs of the plain builds."""
    ok = [r.name for r in results if r.ok]
    out = []
    for i, a in enumerate(ok):
        for b in ok[i + 1 :]:
            diffs = _diff_phases(builds[a].first.outputs, builds[b].first.outputs, spec, outputs=True)
            out.append(PairResult.from_diffs(a, b, diffs))
    return out


def _against(
    target: str,
    builds: Mapping[str, _Builds],
    results: Sequence[BackendResult],
    spec: ModelSpec,
    opts: CompareOptions,
    layers: bool = True,
) -> list[CrossBackendResult]:
    """Every backend that ran against `target` (the oracle, the expected outputs), when it ran."""
    by_name = {r.name: r for r in results}
    if target not in builds or not builds[target].ok:
        return []
    return [
        _cross_one(builds[r.name], builds[target], spec, opts, layers)
        for r in by_name.values()
        if r.ok and r.name != target
    ]


def _cross_one(
    a: _Builds, b: _Builds, spec: ModelSpec, opts: CompareOptions, layers: bool = True
) -> CrossBackendResult:
    a0, b0 = a.first, b.first
    outputs = _diff_phases(a0.outputs, b0.outputs, spec, outputs=True)
    missing = [n for n in spec.output_names if n not in {value_name(d.name) for d in outputs}]
    outputs += [
        TensorDiff.mismatch(n, spec.op_types().get(n, ""), "missing", "not produced") for n in missing
    ]
    la, lb = a0.layers, b0.layers
    note = ""
    per_layer: list[TensorDiff] = []
    only_a: list[str] = []
    only_b: list[str] = []
    if opts.outputs_only or not layers:
        note = "graph outputs only"
    elif la is None or lb is None:
        who = a.planned.name if la is None else b.planned.name
        note = f"{who} has no per-layer capture"
    else:
        per_layer = _diff_phases(la, lb, spec, outputs=False)
        only_a = sorted(set(la.capture_names) - set(lb.capture_names))
        only_b = sorted(set(lb.capture_names) - set(la.capture_names))
    return CrossBackendResult.from_diffs(
        a.planned.name,
        b.planned.name,
        outputs,
        per_layer,
        spec.output_names,
        only_a,
        only_b,
        opts.max_ulp,
        note,
    )
