"""One backend's outcome across its builds and runs, and what it was fed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from xbackend.execution.protocol import RunStatus
from xbackend.numerics.metrics import TensorDiff, worst_per_tensor

__all__ = [
    "BackendResult",
    "BackendStatus",
    "FeedsInfo",
    "Latency",
    "ObserverEffect",
]

# how a backend ended: ran, failed (crashed, hung, rejected the model), or cannot run here
BackendStatus = RunStatus


@dataclass(frozen=True)
class FeedsInfo:
    """What was fed: hash, seed, source and shapes (the arrays themselves stay out of results)."""

    sha256: str
    seed: int | None
    source: str
    shapes: tuple[tuple[str, str, str], ...]  # (name, dtype or 'value', shape or structure)
    ranges: tuple[tuple[str, str], ...] = ()  # generated inputs: the range values were drawn from
    expected: bool = False  # golden outputs came with the inputs
    made: tuple[tuple[str, str], ...] = ()  # generated inputs: how each was made, in words


@dataclass(frozen=True)
class ObserverEffect:
    """Graph outputs of the instrumented build (every intermediate exposed) vs the plain build."""

    outputs_changed: bool
    max_ulp: int | None = None
    scaled_ulp: float | None = None
    first: str | None = None


@dataclass(frozen=True)
class Latency:
    """Wall time of one inference, from the runs the comparison made (the first run of each build
    is warm-up and left out): the runs whose bits were compared are the runs that were timed."""

    median_ms: float
    min_ms: float
    max_ms: float
    runs: int  # timed runs, over every build
    exposed: int = 0  # tensors each timed run handed back (more than the outputs: instrumented)

    @classmethod
    def of(cls, seconds: Sequence[float], exposed: int = 0) -> Latency | None:
        """From run times in seconds; None when there are none (one run per build: pass
        --timed-runs N)."""
        if not seconds:
            return None
        ms = sorted(1000.0 * second for second in seconds)
        n = len(ms)
        median = ms[n // 2] if n % 2 else (ms[n // 2 - 1] + ms[n // 2]) / 2
        return cls(median, ms[0], ms[-1], n, exposed)

    def to_json(self) -> dict[str, float | int]:
        """The latency as the JSON report holds it, in milliseconds."""
        return {
            "median_ms": self.median_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "runs": self.runs,
            "tensors_exposed": self.exposed,
        }

    def words(self) -> str:
        """The latency in words: the median, the range and the runs it was timed over."""
        runs = f"{self.runs} run{'s' if self.runs != 1 else ''}"
        return f"{_ms(self.median_ms)} ms (min {_ms(self.min_ms)}, max {_ms(self.max_ms)}; {runs})"


def _ms(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


@dataclass(frozen=True)
class BackendResult:
    """One backend configuration across its builds and runs.

    Determinism and every figure at the graph outputs come from the plain model (what
    users ship); per-layer run diffs from the instrumented build.
    """

    name: str
    status: BackendStatus
    reason: str = ""
    options: tuple[tuple[str, str], ...] = ()
    info: tuple[tuple[str, str], ...] = ()
    runs: int = 0
    builds: int = 0
    deterministic: bool | None = None
    distinct_outputs: int = 0
    distinct_run_outputs: int = 0
    distinct_build_outputs: int = 0
    exposed: int = 0
    not_exposed: tuple[tuple[str, str], ...] = ()
    run_diffs: tuple[TensorDiff, ...] = ()
    build_diffs: tuple[TensorDiff, ...] = ()
    fingerprints: tuple[str, ...] = ()
    timings: tuple[tuple[str, float], ...] = field(default=(), compare=False)
    build_s: tuple[float, ...] = field(default=(), compare=False)  # each build's worker, wall seconds
    observer: ObserverEffect | None = None  # None: one build serves both, or no per-layer build ran
    layers_error: str = ""  # the instrumented build failed; graph-output figures still stand
    constant_outputs: tuple[tuple[str, str], ...] = ()  # output -> 'all 0' when one value fills it
    output_digests: tuple[tuple[str, str], ...] = ()  # graph output -> digest, plain build 0, run 0
    layer_digests: tuple[tuple[str, str], ...] = ()  # captured tensor -> digest, instrumented build 0
    loaded_from: str = ""  # a capture folder: this backend ran on the host its capture records
    promises: tuple[str, ...] = ()  # what the runner promises: its hardware's and its modes'
    # one inference's wall time (left out of reports unless times are asked for: byte-stable)
    latency: Latency | None = field(default=None, compare=False)
    # the largest peak resident memory of its build processes, and that process's once its engine
    # was loaded (reported with the times)
    peak_rss_bytes: int = field(default=0, compare=False)
    start_rss_bytes: int = field(default=0, compare=False)
    # what the memory plan says its largest build holds beyond its engine loaded (xbackend.planning.memory)
    planned_bytes: int = field(default=0, compare=False)

    @property
    def planned_peak(self) -> int:
        """The plan's peak for the process: what it measured with the engine loaded, and the plan."""
        return self.start_rss_bytes + self.planned_bytes if self.start_rss_bytes and self.planned_bytes else 0

    @property
    def ok(self) -> bool:
        """The backend ran (neither failed nor unavailable here)."""
        return self.status == "ok"

    def varying(self) -> list[TensorDiff]:
        """Tensors that differed between runs or builds, worst kept per tensor, in topological order."""
        diffs = [*self.run_diffs, *self.build_diffs]
        order = {diff.name: index for index, diff in enumerate(diffs)}
        return worst_per_tensor((diff for diff in diffs if not diff.bitwise_equal), order)

    @property
    def varies_run_to_run(self) -> bool:
        """Outputs or an exposed intermediate differed between runs of one build."""
        return self.distinct_run_outputs > 1 or any(not diff.bitwise_equal for diff in self.run_diffs)

    @property
    def varies_build_to_build(self) -> bool:
        """Outputs or an exposed intermediate differed between fresh builds."""
        return self.distinct_build_outputs > 1 or any(not diff.bitwise_equal for diff in self.build_diffs)

    def variance_words(self) -> str:
        """What varied, in the words of what was measured: runs of one build, or fresh builds."""
        runs, builds = self.varies_run_to_run, self.varies_build_to_build
        # an exposed intermediate can vary while every output stays the same: say which moved
        across = (
            f"{self.distinct_build_outputs} distinct outputs over {self.builds} builds"
            if self.distinct_build_outputs > 1
            else f"identical outputs over {self.builds} builds, intermediates varied"
        )
        within = (
            f"{self.distinct_run_outputs} distinct outputs in {self.runs} runs of one build"
            if self.distinct_run_outputs > 1
            else f"identical outputs in {self.runs} runs of one build, intermediates varied"
        )
        if builds and not runs:
            return f"builds differ: {across}; each build deterministic over {self.runs} runs"
        if runs and not builds:
            return f"nondeterministic run to run: {within}"
        return f"nondeterministic: {within}, and {across}"

    @property
    def first_nondeterministic(self) -> str | None:
        """The first tensor, in model order, whose bits varied run to run or build to build."""
        v = self.varying()
        return v[0].name if v else None

    def digests(self) -> dict[str, str]:
        """Every captured tensor's digest; graph outputs as the plain build (what users ship) gave them."""
        return {**dict(self.layer_digests), **dict(self.output_digests)}

    def moved_since(self, old: BackendResult, order: Mapping[str, int]) -> list[str]:
        """Tensors both captured whose digests differ from `old`'s, in `order` (model order)."""
        mine, theirs = self.digests(), old.digests()
        moved = (n for n in mine if n in theirs and mine[n] != theirs[n])
        return sorted(moved, key=lambda n: order.get(n, len(order)))
