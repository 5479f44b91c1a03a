"""A second virtual environment with an older onnxruntime, built once and cached between runs."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

OLD_ORT = "1.20.1"


def cache_dir() -> Path:
    base = os.environ.get("XBACKEND_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "xbackend-tests"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def venv(name: str, *requirements: str) -> Path:
    """The interpreter of a venv holding `requirements` (pip-installed once; a lock guards
    concurrent sessions; a half-made venv is rebuilt)."""
    root = cache_dir() / name
    python = root / "bin" / "python"
    done = root / ".complete"
    with open(cache_dir() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file() and done.read_text("utf-8") == "\n".join(requirements) and python.exists():
            return python
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        if requirements:
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
                check=True,
            )
        done.write_text("\n".join(requirements))
    return python


def old_ort_python() -> Path:
    return venv(f"ort-{OLD_ORT}", f"onnxruntime=={OLD_ORT}")


STANDIN = Path(__file__).resolve().parent / "groq_standin"


def groq_standin_python() -> Path:
    """A GroqFlow environment made of the stand-in (tests/groq_standin) and onnxruntime 1.20.1."""
    python = venv("groq-standin", f"onnxruntime=={OLD_ORT}")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "groq_standin.pth").write_text(f"{STANDIN}\n")
    return python
