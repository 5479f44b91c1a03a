"""scripts/rename_short.py: one-letter bindings renamed only where the rename is safe."""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
from roots import ROOT

pytestmark = pytest.mark.unit  # the unit tier: make check

spec = importlib.util.spec_from_file_location("rename_short", ROOT / "scripts" / "rename_short.py")
assert spec is not None and spec.loader is not None
rename_short = importlib.util.module_from_spec(spec)
sys.modules["rename_short"] = rename_short
spec.loader.exec_module(rename_short)


def _renamed(tmp_path: Path, source: str, keywords: set[tuple[str, str]] | None = None) -> str:
    path = tmp_path / "planted.py"
    path.write_text(textwrap.dedent(source), "utf-8")
    rename_short.rename_file(path, keywords or set(), dry_run=False)
    return path.read_text("utf-8")


def test_names_come_from_what_is_iterated_annotated_and_caught(tmp_path: Path) -> None:
    out = _renamed(
        tmp_path,
        """
        def names(nodes, by_backend, graph):
            first = [n.name for n in nodes]
            for k, v in by_backend.items():
                print(k, v)
            for i, x in enumerate(graph.node):
                print(i, x)
            try:
                pass
            except OSError as e:
                raise ValueError(str(e)) from e
            return first
        """,
    )
    assert "[node.name for node in nodes]" in out
    assert "for backend, value in by_backend.items():" in out
    assert "for index, node in enumerate(graph.node):" in out
    assert "except OSError as error:" in out and "raise ValueError(str(error)) from error" in out


def test_a_rename_that_would_shadow_or_change_what_runs_is_left(tmp_path: Path) -> None:
    source = """
    def shadowed(node, nodes):
        return [n for n in nodes if n is not node]  # `node` is taken in the comprehension


    def outer_name(cross):
        return [c for c in cross]  # the first iterable is read outside: `cross` never shadowed


    def printed(nodes):
        return [f"{n=}" for n in nodes]  # the debug f-string prints the name itself


    def declared(items):
        global n
        for n in items:
            pass


    def rebound(nodes):
        for n in nodes:
            pass
        return lambda n: n  # a nested scope binds the same letter again
    """
    out = _renamed(tmp_path, source)
    assert "[n for n in nodes if n is not node]" in out
    assert "[c for c in cross]" in out
    assert '[f"{n=}" for n in nodes]' in out
    assert "for n in items:" in out
    assert "for n in nodes:" in out


def test_a_parameter_passed_by_keyword_keeps_its_name(tmp_path: Path) -> None:
    source = """
    def render(r: Result) -> str:
        return r.name


    def show(r: Result) -> str:
        return r.name
    """
    out = _renamed(tmp_path, source, keywords={("render", "r")})
    assert "def render(r: Result)" in out
    assert "def show(result: Result) -> str:\n    return result.name" in out


def test_the_rewrite_parses_to_the_old_tree_with_the_names_replaced(tmp_path: Path) -> None:
    source = """
    def judged(paths, rows):
        \"\"\"Each of `paths`' files; `rows` counted.\"\"\"
        sizes = {p.name: len(p.read_bytes()) for p in paths}
        total = sum(r for r in rows)
        return sizes, total
    """
    out = _renamed(tmp_path, source)
    assert "{path.name: len(path.read_bytes()) for path in paths}" in out
    assert "sum(row for row in rows)" in out
    before = ast.parse(textwrap.dedent(source))
    after = ast.parse(out)
    assert [type(node).__name__ for node in ast.walk(before)] == [
        type(node).__name__ for node in ast.walk(after)
    ]


def test_names_a_person_chose_apply_to_their_function_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "kernels.py"
    module.write_text("def attend(q, k):\n    return q @ k\n\n\ndef other(q):\n    return q\n", "utf-8")
    chosen = tmp_path / "names.map"
    chosen.write_text(f"{module} attend q=query k=key\n", "utf-8")
    monkeypatch.chdir(tmp_path)
    assert rename_short.main(["--map", str(chosen), "--callers", str(tmp_path), str(tmp_path)]) == 0
    assert (
        module.read_text("utf-8")
        == "def attend(query, key):\n    return query @ key\n\n\ndef other(q):\n    return q\n"
    )
