"""Each backend's judgment, chosen in one place: what it is fed (its severed run, its own values,
the judge's evaluation), the judge it is held to, and the graph its nodes are judged on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from xbackend.execution.executor import Job
from xbackend.execution.protocol import Phase
from xbackend.judge.judge_plan import (
    LOCAL_PHASE,
    OWN_JUDGE,
    OWN_VALUES,
    BackendJudgment,
    Fed,
    Judge,
    grain_of,
)
from xbackend.judge.judges import JUDGE_ENGINE, own_grain_judge
from xbackend.judge.room import severed_plan
from xbackend.model.load import ModelRef, ModelSpec
from xbackend.planning.builds import Builds
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.results import BackendResult
from xbackend.results.explanation import LOADED
from xbackend.runners.base import RECOMPUTED

__all__ = ["Grounds", "judgment_of"]


@dataclass(frozen=True)
class Grounds:
    """What every backend's judgment is planned from: the model, the severed model and its
    feeds, the reference's capture, and the tensors' shapes and dtypes."""

    ctx: RunContext
    proto: onnx.ModelProto
    source: ModelSpec  # the model whose folder holds the rewrites' weights
    severed: ModelRef  # the severed model, every node fed from graph inputs
    severed_feeds: Path
    available: Mapping[str, tuple[int, tuple[int, ...]]]
    shapes: Mapping[str, tuple[int, ...]]
    captured: Mapping[str, str]
    ref_capture: str
    tensors: Sequence[str]


def judgment_of(
    grounds: Grounds, planned_backend: PlannedBackend | None, backend: BackendResult, builds: Builds
) -> tuple[BackendJudgment, Judge | None]:
    """How backend `planned_backend` is judged (the one place it is decided), and the judge of its own where
    it has one."""
    ctx, name = grounds.ctx, backend.name
    if planned_backend is None or planned_backend.cls is None:
        return BackendJudgment(name, Fed.NOT_MEASURED, LOADED), None
    spec, src = ctx.spec, grounds.source
    args = (ctx, grounds.proto, builds, grounds.available, grounds.shapes, grounds.captured)
    if not planned_backend.cls.executes_graph and not planned_backend.cls.severs_by_feeds:
        # not fed the reference's values: judged as the reference is, on its own values
        mine = builds.first.layers if builds.ok else None
        if mine is None:
            why = f"{planned_backend.cls.name} cannot be fed the reference's values, and exposed none"
            return BackendJudgment(name, Fed.NOT_MEASURED, why), None
        folded = dict(backend.info).get(RECOMPUTED, "").split(",")
        own = own_grain_judge(*args, mine.capture, name, src.path, folded)
        return BackendJudgment(name, Fed.OWN_VALUES, judge=name, graph=OWN_VALUES, own_run=mine.capture), own
    if _judges_evaluation(planned_backend):
        return BackendJudgment(name, Fed.OWN_JUDGE, graph=OWN_JUDGE), None
    tensors = grounds.tensors
    severed_run = severed_plan(ctx, planned_backend.cls.windowed, tensors, grounds.shapes, grounds.captured)
    if not severed_run.fit.fits:
        return BackendJudgment(name, Fed.NOT_MEASURED, severed_run.fit.reason), None
    judge, graph = "", ""  # the reference grain's judge, unless it has its own
    own_judge: Judge | None = None
    # A runner of its own source keeps its model and takes the reference's values as feeds:
    # it computes each part it exposes from the part's inputs, so it is judged at that grain.
    if not planned_backend.cls.executes_graph:
        folded = dict(backend.info).get(RECOMPUTED, "").split(",")
        own_judge = own_grain_judge(*args, grounds.ref_capture, name, src.path, folded)
        judge, graph = name, grain_of(backend)
    model = (
        grounds.severed
        if planned_backend.cls.executes_graph
        else replace(spec.ref(), inputs=grounds.severed.inputs)
    )
    phase = Phase.planned(LOCAL_PHASE, tensors, 1, model=model, hashed=False, windows=severed_run.windows)
    job = Job(
        f"explain-local-{name}",
        name,
        planned_backend.cls,
        _same_grain(planned_backend, backend),
        grounds.severed_feeds,
        (phase,),
    )
    return BackendJudgment(name, Fed.SEVERED, local_job=job, judge=judge, graph=graph), own_judge


def _judges_evaluation(planned_backend: PlannedBackend) -> bool:
    """Whether `planned_backend`'s severed run would be the float64 judge's own evaluation rounded to the
    model's dtypes: the judge's engine at one BLAS thread (the same sums in the same order)."""
    if planned_backend.cls is None or planned_backend.cls.name != JUDGE_ENGINE:
        return False
    rest = {key: raw_option for key, raw_option in planned_backend.raw_options.items() if key != "narrow"}
    return rest in ({}, {"threads": "1"})


def _same_grain(planned_backend: PlannedBackend, backend: BackendResult) -> tuple[tuple[str, str], ...]:
    """`planned_backend`'s options, at the grain its per-layer build exposed (torch decides op or module grain
    per process, from a bitwise check threads can tip): the local run is fed and judged at the
    tensors that build captured, so it must expose the same ones."""
    if planned_backend.cls is None or not any(
        option.name == "grain" for option in planned_backend.cls.option_specs
    ):
        return planned_backend.variant()
    used = dict(backend.info).get("grain", "")
    return (
        planned_backend.variant(grain="op" if used.startswith("op") else "module")
        if used
        else planned_backend.variant()
    )
