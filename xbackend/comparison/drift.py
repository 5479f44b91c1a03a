"""Each backend against the same backend in --baseline: values where the baseline kept them,
else digests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from xbackend.comparison.baseline import Baseline, load_baseline
from xbackend.execution.executor import diff_phases
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec
from xbackend.numerics.metrics import TensorDiff
from xbackend.numerics.values import value_name
from xbackend.planning.builds import Builds
from xbackend.results import EXPECTED, BackendResult, CompareOptions, Drift

__all__ = ["baseline_drifts"]


def baseline_drifts(
    opts: CompareOptions,
    spec: ModelSpec,
    feeds: Feeds,
    builds: Mapping[str, Builds],
    backends: Sequence[BackendResult],
) -> tuple[tuple[Drift, ...], tuple[tuple[str, str], ...]]:
    """Each output's drift from the baseline report, and the environment the baseline was recorded in (both
    empty without --baseline)."""
    if opts.baseline is None:
        return (), ()
    base = load_baseline(opts.baseline)
    out = []
    for backend in backends:
        if not backend.ok or backend.name == EXPECTED:
            continue
        out.append(_drift(backend, builds[backend.name], base, spec, feeds))
    return tuple(out), base.environment


def _drift(backend: BackendResult, mine: Builds, base: Baseline, spec: ModelSpec, feeds: Feeds) -> Drift:
    theirs = base.match(backend.name)
    if theirs is None:
        return Drift(
            backend.name, base.source, "no-baseline", f"the baseline has no {backend.name.split('@')[0]}"
        )
    label = f"{theirs.name} in {base.source}"
    if theirs.feeds_sha256 != feeds.sha256:
        return Drift(
            backend.name,
            label,
            "not-comparable",
            f"the baseline was fed other inputs (sha256 {theirs.feeds_sha256[:12]}, "
            f"now {feeds.sha256[:12]}); "
            + (
                f"pass --inputs {theirs.capture.path} to feed the baseline's inputs"
                if theirs.capture is not None
                else "compare with the baseline's inputs (--seed, --shape, --range, --inputs)"
            ),
        )
    order = spec.tensor_order()
    rank = {n: index for index, n in enumerate(order)}
    if theirs.capture is not None:
        run = theirs.capture.run
        outs = diff_phases(mine.first.outputs, run.outputs, spec, outputs=True)
        layers: list[TensorDiff] = []
        if mine.first.layers is not None and run.layers is not None:
            layers = diff_phases(mine.first.layers, run.layers, spec, outputs=False)
        moved = [tensor_diff.name for tensor_diff in (layers or outs) if not tensor_diff.bitwise_equal]
        moved += [out.name for out in outs if not out.bitwise_equal and out.name not in moved]
        moved.sort(key=lambda n: rank.get(value_name(n), len(rank)))
        status: Literal["drifted", "identical"] = "drifted" if moved else "identical"
        return Drift(backend.name, label, status, "", True, tuple(outs), tuple(layers), tuple(moved))
    if not theirs.result.digests():
        return Drift(backend.name, label, "not-comparable", "the baseline report records no tensor digests")
    moved = backend.moved_since(theirs.result, rank)
    return Drift(backend.name, label, "drifted" if moved else "identical", "", False, (), (), tuple(moved))
