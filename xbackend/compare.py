"""Orchestration: load, feed, run every backend in isolation, compare captures, run probes.

Never imports a backend: runners are found by name and run in worker
processes. Captures are compared one tensor at a time from disk.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from xbackend.capture import CaptureFile, common_names, diff_captures
from xbackend.environment import collect_environment
from xbackend.errors import ModelLoadError
from xbackend.executor import Executor, Job, JobOutcome
from xbackend.inputs import Feeds, generate_feeds, load_feeds
from xbackend.metrics import TensorDiff, worst_per_tensor
from xbackend.model import ModelSpec, downgrade_blockers, load_model
from xbackend.probes import (
    BatchResult,
    BuildVariance,
    ObserverResult,
    OptLevelResult,
    Probes,
    ThreadResult,
    batch_feed_sets,
    batch_inputs,
    batch_result,
    has_opt_levels,
    has_threads,
    save_feeds,
    select_probes,
    summarize,
)
from xbackend.progress import NullProgress, ProgressSink
from xbackend.results import (
    BackendResult,
    CompareOptions,
    CrossBackendResult,
    FeedsInfo,
    PairResult,
    Result,
)
from xbackend.runners.base import Runner
from xbackend.runners.registry import get_runner

__all__ = ["ORACLE", "compare", "compare_with_options"]

ORACLE = "oracle"


@dataclass(frozen=True)
class _Planned:
    name: str
    cls: type[Runner] | None
    options: dict[str, Any]
    raw_options: dict[str, str]
    unavailable: str = ""

    def variant(self, **overrides: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({**self.raw_options, **overrides}.items()))


@dataclass(frozen=True)
class _Builds:
    """A backend's main jobs, one per build."""

    planned: _Planned
    outcomes: tuple[JobOutcome, ...]

    @property
    def ok(self) -> bool:
        return bool(self.outcomes) and all(o.ok for o in self.outcomes)


def compare(model: str | os.PathLike[str], progress: ProgressSink | None = None, **options: Any) -> Result:
    """Compare `model` across backends; keyword options are CompareOptions fields.

    Example: ``xbackend.compare("model.onnx", backends=["ort-cpu", "reference"], runs=5)``.
    """
    return compare_with_options(model, CompareOptions.create(**options), progress)


def compare_with_options(
    model: str | os.PathLike[str], opts: CompareOptions, progress: ProgressSink | None = None
) -> Result:
    spec, proto = load_model(model)
    feeds = (
        load_feeds(opts.inputs, spec) if opts.inputs else generate_feeds(spec, opts.seed, dict(opts.shapes))
    )
    planned = [_plan(name, opts) for name in opts.backends]
    notes = _preflight(spec, proto, planned)
    del proto
    probes_wanted = select_probes(opts.probes, opts.batch_invariance)
    bar = progress or NullProgress()
    with tempfile.TemporaryDirectory(prefix="xbackend-") as tmp:
        work = Path(tmp)
        feeds_path = save_feeds(feeds, work / "feeds.npz")
        ex = Executor(spec, work, opts.timeout, bar)
        mains = {p.name: _main_jobs(p, spec, opts, feeds_path) for p in planned}
        plan = _ProbePlan(spec, opts, feeds, work, probes_wanted)
        probe_jobs = {p.name: plan.jobs(p) for p in planned}
        bar.start(sum(j.steps for js in [*mains.values(), *probe_jobs.values()] for j in js))
        try:
            builds = {p.name: _run_builds(ex, p, mains[p.name]) for p in planned}
            probe_outcomes = {
                p.name: _run_or_skip(ex, probe_jobs[p.name], builds[p.name].ok) for p in planned
            }
        finally:
            bar.stop()
        backends = tuple(_summarize(builds[p.name], spec, opts) for p in planned)
        cross = tuple(_cross_all(builds, backends, spec, opts))
        pairs = tuple(_pairs(builds, backends, spec))
        oracle = tuple(_oracle_errors(builds, backends, spec, opts))
        probes = plan.analyze(planned, builds, probe_outcomes, backends)
    env = tuple(collect_environment().items())
    return Result(spec, _feeds_info(feeds), opts, backends, cross, env, tuple(notes), pairs, oracle, probes)


def _feeds_info(feeds: Feeds) -> FeedsInfo:
    shapes = tuple((k, str(v.dtype), tuple(int(d) for d in v.shape)) for k, v in sorted(feeds.arrays.items()))
    return FeedsInfo(feeds.sha256, feeds.seed, feeds.source, shapes)


def _plan(name: str, opts: CompareOptions) -> _Planned:
    cls = get_runner(name)  # unknown name: BackendUnavailableError listing the known ones
    raw = opts.options_for(name)
    resolved = cls.resolve_options(raw)  # bad option: UsageError before anything runs
    avail = cls.availability()
    if not avail.available:
        return _Planned(name, None, resolved, raw, avail.reason)
    return _Planned(name, cls, resolved, raw)


def _preflight(spec: ModelSpec, proto: onnx.ModelProto, planned: Sequence[_Planned]) -> list[str]:
    """Refuse up front a model a backend cannot load because of its IR version; note downgrades."""
    notes = []
    for p in planned:
        if p.cls is None:
            continue
        try:
            max_ir = p.cls.max_ir_version()
        except Exception:  # the worker will report the real problem
            continue
        if max_ir is None or spec.ir_version <= max_ir:
            continue
        blockers = downgrade_blockers(proto, max_ir)
        if blockers:
            raise ModelLoadError(
                f"{p.name} reads ONNX IR version <= {max_ir} but {spec.path} is IR {spec.ir_version} "
                f"and uses {'; '.join(blockers)}; re-export with an older opset/IR or drop {p.name} "
                "from --backends"
            )
        notes.append(
            f"{p.name}: model IR version {spec.ir_version} was downgraded to {max_ir} for this "
            "backend; the model uses nothing newer, so the graph is unchanged"
        )
    return notes


def _main_jobs(p: _Planned, spec: ModelSpec, opts: CompareOptions, feeds: Path) -> list[Job]:
    if p.cls is None:
        return []
    return [
        Job(
            f"{p.name}-build{k}",
            p.name,
            p.cls,
            p.variant(),
            spec.tensor_order(opts.outputs_only),
            feeds,
            runs=opts.runs,
            fingerprint=opts.builds > 1,
        )
        for k in range(opts.builds)
    ]


def _run_builds(ex: Executor, p: _Planned, jobs: Sequence[Job]) -> _Builds:
    outcomes: list[JobOutcome] = []
    for job in jobs:
        if outcomes and not outcomes[-1].ok:
            ex.skip(job)  # a backend that fails to build once is failed; don't spend K timeouts on it
            continue
        outcomes.append(ex.run(job))
    return _Builds(p, tuple(outcomes))


def _run_or_skip(ex: Executor, jobs: Sequence[Job], backend_ok: bool) -> dict[str, JobOutcome]:
    out = {}
    for job in jobs:
        if backend_ok:
            out[job.label] = ex.run(job)
        else:
            ex.skip(job)
    return out


def _diff_from_dict(d: dict[str, Any]) -> TensorDiff:
    d = dict(d)
    d["shape"] = tuple(d["shape"])
    return TensorDiff(**d)


def _summarize(b: _Builds, spec: ModelSpec, opts: CompareOptions) -> BackendResult:
    p = b.planned
    options = tuple(sorted((k, str(v)) for k, v in p.options.items()))
    if p.cls is None:
        return BackendResult(p.name, "unavailable", p.unavailable, options)
    failed = next((o for o in b.outcomes if not o.ok), None)
    if failed is not None:
        info = tuple(sorted(failed.result.get("info", {}).items()))
        return BackendResult(
            p.name, failed.outcome.status, failed.outcome.reason, options, info, opts.runs, len(b.outcomes)
        )
    first = b.outcomes[0].result
    names = first["capture_names"]
    order = {n: i for i, n in enumerate(names)}
    run_diffs = worst_per_tensor(
        [_diff_from_dict(d) for o in b.outcomes for d in o.result["run_diffs"]], order
    )
    out_hashes = [h for o in b.outcomes for h in o.result["output_hashes"]]
    cap_hashes = [h for o in b.outcomes for h in o.result["capture_hashes"]]
    return BackendResult(
        name=p.name,
        status="ok",
        options=options,
        info=tuple(sorted(first.get("info", {}).items())),
        runs=opts.runs,
        builds=len(b.outcomes),
        deterministic=len(set(cap_hashes)) == 1,
        distinct_outputs=len(set(out_hashes)),
        distinct_run_outputs=max(len(set(o.result["output_hashes"])) for o in b.outcomes),
        distinct_build_outputs=len({o.result["output_hashes"][0] for o in b.outcomes}),
        exposed=len(names),
        not_exposed=tuple(sorted(first.get("not_exposed", {}).items())),
        run_diffs=tuple(run_diffs),
        build_diffs=tuple(_build_diffs(b, names, spec)),
        fingerprints=tuple(o.result["fingerprint"]["digest"] for o in b.outcomes),
        timings=(
            ("prepare_s", float(first["prepare_s"])),
            ("run_s", float(sum(first["run_s"]) / max(1, len(first["run_s"])))),
        ),
    )


def _build_diffs(b: _Builds, names: Sequence[str], spec: ModelSpec) -> list[TensorDiff]:
    """Each later build's first run against build 0's, tensor by tensor from disk."""
    if len(b.outcomes) < 2:
        return []
    ops = spec.op_types()
    order = {n: i for i, n in enumerate(names)}
    diffs: list[TensorDiff] = []
    with CaptureFile(b.outcomes[0].capture, names) as base:
        for o in b.outcomes[1:]:
            with CaptureFile(o.capture, o.names) as other:
                diffs.extend(diff_captures(other, base, names, ops))
    return worst_per_tensor(diffs, order)


def _cross_all(
    builds: dict[str, _Builds], results: Sequence[BackendResult], spec: ModelSpec, opts: CompareOptions
) -> list[CrossBackendResult]:
    ref = opts.reference_name
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


def _compare_first_runs(a: _Builds, b: _Builds, spec: ModelSpec, order: Sequence[str]) -> list[TensorDiff]:
    """Tensors both exposed, in `order`: a's first run against b's."""
    a0, b0 = a.outcomes[0], b.outcomes[0]
    with CaptureFile(a0.capture, a0.names) as ca, CaptureFile(b0.capture, b0.names) as cb:
        return diff_captures(ca, cb, common_names(ca, cb, order), spec.op_types())


def _pairs(builds: dict[str, _Builds], results: Sequence[BackendResult], spec: ModelSpec) -> list[PairResult]:
    """Every pair of backends that ran, at the graph outputs."""
    ok = [r.name for r in results if r.ok]
    out = []
    for i, a in enumerate(ok):
        for b in ok[i + 1 :]:
            diffs = _compare_first_runs(builds[a], builds[b], spec, spec.output_names)
            out.append(PairResult.from_diffs(a, b, diffs))
    return out


def _oracle_errors(
    builds: dict[str, _Builds], results: Sequence[BackendResult], spec: ModelSpec, opts: CompareOptions
) -> list[CrossBackendResult]:
    """Every backend that ran against the float64 oracle, when the oracle ran."""
    by_name = {r.name: r for r in results}
    if ORACLE not in by_name or not by_name[ORACLE].ok:
        return []
    return [
        _cross_one(builds[r.name], builds[ORACLE], spec, opts) for r in results if r.ok and r.name != ORACLE
    ]


def _cross_one(a: _Builds, b: _Builds, spec: ModelSpec, opts: CompareOptions) -> CrossBackendResult:
    a_names, b_names = a.outcomes[0].names, b.outcomes[0].names
    diffs = _compare_first_runs(a, b, spec, spec.tensor_order(opts.outputs_only))
    only_a = sorted(set(a_names) - set(b_names))
    only_b = sorted(set(b_names) - set(a_names))
    return CrossBackendResult.from_diffs(
        a.planned.name, b.planned.name, diffs, spec.output_names, only_a, only_b, opts.max_ulp
    )


# --- probes ---------------------------------------------------------------------------------


class _ProbePlan:
    """Plans each backend's probe jobs up front and turns their outcomes into results."""

    def __init__(
        self, spec: ModelSpec, opts: CompareOptions, feeds: Feeds, work: Path, wanted: tuple[str, ...]
    ) -> None:
        self.spec, self.opts, self.feeds, self.work, self.wanted = spec, opts, feeds, work, wanted
        self.notes: list[str] = []
        self.batch = opts.batch_invariance or 4
        self.n_threads = opts.probe_threads or 2 * (os.cpu_count() or 1)
        self._batch_paths: tuple[Path, tuple[Path, ...]] | None = None
        if "batch" in wanted:
            self._prepare_batch()

    def _prepare_batch(self) -> None:
        if not batch_inputs(self.spec):
            self.notes.append(
                "batch invariance not probed: no model input has a dynamic first (batch) dimension"
            )
            return
        single, batches = batch_feed_sets(self.spec, self.feeds, self.batch, self.opts.seed)
        paths = tuple(save_feeds(f, self.work / f"batch{i}.npz") for i, f in enumerate(batches))
        self._batch_paths = (save_feeds(single, self.work / "single.npz"), paths)

    def jobs(self, p: _Planned) -> list[Job]:
        if p.cls is None:
            return []
        tensors = self.spec.tensor_order(self.opts.outputs_only)
        feeds = self.work / "feeds.npz"
        jobs = []
        if "observer" in self.wanted and not self.opts.outputs_only:
            jobs.append(Job(f"{p.name}-observer", p.name, p.cls, p.variant(), self.spec.output_names, feeds))
        if "threads" in self.wanted and has_threads(p.cls):
            for t in self._thread_values(p):
                jobs.append(
                    Job(f"{p.name}-threads{t}", p.name, p.cls, p.variant(threads=str(t)), tensors, feeds)
                )
        if "opt-levels" in self.wanted and has_opt_levels(p.cls):
            jobs.append(Job(f"{p.name}-opt-levels", p.name, p.cls, p.variant(), (), feeds, kind="opt-levels"))
        if "batch" in self.wanted and self._batch_paths is not None:
            single, batches = self._batch_paths
            jobs.append(
                Job(
                    f"{p.name}-batch",
                    p.name,
                    p.cls,
                    p.variant(),
                    self.spec.tensor_order(),
                    single,
                    extra_feeds=batches,
                )
            )
        return jobs

    def _thread_values(self, p: _Planned) -> list[int]:
        default = int(p.options["threads"])
        return [t for t in (1, self.n_threads) if t != default]

    def analyze(
        self,
        planned: Sequence[_Planned],
        builds: dict[str, _Builds],
        outcomes: dict[str, dict[str, JobOutcome]],
        results: Sequence[BackendResult],
    ) -> Probes:
        ok = {r.name for r in results if r.ok}
        run = [p for p in planned if p.name in ok]
        return Probes(
            ran=self.wanted,
            builds=tuple(
                self._builds(builds[p.name], r)
                for p, r in zip(planned, results, strict=True)
                if r.ok and r.builds > 1
            ),
            batch=tuple(
                self._batch(p, outcomes[p.name])
                for p in run
                if "batch" in self.wanted and self._batch_paths is not None
            ),
            threads=tuple(
                t for p in run if "threads" in self.wanted for t in self._threads(p, builds, outcomes[p.name])
            ),
            opt_levels=tuple(o for p in run for o in self._opt_levels(p, outcomes[p.name])),
            observer=tuple(
                self._observer(p, builds[p.name], outcomes[p.name])
                for p in run
                if "observer" in self.wanted and not self.opts.outputs_only
            ),
            notes=tuple(self.notes),
        )

    def _builds(self, b: _Builds, r: BackendResult) -> BuildVariance:
        fps = [o.result["fingerprint"] for o in b.outcomes]
        return BuildVariance.from_fingerprints(r.name, fps, r.distinct_build_outputs > 1)

    def _observer(self, p: _Planned, b: _Builds, jobs: dict[str, JobOutcome]) -> ObserverResult:
        o = jobs[f"{p.name}-observer"]
        if not o.ok:
            return ObserverResult(p.name, "failed", o.outcome.reason)
        main = b.outcomes[0]
        with CaptureFile(o.capture, o.names) as plain, CaptureFile(main.capture, main.names) as inst:
            diffs = diff_captures(
                inst, plain, common_names(inst, plain, self.spec.output_names), self.spec.op_types()
            )
        equal, max_ulp, scaled, _ = summarize(diffs)
        return ObserverResult(p.name, "ok", "", not equal, max_ulp, scaled)

    def _threads(
        self, p: _Planned, builds: dict[str, _Builds], jobs: dict[str, JobOutcome]
    ) -> list[ThreadResult]:
        if p.cls is None or not has_threads(p.cls):
            return [ThreadResult(p.name, "-", "n/a", "the backend has no thread setting")]
        default = int(p.options["threads"])
        one = builds[p.name].outcomes[0] if default == 1 else jobs.get(f"{p.name}-threads1")
        variants = [(f"{default} (default)" if default else "default", builds[p.name].outcomes[0])]
        variants += [(str(t), jobs[f"{p.name}-threads{t}"]) for t in self._thread_values(p) if t != 1]
        if one is None or not one.ok:
            return [ThreadResult(p.name, "1", "failed", one.outcome.reason if one else "not run")]
        out = []
        for label, o in variants:
            if o is one:
                continue
            if not o.ok:
                out.append(ThreadResult(p.name, label, "failed", o.outcome.reason))
                continue
            with CaptureFile(o.capture, o.names) as a, CaptureFile(one.capture, one.names) as b:
                names = common_names(a, b, self.spec.tensor_order(self.opts.outputs_only))
                diffs = diff_captures(a, b, names, self.spec.op_types())
            equal, max_ulp, scaled, first = summarize(diffs)
            out.append(ThreadResult(p.name, label, "ok", "", equal, max_ulp, scaled, first))
        return out

    def _opt_levels(self, p: _Planned, jobs: dict[str, JobOutcome]) -> list[OptLevelResult]:
        o = jobs.get(f"{p.name}-opt-levels")
        if o is None or not o.ok:
            if o is not None:
                self.notes.append(f"{p.name}: optimization-level probe failed: {o.outcome.reason}")
            return []
        return [
            OptLevelResult(
                p.name,
                r["level"],
                r["bitwise_equal"],
                int(r["max_ulp"]),
                float(r["scaled_ulp"]),
                tuple(r["changed_by"]),
                tuple(r["modified_graph"]),
            )
            for r in o.result["opt_levels"]
        ]

    def _batch(self, p: _Planned, jobs: dict[str, JobOutcome]) -> BatchResult:
        return batch_result(p.name, self.batch, jobs[f"{p.name}-batch"], self.spec)
