"""Ownership by record: xbackend replaces or removes a file only if its folder's ledger lists it
with the digest it has now, or the user passed --force; checked before the run and again at the
moment of writing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import xbackend.cli.run
from tests.cli_helpers import one_line_error, relu_model, run
from xbackend.errors import UsageError
from xbackend.files.atomic import stage_bytes, write_atomic
from xbackend.files.owned import LEDGER, is_ours, place

BASE = ("--backends", "ort-cpu", "--runs", "1", "--no-progress")


def test_a_file_that_looks_like_a_report_is_still_someones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's notes that begin as a report does, or a source file holding the report schema's
    string (as files/atomic.py once did), are not xbackend's: refused, intact; --force replaces."""
    model = relu_model(tmp_path)
    notes = tmp_path / "notes.md"
    notes.write_text("# xbackend report: my notes about it\n", "utf-8")
    source = tmp_path / "atomic.json"
    source.write_text('_TAIL = b\'"schema": "xbackend.report/\'\n', "utf-8")
    for flag, path in (("--report", notes), ("--json", source)):
        before = path.read_bytes()
        code, _, err = run(capsys, "compare", str(model), *BASE, flag, str(path))
        assert code == 2 and path.read_bytes() == before
        one_line_error(err, f"{flag} {path} exists and xbackend did not write it")
        assert "--force" in err
    code, _, err = run(capsys, "compare", str(model), *BASE, "--report", str(notes), "--force")
    assert code == 0, err
    assert notes.read_text("utf-8").startswith("# xbackend report") and is_ours(notes)


def test_a_recorded_report_is_replaced_and_a_changed_one_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = relu_model(tmp_path)
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    out = ("--report", str(md), "--json", str(js))
    assert run(capsys, "compare", str(model), *BASE, *out)[0] == 0
    ledger = json.loads((tmp_path / LEDGER).read_text("utf-8"))
    assert ledger["schema"] == "xbackend.files/2" and len(ledger["seal"]) == 64
    assert sorted(ledger["files"]) == ["r.json", "r.layers.csv", "r.md"]
    assert ledger["files"]["r.md"] == hashlib.sha256(md.read_bytes()).hexdigest()
    assert run(capsys, "compare", str(model), *BASE, *out)[0] == 0  # its own files: a re-run replaces them
    with md.open("a", encoding="utf-8") as f:
        f.write("my review comment\n")  # changed since xbackend wrote it: someone's now
    edited = md.read_bytes()
    code, _, err = run(capsys, "compare", str(model), *BASE, *out)
    assert code == 2 and md.read_bytes() == edited
    one_line_error(err, f"--report {md} exists and xbackend did not write it (or it changed since)")
    # a forged ledger entry (a digest that is not the file's) owns nothing
    (tmp_path / "theirs.json").write_text("{}", "utf-8")
    ledger["files"]["theirs.json"] = "0" * 64
    (tmp_path / LEDGER).write_text(json.dumps(ledger), "utf-8")
    code, _, err = run(capsys, "compare", str(model), *BASE, "--json", str(tmp_path / "theirs.json"))
    assert code == 2 and (tmp_path / "theirs.json").read_text("utf-8") == "{}"


def test_a_file_that_appears_during_the_run_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check before the run passes (nothing there); a user's file made at the --report and
    --json paths while the backends run is refused at the moment of writing, exit 2, intact."""
    model = relu_model(tmp_path)
    md, js = tmp_path / "late.md", tmp_path / "late.json"
    real = xbackend.cli.run.compare_with_options

    def meanwhile(*a: Any, **k: Any) -> Any:
        result = real(*a, **k)
        md.write_text("written by the user meanwhile\n", "utf-8")
        js.write_text("{}\n", "utf-8")
        return result

    monkeypatch.setattr(xbackend.cli.run, "compare_with_options", meanwhile)
    code, _, err = run(capsys, "compare", str(model), *BASE, "--report", str(md), "--json", str(js))
    assert code == 2, err
    # the bundle and its JSON twin are checked together before the first is placed
    one_line_error(err, f"the report {js} appeared while xbackend ran and xbackend did not write it")
    assert md.read_text("utf-8") == "written by the user meanwhile\n" and js.read_text("utf-8") == "{}\n"
    # nothing of the bundle was placed, no temp file is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.json", "late.md", "relu.onnx"]


def test_place_never_replaces_a_file_made_after_the_check(tmp_path: Path) -> None:
    """The race at its narrowest: the temp file is finished, then someone's file appears."""
    dest = tmp_path / "out.md"
    tmp = stage_bytes(dest, b"ours", "report")
    dest.write_bytes(b"theirs")
    with pytest.raises(UsageError, match="appeared while xbackend ran"):
        place(tmp, dest, hashlib.sha256(b"ours").hexdigest(), "report")
    assert dest.read_bytes() == b"theirs"
    tmp.unlink()
    write_atomic(dest, "ours", force=True)  # the API's explicit overwrite
    assert dest.read_text("utf-8") == "ours" and is_ours(dest)


def test_the_module_is_never_its_own_export_even_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = tmp_path / "mod.py"
    mod.write_text("import torch\ndef build():\n    return torch.nn.ReLU()\n", "utf-8")
    before = mod.read_bytes()
    spec = f"{mod}:build"
    code, _, err = run(capsys, "export", "torch", spec, "-o", str(mod), "--input", "x=2,3", "--force")
    assert code == 2 and mod.read_bytes() == before
    one_line_error(err, "is an input of this command")
    out = tmp_path / "m.onnx"
    for _ in range(2):  # an export it recorded: replaced by the next
        code, _, err = run(capsys, "export", "torch", spec, "-o", str(out), "--input", "x=2,3")
        assert code == 0, err
    assert is_ours(out)


SWEEP = """
[sweep]
output = "{output}"
[[backends]]
name = "reference"
[[models]]
name = "{name}"
path = "relu.onnx"
inputs = "x.npz"
runs = 1
"""


def _sweep_folder(tmp_path: Path, output: str, name: str) -> Path:
    import numpy as np

    folder = tmp_path / "project"
    folder.mkdir()
    relu_model(folder)
    np.savez(folder / "x.npz", x=np.arange(4, dtype=np.float32))
    (folder / "s.toml").write_text(SWEEP.format(output=output, name=name), "utf-8")
    return folder


def test_a_sweep_file_cannot_write_over_a_projects_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`output = "."` and a model named README, in a project with jobs/ and models/README.md:
    refused before any job, every file intact. A folder holding fleet.json and jobs/ is not a
    sweep's for that."""
    folder = _sweep_folder(tmp_path, ".", "README")
    (folder / "models").mkdir()
    (folder / "models" / "README.md").write_text("the project's readme\n", "utf-8")
    (folder / "jobs" / "README" / "reference").mkdir(parents=True)
    (folder / "jobs" / "README" / "reference" / "keep.txt").write_text("keep\n", "utf-8")
    (folder / "fleet.json").write_text('{"mine": true}\n', "utf-8")
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    code, _, err = run(capsys, "sweep", str(folder / "s.toml"), "--no-progress")
    assert code == 2
    one_line_error(err, "is a non-empty folder xbackend did not write; xbackend never writes into it")
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    # -o: a folder a sweep wrote, where a user then put a file of their own in a job folder
    out = tmp_path / "fleet"
    folder2 = tmp_path / "p2"
    folder2.mkdir()
    (folder / "s.toml").rename(folder2 / "s.toml")
    for f in ("relu.onnx", "x.npz"):
        (folder / f).rename(folder2 / f)
    code, _, err = run(capsys, "sweep", str(folder2 / "s.toml"), "-o", str(out), "--no-progress")
    assert code == 0, err
    keep = out / "jobs" / "README" / "reference" / "keep.txt"
    keep.write_text("mine\n", "utf-8")
    code, _, err = run(
        capsys, "sweep", str(folder2 / "s.toml"), "-o", str(out), "--no-progress", "--no-resume"
    )
    assert code == 2 and keep.read_text("utf-8") == "mine\n"
    one_line_error(err, f"job folder {keep.parent} holds {keep}, which xbackend did not write")
    mine = out / "models" / "README.md"
    keep.unlink()
    mine.write_text("edited\n", "utf-8")
    code, _, err = run(capsys, "sweep", str(folder2 / "s.toml"), "-o", str(out), "--no-progress")
    assert code == 2 and mine.read_text("utf-8") == "edited\n"
    one_line_error(err, f"-o {mine} exists and xbackend did not write it")
    code, _, err = run(capsys, "sweep", str(folder2 / "s.toml"), "-o", str(out), "--no-progress", "--force")
    assert code == 0, err
    assert is_ours(mine) and not any(p.name.endswith(".partial") for p in out.rglob("*"))


def test_a_ledger_that_is_not_ours_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / LEDGER).write_text("my own file with this name\n", "utf-8")
    with pytest.raises(UsageError, match="is not a ledger this user's xbackend can vouch for"):
        write_atomic(tmp_path / "r.md", "x")
    assert (tmp_path / LEDGER).read_text("utf-8") == "my own file with this name\n"
    assert not (tmp_path / "r.md").exists()  # refused before anything was placed
