"""The report's first screen, as a reviewer reads it: three answers (run to run, build to build,
across backends) within its first 40 lines, the grain each engine was judged at on its verdict
line, no note about xbackend's own instruments above the fold, and figures a browser shows at a
readable size."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TESTS

import xbackend
from xbackend.files.textfmt import prose
from xbackend.numerics.metrics import TensorDiff
from xbackend.report import to_markdown
from xbackend.report.answer import GLOSSARY, instrumentation
from xbackend.report.bundle import write_markdown_bundle
from xbackend.results import BackendResult

pytestmark = pytest.mark.slow

ANSWERS = ("- **Run to run: ", "- **Build to build: ", "- **Across backends: ")


def _head(md: str) -> list[str]:
    """The lines above the first fold."""
    lines = md.splitlines()
    return lines[: next(i for i, line in enumerate(lines) if line.startswith("<details>"))]


def _first_screen(md: str) -> list[str]:
    lines = md.splitlines()
    for start in ANSWERS:  # each answer once, within the first 40 lines
        (at,) = [i for i, line in enumerate(lines) if line.startswith(start)]
        assert at < 40, (start, at)
    verdict_end = lines.index("## Backends")
    assert verdict_end < 40, verdict_end
    return _head(md)


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xbackend.export.example_inputs import InputDecl
    from xbackend.export.torch_onnx import export_torch

    out = tmp_path_factory.mktemp("resnet") / "resnet.onnx"
    shutil.copy(TESTS / "hf_models.py", out.parent / "hf_models.py")
    export_torch(f"{out.parent / 'hf_models.py'}:resnet", [InputDecl("pixel_values", (1, 3, 64, 64))], out)
    return out


def test_a_resnet_report_answers_first_and_names_the_grain(resnet: Path) -> None:
    """ONNX Runtime fuses the ResNet's convolutions into one NCHWc stack: the verdict line itself
    says it was judged at a handful of tensors, not node by node, and so does the answer."""
    r = xbackend.compare(resnet, backends=["ort-cpu", "openvino-cpu", "reference"], runs=2, builds=2)
    md = to_markdown(r, "report")
    head = _first_screen(md)
    nodes = len([n for n in onnx.load(resnet).graph.node if n.op_type != "Constant"])
    ort = next(line for line in r.verdict() if line.startswith("EXPLAINED: ort-cpu: "))
    m = re.match(r"EXPLAINED: ort-cpu: judged at (\d+) tensors of the model's (\d+) nodes", ort)
    assert m is not None, ort
    assert int(m.group(1)) < int(m.group(2)) <= nodes + 1, ort
    across = next(line for line in head if line.startswith(ANSWERS[2]))
    assert "explained by rounding" in across and f"ort-cpu {m.group(1)}" in across, across
    runs = next(line for line in head if line.startswith(ANSWERS[0]))
    assert runs.startswith("- **Run to run: the same bits.** Each of the 3 backends"), runs
    builds = next(line for line in head if line.startswith(ANSWERS[1]))
    assert builds.startswith("- **Build to build: the same bits.** 2 fresh builds"), builds
    mine = {f"- {prose(f.line)}" for f in r.findings() if instrumentation(r, f)}
    assert not mine & set(head)
    pass_line = next(line for line in r.verdict() if line.startswith("PASS"))
    assert f"ort-cpu at {m.group(1)} tensors of {m.group(2)}" in pass_line, pass_line


def test_a_bert_report_keeps_instrument_notes_below_the_fold(bert: Path) -> None:
    """The observer effect (ONNX Runtime fuses otherwise once every tensor is exposed) is a note on
    xbackend's own instruments: under All findings, never in the verdict a reviewer reads first."""
    r = xbackend.compare(
        bert, backends=["ort-cpu", "reference"], shapes={"batch": 2, "sequence": 16}, runs=2, probes="threads"
    )
    md = to_markdown(r, "report")
    head = _first_screen(md)
    mine = [f.line for f in r.findings() if instrumentation(r, f)]
    assert mine, r.verdict()  # the case this test is about: there is a note to move
    assert not any(line.removeprefix("- ") in mine for line in head)
    findings = md.split("## All findings", 1)[1]
    assert "About xbackend's own instruments (not the engines you ship):" in findings
    assert all(f"- {line}" in findings for line in mine)
    assert (
        "- **Build to build: not measured.** One build per backend (`--builds 2` makes fresh ones)." in head
    )
    # every term the head uses is defined once, in the glossary the head links to
    assert "See the [glossary](#glossary)." in md and "## Glossary" in md
    for term, words in GLOSSARY:
        assert f"- **{term}**: {words}" in md


def test_the_glossary_page_is_the_reports_glossary() -> None:
    page = (TESTS.parent / "docs" / "glossary.md").read_text("utf-8")
    for term, words in GLOSSARY:
        assert f"- **{term}**: {words}" in page, term


def test_run_to_run_words_say_which_tensors_varied() -> None:
    """An exposed intermediate that varies while the outputs stay identical: the line says so,
    never '1 distinct outputs in 20 runs'."""
    moved = TensorDiff.from_arrays("h", np.float32([1.0, 2.0]), np.float32([1.0, 2.5]), "MatMul")
    b = BackendResult(
        "racy", "ok", runs=20, builds=1, deterministic=False, distinct_outputs=1, distinct_run_outputs=1,
        distinct_build_outputs=1, run_diffs=(moved,),
    )  # fmt: skip
    assert b.variance_words() == (
        "nondeterministic run to run: identical outputs in 20 runs of one build, intermediates varied"
    )
    b6 = BackendResult(
        "racy", "ok", runs=6, builds=1, deterministic=False, distinct_outputs=6, distinct_run_outputs=6,
        distinct_build_outputs=1, run_diffs=(moved,),
    )  # fmt: skip
    assert b6.variance_words() == "nondeterministic run to run: 6 distinct outputs in 6 runs of one build"


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_each_figure_shows_at_a_readable_size_in_a_browser(resnet: Path, tmp_path: Path) -> None:
    """The report as GitHub renders it (cmark-gfm), opened in headless Chromium at 1280 px: every
    figure loads and is drawn at least 600 px wide; the first screen is saved beside it."""
    browser = _chromium()
    if browser is None:
        pytest.skip(
            "no Chromium here (apt-get install chromium): the figures were not looked at in a browser"
        )
    cmarkgfm = pytest.importorskip("cmarkgfm")
    from cmarkgfm.cmark import Options

    r = xbackend.compare(resnet, backends=["ort-cpu", "reference", "oracle"], runs=1, builds=2)
    write_markdown_bundle(r, tmp_path / "report.md")
    md = (tmp_path / "report.md").read_text("utf-8")
    figures = re.findall(r"!\[[^\]]*\]\((report\.[\w-]+\.png)\)", md)
    assert "report.error-depth.png" in figures and "report.build-variance.png" not in figures
    assert "*Build variance is not drawn: fresh builds of ort-cpu, reference, oracle computed the same" in md
    body = cmarkgfm.github_flavored_markdown_to_html(md, options=Options.CMARK_OPT_UNSAFE)
    probe = (
        "<script>addEventListener('load',()=>{document.body.dataset.images=[...document.images]"
        ".map(i=>[i.getAttribute('src'),i.naturalWidth,Math.round(i.getBoundingClientRect().width)].join(','))"
        ".join(';')})</script>"
    )
    page = tmp_path / "page.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><style>body{max-width:980px;margin:auto;"
        f"font-family:sans-serif}} img{{max-width:100%}}</style></head><body>{body}{probe}</body></html>",
        "utf-8",
    )
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000"]
    dom = subprocess.run(
        [*args, "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=120, check=True,
    ).stdout  # fmt: skip
    seen = re.search(r'data-images="([^"]*)"', dom)
    assert seen is not None, dom[-500:]
    shown = {src: (int(w), int(drawn)) for src, w, drawn in (x.split(",") for x in seen.group(1).split(";"))}
    assert set(shown) == set(figures)
    for src, (natural, drawn) in shown.items():
        assert natural >= 800 and drawn >= 600, (src, natural, drawn)
    shot = tmp_path / "first-screen.png"
    subprocess.run(
        [*args, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True
    )
    assert shot.stat().st_size > 10_000


def test_builds_that_vary_are_answered_and_drawn(
    models: dict[str, Path], plugins: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backend whose second build computes other bits: the answer says NO with its figure, and
    the build-variance figure is drawn (only then)."""
    from xbackend.cli.main import main

    out = tmp_path / "r" / "report.md"
    argv = [
        "compare", str(models["mlp_layernorm"]), "--runs", "1", "--probes", "none",
        "--backends", "test-flaky-build,reference", "--builds", "2",
        "--set", f"test-flaky-build.state_dir={tmp_path}", "--set", "test-flaky-build.tensor=y",
        "--report", str(out), "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 1
    capsys.readouterr()
    md = out.read_text("utf-8")
    head = _first_screen(md)
    builds = next(line for line in head if line.startswith(ANSWERS[1]))
    assert builds.startswith(
        "- **Build to build: NO.** test-flaky-build: 2 distinct outputs over 2 builds"
    ), builds
    assert "![Build variance per layer](report.build-variance.png)" in md
    assert (out.parent / "report.build-variance.png").is_file()
    assert "Build variance is not drawn" not in md
