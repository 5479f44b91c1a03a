"""--tensors: which tensors a comparison exposes: every one, module boundaries, graph outputs,
or those under module paths (or with names) matching globs."""

from __future__ import annotations

import fnmatch
from dataclasses import replace

from xbackend.errors import UsageError
from xbackend.model.load import ModelSpec

__all__ = ["KEYWORDS", "module_boundaries", "select", "with_selection"]

KEYWORDS = ("all", "modules", "outputs")


def with_selection(spec: ModelSpec, selection: str) -> ModelSpec:
    """`spec` exposing what `selection` names; its tensor_order() is then the selection's."""
    selection = selection.strip() or "all"
    if selection == "all":
        return replace(spec, exposed=None, selection="all")
    return replace(spec, exposed=select(spec, selection), selection=selection)


def select(spec: ModelSpec, selection: str) -> tuple[str, ...]:
    """The names `selection` exposes, in model order, graph outputs always among them."""
    everything = spec.all_tensors()
    if selection == "all":
        return everything
    outputs = set(spec.output_names)
    if selection == "outputs":
        return tuple(n for n in everything if n in outputs)
    modules = spec.modules()
    if selection == "modules":
        if not modules:
            raise UsageError(
                "--tensors modules needs module paths, and this model records none (export it with "
                "`xbackend export torch`, or torch.onnx.export(dynamo=True)); use --tensors all, or "
                "globs over tensor names such as --tensors 'attn*'"
            )
        keep = module_boundaries(spec) | outputs
        return tuple(n for n in everything if n in keep)
    globs = [g.strip() for g in selection.split(",") if g.strip()]
    keep = set(outputs)
    for g in globs:
        hits = {n for n in everything if _matches(g, n, modules.get(n, ""))}
        if not hits:
            raise UsageError(f"--tensors {g!r} matches no module path or tensor name; {_examples(spec)}")
        keep |= hits
    return tuple(n for n in everything if n in keep)


def module_boundaries(spec: ModelSpec) -> set[str]:
    """Each module's outputs: the tensors the export verified against the module (recorded by
    `xbackend export torch`), and the last tensor computed inside each module's scope before
    the graph leaves it (a block's output is the last tensor of its own scope, too)."""
    out: set[str] = set()
    scoped = [(tensor.name, tensor.module) for tensor in spec.tensors]
    for (name, mod), (_, nxt) in zip(scoped, [*scoped[1:], ("", "")], strict=True):
        if mod and nxt != mod and not nxt.startswith(mod + "."):
            out.add(name)
    return out | set(spec.verified_modules().values())


def _matches(glob: str, name: str, module: str) -> bool:
    if fnmatch.fnmatchcase(name, glob):
        return True
    if not module:
        return False
    # 'm.h.3.*' takes block 3's own ops (module 'm.h.3') as well as those of its submodules
    return fnmatch.fnmatchcase(module, glob) or (glob.endswith(".*") and module == glob[:-2])


def _examples(spec: ModelSpec) -> str:
    paths = sorted({module for module in spec.modules().values() if module})
    if not paths:
        return "this model records no module paths: match tensor names, e.g. --tensors 'MatMul*'"
    top = sorted({path.split(".")[0] for path in paths})
    sample = ", ".join(paths[: min(4, len(paths))])
    return (
        f"module paths here start with {', '.join(top[:4])} (e.g. {sample}); the report's module "
        "column shows each tensor's"
    )
