"""The explanation's plan, and each backend judged against the float64 judge node by node: the
judge's one evaluation, or its windows, each run and judged in turn and deleted once judged, so
one window's float64 values are on disk at a time."""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from xbackend.execution.executor import Executor, Job, JobOutcome
from xbackend.files.run_values import CaptureFile
from xbackend.judge.conditioning import NodeStat, node_stats
from xbackend.judge.judge_nodes import JUDGE_PHASE, judge_backend, reorder_check
from xbackend.judge.judged_graph import Judged
from xbackend.model.load import ModelSpec
from xbackend.model.reorder import Reordered
from xbackend.planning.builds import Builds
from xbackend.results import BackendResult
from xbackend.results.explanation import LocalErrors, ReorderCheck

__all__ = [
    "LOCAL_PHASE",
    "NODE_FLOOR_PHASE",
    "OWN_JUDGE",
    "OWN_VALUES",
    "BackendJudgment",
    "Early",
    "Fed",
    "Judge",
    "Plan",
    "grain_of",
    "judge_all",
    "plan_rules",
    "shapes_of",
]

LOCAL_PHASE = "local"
NODE_FLOOR_PHASE = "node-floor"
_NO_CHECK = "not run: the allowances are checked against K orders per node with --noise-samples K"


# LocalErrors.graph of the judge's own engine: one evaluation serves both
OWN_JUDGE = (
    "the model's graph, evaluated once: the float64 judge's values rounded to the model's dtypes "
    "(the judge's own evaluator, at one thread)"
)
# ... of a backend that cannot be fed the reference's values (llama.cpp, ExecuTorch)
OWN_VALUES = (
    "its own values at the tensors it exposes (the model severed there, each part evaluated from its "
    "inputs as this backend computed them: it cannot be fed the reference's)"
)


@dataclass(frozen=True)
class Judge:
    """One float64 evaluation of a severed model, or why it cannot run."""

    job: Job | None
    judged: Judged | None
    unavailable: str = ""
    # cut into windows (memory or disk): a job each, run after the others, the next one while
    # one is judged (the disk plan leaves room for two windows' captures beside another judge's)
    windows: tuple[Job, ...] = ()


class Fed(enum.Enum):
    """How a backend's nodes are judged against float64."""

    SEVERED = "severed"  # its severed run, each node fed the reference's values
    OWN_VALUES = "own-values"  # it cannot be fed them: the model severed at what it exposes, fed its own
    OWN_JUDGE = "own-judge"  # it is the judge's own evaluator: the judge's values, rounded, are its
    NOT_MEASURED = "not-measured"


@dataclass(frozen=True)
class BackendJudgment:
    """How one backend is judged: what it is fed, its severed run, the judge it is held to, and
    the graph its nodes are judged on. One record per backend, chosen once and replaced whole
    when its optimized graph is written."""

    name: str
    fed: Fed
    reason: str = ""  # NOT_MEASURED: why
    local_job: Job | None = None  # SEVERED: its severed run
    judge: str = ""  # the key of the judge it is held to ("": the reference's grain)
    graph: str = ""  # the graph its nodes are judged on, in words ("": its grain's)
    unfused: bool = False  # its own graph could not be judged: the unfused model's was
    covers: Mapping[str, tuple[str, ...]] | None = None  # a fused kernel -> the nodes it computes
    # the tensors of its graph also judged on the reference grain's judge (nodes its optimizer
    # left as they were: one evaluation serves both), and its graph's order
    shared: frozenset[str] = frozenset()
    graph_order: tuple[str, ...] | None = None
    own_run: str = ""  # OWN_VALUES: its own per-layer capture
    optimized: tuple[Job, Path] | None = None  # the job that writes its optimized graph, and where

    @property
    def judges(self) -> list[str]:
        """The judges it is held to: its own, and the reference grain's for the nodes they share."""
        return [self.judge, ""] if self.judge and self.shared else [self.judge]

    def graph_words(self) -> str:
        """The graph the backend was judged on, in words."""
        if self.graph:
            return self.graph
        if self.judge:
            return "its own parts (the model severed at the tensors it exposes)"
        return "the model's graph"


@dataclass(frozen=True)
class Plan:
    floor_job: Job | None
    backends: Mapping[str, BackendJudgment]  # every backend but the reference, in --backends order
    reordered: Reordered | None
    extra: tuple[Path, ...]
    order: tuple[str, ...]  # backends in --backends order
    reference: str = ""
    judges: Mapping[str, Judge] = field(default_factory=dict)  # "" : the reference's granularity
    available: Mapping[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    captured: Mapping[str, str] = field(default_factory=dict)  # tensor -> dtype, as the reference holds it
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    node_floor_job: Job | None = None  # the severed model's sums in K orders: the per-node check
    rewrites: ModelSpec | None = None  # the model whose folder holds the rewrites' weights

    def fed(self, *how: Fed) -> list[BackendJudgment]:
        """The backends judged in one of these ways, in order."""
        return [backend for backend in self.backends.values() if backend.fed in how]

    @property
    def local_jobs(self) -> dict[str, Job]:
        """Each backend's severed run."""
        return {
            backend.name: backend.local_job
            for backend in self.backends.values()
            if backend.local_job is not None
        }

    @property
    def optimized(self) -> dict[str, tuple[Job, Path]]:
        """Backends whose optimized graph is written first (round 1), then severed and judged."""
        return {
            backend.name: backend.optimized
            for backend in self.backends.values()
            if backend.optimized is not None
        }

    def with_backend(self, judgment: BackendJudgment) -> Plan:
        """This plan with `judgment` replacing the backend's record."""
        return replace(self, backends={**self.backends, judgment.name: judgment})


class Early:
    """Backends judged in the background the moment their judge's capture and their own exist
    (the main process is otherwise idle while the workers run): one thread, whose numpy and
    compiled passes release the interpreter."""

    def __init__(self, spec: ModelSpec, ref: str, ref_capture: str) -> None:
        self._modules = spec.modules()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="xbackend-judge")
        self._lock = threading.Lock()
        self._captures = {ref: ref_capture}  # backend -> its severed run's capture
        self._judges: dict[str, str] = {}  # judge key -> its one evaluation's capture
        self._futures: dict[tuple[str, str], Future[LocalErrors]] = {}

    def offer(self, plan: Plan, job_outcome: JobOutcome) -> None:
        """Record `job_outcome`'s capture (a severed run, or a judge in one evaluation) and start every
        judgment it completes."""
        if not job_outcome.ok:
            return
        with self._lock:
            self._captures.update(
                {
                    backend_judgment.name: backend_judgment.own_run
                    for backend_judgment in plan.fed(Fed.OWN_VALUES)
                }
            )
            for b in plan.fed(Fed.SEVERED):
                lp = (
                    job_outcome.phase(LOCAL_PHASE)
                    if b.local_job is not None and b.local_job.label == job_outcome.job.label
                    else None
                )
                if lp is not None:
                    self._captures[b.name] = lp.capture
            for key, j in plan.judges.items():
                jp = (
                    job_outcome.phase(JUDGE_PHASE)
                    if j.job is not None and j.job.label == job_outcome.job.label
                    else None
                )
                if jp is not None:
                    self._judges[key] = jp.capture
            if "" in self._judges:
                self._captures.update(
                    dict.fromkeys((b.name for b in plan.fed(Fed.OWN_JUDGE)), self._judges[""])
                )
            for name, capture in self._captures.items():
                mine = plan.backends.get(name) or _REFERENCE
                for key in mine.judges:
                    judge = plan.judges.get(key)
                    if key not in self._judges or (key, name) in self._futures:
                        continue
                    if judge is None or judge.judged is None:
                        continue
                    order = _only(judge.judged.order, mine, key)
                    args = (name, capture, self._judges[key], judge.judged, order, self._modules)
                    self._futures[(key, name)] = self._pool.submit(
                        judge_backend, *args, mine.covers, mine.graph_words(), mine.unfused
                    )

    def take(self, key: str, name: str) -> LocalErrors | None:
        """The local errors judged ahead for (`key`, `name`), waited for, or None where none was started."""
        f = self._futures.pop((key, name), None)
        return f.result() if f is not None else None

    def close(self) -> None:
        """Stop judging ahead: wait for what runs, cancel what has not started."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def judge_all(
    spec: ModelSpec,
    plan: Plan,
    done: Mapping[str, JobOutcome],
    ref_capture: str,
    ex: Executor,
    early: Early | None = None,
) -> tuple[list[LocalErrors], ReorderCheck, dict[str, NodeStat]]:
    """Every backend's local errors against the float64 judge, the reference's own included (its
    capture is its severed run: it was fed its own values), the per-node floor against the
    allowances of the reference's grain, and each node's NodeStat there (conditioning)."""
    local = [LocalErrors(b.name, "not-measured", b.reason) for b in plan.fed(Fed.NOT_MEASURED)]
    modules = spec.modules()
    captures = {
        plan.reference: ref_capture,
        **{backend_judgment.name: backend_judgment.own_run for backend_judgment in plan.fed(Fed.OWN_VALUES)},
    }
    for b in plan.fed(Fed.SEVERED):
        job_outcome = done.get(b.local_job.label) if b.local_job is not None else None
        lp = job_outcome.phase(LOCAL_PHASE) if job_outcome is not None and job_outcome.ok else None
        if lp is None:
            why = job_outcome.reason if job_outcome is not None else "it did not run"
            local.append(LocalErrors(b.name, "not-measured", f"the severed model failed: {why}"))
            continue
        captures[b.name] = lp.capture
    captures.update(dict.fromkeys((b.name for b in plan.fed(Fed.OWN_JUDGE)), ""))  # each window's own capture
    ex.bar.grow(sum(window.steps for judge in plan.judges.values() for window in judge.windows))
    keys: dict[str, list[str]] = {}
    for name in captures:
        for key in (plan.backends.get(name) or _REFERENCE).judges:
            keys.setdefault(key, []).append(name)
    floor = _floor_check(plan, done)
    checks: list[ReorderCheck] = []
    stats: dict[str, NodeStat] = {}
    keys.setdefault("", [])  # the reference's grain is evaluated for conditioning all the same
    parts: dict[str, list[LocalErrors]] = {capture: [] for capture in captures}
    failed: dict[str, str] = {}
    for key, names in keys.items():
        judge = plan.judges.get(key)
        judged = judge.judged if judge is not None else None
        if judge is None or judged is None:
            why = (judge.unavailable if judge else "") or "the float64 evaluation of each node did not run"
            failed.update({name: failed.get(name, why) for name in names})
            continue
        broken = ""
        for capture, order, why in _evaluations(judge, judged, done, ex):
            if capture is None:  # the last one: the windows after it are skipped (the bar says so)
                broken = f"the float64 evaluation of each node failed: {why}"
                continue
            for n in names:
                got = early.take(key, n) if early is not None and judge.job is not None else None
                if got is None:  # not judged in the background: judged now
                    held = plan.backends.get(n) or _REFERENCE
                    args = (n, captures[n] or capture, capture, judged, _only(order, held, key), modules)
                    got = judge_backend(*args, held.covers, held.graph_words(), held.unfused)
                parts[n].append(got)
            if key == "":
                stats.update(node_stats(capture, judged, order))
            if key == "" and floor is not None and floor.status == "ok":
                checks.append(_reorder_part(plan, done, judged, capture, order))
        if broken:
            failed.update({name: failed.get(name, broken) for name in names})
        if key == "" and broken:
            floor = ReorderCheck("unavailable", "the float64 judge failed")
            stats.clear()
    local += [
        LocalErrors(capture, "not-measured", failed.get(capture) or "no window of its judge was judged")
        if capture in failed or not parts[capture]
        else _merged(parts[capture], (plan.backends.get(capture) or _REFERENCE).graph_order).mostly_unjudged()
        for capture in captures
    ]
    if floor is None:
        judge = plan.judges.get("")
        why = "no reduction to permute" if judge is not None else ""
        if plan.node_floor_job is None and judge is not None:
            why = _NO_CHECK
        return local, ReorderCheck("unavailable", why), stats
    return local, (_merged_check(checks, floor) if floor.status == "ok" else floor), stats


def _evaluations(
    judge: Judge, judged: Judged, done: Mapping[str, JobOutcome], ex: Executor
) -> Iterator[tuple[str | None, tuple[str, ...], str]]:
    """(capture, the judged tensors it holds, why it failed) of each evaluation of the judge: its
    one job's, or each window's, run now and its capture deleted once judged."""
    if judge.job is not None:
        whole = done.get(judge.job.label)
        jp = whole.phase(JUDGE_PHASE) if whole is not None and whole.ok else None
        yield (
            (jp.capture if jp else None),
            judged.order,
            (whole.reason if whole is not None else "it did not run"),
        )
        return
    with ex.shared(), ThreadPoolExecutor(1, thread_name_prefix="xbackend-window") as pool:
        ahead: Future[JobOutcome] | None = None
        for index, job in enumerate(judge.windows):
            started, ahead = ahead, None
            job_outcome = (
                started.result() if started is not None else None if ex.cancelled.is_set() else ex.run(job)
            )
            jp = job_outcome.phase(JUDGE_PHASE) if job_outcome is not None and job_outcome.ok else None
            rest = judge.windows[index + 1 :]
            if jp is not None and rest and not ex.cancelled.is_set():
                ahead = pool.submit(ex.run, rest[0])  # runs while this window is judged
            why = job_outcome.reason if job_outcome is not None else "interrupted"
            wanted = set(job.phases[0].tensors)
            try:
                yield (jp.capture if jp else None), tuple(t for t in judged.order if t in wanted), why
            finally:
                if job_outcome is not None:
                    job_outcome.drop_captures()
            if jp is None:  # the windows after it will not run: the bar says so
                for later in rest:
                    ex.skip(later)
                return


def _floor_check(plan: Plan, done: Mapping[str, JobOutcome]) -> ReorderCheck | None:
    """The per-node floor's state before any judging: None when there is none to check, else
    unavailable (its job failed) or ok (the check itself is made window by window)."""
    job, judge = plan.node_floor_job, plan.judges.get("")
    if job is None or judge is None or judge.judged is None or (judge.job is None and not judge.windows):
        return None
    fo = done.get(job.label)
    if fo is None or not fo.ok or fo.phase(NODE_FLOOR_PHASE) is None:
        return ReorderCheck("unavailable", fo.reason if fo is not None and not fo.ok else "it did not run")
    return ReorderCheck("ok", engine=job.backend, samples=len(job.phases[0].extra_feeds))


def _reorder_part(
    plan: Plan, done: Mapping[str, JobOutcome], judged: Judged, capture: str, order: Sequence[str]
) -> ReorderCheck:
    job = plan.node_floor_job
    assert job is not None
    phase = done[job.label].phase(NODE_FLOOR_PHASE)
    assert phase is not None
    spread = phase.extra_captures[0][0] if phase.extra_captures else None
    samples = len(job.phases[0].extra_feeds)
    return reorder_check(judged, capture, phase.capture, spread, samples, job.backend, order)


def _worst(parts: Sequence[LocalErrors] | Sequence[ReorderCheck]) -> tuple[float, str]:
    """The largest ratio over the windows and where, the first window's on a tie; -1 for none."""
    worst: tuple[float, str] = (-1.0, "")
    for part in parts:
        if part.largest_ratio is not None and part.largest_ratio > worst[0]:
            worst = (part.largest_ratio, part.largest_at)
    return worst


def _merged(parts: Sequence[LocalErrors], order: Sequence[str] | None = None) -> LocalErrors:
    """One backend's local errors over the judge's windows, in model order (`order`: its graph's,
    where it was judged on two judges)."""
    first = parts[0]
    worst = _worst(parts)
    origins = [origin for part in parts for origin in part.origins]
    nodes = [node for part in parts for node in part.nodes]
    if order is not None:
        rank = {t: index for index, t in enumerate(order)}
        origins.sort(key=lambda origin: rank.get(origin.tensor, len(rank)))
        nodes.sort(key=lambda node: rank.get(node.tensor, len(rank)))
    return LocalErrors(
        first.backend,
        "ok",
        origins=tuple(origins),
        compared=sum(part.compared for part in parts),
        largest_ratio=worst[0] if worst[0] >= 0 else None,
        largest_at=worst[1],
        nodes=tuple(nodes),
        graph=first.graph,
        flushed=sum(part.flushed for part in parts),
        flushed_at=next((part.flushed_at for part in parts if part.flushed_at), ""),
        unfused=first.unfused,
    )


def _merged_check(parts: Sequence[ReorderCheck], base: ReorderCheck) -> ReorderCheck:
    worst = _worst(parts)
    return ReorderCheck(
        "ok",
        engine=base.engine,
        samples=base.samples,
        largest_ratio=worst[0] if worst[0] >= 0 else 0.0,
        largest_at=worst[1],
        over=tuple(t for part in parts for t in part.over),
    )


# the reference, judged on its own grain's judge
_REFERENCE = BackendJudgment("", Fed.SEVERED)


def _only(order: tuple[str, ...], judgment: BackendJudgment, key: str) -> tuple[str, ...]:
    """The tensors of `order` a backend is judged at on judge `key`: on the reference grain's,
    only those its graph shares with the model."""
    if not judgment.shared or key != "":
        return order
    return tuple(t for t in order if t in judgment.shared)


def plan_rules(plan: Plan) -> tuple[tuple[str, str, str], ...]:
    """Each op's allowance and its source, as the judged models used them."""
    seen: dict[str, tuple[str, str, str]] = {}
    for judge in plan.judges.values():
        for node_bound in judge.judged.bounds.values() if judge.judged is not None else ():
            seen.setdefault(node_bound.op, (node_bound.op, node_bound.general(), node_bound.source))
    return tuple(seen[k] for k in sorted(seen))


def grain_of(backend: BackendResult) -> str:
    """The grain a backend of its own source exposes, as its runner says (torch: op or module)."""
    grain = dict(backend.info).get("grain", "")
    if grain.startswith("op"):
        return f"its aten calls, {grain[3:].strip('()')} (the model severed at the tensors they became)"
    why = f"; not at op grain: {grain[len('module (') : -1]}" if grain.startswith("module (") else ""
    return f"its modules (the model severed at the module outputs it exposes{why})"


def shapes_of(
    builds: Mapping[str, Builds], held: Mapping[str, tuple[str, tuple[int, ...]]]
) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape: the reference's, then any other live backend's per-layer capture
    for the tensors the reference does not hold (the permuted model needs each reduction's)."""
    shapes = {n: s for n, (_, s) in held.items()}
    for build in builds.values():
        layers = build.first.layers if build.ok and build.loaded is None else None
        if layers is None:
            continue
        with CaptureFile(layers.capture) as cap:
            for n, (_, s) in cap.tensors().items():
                shapes.setdefault(n, s)
    return shapes
