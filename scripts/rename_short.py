"""Name one-letter bindings for what they hold, where that can be inferred and the rename is safe.

    python scripts/rename_short.py xbackend            # rewrite in place, print counts
    python scripts/rename_short.py --dry-run xbackend  # print what would change

A binding is renamed only when every binding of that name in its scope infers the same new name
(from what a loop iterates, a parameter's annotation, what an assignment calls, `except ... as`),
the new name is not used anywhere in the scope nor is a keyword or builtin, the scope is a
function, lambda or comprehension (never a module or class body: others may read those names),
nothing in it says `global`, `nonlocal`, `locals()`, `vars()`, `eval` or `exec`, and no nested
scope binds the old name again. A parameter is renamed only where no call in the repository's
code passes it by keyword to a function of that name. Each file's rewrite is checked: the new
source parses to the old tree with exactly those names replaced, or the file is left as it was.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import copy
import keyword
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
FORBIDDEN = set(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist) | {"self", "cls"}
# onnx's repeated fields are singular words: what each element is
REPEATED = {
    "node": "node",
    "input": "input_name",
    "output": "output_name",
    "initializer": "initializer",
    "attribute": "attribute",
    "dim": "dim",
    "value_info": "value_info",
    "opset_import": "opset",
    "graph": "graph",
    "shape": "size",
}
IRREGULAR = {
    "children": "child",
    "indices": "index",
    "matrices": "matrix",
    "vertices": "vertex",
    "axes": "axis",
    "aliases": "alias",
    "statuses": "status",
    "biases": "bias",
    "processes": "process",
    "analyses": "analysis",
    "prefixes": "prefix",
    "suffixes": "suffix",
    "boxes": "box",
    "people": "person",
    "entries": "entry",
    "batches": "batch",
    "dims": "dim",
    "args": "arg",
    "kwargs": "kwarg",
    "bytes": None,
    "data": None,
    "series": None,
    "pass": None,
    "kinds": "kind",
    "lines": "line",
    "items": "item",
    "parts": "part",
    "words": "word",
    "files": "file",
    "names": "name",
    "paths": "path",
    "keys": "key",
}
QUALIFIERS = ("all_", "sorted_", "the_", "unique_", "every_", "new_", "old_", "our_", "my_", "some_")
PATH_ITERATORS = {"glob", "rglob", "iterdir"}
WITH_NAMES = {
    "open": "handle",
    "TemporaryDirectory": "folder",
    "Popen": "process",
    "mkdtemp": "folder",
    "NamedTemporaryFile": "handle",
    "ZipFile": "archive",
    "TarFile": "archive",
    "ThreadPoolExecutor": "pool",
    "ProcessPoolExecutor": "pool",
    "catch_warnings": "caught",
    "fdopen": "handle",
    "redirect_stdout": "stream",
}
# Generic types name nothing a letter does not (`q: Array` is a query): no rename from them
GENERIC = {"ndarray", "NDArray", "Array", "Tensor", "ArrayLike", "DTypeLike", "Number", "T"}
ANNOTATIONS = {
    "Path": "path",
    "NodeProto": "node",
    "GraphProto": "graph",
    "ModelProto": "model",
    "TensorProto": "tensor",
    "ValueInfoProto": "value_info",
    "AttributeProto": "attribute",
    "Module": "module",
    "Namespace": "opts",
    "Match": "match",
    "Popen": "process",
}


# xbackend's result types are named for what they are results of (the long name where it is taken)
SHORT = {"cross_backend_result": "cross", "backend_result": "backend", "candidate_result": "candidate"}
LONG = {short: long for long, short in SHORT.items()}


def snake(name: str) -> str:
    """CapWords to snake_case, shortened where SHORT says: CandidateResult -> candidate."""
    long = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name.lstrip("_")).lower()
    return SHORT.get(long, long)


def singular(word: str) -> str | None:
    """The singular of a plural identifier, or None where it is not plainly plural."""
    word = word.lstrip("_")
    for qualifier in QUALIFIERS:
        if word.startswith(qualifier) and len(word) > len(qualifier) + 2:
            word = word[len(qualifier) :]
    head, _, last = word.rpartition("_")
    if last in IRREGULAR:
        one = IRREGULAR[last]
    elif len(last) > 4 and last.endswith("ies"):
        one = last[:-3] + "y"
    elif last.endswith(("sses", "xes", "ches", "shes", "zes")):
        one = last[:-2]
    elif last.endswith(("ss", "us", "is", "ous")) or not last.endswith("s") or len(last) < 4:
        return None
    else:
        one = last[:-1]
    if one is None:
        return None
    return f"{head}_{one}" if head else one


def name_of(node: ast.AST) -> str | None:
    """The identifier an expression is named by: a name, an attribute, or what a call calls."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return name_of(node.func)
    return None


# What the scope being planned knows of its names: "name" or "self.attr" -> ("annotation", node) or
# ("like", iterable whose elements it holds). Set by plan_renames for each scope.
_known: dict[str, tuple[str, ast.AST]] = {}
CONTAINERS = (
    "list",
    "tuple",
    "Sequence",
    "Iterable",
    "set",
    "frozenset",
    "Iterator",
    "Collection",
    "MutableSequence",
    "AbstractSet",
    "Generator",
)
MAPPINGS = ("dict", "Mapping", "MutableMapping", "OrderedDict", "defaultdict")


def _known_as(node: ast.AST) -> tuple[str, ast.AST] | None:
    if isinstance(node, ast.Name):
        return _known.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return _known.get(f"self.{node.attr}")
    return None


def _annotation_parts(annotation: ast.AST) -> tuple[str | None, list[ast.AST]]:
    """(container's name, its parameters) of an annotation such as list[X] or dict[K, V]."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None, []
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [
            side
            for side in (annotation.left, annotation.right)
            if not (isinstance(side, ast.Constant) and side.value is None)
        ]
        return _annotation_parts(sides[0]) if len(sides) == 1 else (None, [])
    if not isinstance(annotation, ast.Subscript):
        return None, []
    inner = annotation.slice
    return name_of(annotation.value), list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def _typed_element(iterable: ast.AST, part: str) -> str | None:
    """The name of an element ("element"), key or value of what `iterable` is known to hold."""
    known = _known_as(iterable)
    if known is None:
        return None
    how, node = known
    if how == "like":
        if part != "element":
            return None
        key = next(name for name, says in _known.items() if says is known)
        del _known[key]  # a name that copies itself is not followed round
        try:
            return element(node)
        finally:
            _known[key] = known
    container, parameters = _annotation_parts(node)
    if container in CONTAINERS and parameters and part == "element":
        return annotation_name(parameters[0])
    if container in MAPPINGS and len(parameters) == 2:
        chosen = parameters[1] if part == "value" else parameters[0]
        return annotation_name(chosen)
    return None


def element(iterable: ast.AST) -> str | None:
    """What one element of `iterable` is named."""
    found = _element(iterable)
    return found if found is not None else _typed_element(iterable, "element")


def _element(iterable: ast.AST) -> str | None:
    if isinstance(iterable, ast.Call):
        called = name_of(iterable.func)
        if called in ("sorted", "list", "set", "tuple", "reversed", "frozenset", "iter") and iterable.args:
            return element(iterable.args[0])
        if called == "values" and isinstance(iterable.func, ast.Attribute):
            return value_of(iterable.func.value)
        if called == "keys" and isinstance(iterable.func, ast.Attribute):
            return key_of(iterable.func.value)
        if called in PATH_ITERATORS:
            return "path"
        if (
            called == "walk"
            and isinstance(iterable.func, ast.Attribute)
            and name_of(iterable.func.value) == "ast"
        ):
            return "node"
        if called == "splitlines":
            return "line"
        if called == "range":
            return None  # a loop index keeps its letter
    if isinstance(iterable, ast.Subscript):
        if isinstance(iterable.slice, ast.Slice):
            return element(iterable.value)
        if isinstance(iterable.slice, ast.Constant) and isinstance(iterable.slice.value, str):
            key = iterable.slice.value
            return singular(key) if key.isidentifier() else None
        return None
    if isinstance(iterable, ast.Tuple | ast.List | ast.Set):
        return _literal_element(iterable)
    identifier = name_of(iterable)
    if identifier is None:
        return None
    if isinstance(iterable, ast.Attribute) and identifier in REPEATED:
        return REPEATED[identifier]
    if "_by_" in identifier:
        return singular(identifier.split("_by_")[0])
    return singular(identifier)


def _literal_element(iterable: ast.AST) -> str | None:
    """What the elements of a tuple, list or set display are named, where its parts agree."""
    if not isinstance(iterable, ast.Tuple | ast.List | ast.Set) or not iterable.elts:
        return None
    names = {element(part.value) if isinstance(part, ast.Starred) else None for part in iterable.elts}
    return names.pop() if len(names) == 1 else None


def key_of(mapping: ast.AST) -> str | None:
    typed = _typed_element(mapping, "key")
    if typed is not None:
        return typed
    identifier = name_of(mapping)
    if identifier and "_by_" in identifier:
        return identifier.rsplit("_by_", 1)[1] or None
    if identifier and identifier.startswith("by_"):
        return identifier[3:] or None
    return "key"


def value_of(mapping: ast.AST) -> str | None:
    identifier = name_of(mapping)
    typed = _typed_element(mapping, "value")
    if typed is not None and (identifier is None or singular(identifier) is None):
        return typed
    if identifier is None:
        return "value"
    if "_by_" in identifier:
        return singular(identifier.split("_by_")[0]) or identifier.split("_by_")[0]
    if identifier.startswith("by_"):
        return "value"
    return singular(identifier) or "value"


def unpacked(target: ast.AST, iterable: ast.AST) -> dict[str, str | None]:
    """One-letter names of a loop target, each with the name inferred from `iterable`."""
    if isinstance(target, ast.Name):
        return {target.id: element(iterable)}
    if not isinstance(target, ast.Tuple) or any(not isinstance(e, ast.Name) for e in target.elts):
        return {e.id: None for e in ast.walk(target) if isinstance(e, ast.Name)}
    names = [e.id for e in target.elts if isinstance(e, ast.Name)]
    guesses: list[str | None] = [None] * len(names)
    while (
        isinstance(iterable, ast.Call)
        and name_of(iterable.func) in ("sorted", "list", "reversed", "tuple")
        and iterable.args
    ):
        iterable = iterable.args[0]
    if isinstance(iterable, ast.Call):
        called = name_of(iterable.func)
        if called == "items" and isinstance(iterable.func, ast.Attribute) and len(names) == 2:
            guesses = [key_of(iterable.func.value), value_of(iterable.func.value)]
        elif called == "enumerate" and len(names) == 2 and iterable.args:
            guesses = ["index", element(iterable.args[0])]
        elif called == "zip" and len(names) == len(iterable.args):
            guesses = [element(a) for a in iterable.args]
    return dict(zip(names, guesses, strict=True))


def annotation_name(annotation: ast.AST | None) -> str | None:
    """A parameter's name from its annotation's class: `r: Result` -> result."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [
            side
            for side in (annotation.left, annotation.right)
            if not (isinstance(side, ast.Constant) and side.value is None)
        ]
        return annotation_name(sides[0]) if len(sides) == 1 else None
    if isinstance(annotation, ast.Subscript):
        base = name_of(annotation.value)
        if base == "Optional":
            return annotation_name(annotation.slice)
        if base in ("list", "tuple", "Sequence", "Iterable", "set", "frozenset", "Iterator"):
            inner = annotation.slice
            if isinstance(inner, ast.Tuple):
                inner = inner.elts[0]
            one = annotation_name(inner)
            return f"{one}s" if one and not one.endswith("s") else None
        return None
    identifier = name_of(annotation)
    if (
        identifier is None
        or identifier in GENERIC
        or identifier in ("str", "int", "float", "bool", "bytes", "object", "Any")
    ):
        return None
    if identifier in ANNOTATIONS:
        return ANNOTATIONS[identifier]
    if identifier[:1].isupper():
        return snake(identifier)
    return None


def assigned_name(value: ast.AST) -> str | None:
    """A local's name from what is assigned to it."""
    if isinstance(value, ast.Call):
        called = name_of(value.func)
        if called in ("sha256", "sha1", "md5", "blake2b"):
            return "digest"
        if called and called[:1].isupper() and called.lower() != called and called not in GENERIC:
            return ANNOTATIONS.get(called, snake(called))
        return None
    if isinstance(value, ast.Attribute) and len(value.attr) > 2 and not value.attr.startswith("_"):
        return {"input": "inputs", "output": "outputs", "node": "nodes"}.get(value.attr, value.attr)
    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
        key = value.slice.value
        return key if isinstance(key, str) and key.isidentifier() and len(key) > 2 else None
    if isinstance(value, ast.Subscript) and not isinstance(value.slice, ast.Slice):
        return element(value.value)
    return None


def scope_children(node: ast.AST) -> Iterator[ast.AST]:
    """Nodes lexically inside `node`, not descending into nested scopes (those are yielded)."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, SCOPES):
            yield from scope_children(child)


def bound_here(scope: ast.AST) -> dict[str, list[tuple[str, ast.AST, str | None]]]:
    """Each name the scope binds: (kind, node, inferred new name) per binding."""
    found: dict[str, list[tuple[str, ast.AST, str | None]]] = defaultdict(list)
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        arguments = scope.args
        for arg in [
            *arguments.posonlyargs,
            *arguments.args,
            *arguments.kwonlyargs,
            *(a for a in (arguments.vararg, arguments.kwarg) if a is not None),
        ]:
            found[arg.arg].append(("param", arg, annotation_name(arg.annotation)))
    if isinstance(scope, COMPREHENSIONS):
        for generator in scope.generators:
            for name, guess in unpacked(generator.target, generator.iter).items():
                found[name].append(("comp", generator, guess))
    body = scope.body if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) else []
    for statement in body:
        for node in [statement, *scope_children(statement)]:
            if isinstance(node, SCOPES):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[node.name].append(("def", node, None))
                continue
            if isinstance(node, ast.For | ast.AsyncFor):
                for name, guess in unpacked(node.target, node.iter).items():
                    found[name].append(("for", node, guess))
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id].append(("assign", node, assigned_name(node.value)))
                    else:
                        for name in (
                            e.id
                            for e in ast.walk(target)
                            if isinstance(e, ast.Name) and isinstance(e.ctx, ast.Store)
                        ):
                            found[name].append(("assign", node, None))
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
                guess = annotation_name(node.annotation) if isinstance(node, ast.AnnAssign) else None
                found[node.target.id].append(("assign", node, guess))
            elif isinstance(node, ast.ExceptHandler) and node.name:
                found[node.name].append(("except", node, "error"))
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                target = node.optional_vars
                called = name_of(node.context_expr.func) if isinstance(node.context_expr, ast.Call) else None
                guess = WITH_NAMES.get(called or "") if isinstance(target, ast.Name) else None
                for name in (e.id for e in ast.walk(target) if isinstance(e, ast.Name)):
                    found[name].append(("with", node, guess))
            elif isinstance(node, ast.NamedExpr):
                found[node.target.id].append(("walrus", node, assigned_name(node.value)))
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    found[(alias.asname or alias.name).split(".")[0]].append(("import", node, None))
            elif isinstance(node, ast.Global | ast.Nonlocal):
                for name in node.names:
                    found[name].append(("global", node, None))
            elif isinstance(node, ast.ClassDef):
                found[node.name].append(("def", node, None))
    return found


def region(scope: ast.AST) -> list[ast.AST]:
    """The nodes whose names belong to `scope` (a comprehension's first iterable is outside it)."""
    if isinstance(scope, COMPREHENSIONS):
        parts: list[ast.AST] = []
        if isinstance(scope, ast.DictComp):
            parts += [scope.key, scope.value]
        else:
            parts.append(scope.elt)
        for position, generator in enumerate(scope.generators):
            parts.append(generator.target)
            if position:
                parts.append(generator.iter)
            parts += generator.ifs
        return parts
    if isinstance(scope, ast.Lambda):
        return [scope.body]
    assert isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef)
    return list(scope.body)


def identifiers(nodes: list[ast.AST]) -> set[str]:
    """Every identifier used or bound anywhere under `nodes`."""
    seen: set[str] = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Name):
                seen.add(node.id)
            elif isinstance(node, ast.arg):
                seen.add(node.arg)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                seen.add(node.name)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                seen.update(node.names)
            elif isinstance(node, ast.alias):
                seen.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                seen.add(node.name)
    return seen


def rebinds(nodes: list[ast.AST], name: str) -> bool:
    """Whether a scope nested under `nodes` binds `name` again (or declares it global)."""
    for top in nodes:
        for node in ast.walk(top):
            nested = isinstance(node, SCOPES) and node is not top
            if nested and (name in bound_here(node) or name in _comprehension_targets(node)):
                return True
            if isinstance(node, ast.Global | ast.Nonlocal) and name in node.names:
                return True
            if isinstance(node, ast.Call) and name_of(node.func) in ("locals", "vars", "eval", "exec"):
                return True
            if isinstance(node, ast.ClassDef) and name in identifiers(node.body):
                return True
            if isinstance(node, ast.MatchAs | ast.MatchStar) and node.name == name:
                return True
            if isinstance(node, ast.MatchMapping) and node.rest == name:
                return True
    return False


def _comprehension_targets(node: ast.AST) -> set[str]:
    if not isinstance(node, COMPREHENSIONS):
        return set()
    return {e.id for g in node.generators for e in ast.walk(g.target) if isinstance(e, ast.Name)}


def keyword_uses(trees: list[ast.AST]) -> set[tuple[str, str]]:
    """(function name, keyword) for every call in `trees` that passes a keyword."""
    uses: set[tuple[str, str]] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = name_of(node.func)
                for item in node.keywords:
                    if item.arg:
                        uses.add((called or "", item.arg))
                        if called == "partial" and node.args:
                            uses.add((name_of(node.args[0]) or "", item.arg))
    return uses


def known_names(scope: ast.AST, parents: dict[int, ast.AST]) -> dict[str, tuple[str, ast.AST]]:
    """What `scope` and the functions and class around it say their names hold (inner first)."""
    chain: list[ast.AST] = []
    node: ast.AST | None = scope
    while node is not None:
        chain.append(node)
        node = parents.get(id(node))
    known: dict[str, tuple[str, ast.AST]] = {}
    for around in reversed(chain):
        if isinstance(around, ast.ClassDef):
            for statement in around.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    known[f"self.{statement.target.id}"] = ("annotation", statement.annotation)
        if not isinstance(around, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = around.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if arg.annotation is not None:
                known[arg.arg] = ("annotation", arg.annotation)
        assigned: dict[str, list[tuple[str, ast.AST]]] = defaultdict(list)
        for statement in around.body:
            for inner in [statement, *scope_children(statement)]:
                if isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Name):
                    assigned[inner.target.id].append(("annotation", inner.annotation))
                elif isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Attribute):
                    if isinstance(inner.target.value, ast.Name) and inner.target.value.id == "self":
                        known[f"self.{inner.target.attr}"] = ("annotation", inner.annotation)
                elif isinstance(inner, ast.Assign) and len(inner.targets) == 1:
                    target = inner.targets[0]
                    if isinstance(target, ast.Name):
                        assigned[target.id].append(_holds(inner.value))
        for name, says in assigned.items():
            if len(says) == 1 and says[0][0] != "unknown":
                known[name] = says[0]
    return known


def _holds(value: ast.AST) -> tuple[str, ast.AST]:
    """What an assigned value holds: the elements of an iterable it copies or filters."""
    if isinstance(value, ast.ListComp | ast.SetComp | ast.GeneratorExp) and value.generators:
        first = value.generators[0]
        if (
            isinstance(value.elt, ast.Name)
            and isinstance(first.target, ast.Name)
            and value.elt.id == first.target.id
            and len(value.generators) == 1
        ):
            return ("like", first.iter)
    if (
        isinstance(value, ast.Call)
        and name_of(value.func) in ("sorted", "list", "set", "tuple", "reversed")
        and len(value.args) == 1
    ):
        return ("like", value.args[0])
    return ("unknown", value)


# onnx's and numpy's types, by the attributes code reads on them
FOREIGN_CLASSES = {
    "node": {"op_type", "input", "output", "attribute", "domain", "name"},
    "attribute": {"name", "type", "i", "f", "s", "ints", "floats", "strings", "t", "g", "ref_attr_name"},
    "initializer": {"name", "dims", "data_type", "raw_data", "data_location", "external_data"},
}


def class_index(trees: list[ast.AST]) -> dict[str, set[str]]:
    """Each class's snake name with every attribute it has (fields, methods, `self.x` it sets)."""
    index: dict[str, set[str]] = defaultdict(set)
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            attributes = index[snake(node.name)]
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    attributes.add(statement.target.id)
                elif isinstance(statement, ast.Assign):
                    attributes.update(t.id for t in statement.targets if isinstance(t, ast.Name))
                elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                    attributes.add(statement.name)
                    for inner in ast.walk(statement):
                        if (
                            isinstance(inner, ast.Attribute)
                            and isinstance(inner.ctx, ast.Store)
                            and isinstance(inner.value, ast.Name)
                            and inner.value.id == "self"
                        ):
                            attributes.add(inner.attr)
    for name, attributes in FOREIGN_CLASSES.items():
        index[name] |= attributes
    return index


CLASSES: dict[str, set[str]] = {}  # filled by main from the repository's code


def read_attributes(nodes: list[ast.AST], name: str) -> set[str]:
    """The attributes read on `name` under `nodes`."""
    return {
        node.attr
        for top in nodes
        for node in ast.walk(top)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name
    }


def by_attributes(nodes: list[ast.AST], name: str) -> str | None:
    """The one class whose attributes hold every attribute read on `name`, named in snake case."""
    read = read_attributes(nodes, name)
    if not read or read <= {"name", "value", "get", "items", "keys", "values", "copy", "update", "append"}:
        return None
    fitting = sorted({cls for cls, attributes in CLASSES.items() if read <= attributes and len(cls) > 2})
    return fitting[0] if len(fitting) == 1 else None


def by_use(nodes: list[ast.AST], name: str) -> str | None:
    """The one keyword `name` is passed as, wherever it is passed by keyword (a parameter's name
    says what it takes; where it is passed positionally nothing is inferred)."""
    hints: set[str] = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Call):
                for item in node.keywords:
                    if isinstance(item.value, ast.Name) and item.value.id == name and item.arg:
                        hints.add(item.arg)
    generic = {"out", "value", "data", "default", "obj", "item", "arg", "other"}
    hints = {hint for hint in hints if len(hint) > 2 and not hint.startswith("_") and hint not in generic}
    return hints.pop() if len(hints) == 1 else None


def lambda_element(scope: ast.Lambda, parents: dict[int, ast.AST]) -> str | None:
    """A one-parameter lambda given as `key=` to sorted/min/max/sort: what it is called with."""
    arguments = scope.args
    if len([*arguments.posonlyargs, *arguments.args]) != 1 or arguments.vararg or arguments.kwonlyargs:
        return None
    keyword_node = parents.get(id(scope))
    call = parents.get(id(keyword_node)) if keyword_node is not None else None
    if (
        not isinstance(keyword_node, ast.keyword)
        or keyword_node.arg != "key"
        or not isinstance(call, ast.Call)
    ):
        return None
    called = name_of(call.func)
    if called in ("sorted", "min", "max", "groupby") and call.args:
        return element(call.args[0])
    if called == "sort" and isinstance(call.func, ast.Attribute):
        return element(call.func.value)
    return None


def plan_renames(
    tree: ast.Module, keywords: set[tuple[str, str]], chosen: dict[str, dict[str, str]] | None = None
) -> list[tuple[ast.AST, str, str]]:
    """(scope, old, new) for each safe rename in one module: inferred, or, given `chosen` (a
    function's name -> {old: new}), those a person chose for that function's own bindings."""
    planned: list[tuple[ast.AST, str, str]] = []
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    claimed: set[int] = set()  # scopes renamed this round, their ancestors and descendants
    for scope in ast.walk(tree):
        if not isinstance(scope, SCOPES) or id(scope) in claimed:
            continue
        _known.clear()
        _known.update(known_names(scope, parents))
        nodes = region(scope)
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            nodes = [*nodes, scope.args]
        taken = identifiers(nodes)
        if isinstance(scope, COMPREHENSIONS):  # its first iterable is read outside it: never shadowed
            taken |= identifiers([scope.generators[0].iter])
        for name, bindings in bound_here(scope).items():
            if len(name) != 1 or name == "_":
                continue
            if chosen is not None:
                own = (
                    scope.name
                    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef)
                    else ("<lambda>" if isinstance(scope, ast.Lambda) else "<comp>")
                )
                everywhere = chosen.get("*", {}) if own[0] != "<" else {}
                mine = {**everywhere, **chosen.get(own, {})}
                if name not in mine:
                    continue
                bindings = [(kind, node, mine[name]) for kind, node, _ in bindings]
            elif isinstance(scope, ast.Lambda) and len(bindings) == 1:
                bindings = [(kind, node, lambda_element(scope, parents)) for kind, node, _ in bindings]
            guesses = {guess for _, _, guess in bindings}
            if None in guesses and len(guesses) <= 2:
                structural = by_attributes(nodes, name) or by_use(nodes, name)
                if structural is not None and guesses - {None} <= {structural}:
                    guesses = {structural}
            kinds = {kind for kind, _, _ in bindings}
            if len(guesses) != 1 or None in guesses or kinds & {"global", "import", "def"}:
                continue
            new = guesses.pop()
            assert new is not None
            if new in taken and new in LONG:
                new = LONG[new]
            if new in ("input", "output") and not read_attributes(nodes, name):
                new = f"{new}_name"  # a builtin; an input read for no attribute is a tensor's name
            if not new.isidentifier() or new in FORBIDDEN or new in taken or len(new) < 3:
                if chosen is not None:
                    print(
                        f"not renamed: {getattr(scope, 'name', '?')} {name}={new} (taken or reserved)",
                        file=sys.stderr,
                    )
                continue
            passed_by_keyword = (getattr(scope, "name", ""), name) in keywords or ("", name) in keywords
            if (
                "param" in kinds
                and isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef)
                and passed_by_keyword
            ):
                continue
            if rebinds(nodes, name):
                continue
            planned.append((scope, name, new))
            taken.add(new)
            if id(scope) not in claimed:
                claimed.update(id(node) for node in ast.walk(scope))
                above = parents.get(id(scope))
                while above is not None:
                    claimed.add(id(above))
                    above = parents.get(id(above))
    return planned


def occurrences(scope: ast.AST, name: str) -> list[ast.AST]:
    """Every Name/arg node of `name` that belongs to `scope` (nested scopes that read it included)."""
    nodes = region(scope)
    found: list[ast.AST] = []
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        arguments = scope.args
        for arg in [
            *arguments.posonlyargs,
            *arguments.args,
            *arguments.kwonlyargs,
            *(a for a in (arguments.vararg, arguments.kwarg) if a is not None),
        ]:
            if arg.arg == name:
                found.append(arg)
    for top in nodes:
        for node in ast.walk(top):
            if (isinstance(node, ast.Name) and node.id == name) or (
                isinstance(node, ast.ExceptHandler) and node.name == name
            ):
                found.append(node)
    return found


def rewrite(source: str, renames: list[tuple[ast.AST, str, str]]) -> str | None:
    """The source with the renames applied, or None where an occurrence is not where the tree says."""
    lines = source.splitlines(keepends=True)
    encoded = [line.encode("utf-8") for line in lines]
    edits: dict[tuple[int, int], tuple[int, str, str]] = {}
    for scope, old, new in renames:
        for node in occurrences(scope, old):
            if isinstance(node, ast.ExceptHandler):
                row = node.lineno - 1
                text = encoded[row].decode("utf-8")
                match = re.search(rf"\bas\s+{re.escape(old)}\b", text)
                if match is None:
                    return None
                start = len(text[: match.end() - len(old)].encode("utf-8"))
                edits[(row, start)] = (start + len(old), old, new)
                continue
            row, start = node.lineno - 1, node.col_offset  # type: ignore[attr-defined]
            end = start + len(old.encode("utf-8"))
            if encoded[row][start:end].decode("utf-8", "replace") != old:
                return None
            edits[(row, start)] = (end, old, new)
    for scope, old, new in renames:
        docstring = _docstring(scope)
        if docstring is None:
            continue
        for row in range(docstring.lineno - 1, docstring.end_lineno or docstring.lineno):
            text = encoded[row].decode("utf-8")
            for match in re.finditer(rf"`{re.escape(old)}`", text):
                start = len(text[: match.start() + 1].encode("utf-8"))
                edits[(row, start)] = (start + len(old), old, new)
    for (row, start), (end, _old, new) in sorted(edits.items(), reverse=True):
        line = encoded[row]
        before = line[start - 1 : start] if start else b" "
        after = line[end : end + 1]
        if re.match(rb"[A-Za-z0-9_]", before) or re.match(rb"[A-Za-z0-9_]", after):
            return None
        encoded[row] = line[:start] + new.encode("utf-8") + line[end:]
    return b"".join(encoded).decode("utf-8")


def _docstring(scope: ast.AST) -> ast.Constant | None:
    """A function's docstring node, where it has one."""
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) or not scope.body:
        return None
    first = scope.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.value
    return None


def expected_tree(tree: ast.Module, renames: list[tuple[ast.AST, str, str]]) -> str:
    """The old tree with the renames applied to its nodes, dumped."""
    copied = copy.deepcopy(tree)
    originals = list(ast.walk(tree))
    copies = list(ast.walk(copied))
    position = {id(node): index for index, node in enumerate(originals)}
    for scope, old, new in renames:
        for node in occurrences(scope, old):
            twin = copies[position[id(node)]]
            if isinstance(twin, ast.Name):
                twin.id = new
            elif isinstance(twin, ast.arg):
                twin.arg = new
            elif isinstance(twin, ast.ExceptHandler):
                twin.name = new
        docstring = _docstring(scope)
        if docstring is not None:
            twin = copies[position[id(docstring)]]
            assert isinstance(twin, ast.Constant)
            twin.value = twin.value.replace(f"`{old}`", f"`{new}`")
    return ast.dump(copied)


def rename_file(
    path: Path, keywords: set[tuple[str, str]], dry_run: bool, chosen: dict[str, dict[str, str]] | None = None
) -> int:
    """Rename what can be renamed in one file; how many bindings were."""
    current = source = path.read_text("utf-8")
    failed: set[tuple[int, str]] = set()
    applied = 0
    while True:
        tree = ast.parse(current)
        walk_index = {id(node): index for index, node in enumerate(ast.walk(tree))}
        planned = [
            one
            for one in plan_renames(tree, keywords, chosen)
            if (walk_index[id(one[0])], one[1]) not in failed
        ]
        if not planned:
            break
        together = _checked(current, tree, planned)
        if together is not None:
            current, applied = together, applied + len(planned)
            continue
        # one at a time: the first that checks out, then plan again on the new text
        for one in planned:
            alone = _checked(current, tree, [one])
            if alone is not None:
                current, applied = alone, applied + 1
                break
            failed.add((walk_index[id(one[0])], one[1]))
    if applied and current != source:
        if dry_run:
            print(f"{path}: {applied}")
        else:
            path.write_text(current, "utf-8")
    return applied


def _checked(source: str, tree: ast.Module, renames: list[tuple[ast.AST, str, str]]) -> str | None:
    """The rewritten source where it parses to the expected tree, else None."""
    changed = rewrite(source, renames)
    if changed is None:
        return None
    try:
        if ast.dump(ast.parse(changed)) != expected_tree(tree, renames):
            return None
    except SyntaxError:
        return None
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--map",
        help="lines of 'path function old=new ...' (function: a name, * for every function, <lambda> "
        "or <comp> for every lambda or comprehension): names a person chose",
    )
    parser.add_argument(
        "--callers",
        default="xbackend,tests,benchmarks,scripts,models",
        help="comma-separated folders whose calls are read for parameters passed by keyword",
    )
    opts = parser.parse_args(argv)
    callers = [Path(folder) for folder in opts.callers.split(",") if folder]
    keywords = keyword_uses(
        [ast.parse(path.read_text("utf-8")) for folder in callers for path in folder.rglob("*.py")]
    )
    # the classes whose attributes name a binding: those of the code being renamed
    ours = [
        ast.parse(path.read_text("utf-8")) for folder in opts.folders for path in Path(folder).rglob("*.py")
    ]
    CLASSES.update(class_index(ours))
    total = 0
    if opts.map:
        by_file: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)
        for line in Path(opts.map).read_text("utf-8").splitlines():
            if line.strip() and not line.startswith("#"):
                path, function, *pairs = line.split()
                by_file[path].setdefault(function, {}).update(pair.split("=", 1) for pair in pairs)
        for path, chosen in by_file.items():
            total += rename_file(Path(path), keywords, opts.dry_run, chosen)
        print(f"{total} bindings renamed", file=sys.stderr)
        return 0
    for folder in opts.folders:
        for path in sorted(Path(folder).rglob("*.py")):
            total += rename_file(path, keywords, opts.dry_run)
    print(f"{total} bindings renamed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
