"""Workers in another Python environment (the runner option python=PATH).

An engine whose package cannot share xbackend's environment (another onnxruntime release, an
SDK pinned to an older Python) runs its worker in that environment's interpreter. The foreign
side needs only Python >= 3.8, numpy and the engine: xbackend copies its own worker modules to a
cache folder and puts only that folder on the foreign PYTHONPATH, and prepares each phase's
model (tensors exposed as graph outputs, IR version lowered) here, with onnx, so the worker
never parses a model.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from onnx import ValueInfoProto

from xbackend.errors import ModelLoadError
from xbackend.execution.foreign_probe import TAG
from xbackend.files.modelref import ModelRef
from xbackend.model.extdata import write_rewritten
from xbackend.model.load import downgrade_ir, load_proto

__all__ = ["Interpreter", "probe_interpreter", "stage_model", "worker_path"]

_PACKAGE = Path(__file__).resolve().parents[1]
# The staged package's __init__: the real one imports the whole tool (onnx, typer, ...).
_LIGHT_INIT = (
    '"""xbackend\'s worker modules, staged for another interpreter (xbackend.execution.foreign)."""\n'
)
_PROBE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Interpreter:
    """Another environment's Python, as its probe described it, and the runner's state there."""

    path: str  # as the user gave it
    executable: str = ""
    python: str = ""
    numpy: str = ""
    packages: tuple[tuple[str, str], ...] = ()
    available: bool = False
    reason: str = ""
    version: str = ""
    max_ir: int | None = None

    def info(self) -> dict[str, str]:
        """What the report records about this environment (its Python and every package)."""
        out = {
            "interpreter": self.executable or self.path,
            "interpreter.python": self.python,
            "interpreter.numpy": self.numpy,
            "interpreter.packages.sha256": hashlib.sha256(
                "".join(f"{n}=={v}\n" for n, v in self.packages).encode()
            ).hexdigest()[:16],
        }
        out.update({f"interpreter.package.{n}": v for n, v in self.packages})
        return out


def _cache_root() -> Path:
    base = os.environ.get("XBACKEND_CACHE") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base) / "xbackend" if base else Path.home() / ".cache" / "xbackend"
    try:
        root.mkdir(parents=True, exist_ok=True)
        return root
    except OSError:  # a read-only home: a per-user temporary folder
        fallback = Path(tempfile.gettempdir()) / f"xbackend-cache-{os.getuid()}"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


@functools.cache
def worker_path() -> str:
    """A folder holding a copy of xbackend's modules (a light __init__), keyed by their content:
    what the foreign PYTHONPATH holds, and nothing else of this environment."""
    sources = sorted(path for path in _PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)
    digest = hashlib.sha256()
    for source in sources:
        digest.update(str(source.relative_to(_PACKAGE)).encode() + b"\0" + source.read_bytes() + b"\0")
    dest = _cache_root() / f"worker-{digest.hexdigest()[:16]}"
    if not (dest / "xbackend" / "__init__.py").is_file():
        tmp = Path(tempfile.mkdtemp(prefix="worker-", dir=dest.parent))
        for source in sources:
            target = tmp / "xbackend" / source.relative_to(_PACKAGE)
            target.parent.mkdir(parents=True, exist_ok=True)
            if source == _PACKAGE / "__init__.py":
                target.write_text(_LIGHT_INIT)
            else:
                shutil.copyfile(source, target)
        try:
            os.rename(tmp, dest)
        except OSError:  # another process staged it first
            shutil.rmtree(tmp, ignore_errors=True)
    return str(dest)


def foreign_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment for a foreign worker: only the staged modules on PYTHONPATH
    (this environment's site-packages are for another Python)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(extra)
    env["PYTHONPATH"] = worker_path()
    env["PYTHONNOUSERSITE"] = "1"
    env["GGML_NO_BACKTRACE"] = "1"  # ggml's abort handler would run gdb: its own line instead
    return env


@functools.cache
def probe_interpreter(path: str, target: str) -> Interpreter:
    """Run xbackend.execution.foreign_probe under `path`; never raises: a problem is the reason."""
    where = f"python={path}"
    exe = shutil.which(path) if os.sep not in path else path
    if exe is None or not os.path.isfile(exe):
        return Interpreter(
            path, reason=f"{where}: no such interpreter; give the path of a Python, e.g. /opt/venv/bin/python"
        )
    if not os.access(exe, os.X_OK):
        return Interpreter(path, reason=f"{where}: not executable; give the path of a Python interpreter")
    try:
        proc = subprocess.run(
            [exe, "-m", "xbackend.execution.foreign_probe", target],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            env=foreign_env({}),
            cwd=worker_path(),  # `-m` puts the folder it starts in first on sys.path
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Interpreter(path, reason=f"{where}: did not answer within {_PROBE_TIMEOUT_S:g} s")
    except OSError as error:
        return Interpreter(path, reason=f"{where}: cannot start it: {error.strerror}")
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(TAG)), "")
    if not line:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return Interpreter(path, reason=f"{where}: is it Python >= 3.8? its probe failed: {tail}")
    d = json.loads(line[len(TAG) :])
    it = Interpreter(
        path,
        str(d.get("executable", "")),
        str(d.get("python", "")),
        str(d.get("numpy", "")),
        tuple((str(n), str(v)) for n, v in d.get("packages", [])),
        bool(d.get("available", False)),
        str(d.get("error") or d.get("reason") or ""),
        str(d.get("version", "")),
        d.get("max_ir") if isinstance(d.get("max_ir"), int) else None,
    )
    if not it.available and it.reason:
        it = Interpreter(**{**it.__dict__, "reason": f"{where} (Python {it.python}): {it.reason}"})
    return it


def stage_model(
    source: ModelRef, tensors: Sequence[str], max_ir: int | None, folder: Path, own_weights: bool = False
) -> ModelRef:
    """The model with `tensors` exposed as graph outputs and its IR lowered to `max_ir`, written
    once under `folder`; external data is linked beside it (`own_weights`: copied, once per
    source folder, so that onnx.load reads it: a plugin's own loader)."""

    extra = [tensor for tensor in tensors if tensor not in set(source.outputs)]
    ir = source.ir_version if max_ir is None else min(source.ir_version, max_ir)
    own = own_weights and source.external_data
    if not extra and ir == source.ir_version and not own:
        return source
    key = hashlib.sha256(json.dumps([source.path, extra, ir]).encode()).hexdigest()[:16]
    if own:  # the models staged from one folder share one copy of its weights
        folder = folder / hashlib.sha256(str(Path(source.path).parent).encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.onnx"
    if not path.exists():
        proto = load_proto(source.path, load_external=False)
        proto.graph.output.extend(ValueInfoProto(name=tensor) for tensor in extra)
        if ir < source.ir_version:
            try:
                proto = downgrade_ir(proto, ir)
            except ModelLoadError as error:
                raise ModelLoadError(f"the other interpreter's engine reads IR <= {ir}: {error}") from error
        write_rewritten(proto, source.path, path, own)
    return ModelRef(
        str(path), ir, source.inputs, (*source.outputs, *extra), source.external_data, source.weight_bytes
    )
