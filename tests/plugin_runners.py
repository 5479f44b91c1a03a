"""Test-only runners, registered through the real `xbackend.runners` entry-point group.

Each one does one known thing, so tests can assert exact outcomes that real
engines cannot promise across machines.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx

from xbackend.model.load import ModelRef
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, Runner
from xbackend.runners.ort_cpu import OrtCpuRunner
from xbackend.runners.reference import ReferenceRunner


def _prepare_rewritten(
    runner: OrtCpuRunner, proto: onnx.ModelProto, model: ModelRef, tensors: tuple[str, ...]
) -> BuildFingerprint:
    """ONNX Runtime's build of `proto`, the runner's rewrite of `model`, saved in a folder of the
    runner's own that lives as long as it does."""
    folder = tempfile.TemporaryDirectory(prefix=f"xbackend-{runner.name}-")
    runner._rewritten = folder  # type: ignore[attr-defined]
    path = os.path.join(folder.name, "model.onnx")
    onnx.save(proto, path)
    return OrtCpuRunner.prepare_impl(runner, replace(model, path=path, external_data=False), tensors)


def ulps_up(a: np.ndarray, ulps: int) -> np.ndarray:
    """`a` moved up by exactly `ulps` ULPs, element by element."""
    for _ in range(ulps):
        a = np.nextafter(a, np.array(np.inf, a.dtype))
    return a


class NudgeRunner(ReferenceRunner):
    """The reference evaluator, with one tensor moved up by exactly `ulps` ULPs."""

    name = "test-nudge"
    description = "reference + a known ULP nudge on one tensor"
    option_specs = (
        *ReferenceRunner.option_specs,
        OptionSpec("tensor", str, "", "tensor to nudge"),
        OptionSpec("ulps", int, 3, "ULPs to add"),
    )

    def nudges(self, feeds: Mapping[str, np.ndarray]) -> bool:
        """Whether this run is nudged (every run)."""
        return True

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().run_impl(feeds)
        name = self.options["tensor"]
        if name in out and self.nudges(feeds):
            out[name] = ulps_up(np.asarray(out[name]), int(self.options["ulps"]))
        return out


class FlakyBuildRunner(ReferenceRunner):
    """Builds alternate between two 'kernels' for one layer, the way an autotuner picks by timing.

    Build k (counted in a file under `state_dir`) uses kernel k % 2; kernel 1 lands one ULP
    higher on `tensor`. Fingerprints name the kernel per layer, as a real engine's would.
    """

    name = "test-flaky-build"
    description = "alternates kernels between builds"
    option_specs = (
        *ReferenceRunner.option_specs,
        OptionSpec("state_dir", str, "", "where builds are counted"),
        OptionSpec("tensor", str, "", "tensor computed by the alternating kernel"),
    )

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        super().prepare_impl(model, tensors)
        counter = Path(self.options["state_dir"]) / "builds"
        n = int(counter.read_text("utf-8")) if counter.exists() else 0
        counter.write_text(str(n + 1))
        self._kernel = n % 2
        layers = [
            (t, "kernel_b" if t == self.options["tensor"] and self._kernel else "kernel_a") for t in tensors
        ]
        return BuildFingerprint.from_items(self.name, layers)

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().run_impl(feeds)
        name = self.options["tensor"]
        if self._kernel and name in out:
            out[name] = np.nextafter(out[name], np.array(np.inf, out[name].dtype))
        return out


class OutputsOnlyRunner(ReferenceRunner):
    """Exposes graph outputs only, like an engine that fuses everything."""

    name = "test-outputs-only"
    description = "reference that exposes only graph outputs"

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        self._graph_outputs = set(model.outputs)
        return super().prepare_impl(model, tensors)

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v for k, v in super().run_impl(feeds).items() if k in self._graph_outputs}

    def not_exposed(self) -> dict[str, str]:
        return {t: "fused away" for t in self._tensors if t not in self._graph_outputs}


class CrashRunner(ReferenceRunner):
    """Aborts the process while preparing, like a segfaulting engine."""

    name = "test-crash"
    description = "aborts in prepare"

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        os.abort()


class HangRunner(ReferenceRunner):
    """Never returns from run()."""

    name = "test-hang"
    description = "hangs in run"

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # an engine's temp folder, as ONNX Runtime's rewritten models are: a killed worker
        # never removes it itself
        Path(tempfile.mkdtemp(prefix="xbackend-hang-"), "engine.bin").write_bytes(b"0" * 1024)
        while True:
            time.sleep(1)


class MissingRunner(ReferenceRunner):
    """A backend whose library is not installed here."""

    name = "test-missing"
    description = "never available"

    @classmethod
    def availability(cls) -> Availability:
        return Availability.missing("libtest.so not installed")


class ThreadsCrashRunner(ReferenceRunner):
    """The reference evaluator, except that it aborts at any BLAS thread count but 1."""

    name = "test-threads-crash"
    description = "aborts unless threads=1"

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        if int(self.options["threads"]) != 1:
            os.abort()
        return super().prepare_impl(model, tensors)


class SharedProcessRunner(ReferenceRunner):
    """The reference evaluator, declared to share a process between variants: it notes each
    build's thread count and process id under `state_dir`, aborts at `crash_threads` and
    hangs at `hang_threads`."""

    name = "test-shared"
    description = "probe variants share a process"
    shares_process = True
    option_specs = (
        *ReferenceRunner.option_specs,
        OptionSpec("state_dir", str, "", "where builds are noted"),
        OptionSpec("crash_threads", int, -1, "abort when built with this many threads"),
        OptionSpec("hang_threads", int, -1, "hang when built with this many threads"),
    )

    @classmethod
    def process_env(cls, options: Mapping[str, object]) -> dict[str, str]:
        return {}  # no process-wide thread setting: variants may share a process

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        threads = int(self.options["threads"])
        with open(Path(self.options["state_dir"]) / "builds", "a") as f:
            f.write(f"{threads} {os.getpid()}\n")
        if threads == int(self.options["crash_threads"]):
            os.abort()
        while threads == int(self.options["hang_threads"]):
            time.sleep(1)
        return super().prepare_impl(model, tensors)


class ThreadDriftRunner(SharedProcessRunner):
    """`test-shared` as an engine whose instrumented build is a separate one (as ONNX Runtime's
    is), noting how many tensors each build exposes; at `drift_threads` every float tensor from
    `drift_from` on (in the model's order) comes out one ULP higher."""

    name = "test-drift"
    description = "separate instrumented builds; drifts at a known thread count"
    instrumentation_changes_engine = True
    option_specs = (
        *SharedProcessRunner.option_specs,
        OptionSpec("drift_threads", int, -1, "drift when built with this many threads"),
        OptionSpec("drift_from", str, "", "first tensor that drifts"),
    )

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        with open(Path(self.options["state_dir"]) / "exposed", "a") as f:
            f.write(f"{self.options['threads']} {len(tensors)}\n")
        graph = onnx.load(model.path, load_external_data=False).graph
        self._order = [
            o for n in graph.node for o in n.output
        ]  # what drifts does not hang on what is exposed
        return super().prepare_impl(model, tensors)

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().run_impl(feeds)
        if int(self.options["threads"]) != int(self.options["drift_threads"]):
            return out
        start = self.options["drift_from"]
        drifting = False
        for name in self._order:
            drifting = drifting or name == start
            a = out.get(name)
            if drifting and isinstance(a, np.ndarray) and a.dtype.kind == "f":
                out[name] = np.nextafter(a, np.array(np.inf, a.dtype))
        return out


class KillJobRunner(ReferenceRunner):
    """Kills the process that started its worker (a sweep job, or a Ray worker) the first `times`
    builds it is asked for, counted in `marker`: a node or worker lost mid-way through a job."""

    name = "test-kill-job"
    description = "kills its job's process mid-way, then behaves"
    option_specs = (
        *ReferenceRunner.option_specs,
        OptionSpec("marker", str, "", "file counting the kills so far"),
        OptionSpec("times", int, 1, "how many builds kill their job"),
    )

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        marker = Path(self.options["marker"])
        kills = int(marker.read_text("utf-8")) if marker.is_file() else 0
        if kills < int(self.options["times"]):
            marker.write_text(str(kills + 1))
            os.kill(os.getppid(), 9)
            os._exit(1)
        return super().prepare_impl(model, tensors)


class FastGeluRunner(OrtCpuRunner):
    """onnxruntime CPU with every exact GELU swapped for its tanh approximation, as engines with a
    "fast GELU" do: a real precision change, made at the Gelu nodes and nowhere else."""

    name = "test-fast-gelu"
    description = "ONNX Runtime CPU with GELU's tanh approximation"
    saves_optimized_graph = False  # an attribute change inside the engine: judged on the model given

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        proto = onnx.load(model.path)
        for node in proto.graph.node:
            if node.op_type == "Gelu":
                node.attribute.append(onnx.helper.make_attribute("approximate", "tanh"))
        return _prepare_rewritten(self, proto, model, tensors)


class BatchNudgeRunner(NudgeRunner):
    """`test-nudge` only when the batch (any input's first dimension) is larger than 1: a known
    batch variance at a known tensor."""

    name = "test-batch-nudge"
    description = "reference + a ULP nudge on one tensor in batched runs only"

    def nudges(self, feeds: Mapping[str, np.ndarray]) -> bool:
        return any(np.ndim(v) and np.shape(v)[0] > 1 for v in feeds.values())


class RacyRunner(ReferenceRunner):
    """The reference evaluator with an injected, certain race: at `race_threads` threads or more,
    run k of each build lands `tensor` and the graph outputs k + 1 ULPs higher (every run differs
    from every other; the first runs of two builds agree). Below that, or in a model without
    `tensor`, it is the reference. Tests of what xbackend says
    about a race use it: a real race may not show on a loaded machine."""

    name = "test-racy"
    description = "reference + a race at 2+ threads on one tensor"
    option_specs = (
        *ReferenceRunner.option_specs,
        OptionSpec("tensor", str, "pooled", "tensor the race lands on"),
        OptionSpec("race_threads", int, 2, "thread count from which it races"),
    )

    @classmethod
    def process_env(cls, options: Mapping[str, Any]) -> dict[str, str]:
        """BLAS stays on one thread: the race is the only thing `threads` changes."""
        return super().process_env({**options, "threads": 1})

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        self._runs = 0
        graph = onnx.load(model.path, load_external_data=False).graph
        racy = any(self.options["tensor"] in n.output for n in graph.node)
        self._targets = (self.options["tensor"], *model.outputs) if racy else ()
        return super().prepare_impl(model, tensors)

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().run_impl(feeds)
        if int(self.options["threads"]) >= int(self.options["race_threads"]):
            for name in self._targets:
                a = out.get(name)
                if isinstance(a, np.ndarray) and a.dtype.kind == "f":
                    out[name] = ulps_up(a, self._runs + 1)
        self._runs += 1
        return out


class PromisingRunner(RacyRunner):
    """An engine declaring what deterministic hardware promises: the checks are real, and at its
    default of 2 threads it races on the scatter ('pooled'), breaking them."""

    name = "test-promising"
    description = "promises run-to-run, build-to-build and thread-count determinism"
    promises = frozenset({"run-to-run", "build-to-build", "thread-count"})
    option_specs = tuple(replace(o, default=2) if o.name == "threads" else o for o in RacyRunner.option_specs)


class ModedRunner(RacyRunner):
    """An engine with determinism modes, as real engines declare them: at its default of 2 threads
    it races on the scatter ('pooled'). Mode det (`deterministic`) promises run-to-run and keeps
    it: the race is off. Mode hollow promises the same but, with `keeps` off, races anyway."""

    name = "test-moded"
    description = "modes: det keeps its run-to-run promise, hollow breaks it"
    option_specs = (
        *(replace(o, default=2) if o.name == "threads" else o for o in RacyRunner.option_specs),
        OptionSpec("deterministic", bool, False, "promises run-to-run"),
        OptionSpec("keeps", bool, True, "whether deterministic mode really stops the race"),
    )

    @classmethod
    def promises_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        return frozenset({"run-to-run"}) if options.get("deterministic") else frozenset()

    @classmethod
    def determinism_modes(cls) -> dict[str, dict[str, str]]:
        return {"det": {"deterministic": "true"}, "hollow": {"deterministic": "true", "keeps": "false"}}

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.options["deterministic"] and self.options["keeps"]:
            return ReferenceRunner.run_impl(self, feeds)
        return super().run_impl(feeds)


class PlantRunner(OrtCpuRunner):
    """onnxruntime CPU with a known precision loss planted at every node of one op type (or at
    the node outputs named by `at`), each rewrite keeping the planted node's output name, so
    its origins must be exactly those nodes:

    - softmax-recip14: Softmax normalized by a reciprocal rounded to 14 bits (relative 2^-15);
    - erf-as: Erf by Abramowitz & Stegun 7.1.25 (|error| <= 2.5e-5);
    - tf32: MatMul operands rounded to 11 significant bits, as TF32 tensor cores do;
    - bf16-acc: MatMul by a weight, summed in chunks of 32 into a bfloat16 accumulator;
    - onepass-var: LayerNormalization with its variance as E[x²] - E[x]²;
    - affine-bf16: AffineGrid's output rounded to bfloat16 (an op onnx's evaluator computes in
      float32 only, so its float64 value is not one).
    """

    name = "test-plant"
    description = "ONNX Runtime CPU with a planted precision loss"
    # the plant stands for a kernel inside the engine: judged on the model as given, not on the
    # graph of the plant's own float32 steps (whose composition would account for the loss)
    saves_optimized_graph = False
    option_specs = (
        *OrtCpuRunner.option_specs,
        OptionSpec(
            "plant",
            str,
            "softmax-recip14",
            "the loss",
            choices=("softmax-recip14", "erf-as", "tf32", "bf16-acc", "onepass-var", "affine-bf16"),
        ),
        OptionSpec("at", str, "", "comma-separated node outputs to plant at (default: every node of the op)"),
    )
    OPS: ClassVar[dict[str, str]] = {
        "softmax-recip14": "Softmax",
        "erf-as": "Erf",
        "tf32": "MatMul",
        "bf16-acc": "MatMul",
        "onepass-var": "LayerNormalization",
        "affine-bf16": "AffineGrid",
    }

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        proto = onnx.load(model.path)
        plant = str(self.options["plant"])
        at = {s for s in str(self.options["at"]).split(",") if s}
        shapes = _shapes_of(proto)
        _G.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 21)
        nodes: list[onnx.NodeProto] = []
        inits: list[onnx.TensorProto] = []
        self.planted: list[str] = []
        for node in proto.graph.node:
            if node.op_type == self.OPS[plant] and (not at or node.output[0] in at):
                new, consts = _PLANTS[plant](node, shapes)
                nodes += new
                inits += consts
                if new != [node]:
                    self.planted.append(node.output[0])
            else:
                nodes.append(node)
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
        proto.graph.initializer.extend(inits)
        return _prepare_rewritten(self, proto, model, tensors)

    def info(self) -> dict[str, str]:
        return {**super().info(), "planted": ",".join(getattr(self, "planted", []))}


def _shapes_of(proto: onnx.ModelProto) -> dict[str, list[int | str]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:
        inferred = proto
    out: dict[str, list[int | str]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        out[vi.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
    for t in proto.graph.initializer:
        out[t.name] = list(t.dims)
        out[("init", t.name)] = list(t.dims)  # type: ignore[index]
    return out


class _G:
    """Nodes under names unique to one planted node."""

    opset = 21

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0

    def op(self, op: str, *ins: str, out: str = "", **attrs: Any) -> str:
        self.k += 1
        o = out or f"{self.prefix}/plant{self.k}"
        self.nodes.append(onnx.helper.make_node(op, list(ins), [o], **attrs))
        return o

    def const(self, v: Any, dtype: Any = np.float32) -> str:
        self.k += 1
        name = f"{self.prefix}/const{self.k}"
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(v, dtype), name))
        return name

    def reduce(self, op: str, x: str, axes: list[int]) -> str:
        """A Reduce* over `axes` (an input from opset 13 for ReduceSum, from 18 for the rest)."""
        if self.opset < (13 if op == "ReduceSum" else 18):
            return self.op(op, x, axes=axes, keepdims=1)
        return self.op(op, x, self.const(axes, np.int64), keepdims=1)

    def split(self, x: str, keep: int) -> str:
        """x rounded to `keep` significant bits (Veltkamp: c = x·(2^s + 1), hi = c - (c - x))."""
        c = self.op("Mul", x, self.const(2.0 ** (24 - keep) + 1))
        return self.op("Sub", c, self.op("Sub", c, x))


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _softmax_recip14(
    node: onnx.NodeProto, shapes: Any
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    g = _G(node.output[0])
    axes = [_attr(node, "axis", -1)]
    x = node.input[0]
    e = g.op("Exp", g.op("Sub", x, g.reduce("ReduceMax", x, axes)))
    r = g.split(g.op("Reciprocal", g.reduce("ReduceSum", e, axes)), 14)
    g.op("Mul", e, r, out=node.output[0])
    return g.nodes, g.inits


def _erf_as(node: onnx.NodeProto, shapes: Any) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    g = _G(node.output[0])
    z = node.input[0]
    az = g.op("Abs", z)
    t = g.op("Reciprocal", g.op("Add", g.const(1.0), g.op("Mul", az, g.const(0.47047))))
    poly = g.op("Add", g.const(-0.0958798), g.op("Mul", t, g.const(0.7478556)))
    poly = g.op("Mul", t, g.op("Add", g.const(0.3480242), g.op("Mul", t, poly)))
    e = g.op("Sub", g.const(1.0), g.op("Mul", poly, g.op("Exp", g.op("Neg", g.op("Mul", z, z)))))
    g.op("Mul", g.op("Sign", z), e, out=node.output[0])
    return g.nodes, g.inits


def _tf32(node: onnx.NodeProto, shapes: Any) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    g = _G(node.output[0])
    g.op("MatMul", g.split(node.input[0], 11), g.split(node.input[1], 11), out=node.output[0])
    return g.nodes, g.inits


def _bf16_acc(node: onnx.NodeProto, shapes: Any) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    g = _G(node.output[0])
    a, b = node.input
    weight = shapes.get(("init", b))
    k = weight[-2] if weight is not None and len(weight) >= 2 else None
    if not isinstance(k, int) or k <= 0:  # not a product by a weight: left as it is
        return [node], []
    acc = ""
    chunk = 32
    for k0 in range(0, k, chunk):
        k1 = min(k, k0 + chunk)
        sa = g.op("Slice", a, g.const([k0], np.int64), g.const([k1], np.int64), g.const([-1], np.int64))
        sb = g.op("Slice", b, g.const([k0], np.int64), g.const([k1], np.int64), g.const([-2], np.int64))
        part = g.op("MatMul", sa, sb)
        total = part if not acc else g.op("Add", acc, part)
        last = k1 == k
        acc = g.op("Cast", g.op("Cast", total, to=onnx.TensorProto.BFLOAT16), to=onnx.TensorProto.FLOAT,
                   out=node.output[0] if last else "")  # fmt: skip
    return g.nodes, g.inits


def _onepass_var(node: onnx.NodeProto, shapes: Any) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    g = _G(node.output[0])
    x, scale = node.input[0], node.input[1]
    rank = len(shapes.get(x, [])) or 2
    axis = _attr(node, "axis", -1) % rank
    axes = list(range(axis, rank))
    mu = g.reduce("ReduceMean", x, axes)
    q = g.reduce("ReduceMean", g.op("Mul", x, x), axes)
    var = g.op("Sub", q, g.op("Mul", mu, mu))
    sd = g.op("Sqrt", g.op("Add", var, g.const(_attr(node, "epsilon", 1e-5))))
    y = g.op("Mul", g.op("Div", g.op("Sub", x, mu), sd), scale)
    if len(node.input) > 2 and node.input[2]:
        g.op("Add", y, node.input[2], out=node.output[0])
    else:
        g.op("Identity", y, out=node.output[0])
    return g.nodes, g.inits


def _bf16_out(
    node: onnx.NodeProto, shapes: dict[str, list[int | str]]
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The node's float32 output rounded to bfloat16 (relative 2^-9) and widened back."""
    out = node.output[0]
    inner = onnx.NodeProto()
    inner.CopyFrom(node)
    inner.output[0] = out + "/xb.plant.raw"
    down = onnx.helper.make_node(
        "Cast", [inner.output[0]], [out + "/xb.plant.bf16"], to=onnx.TensorProto.BFLOAT16
    )
    up = onnx.helper.make_node("Cast", [down.output[0]], [out], to=onnx.TensorProto.FLOAT)
    return [inner, down, up], []


_PLANTS = {
    "affine-bf16": _bf16_out,
    "softmax-recip14": _softmax_recip14,
    "erf-as": _erf_as,
    "tf32": _tf32,
    "bf16-acc": _bf16_acc,
    "onepass-var": _onepass_var,
}


class OrtNudgeRunner(OrtCpuRunner):
    """onnxruntime CPU with one tensor moved up by `ulps` ULPs after each run: an error made
    inside whichever kernel computes it (in the optimized graph, possibly a fused one)."""

    name = "test-ort-nudge"
    description = "ONNX Runtime CPU + a known ULP nudge on one tensor"
    option_specs = (
        *OrtCpuRunner.option_specs,
        OptionSpec("tensor", str, "", "tensor to nudge"),
        OptionSpec("ulps", int, 3, "ULPs to add"),
    )

    def run_impl(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        out = super().run_impl(feeds)
        name = str(self.options["tensor"])
        if name in out:
            out[name] = ulps_up(np.asarray(out[name]), int(self.options["ulps"]))
        return out


class _Without:
    """Inductor's config as an older torch has it: one switch missing."""

    def __init__(self, config: Any, missing: str) -> None:
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_missing", missing)

    def __getattr__(self, key: str) -> Any:
        if key == self._missing:
            raise AttributeError(key)
        return getattr(self._config, key)

    def __setattr__(self, key: str, value: Any) -> None:
        if key == self._missing:
            raise AttributeError(key)
        setattr(self._config, key, value)


def _old_inductor_runner() -> type:
    from xbackend.runners import torch_compile

    class OldInductorRunner(torch_compile.TorchCompileRunner):
        """torch-compile under an Inductor without batch_invariant (torch 2.11, the GPU images')."""

        name = "test-old-inductor"
        description = "torch-compile as torch 2.11 offers it"

        def prepare_impl(self, model: ModelRef, tensors: Any) -> BuildFingerprint:
            real = torch_compile.set_switches

            def older(config: Any, wanted: Mapping[str, bool], version: str) -> None:
                real(_Without(config, "batch_invariant"), wanted, "2.11.0")

            torch_compile.set_switches = older  # type: ignore[assignment]
            try:
                return super().prepare_impl(model, tensors)
            finally:
                torch_compile.set_switches = real

    return OldInductorRunner


def __getattr__(name: str) -> Any:  # the torch runner subclass is made only where torch is
    if name == "OldInductorRunner":
        return _old_inductor_runner()
    raise AttributeError(name)


class LogitFlipRunner(OrtCpuRunner):
    """onnxruntime CPU whose runner-up logit, at the last position of every row whose position id
    there is `position`, is raised past the top one by `delta`: a planted change of known size
    that flips greedy decoding's token at a known step of each prompt (`batched`: only in batches
    of more than one row)."""

    name = "test-logit-flip"
    description = "ONNX Runtime CPU with the runner-up logit planted past the top one at one position"
    option_specs = (
        *OrtCpuRunner.option_specs,
        OptionSpec("position", int, 20, "the position id whose token flips"),
        OptionSpec("delta", float, 0.5, "how far past the top logit the runner-up is raised"),
        OptionSpec("batched", bool, False, "flip only in batches of more than one row"),
    )

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(super().run_impl(feeds))
        logits = np.array(out["logits"])
        pos = np.asarray(feeds["position_ids"])
        if self.options["batched"] and logits.shape[0] < 2:
            return out
        for r in range(logits.shape[0]):
            if int(pos[r, -1]) == int(self.options["position"]):
                row = logits[r, -1]
                first, second = np.argsort(row)[::-1][:2]
                row[second] = row[first] + np.float32(self.options["delta"])
        out["logits"] = logits
        return out


class ClassFlipRunner(OrtCpuRunner):
    """onnxruntime CPU with one decision planted: in row `row` of `output`, the runner-up score
    raised past the top one by `delta`."""

    name = "test-class-flip"
    description = "ONNX Runtime CPU with one top-1 choice flipped"
    option_specs = (
        *OrtCpuRunner.option_specs,
        OptionSpec("output", str, "y", "the class-score output"),
        OptionSpec("row", int, 0, "the decision to flip (an index over the leading axes, flattened)"),
        OptionSpec("delta", float, 0.25, "how far past the top score the runner-up is raised"),
    )

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(super().run_impl(feeds))
        name = self.options["output"]
        scores = np.array(out[name])
        flat = scores.reshape(-1, scores.shape[-1])
        row = flat[int(self.options["row"])]
        first, second = np.argsort(row)[::-1][:2]
        row[second] = row[first] + np.float32(self.options["delta"])
        out[name] = flat.reshape(scores.shape)
        return out


RETURNS = ("float16-matmul", "float64")


class ReturnedDtypeRunner(OrtCpuRunner):
    """onnxruntime CPU handing back another dtype than the model declares:

    - float16-matmul: every MatMul computed in float16 (its operands cast down, its result cast
      back up for the nodes after it) and handed back as float16 arrays: a precision loss at the
      MatMuls, in the dtype it was made in;
    - float64: every float32 tensor handed back upcast to float64: correct values, wider.
    """

    name = "test-dtype"
    description = "ONNX Runtime CPU handing back float16 or float64 for float32 tensors"
    saves_optimized_graph = False  # the float16 MatMul stands for a kernel inside the engine
    option_specs = (
        *OrtCpuRunner.option_specs,
        OptionSpec(
            "returned", str, "float16-matmul", "what comes back", choices=("float16-matmul", "float64")
        ),
    )

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        self._half: set[str] = set()
        if self.options["returned"] != "float16-matmul":
            return super().prepare_impl(model, tensors)
        proto = onnx.load(model.path)
        nodes: list[onnx.NodeProto] = []
        f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
        for node in proto.graph.node:
            if node.op_type != "MatMul":
                nodes.append(node)
                continue
            out = node.output[0]
            a, b = (f"{out}/half{k}" for k in (0, 1))
            nodes += [
                onnx.helper.make_node("Cast", [node.input[0]], [a], to=f16),
                onnx.helper.make_node("Cast", [node.input[1]], [b], to=f16),
                onnx.helper.make_node("MatMul", [a, b], [f"{out}/half"]),
                onnx.helper.make_node("Cast", [f"{out}/half"], [out], to=f32),
            ]
            self._half.add(out)
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
        return _prepare_rewritten(self, proto, model, tensors)

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().run_impl(feeds)
        for k, v in out.items():
            if not isinstance(v, np.ndarray) or v.dtype != np.float32:
                continue
            if k in self._half:
                out[k] = v.astype(np.float16)  # exact: its values are float16's
            elif self.options["returned"] == "float64":
                out[k] = v.astype(np.float64)
        return out


class FuseUnexposedRunner(OrtCpuRunner):
    """onnxruntime CPU that fuses only where the intermediate is not exposed (as engines fuse
    only what nobody reads): the instrumented and severed runs are exact, the plain run is not.

    - kind bias-matmul: a MatMul and the Add of its bias in one float16 kernel; `at`: the MatMul
      outputs it may fuse (default every one);
    - kind add-layernorm: a residual Add and the LayerNormalization reading it in one kernel whose
      rsqrt keeps 11 bits (float16's: a relative error up to 2^-12); `at`: the LayerNormalization
      outputs it may fuse;
    - kind onepass-var: the same fusion, its variance as E[x²] - E[x]² (exact rsqrt);
    - kind softmax-pv: a Softmax and the MatMul that reads its probabilities (through a Where, as
      torch's exports mask them) in one kernel that holds them in float16; `at`: the Softmax outputs;
    - kind gelu-tanh: an erf GELU (x·0.5·(1 + erf(x/√2)), as exported) computed as the tanh
      approximation; `at`: the Erf outputs;
    - kind gelu-erf16: the same GELU with its erf held in float16, one node of its five;
    - kind rms-norm: an RMS norm (Pow 2, ReduceMean, Add ε, Sqrt, Reciprocal, Mul by x, Mul by
      its weight, as exported) whose rsqrt keeps float16's 11 bits; `at`: the weight Mul outputs;
    - kind swiglu: SiLU(gate)·up (Sigmoid, Mul, Mul) in one float16 kernel; `at`: the products.
    Each fuses only where none of the fused intermediates is exposed."""

    name = "test-fuse"
    description = "ONNX Runtime CPU fusing bias + MatMul in float16 where unexposed"
    saves_optimized_graph = False  # a kernel inside the engine: no graph of it is written
    option_specs = (
        *OrtCpuRunner.option_specs,
        OptionSpec("at", str, "", "comma-separated outputs it may fuse"),
        OptionSpec(
            "kind",
            str,
            "bias-matmul",
            "what it fuses",
            choices=(
                "bias-matmul",
                "add-layernorm",
                "onepass-var",
                "softmax-pv",
                "gelu-tanh",
                "gelu-erf16",
                "rms-norm",
                "swiglu",
            ),
        ),
    )

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        proto = onnx.load(model.path)
        at = {s for s in str(self.options["at"]).split(",") if s}
        exposed = set(tensors) | set(model.outputs)
        if self.options["kind"] in ("add-layernorm", "onepass-var"):
            return self._add_layernorm(proto, model, tensors, at, exposed)
        kind = str(self.options["kind"])
        if kind in _REWRITES:
            self.fused = _REWRITES[kind](proto, at, exposed)
            return _prepare_rewritten(self, proto, model, tensors)
        if kind in ("gelu-tanh", "gelu-erf16"):
            self.fused = _gelu(proto, at, exposed, kind)
            return _prepare_rewritten(self, proto, model, tensors)
        readers: dict[str, list[onnx.NodeProto]] = {}
        for n in proto.graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        weights = {t.name for t in proto.graph.initializer}
        f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
        fused: dict[str, list[onnx.NodeProto]] = {}  # the Add's output -> the kernel's nodes
        gone: set[str] = set()
        for n in proto.graph.node:
            r = readers.get(n.output[0], [])
            if n.op_type != "MatMul" or (at and n.output[0] not in at) or n.output[0] in exposed:
                continue
            if len(r) != 1 or r[0].op_type != "Add" or not (set(r[0].input) - {n.output[0]}) <= weights:
                continue
            add, bias = r[0], next(i for i in r[0].input if i != n.output[0])
            p = f"{add.output[0]}/fp16"
            fused[add.output[0]] = [
                *(
                    onnx.helper.make_node("Cast", [x], [f"{p}{k}"], to=f16)
                    for k, x in enumerate((*n.input, bias))
                ),
                onnx.helper.make_node("MatMul", [f"{p}0", f"{p}1"], [f"{p}mm"]),
                onnx.helper.make_node("Add", [f"{p}mm", f"{p}2"], [f"{p}sum"]),
                onnx.helper.make_node("Cast", [f"{p}sum"], [add.output[0]], to=f32),
            ]
            gone.add(n.output[0])
        nodes: list[onnx.NodeProto] = []
        for n in proto.graph.node:
            if n.output[0] in gone:
                continue
            nodes += fused.get(n.output[0], [n])
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
        self.fused = sorted(gone)
        return _prepare_rewritten(self, proto, model, tensors)

    def _add_layernorm(
        self,
        proto: onnx.ModelProto,
        model: ModelRef,
        tensors: tuple[str, ...],
        at: set[str],
        exposed: set[str],
    ) -> BuildFingerprint:
        adds = {n.output[0] for n in proto.graph.node if n.op_type == "Add"}
        widths = {t.name: int(t.dims[-1]) for t in proto.graph.initializer if t.dims}
        f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
        nodes: list[onnx.NodeProto] = []
        self.fused = []
        for n in proto.graph.node:
            x = n.input[0] if n.input else ""
            mine = n.op_type == "LayerNormalization" and (not at or n.output[0] in at)
            if not mine or x not in adds or x in exposed:
                nodes.append(n)
                continue
            p, width = f"{n.output[0]}/fused", widths[n.input[1]]
            eps = float(_attr(n, "epsilon", 1e-5))
            w = onnx.numpy_helper.from_array(np.full((width, 1), 1 / width, np.float32), f"{p}/w")
            e = onnx.numpy_helper.from_array(np.array(eps, np.float32), f"{p}/eps")
            proto.graph.initializer.extend([w, e])
            make = onnx.helper.make_node
            if self.options["kind"] == "onepass-var":  # E[x²] - E[x]²: cancels where |mean| >> σ
                variance = [
                    make("Mul", [x, x], [f"{p}/x2"]),
                    make("MatMul", [f"{p}/x2", w.name], [f"{p}/ex2"]),
                    make("Mul", [f"{p}/mean", f"{p}/mean"], [f"{p}/m2"]),
                    make("Sub", [f"{p}/ex2", f"{p}/m2"], [f"{p}/var"]),
                ]
                rsqrt = [make("Reciprocal", [f"{p}/sd"], [f"{p}/r11"])]
            else:
                variance = [
                    make("Mul", [f"{p}/d", f"{p}/d"], [f"{p}/d2"]),
                    make("MatMul", [f"{p}/d2", w.name], [f"{p}/var"]),
                ]
                rsqrt = [
                    make("Reciprocal", [f"{p}/sd"], [f"{p}/r"]),
                    make("Cast", [f"{p}/r"], [f"{p}/r16"], to=f16),
                    make("Cast", [f"{p}/r16"], [f"{p}/r11"], to=f32),
                ]
            nodes += [
                make("MatMul", [x, w.name], [f"{p}/mean"]),
                make("Sub", [x, f"{p}/mean"], [f"{p}/d"]),
                *variance,
                make("Add", [f"{p}/var", e.name], [f"{p}/ve"]),
                make("Sqrt", [f"{p}/ve"], [f"{p}/sd"]),
                *rsqrt,
                make("Mul", [f"{p}/d", f"{p}/r11"], [f"{p}/n"]),
                make("Mul", [f"{p}/n", n.input[1]], [f"{p}/g"]),
                make("Add", [f"{p}/g", n.input[2]], [n.output[0]]),
            ]
            self.fused.append(n.output[0])
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
        return _prepare_rewritten(self, proto, model, tensors)

    def info(self) -> dict[str, str]:
        return {**super().info(), "fused": ",".join(getattr(self, "fused", []))}


def _readers(proto: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in proto.graph.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


def _replace_nodes(proto: onnx.ModelProto, at: onnx.NodeProto, new: list[onnx.NodeProto],
                   gone: set[str]) -> None:  # fmt: skip
    """`new` in the place of node `at`; the nodes whose first output is in `gone` removed."""
    nodes = []
    for n in proto.graph.node:
        if n is at or n.output[0] == at.output[0]:
            nodes += new
        elif n.output[0] not in gone:
            nodes.append(n)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)


def _softmax_pv(proto: onnx.ModelProto, at: set[str], exposed: set[str]) -> list[str]:
    """Each Softmax whose probabilities reach one MatMul unexposed (through IsNaN/Where masking):
    the MatMul reads them rounded to float16."""
    readers, f16, f32 = _readers(proto), onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    fused = []
    for s in [n for n in proto.graph.node if n.op_type == "Softmax"]:
        p = s.output[0]
        if (at and p not in at) or p in exposed:
            continue
        chain, t = [p], p
        while True:
            r = [n for n in readers.get(t, []) if n.op_type != "IsNaN"]
            if len(r) != 1 or r[0].op_type not in ("Where", "MatMul"):
                break
            if r[0].op_type == "MatMul":
                mm = r[0]
                if mm.input[0] != t or any(c in exposed for c in chain):
                    break
                h = f"{p}/fp16"
                cast = [onnx.helper.make_node("Cast", [t], [h + "a"], to=f16),
                        onnx.helper.make_node("Cast", [h + "a"], [h + "b"], to=f32)]  # fmt: skip
                mm.input[0] = h + "b"
                _replace_nodes(proto, mm, [*cast, mm], set())
                fused.append(p)
                break
            t = r[0].output[0]
            chain.append(t)
    return fused


def _gelu(proto: onnx.ModelProto, at: set[str], exposed: set[str], kind: str) -> list[str]:
    """Each erf GELU (Div by √2, Erf, Add 1, Mul by 0.5, Mul by x, in any order of the last
    two) whose intermediates are unexposed: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (kind
    gelu-tanh), or with its Erf's result rounded to float16 (gelu-erf16)."""
    readers, made = _readers(proto), {o: n for n in proto.graph.node for o in n.output}
    fused = []
    for e in [n for n in proto.graph.node if n.op_type == "Erf"]:
        div = made.get(e.input[0])
        if div is None or div.op_type != "Div" or (at and e.output[0] not in at):
            continue
        x, inner, t = div.input[0], [div.output[0], e.output[0]], e.output[0]
        end = None
        for _ in range(3):
            r = readers.get(t, [])
            if len(r) != 1 or r[0].op_type not in ("Add", "Mul"):
                break
            t = r[0].output[0]
            if r[0].op_type == "Mul" and x in r[0].input:
                end = r[0]
                break
            inner.append(t)
        if end is None or any(i in exposed for i in inner):
            continue
        if kind == "gelu-erf16":
            raw, half, f16 = f"{e.output[0]}/raw", f"{e.output[0]}/f16", onnx.TensorProto.FLOAT16
            erf = onnx.helper.make_node("Erf", list(e.input), [raw])
            f32 = onnx.TensorProto.FLOAT
            casts = [onnx.helper.make_node("Cast", [raw], [half], to=f16),
                     onnx.helper.make_node("Cast", [half], [e.output[0]], to=f32)]  # fmt: skip
            _replace_nodes(proto, e, [erf, *casts], set())
            fused.append(e.output[0])
            continue
        p, make = f"{e.output[0]}/tanh", onnx.helper.make_node
        consts = {"c3": 0.044715, "k": math.sqrt(2 / math.pi), "one": 1.0, "half": 0.5}
        proto.graph.initializer.extend(
            onnx.numpy_helper.from_array(np.array(v, np.float32), f"{p}/{k}") for k, v in consts.items()
        )
        new = [
            make("Mul", [x, x], [f"{p}/x2"]),
            make("Mul", [f"{p}/x2", x], [f"{p}/x3"]),
            make("Mul", [f"{p}/x3", f"{p}/c3"], [f"{p}/a"]),
            make("Add", [x, f"{p}/a"], [f"{p}/b"]),
            make("Mul", [f"{p}/b", f"{p}/k"], [f"{p}/c"]),
            make("Tanh", [f"{p}/c"], [f"{p}/th"]),
            make("Add", [f"{p}/th", f"{p}/one"], [f"{p}/d"]),
            make("Mul", [f"{p}/d", f"{p}/half"], [f"{p}/h"]),
            make("Mul", [x, f"{p}/h"], [end.output[0]]),
        ]
        _replace_nodes(proto, end, new, set(inner))
        fused.append(e.output[0])
    return fused


class FuseTrtNamesRunner(FuseUnexposedRunner):
    """test-fuse that publishes its kernels as TensorRT's engine inspector names them ("a + b",
    "PWN(...)", "{ForeignNode[first...last]}", reformatting copies beside): the explanation cuts at
    them, as it does for TensorRT, instead of searching by exposure."""

    name = "test-fuse-trt"
    description = "test-fuse publishing its kernels with TensorRT's layer names"
    saves_optimized_graph = True
    optimized_format = "runtime"
    optimized_label = "TensorRT's engine layers"

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        original = onnx.load(model.path, load_external_data=False)
        got = super().prepare_impl(model, tensors)
        if self.options["save_optimized"]:  # after ONNX Runtime wrote its optimized model there
            from xbackend.runners.tensorrt_plan import TrtLayer, runtime_layers

            names = _trt_layer_names(original, set(self.fused), str(self.options["kind"]))
            layers = [TrtLayer(n, _trt_type(n)) for n in names]
            data = json.dumps(runtime_layers(layers))
            Path(self.options["save_optimized"]).write_text(data)
        return got


def _trt_type(name: str) -> str:
    if name.startswith("{ForeignNode"):
        return "Myelin"
    if name.startswith("Reformatting"):
        return "Reformat"
    return "PointWiseV2" if name.startswith("PWN(") else ("CaskGemm" if " + " in name else "Single")


def _trt_layer_names(proto: onnx.ModelProto, sites: set[str], kind: str) -> list[str]:
    """Every node of `proto` in a layer named as TensorRT names it; the planted kernels fused."""
    readers, made = _readers(proto), {o: n for n in proto.graph.node for o in n.output}

    def name(n: onnx.NodeProto) -> str:
        return n.name or f"node_of_{n.output[0]}"

    groups: dict[str, list[onnx.NodeProto]] = {}
    for t in sorted(sites):
        if kind == "bias-matmul":
            groups[t] = [made[t], readers[t][0]]
        elif kind == "softmax-pv":
            chain = [made[t]]
            while chain[-1].op_type != "MatMul":
                chain.append(next(r for r in readers[chain[-1].output[0]] if r.op_type != "IsNaN"))
            groups[t] = chain
        elif kind == "gelu-tanh":
            div, erf = made[made[t].input[0]], made[t]
            chain = [div, erf]
            while not (chain[-1].op_type == "Mul" and div.input[0] in chain[-1].input):
                chain.append(readers[chain[-1].output[0]][0])
            groups[t] = chain
    member = {id(n): t for t, g in groups.items() for n in g}
    out: list[str] = []
    for n in proto.graph.node:
        t = member.get(id(n))
        if n.op_type == "Constant" or (t is not None and n is not groups[t][0]):
            continue
        if t is None:
            out.append(name(n))
            continue
        g = [name(x) for x in groups[t]]
        if kind == "softmax-pv":
            out.append(f"{{ForeignNode[{g[0]}...{g[-1]}]}}")
        elif kind == "gelu-tanh":
            out.append(f"PWN(PWN({g[0]}, {g[1]}), {', '.join(g[2:])})")
        else:
            out.append(" + ".join(g))
        out.append(f"Reformatting CopyNode for Input Tensor 0 to {g[-1]}")
    return out


def _rounded16(t: str, out: str) -> list[onnx.NodeProto]:
    """`t` rounded to float16 and back, as `out`."""
    h, make = f"{out}/f16", onnx.helper.make_node
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    return [make("Cast", [t], [h], to=f16), make("Cast", [h], [out], to=f32)]


def _rms_norm(proto: onnx.ModelProto, at: set[str], exposed: set[str]) -> list[str]:
    """Each RMS norm as exported (Pow 2 -> ReduceMean -> Add ε -> Sqrt -> Reciprocal or Div(1, ·),
    Mul by x, Mul by the weight) whose intermediates are unexposed: its rsqrt rounded to float16."""
    readers, made = _readers(proto), {o: n for n in proto.graph.node for o in n.output}
    fused = []
    # the rsqrt: Reciprocal(s) (torch.export) or Div(1, s) (the TorchScript exporter)
    for rec in [n for n in proto.graph.node if n.op_type in ("Reciprocal", "Div")]:
        chain = [rec]
        for op in ("Sqrt", "Add", "ReduceMean", "Pow"):
            up = made.get(chain[-1].input[-1 if chain[-1] is rec else 0])
            if up is None or up.op_type != op:
                break
            chain.append(up)
        if len(chain) != 5:
            continue
        x = chain[-1].input[0]
        r = readers.get(rec.output[0], [])
        if len(r) != 1 or r[0].op_type != "Mul" or x not in r[0].input:
            continue
        r2 = readers.get(r[0].output[0], [])
        if len(r2) != 1 or r2[0].op_type != "Mul" or (at and r2[0].output[0] not in at):
            continue
        if any(n.output[0] in exposed for n in (*chain, r[0])):
            continue
        raw = f"{rec.output[0]}/raw"
        new = [onnx.helper.make_node(rec.op_type, list(rec.input), [raw]), *_rounded16(raw, rec.output[0])]
        _replace_nodes(proto, rec, new, set())
        fused.append(r2[0].output[0])
    return fused


def _swiglu(proto: onnx.ModelProto, at: set[str], exposed: set[str]) -> list[str]:
    """Each SiLU(gate)·up (Sigmoid(g), Mul(g, ·), Mul(·, up)) whose sigmoid and SiLU are
    unexposed: the three in float16 (its operands rounded in, the product rounded out)."""
    readers = _readers(proto)
    fused = []
    for sg in [n for n in proto.graph.node if n.op_type == "Sigmoid"]:
        g = sg.input[0]
        r = readers.get(sg.output[0], [])
        if len(r) != 1 or r[0].op_type != "Mul" or g not in r[0].input:
            continue
        silu = r[0]
        r2 = readers.get(silu.output[0], [])
        if len(r2) != 1 or r2[0].op_type != "Mul":
            continue
        prod, out = r2[0], r2[0].output[0]
        if (at and out not in at) or sg.output[0] in exposed or silu.output[0] in exposed:
            continue
        up = next(i for i in prod.input if i != silu.output[0])
        p, make = f"{out}/swiglu16", onnx.helper.make_node
        new = [
            *_rounded16(g, f"{p}/g"),
            *_rounded16(up, f"{p}/u"),
            make("Sigmoid", [f"{p}/g"], [f"{p}/s"]),
            *_rounded16(f"{p}/s", f"{p}/s16"),
            make("Mul", [f"{p}/g", f"{p}/s16"], [f"{p}/silu"]),
            *_rounded16(f"{p}/silu", f"{p}/silu16"),
            make("Mul", [f"{p}/silu16", f"{p}/u"], [f"{p}/y"]),
            *_rounded16(f"{p}/y", out),
        ]
        _replace_nodes(proto, prod, new, {sg.output[0], silu.output[0]})
        fused.append(out)
    return fused


_REWRITES = {"softmax-pv": _softmax_pv, "rms-norm": _rms_norm, "swiglu": _swiglu}


class OnnxLoadRunner(Runner):
    """A plugin that reads its model with onnx.load, weights included (as many do), and runs the
    proto it loaded on ONNX Runtime: it needs a staged model whose external data onnx accepts."""

    name = "test-onnx-load"
    description = "onnx.load, then ONNX Runtime on the loaded proto"
    stages_model = True

    @classmethod
    def availability(cls) -> Availability:
        return Availability.ok(onnx.__version__)

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        import onnxruntime as ort

        proto = onnx.load(model.path)  # external data read here: refused if hard-linked or a symlink
        self.weights = sum(len(t.raw_data) for t in proto.graph.initializer)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.session = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        have = {o.name for o in self.session.get_outputs()}
        self.names = [t for t in tensors if t in have]
        return BuildFingerprint.from_items(self.name, [("onnx", onnx.__version__)])

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(self.names, dict(feeds)), strict=True))

    def info(self) -> dict[str, str]:
        return {**super().info(), "weights_loaded": str(getattr(self, "weights", 0))}


class FlushRunner(OrtCpuRunner):
    """onnxruntime CPU that sets every Softmax result below `below` to zero: at 1.6e-38 what
    OpenVINO's exp does (flush-to-zero), far above it a real loss."""

    name = "test-flush"
    description = "ONNX Runtime CPU flushing small Softmax results to zero"
    saves_optimized_graph = False  # stands for a kernel inside the engine
    option_specs = (*OrtCpuRunner.option_specs, OptionSpec("below", float, 1.6e-38, "the flush line"))

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        graph = onnx.load(model.path, load_external_data=False).graph
        self._softmax = {n.output[0] for n in graph.node if n.op_type == "Softmax"}
        return super().prepare_impl(model, tensors)

    def run_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = super().run_impl(feeds)
        for k in self._softmax & set(out):
            v = out[k]
            out[k] = np.where(np.abs(v) < float(self.options["below"]), np.float32(0), v)
        return out


class HalfProbsRunner(ReferenceRunner):
    """The reference evaluator whose attention kernels (com.microsoft Attention,
    MultiHeadAttention, GroupQueryAttention) round the softmax's probabilities to float16 before
    P·V, as a half-precision attention kernel does: a relative 2^-11 inside one fused node."""

    name = "test-half-probs"
    description = "reference with float16 attention probabilities"

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        from xbackend.runners import contrib_transformer  # this worker process's kernels only

        contrib_transformer._attend = _half_attend  # type: ignore[assignment]
        return super().prepare_impl(model, tensors)


def _half_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, add: Any, scale: float, *_: Any,
                 **__: Any) -> tuple[np.ndarray, None]:  # fmt: skip
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = scale * np.matmul(q, np.swapaxes(k, -1, -2)) + (0 if add is None else add)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(np.float16).astype(q.dtype)
    return np.matmul(p, v), None
