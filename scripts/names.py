"""How many of xbackend's bindings are one letter: parameters and assignment targets (loop and
comprehension variables, `with ... as`, `except ... as`, `:=` included), counted once per
binding site. `_` is not counted (it names what is thrown away).

    python scripts/names.py            # the share, and the files with the most
    python scripts/names.py --max 10   # exit 1 when the share is 10% or more (make lint)
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _targets(node: ast.AST) -> Iterator[str]:
    """The names a binding target binds (tuples and starred unpacked)."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Tuple | ast.List):
        for element in node.elts:
            yield from _targets(element)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


def bindings(tree: ast.AST) -> Iterator[str]:
    """Every name `tree` binds as a parameter or an assignment target."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            every += [a for a in (args.vararg, args.kwarg) if a is not None]
            yield from (a.arg for a in every if a.arg not in ("self", "cls"))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _targets(target)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor | ast.comprehension):
            yield from _targets(node.target)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            yield from _targets(node.optional_vars)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name
        elif isinstance(node, ast.NamedExpr):
            yield from _targets(node.target)


def measure(folder: Path) -> tuple[int, int, Counter[str]]:
    """(bindings, one-letter bindings, one-letter bindings per file) under `folder`."""
    total = short = 0
    per_file: Counter[str] = Counter()
    for path in sorted(folder.rglob("*.py")):
        names = [n for n in bindings(ast.parse(path.read_text("utf-8"))) if n != "_"]
        one = sum(len(n) == 1 for n in names)
        total, short = total + len(names), short + one
        per_file[str(path.relative_to(folder.parent))] = one
    return total, short, per_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=float, default=None, help="fail at this share (percent) or more")
    parser.add_argument("--folder", default=str(ROOT / "xbackend"))
    parser.add_argument("--top", type=int, default=10, help="files with the most one-letter bindings")
    opts = parser.parse_args(argv)
    total, short, per_file = measure(Path(opts.folder))
    share = 100 * short / total if total else 0.0
    print(f"{short} of {total} bindings are one letter: {share:.1f}%")
    for name, count in per_file.most_common(opts.top):
        print(f"  {count:5d}  {name}")
    if opts.max is not None and share >= opts.max:
        said = f"names: {share:.1f}% is not under {opts.max:g}%: name them for what they hold"
        print(said, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
