"""One model's comparison as a sequence of named stages: load, feed, plan, execute, compare,
judge, assemble. Each takes and returns typed state; the judge is the stage that waits for the
explanation the execute stage started beside the probes.

Never imports a backend: runners are found by name and run in worker processes. Never names a
probe: it runs those the registry selects. Captures are compared one value at a time from disk.
Candidates sit above this module (xbackend.candidates.session): they call it for the original
and for each candidate.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from xbackend.comparison.cross import against, cross_all, pairs
from xbackend.comparison.decisions import decision_outputs, decisions_all
from xbackend.comparison.decode import decode_backends
from xbackend.comparison.drift import baseline_drifts
from xbackend.comparison.executing import Execution, ProbesRun, probe_results
from xbackend.comparison.request import Ran, RunRequest
from xbackend.comparison.save_captures import save_captures
from xbackend.comparison.tolerances import attach
from xbackend.errors import UsageError
from xbackend.host.environment import collect_environment
from xbackend.judge.conditioning import far_from_float64
from xbackend.judge.room import explanation_fit
from xbackend.model.extdata import write_rewritten
from xbackend.model.inputs import Feeds
from xbackend.model.load import ModelSpec, load_model
from xbackend.model.selection import with_selection
from xbackend.numerics.values import Value
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.planning.memory import Fit, measure_unsized, memory_plan, sizing_note, window_note
from xbackend.planning.plan import (
    feeds_for,
    feeds_info,
    load_captures,
    plan_backend,
    preflight,
    with_expected,
)
from xbackend.probes.base import Probe
from xbackend.probes.registry import PROBES, select_probes
from xbackend.results import EXPECTED, CompareOptions, ProbeResult, Result
from xbackend.results.capture_record import LoadedCapture
from xbackend.results.comparisons import CrossBackendResult, Drift, PairResult
from xbackend.results.decode import DecodeResult
from xbackend.results.explanation import Explanation

__all__ = ["LAYER_NODE_LIMIT", "ORACLE", "compare_model"]

ORACLE = "oracle"


def compare_model(request: RunRequest) -> Ran:
    """The model of `request` compared across its backends: its Result, the builds (their
    captures on disk while the run folder lives) and the feeds."""
    loaded = _load(request)
    fed = _feed(request, loaded)
    planned = _plan(request, loaded, fed)
    del loaded  # the original's proto goes once it is planned
    with Execution(
        planned.ctx,
        planned.backends,
        planned.probes,
        planned.captures,
        request.progress,
        planned.windows,
        spill=planned.spill,
        plain=not request.quick,
        memory=planned.explanation_memory,
    ) as execution:
        assert execution.run is not None
        compared = _compare(planned.ctx, execution.run, request.capture_to)  # while the judge runs
        explanation = execution.judge()
    early = execution.probes  # analyzed before the explanation ran, where they were
    return _assemble(planned, execution.run, early, compared, explanation)


# --- load --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Loaded:
    """The model as read, the probes asked for and the captures to load."""

    spec: ModelSpec  # its tensors selected (--tensors)
    proto: onnx.ModelProto
    wanted: tuple[str, ...]  # the probes to run, by name
    captures: tuple[LoadedCapture, ...]


def _load(request: RunRequest) -> _Loaded:
    opts = request.options
    wanted = select_probes(opts.probes, opts.batch_invariance)  # unknown names: UsageError, first
    spec, proto = request.read or load_model(request.model)
    _check_size(spec.path, len(proto.graph.node), opts)
    spec = with_selection(spec, opts.tensors)
    decision_outputs(spec, opts.decisions)  # a name the model lacks: UsageError before anything runs
    return _Loaded(spec, proto, tuple(wanted), tuple(load_captures(spec, opts)))


# Past this many nodes a layer-by-layer comparison is refused in seconds: ONNX Runtime's builds
# grow faster than linearly in the tensors they expose and the inputs a severed graph takes
# (measured on a 2-core EPYC: every tensor of a 100,000-node chain exposed, 35 s to build
# against 0.44 s at 10,000; a severed graph of 20,000 inputs, 104 s against 14 s at 10,000).
LAYER_NODE_LIMIT = 25_000


def _check_size(path: str, nodes: int, opts: CompareOptions) -> None:
    if nodes > LAYER_NODE_LIMIT and not opts.outputs_only:
        raise UsageError(
            f"{path} has {nodes:,} nodes, more than the {LAYER_NODE_LIMIT:,} xbackend compares layer by "
            "layer (the engines' builds with every tensor exposed grow faster than linearly past that); "
            f"compare its graph outputs with `xbackend compare {shlex.quote(path)} --outputs-only` (36 s "
            "for 100,000 nodes on a 2-core machine; capture takes --outputs-only too)"
        )


# --- feed --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fed:
    """The run's feeds (None until decoded, with --decode) and the options with golden outputs."""

    feeds: Feeds | None
    expected: Mapping[str, Value] | None
    options: CompareOptions


def _feed(request: RunRequest, loaded: _Loaded) -> _Fed:
    opts = request.options
    if request.feeds is not None:
        feeds, expected = request.feeds, None
    elif opts.decode:  # the feeds are a decoding step's, known once every backend has decoded
        feeds, expected = None, None
    else:
        feeds, expected = feeds_for(loaded.spec, opts, loaded.captures)
    return _Fed(feeds, expected, with_expected(opts, expected))


# --- plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Planned:
    """Everything decided before the first build: the run's context, each backend planned, the
    probes, each backend's windows, the notes the plan made, and whether the explanation fits."""

    ctx: RunContext
    shipped_path: str  # the file the user named (the graph run may be a sorted copy)
    unsorted: bool
    backends: tuple[PlannedBackend, ...]
    probes: tuple[Probe, ...]
    captures: tuple[LoadedCapture, ...]
    windows: Mapping[str, tuple[tuple[str, ...], ...]]
    notes: tuple[str, ...]
    explanation_memory: Fit
    spill: bool  # per-layer tensors cross the process boundary (else compared in the worker)
    decoded: DecodeResult | None


def _plan(request: RunRequest, loaded: _Loaded, fed: _Fed) -> _Planned:
    spec, proto, opts, work = loaded.spec, loaded.proto, fed.options, request.work
    shipped_path = spec.path
    if spec.unsorted:  # every engine and judge reads the same graph, its nodes in order
        sorted_path = work / "sorted" / Path(spec.path).name
        write_rewritten(proto, spec.path, sorted_path)
        spec = replace(spec, path=str(sorted_path))
    planned, notes = preflight(
        spec, proto, [plan_backend(name, opts, work, fed.expected) for name in opts.backends]
    )
    feeds, decoded = fed.feeds, None
    if feeds is None:  # --decode (a candidate's: its tokens against its original's)
        decoded, feeds = decode_backends(spec, opts, planned, work, request.progress, request.against)
    memory = memory_plan(spec, proto, feeds, opts, request.quick)
    feeds_path = work / "feeds.xbv"
    feeds.save(feeds_path)
    memory = measure_unsized(memory, spec, planned, work, feeds_path, opts.timeout)
    planned, windows = memory.plan_all(planned, spec, opts)
    notes += [window_note(key, window, spec, opts, memory) for key, window in windows.items() if window]
    notes += [n for n in [sizing_note(memory)] if n]
    feed_bytes = sum(getattr(array, "nbytes", 0) for array in feeds.arrays.values())
    planned = [
        replace(p, planned_bytes=memory.planned_bytes(p, spec, opts, windows.get(p.name, ()), feed_bytes))
        for p in planned
    ]
    ctx = RunContext(
        spec,
        opts,
        feeds,
        feeds_path,
        work,
        run_bytes=memory.run_bytes(spec),
        budget=memory.budget,
        judge_alone=request.role.judges_alone,
    )
    probes = tuple(PROBES[name](ctx) for name in loaded.wanted)
    # One backend, one build, nothing saved or compared after: its per-layer tensors cross no
    # process, so the worker compares them run to run by digest and writes the outputs only.
    running = [probe for probe in probes if not probe.always]  # the builds probe reads fingerprints only
    alone = len(planned) == 1 and opts.builds == 1 and not (running or loaded.captures or opts.baseline)
    kept = request.capture_to is not None or opts.save_captures or request.role.keeps_layers
    return _Planned(
        ctx,
        shipped_path,
        spec.unsorted,
        tuple(planned),
        probes,
        loaded.captures,
        windows,
        tuple(notes),
        explanation_fit(memory, spec, bool(opts.noise_samples)),
        spill=not (alone and not kept),
        decoded=decoded,
    )


# --- compare -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Compared:
    """The comparisons of the captures, made while the explanation runs (its tolerances are
    attached after)."""

    environment: tuple[tuple[str, str], ...]
    drift: tuple[Drift, ...]
    baseline_environment: tuple[tuple[str, str], ...]
    oracle: tuple[CrossBackendResult, ...]
    cross: tuple[CrossBackendResult, ...]
    expected: tuple[CrossBackendResult, ...]
    pairs: tuple[PairResult, ...]


def _compare(ctx: RunContext, done: ProbesRun, capture_to: str | os.PathLike[str] | None) -> _Compared:
    """Every comparison between the backends that ran and the captures loaded."""
    spec, opts, feeds = ctx.spec, ctx.opts, ctx.feeds
    builds, backends = done.builds, done.backends
    env = tuple(collect_environment().items())
    save_captures(opts, spec, feeds, ctx.feeds_path, builds, backends, env, capture_to)
    drift, baseline_env = baseline_drifts(opts, spec, feeds, builds, backends)
    compared = [backend for backend in backends if backend.name != EXPECTED]
    return _Compared(
        env,
        drift,
        baseline_env,
        tuple(against(ORACLE, builds, compared, spec, opts)),
        tuple(cross_all(builds, compared, done.reference, spec, opts)),
        tuple(against(EXPECTED, builds, compared, spec, opts, layers=False)),
        tuple(pairs(builds, backends, spec)),
    )


# --- assemble ----------------------------------------------------------------------------------


def _assemble(
    planned: _Planned,
    done: ProbesRun,
    early: tuple[ProbeResult, ...] | None,
    compared: _Compared,
    explanation: Explanation,
) -> Ran:
    """The comparisons made, with the explanation's tolerances attached, the probes' results and
    the decisions."""
    ctx = planned.ctx
    spec, opts, feeds = ctx.spec, ctx.opts, ctx.feeds
    builds, ref = done.builds, done.reference
    ref_layers = builds[ref].first.layers if ref in builds and builds[ref].ok else None
    ref_capture = ref_layers.capture if ref_layers is not None else None
    cross = attach(compared.cross, explanation, spec.op_types(), opts.auto_tolerance)
    notes = planned.notes
    if planned.unsorted:
        notes += (
            "the model file lists its nodes out of topological order (as ONNX Runtime's float16 "
            "converter writes them); every backend ran the same graph with its nodes sorted",
        )
    probes = early if early is not None else probe_results(planned.probes, done)
    result = Result(
        model=replace(spec, path=planned.shipped_path),  # the file the user named, never the sorted copy
        feeds=feeds_info(feeds, compared.expected != ()),
        options=opts,
        backends=done.backends,
        cross_backend=cross,
        environment=compared.environment,
        notes=(*notes, *ctx.notes),
        pairs=compared.pairs,
        oracle_error=compared.oracle,
        probes=probes,
        probes_ran=tuple(probe.name for probe in planned.probes),
        reference=ref,
        expected_error=compared.expected,
        baseline=compared.drift,
        baseline_environment=compared.baseline_environment,
        explanation=far_from_float64(
            explanation, spec, [x for x in cross if x.backend != ORACLE], compared.oracle, ref_capture
        ),
        decode=planned.decoded,
    )
    decided = decisions_all(spec, opts.decisions, builds, result.backends, result.reference_used)
    return Ran(replace(result, decisions=decided), builds, feeds)
