"""onnx.reference.ReferenceEvaluator: numpy kernels, every intermediate available.

Its MatMul goes through the BLAS numpy links against, whose results move with
the BLAS thread count, so the worker pins BLAS threads (1 by default) before
numpy is imported.
"""

from __future__ import annotations

import importlib.metadata
import locale
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx

from xbackend.errors import BackendUnavailableError, RunnerFailedError
from xbackend.files.modelref import KNOWN_DOMAINS
from xbackend.model.extdata import map_external
from xbackend.model.load import ModelRef, load_proto
from xbackend.model.ortdomain import as_contrib
from xbackend.numerics.values import Value, normalize
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, Runner
from xbackend.runners.contrib import contrib_ops, legacy_ops
from xbackend.runners.mlops import ml_ops

__all__ = ["ReferenceRunner", "blas_info", "graph_reads", "last_uses", "locale_kept", "prune"]

BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_info() -> str:
    """Name and version of the BLAS numpy was built against."""
    try:
        cfg: Any = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # numpy < 1.25 has no dict mode
        return "unknown"


@contextmanager
def locale_kept() -> Iterator[None]:
    """Run the evaluator and put the process's locale back after it: onnx's StringNormalizer sets
    LC_ALL to the model's locale, and under "C" every later open() without an encoding reads and
    writes ASCII in this process."""
    kept = locale.setlocale(locale.LC_ALL)
    try:
        yield
    finally:
        if locale.setlocale(locale.LC_ALL) != kept:
            locale.setlocale(locale.LC_ALL, kept)


class ReferenceRunner(Runner):
    name = "reference"
    description = "onnx.reference.ReferenceEvaluator (numpy), BLAS threads pinned"
    instrumentation_changes_engine = False  # it computes node by node whatever it exposes
    # a build evaluates only the nodes its exposed tensors need and drops each result its last
    # reader is done with, so a window holds its own tensors and the few still to be read
    windowed = True
    weight_copies = 1.0  # memory-mapped from the model's files
    domains = KNOWN_DOMAINS
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        OptionSpec("threads", int, 1, "BLAS threads (OPENBLAS/OMP/MKL_NUM_THREADS)", threads=True),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._evaluator: Any = None
        self._missing: dict[str, str] = {}
        self._tensor_seqs: set[str] = set()  # outputs declared a sequence of tensors
        self._reads: set[str] = set()  # the graph inputs the pruned graph reads
        self._dead: list[list[str]] = []  # per node: results no later node reads, none exposed

    @classmethod
    def load_engine(cls) -> None:
        import onnx.reference  # noqa: F401  # engine: onnx's reference evaluator

    @classmethod
    def availability(cls) -> Availability:
        return Availability.ok(importlib.metadata.version("onnx"))

    @classmethod
    def process_env(cls, options: Mapping[str, Any]) -> dict[str, str]:
        return {var: str(max(1, int(options["threads"]))) for var in BLAS_THREAD_VARS}

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        from onnx.model_container import ModelContainer  # engine: onnx's reference evaluator
        from onnx.reference import ReferenceEvaluator  # engine: onnx's reference evaluator

        proto = load_proto(model.path, load_external=False)
        # weights mapped from their files, not copied into the proto and again into numpy
        weights = map_external(proto, Path(model.path))
        if weights:  # a fresh proto: the old one's arena still holds the bytes of lifted weights
            proto = onnx.load_from_string(proto.SerializeToString())
        prune(proto, tensors)
        held = {
            e.value
            for initializer in proto.graph.initializer
            for e in initializer.external_data
            if e.key == "location"
        }
        weights = {key: weight for key, weight in weights.items() if key in held}
        proto, weights = self.transform(as_contrib(proto), weights)
        self._reads = {input_name.name for input_name in proto.graph.input} & (
            graph_reads(proto.graph) | set(tensors)
        )
        self._dead = last_uses(proto.graph, {*tensors, *self.kept()})
        self._tensor_seqs = {
            output_name.name for output_name in proto.graph.output if _sequence_of_tensors(output_name.type)
        }
        container = ModelContainer()
        container.model_proto = proto
        container.set_large_initializers(weights)
        try:
            opset = next(
                (opset.version for opset in proto.opset_import if opset.domain in ("", "ai.onnx")), 1
            )
            ops = [*ml_ops(), *contrib_ops(), *legacy_ops(opset)]
            self._evaluator = ReferenceEvaluator(container, new_ops=ops)
        except Exception as e:
            raise BackendUnavailableError(f"the reference evaluator cannot load the model: {_msg(e)}") from e
        _name_failing_nodes(self._evaluator)
        return BuildFingerprint.from_items(self.name, sorted(self.info().items()))

    def transform(
        self, proto: onnx.ModelProto, weights: dict[str, np.ndarray]
    ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        """The model the evaluator runs and its mapped weights (the oracle promotes both to
        float64)."""
        return proto, weights

    def kept(self) -> set[str]:
        """Results a run keeps beside the exposed tensors (for inspect)."""
        return set()

    def widen(self, feeds: Mapping[str, Value]) -> dict[str, Value]:
        """Feeds as the transformed model takes them."""
        return dict(feeds)

    def narrow(self, name: str, value: Value) -> Value:
        """A result as the original model would type it."""
        return value

    def inspect(self, results: Mapping[str, Value]) -> None:
        """Every result of a run, before any is narrowed (the oracle checks what it computed)."""

    def run_impl(self, feeds: Mapping[str, Value]) -> dict[str, Value]:
        try:
            used = {key: feed for key, feed in feeds.items() if key in self._reads}
            with locale_kept():
                results = _evaluate(self._evaluator, self.widen(used), self._dead)
        except Exception as error:
            raise RunnerFailedError(f"the reference evaluator failed while running {_msg(error)}") from error
        self.inspect(results)
        self._missing = {
            tensor: "not produced by the reference evaluator"
            for tensor in self._tensors
            if tensor not in results
        }
        out = {}
        for t in self._tensors:
            if t in results:  # popped: a float64 result goes as its narrowed copy arrives
                v = results.pop(t)
                out[t] = self.narrow(t, normalize(_unnest(v) if t in self._tensor_seqs else v))
                del v
        return out

    def not_exposed(self) -> dict[str, str]:
        return dict(self._missing)

    def info(self) -> dict[str, str]:
        out = super().info()
        out["onnx"] = importlib.metadata.version("onnx")
        out["numpy"] = np.__version__
        out["blas"] = blas_info()
        out.update({f"env.{v}": os.environ.get(v, "unset") for v in BLAS_THREAD_VARS})
        return dict(sorted(out.items()))

    def close(self) -> None:
        self._evaluator = None


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """The names a node's subgraphs read (from the enclosing scope, by name: If, Loop, Scan)."""
    out: set[str] = set()
    for attribute in node.attribute:
        for sub in (attribute.g, *attribute.graphs) if attribute.HasField("g") else attribute.graphs:
            out |= graph_reads(sub)
    return out


def graph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every name the graph's nodes read, their subgraphs' included."""
    out: set[str] = set()
    for node in graph.node:
        out.update(input_name for input_name in node.input if input_name)
        out |= _subgraph_reads(node)
    return out


def prune(proto: onnx.ModelProto, wanted: Sequence[str]) -> None:
    """Only the nodes and weights `wanted` (and the graph outputs still made) need, in place:
    a window of a severed graph evaluates its own nodes, not the whole model's."""
    graph = proto.graph
    need = set(wanted)
    keep: list[onnx.NodeProto] = []
    for node in reversed(graph.node):
        if any(output_name in need for output_name in node.output):
            keep.append(node)
            need.update(input_name for input_name in node.input if input_name)
            need |= _subgraph_reads(node)
    if len(keep) == len(graph.node):
        return
    made = (
        {output_name for node in keep for output_name in node.output}
        | {input_name.name for input_name in graph.input}
        | {initializer.name for initializer in graph.initializer}
    )
    outputs = [
        output_name for output_name in graph.output if output_name.name in made and output_name.name in need
    ]
    inits = [initializer for initializer in graph.initializer if initializer.name in need]
    del graph.node[:], graph.output[:], graph.initializer[:]
    graph.node.extend(reversed(keep))
    graph.output.extend(outputs)
    graph.initializer.extend(inits)


def last_uses(graph: onnx.GraphProto, kept: set[str]) -> list[list[str]]:
    """Per node, the results to drop once it ran: read by no later node, not in `kept`."""
    last: dict[str, int] = {}
    for k, node in enumerate(graph.node):
        for name in {
            *(input_name for input_name in node.input if input_name),
            *_subgraph_reads(node),
            *(output_name for output_name in node.output if output_name),
        }:
            last[name] = k
    held = kept | {initializer.name for initializer in graph.initializer}
    dead: list[list[str]] = [[] for _ in graph.node]
    for name, k in sorted(last.items()):
        if name not in held:
            dead[k].append(name)
    return dead


def _evaluate(evaluator: Any, feeds: dict[str, Value], dead: list[list[str]]) -> dict[str, Value]:
    """ReferenceEvaluator.run(intermediate=True), each result dropped after its last reader
    (`dead`): a run holds the tensors it exposes and those still to be read, not all of them."""
    nodes = getattr(evaluator, "rt_nodes_", None)
    inits = getattr(evaluator, "rt_inits_", None)
    if nodes is None or inits is None or len(nodes) != len(dead):  # another onnx: keep everything
        return dict(evaluator.run(None, feeds, intermediate=True))
    results: dict[str, Value] = {"": None, **inits, **feeds}
    del feeds
    for node, drop in zip(nodes, dead, strict=True):
        missing = [input_name for input_name in node.input if input_name not in results]
        if missing:
            raise RuntimeError(f"{node.op_type} reads {missing[0]!r}, which is neither fed nor computed")
        inputs = [results[input_name] for input_name in node.input]
        outs = node.run(*inputs, context=results) if node.need_context() else node.run(*inputs)
        del inputs
        # an omitted output ("") is never bound: "" stands for every omitted input, None
        results.update((name, out) for name, out in zip(node.output, outs, strict=False) if name)
        del outs
        for name in drop:
            results.pop(name, None)
    return results


class NodeError(Exception):
    """A node of the reference evaluator failed; says which node and op."""


def _name_failing_nodes(evaluator: Any) -> None:
    """Wrap each node's kernel so an exception names the node and op that raised it."""
    for node in getattr(evaluator, "rt_nodes_", []) or []:
        onnx_node = getattr(node, "onnx_node", None)
        if onnx_node is None:
            continue
        label = f"node {onnx_node.name!r} " if onnx_node.name else ""
        where = f"{label}(op {onnx_node.domain + '.' if onnx_node.domain else ''}{onnx_node.op_type}, " + (
            f"output {onnx_node.output[0]!r})" if onnx_node.output else "no outputs)"
        )
        original = node.run

        def run(*args: Any, _orig: Any = original, _where: str = where, **kwargs: Any) -> Any:
            try:
                return _orig(*args, **kwargs)
            except NodeError:
                raise
            except Exception as error:
                raise NodeError(f"at {_where}: {_msg(error)}") from error

        node.run = run


def _sequence_of_tensors(tp: onnx.TypeProto) -> bool:
    """A sequence of tensors, optional or not."""
    if tp.HasField("optional_type"):
        tp = tp.optional_type.elem_type
    return bool(tp.HasField("sequence_type") and tp.sequence_type.elem_type.HasField("tensor_type"))


def _unnest(v: Any) -> Any:
    """The evaluator returns an optional sequence an If branch builds as [[t, ...]]: a
    sequence of tensors is one list (what the model declares, and ONNX's node tests expect)."""
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], list):
        return v[0]
    return v


_NO_OP = re.compile(r"No registered implementation for operator '([^']+)' and domain '([^']*)'")
_UNKNOWN = re.compile(r"Node type '([^']+)' from domain '([^']*)' is unknown")


def _msg(base_exception: BaseException) -> str:
    text = " ".join(str(base_exception).split()) or type(base_exception).__name__
    if isinstance(base_exception, NodeError):
        return text[:400]
    lacks = _NO_OP.search(text)
    if lacks:  # not the evaluator's list of every op it has
        op, domain = lacks.group(1), lacks.group(2) or "ai.onnx"
        return f"it has no implementation of {domain} {op}"
    unknown = _UNKNOWN.search(text)
    if unknown:
        op, domain = unknown.group(1), unknown.group(2)
        whose = ", an ONNX Runtime kernel" if domain == "com.microsoft" else ""
        return (
            f"xbackend has no float64 form of {domain}.{op}{whose} (the kernels it evaluates: "
            "docs/explanations.md, 'ONNX Runtime's kernels')"
        )
    return f"{type(base_exception).__name__}: {text[:300]}"
