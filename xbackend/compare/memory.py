"""--max-memory: each backend's per-layer build planned to fit the budget, its exposed tensors
cut into windows (one session run each) where the engine holds only what it exposes."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import psutil

from xbackend.compare.builds import Builds
from xbackend.errors import UsageError
from xbackend.execution.executor import Executor, Job
from xbackend.execution.progress import NullProgress
from xbackend.execution.protocol import Phase
from xbackend.files.run_values import CaptureFile
from xbackend.files.textfmt import gib
from xbackend.model.footprint import DEFAULT_SHARE, Sizes, available_memory, plan_windows, tensor_bytes
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec
from xbackend.probes.base import PlannedBackend, ProbeContext
from xbackend.results import CompareOptions

__all__ = [
    "FLOOR_RUNS",
    "JUDGE_COPIES",
    "NODE_FLOOR_RUNS",
    "OVERHEAD",
    "MemoryPlan",
    "explanation_disk",
    "explanation_room",
    "judge_peak",
    "judge_window_note",
    "judge_windows",
    "measure_unsized",
    "memory_plan",
    "severed_plan",
    "severed_window_note",
    "severed_windows",
    "side_by_side",
    "sizing_note",
    "window_note",
]

# a worker's interpreter, engine libraries and a build's own, beyond weights and tensors (measured
# at the peak on a 1 MB model: 70 MiB for ONNX Runtime and onnx's evaluator, 100 MiB for
# OpenVINO; torch's libraries take about 400 MiB)
OVERHEAD = 2**29
# the float64 judge's peak in units of one run's float32 activations (measured: 8.5 on a GPT-2
# at sequence 256 - values and magnitudes in float64, the severed inputs, the evaluator's own)
JUDGE_COPIES = 9
# the explanation's severed builds hold about this many runs of activations: the per-node floor
# its feeds, its first order's run, the spread and the order running (measured 3.25 on GPT-2 small
# at sequence 1024); the oracle's severed run, its feeds widened to float64 and its float64 values
# (2.9)
SEVERED_COPIES = 3.25
# cut into windows, the judge holds the whole run's feeds (as captured) and about this many times
# its window's float64 tensors: values and magnitudes, their operands widened, a node's temporaries
JUDGE_WINDOW_COPIES = 3
# a window's build also holds the results its later nodes still read: this many of the largest
# tensor besides the window's own
_LIVE = 2
_GiB = 2**30


@dataclass(frozen=True)
class MemoryPlan:
    """The budget and what one run of the model weighs, sized from the graph and the feeds."""

    budget: int | None  # bytes a backend's process may use; None: the OS does not say what is free
    explicit: bool  # --max-memory given (else a share of the memory available at the start)
    weights: int  # bytes of the model's weights, as stored
    sizes: Sizes = field(repr=False)  # tensor -> bytes, where shape inference knew
    read: frozenset[str] = field(default=frozenset(), repr=False)  # tensors some node reads

    @property
    def live(self) -> int:
        """What a build holds for its later nodes beside the tensors it exposes: _LIVE of the
        largest tensor a node reads (a graph output no node reads is held only when exposed)."""
        return _LIVE * max((n for t, n in self.sizes.items() if t in self.read), default=0)

    def describe(self) -> str:
        if self.budget is None:
            return "no memory budget (the OS does not say how much memory is available)"
        how = "--max-memory" if self.explicit else f"{DEFAULT_SHARE:.0%} of the memory available at the start"
        return f"{gib(self.budget)} per backend process ({how})"

    def windows(
        self, p: PlannedBackend, spec: ModelSpec, opts: CompareOptions
    ) -> tuple[tuple[str, ...], ...]:
        """`p`'s per-layer tensors cut into windows that fit (() for one); a UsageError that says
        what to do when even one window, or a backend that holds a whole run, cannot fit."""
        cls = p.cls
        if cls is None or self.budget is None:
            return ()
        held = int(cls.weight_copies * self.weights)
        room = self.budget - held - OVERHEAD
        tensors = spec.tensor_order()
        raise_it = self._raise_it()
        if room <= 0:
            raise UsageError(
                f"{p.name} holds the weights about {cls.weight_copies:g} times ({gib(held)}) and "
                f"needs about 1 GiB besides: more than the {self.describe()}; {raise_it}"
            )
        if not cls.windowed:
            counted = spec.all_tensors() if cls.holds_every_intermediate else tensors
            # refused on the tensors sized before running alone: never on a guess
            need = int(cls.value_width * self.sizes.sized(counted))
            if need > room:
                what = "every tensor of a run" if cls.holds_every_intermediate else "the tensors it exposes"
                raise UsageError(
                    f"{p.name} holds {what} at once (about {gib(need)}) besides its weights "
                    f"({gib(held)}): more than the {self.describe()}; {raise_it}, or leave "
                    f"{p.name} out of --backends (ort-cpu cuts its tensors into windows)"
                )
            return ()
        # the window's tensors as the engine holds them, and what its later nodes still read
        room = int(room / cls.value_width) - self.live
        if room <= 0:
            raise UsageError(
                f"{p.name} needs about {gib(int(self.live * cls.value_width))} for the tensors its "
                f"nodes read beside its weights ({gib(held)}): more than the {self.describe()}; {raise_it}"
            )
        for t in spec.output_names:  # an output is always compared: --tensors cannot leave it out
            if self.sizes.get(t, 0) > room:
                raise UsageError(
                    f"graph output {t} alone takes {gib(self.sizes[t])}, more than the {gib(room)} "
                    f"--max-memory leaves {p.name} for one window's tensors; {raise_it}"
                )
        plan = plan_windows(
            tensors,
            self.sizes,
            room,
            f"{raise_it}, or leave that tensor out with --tensors (e.g. --tensors modules)",
        )
        return plan.windows if len(plan.windows) > 1 else ()

    def plan_all(
        self, planned: Sequence[PlannedBackend], spec: ModelSpec, opts: CompareOptions
    ) -> tuple[list[PlannedBackend], dict[str, tuple[tuple[str, ...], ...]]]:
        """Each backend's windows; a backend that cannot fit the budget is unavailable, with the
        reason, and the others run; a UsageError when none of them can."""
        windows: dict[str, tuple[tuple[str, ...], ...]] = {}
        refused: dict[str, str] = {}
        for p in planned:
            try:
                windows[p.name] = () if spec.outputs_only else self.windows(p, spec, opts)
            except UsageError as e:
                refused[p.name] = str(e)
        runnable = [p for p in planned if p.cls is not None]
        if refused and len(refused) == len(runnable):
            raise UsageError(refused[runnable[0].name])
        out = [
            replace(p, cls=None, unavailable=f"it does not fit the memory budget: {refused[p.name]}")
            if p.name in refused
            else p
            for p in planned
        ]
        return out, windows

    def planned_bytes(
        self,
        p: PlannedBackend,
        spec: ModelSpec,
        opts: CompareOptions,
        windows: Sequence[Sequence[str]],
        feeds: int,
    ) -> int:
        """What `p`'s largest build holds beyond its engine loaded: the weights as it holds them,
        its feeds, the tensors it exposes at once (a window's, where cut) as it holds them, with
        what its later nodes still read where it does not expose every tensor, and a build's own
        (Runner.build_bytes)."""
        cls = p.cls
        if cls is None:
            return 0
        exposed = spec.output_names if spec.outputs_only else spec.tensor_order()
        held = max((self.sizes.sized(w) for w in windows), default=self.sizes.sized(exposed))
        live = self.live if (windows or spec.outputs_only) else 0
        return int(
            cls.weight_copies * self.weights + cls.value_width * (held + live) + feeds + cls.build_bytes
        )

    def run_bytes(self, spec: ModelSpec) -> int:
        """Every tensor of one run, those sized before running (no guess)."""
        return self.sizes.sized(spec.all_tensors())

    def explanation_blocker(self, spec: ModelSpec, floors: bool = False) -> str:
        """Why the explanation's builds cannot run within the budget ('' when they can): the
        severed model takes every tensor of a run in and gives every one out, a window of them at
        a time where they do not fit (the per-node floor, asked for with `floors`, all at once);
        the float64 judge, cut into windows where it must, holds the run's feeds and a window's
        tensors in float64 with their magnitudes (the largest tensor alone at least)."""
        if self.budget is None:
            return ""
        run = self.run_bytes(spec)
        largest = 2 * max((self.sizes.get(t, 0) for t in spec.all_tensors()), default=0)  # float64
        severed = int(SEVERED_COPIES * run)
        windowed = run + int((SEVERED_COPIES - 1) * largest / 2)
        if floors and severed + 2 * self.weights + OVERHEAD > self.budget:
            what = (
                f"its per-node floor (--noise-samples) holds every tensor of a run about "
                f"{SEVERED_COPIES:g} times (about {gib(severed)}) beside the weights"
            )
        elif windowed + 2 * self.weights + OVERHEAD > self.budget:
            what = (
                f"its severed builds hold a run's feeds and, window by window, at least its largest "
                f"tensor (about {gib(windowed)}) beside the weights"
            )
        elif run + 2 * JUDGE_WINDOW_COPIES * largest + 2 * self.weights + OVERHEAD > self.budget:
            what = (
                "its float64 judge holds the run's feeds and, node by node, the largest tensor in "
                f"float64 with its magnitude (about {gib(run + 2 * JUDGE_WINDOW_COPIES * largest)})"
            )
        else:
            return ""
        fix = f"{self._raise_it()}, or give the inputs smaller shapes (--shape)"
        return f"{what}, more than the {self.describe()}; {fix}"

    def _raise_it(self) -> str:
        return "raise --max-memory" if self.explicit else "free memory, or set --max-memory higher"


def severed_windows(
    tensors: Sequence[str], sizes: Mapping[str, int], run: int, weights: int, budget: int | None
) -> tuple[tuple[str, ...], ...]:
    """A severed run's tensors cut into windows, each its own build, where the whole run does not
    fit the budget (() for one): a build holds the run's feeds (the reference's values), the
    weights, and its window's tensors as the engine and the worker hold them. UsageError where
    one tensor alone does not fit."""
    if budget is None or SEVERED_COPIES * run + 2 * weights + OVERHEAD <= budget:
        return ()
    room = int((budget - run - 2 * weights - OVERHEAD) / (SEVERED_COPIES - 1))
    what = "raise --max-memory, free memory, or give the inputs smaller shapes (--shape)"
    cut = plan_windows(list(tensors), sizes, max(room, 1), what).windows
    return cut if len(cut) > 1 else ()  # its tensors fit beside the feeds: one build


def severed_plan(
    ctx: ProbeContext,
    windowed: bool,
    tensors: Sequence[str],
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, str],
) -> tuple[tuple[tuple[str, ...], ...], str]:
    """A backend's severed run: its windows (() for one), or why it cannot run within the budget
    (`windowed`: its engine allocates only the tensors a build exposes)."""
    sizes = {
        t: int(np.prod(shapes[t], dtype=np.int64)) * np.dtype(dtypes.get(t, "float32")).itemsize
        for t in tensors
        if t in shapes
    }
    try:
        cut = severed_windows(tensors, sizes, ctx.run_bytes, ctx.spec.weight_bytes, ctx.budget)
    except UsageError as e:
        return (), f"its severed run does not fit: {e}"
    if cut and not windowed:
        need = gib(int(SEVERED_COPIES * ctx.run_bytes))
        return (), (
            f"its severed run holds every tensor of a run at once (about {need}), more than the "
            f"{gib(ctx.budget or 0)} each process may use, and its engine cannot expose them a "
            "window at a time"
        )
    return cut, ""


def judge_peak(run: int, weights: int, budget: int | None) -> int:
    """The float64 judge's planned peak: whole (JUDGE_COPIES runs of activations) where that
    fits the budget, else the budget its windows are cut to fill."""
    whole = JUDGE_COPIES * run + 2 * weights + OVERHEAD
    return whole if budget is None or whole <= budget else budget


def judge_windows(
    groups: Sequence[Sequence[str]],
    shapes: Mapping[str, tuple[int, ...]],
    prefixes: Sequence[str],
    run: int,
    weights: int,
    budget: int | None,
    disk: int | None = None,
) -> tuple[tuple[str, ...], ...]:
    """The judged model's tensors, node by node (`groups`: a node's value, magnitude and what it
    inherits, never split), cut into windows whose float64 values fit the budget beside the run's
    feeds, and whose capture fits `disk` bytes (() for one window: the whole judge fits). Sizes
    are the captured shapes, never a guess: a tensor named `prefix + name` has `name`'s shape;
    one with no shape counts as the largest (the severed graph's own, which the capture does not
    hold)."""
    rooms = [disk] if disk is not None else []
    if budget is not None and judge_peak(run, weights, budget) >= budget:  # whole, it does not fit
        rooms.append((budget - run - 2 * weights - OVERHEAD) // JUDGE_WINDOW_COPIES)
    if not rooms:
        return ()
    room = min(rooms)

    def base(t: str) -> str:
        return next((t[len(p) :] for p in prefixes if t.startswith(p)), t)

    sizes = {
        t: 8 * int(np.prod(shapes[base(t)], dtype=np.int64)) for g in groups for t in g if base(t) in shapes
    }
    largest = max(sizes.values(), default=0)
    # each node one item of its tensors' bytes: windows never split a node
    nodes = {g[0]: sum(sizes.get(t, largest) for t in g) for g in groups}
    if sum(nodes.values()) <= room:
        return ()
    what = (
        "raise --max-memory, set TMPDIR to a folder on a larger disk, or give the inputs smaller "
        "shapes (--shape)"
    )
    members = {g[0]: tuple(g) for g in groups}
    cut = plan_windows([g[0] for g in groups], nodes, max(room, 1), what).windows
    return tuple(tuple(t for n in w for t in members[n]) for w in cut)


# each lane holds the model's weights about this many times over (the float64 judge: twice, and
# its magnitudes; the floor engine: once, and its permuted copy), and a run's activations as the
# float64 judge does (the largest of its jobs)
_LANE_COPIES = 6


def side_by_side(ctx: ProbeContext, lanes: int, processes: int = 0) -> bool:
    """Whether `lanes` worker processes may run at once, a physical core each, with the memory
    for `processes` of them (at least `lanes`: work beside them may hold more); --max-memory is
    a per-process budget: then one at a time."""
    cores = psutil.cpu_count(logical=False) or 1
    judge = judge_peak(ctx.run_bytes, ctx.spec.weight_bytes, ctx.budget)
    held = max(lanes, processes) * (_LANE_COPIES * ctx.spec.weight_bytes + judge)
    return cores >= lanes and held < psutil.virtual_memory().available // 2 and ctx.opts.max_memory is None


# the explanation's files, in runs of activations: the severed feeds (1); per backend compared,
# its severed run (1); where they run, the floor's run and spread (2, deleted once it ends) and
# the per-node floor's feeds, run and spread (3); each float64 judge's values and magnitudes (4),
# one for the reference's grain and at most one per backend (its own graph)
FLOOR_RUNS = 2
NODE_FLOOR_RUNS = 3
_JUDGE_RUNS = 4


def explanation_disk(folder: Path, run: int, backends: int, floors: int = 0) -> tuple[str, int | None]:
    """Why the explanation's files would not fit on the disk that holds `folder` ('' if they do),
    and the bytes each float64 judge may write at once (None: whole, beside the rest): where the
    judges' whole captures would not fit, each is cut into windows, judged and deleted in turn.
    `floors`: the runs of activations the floors write (0 where none runs)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "", None
    base = run * (1 + backends + floors)
    judges = _JUDGE_RUNS * run * (1 + backends)
    if base + judges <= free:
        return "", None
    # a third of what is left: a judge's window, the next one running while it is judged, and
    # another judge's whole capture
    room = (free - base) // 3
    if room >= run // 2:
        return "", room
    return (
        f"its files would take at least {gib(base + run)} on the disk that holds {folder.parent} "
        f"({gib(free)} free); set TMPDIR to a folder on a larger disk, or give the inputs smaller "
        "shapes (--shape)"
    ), None


def explanation_room(ctx: ProbeContext, others: Sequence[Builds]) -> tuple[str, int | None]:
    """explanation_disk for the backends judged against the reference (`others`), with the floors
    where they will run: asked for (--noise-samples K: the floor and the per-node floor), or for a
    backend the float64 judge cannot judge (a loaded capture, a runner of its own source)."""
    unjudged = any(
        b.loaded is not None
        or b.planned.cls is None
        or not (b.planned.cls.executes_graph or b.planned.cls.severs_by_feeds)
        for b in others
    )
    floors = FLOOR_RUNS + NODE_FLOOR_RUNS if ctx.opts.noise_samples else FLOOR_RUNS if unjudged else 0
    return explanation_disk(ctx.work, ctx.run_bytes, len(others), floors=floors)


def severed_window_note(name: str, windows: Sequence[Sequence[str]], budget: int) -> str:
    """What the report says of a backend's severed run cut into windows to fit the budget."""
    return (
        f"{name}'s severed run exposed its {sum(map(len, windows))} tensors in {len(windows)} windows, "
        f"each its own build fed the whole run, to stay within {gib(budget)} per process; every "
        "node was still judged"
    )


def judge_window_note(graph: str, windows: Sequence[Sequence[str]], budget: int, disk: int | None) -> str:
    """What the report says of a float64 judge cut into windows to fit the budget and the disk."""
    within = [f"{gib(budget)} per process"] + (
        [f"{gib(disk)} of files at a time"] if disk is not None else []
    )
    return (
        f"the float64 judge of {graph} evaluated its {sum(map(len, windows))} tensors in "
        f"{len(windows)} windows, each its own evaluation judged and deleted in turn, to stay "
        f"within {' and '.join(within)}; every node was still judged"
    )


def memory_plan(
    spec: ModelSpec, proto: onnx.ModelProto, feeds: Feeds, opts: CompareOptions, quick: bool = False
) -> MemoryPlan:
    """Sizes from shape inference with the feeds' shapes; the budget from --max-memory or the
    memory available now (`quick`: the quick table's, sized no further than the budget asks)."""
    explicit = opts.max_memory is not None
    if explicit:
        budget: int | None = opts.max_memory
    else:
        free = available_memory()
        budget = int(free * DEFAULT_SHARE) if free else None
    shapes = {k: v.shape for k, v in feeds.arrays.items() if isinstance(v, np.ndarray)}
    weights = spec.weight_bytes
    sizes = tensor_bytes(proto, shapes, budget if quick else None) if budget is not None else Sizes({})
    weights_read = {t.name for t in proto.graph.initializer}
    read = frozenset(i for n in proto.graph.node for i in n.input if i and i not in weights_read)
    return MemoryPlan(budget, explicit, weights, sizes, read)


def measure_unsized(
    plan: MemoryPlan,
    spec: ModelSpec,
    planned: Sequence[PlannedBackend],
    work: Path,
    feeds: Path,
    timeout: float,
) -> MemoryPlan:
    """The tensors shape inference could not size, sized by running the model once on a backend
    that holds only what it exposes (ort-cpu, the reference), exposing those alone: the plan is
    made from what was measured, not from a guess. A failed run leaves them counted at the
    largest sized tensor, and the report says why."""
    sizes = plan.sizes
    engine = next(
        (p for p in planned if p.cls is not None and p.cls.windowed and p.interpreter is None), None
    )
    if not sizes.unsized or sizes.bounded or plan.budget is None or engine is None or engine.cls is None:
        return plan
    ex = Executor(spec, work / "sizing", timeout, NullProgress())
    phase = Phase.planned("sizing", sizes.unsized, 1)
    o = ex.run(Job("sizing", engine.name, engine.cls, engine.variant(), feeds, (phase,)))
    ph = o.phase("sizing") if o.ok else None
    if ph is None:
        return replace(plan, sizes=replace(sizes, unmeasured=f"{engine.name}: {o.reason}"))
    with CaptureFile(ph.capture) as cap:
        got = {
            n: int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for n, (d, s) in cap.tensors().items()
        }
    o.drop_captures()
    return replace(plan, sizes=sizes.with_measured(got, engine.name))


def sizing_note(plan: MemoryPlan) -> str:
    """What the report says when some tensors could not be sized before running ('' if none)."""
    if not plan.sizes.unsized and not plan.sizes.measured:
        return ""
    return f"memory plan: {plan.sizes.describe()}"


def window_note(
    name: str, windows: tuple[tuple[str, ...], ...], spec: ModelSpec, opts: CompareOptions, plan: MemoryPlan
) -> str:
    """What the report says about a backend whose tensors were exposed in windows, and why."""
    tensors = spec.tensor_order()
    total = sum(plan.sizes.get(t, 0) for t in tensors)
    largest = max(sum(plan.sizes.get(t, 0) for t in w) for w in windows)
    return (
        f"{name}: its {len(tensors)} per-layer tensors ({gib(total)} per run) were exposed in "
        f"{len(windows)} windows of at most {gib(largest)}, each its own build and session runs, "
        f"to stay within {plan.describe()}; every tensor was still compared"
    )
