"""torch at op grain: the module's aten calls, mapped to the ONNX tensors they became.

torch.onnx's exporter records, on each node it writes, the FX node it came from
(`pkg.torch.onnx.fx_node`) and its module path (`pkg.torch.onnx.name_scopes`), and names the
node that finishes an aten call after that FX node. The module is exported again here with
torch.export, decomposed as torch.onnx decomposes it (aten.linear, layer_norm, softmax, gelu and
scaled_dot_product_attention stay whole), and each FX call is matched to an ONNX tensor by its
module path, its aten target and its order among the same calls there: a module called several
times keeps one match per call, and a call whose module computes otherwise matches nothing.

The graph runs node by node (torch.fx.Interpreter) on torch's own kernels; it is used only where
its outputs are bitwise the module's on the same inputs, so it is the eager computation.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from xbackend.export.torch_onnx import flatten_outputs, to_numpy, to_tensor
from xbackend.numerics.values import Value

__all__ = ["OpGraph", "onnx_calls"]

_TARGET = re.compile(r"target=(?:torch\.ops\.)?([\w.]+)")
_DEFINES = re.compile(r"^%([\w.]+) ")


def onnx_calls(proto: onnx.ModelProto) -> dict[tuple[str, str, int], str]:
    """Each aten call the exporter wrote -> the ONNX tensor that holds its result: keyed by its
    module path, its target and its order among the same calls in that module."""
    seen: dict[tuple[str, str], int] = {}
    out: dict[tuple[str, str, int], str] = {}
    for node in proto.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        fx = meta.get("pkg.torch.onnx.fx_node", "")
        name, target = _DEFINES.match(fx), _TARGET.search(fx)
        if name is None or target is None or name.group(1) not in node.output:
            continue  # a node inside an aten call's decomposition: not its result
        scope = _module_path(meta.get("pkg.torch.onnx.name_scopes", ""))
        key = (scope, target.group(1))
        k = seen.get(key, 0)
        seen[key] = k + 1
        out[(*key, k)] = name.group(1)
    return out


def _module_path(scopes: str) -> str:
    """The innermost module of a name_scopes list (its last entry is the call's own name)."""
    try:
        parts = ast.literal_eval(scopes) if scopes else []
    except (ValueError, SyntaxError):
        return ""
    return str(parts[-2]) if isinstance(parts, list) and len(parts) >= 2 else ""


@dataclass
class OpGraph:
    """The module's aten calls, run one by one: each call's result captured where it maps to an
    ONNX tensor, and replaced by the reference's value of that tensor where one is fed."""

    module: Any  # torch.fx.GraphModule
    names: dict[str, str]  # FX node -> ONNX tensor
    why_not: str = ""
    captured: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def build(cls, module: Any, args: Sequence[Any], calls: Mapping[tuple[str, str, int], str]) -> OpGraph:
        """Export `module` on `args` and match its calls to the model's (`calls`: onnx_calls);
        raises where torch cannot export it (the caller stays at module grain and says why)."""
        import torch  # heavy: torch
        from torch.onnx._internal.exporter import _core, _registration  # heavy: torch's exporter

        ep = torch.export.export(module, tuple(args))
        registry = _registration.ONNXRegistry.from_torchlib()
        gm = _core._prepare_exported_program_for_export(ep, registry=registry).module()
        seen: dict[tuple[str, str], int] = {}
        names: dict[str, str] = {}
        for n in gm.graph.nodes:
            if n.op != "call_function":
                continue
            stack = list((n.meta.get("nn_module_stack") or {}).values())
            scope = str(stack[-1][0]) if stack else ""
            key = (scope, str(n.target))
            k = seen.get(key, 0)
            seen[key] = k + 1
            tensor = calls.get((*key, k))
            if tensor is not None:
                names[n.name] = tensor
        return cls(gm, names)

    def run(self, args: Sequence[Any], severed: Mapping[str, Value], wanted: set[str]) -> list[Any]:
        """The graph's flat outputs; each mapped call's result in `captured` (those in `wanted`),
        and the reference's value handed on in its place where `severed` holds one."""
        import torch  # heavy: torch

        graph, names, captured = self, self.names, self.captured
        captured.clear()

        class Calls(torch.fx.Interpreter):
            def run_node(self, n: Any) -> Any:
                out = super().run_node(n)
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
