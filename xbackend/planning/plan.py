"""Before anything runs: captures to load, feeds, and each backend planned (or why it cannot run)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import onnx

from xbackend.errors import InputError, ModelLoadError, UsageError
from xbackend.execution.executor import Executor, Job, standard_phases
from xbackend.execution.foreign import probe_interpreter
from xbackend.execution.progress import ProgressSink
from xbackend.files.storage import save_values
from xbackend.model.inputs import Feeds, capture_feeds, generate_feeds, load_expected, load_feeds
from xbackend.model.load import ModelSpec, downgrade_blockers, used_domains
from xbackend.model.torch_module import META_MODULE, read_torch_metadata, trusted_spec
from xbackend.numerics.values import Value
from xbackend.planning.context import PlannedBackend
from xbackend.results import EXPECTED, CompareOptions, FeedsInfo
from xbackend.results.capture_record import LoadedCapture, open_capture
from xbackend.runners.base import INTERNAL_OPTIONS, PYTHON_OPTION
from xbackend.runners.registry import get_runner, runner_target

__all__ = [
    "executor_for",
    "feeds_for",
    "feeds_info",
    "load_captures",
    "main_jobs",
    "make_feeds",
    "plan_backend",
    "preflight",
    "with_expected",
]


def executor_for(
    spec: ModelSpec, work: Path, timeout: float, bar: ProgressSink, planned: Sequence[PlannedBackend]
) -> Executor:
    """The executor of `planned`'s workers: a model staged for another interpreter is lowered to
    the IR that interpreter's engine reads."""
    max_ir = {
        planned_backend.interpreter.path: planned_backend.interpreter.max_ir
        for planned_backend in planned
        if planned_backend.interpreter
    }
    return Executor(spec, work, timeout, bar, max_ir)


def make_feeds(spec: ModelSpec, opts: CompareOptions) -> tuple[Feeds, dict[str, Value] | None]:
    """The feeds --inputs holds (and its golden outputs), else feeds generated from --seed,
    --shape and --range."""
    if opts.inputs:
        return load_feeds(opts.inputs, spec), load_expected(opts.inputs, spec)
    ranges = {n: (lo, hi) for n, lo, hi in opts.ranges}
    return generate_feeds(spec, opts.seed, dict(opts.shapes), ranges), None


def with_expected(opts: CompareOptions, expected: Mapping[str, Value] | None) -> CompareOptions:
    """The options with the golden outputs' backend (expected) among the backends where
    --inputs holds outputs; a UsageError where it is asked for and they hold none."""
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


def load_captures(spec: ModelSpec, opts: CompareOptions) -> list[LoadedCapture]:
    """The captures --load names, each checked to be of this model (an InputError, one line,
    where one is another model's)."""
    out = []
    for name, path in opts.loads:
        cap = open_capture(path, name)
        if cap.model_sha256 != spec.sha256:
            raise InputError(
                f"capture {path} was made from another model ({cap.model_name}, sha256 "
                f"{cap.model_sha256[:12]}; {Path(spec.path).name} is {spec.sha256[:12]}): load it with that "
                "model, or pass it as --baseline to measure drift between the two"
            )
        out.append(cap)
    return out


def feeds_for(
    spec: ModelSpec, opts: CompareOptions, loaded: Sequence[LoadedCapture]
) -> tuple[Feeds, dict[str, Value] | None]:
    """The comparison's feeds; with --load, the first capture's inputs unless others were asked for,
    and every capture must have been fed the same bytes."""
    if loaded and not (opts.inputs or opts.shapes or opts.ranges or opts.seed):
        feeds, expected = capture_feeds(loaded[0].inputs, spec), None  # already checked: not hashed again
    else:
        feeds, expected = make_feeds(spec, opts)
    for cap in loaded:
        if cap.feeds.sha256 != feeds.sha256:
            raise InputError(
                f"capture {cap.path} was fed other inputs (sha256 {cap.feeds.sha256[:12]}) than this "
                f"comparison (sha256 {feeds.sha256[:12]}); pass --inputs {cap.path} to feed every "
                "backend the capture's inputs"
            )
    return feeds, expected


def feeds_info(feeds: Feeds, expected: bool) -> FeedsInfo:
    """What the report says of the feeds: digest, seed, source, shapes, ranges."""
    shapes = tuple(feeds.describe())
    return FeedsInfo(feeds.sha256, feeds.seed, feeds.source, shapes, feeds.ranges, expected, feeds.made)


def plan_backend(
    name: str, opts: CompareOptions, work: Path, expected: Mapping[str, Value] | None
) -> PlannedBackend:
    """Backend `name` as the options configure it: its runner and options checked (a
    UsageError for a bad one), or unavailable here with the reason."""
    cls = get_runner(name)  # unknown name: BackendUnavailableError listing the known ones
    raw = opts.options_for(name)
    internal = sorted(set(raw) & INTERNAL_OPTIONS)
    if internal:
        raise UsageError(
            f"{name} option {', '.join(internal)} is set by xbackend itself (it writes the graph the "
            "explanation judges); leave it out"
        )
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


def preflight(
    spec: ModelSpec, proto: onnx.ModelProto, planned: Sequence[PlannedBackend]
) -> tuple[list[PlannedBackend], list[str]]:
    """Backends that cannot read the model's IR version become unavailable for this model; note
    downgrades. Refuse the run only when no backend can load the model."""
    out: list[PlannedBackend] = []
    notes: list[str] = []
    blocked: list[str] = []
    used = used_domains(proto)
    for p in planned:
        _trusted_code(spec, proto, p)
        why = _domain_blocker(used, p) or _ir_blocker(spec, proto, p, notes)
        if why:
            blocked.append(f"{p.name}: {why}")
            p = replace(p, cls=None, unavailable=why)
        out.append(p)
    if blocked and all(planned_backend.cls is None for planned_backend in out) and len(blocked) == len(out):
        domains = any(_domain_blocker(used, planned_backend) for planned_backend in planned)
        fix = "add reference to --backends" if domains else "re-export it with an older opset/IR"
        raise ModelLoadError(f"no backend can load {spec.path}: {'; '.join(blocked)}; {fix}")
    return out, notes


def _trusted_code(spec: ModelSpec, proto: onnx.ModelProto, planned_backend: PlannedBackend) -> None:
    """--trust-model-code runs the Python file beside the model: any other source module the
    model records is refused before anything runs (exit 2)."""
    raw = dict(planned_backend.raw_options)
    if raw.get("trust_model_code", "").lower() not in ("true", "1", "yes") or raw.get("module"):
        return
    recorded = read_torch_metadata(proto).get(META_MODULE, "")
    if recorded:
        trusted_spec(recorded, Path(spec.path))


def _domain_blocker(used: Mapping[str, Sequence[str]], planned_backend: PlannedBackend) -> str:
    """Why `planned_backend`'s engine cannot run the model's ops ('' when it can, or does not say)."""
    domains = (
        planned_backend.cls.domains
        if planned_backend.cls is not None and planned_backend.cls.executes_graph
        else None
    )
    if domains is None:
        return ""
    missing = [f"{key}:{op}" for key, ops in sorted(used.items()) if key not in domains for op in ops]
    if not missing:
        return ""
    return f"it does not implement op(s) {', '.join(missing[:5])}"


def _ir_blocker(
    spec: ModelSpec, proto: onnx.ModelProto, planned_backend: PlannedBackend, notes: list[str]
) -> str:
    if planned_backend.cls is None:
        return ""
    try:
        max_ir = (
            planned_backend.interpreter.max_ir
            if planned_backend.interpreter
            else planned_backend.cls.max_ir_version()
        )
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
        f"{planned_backend.name}: model IR version {spec.ir_version} was downgraded to {max_ir} for this "
        "backend; the model uses nothing newer, so the graph is unchanged"
    )
    return ""


def main_jobs(
    planned_backend: PlannedBackend,
    spec: ModelSpec,
    opts: CompareOptions,
    feeds: Path,
    windows: tuple[tuple[str, ...], ...] = (),
    spill: bool = True,
    plain: bool = True,
) -> list[Job]:
    """`planned_backend`'s main builds, one job each (none where it cannot run): its runs, its per-layer
    tensors in `windows`, spilled to disk when `spill`, a plain build of its own when `plain`."""
    if planned_backend.cls is None:
        return []
    phases = standard_phases(
        planned_backend.cls,
        spec,
        opts.runs,
        options=planned_backend.raw_options,
        timed_runs=opts.timed_runs,
        windows=windows,
        spill=spill,
        plain_build=plain,
    )
    return [
        Job(
            f"{planned_backend.name}-build{k}",
            planned_backend.name,
            planned_backend.cls,
            planned_backend.variant(),
            feeds,
            phases,
            fingerprint=opts.builds > 1,
        )
        for k in range(opts.builds)
    ]
