"""Backends against each other: each against the reference, every pair, and each against a
target (the float64 oracle, the expected outputs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xbackend.execution.executor import diff_phases
from xbackend.model.load import ModelSpec
from xbackend.numerics.metrics import TensorDiff
from xbackend.numerics.values import value_name
from xbackend.planning.builds import Builds
from xbackend.results import EXPECTED, BackendResult, CompareOptions, CrossBackendResult, PairResult

__all__ = ["against", "cross_all", "effective_reference", "pairs"]


def effective_reference(opts: CompareOptions, results: Sequence[BackendResult]) -> str:
    """--reference when it ran, else the first backend in --backends order that did."""
    by_name = {result.name: result for result in results}
    ref = opts.reference_name
    if by_name[ref].ok:
        return ref
    return next((result.name for result in results if result.ok and result.name != EXPECTED), ref)


def cross_all(
    builds: Mapping[str, Builds],
    results: Sequence[BackendResult],
    ref: str,
    spec: ModelSpec,
    opts: CompareOptions,
) -> list[CrossBackendResult]:
    """Each backend that ran against the reference `ref`, output by output and layer by layer."""
    by_name = {result.name: result for result in results}
    out = []
    for r in results:
        if r.name == ref:
            continue
        if not r.ok:
            out.append(CrossBackendResult(r.name, ref, "skipped", f"{r.name} {r.status}"))
        elif not by_name[ref].ok:
            out.append(
                CrossBackendResult(r.name, ref, "skipped", f"the reference ({ref}) {by_name[ref].status}")
            )
        else:
            out.append(_cross_one(builds[r.name], builds[ref], spec, opts))
    return out


def pairs(
    builds: Mapping[str, Builds], results: Sequence[BackendResult], spec: ModelSpec
) -> list[PairResult]:
    """Every pair of backends that ran, at the graph outputs of the plain builds."""
    ok = [result.name for result in results if result.ok]
    out = []
    for index, a in enumerate(ok):
        for b in ok[index + 1 :]:
            diffs = diff_phases(builds[a].first.outputs, builds[b].first.outputs, spec, outputs=True)
            out.append(PairResult.from_diffs(a, b, diffs))
    return out


def against(
    target: str,
    builds: Mapping[str, Builds],
    results: Sequence[BackendResult],
    spec: ModelSpec,
    opts: CompareOptions,
    layers: bool = True,
) -> list[CrossBackendResult]:
    """Every backend that ran against `target` (the oracle, the expected outputs), when it ran."""
    by_name = {result.name: result for result in results}
    if target not in builds or not builds[target].ok:
        return []
    return [
        _cross_one(builds[value.name], builds[target], spec, opts, layers)
        for value in by_name.values()
        if value.ok and value.name != target
    ]


def _cross_one(
    builds: Builds, b: Builds, spec: ModelSpec, opts: CompareOptions, layers: bool = True
) -> CrossBackendResult:
    a0, b0 = builds.first, b.first
    outputs = diff_phases(a0.outputs, b0.outputs, spec, outputs=True)
    # an output a backend says it does not hand out (llama.cpp's KV cache), with its reason in the
    # backend's not-exposed list, is not compared; one it simply lacks is a mismatch
    declared = {n for x in (a0, b0) for n, _ in getattr(x.outputs, "not_exposed", ())}
    produced = {value_name(output.name) for output in outputs}
    missing = [
        output_name
        for output_name in spec.output_names
        if output_name not in produced and output_name not in declared
    ]
    outputs += [
        TensorDiff.mismatch(output_name, spec.op_types().get(output_name, ""), "missing", "not produced")
        for output_name in missing
    ]
    la, lb = a0.layers, b0.layers
    note = ""
    per_layer: list[TensorDiff] = []
    only_a: list[str] = []
    only_b: list[str] = []
    if spec.outputs_only or not layers:
        note = "graph outputs only"
    elif la is None or lb is None:
        who = builds.planned.name if la is None else b.planned.name
        note = f"{who} has no per-layer capture"
    else:
        per_layer = diff_phases(la, lb, spec, outputs=False)
        only_a = sorted(set(la.capture_names) - set(lb.capture_names))
        only_b = sorted(set(lb.capture_names) - set(la.capture_names))
    return CrossBackendResult.from_diffs(
        builds.planned.name,
        b.planned.name,
        outputs,
        per_layer,
        spec.output_names,
        only_a,
        only_b,
        opts.fixed_ulp,
        note,
    )
