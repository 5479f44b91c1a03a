"""scripts/docstrings.py: public functions and methods that say nothing of what they take and return."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
from roots import ROOT

pytestmark = pytest.mark.unit  # the unit tier: make check

spec = importlib.util.spec_from_file_location("docstrings", ROOT / "scripts" / "docstrings.py")
assert spec is not None and spec.loader is not None
docstrings = importlib.util.module_from_spec(spec)
sys.modules["docstrings"] = docstrings
spec.loader.exec_module(docstrings)


def test_an_override_reads_its_base_and_private_names_are_not_counted(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "base.py").write_text(
        textwrap.dedent(
            '''
            class Sink:
                def start(self, total):
                    """The plan is `total` steps."""

                def stop(self): ...


            def said():
                """Says."""


            def silent(): ...


            def _private(): ...
            '''
        ),
        "utf-8",
    )
    (package / "other.py").write_text(
        textwrap.dedent(
            """
            from pkg.base import Sink


            class Quiet(Sink):
                def start(self, total): ...

                def stop(self): ...

                def extra(self): ...


            class _Hidden:
                def shown(self): ...
            """
        ),
        "utf-8",
    )
    total, missing = docstrings.undocumented(package)
    assert total == 7  # start, stop, said, silent; Quiet's start, stop, extra
    named = sorted(entry.split(":", 2)[2] for entry in missing)
    assert named == ["Quiet.extra", "Quiet.stop", "Sink.stop", "silent"]  # Quiet.start reads Sink's
    assert docstrings.main(["--folder", str(package), "--max", "4", "--top", "0"]) == 1
    assert docstrings.main(["--folder", str(package), "--max", "5", "--top", "0"]) == 0


def test_xbackend_has_none() -> None:
    _, missing = docstrings.undocumented(ROOT / "xbackend")
    assert missing == []
