"""Judgments on differences: the noise floor per tensor, each backend's origins, and the
tensors the model itself leaves ill-conditioned.

- The noise floor of a tensor: the largest scaled ULP by which K random orders of every
  reduction (run on one engine, see xbackend.model.reorder) move it from the original order.
- A node's local error: its output on a backend fed the reference's values of its inputs
  (xbackend.model.sever), against the float64 value of the node on those inputs, element by element
  (xbackend.judge.judge_nodes, allowances from xbackend.bounds.element). A node past its allowance is an
  origin; a backend without origins is explained. A backend that could not be judged is held to
  MARGIN times the larger of the floor and its op's rounding bound (xbackend.bounds.unjudged).
- A tensor is ill-conditioned when the rounding of the nodes above it, carried through their
  condition numbers (the float64 judge's value and magnitude, xbackend.judge.conditioning), passes
  `conditioning_limit`: fewer than half of its dtype's significand bits survive rounding.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from xbackend.bounds.unjudged import bound_for
from xbackend.files.codec import OMIT_DEFAULT
from xbackend.files.modelref import np_dtype
from xbackend.numerics.values import value_name

__all__ = [
    "ALL_LOADED",
    "DECLINED",
    "GGUF_DECLINED",
    "LOADED",
    "MARGIN",
    "NOT_MEASURED",
    "QUICK_DECLINED",
    "UNFUSED",
    "Amplifier",
    "Explanation",
    "IllConditioned",
    "LocalErrors",
    "NodeJudgment",
    "Origin",
    "PlainOutputs",
    "PlainStatus",
    "ReorderCheck",
    "conditioning_limit",
    "explained_words",
    "origins_line",
    "share",
    "times_floor",
]

# Calibrated on the bundled models and the ONNX node tests (docs/explanations.md): the largest
# local error of ORT, OpenVINO f32 and torch eager was 1.25x what MARGIN=1 allows (ORT, a
# global average pool); 4 leaves a factor of 3 before a correct engine is called an origin.
MARGIN = 4.0

# a plain run's judgment (shipped-graph: its own graph's kernels were judged instead)
PlainStatus = Literal["explained", "unexplained", "shipped-graph", "not-judged"]


def conditioning_limit(dtype: str) -> float:
    """Scaled ULP past which reorderings alone leave fewer than half the significand bits:
    2^(p/2) for a p-bit significand (float32: 4096)."""
    try:
        p = np.finfo(np_dtype(dtype)).nmant + 1  # type: ignore[type-var]
    except (TypeError, ValueError):
        return math.inf
    return float(2.0 ** (p / 2))


@dataclass(frozen=True)
class Origin:
    """A node whose own error exceeds what reordering and rounding allow."""

    tensor: str
    module: str
    op_type: str
    local_scaled_ulp: float | None  # None: not a float difference (see detail)
    allowed_scaled_ulp: float
    detail: str = ""
    element: tuple[int, ...] = ()  # where the error is largest against its allowance
    rule: str = ""  # the allowance's formula (xbackend.bounds.element.NodeBound.describe)
    certain: bool = False  # past the deterministic bound too: an error at any confidence
    covers: tuple[str, ...] = ()  # a fused kernel: the original nodes' outputs it computes

    @property
    def ratio(self) -> float:
        """The origin's own error over its allowance (inf where it is not a float difference)."""
        if self.local_scaled_ulp is None:
            return math.inf
        return self.local_scaled_ulp / self.allowed_scaled_ulp if self.allowed_scaled_ulp else math.inf


@dataclass(frozen=True)
class NodeJudgment:
    """One node output on one backend against its float64 value: at the element where the error
    is largest against its allowance, both in ULP of the tensor's largest float64 magnitude."""

    tensor: str
    op_type: str
    local_scaled_ulp: float | None  # None: not a float value, and it differs (or not judged)
    allowed_scaled_ulp: float
    ratio: float
    not_judged: str = field(default="", metadata={OMIT_DEFAULT: True})  # why its allowance judges nothing
    # the smallest relative error that, made on every element, is past its allowance (0: unknown)
    threshold: float = field(default=0.0, metadata={OMIT_DEFAULT: True})


@dataclass(frozen=True)
class PlainOutputs:
    """A backend's plain (shipped) outputs against the float64 model, each node's allowance
    composed to them: judged where they differ from its instrumented outputs."""

    status: PlainStatus
    reason: str = ""
    ratio: float = 0.0  # the outputs' largest error / composed allowance
    at: str = ""  # the output where it is largest
    largest: int = field(default=0, metadata={OMIT_DEFAULT: True})  # nodes in its largest stretch
    alone: int = field(default=0, metadata={OMIT_DEFAULT: True})  # nodes judged alone (a stretch of one)
    nodes: int = field(default=0, metadata={OMIT_DEFAULT: True})  # nodes judged (Constants aside)
    fused: int = field(default=0, metadata={OMIT_DEFAULT: True})  # tensors found inside fusions
    cut: str = field(default="", metadata={OMIT_DEFAULT: True})  # how it was cut: "fusions", or why not

    def grain(self) -> str:
        """Its stretches in words ('' when it was not cut)."""
        if not self.largest:
            return ""
        how = (
            f"cut around the {self.fused} tensor(s) whose exposure moves its outputs"
            + self.cut.removeprefix("fusions")
            if self.cut.startswith("fusions")
            else f"cut in {self.cut}"
        )
        alone = f"{self.alone} of {self.nodes} nodes judged alone"
        return f"{how}; stretches of at most {self.largest} nodes, {alone}"

    def words(self) -> str:
        """How the observer effect's WARN ends."""
        size = f"; {self.grain()}" if self.largest else ""
        if self.status == "explained":
            ratio = math.floor(self.ratio * 1000) / 1000
            return (
                "its plain run, stretch by stretch as it ships, is within the bound composed from its "
                f"nodes' allowances ({ratio:.3g} of it, at {self.at}{size})"
            )
        if self.status == "unexplained":
            return (
                "its plain run is past the bound composed from its nodes' allowances "
                f"({self.ratio:.3g}x, at {self.at}{size}): see its origins"
            )
        if self.status == "shipped-graph":
            return f"the plain run's kernels were judged on {self.reason}"
        return f"its plain run was not judged: {self.reason}"


@dataclass(frozen=True)
class LocalErrors:
    """One backend's local errors, node by node, against the reference."""

    backend: str
    status: Literal["ok", "not-measured"]
    reason: str = ""
    origins: tuple[Origin, ...] = ()
    compared: int = 0  # nodes whose local error was measured
    largest_ratio: float | None = None  # largest local error / allowed, over the nodes
    largest_at: str = ""
    nodes: tuple[NodeJudgment, ...] = ()  # every judged node output, model order
    graph: str = ""  # the graph its nodes were judged on (ONNX Runtime's optimized one, its modules, ...)
    plain: PlainOutputs | None = field(default=None, metadata={OMIT_DEFAULT: True})
    flushed: int = field(default=0, metadata={OMIT_DEFAULT: True})  # elements flushed to zero (FTZ)
    flushed_at: str = field(default="", metadata={OMIT_DEFAULT: True})  # the first node that flushed
    # its own graph could not be judged: `graph` is the unfused model's, and says why
    unfused: bool = field(default=False, metadata={OMIT_DEFAULT: True})

    def node(self, tensor: str) -> NodeJudgment | None:
        """The judgment of the node that computes `tensor` (its local error, allowance, op)."""
        return self._node_index.get(value_name(tensor))

    @functools.cached_property
    def _node_index(self) -> dict[str, NodeJudgment]:
        return {node.tensor: node for node in self.nodes}

    @property
    def explained(self) -> bool | None:
        """True without origins, False with some, None where the nodes were not judged."""
        return None if self.status != "ok" else not self.origins

    def detection(self) -> tuple[tuple[str, float, int], ...]:
        """Per op: the median over its judged nodes of the smallest relative error each catches,
        and how many nodes; the most sensitive op first."""
        by_op: dict[str, list[float]] = {}
        for node in self.nodes:
            if node.threshold > 0 and math.isfinite(node.threshold) and not node.not_judged:
                by_op.setdefault(node.op_type, []).append(node.threshold)
        rows = [(op, statistics.median(value), len(value)) for op, value in by_op.items()]
        return tuple(sorted(rows, key=lambda row: (row[1], row[0])))

    @property
    def unjudged(self) -> tuple[NodeJudgment, ...]:
        """Nodes whose allowance judges nothing (not finite, or past the value's magnitude)."""
        return tuple(node for node in self.nodes if node.not_judged)

    def coarser_than(self, nodes: int) -> bool:
        """Judged at fewer tensors than the model's `nodes` (a fusing engine's kernel outputs)."""
        return 0 < self.compared < nodes

    def share(self) -> str:
        """'k of n nodes' judged."""
        return f"{self.compared} of {self.compared + len(self.unjudged)} nodes"

    def mostly_unjudged(self) -> LocalErrors:
        """Not judged overall where most of its nodes were not: 'not-measured', with the share."""
        if (
            self.status != "ok"
            or len(self.unjudged) * 2 <= self.compared + len(self.unjudged)
            or self.origins
        ):
            return self
        first = self.unjudged[0]
        why = (
            f"only {self.share()} could be judged: the others' allowances judge nothing (first "
            f"{first.tensor} ({first.op_type}): {first.not_judged})"
        )
        return dataclasses.replace(self, status="not-measured", reason=why)


@dataclass(frozen=True)
class IllConditioned:
    """A tensor where the model, not the engines, decides the accuracy: where it starts."""

    tensor: str
    module: str
    scaled_ulp: float  # its rounding composed through the condition numbers above it (0: not composed)
    cause: str
    criterion: str = "condition"  # "condition" | "far from float64"


@dataclass(frozen=True)
class Amplifier:
    """A math node that turns the rounding its input already carries (half an ULP) into more:
    cos and sin of large float32 angles. Ill-conditioned in float32, not noise and not an error."""

    tensor: str
    module: str
    op_type: str
    gain_scaled_ulp: float  # how far half an ULP of the input moves the output, at most
    input_max: float


@dataclass(frozen=True)
class ReorderCheck:
    """The allowances checked against the floor engine's own sums in K random orders, node by node
    (each fed the reference's values): legitimate orders must stay within them."""

    status: Literal["ok", "unavailable"]
    reason: str = ""
    engine: str = ""
    samples: int = 0
    largest_ratio: float | None = None  # the largest spread / allowance over the nodes' elements
    largest_at: str = ""
    over: tuple[str, ...] = ()  # nodes whose reorderings pass their allowance: a rule too tight

    @property
    def quantile(self) -> float:
        """q such that the largest of the K spreads is above the q-quantile of one order's spread
        with probability 0.9: 1 - q^K = 0.9."""
        return 0.1 ** (1 / self.samples) if self.samples else 0.0


@dataclass(frozen=True)
class Explanation:
    """The noise floor, each backend's local errors, and ill-conditioned tensors."""

    status: Literal["ok", "unavailable"]
    reason: str = ""
    engine: str = ""  # the engine whose permuted runs measured the floor
    samples: int = 0
    margin: float = MARGIN
    floors: tuple[tuple[str, float], ...] = ()  # tensor -> floor (scaled ULP), model order
    permuted: int = 0  # reductions permuted
    skipped: tuple[tuple[str, str, str], ...] = ()  # (node, op, why) reductions left in order
    local: tuple[LocalErrors, ...] = ()
    ill_conditioned: tuple[IllConditioned, ...] = ()
    rules: tuple[tuple[str, str, str], ...] = ()  # (op, allowance per element, source), by op
    confidence: float = 0.0  # per node: the chance a correct engine's rounding stays within
    reorder_check: ReorderCheck = ReorderCheck("unavailable")
    amplifiers: tuple[Amplifier, ...] = ()
    floor_note: str = ""  # why there is no floor (not needed, or it failed)
    conditioning: str = ""  # why ill-conditioning was not assessed ("": it was)
    # each judged tensor's rounding composed through the condition numbers above it (scaled ULP)
    composed: tuple[tuple[str, float], ...] = field(default=(), metadata={OMIT_DEFAULT: True})

    @property
    def ok(self) -> bool:
        """The explanation ran."""
        return self.status == "ok"

    @property
    def declined(self) -> bool:
        """Not run because the user asked for none (--noise-samples 0) or brought captures alone (no
        engine to judge): a NOTE, never a gate."""
        return self.reason in (DECLINED, QUICK_DECLINED, GGUF_DECLINED) or self.reason.startswith(ALL_LOADED)

    def floor_map(self) -> dict[str, float]:
        """Each tensor's noise floor, in scaled ULP, where it was measured."""
        return dict(self._floor_index)

    @functools.cached_property
    def _floor_index(self) -> dict[str, float]:  # built once: floor() is asked per tensor
        return dict(self.floors)

    def floor(self, tensor: str) -> float | None:
        """`tensor`'s noise floor in scaled ULP (None: not measured)."""
        return self._floor_index.get(value_name(tensor))

    def tolerances(self, op_types: Mapping[str, str]) -> dict[str, float]:
        """Each tensor's tolerance: MARGIN x the larger of its floor, its op's rounding bound
        and 1 ULP."""
        return {t: self.margin * max(f, bound_for(op_types.get(t, ""))[0], 1.0) for t, f in self.floors}

    def local_for(self, backend: str) -> LocalErrors | None:
        """`backend`'s local errors against float64 (None: it was not judged)."""
        return next((local_errors for local_errors in self.local if local_errors.backend == backend), None)


def times_floor(scaled_ulp: float, floor: float) -> float:
    """A difference in units of its tensor's noise floor (a floor under 1 ULP counts as 1)."""
    return scaled_ulp / max(floor, 1.0)


DECLINED = "--noise-samples 0: no floor was measured"
GGUF_DECLINED = (
    "a GGUF file declares its weights' types, not the precision its arithmetic keeps: nothing to "
    "judge its nodes at (nor is its run judged against float64: its weights are not the model's); "
    "per-layer SQNR, events and its tokens or decisions are measured"
)
QUICK_DECLINED = (
    "the quick table (--probes none --runs 1) judges nothing against float64: drop --runs 1 for it"
)
# A judgment the user's own choice rules out, as --noise-samples 0 does: captures loaded from
# elsewhere (--load, a sweep's jobs) carry no engine to feed the reference's values to.
LOADED = "loaded from a capture: its engine did not run here"
ALL_LOADED = "every backend compared with the reference was loaded from a capture"
NOT_MEASURED = Explanation("unavailable", "not measured")
UNFUSED = "the unfused graph"  # LocalErrors.graph of an engine whose own graph could not be judged


def _modname(tensor: str, modules: Mapping[str, str]) -> str:
    m = modules.get(tensor, "")
    return f"{tensor} ({m})" if m else tensor


def _ulp(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}"


def origins_line(backend: str, origins: Sequence[Origin], modules: Mapping[str, str]) -> str:
    """`backend: N origins (...), first T (module) (Op): local error X scaled ULP at [i] where
    rounding allows Y (rule)`: the allowance printed is the one that decided."""
    origin = origins[0]
    n = len(origins)
    if origin.local_scaled_ulp is None or origin.detail:
        what = origin.detail or "exact values differ"
    else:
        where = f" at [{', '.join(map(str, origin.element))}]" if origin.element else ""
        what = (
            f"local error {_ulp(origin.local_scaled_ulp)} scaled ULP{where} where rounding allows "
            f"{_ulp(origin.allowed_scaled_ulp)} ({origin.rule})"
        )
        if origin.certain:
            what += "; past the deterministic bound too"
    kernel = origin.op_type
    if origin.covers and origin.covers != (origin.tensor,):
        kernel += f", fusing {', '.join(_modname(cover, modules) for cover in origin.covers[:6])}"
    return (
        f"{backend}: {n} origin{'s' if n > 1 else ''} (nodes past what rounding allows against their own "
        f"float64 value), first {_modname(origin.tensor, modules)} ({kernel}): {what}"
    )


def share(raw: float) -> str:
    """A share of an allowance: floored to 3 decimals (0.9996 is not 1), in two figures where
    that would say 0."""
    return f"{math.floor(raw * 1000) / 1000:.3g}" if raw >= 0.001 or raw == 0 else f"{raw:.2g}"


def explained_words(le: LocalErrors, modules: Mapping[str, str], nodes: int = 0) -> str:
    """Why a backend without origins is explained, at the grain it was judged: node by node, or at
    the K tensors its fused kernels expose (`nodes`: the model's own judged node count). Its
    closest call stays in the explanation's table: a correctly rounded Add lands near its whole
    allowance, which a verdict line would read as a near miss."""
    if le.compared == 1 and le.largest_at:  # one exposed tensor: no node was judged on its own
        where = _modname(le.largest_at, modules)
        ratio = share(le.largest_ratio or 0.0)
        return (
            f"judged at one tensor only, {where}, the only one it exposes: {ratio} of the allowance "
            "its nodes' rounding composes to there; no node inside was judged on its own"
        )
    nodes_words = (
        f"judged at {le.compared} tensors of the model's {nodes} nodes (its kernels' outputs), each "
        "within the rounding its nodes compose to"
        if le.coarser_than(nodes)
        else "every node is within rounding of its own float64 value"
    )
    if le.unjudged:
        skipped = ", ".join(n.tensor for n in le.unjudged[:3])
        nodes_words = (
            f"{nodes_words.replace('every node is', 'every node judged is', 1)} ({le.share()}; not "
            f"{skipped}: its allowance judges nothing)"
        )
    return f"{nodes_words}; its differences are those errors carried through the model"
