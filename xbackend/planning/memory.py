"""The memory plan: each backend's per-layer build planned to fit the budget, its exposed tensors
cut into windows (one session run each) where the engine holds only what it exposes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import psutil

from xbackend.errors import UsageError
from xbackend.execution.executor import Executor, Job
from xbackend.execution.progress import NullProgress
from xbackend.execution.protocol import Phase
from xbackend.files.run_values import CaptureFile
from xbackend.files.textfmt import gib
from xbackend.model.footprint import DEFAULT_SHARE, Sizes, available_memory, plan_windows, tensor_bytes
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.results import CompareOptions

__all__ = [
    "FITS",
    "JUDGE_COPIES",
    "OVERHEAD",
    "Fit",
    "MemoryPlan",
    "judge_peak",
    "measure_unsized",
    "memory_plan",
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
# a window's build also holds the results its later nodes still read: this many of the largest
# tensor besides the window's own
_LIVE = 2
_GiB = 2**30


@dataclass(frozen=True)
class Fit:
    """Whether planned work fits the memory or disk it may use; where it does not, `reason` says
    what does not fit and what to do."""

    fits: bool
    reason: str = ""

    @classmethod
    def no(cls, reason: str) -> Fit:
        """Work that does not fit, and why (with what to do)."""
        return cls(False, reason)


FITS = Fit(True)


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
        return _LIVE * max((siz for key, siz in self.sizes.items() if key in self.read), default=0)

    def describe(self) -> str:
        """The budget in words, and where it came from (--max-memory or a share of what is free)."""
        if self.budget is None:
            return "no memory budget (the OS does not say how much memory is available)"
        how = "--max-memory" if self.explicit else f"{DEFAULT_SHARE:.0%} of the memory available at the start"
        return f"{gib(self.budget)} per backend process ({how})"

    def windows(
        self, planned_backend: PlannedBackend, spec: ModelSpec, opts: CompareOptions
    ) -> tuple[tuple[str, ...], ...]:
        """`planned_backend`'s per-layer tensors cut into windows that fit (() for one); a UsageError
        that says what to do when even one window, or a backend that holds a whole run, cannot fit."""
        cls = planned_backend.cls
        if cls is None or self.budget is None:
            return ()
        held = int(cls.weight_copies * self.weights)
        room = self.budget - held - OVERHEAD
        tensors = spec.tensor_order()
        raise_it = self.raise_it()
        if room <= 0:
            raise UsageError(
                f"{planned_backend.name} holds the weights about {cls.weight_copies:g} times ({gib(held)}) "
                "and "
                f"needs about 1 GiB besides: more than the {self.describe()}; {raise_it}"
            )
        if not cls.windowed:
            counted = spec.all_tensors() if cls.holds_every_intermediate else tensors
            # refused on the tensors sized before running alone: never on a guess
            need = int(cls.value_width * self.sizes.sized(counted))
            if need > room:
                what = "every tensor of a run" if cls.holds_every_intermediate else "the tensors it exposes"
                raise UsageError(
                    f"{planned_backend.name} holds {what} at once (about {gib(need)}) besides its weights "
                    f"({gib(held)}): more than the {self.describe()}; {raise_it}, or leave "
                    f"{planned_backend.name} out of --backends (ort-cpu cuts its tensors into windows)"
                )
            return ()
        # the window's tensors as the engine holds them, and what its later nodes still read
        room = int(room / cls.value_width) - self.live
        if room <= 0:
            raise UsageError(
                f"{planned_backend.name} needs about {gib(int(self.live * cls.value_width))} for the tensors "
                "its "
                f"nodes read beside its weights ({gib(held)}): more than the {self.describe()}; {raise_it}"
            )
        for output_name in spec.output_names:  # an output is always compared: --tensors cannot leave it out
            if self.sizes.get(output_name, 0) > room:
                raise UsageError(
                    f"graph output {output_name} alone takes {gib(self.sizes[output_name])}, more than the "
                    f"{gib(room)} "
                    f"--max-memory leaves {planned_backend.name} for one window's tensors; {raise_it}"
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
            except UsageError as error:
                refused[p.name] = str(error)
        runnable = [planned_backend for planned_backend in planned if planned_backend.cls is not None]
        if refused and len(refused) == len(runnable):
            raise UsageError(refused[runnable[0].name])
        out = [
            replace(
                planned_backend,
                cls=None,
                unavailable=f"it does not fit the memory budget: {refused[planned_backend.name]}",
            )
            if planned_backend.name in refused
            else planned_backend
            for planned_backend in planned
        ]
        return out, windows

    def planned_bytes(
        self,
        planned_backend: PlannedBackend,
        spec: ModelSpec,
        opts: CompareOptions,
        windows: Sequence[Sequence[str]],
        feeds: int,
    ) -> int:
        """What `planned_backend`'s largest build holds beyond its engine loaded: the weights as it
        holds them, its feeds, the tensors it exposes at once (a window's, where cut) as it holds them, with
        what its later nodes still read where it does not expose every tensor, and a build's own
        (Runner.build_bytes)."""
        cls = planned_backend.cls
        if cls is None:
            return 0
        exposed = spec.output_names if spec.outputs_only else spec.tensor_order()
        held = max((self.sizes.sized(window) for window in windows), default=self.sizes.sized(exposed))
        live = self.live if (windows or spec.outputs_only) else 0
        return int(
            cls.weight_copies * self.weights + cls.value_width * (held + live) + feeds + cls.build_bytes
        )

    def run_bytes(self, spec: ModelSpec) -> int:
        """Every tensor of one run, those sized before running (no guess)."""
        return self.sizes.sized(spec.all_tensors())

    def raise_it(self) -> str:
        """What a user does to give a backend more memory."""
        return "raise --max-memory" if self.explicit else "free memory, or set --max-memory higher"


def judge_peak(run: int, weights: int, budget: int | None) -> int:
    """The float64 judge's planned peak: whole (JUDGE_COPIES runs of activations) where that
    fits the budget, else the budget its windows are cut to fill."""
    whole = JUDGE_COPIES * run + 2 * weights + OVERHEAD
    return whole if budget is None or whole <= budget else budget


# each lane holds the model's weights about this many times over (the float64 judge: twice, and
# its magnitudes; the floor engine: once, and its permuted copy), and a run's activations as the
# float64 judge does (the largest of its jobs)
_LANE_COPIES = 6


def side_by_side(ctx: RunContext, lanes: int, processes: int = 0) -> bool:
    """Whether `lanes` worker processes may run at once, a physical core each, with the memory
    for `processes` of them (at least `lanes`: work beside them may hold more); --max-memory is
    a per-process budget: then one at a time."""
    cores = psutil.cpu_count(logical=False) or 1
    judge = judge_peak(ctx.run_bytes, ctx.spec.weight_bytes, ctx.budget)
    held = max(lanes, processes) * (_LANE_COPIES * ctx.spec.weight_bytes + judge)
    return cores >= lanes and held < psutil.virtual_memory().available // 2 and ctx.opts.max_memory is None


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
    shapes = {key: array.shape for key, array in feeds.arrays.items() if isinstance(array, np.ndarray)}
    weights = spec.weight_bytes
    sizes = tensor_bytes(proto, shapes, budget if quick else None) if budget is not None else Sizes({})
    weights_read = {initializer.name for initializer in proto.graph.initializer}
    read = frozenset(
        input_name
        for node in proto.graph.node
        for input_name in node.input
        if input_name and input_name not in weights_read
    )
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
        (
            planned_backend
            for planned_backend in planned
            if planned_backend.cls is not None
            and planned_backend.cls.windowed
            and planned_backend.interpreter is None
        ),
        None,
    )
    if not sizes.unsized or sizes.bounded or plan.budget is None or engine is None or engine.cls is None:
        return plan
    ex = Executor(spec, work / "sizing", timeout, NullProgress())
    phase = Phase.planned("sizing", sizes.unsized, 1)
    job_outcome = ex.run(Job("sizing", engine.name, engine.cls, engine.variant(), feeds, (phase,)))
    ph = job_outcome.phase("sizing") if job_outcome.ok else None
    if ph is None:
        return replace(plan, sizes=replace(sizes, unmeasured=f"{engine.name}: {job_outcome.reason}"))
    with CaptureFile(ph.capture) as cap:
        got = {
            n: int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for n, (d, s) in cap.tensors().items()
        }
    job_outcome.drop_captures()
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
    total = sum(plan.sizes.get(tensor, 0) for tensor in tensors)
    largest = max(sum(plan.sizes.get(t, 0) for t in window) for window in windows)
    return (
        f"{name}: its {len(tensors)} per-layer tensors ({gib(total)} per run) were exposed in "
        f"{len(windows)} windows of at most {gib(largest)}, each its own build and session runs, "
        f"to stay within {plan.describe()}; every tensor was still compared"
    )
