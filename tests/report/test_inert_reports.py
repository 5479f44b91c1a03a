"""Every report kind, rendered as GitHub renders Markdown (cmark-gfm), from forged names: a model
file name, tensor names, a sweep's model name, a JSON report's environment values and backend
names. Each builds exactly the links, images and tags the same report on plain names builds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.cli_helpers import run
from tests.system.test_boundary import FORGING, _chain, _rendered

# what a name can try: links (with and without a cancelling backslash), autolinks, emphasis
NAMES = [*FORGING, "**bold**", "__strong__", "a*b*c", "x\\*\\*y\\*\\*"]


def _same_page(kind: str, plain_md: str, forged_md: str) -> None:
    plain, forged = _rendered(plain_md), _rendered(forged_md)
    assert all(not link.startswith(("http", "mailto", "//")) for link in forged.links), (kind, forged.links)
    assert len(plain.links) == len(forged.links), kind
    ignore = {"code"}  # a name holding a backtick or an address is a code span, by design
    forged_tags = {t: n for t, n in forged.tags.items() if t not in ignore}
    assert forged_tags == {t: n for t, n in plain.tags.items() if t not in ignore}, kind


def _forge_json(path: Path, dest: Path, env_value: str, backend: str) -> None:
    """A report JSON whose environment values and backend name are someone's strings."""
    text = path.read_text("utf-8").replace('"ort-cpu', json.dumps(backend)[:-1])
    data = json.loads(text)
    for pair in data["result"]["environment"][:3]:  # [key, value] pairs
        pair[1] = env_value
    dest.write_text(json.dumps(data, indent=1, sort_keys=True), "utf-8")


@pytest.mark.parametrize("forged", [NAMES[0], NAMES[5], "**bold**", "f\\[x](https:evil.example/d)"])
def test_every_report_kind_builds_nothing_from_a_name(
    forged: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pages: dict[str, dict[str, str]] = {}
    for kind in ("plain", "forged"):
        folder = tmp_path / kind
        folder.mkdir()
        names = NAMES if kind == "forged" else [f"t{k}" for k in range(len(NAMES))]
        stem = forged.replace("/", "_") if kind == "forged" else "model"
        model = _chain(folder / f"{stem}.onnx", names)
        md, js = folder / "r.md", folder / "r.json"
        base = ("--runs", "2", "--no-progress")
        code, _, err = run(capsys, "compare", str(model), "--backends", "ort-cpu,reference", *base,
                           "--report", str(md), "--json", str(js))  # fmt: skip
        assert code == 0, err
        code, _, err = run(capsys, "certify", str(model), "--backend", "reference", "--builds", "2",
                           *base, "-o", str(folder / "cert"))  # fmt: skip
        assert code in (0, 16), err
        value, backend = (forged, f"ort-cpu{forged}") if kind == "forged" else ("plain value", "ort-cpu0")
        _forge_json(js, folder / "other.json", value, backend)
        code, _, err = run(capsys, "report", str(folder / "other.json"), "-o", str(folder / "other.md"))
        assert code == 0, err
        code, _, err = run(capsys, "diff", str(js), str(folder / "other.json"), "-o", str(folder / "d.md"))
        assert code == 1, err
        sweep = folder / "sweep"
        sweep.mkdir()
        shutil.copy(model, sweep / "m.onnx")
        np.savez(sweep / "x.npz", x=np.linspace(-1, 1, 4, dtype=np.float32))
        name = forged if kind == "forged" else "model"
        (sweep / "s.toml").write_text(
            f'[[backends]]\nname = "reference"\n[[models]]\nname = {json.dumps(name)}\npath = "m.onnx"\n'
            'inputs = "x.npz"\nruns = 1\n',
            "utf-8",
        )
        fleet = ("-o", str(folder / "fleet"), "--no-progress")
        code, _, err = run(capsys, "sweep", str(sweep / "s.toml"), *fleet)
        assert code in (0, 1), err
        model_md = next((folder / "fleet" / "models").glob("*.md"))
        pages[kind] = {
            "compare": md.read_text("utf-8"),
            "certify": (folder / "cert.md").read_text("utf-8"),
            "report": (folder / "other.md").read_text("utf-8"),
            "diff": (folder / "d.md").read_text("utf-8"),
            "fleet": (folder / "fleet" / "fleet.md").read_text("utf-8"),
            "fleet model": model_md.read_text("utf-8"),
        }
    for kind in pages["plain"]:
        _same_page(kind, pages["plain"][kind], pages["forged"][kind])


# escaped backticks and a name's own backslashes, which once opened or cancelled a code span
ESCAPED = [
    "\\[e](https://evil.example/env) _em_",
    "x\\`[l](https://evil.example/f)\\`",
    "\\`*em*\\` and \\`_em_\\`",
    "``[l](https://evil.example/g)\\``",
    "\\\\`[l](https://evil.example/h)`",
    "tail\\",
    "a@b.example``x``",
    "_em_www.evil.example",
]


@pytest.mark.parametrize("forged", ESCAPED)
def test_values_from_a_result_json_build_nothing(
    forged: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`xbackend report` on a result JSON whose environment values and a backend's name are
    someone's strings: the page builds exactly what its plain twin builds."""
    model = _chain(tmp_path / "m.onnx", ["t0", "t1"])
    js = tmp_path / "r.json"
    code, _, err = run(capsys, "compare", str(model), "--backends", "ort-cpu,reference", "--runs", "1",
                       "--no-progress", "--json", str(js))  # fmt: skip
    assert code == 0, err
    pages = {}
    for kind, value, backend in (
        ("plain", "plain value", "ort-cpu0"),
        ("forged", forged, f"ort-cpu{forged}"),
    ):
        _forge_json(js, tmp_path / f"{kind}.json", value, backend)
        out = tmp_path / f"{kind}.md"
        code, _, err = run(capsys, "report", str(tmp_path / f"{kind}.json"), "-o", str(out))
        assert code == 0, err
        pages[kind] = out.read_text("utf-8")
    _same_page("report", pages["plain"], pages["forged"])


def test_the_escaping_functions_build_nothing_from_any_short_mix() -> None:
    """Every string of up to three pieces among backticks (escaped or not), backslashes, links,
    emphasis, tags, www. and e-mail addresses (2,197 of them), through each function a name
    passes in a report: inert, prose, a table cell. None renders a link, emphasis or a tag."""
    import itertools

    from xbackend.files.textfmt import inert, prose
    from xbackend.report.markup import cell

    pieces = ["`", "\\`", "``", "\\\\`", "[l](https://e.example)", "_em_", "*s*", "x", " ", "\\", "<b>",
              "www.e.example", "a@b.example"]  # fmt: skip
    built = []
    for k in (1, 2, 3):
        for combo in itertools.product(pieces, repeat=k):
            text = "".join(combo)
            for shown in (inert(text), prose(text), f"|a|\n|-|\n|{cell(text)}|"):
                page = _rendered(shown)
                if page.links or set(page.tags) & {"em", "strong", "b", "a", "del"}:
                    built.append((text, shown))
    assert built == []
