"""ExecuTorch's per-operator values: the program run with ETDump on, its intermediate outputs read
by ExecuTorch's own Inspector and matched to the ONNX model's tensors through the exported
program's operator names.

How a value finds its tensor:
- ExecuTorch numbers each operator of the exported program (its debug handle) and carries the
  number through lowering: an edge operator, a portable kernel call and a delegate call name the
  handles they compute. The Inspector reads ETDump and merges overlapping handles into one
  piece per kernel call (a decomposed `linear` is `permute_copy` + `addmm`: one piece; an XNNPACK
  call is one piece however many operators it took), each with the values its kernel logged.
- A piece's value stands for its last handle's operator (the rule ExecuTorch's
  `calculate_numeric_gap` applies, so the values compared here are the ones it compares); a
  kernel that logs several values gives the one of the operator's shape (`native_layer_norm`'s
  output, not its mean and rstd).
- An operator of the exported program is an ONNX tensor where torch.onnx wrote the same aten call
  (`export/torch_ops.OpGraph`: its whole FX text, the name torch.export gave it included).

The other operators inside a piece (inside an XNNPACK call, a decomposition's steps) are not
exposed, with the piece named by the exported program's module hierarchy.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xbackend.errors import first_line
from xbackend.model.torch_module import to_numpy

__all__ = ["Dump"]

HEADROOM = 1 << 20


@dataclass
class Dump:
    """One program's ETDump reading: its ETRecord in a folder of xbackend's own, the exported
    program's operators by debug handle (read on the first run), and what each run logged."""

    names: dict[str, str]  # aten operator (exported program) -> ONNX tensor
    modules: dict[str, str]  # aten operator -> the module that called it
    shapes: dict[str, tuple[tuple[int, ...], str]]  # aten operator -> its output's shape and dtype
    buffer_size: int
    folder: Any = None  # tempfile.TemporaryDirectory, removed on close
    by_handle: dict[int, str] = field(default_factory=dict)
    hidden: dict[str, str] = field(default_factory=dict)  # ONNX tensor -> why not exposed
    exposed: set[str] = field(default_factory=set)  # ONNX tensors the last run logged
    pieces: int = 0  # kernel calls that logged values, in the last run
    why: str = ""  # why nothing past the outputs is exposed
    record: Any = None  # the ETRecord, read back once (an unsaved one names no debug handles)

    @classmethod
    def build(cls, program: Any, exported: Any, names: Mapping[str, str]) -> Dump:
        """`program`: the ExecutorchProgramManager (made with generate_etrecord=True);
        `exported`: the torch.export program it was lowered from; `names`: its operators that
        are ONNX tensors."""
        modules: dict[str, str] = {}
        shapes: dict[str, tuple[tuple[int, ...], str]] = {}
        total = 0
        for node in exported.graph.nodes:
            if node.op != "call_function":
                continue
            stack = node.meta.get("nn_module_stack") or {}
            modules[node.name] = list(stack.values())[-1][0] if stack else ""
            vals = node.meta.get("val")
            for v in vals if isinstance(vals, (list, tuple)) else [vals]:
                if hasattr(v, "shape") and hasattr(v, "element_size"):
                    total += int(np.prod(v.shape, dtype=np.int64)) * v.element_size()
            if hasattr(vals, "shape") and hasattr(vals, "dtype"):
                shapes[node.name] = (tuple(int(size) for size in vals.shape), str(vals.dtype))
        # a delegate call logs its inputs beside its outputs: twice every value, with room
        dump = cls(dict(names), modules, shapes, 2 * total + HEADROOM)
        dump.folder = tempfile.TemporaryDirectory(prefix="xbackend-etdump-")
        program.get_etrecord().save(str(Path(dump.folder.name) / "etrecord.bin"))
        return dump

    def close(self) -> None:
        """Remove the dump's folder (again: nothing)."""
        if self.folder is not None:
            self.folder.cleanup()
            self.folder = None

    def run(self, buffer: bytes, args: Sequence[Any]) -> tuple[list[Any], dict[str, np.ndarray]]:
        """The program's outputs and its logged values by ONNX tensor, from one run of a fresh
        instance (ETDump holds every run of an instance)."""
        from executorch.extension.pybindings import portable_lib  # engine: executorch

        folder = Path(self.folder.name)
        program = portable_lib._load_for_executorch_from_buffer(
            buffer, enable_etdump=True, debug_buffer_size=self.buffer_size
        )
        out = list(program.run_method("forward", tuple(args)))
        program.write_etdump_result_to_file(str(folder / "etdump.etdp"), str(folder / "debug.bin"))
        try:
            pieces = self._pieces(folder)
        except Exception as error:  # the Inspector cannot read it: outputs only, and why
            kind, said = type(error).__name__, first_line(error)
            self.why = f"ExecuTorch's Inspector could not read its ETDump ({kind}: {said})"
            return out, {}
        return out, self._values(pieces)

    def _pieces(self, folder: Path) -> dict[tuple[int, ...], tuple[Any, list[str]]]:
        from executorch.devtools import Inspector, parse_etrecord  # engine: executorch
        from executorch.devtools.inspector import _inspector_utils as utils  # engine: executorch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.record is None:
                self.record = parse_etrecord(str(folder / "etrecord.bin"))
            ins = Inspector(
                etdump_path=str(folder / "etdump.etdp"),
                etrecord=self.record,
                debug_buffer_path=str(folder / "debug.bin"),
            )
            if not self.by_handle:
                graph, which = ins._resolve_reference_graph()
                if which != "exported_program":
                    self.why = (
                        "ExecuTorch could not carry its debug handles back to the exported program: "
                        "its operators cannot be named"
                    )
                    return {}
                for key, ops in utils.get_aot_debug_handle_to_op_name_mapping(graph).items():
                    self.by_handle[int(key[0])] = ops[-1]
            runtime, kernels = ins._get_runtime_intermediate_outputs_and_op_names()
        return {h: (v, kernels.get(h, [])) for h, (v, _n) in runtime.items()}

    def _values(self, pieces: Mapping[tuple[int, ...], tuple[Any, list[str]]]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        self.hidden = {}
        for handles, (logged, kernels) in pieces.items():
            if handles[-1] not in self.by_handle:
                continue
            ops = [self.by_handle[fromkey] for fromkey in dict.fromkeys(handles) if fromkey in self.by_handle]
            last = self.by_handle[handles[-1]]
            kernel = "XNNPACK delegate call" if "DELEGATE_CALL" in kernels else f"kernel {', '.join(kernels)}"
            where = self.modules.get(last, "") or "the top module"
            for op in ops:
                if op in self.names and op != last:
                    self.hidden[self.names[op]] = (
                        f"inside ExecuTorch's {kernel} for {where} ({ops[0]} .. {last}): it logs the "
                        f"call's output only ({self.names.get(last, last)})"
                    )
            tensor = self.names.get(last)
            value = _pick(logged, self.shapes.get(last))
            if tensor is not None and value is not None:
                out[tensor] = value
        self.exposed, self.pieces = set(out), len(pieces)
        return out


def _pick(logged: Any, kind: tuple[tuple[int, ...], str] | None) -> np.ndarray | None:
    """The logged value of an operator of `kind` (shape, dtype): the one value, or the one of that
    shape and dtype among several (ExecuTorch's rule: else the last; max_pool2d logs its indices
    after its values, of one shape), reshaped where a view was not logged (`addmm`'s 2-d result
    of a 3-d `linear`); None where none is of its dtype."""
    values = list(logged) if isinstance(logged, (list, tuple)) else [logged]
    values = [value for value in values if hasattr(value, "shape") and hasattr(value, "dtype")]
    if kind is None or not values:
        return None
    shape, dtype = kind
    values = [value for value in values if str(value.dtype) == dtype]
    if not values:
        return None
    same = [value for value in values if tuple(value.shape) == shape]
    chosen = same[0] if len(same) == 1 else values[-1]
    arr = to_numpy(chosen)  # a copy, off ETDump's buffer
    if arr.shape != shape:
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            return None
        arr = arr.reshape(shape)
    return arr
