"""Captures set against each other: a backend against a reference, two backends, a baseline."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from xbackend.files.codec import OMIT_DEFAULT
from xbackend.files.textfmt import short, with_module
from xbackend.numerics.metrics import DEFAULT_MAX_ULP, TensorDiff
from xbackend.numerics.values import value_name
from xbackend.results.explanation import Origin
from xbackend.results.findings import Finding, Kind, Label, scaled_ulp_figure

__all__ = ["CrossBackendResult", "Drift", "PairResult"]


@dataclass(frozen=True)
class CrossBackendResult:
    """A backend against a reference: graph outputs from the plain builds, and per layer (in
    topological order) from the instrumented builds."""

    backend: str
    reference: str
    status: Literal["ok", "skipped"]
    reason: str = ""
    tensors: tuple[TensorDiff, ...] = ()  # per layer (instrumented builds); graph outputs included
    outputs: tuple[str, ...] = ()
    only_in_backend: tuple[str, ...] = ()
    only_in_reference: tuple[str, ...] = ()
    max_ulp_tolerance: float = DEFAULT_MAX_ULP
    output_tensors: tuple[TensorDiff, ...] = ()  # graph outputs of the plain builds
    layers_note: str = ""  # why there is no per-layer table, when there is none
    # --max-ulp auto: each tensor's tolerance (max_ulp_tolerance elsewhere). Judged against float64
    # (explained is not None): the allowance of the backend's local error at the tensor's node, the
    # one figure that decides; else MARGIN x its noise floor, applied to the difference itself.
    tolerances: tuple[tuple[str, float], ...] = ()
    explained: bool | None = None  # no origin among its local errors; None: not measured
    not_judged: str = ""  # why explained is None (the explanation or its local errors did not run)
    origins: tuple[Origin, ...] = ()
    local_errors: tuple[tuple[str, float | None], ...] = ()  # tensor -> its local error (scaled ULP)
    # what decided its tolerances: its nodes' allowances, the noise floor, or a fixed --max-ulp
    tolerance_by: str = field(default="", metadata={OMIT_DEFAULT: True})

    @classmethod
    def from_diffs(
        cls,
        backend: str,
        reference: str,
        outputs_diffs: Sequence[TensorDiff],
        layer_diffs: Sequence[TensorDiff],
        outputs: Iterable[str],
        only_a: Iterable[str],
        only_b: Iterable[str],
        tolerance: float,
        layers_note: str = "",
    ) -> CrossBackendResult:
        """The backend against the reference from its outputs' and layers' differences, and the tensors
        only one of them exposed."""
        return cls(
            backend,
            reference,
            "ok",
            "",
            tuple(layer_diffs),
            tuple(outputs),
            tuple(only_a),
            tuple(only_b),
            tolerance,
            tuple(outputs_diffs),
            layers_note,
        )

    @property
    def bitwise_equal(self) -> bool:
        """Every graph output the same bits as the reference's."""
        return self.status == "ok" and all(
            output_tensor.bitwise_equal for output_tensor in self.output_tensors
        )

    def output_diffs(self) -> list[TensorDiff]:
        """Graph outputs of the plain builds: what the verdict is about."""
        return list(self.output_tensors)

    def instrumented_output_diffs(self) -> list[TensorDiff]:
        """The same graph outputs as measured in the instrumented builds."""
        outs = {value_name(output_tensor.name) for output_tensor in self.output_tensors}
        return [tensor for tensor in self.tensors if value_name(tensor.name) in outs]

    @property
    def observer_differs(self) -> bool:
        """The instrumented builds' output figures differ from the plain builds'."""
        inst = {
            diff.name: (diff.bitwise_equal, diff.max_ulp, diff.scaled_ulp)
            for diff in self.instrumented_output_diffs()
        }
        plain = {
            output_tensor.name: (output_tensor.bitwise_equal, output_tensor.max_ulp, output_tensor.scaled_ulp)
            for output_tensor in self.output_tensors
        }
        return bool(inst) and any(inst.get(key, value) != value for key, value in plain.items())

    @property
    def max_ulp(self) -> int | None:
        """Raw max ULP over graph outputs (None if no float output was compared)."""
        vals = [
            output_tensor.max_ulp
            for output_tensor in self.output_tensors
            if output_tensor.max_ulp is not None
        ]
        return max(vals) if vals else None

    @property
    def scaled_ulp(self) -> float | None:
        """The largest scaled ULP over the graph outputs (None: none was a float compared)."""
        vals = [
            output_tensor.scaled_ulp
            for output_tensor in self.output_tensors
            if output_tensor.scaled_ulp is not None
        ]
        return max(vals) if vals else None

    @property
    def first_divergence(self) -> str | None:
        """The first tensor, in model order, whose bits differ from the reference's."""
        layer = next((tensor.name for tensor in self.tensors if not tensor.bitwise_equal), None)
        return layer or next(
            (output_tensor.name for output_tensor in self.output_tensors if not output_tensor.bitwise_equal),
            None,
        )

    def tolerance(self, tensor: str) -> float:
        """The scaled ULP `tensor` may differ by: its floor-based tolerance under --max-ulp auto,
        else --max-ulp."""
        return self._tolerance_index.get(value_name(tensor), self.max_ulp_tolerance)

    @functools.cached_property
    def _tolerance_index(self) -> dict[str, float]:  # built once: tolerance() is asked per tensor
        return dict(self.tolerances)

    @property
    def judged(self) -> bool:
        """Under --max-ulp auto with every node judged against float64: a tensor violates its
        tolerance exactly when its node is an origin."""
        return bool(self.tolerances) and self.explained is not None

    @functools.cached_property
    def _origin_names(self) -> frozenset[str]:
        return frozenset(origin.tensor for origin in self.origins)

    def local_error(self, tensor: str) -> float | None:
        """`tensor`'s own error against its float64 value, in scaled ULP, where it was judged."""
        return dict(self.local_errors).get(value_name(tensor))

    def exceeds(self, tensor_diff: TensorDiff) -> bool:
        """Whether diff `tensor_diff` is past its tolerance: its node an origin, where nodes were judged."""
        if self.judged:
            return value_name(tensor_diff.name) in self._origin_names
        return tensor_diff.exceeds(self.tolerance(tensor_diff.name))

    @property
    def first_violation(self) -> str | None:
        """The first tensor past its tolerance (the first origin, where nodes were judged)."""
        if self.judged:
            return self.origins[0].tensor if self.origins else None
        layer = next((tensor.name for tensor in self.tensors if self.exceeds(tensor)), None)
        out = next(
            (output_tensor.name for output_tensor in self.output_tensors if self.exceeds(output_tensor)), None
        )
        return (layer or out) if out is not None else layer

    @property
    def exceeds_tolerance(self) -> bool:
        """Some graph output past its tolerance."""
        return self.status == "ok" and any(
            self.exceeds(output_tensor) for output_tensor in self.output_tensors
        )

    @property
    def violates(self) -> bool:
        """Under --max-ulp auto with every node judged against float64: an origin. Else: an
        output past its tolerance."""
        if self.status != "ok":
            return False
        if self.judged:
            return not self.explained
        return self.exceeds_tolerance

    def zero_ulp_reason(self) -> str:
        """Why outputs' bits differ at 0 ULP ('' unless that is the case)."""
        return "; ".join(
            f"{output_tensor.name}: {output_tensor.zero_ulp_reason()}"
            for output_tensor in self.output_tensors
            if output_tensor.zero_ulp_reason()
        )


@dataclass(frozen=True)
class PairResult:
    """Two backends against each other at the graph outputs."""

    a: str
    b: str
    bitwise_equal: bool
    max_ulp: int | None
    scaled_ulp: float | None
    max_rel: float

    @classmethod
    def from_diffs(cls, a: str, b: str, diffs: Sequence[TensorDiff]) -> PairResult:
        """The comparison of backends `a` and `b` from their tensors' differences."""
        ulps = [diff.max_ulp for diff in diffs if diff.max_ulp is not None]
        scaled = [diff.scaled_ulp for diff in diffs if diff.scaled_ulp is not None]
        rel = max((diff.max_rel for diff in diffs), default=0.0)
        return cls(
            a,
            b,
            all(diff.bitwise_equal for diff in diffs),
            max(ulps) if ulps else None,
            max(scaled) if scaled else None,
            rel,
        )


@dataclass(frozen=True)
class Drift:
    """A backend against the same backend in a baseline (a previous release's capture or report)."""

    backend: str
    baseline: str  # the baseline's backend, and where it came from
    status: Literal["identical", "drifted", "no-baseline", "not-comparable"]
    reason: str = ""
    measured: bool = False  # values were compared (ULP figures); else digests only
    outputs: tuple[TensorDiff, ...] = ()  # graph outputs, when measured
    tensors: tuple[TensorDiff, ...] = ()  # every tensor both captured, model order, when measured
    moved: tuple[str, ...] = ()  # tensors whose bits moved, model order

    @property
    def drifted(self) -> bool:
        """The backend's bits moved from the baseline's."""
        return self.status == "drifted"

    @property
    def first_moved(self) -> str | None:
        """The first tensor, in model order, whose bits moved."""
        return self.moved[0] if self.moved else None

    @property
    def outputs_moved(self) -> tuple[str, ...]:
        """The graph outputs whose bits moved (where values were compared)."""
        outs = {value_name(output.name) for output in self.outputs}
        return tuple(m for m in self.moved if value_name(m) in outs) if self.measured else ()

    @property
    def max_ulp(self) -> int | None:
        """The largest ULP distance of any output from the baseline (None where none was measured)."""
        vals = [output.max_ulp for output in self.outputs if output.max_ulp is not None]
        return max(vals) if vals else None

    @property
    def scaled_ulp(self) -> float | None:
        """The largest scaled ULP of any output from the baseline (None where none was measured)."""
        vals = [output.scaled_ulp for output in self.outputs if output.scaled_ulp is not None]
        return max(vals) if vals else None


def drift_findings(baseline: Sequence[Drift], modules: Mapping[str, str]) -> list[Finding]:
    """Each backend against the same backend in --baseline: moved, not comparable, identical, or absent."""
    out = []
    for d in baseline:
        if d.drifted:
            size = (
                f": {short(d.scaled_ulp)} scaled ULP (raw {d.max_ulp}) at the outputs"
                if d.measured and d.outputs_moved
                else (": the outputs are bit-identical, intermediates moved" if d.measured else "")
            )
            first = with_module(d.first_moved or "", modules)
            words = f"{d.backend} moved from the baseline{size}; first moved tensor {first}"
            out.append(
                Finding(
                    Label.DRIFT,
                    Kind.DRIFTED,
                    words,
                    backend=d.backend,
                    tensor=d.first_moved or "",
                    figures=scaled_ulp_figure(d.scaled_ulp),
                )
            )
        elif d.status == "not-comparable":
            words = f"{d.backend} cannot be compared with the baseline: {d.reason}"
            out.append(Finding(Label.DRIFT, Kind.NOT_COMPARABLE, words, backend=d.backend))
        elif d.status == "identical":
            what = f"{len(d.tensors)} tensors compared" if d.measured else "digests compared"
            words = f"{d.backend}: bit-identical to {d.baseline} ({what})"
            out.append(Finding(Label.BASELINE, Kind.BASELINE_IDENTICAL, words, backend=d.backend))
        elif d.status == "no-baseline":
            words = f"{d.backend}: not in the baseline{f' ({d.reason})' if d.reason else ''}"
            out.append(Finding(Label.BASELINE, Kind.NOT_IN_BASELINE, words, backend=d.backend))
    if baseline and not any(drift.status in ("identical", "drifted") for drift in baseline):
        words = (
            "baseline: no backend of this run is in the baseline, so nothing was compared against "
            "it; run the baseline's backends (--backends)"
        )
        out.append(Finding(Label.WARN, Kind.BASELINE_UNUSED, words))
    return out
