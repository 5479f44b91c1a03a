"""The explanation's room: its severed builds and float64 judges planned to fit the memory each
process may use and the disk that holds the run, cut into windows where they must be; each answer
is a typed Fit (why not, and what to do, where it does not)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xbackend.errors import UsageError
from xbackend.files.textfmt import gib
from xbackend.model.footprint import plan_windows
from xbackend.model.load import ModelSpec
from xbackend.planning.builds import Builds
from xbackend.planning.context import RunContext
from xbackend.planning.memory import FITS, OVERHEAD, Fit, MemoryPlan, judge_peak

__all__ = [
    "FLOOR_RUNS",
    "JUDGE_WINDOW_COPIES",
    "NODE_FLOOR_RUNS",
    "SEVERED_COPIES",
    "DiskPlan",
    "SeveredPlan",
    "explanation_disk",
    "explanation_fit",
    "explanation_room",
    "judge_window_note",
    "judge_windows",
    "severed_plan",
    "severed_window_note",
    "severed_windows",
]

# the explanation's severed builds hold about this many runs of activations: the per-node floor
# its feeds, its first order's run, the spread and the order running (measured 3.25 on GPT-2 small
# at sequence 1024); the oracle's severed run, its feeds widened to float64 and its float64 values
# (2.9)
SEVERED_COPIES = 3.25
# cut into windows, the judge holds the whole run's feeds (as captured) and about this many times
# its window's float64 tensors: values and magnitudes, their operands widened, a node's temporaries
JUDGE_WINDOW_COPIES = 3


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


@dataclass(frozen=True)
class SeveredPlan:
    """A backend's severed run as planned: its windows (() for one build), and whether it fits."""

    windows: tuple[tuple[str, ...], ...]
    fit: Fit


def severed_plan(
    ctx: RunContext,
    windowed: bool,
    tensors: Sequence[str],
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, str],
) -> SeveredPlan:
    """A backend's severed run: its windows (() for one), or why it cannot run within the budget
    (`windowed`: its engine allocates only the tensors a build exposes)."""
    sizes = {
        tensor: int(np.prod(shapes[tensor], dtype=np.int64))
        * np.dtype(dtypes.get(tensor, "float32")).itemsize
        for tensor in tensors
        if tensor in shapes
    }
    try:
        cut = severed_windows(tensors, sizes, ctx.run_bytes, ctx.spec.weight_bytes, ctx.budget)
    except UsageError as error:
        return SeveredPlan((), Fit.no(f"its severed run does not fit: {error}"))
    if cut and not windowed:
        need = gib(int(SEVERED_COPIES * ctx.run_bytes))
        return SeveredPlan(
            (),
            Fit.no(
                f"its severed run holds every tensor of a run at once (about {need}), more than the "
                f"{gib(ctx.budget or 0)} each process may use, and its engine cannot expose them a "
                "window at a time"
            ),
        )
    return SeveredPlan(cut, FITS)


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
        return next((t[len(prefixe) :] for prefixe in prefixes if t.startswith(prefixe)), t)

    sizes = {
        t: 8 * int(np.prod(shapes[base(t)], dtype=np.int64))
        for group in groups
        for t in group
        if base(t) in shapes
    }
    largest = max(sizes.values(), default=0)
    # each node one item of its tensors' bytes: windows never split a node
    nodes = {group[0]: sum(sizes.get(t, largest) for t in group) for group in groups}
    if sum(nodes.values()) <= room:
        return ()
    what = (
        "raise --max-memory, set TMPDIR to a folder on a larger disk, or give the inputs smaller "
        "shapes (--shape)"
    )
    members = {group[0]: tuple(group) for group in groups}
    cut = plan_windows([group[0] for group in groups], nodes, max(room, 1), what).windows
    return tuple(tuple(t for n in w for t in members[n]) for w in cut)


# the explanation's files, in runs of activations: the severed feeds (1); per backend compared,
# its severed run (1); where they run, the floor's run and spread (2, deleted once it ends) and
# the per-node floor's feeds, run and spread (3); each float64 judge's values and magnitudes (4),
# one for the reference's grain and at most one per backend (its own graph)
FLOOR_RUNS = 2
NODE_FLOOR_RUNS = 3
_JUDGE_RUNS = 4


@dataclass(frozen=True)
class DiskPlan:
    """The explanation's files on the disk that holds the run: whether they fit, and the bytes
    each float64 judge may write at once (None: whole, beside the rest)."""

    fit: Fit
    judge_disk: int | None = None


def explanation_disk(folder: Path, run: int, backends: int, floors: int = 0) -> DiskPlan:
    """Whether the explanation's files fit on the disk that holds `folder`, and the bytes each
    float64 judge may write at once: where the judges' whole captures would not fit, each is cut
    into windows, judged and deleted in turn. `floors`: the runs of activations the floors write
    (0 where none runs)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return DiskPlan(FITS)
    base = run * (1 + backends + floors)
    judges = _JUDGE_RUNS * run * (1 + backends)
    if base + judges <= free:
        return DiskPlan(FITS)
    # a third of what is left: a judge's window, the next one running while it is judged, and
    # another judge's whole capture
    room = (free - base) // 3
    if room >= run // 2:
        return DiskPlan(FITS, room)
    return DiskPlan(
        Fit.no(
            f"its files would take at least {gib(base + run)} on the disk that holds {folder.parent} "
            f"({gib(free)} free); set TMPDIR to a folder on a larger disk, or give the inputs smaller "
            "shapes (--shape)"
        )
    )


def explanation_room(ctx: RunContext, others: Sequence[Builds]) -> DiskPlan:
    """explanation_disk for the backends judged against the reference (`others`), with the floors
    where they will run: asked for (--noise-samples K: the floor and the per-node floor), or for a
    backend the float64 judge cannot judge (a loaded capture, a runner of its own source)."""
    unjudged = any(
        other.loaded is not None
        or other.planned.cls is None
        or not (other.planned.cls.executes_graph or other.planned.cls.severs_by_feeds)
        for other in others
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


def explanation_fit(plan: MemoryPlan, spec: ModelSpec, floors: bool = False) -> Fit:
    """Whether the explanation's builds can run within the plan's budget: the
    severed model takes every tensor of a run in and gives every one out, a window of them at
    a time where they do not fit (the per-node floor, asked for with `floors`, all at once);
    the float64 judge, cut into windows where it must, holds the run's feeds and a window's
    tensors in float64 with their magnitudes (the largest tensor alone at least)."""
    if plan.budget is None:
        return FITS
    run = plan.run_bytes(spec)
    largest = 2 * max((plan.sizes.get(tensor, 0) for tensor in spec.all_tensors()), default=0)  # float64
    severed = int(SEVERED_COPIES * run)
    windowed = run + int((SEVERED_COPIES - 1) * largest / 2)
    if floors and severed + 2 * plan.weights + OVERHEAD > plan.budget:
        what = (
            f"its per-node floor (--noise-samples) holds every tensor of a run about "
            f"{SEVERED_COPIES:g} times (about {gib(severed)}) beside the weights"
        )
    elif windowed + 2 * plan.weights + OVERHEAD > plan.budget:
        what = (
            f"its severed builds hold a run's feeds and, window by window, at least its largest "
            f"tensor (about {gib(windowed)}) beside the weights"
        )
    elif run + 2 * JUDGE_WINDOW_COPIES * largest + 2 * plan.weights + OVERHEAD > plan.budget:
        what = (
            "its float64 judge holds the run's feeds and, node by node, the largest tensor in "
            f"float64 with its magnitude (about {gib(run + 2 * JUDGE_WINDOW_COPIES * largest)})"
        )
    else:
        return FITS
    fix = f"{plan.raise_it()}, or give the inputs smaller shapes (--shape)"
    return Fit.no(f"{what}, more than the {plan.describe()}; {fix}")
