"""TensorRT through its native Python API (10.x and 11.x): `trt-autotune` and `trt-pinned`.

A TensorRT build times candidate tactics per layer and keeps the fastest, so two builds of
one model can differ. Both runners parse the ONNX model, build a strongly typed network
(precision follows the model's types, as TensorRT 11 always does), clear TF32 unless
`tf32=true`, and build with detailed profiling so the engine inspector names each layer's
tactic.

- trt-autotune: a fresh, empty timing cache per build: every build times every tactic.
  `opt_level=0` is autotuning off: the builder takes the first tactic that works and ignores
  the timing cache.
- trt-pinned: the first build records a timing cache to `cache` (an editable cache where
  TensorRT has them, 10.8+); later builds replay it with ERROR_ON_TIMING_CACHE_MISS. The cache's
  SHA-256 is hashed before and after each build: a replayed cache that changed means misses
  leaked through (seen in TensorRT 11.0), and builds that still differ show in the builds probe.

Per-layer capture: unfused debug tensors (`mark_unfused_tensors_as_debug_tensors`, 10.12+)
where supported, since they do not prevent fusion; else each wanted tensor is marked as a
network output, which does, so those come from a build of their own. `info()` says which.

The parts that need no GPU (builder-config calls, inspector JSON, timing-cache keys, the pin
decision) are plain functions in `xbackend.runners.tensorrt_plan`, tested without TensorRT.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from xbackend.errors import BackendUnavailableError, RunnerFailedError
from xbackend.files.atomic import write_atomic_bytes
from xbackend.files.modelref import ModelRef
from xbackend.host import gpu
from xbackend.host.cudart import DeviceBuffer, Stream, download
from xbackend.numerics.values import Value
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, Runner
from xbackend.runners.tensorrt_plan import (
    ConfigCall,
    TrtLayer,
    apply_calls,
    capture_method,
    config_calls,
    default_cache_path,
    format_timing_key,
    parse_engine_json,
    parse_layer,
    parse_timing_key,
    parse_version,
    pin_mode,
    runtime_layers,
)

__all__ = [
    "ConfigCall",
    "TrtAutotuneRunner",
    "TrtLayer",
    "TrtPinnedRunner",
    "capture_method",
    "config_calls",
    "default_cache_path",
    "format_timing_key",
    "parse_engine_json",
    "parse_layer",
    "parse_timing_key",
    "parse_version",
    "pin_mode",
]

INSTALL_HINT = (
    "install NVIDIA TensorRT 10 or 11 for CUDA 13 (NVIDIA's container, see docker/Dockerfile.gpu, or "
    "pip install tensorrt-cu13 on a host that reaches pypi.nvidia.com)"
)
CAPTURE = ("auto", "debug", "outputs")


def _np_dtype(trt_dtype: Any) -> np.dtype:
    name = str(trt_dtype).rsplit(".", 1)[-1]
    table = {
        "FLOAT": np.float32,
        "HALF": np.float16,
        "BF16": ml_dtypes.bfloat16,
        "FP8": ml_dtypes.float8_e4m3fn,
        "INT8": np.int8,
        "UINT8": np.uint8,
        "INT32": np.int32,
        "INT64": np.int64,
        "BOOL": np.bool_,
    }
    if name not in table:
        raise RunnerFailedError(f"TensorRT tensor type {name} is not read back by xbackend")
    dtype: np.dtype = np.dtype(table[name])
    return dtype


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class TrtAutotuneRunner(Runner):
    name = "trt-autotune"
    description = "TensorRT (native API), a fresh timing cache per build: tactics chosen by timing"
    pinned: ClassVar[bool] = False
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        OptionSpec("tf32", bool, False, "BuilderFlag.TF32 (TensorRT's default is on; off compares float32)"),
        OptionSpec(
            "opt_level", int, 3, "builder_optimization_level 0-5 (0: first tactic that works, no timing)"
        ),
        OptionSpec("workspace_mb", int, 0, "workspace memory pool limit in MiB (0: TensorRT's default)"),
        OptionSpec("device_id", int, 0, "CUDA device"),
        OptionSpec(
            "capture",
            str,
            "auto",
            "per-layer capture: debug (unfused debug tensors, 10.12+: same engine), outputs (marked "
            "outputs: another engine), auto (debug where supported)",
            CAPTURE,
        ),
        OptionSpec(
            "save_optimized",
            str,
            "",
            "set by xbackend's explanation only: write the engine's layers and the ONNX nodes each "
            "computes (JSON, from the engine inspector)",
            path=True,
        ),
    )
    # the engine inspector names the ONNX nodes each layer fuses: the explanation judges at them
    saves_optimized_graph = True
    optimized_format = "runtime"
    optimized_label = "TensorRT's engine layers"

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._model: ModelRef | None = None
        self._trt: Any = None
        self._logger: Any = None
        self._engine: Any = None
        self._context: Any = None
        self._stream: Any = None
        self._method = "outputs"
        self._mode = "fresh"
        self._cache_path = ""
        self._notes: dict[str, str] = {}
        self._layers: list[TrtLayer] = []
        self._plan_sha = ""
        self._io: list[str] = []
        self._missing: dict[str, str] = {}
        self._debug: dict[str, np.ndarray] = {}
        self._listener: Any = None
        self._shapes: dict[str, tuple[int, ...]] = {}

    @classmethod
    def availability(cls) -> Availability:
        version = gpu.tensorrt_version()
        cudart = gpu.find_library("libcudart.so.13") or gpu.find_library("libcudart.so.12")
        problem = gpu.problems(
            "" if version else f"TensorRT is not installed: {INSTALL_HINT}",
            "" if cudart else "libcudart not found: pip install nvidia-cuda-runtime (CUDA 13)",
            gpu.cuda_problem(),
        )
        return Availability.missing(problem) if problem else Availability.ok(version)

    @classmethod
    def instruments(cls, metadata: Mapping[str, str], model_dir: Path, options: Mapping[str, Any]) -> bool:
        if importlib.util.find_spec("tensorrt") is None:
            return True
        import tensorrt as trt  # optional: TensorRT, GPU hosts only

        try:
            method = capture_method(
                str(options.get("capture", "auto")),
                parse_version(trt.__version__),
                hasattr(trt.INetworkDefinition, "mark_unfused_tensors_as_debug_tensors"),
            )
        except BackendUnavailableError:
            return True
        return method == "outputs"

    @classmethod
    def autotune_family(cls, pin_path: str) -> dict[str, tuple[str, dict[str, str]]]:
        return {
            "off": (TrtAutotuneRunner.name, {"opt_level": "0"}),
            "on": (TrtAutotuneRunner.name, {}),
            "pinned": (TrtPinnedRunner.name, {"cache": pin_path.removesuffix(".json") + ".timing-cache"}),
        }

    # --- build ------------------------------------------------------------------------------

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        import tensorrt as trt  # optional: TensorRT, GPU hosts only

        self._trt = trt
        self._model = model
        version = parse_version(trt.__version__)
        self._method = capture_method(
            self.options["capture"],
            version,
            hasattr(trt.INetworkDefinition, "mark_unfused_tensors_as_debug_tensors"),
        )
        if self.pinned:
            self._cache_path = self._cache_option(model)
        self._mode = pin_mode(
            self.pinned, self._cache_path, bool(self._cache_path) and os.path.exists(self._cache_path)
        )
        # the engine is built at the first run: dynamic inputs take the feeds' shapes as their profile
        return BuildFingerprint.from_items(self.name, sorted(self.info().items()))

    def _cache_option(self, model: ModelRef) -> str:
        return ""

    def _logger_obj(self) -> Any:
        trt = self._trt

        class Logger(trt.ILogger):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.ILogger.__init__(self)
                self.errors: list[str] = []

            def log(self, severity: Any, msg: str) -> None:
                if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                    self.errors.append(" ".join(msg.split()))

        return Logger()

    def _fail(self, what: str) -> RunnerFailedError:
        last = (
            self._logger.errors[-1] if self._logger is not None and self._logger.errors else "no error logged"
        )
        return RunnerFailedError(f"TensorRT {what}: {last[:300]}")

    def _build(self, feeds: Mapping[str, Value]) -> None:
        trt = self._trt
        assert self._model is not None
        self._logger = self._logger_obj()
        builder = trt.Builder(self._logger)
        flags = 0
        if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
            flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse_from_file(str(self._model.path)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise BackendUnavailableError(
                f"TensorRT's ONNX parser rejected the model: {'; '.join(errors)[:400]}"
            )
        self._expose(network)
        config = builder.create_builder_config()
        apply_calls(config, trt, config_calls(self.options, self._mode, parse_version(trt.__version__)))
        self._profile(builder, network, config, feeds)
        cache, before = self._timing_cache(config)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            if self._mode == "replay":
                raise RunnerFailedError(
                    f"TensorRT could not build from the pinned timing cache {self._cache_path} "
                    f"({self._last_error()}); if the model, GPU or TensorRT changed, delete it and build "
                    "once to record it again"
                )
            raise self._fail("failed to build the engine")
        data = bytes(plan)
        self._plan_sha = _sha256(data)
        self._after_build(cache, before)
        runtime = trt.Runtime(self._logger)
        self._engine = runtime.deserialize_cuda_engine(data)
        if self._engine is None:
            raise self._fail("could not load the engine it built")
        inspector = self._engine.create_engine_inspector()
        self._layers, _ = parse_engine_json(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
        if self.options["save_optimized"]:
            data = json.dumps(runtime_layers(self._layers), indent=1).encode()
            write_atomic_bytes(Path(self.options["save_optimized"]), data, "TensorRT engine layers")
        self._context = self._engine.create_execution_context()
        self._io = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        if self._method == "debug":
            self._attach_listener()

    def _last_error(self) -> str:
        return self._logger.errors[-1][:200] if self._logger.errors else "no error logged"

    def _expose(self, network: Any) -> None:
        """Make the wanted intermediates readable: debug tensors or marked outputs."""
        assert self._model is not None
        wanted = [tensor for tensor in self._tensors if tensor not in self._model.outputs]
        if not wanted:
            return
        if self._method == "debug":
            network.mark_unfused_tensors_as_debug_tensors()
            return
        by_name = {}
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            for j in range(layer.num_outputs):
                t = layer.get_output(j)
                by_name[t.name] = t
        for name in wanted:
            t = by_name.get(name)
            if t is None:
                self._missing[name] = "not a tensor of TensorRT's network (its ONNX parser folded it)"
            elif not t.is_network_output:
                network.mark_output(t)

    def _profile(self, builder: Any, network: Any, config: Any, feeds: Mapping[str, Value]) -> None:
        """Dynamic inputs get a profile of exactly the feeds' shapes."""
        profile = None
        for i in range(network.num_inputs):
            t = network.get_input(i)
            feed = feeds.get(t.name)
            shape = tuple(feed.shape) if isinstance(feed, np.ndarray) else ()
            self._shapes[t.name] = shape
            if any(size < 0 for size in t.shape):
                profile = profile or builder.create_optimization_profile()
                profile.set_shape(t.name, shape, shape, shape)
        if profile is not None:
            config.add_optimization_profile(profile)

    def _timing_cache(self, config: Any) -> tuple[Any, str]:
        if self._mode == "replay":
            data = Path(self._cache_path).read_bytes()
            cache = config.create_timing_cache(data)
            if not config.set_timing_cache(cache, False):
                raise RunnerFailedError(
                    f"the timing cache {self._cache_path} was recorded by another TensorRT version or GPU: "
                    "delete it and build once to record it again"
                )
            return cache, _sha256(data)
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
        return cache, ""

    def _after_build(self, cache: Any, before: str) -> None:
        data = bytes(cache.serialize())
        after = _sha256(data)
        self._notes["timing_cache_entries"] = str(len(self._entries(cache)))
        if self._mode == "record":
            write_atomic_bytes(self._cache_path, data, "timing cache")
            self._notes["timing_cache_sha256"] = after
        elif self._mode == "replay":
            self._notes["timing_cache_sha256"] = before
            self._notes["timing_cache_after_build"] = (
                "unchanged"
                if after == before
                else f"CHANGED ({after[:12]}): entries were added despite ERROR_ON_TIMING_CACHE_MISS"
            )

    def _entries(self, cache: Any) -> list[str]:
        """Timing-cache keys, where TensorRT lists them (10.8+)."""
        try:
            return sorted(str(queryKey) for queryKey in cache.queryKeys())
        except (AttributeError, RuntimeError):
            return []

    # --- per-layer capture through the debug listener ------------------------------------------

    def _attach_listener(self) -> None:
        trt = self._trt
        runner = self

        class Listener(trt.IDebugListener):  # type: ignore[misc, name-defined]
            def __init__(self) -> None:
                trt.IDebugListener.__init__(self)

            def process_debug_tensor(
                self, addr: int, location: Any, dtype: Any, shape: Any, name: str, stream: int
            ) -> bool:
                # the buffer is valid only during this callback: copy it now
                out = np.empty(tuple(shape), dtype=_np_dtype(dtype))
                runner._debug[name] = download(int(addr), out, stream)
                return True

        self._listener = Listener()
        self._context.set_debug_listener(self._listener)
        wanted = set(self._tensors) - set(self._io)
        for name in wanted:
            if self._engine.is_debug_tensor(name):
                self._context.set_tensor_debug_state(name, True)
            else:
                self._missing[name] = "fused away by TensorRT (not among the unfused tensors it can expose)"

    # --- run -----------------------------------------------------------------------------------

    def run_impl(self, feeds: Mapping[str, Value]) -> dict[str, Value]:
        if self._engine is None:
            self._build(feeds)
        trt = self._trt
        if self._stream is None:
            self._stream = Stream()
        buffers: list[DeviceBuffer] = []
        try:
            for name in self._io:
                if self._engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                    a = np.asarray(feeds[name], dtype=_np_dtype(self._engine.get_tensor_dtype(name)))
                    if not self._context.set_input_shape(name, a.shape):
                        raise RunnerFailedError(f"TensorRT rejected input {name} of shape {a.shape}")
                    buf = DeviceBuffer(a.nbytes)
                    buf.upload(a, self._stream)
                    buffers.append(buf)
                    self._context.set_tensor_address(name, buf.ptr)
            outputs = {}
            for name in self._io:
                if self._engine.get_tensor_mode(name) != trt.TensorIOMode.OUTPUT:
                    continue
                shape = tuple(self._context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise RunnerFailedError(
                        f"output {name} has a data-dependent shape {shape}; xbackend reads fixed-shape "
                        "outputs only"
                    )
                out = np.empty(shape, dtype=_np_dtype(self._engine.get_tensor_dtype(name)))
                buf = DeviceBuffer(out.nbytes)
                buffers.append(buf)
                self._context.set_tensor_address(name, buf.ptr)
                outputs[name] = (out, buf)
            self._debug = {}
            if not self._context.execute_async_v3(self._stream.ptr):
                raise self._fail("failed to run the engine")
            self._stream.synchronize()
            result: dict[str, Value] = {
                n: buf.download(out, self._stream) for n, (out, buf) in outputs.items()
            }
        finally:
            for buffer in buffers:
                buffer.close()
        if self._method == "debug" and self._listener is not None:
            wanted = [
                tensor for tensor in self._tensors if tensor not in result and tensor not in self._missing
            ]
            if wanted and not self._debug:
                # NVIDIA/TensorRT#4456: the listener is never called
                for t in wanted:
                    self._missing[t] = (
                        f"TensorRT {trt.__version__} never called the debug listener (NVIDIA/TensorRT#4456); "
                        "use capture=outputs"
                    )
            result.update({key: value for key, value in self._debug.items() if key in set(self._tensors)})
        return result

    def not_exposed(self) -> dict[str, str]:
        return {key: why for key, why in self._missing.items() if key in set(self._tensors)}

    def fingerprint(self) -> BuildFingerprint:
        """The plan's digest and each layer's tactic; complete once the first run has built."""
        if not self._plan_sha:
            return super().fingerprint()
        items = [(f"layer {layer.name}", f"{layer.type} {layer.tactic}".strip()) for layer in self._layers]
        items.append(("plan sha256", self._plan_sha))
        items += [
            (f"option {key}", value)
            for key, value in sorted(self.info().items())
            if not key.startswith("timing_cache")
        ]
        return BuildFingerprint.from_items(self.name, items)

    def info(self) -> dict[str, str]:
        out = super().info()
        if self._trt is not None:
            out["tensorrt"] = str(self._trt.__version__)
            out["builder_config"] = ", ".join(
                str(call)
                for call in config_calls(self.options, self._mode, parse_version(self._trt.__version__))
            )
        out["per_layer_capture"] = (
            "unfused debug tensors (same engine)"
            if self._method == "debug"
            else "marked outputs (another engine)"
        )
        out["timing_cache"] = {"fresh": "fresh per build", "record": f"recorded to {self._cache_path}",
                               "replay": f"replayed from {self._cache_path}"}[self._mode]  # fmt: skip
        if self._layers:
            out["engine_layers"] = str(len(self._layers))

        name = gpu.device_name(int(self.options["device_id"]))
        if name:
            out["gpu"] = name
        out.update(self._notes)
        return dict(sorted(out.items()))

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._context = None
        self._engine = None


class TrtPinnedRunner(TrtAutotuneRunner):
    name = "trt-pinned"
    description = "TensorRT (native API), timing cache recorded once and replayed with error-on-miss"
    pinned = True
    # Checked, not assumed: rebuilds from one timing cache were seen to differ (NVIDIA/TensorRT#4798).
    promises = frozenset({"build-to-build"})
    option_specs = (
        *TrtAutotuneRunner.option_specs,
        OptionSpec(
            "cache",
            str,
            "",
            "timing cache FILE: recorded by the first build, replayed by later ones (default: per model, "
            "TensorRT version and GPU under ~/.cache/xbackend/tensorrt)",
            path=True,
        ),
    )

    def _cache_option(self, model: ModelRef) -> str:
        if self.options["cache"]:
            return str(self.options["cache"])

        from xbackend.model.load import model_sha256  # onnx: only a pinned build's cache key needs it

        name = gpu.device_name(int(self.options["device_id"]))
        return default_cache_path(model_sha256(Path(model.path)), str(self._trt.__version__), name)
