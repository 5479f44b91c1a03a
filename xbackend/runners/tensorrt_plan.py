"""TensorRT's parts that need no GPU: builder-config calls from options, the engine
inspector's JSON, timing-cache keys, the pin decision and where pinned caches live.

Plain functions over plain values, tested without TensorRT; `xbackend.runners.tensorrt`
applies them to a real builder.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xbackend.errors import BackendUnavailableError, RunnerFailedError

__all__ = [
    "ConfigCall",
    "TrtLayer",
    "apply_calls",
    "cache_home",
    "capture_method",
    "config_calls",
    "default_cache_path",
    "format_timing_key",
    "layer_nodes",
    "parse_engine_json",
    "parse_layer",
    "parse_timing_key",
    "parse_version",
    "pin_mode",
    "runtime_layers",
]

OPT_LEVELS = range(6)


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a TensorRT version string ("10.13.3.9" -> (10, 13))."""
    m = re.match(r"(\d+)\.(\d+)", text)
    if m is None:
        raise ValueError(f"not a TensorRT version: {text!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class ConfigCall:
    """One builder-config call, by name: enum integers move between TensorRT versions."""

    op: str  # set_flag | clear_flag | set
    name: str
    value: Any = None

    def __str__(self) -> str:
        return f"{self.op}({self.name})" if self.op != "set" else f"{self.name}={self.value}"


def pin_mode(pinned: bool, cache_path: str, exists: bool) -> str:
    """What a build does with its timing cache: "fresh" (a new, empty one: autotuning), "record"
    (fresh, then saved to `cache_path`) or "replay" (the saved one, misses are errors)."""
    if not pinned:
        return "fresh"
    if not cache_path:
        raise BackendUnavailableError("trt-pinned needs a timing cache path (--set trt-pinned.cache=FILE)")
    return "replay" if exists else "record"


def config_calls(options: Mapping[str, Any], mode: str, version: tuple[int, int]) -> list[ConfigCall]:
    """The builder-config calls for runner `options`, pin `mode` and TensorRT `version`."""
    level = int(options["opt_level"])
    if level not in OPT_LEVELS:
        raise RunnerFailedError(f"opt_level={level}: TensorRT's builder_optimization_level is 0 to 5")
    calls = [
        ConfigCall("set", "profiling_verbosity", "DETAILED"),
        ConfigCall("set", "builder_optimization_level", level),
        ConfigCall("set_flag" if options["tf32"] else "clear_flag", "TF32"),
    ]
    if int(options.get("workspace_mb", 0)):
        calls.append(ConfigCall("set", "workspace_bytes", int(options["workspace_mb"]) << 20))
    if mode in ("record", "replay") and version >= (10, 8):
        calls.append(ConfigCall("set_flag", "EDITABLE_TIMING_CACHE"))
    if mode == "replay":
        calls.append(ConfigCall("set_flag", "ERROR_ON_TIMING_CACHE_MISS"))
    return calls


def apply_calls(config: Any, trt: Any, calls: Sequence[ConfigCall]) -> None:
    """Apply the planned builder-config calls (set a field, set a flag, clear one) to TensorRT's `config`."""
    for call in calls:
        if call.op == "set":
            if call.name == "profiling_verbosity":
                config.profiling_verbosity = getattr(trt.ProfilingVerbosity, call.value)
            elif call.name == "workspace_bytes":
                config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, call.value)
            else:
                setattr(config, call.name, call.value)
            continue
        flag = getattr(trt.BuilderFlag, call.name, None)
        if flag is None:
            raise BackendUnavailableError(f"TensorRT {trt.__version__} has no BuilderFlag.{call.name}")
        (config.set_flag if call.op == "set_flag" else config.clear_flag)(flag)


@dataclass(frozen=True)
class TrtLayer:
    """One engine layer as the inspector describes it."""

    name: str
    type: str = ""
    tactic: str = ""


def parse_layer(entry: Any) -> TrtLayer:
    """A layer from the engine inspector's JSON: a bare name (profiling verbosity below DETAILED)
    or an object with Name, LayerType and TacticName or TacticValue."""
    if isinstance(entry, str):
        return TrtLayer(entry)
    if not isinstance(entry, dict) or "Name" not in entry:
        raise ValueError(f"not an engine-inspector layer: {str(entry)[:80]}")
    tactic = entry.get("TacticName") or entry.get("TacticValue") or ""
    return TrtLayer(str(entry["Name"]), str(entry.get("LayerType", "")), str(tactic))


def parse_engine_json(text: str) -> tuple[list[TrtLayer], list[str]]:
    """(layers, I/O tensor names) from `IEngineInspector.get_engine_information(JSON)`. TensorRT
    10 lists the I/O tensors under "Bindings", 11 under "I/O Tensors"."""
    try:
        doc = json.loads(text)  # TensorRT's own, not a file from others
    except json.JSONDecodeError as error:
        raise ValueError(f"the engine inspector's JSON does not parse: {error}") from error
    layers = [parse_layer(x) for x in doc.get("Layers", [])]
    io = doc.get("I/O Tensors", doc.get("Bindings", []))
    names = [x if isinstance(x, str) else str(x.get("Name", "")) for x in io]
    return layers, names


_FOREIGN = re.compile(r"^\{?ForeignNode\[(.+?)\.\.\.(.+)\]\}?$")
_NOT_NODES = ("Reformatting CopyNode", "(Unnamed Layer", "[trainStation", "myelinCopy")


def _split_top(text: str, seps: Sequence[str]) -> list[str]:
    """`text` split at each of `seps` outside parentheses and brackets."""
    out, depth, k, start = [], 0, 0, 0
    while k < len(text):
        c = text[k]
        depth += c in "([{"
        depth -= c in ")]}"
        sep = next((sep for sep in seps if depth == 0 and text.startswith(sep, k)), "")
        if sep:
            out.append(text[start:k])
            k += len(sep)
            start = k
            continue
        k += 1
    out.append(text[start:])
    return [x.strip() for x in out if x.strip()]


def layer_nodes(name: str) -> tuple[tuple[str, ...], bool]:
    """The ONNX node names one engine layer computes, from its name as TensorRT writes it:
    "a + b" (vertical fusion), "a || b" (horizontal), "PWN(a, PWN(b, c))" (a pointwise kernel),
    "{ForeignNode[first...last]}" (a Myelin region: every node from first to last, said by the
    flag). Reformatting copies and unnamed layers compute no node of the model: ()."""
    text = name.strip()
    if text.startswith(_NOT_NODES):
        return (), False
    foreign = _FOREIGN.match(text)
    if foreign:
        return (foreign.group(1).strip(), foreign.group(2).strip()), True
    out: list[str] = []
    for part in _split_top(text, (" + ", " || ")):
        if part.startswith("PWN(") and part.endswith(")"):
            for inner in _split_top(part[4:-1], (", ",)):
                out.extend(layer_nodes(inner)[0])
        elif not part.startswith(_NOT_NODES):
            out.append(part)
    return tuple(out), False


def runtime_layers(layers: Sequence[TrtLayer]) -> list[dict[str, Any]]:
    """The engine's layers as xbackend's runtime-graph JSON (as OpenVINO's): each layer's type and
    the ONNX nodes it computes; a Myelin region as its first and last node, with "range"."""
    out = []
    for layer in layers:
        nodes, span = layer_nodes(layer.name)
        if nodes and layer.type != "Reformat":  # a copy between formats computes no node
            out.append({"name": layer.name, "type": layer.type, "original": list(nodes), "range": span})
    return out


def parse_timing_key(text: str) -> bytes:
    """A timing-cache key's 16 bytes from its string form, "0x" and 32 hex digits."""
    t = text.strip()
    if not re.fullmatch(r"0x[0-9a-fA-F]{32}", t):
        raise ValueError(f"not a TensorRT timing-cache key (0x and 32 hex digits): {text!r}")
    return bytes.fromhex(t[2:])


def format_timing_key(data: bytes) -> str:
    """A timing-cache key (16 bytes) as TensorRT prints it: 0x and its hex."""
    if len(data) != 16:
        raise ValueError(f"a timing-cache key has 16 bytes, not {len(data)}")
    return "0x" + data.hex()


def capture_method(requested: str, version: tuple[int, int], has_unfused: bool) -> str:
    """ "debug" (unfused debug tensors: same engine) or "outputs" (marked network outputs: another
    engine) for the user's `capture` option on this TensorRT."""
    supported = has_unfused and version >= (10, 12)
    if requested == "debug" and not supported:
        raise BackendUnavailableError(
            f"TensorRT {version[0]}.{version[1]} has no mark_unfused_tensors_as_debug_tensors (10.12+): "
            "use capture=outputs or capture=auto"
        )
    if requested == "outputs":
        return "outputs"
    return "debug" if supported else "outputs"


def cache_home() -> str:
    """xbackend's folder for caches kept between runs (pinned TensorRT caches)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xbackend")


def default_cache_path(model_digest: str, trt_version: str, gpu: str) -> str:
    """Where trt-pinned keeps a model's timing cache when no `cache` is given: per model, TensorRT
    version and GPU (a cache is valid for those alone)."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", gpu).strip("-") or "gpu"
    return os.path.join(cache_home(), "tensorrt", f"{model_digest[:16]}-trt{trt_version}-{slug}.timing-cache")
