"""The examples in README.md and docs/ that are marked runnable, run as a user would run them.

A fenced block preceded by the line `<!-- runnable -->` is run: each `sh` command in turn (a
trailing backslash continues it), each `python` block as a script, a `python` block whose
first line is `# NAME.py` written to that file for the commands after it. Every document runs
in a fresh folder holding a copy of `models/`, with this environment's `xbackend` on PATH. Each
command must exit exactly as its block declares: 0 unless the marker says otherwise
(`<!-- runnable exit=1 -->`: every command of that block finds differences), so a documented
command that fails cannot pass as "differences found".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from roots import ROOT

pytestmark = pytest.mark.slow

MARK = "<!-- runnable"
_MARKER = re.compile(r"^<!-- runnable(?: exit=(\d+))? -->$")
DOCS = sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] if MARK in p.read_text("utf-8"))


def runnable_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, declared exit code) of every fenced block a marker precedes, in order."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip().startswith(MARK):
            continue
        marker = _MARKER.match(line.strip())
        assert marker, f"line {i + 1}: a marker is <!-- runnable --> or <!-- runnable exit=N -->"
        fence = lines[i + 1].strip()
        assert fence.startswith("```"), f"{MARK} must precede a fenced block (line {i + 1})"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        out.append((fence[3:].strip(), "\n".join(lines[i + 2 : end]), int(marker.group(1) or 0)))
    return out


def commands(body: str) -> list[str]:
    """Shell commands, a backslash continuing one onto the next line; comment lines dropped."""
    out, cur = [], ""
    for line in body.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    return out


def test_the_block_reader_finds_marked_blocks_only() -> None:
    text = f"intro\n```sh\nno\n```\n{MARK} -->\n```sh\na \\\n  b  # why\n# note\nc\n```\n"
    assert runnable_blocks(text) == [("sh", "a \\\n  b  # why\n# note\nc", 0)]
    assert runnable_blocks(f"{MARK} exit=1 -->\n```sh\nx\n```\n") == [("sh", "x", 1)]
    assert commands("a \\\n  b  # why\n# note\nc") == ["a    b  # why", "c"]


def test_every_page_with_examples_marks_some() -> None:
    """The pages a new user starts from mark their examples runnable."""
    names = {p.name for p in DOCS}
    assert {"README.md", "python-api.md", "certificates.md", "security.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_marked_examples_run(doc: Path, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "models", tmp_path / "models")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for lang, body, code in runnable_blocks(doc.read_text("utf-8")):
        if lang == "python":
            first = body.splitlines()[0].strip()
            if first.startswith("# ") and first.endswith(".py"):
                (tmp_path / first[2:]).write_text(body, "utf-8")
                continue
            proc = subprocess.run(
                [sys.executable, "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True
            )
            assert proc.returncode == code, (
                f"{doc.name} python block exited {proc.returncode}, not {code}:\n{body}\n"
                f"{proc.stderr[-2000:]}"
            )
            continue
        assert lang == "sh", f"{doc.name}: a runnable block is sh or python, not {lang!r}"
        for cmd in commands(body):
            proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True)
            assert proc.returncode == code, (
                f"{doc.name}: `{cmd}` exited {proc.returncode}, not {code}:\n{proc.stderr[-2000:]}"
            )
