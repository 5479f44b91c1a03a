"""Fuzzing the paths a user can name, for every command that writes: each output path is drawn
from the kinds the system refuses or that belong to someone (too long, not UTF-8, a link loop, a
dangling link, a FIFO, a device, a folder, a file under a file, someone's file, a file made to
look like a report) and the command must end with exit 0 or 2, one line on stderr when 2,
within seconds, with every file that was there unchanged."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_helpers import relu_model, run

pytestmark = pytest.mark.slow

FUZZ = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

KINDS = ["new", "long", "not-utf8", "loop", "dangling", "fifo", "device", "folder", "under-file", "theirs",
         "looks-ours"]  # fmt: skip


def _path(kind: str, folder: Path, suffix: str) -> str:
    """A path of `kind` in `folder` (made there, when it is a thing that exists)."""
    p = folder / f"{kind}{suffix}"
    if kind == "long":
        return str(folder / ("x" * 300 + suffix))
    if kind == "not-utf8":
        return os.fsdecode(bytes(folder) + b"/r\xff" + suffix.encode())
    if kind == "loop":
        (folder / "l1").symlink_to(folder / "l2")
        (folder / "l2").symlink_to(folder / "l1")
        return str(folder / "l1" / f"r{suffix}")
    if kind == "dangling":
        p.symlink_to(folder / "nowhere")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "device":
        return "/dev/null"
    elif kind == "folder":
        p.mkdir()
    elif kind == "under-file":
        (folder / "afile").write_text("mine", "utf-8")
        return str(folder / "afile" / f"r{suffix}")
    elif kind == "theirs":
        p.write_text("someone's notes\n", "utf-8")
    elif kind == "looks-ours":
        p.write_text('# xbackend report: x\n"schema": "xbackend.report/1"\n', "utf-8")
    return str(p)


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = Path(root) / n
            rel = os.fsencode(p.relative_to(folder)).decode("utf-8", "backslashreplace")
            if p.is_symlink():
                out[rel] = os.readlink(p)
            else:
                out[rel] = p.read_bytes() if p.is_file() else "dir"
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A model, a JSON report and a capture, made once."""
    from xbackend.cli import main

    d = tmp_path_factory.mktemp("made")
    model = relu_model(d)
    np.savez(d / "x.npz", x=np.linspace(-1, 1, 4, dtype=np.float32))
    js = d / "r.json"
    assert main(["compare", str(model), "--backends", "reference", "--runs", "1", "--json", str(js),
                 "--no-progress"]) == 0  # fmt: skip
    assert main(["capture", str(model), "--backend", "reference", "-o", str(d / "cap"), "--no-progress"]) == 0
    (d / "s.toml").write_text(
        '[[backends]]\nname = "reference"\n[[models]]\nname = "m"\npath = "relu.onnx"\n'
        'inputs = "x.npz"\nruns = 1\n',
        "utf-8",
    )
    return model, js, d / "cap"


NP = "--no-progress"
COMMANDS = {
    "compare --report": (".md", lambda m, j, c, out: ["compare", str(m), "--backends", "reference", "--runs",
                                                       "1", "--probes", "none", NP, "--report", out]),
    "compare --json": (".json", lambda m, j, c, out: ["compare", str(m), "--backends", "reference", "--runs",
                                                       "1", "--probes", "none", NP, "--json", out]),
    "report -o": (".md", lambda m, j, c, out: ["report", str(j), "-o", out]),
    "diff -o": (".md", lambda m, j, c, out: ["diff", str(j), str(j), "-o", out]),
    "capture export --npz": (".npz", lambda m, j, c, out: ["capture-export", str(c), "--npz", out]),
    "capture -o": ("", lambda m, j, c, out: ["capture", str(m), "--backend", "reference", NP, "-o", out]),
    "certify -o": ("", lambda m, j, c, out: ["certify", str(m), "--backend", "reference", NP, "-o", out]),
    "sweep -o": ("", lambda m, j, c, out: ["sweep", str(m.parent / "s.toml"), NP, "-o", out]),
}  # fmt: skip


@FUZZ
@given(command=st.sampled_from(sorted(COMMANDS)), kind=st.sampled_from(KINDS), force=st.booleans())
def test_every_output_path_kind_is_written_or_one_line(
    made: tuple[Path, Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    command: str,
    kind: str,
    force: bool,
) -> None:
    folder = tmp_path_factory.mktemp("out")
    suffix, argv = COMMANDS[command]
    out = _path(kind, folder, suffix)
    before = _snapshot(folder)
    started = time.monotonic()
    code, _, err = run(capsys, *argv(*made, out), *(["--force"] if force else []))
    assert time.monotonic() - started < 120
    assert code in (0, 2), (command, kind, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("xbackend: error: "), err
    after = _snapshot(folder)
    stem = command == "certify -o"  # -o STEM: its files are STEM.json and STEM.md beside the path
    kept = ("fifo", "device", "dangling", "folder") + (("theirs", "looks-ours") if not force else ())
    for rel, content in before.items():
        if kind in kept:
            assert after.get(rel) == content, (command, kind, rel)
    refused = {"long", "not-utf8", "loop", "under-file", "device"}
    if not stem:
        refused |= {"fifo", "dangling"} | ({"theirs", "looks-ours"} if not force else set())
    if kind in refused:
        assert code == 2, (command, kind, err)
