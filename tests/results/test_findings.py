"""Findings are records: the verdict lines, the report's order and folding, the JSON and the exit
code are computed from them, never from their sentences. Tested on stored reports of real runs
(tests/stored/, made by tests/stored/make.py) and by reading xbackend's own source."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from roots import ROOT

from xbackend.files.textfmt import prose
from xbackend.report import from_json, to_json, to_markdown
from xbackend.report.answer import instrumentation, rank
from xbackend.results import Result
from xbackend.results.findings import Finding, Kind, Label

pytestmark = pytest.mark.unit  # the unit tier: make check

STORED = sorted((ROOT / "tests" / "stored").glob("*.json"))
PACKAGE = ROOT / "xbackend"


def _stored(path: Path) -> Result:
    return from_json(path.read_text("utf-8"), str(path))


def test_the_stored_reports_cover_every_label_but_advice() -> None:
    """What the rest of this file reads: a battery wide enough to mean something."""
    assert [p.stem for p in STORED] == [
        "candidate", "decided", "decoded", "drifted", "gated", "nothing-ran", "planted", "vacuous",
    ]  # fmt: skip
    labels = {f.label for p in STORED for f in _stored(p).findings()}
    assert labels == set(Label) - {Label.ADVICE}


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_the_verdict_lines_are_the_findings_and_the_json_holds_both(path: Path) -> None:
    result = _stored(path)
    found = result.findings()
    assert result.verdict() == [f.line for f in found]
    verdict = json.loads(to_json(result))["verdict"]
    assert verdict["lines"] == result.verdict()
    assert [Finding.from_json(f) for f in verdict["findings"]] == found


def _reworded(found: list[Finding]) -> list[Finding]:
    return [f.with_sentence(f"finding number {k}") for k, f in enumerate(found)]


def _order(markdown: str, found: list[Finding]) -> list[int]:
    """Which finding each bullet of the Verdict and of All findings shows, in the report's order."""
    shown = {f"- {prose(f.line)}": k for k, f in enumerate(found)}
    return [shown[line] for line in markdown.splitlines() if line in shown]


def _masked(data: Any) -> Any:
    """The JSON with every sentence and verdict line replaced by its type: its structure."""
    if isinstance(data, dict):
        return {k: ("<text>" if k in ("sentence", "lines") else _masked(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [_masked(v) for v in data]
    return data


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_rewording_every_finding_moves_nothing(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sentence replaced by 'finding number K': the report shows the same findings in the
    same order and folds the same ones, the JSON keeps its structure, the exit code and the gates
    stay."""
    result = _stored(path)
    found = result.findings()
    before_md, before_json = to_markdown(result), json.loads(to_json(result))
    exit_code, gates = result.exit_code, [(g.policy, g.exit_code) for g in result.gates()]
    original = Result.findings
    monkeypatch.setattr(Result, "findings", lambda self: _reworded(original(self)))
    after_md, after_json = to_markdown(result), json.loads(to_json(result))
    order = _order(before_md, found)
    assert order and _order(after_md, _reworded(found)) == order
    assert _masked(after_json) == _masked(before_json)
    assert result.exit_code == exit_code and [(g.policy, g.exit_code) for g in result.gates()] == gates
    assert result.verdict() == [f.line for f in _reworded(found)]


def test_the_report_ranks_and_folds_by_label_and_kind() -> None:
    """Changed answers sit beside the failures; the observer effect and the reference's own
    thread counts are xbackend's instruments, folded below; a candidate's thread finding is not."""
    flip = Finding(Label.WARN, Kind.TOKEN_FLIP, "anything at all", backend="ort-cpu")
    warn = Finding(Label.WARN, Kind.PROBE, "anything at all", backend="ort-cpu")
    ranks = [
        rank(f)
        for f in (Finding(Label.PASS, Kind.PASS, "x"), flip, warn, Finding(Label.NOTE, Kind.PROBE, "x"))
    ]
    assert ranks == [-1, 1, 2, 3]
    result = _stored(ROOT / "tests" / "stored" / "gated.json")
    threads = Finding(Label.WARN, Kind.THREADS_VARY, "whatever it says", backend="reference", probe="threads")
    assert instrumentation(result, threads)
    assert not instrumentation(result, dataclasses.replace(threads, backend="ort-cpu"))
    assert not instrumentation(result, dataclasses.replace(threads, candidate="c.onnx"))
    observer = next(f for f in result.findings() if f.kind is Kind.OBSERVER_EFFECT)
    assert instrumentation(result, observer.with_sentence("reworded"))


# --- no code reads a sentence back ------------------------------------------------------------

LABELS = "|".join(label.value for label in Label)
_LABELLED = re.compile(rf"^\s*({LABELS})\b")
_READS = {"startswith", "endswith", "removeprefix", "removesuffix", "partition", "rpartition", "split",
          "rsplit", "find", "rfind", "index", "count"}  # fmt: skip
# where the verdict's lines are made into text, and the one place the label words are defined
_WRITERS = {"xbackend/results/findings.py"}
_VERDICT_CALLERS = {"xbackend/sweep/node.py", "xbackend/cli/run.py", "xbackend/results/result.py"}


def _texts(node: ast.AST) -> list[str]:
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            out.append(sub.value)
    return out


def sentence_readers(source: str, path: str) -> list[str]:
    """Places in `source` that read a verdict line or a finding's words: a string method or a
    comparison given a label word ('FAIL', 'WARN: '), a string method or `in` applied to a
    finding's `.sentence` or `.line`, and `.verdict()` called outside the places that print it."""
    out = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _READS:
                args = [t for a in node.args for t in _texts(a)]
                if any(_LABELLED.match(t) for t in args) and path not in _WRITERS:
                    out.append(f"{path}:{line}: .{node.func.attr}() of a label word")
                target = node.func.value
                if isinstance(target, ast.Attribute) and target.attr in ("sentence", "line"):
                    out.append(f"{path}:{line}: .{target.attr}.{node.func.attr}()")
            if node.func.attr == "verdict" and path not in _VERDICT_CALLERS:
                out.append(f"{path}:{line}: .verdict() read back")
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            if any(_LABELLED.match(t) for p in parts for t in _texts(p)) and path not in _WRITERS:
                out.append(f"{path}:{line}: a comparison with a label word")
            if any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(
                isinstance(p, ast.Attribute) and p.attr in ("sentence", "line") for p in node.comparators
            ):
                out.append(f"{path}:{line}: `in` a finding's words")
    return sorted(out, key=lambda said: int(said.split(":")[1]))


def test_no_module_reads_a_verdict_line_or_a_findings_words() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        found += sentence_readers(path.read_text("utf-8"), rel)
    assert found == []


def test_the_source_check_catches_each_way_of_reading_a_sentence() -> None:
    """Planted: what report/answer.py did before findings were records, and the ways around it."""
    planted = (
        'a = line.startswith("WARN: observer effect on ")\n'
        'b = [v for v in lines if v.startswith(("PASS", "NOTE"))]\n'
        'c = "leaves" in finding.sentence\n'
        'd = finding.line.split(": ", 1)\n'
        "e = result.verdict()\n"
        'f = kind == "FAIL"\n'
    )
    assert [x.split(": ", 1)[0] for x in sentence_readers(planted, "xbackend/report/x.py")] == [
        "xbackend/report/x.py:1",
        "xbackend/report/x.py:2",
        "xbackend/report/x.py:3",
        "xbackend/report/x.py:4",
        "xbackend/report/x.py:5",
        "xbackend/report/x.py:6",
    ]
