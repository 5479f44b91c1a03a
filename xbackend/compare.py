"""Orchestration: load, feed, run every backend in isolation, compare captures.

Never imports a backend: runners are found by name and run in worker
processes. Captures are compared one tensor at a time from disk.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import onnx

from xbackend.capture import CaptureFile
from xbackend.environment import collect_environment
from xbackend.errors import ModelLoadError
from xbackend.inputs import Feeds, generate_feeds, load_feeds
from xbackend.isolation import WorkerOutcome, run_worker
from xbackend.metrics import TensorDiff
from xbackend.model import ModelSpec, downgrade_blockers, load_model
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


@dataclass(frozen=True)
class _Builds:
    """A backend's worker outcomes, one per build, with where their captures are."""

    planned: _Planned
    outcomes: tuple[WorkerOutcome, ...]
    captures: tuple[Path, ...]


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
    bar = progress or NullProgress()
    with tempfile.TemporaryDirectory(prefix="xbackend-") as tmp:
        work = Path(tmp)
        feeds_path = work / "feeds.npz"
        feeds.save(feeds_path)
        bar.start(sum(opts.builds * (opts.runs + 1) for p in planned if p.cls is not None))
        try:
            builds = {p.name: _run_builds(p, spec, opts, work, feeds_path, bar) for p in planned}
        finally:
            bar.stop()
        backends = tuple(_summarize(builds[p.name], spec, opts) for p in planned)
        cross = tuple(_cross_all(builds, backends, spec, opts))
        pairs = tuple(_pairs(builds, backends, spec))
        oracle = tuple(_oracle_errors(builds, backends, spec, opts))
    env = tuple(collect_environment().items())
    return Result(spec, _feeds_info(feeds), opts, backends, cross, env, tuple(notes), pairs, oracle)


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


def _job(
    p: _Planned, spec: ModelSpec, opts: CompareOptions, job_dir: Path, feeds: Path, capture: Path
) -> dict[str, Any]:
    return {
        "backend": p.name,
        "options": p.raw_options,
        "model": asdict(spec.ref()),
        "tensors": list(spec.tensor_order(opts.outputs_only)),
        "outputs": list(spec.output_names),
        "op_types": spec.op_types(),
        "runs": opts.runs,
        "feeds": str(feeds),
        "capture": str(capture),
        "result": str(job_dir / "result.json"),
    }


def _run_builds(
    p: _Planned, spec: ModelSpec, opts: CompareOptions, work: Path, feeds: Path, bar: ProgressSink
) -> _Builds:
    if p.cls is None:
        return _Builds(p, (), ())
    env = p.cls.process_env(p.options)
    outcomes, captures = [], []
    for k in range(opts.builds):
        job_dir = work / f"{p.name}-build{k}"
        job_dir.mkdir()
        capture = job_dir / "capture.npz"
        bar.describe(f"{p.name} build {k + 1}/{opts.builds}")
        outcome = run_worker(
            _job(p, spec, opts, job_dir, feeds, capture), job_dir, opts.timeout, env, bar.advance
        )
        done = len(outcome.result.get("output_hashes", ()))
        bar.advance(opts.runs + 1 - done)  # prepare step, plus runs a failure skipped
        outcomes.append(outcome)
        captures.append(capture)
        if outcome.status != "ok":
            break  # a backend that fails to build once is failed; don't spend K timeouts on it
    return _Builds(p, tuple(outcomes), tuple(captures))


def _diff_from_dict(d: dict[str, Any]) -> TensorDiff:
    d = dict(d)
    d["shape"] = tuple(d["shape"])
    return TensorDiff(**d)


def _summarize(b: _Builds, spec: ModelSpec, opts: CompareOptions) -> BackendResult:
    p = b.planned
    options = tuple(sorted((k, str(v)) for k, v in p.options.items()))
    if p.cls is None:
        return BackendResult(p.name, "unavailable", p.unavailable, options)
    failed = next((o for o in b.outcomes if o.status != "ok"), None)
    if failed is not None:
        info = tuple(sorted(failed.result.get("info", {}).items()))
        return BackendResult(p.name, failed.status, failed.reason, options, info, opts.runs, len(b.outcomes))
    first = b.outcomes[0].result
    names = first["capture_names"]
    order = {n: i for i, n in enumerate(names)}
    run_diffs = _worst_per_tensor(
        [_diff_from_dict(d) for o in b.outcomes for d in o.result["run_diffs"]], order
    )
    build_diffs = _build_diffs(b, names, spec)
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
        build_diffs=tuple(build_diffs),
        fingerprints=tuple(o.result["fingerprint"]["digest"] for o in b.outcomes),
        timings=(
            ("prepare_s", float(first["prepare_s"])),
            ("run_s", float(sum(first["run_s"]) / max(1, len(first["run_s"])))),
        ),
    )


def _worst_per_tensor(diffs: Sequence[TensorDiff], order: dict[str, int]) -> list[TensorDiff]:
    worst: dict[str, TensorDiff] = {}
    for d in diffs:
        worst[d.name] = worst[d.name].worse(d) if d.name in worst else d
    return sorted(worst.values(), key=lambda d: order.get(d.name, len(order)))


def _build_diffs(b: _Builds, names: Sequence[str], spec: ModelSpec) -> list[TensorDiff]:
    """Each later build's first run against build 0's, tensor by tensor from disk."""
    if len(b.outcomes) < 2:
        return []
    ops = spec.op_types()
    order = {n: i for i, n in enumerate(names)}
    diffs: list[TensorDiff] = []
    with CaptureFile(b.captures[0], names) as base:
        for o, path in zip(b.outcomes[1:], b.captures[1:], strict=True):
            with CaptureFile(path, o.result["capture_names"]) as other:
                diffs.extend(_diff_captures(other, base, names, ops))
    return _worst_per_tensor(diffs, order)


def _diff_captures(
    a: CaptureFile, b: CaptureFile, names: Sequence[str], ops: dict[str, str]
) -> list[TensorDiff]:
    out = []
    for n in names:
        if n in a and n in b:
            out.append(TensorDiff.from_arrays(n, a[n], b[n], ops.get(n, "")))
        else:
            out.append(TensorDiff.mismatch(n, ops.get(n, ""), "missing", "exposed on one side only"))
    return out


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
    a_names = a.outcomes[0].result["capture_names"]
    b_names = b.outcomes[0].result["capture_names"]
    common = [n for n in order if n in set(a_names) & set(b_names)]
    with CaptureFile(a.captures[0], a_names) as ca, CaptureFile(b.captures[0], b_names) as cb:
        return _diff_captures(ca, cb, common, spec.op_types())


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
    a_names = a.outcomes[0].result["capture_names"]
    b_names = b.outcomes[0].result["capture_names"]
    diffs = _compare_first_runs(a, b, spec, spec.tensor_order(opts.outputs_only))
    only_a = sorted(set(a_names) - set(b_names))
    only_b = sorted(set(b_names) - set(a_names))
    return CrossBackendResult.from_diffs(
        a.planned.name, b.planned.name, diffs, spec.output_names, only_a, only_b, opts.max_ulp
    )
