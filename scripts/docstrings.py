"""How many of xbackend's public functions and methods say nothing of what they take and return:
no docstring of their own, nor one on the method they override in a class of the package.

    python scripts/docstrings.py              # the count, and the files with the most
    python scripts/docstrings.py --max 300    # exit 1 at 300 or more (make lint)
    python scripts/docstrings.py --list       # every one, as path:line:name

Public: a module-level function or a method of a public class whose name has no leading
underscore. A method that overrides a documented one (same name on a base class defined in
the package, followed through its bases) reads that docstring, as `help()` and editors do.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ClassInfo:
    """A class's base class names and, per method it defines, whether that method has a docstring."""

    bases: tuple[str, ...]
    documented: dict[str, bool]


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):  # Generic[T], Protocol[T]
        return _base_name(node.value)
    return ""


def _info(node: ast.ClassDef) -> ClassInfo:
    methods = {
        item.name: ast.get_docstring(item) is not None
        for item in node.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    return ClassInfo(tuple(_base_name(base) for base in node.bases), methods)


def class_index(trees: list[ast.Module]) -> dict[str, list[ClassInfo]]:
    """Every class of `trees`, by name (two modules may each define a class of one name)."""
    index: dict[str, list[ClassInfo]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                index.setdefault(node.name, []).append(_info(node))
    return index


def documented_above(
    index: dict[str, list[ClassInfo]], info: ClassInfo, method: str, seen: frozenset[str] = frozenset()
) -> bool:
    """Whether a base class of the class `info` describes documents `method` (a base name that
    two modules define counts where either does)."""
    for base in info.bases:
        if base in seen:
            continue
        for above in index.get(base, []):
            if above.documented.get(method) or documented_above(index, above, method, seen | {base}):
                return True
    return False


def undocumented(folder: Path) -> tuple[int, list[str]]:
    """(public functions and methods under `folder`, those that say nothing: path:line:name)."""
    paths = sorted(folder.rglob("*.py"))
    trees = [ast.parse(path.read_text("utf-8")) for path in paths]
    index = class_index(trees)
    total = 0
    missing: list[str] = []
    for path, tree in zip(paths, trees, strict=True):
        shown = path.relative_to(folder.parent)
        stack: list[tuple[ast.AST, ast.ClassDef | None]] = [(tree, None)]
        while stack:
            node, cls = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    if not child.name.startswith("_") and cls is None:
                        stack.append((child, child))
                elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    if child.name.startswith("_"):
                        continue
                    total += 1
                    if ast.get_docstring(child) is not None:
                        continue
                    if cls is not None and documented_above(index, _info(cls), child.name):
                        continue
                    missing.append(f"{shown}:{child.lineno}:{f'{cls.name}.' if cls else ''}{child.name}")
    return total, sorted(missing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=None, help="fail at this many or more")
    parser.add_argument("--folder", default=str(ROOT / "xbackend"))
    parser.add_argument("--top", type=int, default=10, help="files with the most")
    parser.add_argument("--list", action="store_true", help="print every one")
    opts = parser.parse_args(argv)
    total, missing = undocumented(Path(opts.folder))
    print(f"{len(missing)} of {total} public functions and methods say nothing of what they take and return")
    if opts.list:
        print("\n".join(missing))
    for name, count in Counter(entry.split(":")[0] for entry in missing).most_common(opts.top):
        print(f"  {count:5d}  {name}")
    if opts.max is not None and len(missing) >= opts.max:
        said = f"docstrings: {len(missing)} is not under {opts.max}: say what each takes and returns"
        print(said, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
