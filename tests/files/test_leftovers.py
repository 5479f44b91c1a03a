"""After a command, TMPDIR and HOME hold nothing xbackend or its engines left: no Inductor cache
from an export, no ONNX Runtime telemetry files ($TMPDIR/.ses, ~/.cache/Microsoft), no
matplotlib config or font cache; HOME holds the ledger key alone (docs/security.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from roots import ROOT

pytestmark = pytest.mark.slow

MODELS = ROOT / "models"


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
        k: v
        for k, v in os.environ.items()
        if k not in ("ORT_DISABLE_TELEMETRY", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR", "XDG_STATE_HOME")
    }
    root = str(MODELS.parent)  # this tree's xbackend, whatever is installed
    env.update(TMPDIR=str(tmp), HOME=str(home), PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")]))
    for argv in (
        ["export", "torch", "mod.py:build", "-o", "m.onnx", "--input", "x=2,3"],
        ["compare", str(MODELS / "mlp_layernorm.onnx"), "--backends", "ort-cpu,reference", "--runs", "1",
         "--probes", "none", "--no-progress"],
        ["compare", str(MODELS / "mlp_layernorm.onnx"), "--backends", "ort-cpu,reference", "--runs", "2",
         "--no-progress", "--report", "r.md"],  # figures drawn: matplotlib's caches
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "xbackend", *argv], cwd=work, env=env, capture_output=True, text=True,
            encoding="utf-8", timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert sorted(os.listdir(tmp)) == [], (argv[0], os.listdir(tmp))
        assert not (home / ".cache" / "Microsoft").exists(), argv[0]
        # what docs/security.md lists: the key that seals this user's ledgers, nothing else
        left = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
        assert left == [".local/state/xbackend/ledger.key"], (argv, left)
    assert (work / "r.ulp-distribution.png").is_file()


def _xbackend(argv: list[str], cwd: Path, fsize: int | None = None, user: bool = False) -> tuple[int, str]:
    """xbackend in a fresh process under a file-size limit (`ulimit -f`), or as an unprivileged
    user where the tests run as root (permissions bind only then)."""
    import resource

    def limits() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if user and os.geteuid() == 0:
            os.setgid(65534)
            os.setuid(65534)

    env = {**os.environ, "PYTHONPATH": str(MODELS.parent), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "xbackend", *argv, "--no-progress"], cwd=cwd, env=env, capture_output=True,
        text=True, encoding="utf-8", timeout=600, preexec_fn=limits,
    )  # fmt: skip
    return done.returncode, done.stderr


def test_a_file_size_limit_leaves_no_part_of_a_report(tmp_path: Path) -> None:
    """An 8 KiB `ulimit -f` left a report's .layers.csv without its .md: the bundle and its JSON
    are staged first and placed only when every file was written, so nothing is left; with no
    room for even a temp file, it is one line naming TMPDIR and the limit, not "No usable
    temporary directory"."""
    model = tmp_path / "m.onnx"
    model.write_bytes((MODELS / "torch_mlp.onnx").read_bytes())
    argv = ["compare", "m.onnx", "--backends", "ort-cpu,reference", "--runs", "1", "--probes", "none"]
    code, err = _xbackend([*argv, "--report", "r.md", "--json", "r.json"], tmp_path, fsize=16 << 10)
    assert code == 2, err
    assert err.strip().splitlines()[-1].startswith("xbackend: error: cannot write report")
    assert "File too large" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    code, err = _xbackend(argv, tmp_path, fsize=0)
    assert code == 2, err
    assert err.strip().startswith("xbackend: error: cannot make a temp folder")
    assert "check `ulimit -f`" in err
    code, err = _xbackend(["capture", "m.onnx", "--backend", "ort-cpu", "-o", "cap"], tmp_path, fsize=4 << 10)
    assert code == 2, err
    assert "File too large" in err and "ulimit -f" in err
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))
    assert not (tmp_path / "cap").exists() or not any((tmp_path / "cap").iterdir())


def _runs_as_nobody() -> bool:
    """Every folder above the interpreter lets others in (uid 65534 could start it)."""
    p = Path(sys.executable).resolve()
    return all(os.stat(a).st_mode & 0o001 for a in p.parents) and bool(os.stat(p).st_mode & 0o001)


def test_paths_the_user_cannot_read_or_write_are_one_line(tmp_path: Path) -> None:
    """As an unprivileged user: an unreadable model, inputs and a read-only output folder are exit
    2 with one line each (a PermissionError was an internal error, exit 4)."""
    if os.geteuid() == 0 and not _runs_as_nobody():
        pytest.skip(f"uid 65534 cannot run {sys.executable} here (its folders are root's alone)")
    tmp_path.chmod(0o755)
    model = tmp_path / "m.onnx"
    model.write_bytes((MODELS / "torch_mlp.onnx").read_bytes())
    secret = tmp_path / "secret.onnx"
    secret.write_bytes(model.read_bytes())
    secret.chmod(0o000)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    base = ["--backends", "ort-cpu", "--runs", "1", "--probes", "none"]
    cases = {
        "cannot be read (no permission)": ["compare", str(secret), *base],
        "--report": ["compare", str(model), *base, "--report", str(ro / "r.md")],
        "cannot be written": ["capture", str(model), "--backend", "ort-cpu", "-o", str(ro / "cap")],
    }
    for said, argv in cases.items():
        code, err = _xbackend(argv, tmp_path, user=True)
        assert code == 2, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("xbackend: error: ") and said in lines[0], err


def test_a_refusal_no_check_named_is_still_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the system refuses where no earlier check looked (a permission, a full disk, a
    looping link) is exit 2 and one line naming the path, never an internal error (exit 4)."""
    import errno

    import xbackend.cli.run
    from tests.cli_helpers import one_line_error, relu_model, run

    model = relu_model(tmp_path)
    for e, said in (
        (PermissionError(errno.EACCES, "Permission denied", "/data/m.onnx.data"), "Permission denied"),
        (OSError(errno.ENOSPC, "No space left on device"), "(No space left on device); check free disk"),
        (RuntimeError(f"Symlink loop from {tmp_path / 'a'!r}"), "a symbolic link leads back to itself"),
    ):

        def refused(*_a: object, err: BaseException = e, **_k: object) -> None:
            raise err

        monkeypatch.setattr(xbackend.cli.run, "compare_with_options", refused)
        code, _, err = run(capsys, "compare", str(model), "--no-progress")
        assert code == 2, err
        one_line_error(err, said)
