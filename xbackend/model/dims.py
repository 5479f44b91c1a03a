"""Named dynamic dimensions: `--shape batch=2` sets every input that shares `batch`.

A dimension an exporter names by an expression of others (optimum's `past_sequence_length +
sequence_length`) is computed from them, never asked for: set alone it could disagree with them.
"""

from __future__ import annotations

import ast
import shlex
from collections.abc import Callable, Mapping

from xbackend.errors import InputError
from xbackend.model.load import ModelSpec, TensorSpec

__all__ = ["computed_dim", "fill_dims", "named_dims", "split_shapes", "unset_dims"]

Shape = tuple[int, ...]
_OPS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
}


def _expression(name: str) -> ast.expr | None:
    """The arithmetic a dimension's name spells (names, whole numbers, + - *), or None for a
    plain name."""
    try:
        tree = ast.parse(name, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    return tree if isinstance(tree, ast.BinOp) and _arithmetic(tree) else None


def _arithmetic(node: ast.expr) -> bool:
    if isinstance(node, ast.BinOp):
        return type(node.op) in _OPS and _arithmetic(node.left) and _arithmetic(node.right)
    return isinstance(node, ast.Name) or (isinstance(node, ast.Constant) and type(node.value) is int)


def _operands(name: str) -> list[str]:
    tree = _expression(name)
    return [node.id for node in ast.walk(tree) if isinstance(node, ast.Name)] if tree is not None else []


def computed_dim(name: str, dims: Mapping[str, int]) -> int | None:
    """The size of a dimension named by an expression of others, once they are set (None:
    a plain name, or an operand unset)."""
    tree = _expression(name)
    if tree is None:
        return None

    def value(node: ast.expr) -> int | None:
        if isinstance(node, ast.BinOp):
            a, b = value(node.left), value(node.right)
            return None if a is None or b is None else _OPS[type(node.op)](a, b)
        if isinstance(node, ast.Name):
            return dims.get(node.id)
        return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None

    return value(tree)


def named_dims(spec: ModelSpec) -> dict[str, list[str]]:
    """Symbolic dimension name -> the inputs that use it (e.g. 'batch' -> input_ids, attention_mask)."""
    out: dict[str, list[str]] = {}
    for i in spec.inputs:
        for d in i.shape or ():
            if isinstance(d, str) and d and i.name not in out.get(d, []):
                out.setdefault(d, []).append(i.name)
    return out


def split_shapes(spec: ModelSpec, shapes: Mapping[str, Shape]) -> tuple[dict[str, Shape], dict[str, int]]:
    """(input -> shape, dimension name -> size): `--shape batch=2` sets a named dimension every
    input that uses it shares; an input's own name wins."""
    named = named_dims(spec)
    inputs, dims = {}, {}
    for name, shape in shapes.items():
        if name in spec.input_names or name not in named:
            inputs[name] = shape
        elif len(shape) != 1:
            raise InputError(
                f"--shape {name}={','.join(map(str, shape))}: {name!r} is a dynamic dimension (of "
                f"{', '.join(named[name])}), so it takes one size, e.g. --shape {name}=2"
            )
        else:
            dims[name] = shape[0]
    for name in named:  # a dimension spelled as arithmetic of others follows from them
        size = computed_dim(name, dims)
        if size is None:
            continue
        if name in dims and dims[name] != size:
            given = shlex.quote(f"{name}={dims[name]}")
            raise InputError(
                f"--shape {given} disagrees with its operands ({name} = {size}); leave it out: it is "
                f"computed from {', '.join(_operands(name))}"
            )
        dims[name] = size
    return inputs, dims


def fill_dims(spec: TensorSpec, dims: Mapping[str, int]) -> Shape | None:
    """The input's shape from named dimension sizes, when they settle every dynamic dimension."""
    if spec.shape is None or not spec.dynamic_dims:
        return None
    if not all(isinstance(spec.shape[dim], str) and spec.shape[dim] in dims for dim in spec.dynamic_dims):
        return None
    return tuple(size if isinstance(size, int) else dims[str(size)] for size in spec.shape)


def unset_dims(spec: ModelSpec, shapes: Mapping[str, Shape], dims: Mapping[str, int]) -> InputError | None:
    """One error for every named dimension left unset, naming the inputs that share it."""
    missing: dict[str, list[str]] = {}
    for i in spec.inputs:
        if i.name in shapes or i.shape is None or fill_dims(i, dims) is not None:
            continue
        syms = [i.shape[dim] for dim in i.dynamic_dims]
        if not all(isinstance(sym, str) and sym for sym in syms):
            return None  # an unnamed dimension: the per-input error says what to pass
        for sym in syms:
            # one computed from others is never asked for: its operands are
            for d in _operands(str(sym)) or [str(sym)]:
                if d not in dims and i.name not in missing.get(d, []):
                    missing.setdefault(d, []).append(i.name)
    if not any(len(names) > 1 for names in missing.values()):
        return None  # no dimension shared: the per-input error names the input's own --shape
    flags = " ".join(f"--shape {shlex.quote(f'{d}=1')}" for d in missing)
    users = "; ".join(f"{key} (of {', '.join(names)})" for key, names in missing.items())
    return InputError(f"dynamic dimension(s) {users} unset; pass {flags}, or a --shape per input")
