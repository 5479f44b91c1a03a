"""--max-memory: each backend's per-layer build planned to fit the budget, its exposed tensors
cut into windows (one session run each) where the engine holds only what it exposes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from xbackend.errors import UsageError
from xbackend.footprint import DEFAULT_SHARE, Sizes, available_memory, plan_windows, tensor_bytes
from xbackend.inputs import Feeds
from xbackend.model import ModelSpec
from xbackend.probes.base import PlannedBackend
from xbackend.results import CompareOptions
from xbackend.textfmt import gib

__all__ = ["JUDGE_COPIES", "OVERHEAD", "MemoryPlan", "memory_plan", "sizing_note", "window_note"]

OVERHEAD = 2**30  # a worker's interpreter, engine libraries and arenas, beyond weights and tensors
# the float64 judge's peak in units of one run's float32 activations (measured: 8.5 on a GPT-2
# at sequence 256 - values and magnitudes in float64, the severed inputs, the evaluator's own)
JUDGE_COPIES = 9
_GiB = 2**30


@dataclass(frozen=True)
class MemoryPlan:
    """The budget and what one run of the model weighs, sized from the graph and the feeds."""

    budget: int | None  # bytes a backend's process may use; None: the OS does not say what is free
    explicit: bool  # --max-memory given (else a share of the memory available at the start)
    weights: int  # bytes of the model's weights, as stored
    sizes: Sizes = field(repr=False)  # tensor -> bytes, where shape inference knew

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
        tensors = spec.tensor_order(opts.outputs_only)
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
        plan = plan_windows(
            tensors,
            self.sizes,
            room,
            f"{raise_it}, or leave that tensor out with --tensors (e.g. --tensors modules)",
        )
        return plan.windows if len(plan.windows) > 1 else ()

    def run_bytes(self, spec: ModelSpec) -> int:
        """Every tensor of one run, those sized before running (no guess)."""
        return self.sizes.sized(spec.all_tensors())

    def explanation_blocker(self, spec: ModelSpec) -> str:
        """Why the explanation's builds cannot run within the budget ('' when they can): the
        severed model takes every tensor of a run in and gives every one out, and the float64
        judge holds each in float64 with its operands' magnitudes (JUDGE_COPIES)."""
        if self.budget is None:
            return ""
        run = self.run_bytes(spec)
        if 2 * run + 2 * self.weights + OVERHEAD > self.budget:
            what = f"its builds hold every tensor of a run twice (about {gib(2 * run)}) beside the weights"
        elif JUDGE_COPIES * run + 2 * self.weights + OVERHEAD > self.budget:
            what = (
                "its float64 judge holds every tensor of a run in float64 with its operands' magnitudes "
                f"(about {gib(JUDGE_COPIES * run)})"
            )
        else:
            return ""
        fix = f"{self._raise_it()}, or give the inputs smaller shapes (--shape)"
        return f"{what}, more than the {self.describe()}; {fix}"

    def _raise_it(self) -> str:
        return "raise --max-memory" if self.explicit else "free memory, or set --max-memory higher"


def memory_plan(spec: ModelSpec, proto: onnx.ModelProto, feeds: Feeds, opts: CompareOptions) -> MemoryPlan:
    """Sizes from shape inference with the feeds' shapes; the budget from --max-memory or the
    memory available now."""
    explicit = opts.max_memory is not None
    if explicit:
        budget: int | None = opts.max_memory
    else:
        free = available_memory()
        budget = int(free * DEFAULT_SHARE) if free else None
    shapes = {k: v.shape for k, v in feeds.arrays.items() if isinstance(v, np.ndarray)}
    weights = spec.weight_bytes
    sizes = tensor_bytes(proto, shapes) if budget is not None else Sizes({})
    return MemoryPlan(budget, explicit, weights, sizes)


def sizing_note(plan: MemoryPlan) -> str:
    """What the report says when some tensors could not be sized before running ('' if none)."""
    if not plan.sizes.unsized:
        return ""
    return f"memory plan: {plan.sizes.describe()}"


def window_note(
    name: str, windows: tuple[tuple[str, ...], ...], spec: ModelSpec, opts: CompareOptions, plan: MemoryPlan
) -> str:
    """What the report says about a backend whose tensors were exposed in windows, and why."""
    tensors = spec.tensor_order(opts.outputs_only)
    total = sum(plan.sizes.get(t, 0) for t in tensors)
    largest = max(sum(plan.sizes.get(t, 0) for t in w) for w in windows)
    return (
        f"{name}: its {len(tensors)} per-layer tensors ({gib(total)} per run) were exposed in "
        f"{len(windows)} windows of at most {gib(largest)}, each its own build and session runs, "
        f"to stay within {plan.describe()}; every tensor was still compared"
    )
