"""The float64 judges: a severed model with each node's operand magnitudes, evaluated in float64
without rounding back (the oracle, narrow=false), whole or cut into windows; and the judge of a
backend judged at the grain it exposes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import onnx

from xbackend.bounds.element import AUX
from xbackend.bounds.propagation import PROP
from xbackend.errors import UsageError
from xbackend.execution.executor import Job
from xbackend.execution.protocol import Phase
from xbackend.files.run_values import CaptureFile
from xbackend.judge.floors import (
    model_ref,
    save_severed_feeds,
)
from xbackend.judge.judge_nodes import JUDGE_PHASE
from xbackend.judge.judge_plan import (
    Judge,
)
from xbackend.judge.judged_graph import judged_model
from xbackend.judge.room import (
    judge_windows,
)
from xbackend.model.extdata import uses_external_data, write_rewritten
from xbackend.model.sever import SEVERED, sever
from xbackend.planning.builds import Builds
from xbackend.planning.context import RunContext
from xbackend.planning.plan import plan_backend

__all__ = ["JUDGE_ENGINE", "judge_job", "own_grain_judge"]

JUDGE_ENGINE = "oracle"


def judge_job(
    ctx: RunContext,
    severed: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]],
    captured: Mapping[str, str],
    spath: Path,
    sfeeds: Path,
    key: str,
    source: str | Path,
    fill_shapes: bool = False,
    folded: Sequence[str] = (),
) -> Judge:
    """The severed model with each node's operand magnitudes, evaluated in float64 without
    rounding back (the oracle, narrow=false); or why it cannot run."""
    oracle = plan_backend(JUDGE_ENGINE, replace(ctx.opts, runner_options=()), ctx.work, None)
    cls = oracle.cls
    if cls is None:
        return Judge(
            None, None, f"the float64 evaluator ({JUDGE_ENGINE}) cannot run here: {oracle.unavailable}"
        )
    judged = judged_model(severed, shapes, captured, fill_shapes, folded)
    jpath = spath.with_name(f"judged{'-' + key if key else ''}.onnx")
    write_rewritten(judged.proto, source, jpath)
    inputs = tuple(
        input_name.name for input_name in severed.graph.input if input_name.name.startswith(SEVERED)
    )
    model = replace(
        model_ref(ctx.spec, jpath, inputs, uses_external_data(judged.proto)),
        outputs=tuple(output_name.name for output_name in judged.proto.graph.output),
    )
    try:
        windows = judge_windows(
            judged.groups,
            shapes,
            (AUX, PROP),
            ctx.run_bytes,
            ctx.spec.weight_bytes,
            ctx.budget,
            ctx.judge_disk,
        )
    except UsageError as error:  # not even one node fits: said, never killed
        return Judge(None, None, f"the float64 judge does not fit: {error}")
    label = f"explain-judge{'-' + key if key else ''}"
    # one BLAS thread: the explanation's jobs run side by side, a core each (its products are
    # a small part of an evaluation that is mostly numpy's elementwise work)
    variant = oracle.variant(narrow="false", threads="1", float32_prefix=AUX)

    def job(suffix: str, tensors: tuple[str, ...]) -> Job:
        phase = Phase.planned(JUDGE_PHASE, tensors, 1, model=model, hashed=False)
        return Job(label + suffix, JUDGE_ENGINE, cls, variant, sfeeds, (phase,))

    if windows:  # each its own job, judged and deleted in turn (xbackend.judge.judge_plan)
        cut = tuple(job(f"-w{index + 1}", window) for index, window in enumerate(windows))
        return Judge(None, judged, windows=cut)
    return Judge(job("", judged.tensors), judged)


def own_grain_judge(
    ctx: RunContext,
    proto: onnx.ModelProto,
    builds: Builds,
    available: Mapping[str, tuple[int, tuple[int, ...]]],
    shapes: Mapping[str, tuple[int, ...]],
    captured: Mapping[str, str],
    fed: str,
    name: str,
    source: str,
    folded: Sequence[str],
) -> Judge:
    """A backend that computes each tensor it exposes from the tensors it exposes above it (torch:
    module outputs): the model severed at those, judged in float64 on the values of capture
    `fed` (the reference's, or its own) (`folded`: the constants it computes again at run time)."""
    layers = builds.first.layers if builds.ok else None
    mine: set[str] = set()
    if layers is not None:
        with CaptureFile(layers.capture) as cap:
            mine = set(cap.names)
    grain = {n: available[n] for n in available if n in mine}
    severed = sever(proto, grain)
    spath = ctx.work / "explain" / f"severed-{name}.onnx"
    sfeeds = spath.with_suffix(".xbv")
    save_severed_feeds(sfeeds, ctx.feeds.arrays, fed, severed.inputs)
    own = {key: value for key, value in captured.items() if key in grain}
    return judge_job(ctx, severed.proto, shapes, own, spath, sfeeds, name, source, folded=folded)
