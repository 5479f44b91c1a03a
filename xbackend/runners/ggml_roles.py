"""llama.cpp's tensors matched to an ONNX export's by layer and role.

llama.cpp names the tensors of its graph by role and layer (`attn_norm-0`, `Qcur-1`, `l_out-1`,
`result_output`); several share a name across steps (`Qcur-0` is the projection, its reshape and
its rotation), told apart by the ggml op that made them. An optimum or torch.onnx export of a
Llama or Qwen2 names its nodes by module: optimum's (TorchScript's) node names
(`/model/layers.0/input_layernorm/...`), torch.onnx's dynamo exporter the module path it records
on each node (`model.model.layers.0.input_layernorm`, read as the same scope). Each role is
found in the ONNX graph by its module's output, or by where it flows (the rotated query is what
the attention's QK MatMul reads, through its scaling and transposes), never by value.

Layouts: ggml's first dimension is the innermost, so [E, T] is numpy's (T, E) and [D, H, T] is
(T, H, D). llama.cpp's converter permutes the rows of the query and key projections so that its
rotary pairs are adjacent (Hugging Face's are half a head apart): each head's features are
interleaved back before the comparison, and the match says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the graph is handed in: a foreign worker needs no onnx to import this
    import onnx

__all__ = ["ROLE_ARCHS", "UNINTERLEAVED", "Matched", "RoleMap", "role_map", "stage_of"]

ROLE_ARCHS = ("llama", "qwen2")  # llama.cpp architectures whose graph is matched by role

_LAYER = re.compile(r"/model/layers\.(\d+)/")
UNINTERLEAVED = (
    "each head's features interleaved back: llama.cpp's converter permutes the query and key "
    "projections' rows so its rotary pairs are adjacent (Hugging Face's are half a head apart)"
)
# what a tensor flows through on its way to the attention's QK MatMul (scaling, layout, GQA repeat)
_PASS = frozenset({"Mul", "Div", "Transpose", "Reshape", "Expand", "Unsqueeze", "Squeeze", "Cast", "Concat"})


@dataclass(frozen=True)
class Matched:
    """One ONNX tensor and the llama.cpp tensor (name, op) that holds its values."""

    onnx: str
    ggml: str
    op: str  # the ggml op that made it (a name alone is ambiguous)
    # "rows" ([E, T]); "heads" ([D, H, T]); "rows-rope", "heads-rope": the same, each head's
    # features interleaved back (llama's Q and K, whose projections the converter permuted)
    layout: str
    heads: int = 0  # for the rope layouts: the heads the features are cut into
    undid: str = ""  # what was undone to compare, in words

    def to_onnx(self, raw: np.ndarray) -> np.ndarray:
        """ggml's values of one sequence (numpy order: ggml's dims reversed) in the ONNX tensor's
        layout, its batch of one in front."""
        x = raw
        if self.layout == "rows-rope":  # (T, H*D): each head's features interleaved back
            t = x.shape[0]
            x = x.reshape(t, self.heads, -1)
            x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1).reshape(t, -1)
        elif self.layout == "heads-rope":  # (T, H, D) -> (H, T, D), interleaved back
            x = np.swapaxes(x, 0, 1)
            x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
        elif self.layout == "heads":  # (T, H, D) -> (H, T, D)
            x = np.swapaxes(x, 0, 1)
        return np.ascontiguousarray(x)[None]


@dataclass(frozen=True)
class RoleMap:
    """Every ONNX tensor asked for: matched to a llama.cpp tensor, or why not."""

    matched: Mapping[str, Matched]  # ONNX tensor -> its llama.cpp tensor
    unmatched: Mapping[str, str]  # ONNX tensor -> why no llama.cpp tensor holds it
    # the model's rotary constants (frequencies, or cos and sin folded by the exporter), which
    # llama.cpp computes again from the GGUF's rope base
    recomputed: tuple[str, ...] = ()

    def by_ggml(self) -> dict[tuple[str, str], Matched]:
        """Each matched tensor by its ggml name and op."""
        return {(matched.ggml, matched.op): matched for matched in self.matched.values()}


@dataclass(frozen=True)
class _Node:
    """A node under the name its module scope gives it (`/model/layers.0/self_attn/q_proj/...`)."""

    name: str
    op_type: str
    input: tuple[str, ...]
    output: tuple[str, ...]
    scope: str  # its innermost module, as a path ("" where the export names none)


def _scoped(graph: onnx.GraphProto) -> list[_Node]:
    """The nodes, each named as optimum names them: a dynamo export's recorded module path, the
    decoder (the module holding `layers`) read as /model, the node's own name after it."""
    paths = []
    for node in graph.node:
        scopes = next(
            (prop.value for prop in node.metadata_props if prop.key == "pkg.torch.onnx.name_scopes"), ""
        )
        found = re.findall(r"'([^']*)'", scopes)
        paths.append(found[-2] if len(found) >= 2 else "")
    root = next((path.split(".layers.")[0] for path in paths if ".layers." in path), None)
    out = []
    for node, path in zip(graph.node, paths, strict=True):
        name, scope = node.name, ""
        if root is not None and (path == root or path.startswith(root + ".")):
            scope = "/model" + path[len(root) :].replace(".", "/").replace("/layers/", "/layers.")
            name = f"{scope}/{node.name}"
        out.append(_Node(name, node.op_type, tuple(node.input), tuple(node.output), scope))
    return out


class _Graph:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.nodes = _scoped(graph)
        self.producer = {
            output_name: node for node in self.nodes for output_name in node.output if output_name
        }
        self.consumers: dict[str, list[_Node]] = {}
        for n in self.nodes:
            for input_name in n.input:
                self.consumers.setdefault(input_name, []).append(n)
        self.outputs = {output_name.name for output_name in graph.output}
        self.constant = {initializer.name for initializer in graph.initializer} | {
            output_name for node in self.nodes if node.op_type == "Constant" for output_name in node.output
        }
        self.by_name = {node.name: node for node in self.nodes}
        floats = (1, 10, 11, 16)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
        self.float_constant = {
            initializer.name for initializer in graph.initializer if initializer.data_type in floats
        } | {
            output_name
            for node in graph.node
            if node.op_type == "Constant" and node.attribute and node.attribute[0].t.data_type in floats
            for output_name in node.output
        }
        rest = [
            output_name.name for output_name in graph.output if not output_name.name.startswith("present")
        ]
        self.logits = "logits" if "logits" in self.outputs else (rest[0] if len(rest) == 1 else None)

    def residual(self, layer: str, k: int) -> str | None:
        """The layer's k-th residual Add: optimum names them Add and Add_1; otherwise the Adds
        the layer's own scope holds (outside its modules), in order."""
        named = self.node_output(f"{layer}/Add" + (f"_{k}" if k else ""))
        if named is not None:
            return named
        adds = [node for node in self.nodes if node.scope == layer and node.op_type == "Add"]
        return adds[k].output[0] if len(adds) > k and adds[k].output else None

    def module_output(self, scope: str) -> str | None:
        """What a module computes: of the tensors its nodes hand to nodes outside it, the one its
        last node writes (a norm also hands its input's cast on to the residual)."""
        inside = [node for node in self.nodes if node.name.startswith(scope + "/")]
        names = {node.name for node in inside}
        for n in reversed(inside):
            for output_name in n.output:
                if output_name and (
                    output_name in self.outputs
                    or any(c.name not in names for c in self.consumers.get(output_name, []))
                ):
                    return str(output_name)
        return None

    def node_output(self, name: str) -> str | None:
        n = self.by_name.get(name)
        return n.output[0] if n is not None and n.output else None

    def input_of(self, scope: str, op: str) -> str | None:
        """The data input of the module's one `op` node (what a projection reads)."""
        found = [node for node in self.nodes if node.name.startswith(scope + "/") and node.op_type == op]
        if len(found) != 1:
            return None
        data = [input_name for input_name in found[0].input if input_name and input_name not in self.constant]
        return data[0] if data else None

    def rotary_constants(self, rotated: Sequence[str]) -> tuple[str, ...]:
        """The constants the rotary embedding reads (its frequencies), and those the rotations'
        products read (cos and sin, where the exporter folded them)."""
        nodes = [node for node in self.nodes if "/rotary_emb/" in node.name + "/"]
        for t in rotated:
            add = self.producer.get(t)
            nodes += [self.producer[i] for i in (add.input if add else ()) if i in self.producer]
        return tuple(
            sorted(
                {
                    input_name
                    for node in nodes
                    for input_name in node.input
                    if input_name in self.float_constant
                }
            )
        )

    def rotated(self, layer: int, side: int) -> str | None:
        """The rotated query (side 0) or key (side 1): followed back from the attention's QK
        MatMul (the self_attn MatMul whose inputs neither is a weight) through scaling and
        layout to the Add that rotates it."""
        scope = f"/model/layers.{layer}/self_attn/"
        qk = next(
            (
                node
                for node in self.nodes
                if node.name.startswith(scope)
                and node.op_type == "MatMul"
                and "_proj/" not in node.name
                and not any(input_name in self.constant for input_name in node.input)
            ),
            None,
        )
        if qk is None or len(qk.input) < 2:
            return None
        t = str(qk.input[side])
        for _ in range(12):
            n = self.producer.get(t)
            if n is None:
                return None
            if n.op_type == "Add":
                return t
            if n.op_type not in _PASS:
                return None
            data = [input_name for input_name in n.input if input_name and input_name not in self.constant]
            if not data:
                return None
            t = str(data[-1] if n.op_type == "Concat" else data[0])  # a cache: the new tokens come last
        return None


def _roles(
    graph: _Graph, layers: int, heads: int, kv_heads: int, permuted: bool
) -> list[tuple[str | None, Matched]]:
    """Each role of a Llama-family export: (its ONNX tensor or None, what holds it in llama.cpp);
    `permuted`: the converter permuted Q and K (llama; qwen2 rotates halves, as Hugging Face)."""
    rows, rotated, undid = ("rows-rope", "heads-rope", UNINTERLEAVED) if permuted else ("rows", "heads", "")
    out: list[tuple[str | None, Matched]] = [
        (graph.module_output("/model/embed_tokens"), Matched("", "embd", "GET_ROWS", "rows")),
        (graph.module_output("/model/norm"), Matched("", "result_norm", "MUL", "rows")),
        (graph.logits, Matched("", "result_output", "MUL_MAT", "rows")),
    ]
    for i in range(layers):
        lay, att, mlp = f"/model/layers.{i}", f"/model/layers.{i}/self_attn", f"/model/layers.{i}/mlp"
        out += [
            (graph.module_output(f"{lay}/input_layernorm"), Matched("", f"attn_norm-{i}", "MUL", "rows")),
            (
                graph.module_output(f"{att}/q_proj"),
                Matched("", f"Qcur-{i}", "PROJ", rows, heads, undid),
            ),
            (
                graph.module_output(f"{att}/k_proj"),
                Matched("", f"Kcur-{i}", "PROJ", rows, kv_heads, undid),
            ),
            (graph.module_output(f"{att}/v_proj"), Matched("", f"Vcur-{i}", "PROJ", "rows")),
            (graph.rotated(i, 0), Matched("", f"Qcur-{i}", "ROPE", rotated, heads, undid)),
            (graph.rotated(i, 1), Matched("", f"Kcur-{i}", "ROPE", rotated, kv_heads, undid)),
            (graph.input_of(f"{att}/o_proj", "MatMul"), Matched("", f"kqv_out-{i}", "ATTN", "rows")),
            (graph.module_output(f"{att}/o_proj"), Matched("", f"attn_out-{i}", "PROJ", "rows")),
            (graph.residual(lay, 0), Matched("", f"ffn_inp-{i}", "ADD", "rows")),
            (
                graph.module_output(f"{lay}/post_attention_layernorm"),
                Matched("", f"ffn_norm-{i}", "MUL", "rows"),
            ),
            (graph.module_output(f"{mlp}/gate_proj"), Matched("", f"ffn_gate-{i}", "PROJ", "rows")),
            (graph.module_output(f"{mlp}/up_proj"), Matched("", f"ffn_up-{i}", "PROJ", "rows")),
            (graph.input_of(f"{mlp}/down_proj", "MatMul"), Matched("", f"ffn_swiglu-{i}", "SWIGLU", "rows")),
            (graph.module_output(f"{mlp}/down_proj"), Matched("", f"ffn_out-{i}", "PROJ", "rows")),
            (graph.residual(lay, 1), Matched("", f"l_out-{i}", "ADD", "rows")),
        ]
    return out


def role_map(graph: onnx.GraphProto, wanted: Sequence[str], hparams: Mapping[str, int], arch: str) -> RoleMap:
    """The tensors `wanted` (ONNX names) matched to llama.cpp's for a model of `arch` with the
    GGUF's `hparams` (block_count, head_count, head_count_kv); each one unmatched with why."""
    if arch not in ROLE_ARCHS:
        why = f"llama.cpp's {arch} graph is not matched to ONNX tensors (llama and qwen2 are)"
        return RoleMap({}, {t: why for t in wanted if t != "logits"})
    g = _Graph(graph)
    layers = int(hparams.get("block_count", 0))
    found: dict[str, Matched] = {}
    heads, kv_heads = int(hparams.get("head_count", 0)), int(hparams.get("head_count_kv", 0))
    for tensor, m in _roles(g, layers, heads, kv_heads, arch == "llama"):
        if tensor is not None and tensor not in found:
            found[tensor] = Matched(tensor, m.ggml, m.op, m.layout, m.heads, m.undid)
    matched = {t: found[t] for t in wanted if t in found}
    unmatched = {t: _why(t, g) for t in wanted if t not in found}
    rotated = [key for key, matched in found.items() if matched.op == "ROPE"]
    return RoleMap(matched, unmatched, g.rotary_constants(rotated))


def _why(tensor: str, g: _Graph) -> str:
    n = g.producer.get(tensor)
    if n is None:
        return "an input or a weight: llama.cpp reads it from the GGUF file"
    layer = _LAYER.match(n.name + "/") or _LAYER.match(n.name)
    where = f"layer {layer.group(1)}'s " if layer else ""
    return (
        f"{where}{n.op_type} has no tensor of its own in llama.cpp's graph (it computes the role in "
        "other steps, or fuses it)"
    )


_BIASED = ("Qcur", "Kcur", "Vcur", "attn_out", "ffn_out", "ffn_gate", "ffn_up")


def stage_of(name: str, op: str) -> str:
    """The match's op for a tensor llama.cpp hands the callback: a projection (its matrix
    product, or the bias added after it) is PROJ; the rest keep their op."""
    if name.startswith("kqv_out"):
        return "ATTN"  # the heads merged: a reshape of flash attention's output, else a copy
    if op == "MUL_MAT" and not name.startswith(("result_output",)):
        return "PROJ"
    if op == "ADD" and name.split("-")[0] in (
        "Qcur",
        "Kcur",
        "Vcur",
        "attn_out",
        "ffn_out",
        "ffn_gate",
        "ffn_up",
    ):
        return "PROJ"  # a bias (Qwen2's q, k and v projections): the projection's last step
    return op
