"""torch at op grain: the module's aten calls, mapped to the ONNX tensors they became.

torch.onnx's exporter records, on each node it writes, the FX node it came from as text
(`pkg.torch.onnx.fx_node`: its name, aten target and arguments), and names the node that finishes
an aten call after that FX node. The module is exported again here with torch.export, decomposed
as torch.onnx decomposes it (aten.linear, layer_norm, softmax, gelu and
scaled_dot_product_attention stay whole), and an FX call is matched to an ONNX tensor only where
its whole text is the same: each call of a module called several times has its own, and a call
whose arguments come from code that computes otherwise (or from another export's symbolic
shapes) matches nothing.

The graph runs node by node (torch.fx.Interpreter) on torch's own kernels; it is used only where
its outputs are bitwise the module's on the same inputs, so it is the eager computation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from xbackend.model.torch_module import flatten_outputs, to_numpy, to_tensor
from xbackend.numerics.values import Value

__all__ = ["OpGraph", "folded_constants", "onnx_calls"]

_DEFINES = re.compile(r"^%([\w.]+) ")
_USERS = re.compile(r" : \[num_users=\d+\]")


def onnx_calls(proto: onnx.ModelProto) -> dict[str, str]:
    """Each aten call the exporter wrote (its FX node as text, the number of its users left out)
    -> the ONNX tensor that holds its result."""
    out: dict[str, str] = {}
    for node in proto.graph.node:
        fx = {prop.key: prop.value for prop in node.metadata_props}.get("pkg.torch.onnx.fx_node", "")
        name = _DEFINES.match(fx)
        if name is not None and name.group(1) in node.output:  # the node that finishes the call
            out[_signature(fx)] = name.group(1)
    return out


FOLDED_BYTES = 1 << 20  # constants the exporter folded are small; weights are not looked at


def folded_constants(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The model's small constants by name: where the exporter folded an aten call whose inputs
    are all constant (a timestep embedding's frequencies), it keeps the call's name on the result."""
    out = {
        initializer.name: numpy_helper.to_array(initializer)
        for initializer in proto.graph.initializer
        if initializer.data_location != onnx.TensorProto.EXTERNAL
        and len(initializer.raw_data) <= FOLDED_BYTES
    }
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.output and node.attribute and node.attribute[0].HasField("t"):
            out[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return out


def _signature(fx: str) -> str:
    """An FX node's text without its user count: its name, target and arguments (by name)."""
    return _USERS.sub("", fx, count=1)


@dataclass
class OpGraph:
    """The module's aten calls, run one by one: each call's result captured where it maps to an
    ONNX tensor, and replaced by the reference's value of that tensor where one is fed."""

    module: Any  # torch.fx.GraphModule
    names: dict[str, str]  # FX node -> ONNX tensor
    # FX calls the exporter folded into a constant of the same name: fed its value in severed
    # runs, as the reference's values are (torch computes them at run time, a rounding apart)
    folded: dict[str, np.ndarray] = field(default_factory=dict)
    captured: dict[str, np.ndarray] = field(default_factory=dict)
    # torch.export's own names (before torch.onnx's decompositions rename calls: aten.add_ becomes
    # add) -> ONNX tensor: what programs lowered from the same export (ExecuTorch's) call them
    roots: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls, module: Any, args: Sequence[Any], calls: Mapping[str, str], constants: Mapping[str, np.ndarray]
    ) -> OpGraph:
        """Export `module` on `args` and match its calls to the model's (`calls`: onnx_calls),
        each by its whole FX text: the same name, target and arguments; raises where torch cannot
        export it (the caller stays at module grain and says why)."""
        import torch  # heavy: torch
        from torch.onnx._internal.exporter import _core, _registration  # heavy: torch's exporter

        ep = torch.export.export(module, tuple(args))
        raw = {node.name: _kind(node) for node in ep.graph.nodes if node.op == "call_function"}
        registry = _registration.ONNXRegistry.from_torchlib()
        ep = _core._prepare_exported_program_for_export(ep, registry=registry)
        names: dict[str, str] = {}
        folded: dict[str, np.ndarray] = {}
        roots: dict[str, str] = {}
        for n in ep.graph.nodes:
            if n.op != "call_function":
                continue
            sig = _signature(n.format_node())
            if sig in calls:
                names[n.name] = calls[sig]
                root = _root(n)
                if raw.get(root) == _kind(n):  # the last of a call's steps, of its shape, stands for it
                    roots[root] = calls[sig]
            elif n.name in constants and not any(ancestor.op == "placeholder" for ancestor in _ancestors(n)):
                folded[n.name] = constants[n.name]
        return cls(ep.module(), names, folded, roots=roots)

    def run(self, args: Sequence[Any], severed: Mapping[str, Value], wanted: set[str]) -> list[Any]:
        """The graph's flat outputs; each mapped call's result in `captured` (those in `wanted`),
        and the reference's value handed on in its place where `severed` holds one."""
        import torch  # heavy: torch

        graph, names, captured, folded = self, self.names, self.captured, self.folded
        captured.clear()
        feeding = bool(severed)

        class Calls(torch.fx.Interpreter):
            def run_node(self, n: Any) -> Any:
                out = super().run_node(n)
                const = folded.get(n.name) if feeding else None
                if const is not None and isinstance(out, torch.Tensor) and const.shape == tuple(out.shape):
                    return to_tensor(const).to(dtype=out.dtype, device=out.device)
                tensor = names.get(n.name)
                if tensor is None or not isinstance(out, torch.Tensor):
                    return out
                if tensor in wanted:
                    captured[tensor] = to_numpy(out)
                ref = severed.get(tensor)
                if isinstance(ref, np.ndarray) and ref.shape == tuple(out.shape):
                    return to_tensor(ref).to(dtype=out.dtype, device=out.device)
                return out

        with torch.no_grad():
            result = Calls(graph.module).run(*args)
        return [v for _, v in flatten_outputs(result)]


def _root(n: Any) -> str:
    """The name of the node of torch.export's own graph that `n` was made from."""
    name, chain = n.name, n.meta.get("from_node") or []
    src = chain[-1] if chain else None
    while src is not None:
        name = src.name
        src = src.from_node[-1] if src.from_node else None
    return str(name)


def _kind(n: Any) -> tuple[tuple[int, ...], str] | None:
    v = n.meta.get("val")
    return (tuple(v.shape), str(v.dtype)) if hasattr(v, "shape") and hasattr(v, "dtype") else None


def _ancestors(n: Any) -> list[Any]:
    """Every node `n` is computed from (a constant's are get_attr and literal-only calls)."""
    seen: dict[str, Any] = {}
    todo = list(n.all_input_nodes)
    while todo:
        x = todo.pop()
        if x.name not in seen:
            seen[x.name] = x
            todo += x.all_input_nodes
    return list(seen.values())
