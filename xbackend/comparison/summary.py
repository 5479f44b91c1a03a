"""A backend's builds summarized: determinism, run and build diffs, digests, observer effect."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xbackend.errors import BackendUnavailableError
from xbackend.execution.executor import JobOutcome, diff_phases
from xbackend.execution.protocol import PhaseResult
from xbackend.files.run_values import CaptureFile
from xbackend.model.load import ModelSpec
from xbackend.numerics.metrics import TensorDiff, is_constant, summarize, worst_per_tensor
from xbackend.numerics.values import value_sha256
from xbackend.planning.builds import Builds
from xbackend.results import EXPECTED, BackendResult, CompareOptions, Latency, ObserverEffect
from xbackend.results.promises import PROPERTIES, validate
from xbackend.runners.base import QUIET_WHEN_UNSET
from xbackend.runners.registry import get_runner

__all__ = ["build_diffs", "latency", "promised", "summarize_backend"]


def summarize_backend(builds: Builds, spec: ModelSpec, opts: CompareOptions) -> BackendResult:
    """The backend's result: unavailable, failed (at its first failed build), or what it ran."""
    planned = builds.planned
    options = _shown_options(builds)
    if planned.cls is None:
        return BackendResult(
            planned.name,
            "unavailable",
            planned.unavailable,
            options,
            planned.interpreter_info(),
            promises=promised(planned.name, planned.options),
        )
    failed = next((outcome for outcome in builds.outcomes if not outcome.ok), None)
    if failed is not None:
        return BackendResult(
            planned.name,
            failed.outcome.status,
            failed.reason,
            options,
            _info(builds, failed),
            opts.runs,
            len(builds.outcomes),
            promises=promised(planned.name, planned.options),
        )
    return _ran(builds, spec, opts, options)


def _ran(
    builds: Builds, spec: ModelSpec, opts: CompareOptions, options: tuple[tuple[str, str], ...]
) -> BackendResult:
    first = builds.outcomes[0]
    top = max(builds.outcomes, key=lambda outcome: outcome.result.peak_rss_bytes)
    outs = [outcome.outputs for outcome in builds.outcomes]
    shown = first.layers or first.outputs
    return BackendResult(
        name=builds.planned.name,
        status="ok",
        options=options,
        info=_info(builds, first),
        runs=len(first.outputs.run_s),
        builds=len(builds.outcomes),
        deterministic=_deterministic(builds),
        distinct_outputs=len({hashe for ph in outs for hashe in ph.output_hashes}),
        distinct_run_outputs=max(len(set(ph.output_hashes)) for ph in outs),
        distinct_build_outputs=len({ph.output_hashes[0] for ph in outs}),
        exposed=len(shown.capture_names),
        not_exposed=shown.not_exposed,
        run_diffs=tuple(_run_diffs(builds, spec)),
        build_diffs=tuple(build_diffs(builds, spec)),
        fingerprints=tuple(ph.fingerprint.digest for ph in outs),
        build_s=tuple(outcome.outcome.elapsed_s for outcome in builds.outcomes),
        timings=_timings(first.outputs),
        observer=_observer(first, spec),
        layers_error="; ".join(f"{ph}: {why}" for ph, why in first.result.phase_errors),
        constant_outputs=_constant_outputs(first.outputs, spec),
        output_digests=_digests(first.outputs, spec.output_names),
        layer_digests=_digests(first.layers),
        promises=promised(builds.planned.name, builds.planned.options),
        latency=latency(builds),
        peak_rss_bytes=top.result.peak_rss_bytes,
        start_rss_bytes=top.result.start_rss_bytes,
        planned_bytes=builds.planned.planned_bytes,
    )


def latency(builds: Builds) -> Latency | None:
    """One inference's wall time over every build's runs of the model users ship, each build's
    first run (warm-up: lazy compiles, autotuning, allocations) left out."""
    first = builds.outcomes[0].outputs
    seconds = [s for outcome in builds.outcomes for s in outcome.outputs.run_s[1:]]
    return Latency.of(seconds, len(first.capture_names))


def _shown_options(builds: Builds) -> tuple[tuple[str, str], ...]:
    """The options the report shows: not the expected outputs' file, not an unset python= or
    save_optimized=."""
    planned = builds.planned
    return tuple(
        sorted(
            (key, str(option))
            for key, option in planned.options.items()
            if (key != "file" or planned.name != EXPECTED) and (key not in QUIET_WHEN_UNSET or option)
        )
    )


def _info(builds: Builds, job_outcome: JobOutcome) -> tuple[tuple[str, str], ...]:
    """What the runner reported in force, plus the foreign interpreter's description."""
    ran = job_outcome.outputs.info if job_outcome.ok else job_outcome.result.info
    return tuple(sorted({**dict(ran), **dict(builds.planned.interpreter_info())}.items()))


def _deterministic(builds: Builds) -> bool:
    """Every phase captured the same bits on every run of every build."""
    cap_hashes = {
        ph.name: [
            hashe
            for outcome in builds.outcomes
            if (x := outcome.phase(ph.name))
            for hashe in x.capture_hashes
        ]
        for ph in builds.outcomes[0].result.phases
    }
    return all(len(set(hs)) == 1 for hs in cap_hashes.values())


def _run_diffs(builds: Builds, spec: ModelSpec) -> list[TensorDiff]:
    """Within each session, later runs against run 0: the worst per tensor, in model order."""
    outs = [outcome.outputs for outcome in builds.outcomes]
    layers = [outcome.layers for outcome in builds.outcomes if outcome.separate_layers]
    order = {n: index for index, n in enumerate(spec.tensor_order())}
    return worst_per_tensor([diff for ph in [*outs, *layers] if ph for diff in ph.run_diffs], order)


def _timings(ph: PhaseResult) -> tuple[tuple[str, float], ...]:
    return (("prepare_s", ph.prepare_s), ("run_s", float(sum(ph.run_s) / max(1, len(ph.run_s)))))


def promised(name: str, options: Mapping[str, Any]) -> tuple[str, ...]:
    """What backend `name` promises under its resolved `options` (its hardware's and its modes')."""
    try:
        cls = get_runner(name)
    except BackendUnavailableError:
        return ()
    promises = cls.promises_for(options)
    validate(promises, cls.name)
    return tuple(p for p in PROPERTIES if p in promises)


def _digests(ph: PhaseResult | None, names: Sequence[str] | None = None) -> tuple[tuple[str, str], ...]:
    """Each captured tensor's digest (64 bits of its value hash): enough to tell, in a later
    release's report, which tensors moved."""
    if ph is None:
        return ()
    keep = ph.capture_names if names is None else [name for name in ph.capture_names if name in set(names)]
    if ph.digests:  # hashed by the worker as it saved the capture
        have = dict(ph.digests)
        return tuple((n, have[n]) for n in keep if n in have)
    with CaptureFile(ph.capture) as c:
        return tuple((n, value_sha256({n: c[n]})[:16]) for n in keep if n in c)


def _constant_outputs(ph: PhaseResult, spec: ModelSpec) -> tuple[tuple[str, str], ...]:
    out = []
    with CaptureFile(ph.capture) as c:
        for output_name in spec.output_names:
            v = c.get(output_name, None)
            if isinstance(v, np.ndarray) and v.size == 0:
                out.append((output_name, f"empty (shape {list(v.shape)})"))  # a batch of 0: nothing compared
            elif isinstance(v, np.ndarray) and v.size >= 2 and is_constant(v):
                out.append((output_name, f"all {v.reshape(-1)[0]!s}"))
    return tuple(out)


def _observer(job_outcome: JobOutcome, spec: ModelSpec) -> ObserverEffect | None:
    """Graph outputs of the instrumented build against the plain one (same process, same feeds)."""
    if not job_outcome.separate_layers or job_outcome.layers is None:
        return None
    diffs = diff_phases(job_outcome.layers, job_outcome.outputs, spec, outputs=True)
    equal, max_ulp, scaled, first = summarize(diffs)
    return ObserverEffect(not equal, max_ulp, scaled, first)


def build_diffs(builds: Builds, spec: ModelSpec) -> list[TensorDiff]:
    """Each later build's first run against build 0's: outputs (plain) and layers (instrumented)."""
    if len(builds.outcomes) < 2:
        return []
    order = {n: index for index, n in enumerate(spec.tensor_order())}
    diffs: list[TensorDiff] = []
    for outcome in builds.outcomes[1:]:
        diffs += diff_phases(outcome.outputs, builds.first.outputs, spec, outputs=True)
        if builds.first.layers is not None and outcome.layers is not None:
            diffs += diff_phases(outcome.layers, builds.first.layers, spec, outputs=False)
    return worst_per_tensor(diffs, order)
