"""ONNX Runtime, CPU execution provider."""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from xbackend.errors import BackendUnavailableError, ModelLoadError, RunnerFailedError
from xbackend.files.modelref import ENGINE_DOMAINS, ModelRef, model_file, read_model_bytes
from xbackend.numerics.metrics import diff_values
from xbackend.numerics.values import Value, normalize, value_sha256
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, Runner, promised_if
from xbackend.runners.buildinfo import OptLevelRow
from xbackend.runners.ort_values import (
    from_ortvalue,
    map_value_dtype,
    numpy_readable,
    to_ort_feeds,
    typed_map_values,
)

__all__ = ["OrtCpuRunner", "ort_message", "ort_version"]

OPT_LEVELS = ("disable", "basic", "extended", "layout", "all")
_OPT_ENUM = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}


class _Captured:
    text = ""


@contextlib.contextmanager
def capture_stderr() -> Iterator[_Captured]:
    """Collect what native code writes to fd 2 (ONNX Runtime's log sink) while the block runs."""
    out = _Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.text = tmp.read().decode(errors="replace")


_MODIFIED = re.compile(r"GraphTransformer (\S+) modified: 1")
_PLACED = re.compile(r"(?:All nodes placed on|Node\(s\) placed on) \[(\w+)\]\. Number of nodes: (\d+)")


def parse_placements(log: str) -> list[tuple[str, str]]:
    """(provider, node count) pairs from ONNX Runtime's verbose 'Node placements' log."""
    return [(m.group(1), m.group(2)) for m in _PLACED.finditer(log)]


def parse_modified(log: str) -> list[str]:
    """Graph transformers that changed the graph, in the order ONNX Runtime first applied them."""
    seen: list[str] = []
    for m in _MODIFIED.finditer(log):
        if m.group(1) not in seen:
            seen.append(m.group(1))
    return seen


def _same(a: Mapping[str, Value], b: Mapping[str, Value]) -> bool:
    return a.keys() == b.keys() and value_sha256(a) == value_sha256(b)


# Element types ONNX Runtime's Python API hands over as numpy arrays.
@functools.lru_cache(maxsize=None)
def _scratch_dir() -> str:
    """A per-process folder for instrumented model copies, removed at exit."""
    path = tempfile.mkdtemp(prefix="xbackend-ort-models-")
    atexit.register(shutil.rmtree, path, True)
    return path


# past this many feeds, run() is avoided: its Python check of the feed names is quadratic in them
# (a 100,000-node model judged node by node has as many feeds)
_MANY_FEEDS = 256


def _bindable(sess: Any, feeds: Mapping[str, Any]) -> bool:
    import onnxruntime as ort  # engine: onnxruntime

    arrays = all(
        isinstance(feed, ort.OrtValue) or (isinstance(feed, np.ndarray) and feed.dtype.kind != "O")
        for feed in feeds.values()
    )
    return arrays and all(output.type.startswith("tensor(") for output in sess.get_outputs())


def _run_bound(sess: Any, names: Sequence[str], feeds: Mapping[str, Any]) -> dict[str, Any]:
    """run() through an IOBinding (ONNX Runtime's public API): the same kernels, linear in feeds."""
    import onnxruntime as ort  # engine: onnxruntime

    io = sess.io_binding()
    kept = []  # the arrays bound stay alive until the run
    for key, feed in feeds.items():
        if isinstance(feed, ort.OrtValue):
            io.bind_ortvalue_input(key, feed)
        else:
            kept.append(feed if feed.flags.c_contiguous else feed.copy(order="C"))  # a 0-d scalar stays 0-d
            io.bind_cpu_input(key, kept[-1])
    for n in names:
        io.bind_output(n)
    sess.run_with_iobinding(io)
    return {name: from_ortvalue(get_output) for name, get_output in zip(names, io.get_outputs())}


def run_session(
    sess: Any, names: Sequence[str], opaque: Sequence[str], feeds: Mapping[str, Value]
) -> dict[str, Any]:
    """Every named output, reading tensors of types numpy cannot take from ORT (bfloat16, float8)
    through OrtValues instead of changing the graph."""
    ort_feeds = to_ort_feeds(feeds)
    if len(ort_feeds) > _MANY_FEEDS and _bindable(sess, ort_feeds):
        return _run_bound(sess, names, ort_feeds)
    if not opaque:
        return dict(zip(names, sess.run(list(names), ort_feeds)))
    rest = [name for name in names if name not in set(opaque)]
    import onnxruntime as ort  # engine: onnxruntime

    # run_with_ort_values takes OrtValues only; sequences and optionals go through run().
    as_values = {
        key: ort_feed if isinstance(ort_feed, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(ort_feed)
        for key, ort_feed in ort_feeds.items()
        if isinstance(ort_feed, (ort.OrtValue, np.ndarray))
    }
    if len(as_values) != len(ort_feeds):
        raise RunnerFailedError(
            "onnxruntime cannot return these outputs' element types through run(), and "
            "run_with_ort_values takes no sequence or optional inputs"
        )
    out = {
        n: from_ortvalue(run_with_ort_value)
        for n, run_with_ort_value in zip(opaque, sess.run_with_ort_values(list(opaque), as_values))
    }
    if rest:
        out.update(zip(rest, sess.run(rest, ort_feeds)))
    return {name: out[name] for name in names}


_CANNOT_LOAD = re.compile(
    r"NOT_IMPLEMENTED|Could not find an implementation|Unsupported model IR version|opset \d+ is under "
    r"development|is not (?:a )?registered|No Op registered|Unsupported ONNX opset|"
    r"only \*?guarantees\*? support",
    re.IGNORECASE,
)


def cannot_load(base_exception: BaseException) -> bool:
    """ORT's error says the model needs something this build lacks (an op, opset or IR version)."""
    return bool(_CANNOT_LOAD.search(str(base_exception)))


_GENERATED = re.compile(r"_token_\d+")


def canonical_nodes(graph: Any) -> list[tuple[str, str]]:
    """(node key, signature) for every node, independent of the order ORT serialized them in and of
    the counters in the names it generated ('reorder_token_7')."""
    # Keyed by what a node produces: the node names ORT invents depend on creation order.
    pairs = sorted(
        (
            _GENERATED.sub("_token", f"{node.op_type}->{','.join(node.output)}"),
            _GENERATED.sub("_token", _node_signature(node)),
        )
        for node in graph.node
    )
    seen: dict[str, int] = {}
    out = []
    for name, sig in pairs:
        k = seen.get(name, 0)
        seen[name] = k + 1
        out.append((name if k == 0 else f"{name}#{k}", sig))
    return out


def _node_signature(node: Any) -> str:
    import onnx  # onnx in workers: a foreign environment may lack onnx

    attrs = ",".join(
        f"{attribute.name}={onnx.helper.get_attribute_value(attribute)!r}"
        for attribute in node.attribute
        if attribute.type != attribute.GRAPH
    )
    reads, writes = ",".join(node.input), ",".join(node.output)
    return f"{node.domain or 'ai.onnx'}:{node.op_type}({reads})->({writes}) {attrs}"


def ort_version() -> str:
    """The version of the onnxruntime that imports: package metadata would name the CPU build
    when onnxruntime and onnxruntime-gpu are both installed."""
    import onnxruntime as ort  # engine: onnxruntime

    return str(ort.__version__)


def ort_dist_version() -> str:
    """The installed onnxruntime distribution's version, without importing it (the GPU build is
    another distribution, onnxruntime-gpu, of the same import package)."""
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def physical_cores() -> int:
    """What ONNX Runtime uses by default for intra-op threads."""
    try:
        import psutil  # optional: a foreign environment may lack psutil
    except ImportError:  # another interpreter with only numpy and the engine
        return _cpuinfo_cores() or os.cpu_count() or 1
    return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def _cpuinfo_cores() -> int:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo; 0 where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as handle:
            blocks = handle.read().split("\n\n")
    except OSError:
        return 0
    cores = set()
    for block in blocks:
        fields = dict(ln.split(":", 1) for ln in block.splitlines() if ":" in ln)
        fields = {key.strip(): field.strip() for key, field in fields.items()}
        if "core id" in fields:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores)


def ort_message(base_exception: BaseException) -> str:
    """ONNX Runtime's error text without its '[ONNXRuntimeError] : 1 : FAIL : file:line fn(...)' prefix."""
    text = " ".join(str(base_exception).split())
    text = re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text)
    text = re.sub(r"^Load model from \S+ failed:\s*", "", text)  # sessions built from a path
    text = re.sub(r"^/\S+:\d+\s+(?:[\w:<>~]+\s+)*[\w:<>~]+\(.*?\)\s+", "", text)
    return text[:400]


@functools.lru_cache(maxsize=1)
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# ModelProto fields written by hand, so a worker with no onnx package (another interpreter) can
# still expose intermediates: ModelProto.ir_version = 1, .graph = 7, .opset_import = 8;
# GraphProto.node = 1, .output = 12; NodeProto.input = 1, .output = 2, .op_type = 4;
# ValueInfoProto.name = 1; OperatorSetIdProto.version = 2.
def _ir_version_field(ir: int) -> bytes:
    return _varint(1 << 3) + _varint(ir)


def _graph_outputs_field(names: Sequence[str]) -> bytes:
    return _field(7, b"".join(_field(12, _field(1, name.encode())) for name in names)) if names else b""


def _probe_max_ir() -> int | None:
    # ORT exposes no constant for this; loading an impossible IR makes it say.
    import onnxruntime as ort

    node = _field(1, b"x") + _field(2, b"y") + _field(4, b"Identity")
    probe = _ir_version_field(1000) + _field(7, _field(1, node)) + _field(8, _varint(2 << 3) + _varint(13))
    try:
        ort.InferenceSession(probe, providers=["CPUExecutionProvider"])
    except Exception as error:
        found = re.search(r"max supported IR version:\s*(\d+)", str(error))
        return int(found.group(1)) if found else None
    return None


class OrtCpuRunner(Runner):
    name = "ort-cpu"
    description = "ONNX Runtime, CPU execution provider"
    shares_process = True  # threads and optimization level are SessionOptions: per session
    windowed = True  # a build allocates only the graph outputs it exposes
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        OptionSpec(
            "threads", int, physical_cores, "intra-op threads (default: physical cores)", threads=True
        ),
        OptionSpec("inter_op_threads", int, 1, "inter-op threads (1 = sequential execution)", threads=True),
        OptionSpec("opt_level", str, "all", "graph optimization level", OPT_LEVELS),
        OptionSpec(
            "deterministic_compute",
            bool,
            False,
            "SessionOptions.use_deterministic_compute (promises run-to-run)",
        ),
        OptionSpec(
            "save_optimized",
            str,
            "",
            "set by xbackend's explanation only: write the graph the session runs (its optimized model) here",
            path=True,
        ),
    )
    saves_optimized_graph = True
    domains = ENGINE_DOMAINS

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._session_obj: Any = None
        self._outputs: list[str] = []
        self._opaque: list[str] = []  # outputs whose element type numpy cannot take from ORT directly
        self._map_dtypes: dict[str, str] = {}  # map outputs: their values' declared dtype
        self._notes: dict[str, str] = {}

    @classmethod
    def load_engine(cls) -> None:
        import onnxruntime  # noqa: F401  # engine: onnxruntime

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("onnxruntime") is None:
            return Availability.missing("onnxruntime not installed (pip install onnxruntime)")
        return Availability.ok(ort_dist_version())

    @classmethod
    def max_ir_version(cls) -> int | None:
        return _probe_max_ir()

    @classmethod
    def promises_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        return super().promises_for(options) | promised_if(options.get("deterministic_compute"), "run-to-run")

    @classmethod
    def determinism_modes(cls) -> dict[str, dict[str, str]]:
        return {"det": {"deterministic_compute": "true"}}

    def providers(self) -> list[Any]:
        """The execution providers a session gets, with their options."""
        return ["CPUExecutionProvider"]

    def session_options(self) -> Any:
        """ONNX Runtime's session options from this runner's (threads, execution mode, optimization level)."""
        import onnxruntime as ort  # engine: onnxruntime

        so = ort.SessionOptions()
        so.intra_op_num_threads = int(self.options["threads"])
        so.inter_op_num_threads = int(self.options["inter_op_threads"])
        so.execution_mode = (
            ort.ExecutionMode.ORT_SEQUENTIAL
            if self.options["inter_op_threads"] <= 1
            else ort.ExecutionMode.ORT_PARALLEL
        )
        so.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, _OPT_ENUM[self.options["opt_level"]]
        )
        so.use_deterministic_compute = bool(self.options["deterministic_compute"])
        so.log_severity_level = 4  # errors reach us as exceptions: ORT's log would print them twice
        return so

    def _suffix(self, model: ModelRef, tensors: tuple[str, ...]) -> bytes:
        """Serialized fields appended to the model bytes: protobuf merges them into the model.

        Appending a ModelProto whose graph holds only extra outputs exposes the
        intermediates without parsing and re-serializing the whole model.
        """
        have = set(model.outputs)
        suffix = _graph_outputs_field([tensor for tensor in tensors if tensor not in have])
        max_ir = self.max_ir_version()
        if max_ir is not None and model.ir_version > max_ir:
            # onnx in workers: a foreign environment may lack onnx
            from xbackend.model.load import downgrade_ir, load_proto

            try:
                downgrade_ir(load_proto(model.path, load_external=False), max_ir)
            except ModelLoadError as error:
                raise BackendUnavailableError(f"onnxruntime reads IR <= {max_ir}: {error}") from error
            self._notes["ir_version"] = (
                f"{model.ir_version} -> {max_ir} (downgraded: the model uses nothing newer)"
            )
            suffix += _ir_version_field(max_ir)
        return suffix

    def _source(self, model: ModelRef, suffix: bytes) -> str | bytes:
        """What ORT loads: the model file itself, or the model with `suffix` appended, written once
        per process to a temporary file (ORT builds from a path in about half the time it takes
        from bytes). Models with external data go as bytes: their data is found by folder."""
        if not suffix:
            return str(model_file(model.path))  # checked: the usual one-line error if missing
        if model.external_data:
            return read_model_bytes(model.path) + suffix
        st = os.stat(model.path)
        key = hashlib.sha256(f"{model.path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode() + suffix).hexdigest()
        path = Path(_scratch_dir()) / f"{key}.onnx"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            with open(model.path, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
                dst.write(suffix)
            os.replace(tmp, path)
        return str(path)

    def _session(self, data: str | bytes, model: ModelRef, so: Any, disabled: Sequence[str] = ()) -> Any:
        import onnxruntime as ort  # engine: onnxruntime

        if model.external_data and isinstance(data, bytes):
            # Bytes carry no directory: tell ORT where the external data lives.
            folder = str(Path(model.path).parent)
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        try:
            return ort.InferenceSession(
                data, so, providers=self.providers(), disabled_optimizers=list(disabled) or None
            )
        except Exception as error:
            if cannot_load(error):
                raise BackendUnavailableError(
                    f"onnxruntime {ort_version()} cannot load this model: {ort_message(error)}"
                ) from error
            raise RunnerFailedError(f"onnxruntime rejected the model: {ort_message(error)}") from error

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        data = self._source(model, self._suffix(model, tensors))
        so = self.session_options()
        if set(tensors) - set(model.outputs):
            # A build exposing intermediates hands every tensor to xbackend, which frees each
            # once compared; ORT's arena would keep their memory and fragment on the next run
            # (GPT-2 T=1024: 1 GiB more). Allocation only: the kernels and their bits are the same.
            so.enable_cpu_mem_arena = False
            self._notes["cpu_mem_arena"] = "off (intermediates exposed: freed as compared)"
        if self.options["save_optimized"]:
            # the graph users' sessions run: fused kernels and all (xbackend.judge.explain_jobs judges it)
            so.optimized_model_filepath = str(self.options["save_optimized"])
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name",
                os.path.basename(so.optimized_model_filepath) + ".data",
            )
            self._session_obj = self._session(data, model, so)
            fp = BuildFingerprint.from_items(self.name, sorted(self.info().items()))
        elif not self.detailed_fingerprint:
            self._session_obj = self._session(data, model, so)
            fp = BuildFingerprint.from_items(self.name, sorted(self.info().items()))
        else:
            with tempfile.TemporaryDirectory(prefix="xbackend-ort-") as tmp:
                so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
                so.add_session_config_entry(
                    "session.optimized_model_external_initializers_file_name", "optimized.data"
                )
                so.log_severity_level = 0
                with capture_stderr() as log:
                    self._session_obj = self._session(data, model, so)
                fp = self._detailed_fingerprint(so.optimized_model_filepath, log.text)
        types = {output.name: output.type for output in self._session_obj.get_outputs()}
        self._outputs = [tensor for tensor in tensors if tensor in types]
        self._opaque = [output for output in self._outputs if not numpy_readable(types[output])]
        self._map_dtypes = {
            output: d for output in self._outputs if (d := map_value_dtype(types[output])) is not None
        }
        return fp

    def _detailed_fingerprint(self, optimized: str, log: str) -> BuildFingerprint:
        """The optimized graph ORT wrote, node by node, plus its node-to-provider placement."""
        try:
            import onnx  # onnx in workers: a foreign environment may lack onnx
        except ImportError:  # an interpreter with only the engine: the graph's bytes stand in
            with open(optimized, "rb") as handle:
                items = [("optimized graph sha256", hashlib.sha256(handle.read()).hexdigest())]
        else:
            items = canonical_nodes(onnx.load(optimized, load_external_data=False).graph)
        items += [(f"placement {k}", v) for k, v in parse_placements(log)]
        items += [(f"option {key}", value) for key, value in sorted(self.info().items())]
        return BuildFingerprint.from_items(self.name, items)

    def _outputs_at(
        self,
        data: str | bytes,
        model: ModelRef,
        feeds: Mapping[str, Value],
        level: str,
        disabled: Sequence[str] = (),
    ) -> tuple[dict[str, Value], list[str]]:
        """Graph outputs of a fresh session at `level`, and the transformers that changed the graph."""
        import onnxruntime as ort  # engine: onnxruntime

        so = self.session_options()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPT_ENUM[level])
        so.log_severity_level = 0
        with capture_stderr() as log:
            sess = self._session(data, model, so, disabled)
        names = [output.name for output in sess.get_outputs()]
        opaque = [output.name for output in sess.get_outputs() if not numpy_readable(output.type)]
        out = {key: normalize(value) for key, value in run_session(sess, names, opaque, feeds).items()}
        return out, parse_modified(log.text)

    def optimization_levels(self, model: ModelRef, feeds: Mapping[str, Value]) -> list[OptLevelRow]:
        """Each level's graph outputs against DISABLE_ALL; for a level that changes bits, the
        transformer(s) whose removal alone restores them. Runs the plain model (no intermediates
        exposed), since exposing tensors blocks the fusions being measured."""
        data = self._source(model, self._suffix(model, ()))
        base, _ = self._outputs_at(data, model, feeds, "disable")
        rows = []
        previous: tuple[dict[str, Value], list[str], list[str]] | None = None
        for level in OPT_LEVELS[1:]:
            got, modified = self._outputs_at(data, model, feeds, level)
            diffs = [diff for n in base for diff in diff_values(n, got[n], base[n])]
            equal = all(diff.bitwise_equal for diff in diffs)
            if equal:
                changed_by = []
            elif previous is not None and previous[1] == modified and _same(got, previous[0]):
                # the same transformers rewrote the graph and the bits agree: the same culprits
                changed_by = previous[2]
            else:
                changed_by = [
                    c for c in modified if _same(self._outputs_at(data, model, feeds, level, [c])[0], base)
                ]
            previous = (got, modified, changed_by)
            rows.append(
                OptLevelRow(
                    level,
                    equal,
                    max((diff.max_ulp or 0 for diff in diffs), default=0),
                    max((diff.scaled_ulp or 0.0 for diff in diffs), default=0.0),
                    tuple(changed_by),
                    tuple(modified),
                )
            )
        return rows

    def run_impl(self, feeds: Mapping[str, Value]) -> dict[str, Value]:
        try:
            out = run_session(self._session_obj, self._outputs, self._opaque, feeds)
        except Exception as error:
            raise RunnerFailedError(f"onnxruntime failed while running: {ort_message(error)}") from error
        for name, dtype in self._map_dtypes.items():
            out[name] = typed_map_values(out[name], dtype)
        return out

    def not_exposed(self) -> dict[str, str]:
        have = set(self._outputs)
        return {
            tensor: "not an output of the ONNX Runtime session"
            for tensor in self._tensors
            if tensor not in have
        }

    def info(self) -> dict[str, str]:
        out = super().info()
        out["onnxruntime"] = ort_version()
        out["execution_mode"] = "sequential" if self.options["inter_op_threads"] <= 1 else "parallel"
        if self._session_obj is not None:
            out["providers"] = ",".join(self._session_obj.get_providers())
            with contextlib.suppress(AttributeError):  # read back from the session, where ORT can
                so = self._session_obj.get_session_options()
                out["in_force.use_deterministic_compute"] = str(bool(so.use_deterministic_compute))
        out.update(self._notes)
        return dict(sorted(out.items()))

    def close(self) -> None:
        self._session_obj = None
