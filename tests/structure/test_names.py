"""scripts/names.py: the share of one-letter bindings, counted as the issue counts them."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
from roots import ROOT

pytestmark = pytest.mark.unit  # the unit tier: make check

spec = importlib.util.spec_from_file_location("names", ROOT / "scripts" / "names.py")
assert spec is not None and spec.loader is not None
names = importlib.util.module_from_spec(spec)
sys.modules["names"] = names
spec.loader.exec_module(names)


def test_every_kind_of_binding_is_counted_once() -> None:
    source = (
        "def f(a, /, bb, *c, d=1, **e):\n"
        "    g = 1\n"
        "    h: int = 2\n"
        "    i += 1\n"
        "    for j, (k, *ll) in []:\n"
        "        pass\n"
        "    with open('x') as m:\n"
        "        pass\n"
        "    try:\n"
        "        pass\n"
        "    except OSError as n:\n"
        "        pass\n"
        "    q = [o for o in p if (r := o)]\n"
        "    _ = lambda s: s\n"
        "class C:\n"
        "    def method(self, t): ...\n"
    )
    found = list(names.bindings(ast.parse(source)))
    assert sorted(found) == sorted(
        ["a", "bb", "c", "d", "e", "g", "h", "i", "j", "k", "ll", "m", "n", "q", "o", "r", "_", "s", "t"]
    )


def test_the_script_fails_at_its_ceiling_and_passes_under_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Planted: four bindings, one of them one letter (25%)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(
        "def scale(value, factor):\n    x = value * factor\n    result = x\n    return result\n"
    )
    assert names.main(["--folder", str(package)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "1 of 4 bindings are one letter: 25.0%",
        "      1  pkg/mod.py",
    ]
    assert names.main(["--folder", str(package), "--max", "25"]) == 1
    assert "is not under 25%" in capsys.readouterr().err
    assert names.main(["--folder", str(package), "--max", "25.1"]) == 0
