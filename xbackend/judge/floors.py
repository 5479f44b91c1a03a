"""The noise floors' jobs, asked for with --noise-samples K or needed by a backend the float64
judge cannot judge: the permuted model (xbackend.model.reorder) in K orders on the floor engine,
whole and severed; and the severed model's feeds: the reference's captured values under severed
names, read one at a time from its capture (the floor's arithmetic is xbackend.numerics.spread's,
in the worker)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from xbackend.execution.executor import Job
from xbackend.execution.protocol import Phase
from xbackend.files.run_values import CaptureFile
from xbackend.files.storage import save_values
from xbackend.judge.judge_plan import NODE_FLOOR_PHASE
from xbackend.model.extdata import write_rewritten
from xbackend.model.load import ModelRef, ModelSpec
from xbackend.model.reorder import Reordered, index_feeds, reorder
from xbackend.model.sever import SEVERED, Severed
from xbackend.numerics.values import Value
from xbackend.planning.context import PlannedBackend, RunContext
from xbackend.planning.plan import plan_backend

__all__ = [
    "FLOOR_ENGINE",
    "FLOOR_PHASE",
    "FLOOR_SAMPLES",
    "SeveredFeeds",
    "floor_backend",
    "floor_job",
    "model_ref",
    "node_floor_job",
    "save_severed_feeds",
]

FLOOR_ENGINE = "ort-cpu"
FLOOR_SAMPLES = 8  # K where the floor is needed and --noise-samples did not say
FLOOR_PHASE = "floor"


class SeveredFeeds(Mapping[str, Value]):
    """The feeds plus the reference's captured values under severed names, read one at a time
    (and `extra` values: a permuted model's index inputs)."""

    def __init__(
        self,
        feeds: Mapping[str, Value],
        cap: CaptureFile,
        severed: Sequence[str],
        extra: Mapping[str, Value] | None = None,
    ) -> None:
        self.feeds = feeds
        self.cap = cap
        self.severed = {SEVERED + n: n for n in severed}
        self.extra = dict(extra or {})

    def __getitem__(self, key: str) -> Value:
        if key in self.extra:
            return self.extra[key]
        return self.cap[self.severed[key]] if key in self.severed else self.feeds[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.extra
        yield from self.feeds
        yield from self.severed

    def __len__(self) -> int:
        return len(self.extra) + len(self.feeds) + len(self.severed)


def save_severed_feeds(
    path: Path,
    feeds: Mapping[str, Value],
    ref_capture: str,
    severed: Sequence[str],
    extra: Mapping[str, Value] | None = None,
) -> None:
    """Write a severed model's feeds to `path`: the model's feeds, the reference's captured
    values of `severed` under severed names (streamed from its capture), and `extra`."""
    with CaptureFile(ref_capture) as cap:
        save_values(path, SeveredFeeds(feeds, cap, severed, extra))


def floor_job(
    ctx: RunContext,
    engine: PlannedBackend | None,
    src: ModelSpec,
    proto: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]],
    tensors: tuple[str, ...],
    folder: Path,
    unjudged: bool,
) -> tuple[Job | None, Reordered | None, tuple[Path, ...]]:
    """The permuted model in K orders on the floor engine, where the user asked for floors
    (--noise-samples K) or a backend cannot be judged against float64 (`unjudged`) and is
    held to them (`engine`: the floor engine, xbackend.planning.plan.floor_backend)."""
    opts = ctx.opts
    if engine is None or engine.cls is None or not (opts.noise_samples or unjudged):
        return None, None, ()
    reordered = reorder(proto, shapes)
    path = folder / "reordered.onnx"
    write_rewritten(reordered.proto, src.path, path)
    identity = index_feeds(reordered, None)
    model = model_ref(src, path, tuple(identity))
    base = folder / "order-0.xbv"
    save_values(base, {**ctx.feeds.arrays, **identity})
    paths = []
    for k in range(1, (opts.noise_samples or FLOOR_SAMPLES) + 1):  # an order's file: its permutations alone
        p = folder / f"order-{k}.xbv"
        save_values(p, index_feeds(reordered, np.random.default_rng([opts.seed, k])))
        paths.append(p)
    phase = Phase.planned(FLOOR_PHASE, tensors, 1, tuple(paths), model=model, extras="spread")
    # One thread: a race between threads (a scatter's lost updates) must not pass for reordering.
    variant = engine.variant(threads="1")
    return Job("explain-floor", engine.name, engine.cls, variant, base, (phase,)), reordered, tuple(paths)


def node_floor_job(
    ctx: RunContext,
    src: ModelSpec,
    engine: PlannedBackend,
    severed: Severed,
    shapes: Mapping[str, tuple[int, ...]],
    ref_capture: str,
    folder: Path,
) -> Job | None:
    """The severed model with every reduction permuted, fed the reference's values, run in K
    random orders on the floor engine: how far legitimate orders move each node on its own."""
    if engine.cls is None or not ctx.opts.noise_samples:
        return None
    rs = reorder(severed.proto, {**shapes, **{SEVERED + key: shape for key, shape in shapes.items()}})
    if not rs.sites:
        return None
    path = folder / "reordered-severed.onnx"
    write_rewritten(rs.proto, src.path, path)
    identity = index_feeds(rs, None)
    inputs = (*(SEVERED + input_name for input_name in severed.inputs), *identity)
    model = replace(
        model_ref(src, path, inputs), outputs=tuple(output_name.name for output_name in rs.proto.graph.output)
    )
    base = folder / "node-order-0.xbv"
    paths = []
    save_severed_feeds(base, ctx.feeds.arrays, ref_capture, severed.inputs, identity)
    for k in range(1, ctx.opts.noise_samples + 1):  # an order's file: its permutations alone
        p = folder / f"node-order-{k}.xbv"
        save_values(p, index_feeds(rs, np.random.default_rng([ctx.opts.seed, 1000 + k])))
        paths.append(p)
    tensors = tuple(
        output_name for node in severed.proto.graph.node for output_name in node.output if output_name
    )
    phase = Phase.planned(NODE_FLOOR_PHASE, tensors, 1, tuple(paths), model=model, extras="spread")
    # one thread, as the floor: a race must not pass for reordering
    return Job("explain-node-floor", engine.name, engine.cls, engine.variant(threads="1"), base, (phase,))


def model_ref(
    spec: ModelSpec, path: Path, extra_inputs: tuple[str, ...], external: bool | None = None
) -> ModelRef:
    """A worker's reference to the model at `path` as `spec` describes it, with `extra_inputs` fed beside
    its own."""
    inputs = (*spec.input_names, *extra_inputs)
    external = spec.external_data if external is None else external
    return ModelRef(str(path), spec.ir_version, inputs, spec.output_names, external, spec.weight_bytes)


def floor_backend(ctx: RunContext, planned: Sequence[PlannedBackend]) -> PlannedBackend | None:
    """ort-cpu as the user configured it, else with its defaults; None when it cannot run."""
    mine = next(
        (
            planned_backend
            for planned_backend in planned
            if planned_backend.cls is not None and planned_backend.cls.name == FLOOR_ENGINE
        ),
        None,
    )
    if mine is not None and mine.interpreter is None:
        return mine
    p = plan_backend(FLOOR_ENGINE, replace(ctx.opts, runner_options=()), ctx.work, None)
    return p if p.cls is not None else None
