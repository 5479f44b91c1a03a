"""After a command, TMPDIR and HOME hold nothing xbackend or its engines left: no Inductor cache
from an export, no ONNX Runtime telemetry files ($TMPDIR/.ses, ~/.cache/Microsoft)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MODELS = Path(__file__).resolve().parent.parent / "models"


def test_export_and_compare_leave_tmpdir_and_home_as_they_were(tmp_path: Path) -> None:
    tmp, home, work = tmp_path / "tmp", tmp_path / "home", tmp_path / "work"
    for d in (tmp, home, work):
        d.mkdir()
    (work / "mod.py").write_text(
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x.relu()\n"
        "def build():\n    return M()\n",
        "utf-8",
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "TORCHINDUCTOR_CACHE_DIR")
    }
    root = str(MODELS.parent)  # this tree's xbackend, whatever is installed
    env.update(TMPDIR=str(tmp), HOME=str(home), PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")]))
    for argv in (
        ["export", "torch", "mod.py:build", "-o", "m.onnx", "--input", "x=2,3"],
        ["compare", str(MODELS / "mlp_layernorm.onnx"), "--backends", "ort-cpu,reference", "--runs", "1",
         "--probes", "none", "--no-progress"],
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "xbackend", *argv], cwd=work, env=env, capture_output=True, text=True,
            encoding="utf-8", timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert sorted(os.listdir(tmp)) == [], (argv[0], os.listdir(tmp))
        assert not (home / ".cache" / "Microsoft").exists(), argv[0]
