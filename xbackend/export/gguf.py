"""A GGUF file from a Hugging Face folder, written by llama.cpp's own converter and quantizer.

The converter (`convert_hf_to_gguf.py`, with its `conversion` package and `gguf-py`) ships in
llama.cpp's sources, not in llama-cpp-python's wheel: it is read from a llama.cpp folder named by
$XBACKEND_LLAMA_CPP, else from the source distribution of the llama-cpp-python installed here
(the same llama.cpp it was built from), fetched once by pip and kept in xbackend's cache. F32,
F16, BF16 and Q8_0 are the converter's; Q4_K_M (and Q8_0 from a float file) are llama.cpp's
quantizer (`llama_model_quantize`), each run in a process of its own.
"""

from __future__ import annotations

import importlib.metadata
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from xbackend.errors import BackendUnavailableError, ExportError, UsageError
from xbackend.files.atomic import check_outputs
from xbackend.files.owned import file_digest, place

__all__ = ["TYPES", "converter_dir", "file_type", "quantize", "write_gguf"]

CONVERTED = ("f32", "f16", "bf16", "q8_0")  # the converter's --outtype
QUANTIZED = {"q4_k_m": 15, "q8_0": 7, "q4_0": 2}  # llama_ftype of llama.cpp's quantizer (llama.h)
TYPES = (*CONVERTED, "q4_k_m", "q4_0")
_ENV = "XBACKEND_LLAMA_CPP"
_NEEDED = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
_TIMEOUT = 3600.0


def converter_dir() -> Path:
    """A folder holding llama.cpp's convert_hf_to_gguf.py, conversion/ and gguf-py/."""
    given = os.environ.get(_ENV)
    if given:
        folder = Path(given)
        if not (folder / "convert_hf_to_gguf.py").is_file():
            raise UsageError(
                f"${_ENV}={given} holds no convert_hf_to_gguf.py: point it at a llama.cpp folder"
            )
        return folder
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError as e:
        raise BackendUnavailableError(
            f"llama-cpp-python is not installed (pip install 'xbackend[llama]'), or set ${_ENV} to a "
            "llama.cpp folder"
        ) from e
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xbackend" / "llama.cpp"
    folder = cache / version
    if (folder / "convert_hf_to_gguf.py").is_file():
        return folder
    _fetch(version, folder)
    return folder


def _fetch(version: str, folder: Path) -> None:
    """The converter's files from llama-cpp-python's source distribution (pip download)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
        done = subprocess.run(
            [*cmd, "-d", tmp, f"llama-cpp-python=={version}"], capture_output=True, text=True, timeout=600
        )
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode or not sdists:
            why = (done.stderr.strip().splitlines() or ["no source distribution"])[-1]
            raise BackendUnavailableError(
                f"could not fetch llama-cpp-python {version}'s sources for llama.cpp's converter ({why}); "
                f"set ${_ENV} to a llama.cpp folder"
            )
        staged = Path(tmp) / "llama.cpp"
        with tarfile.open(sdists[0]) as tar:
            root = f"llama_cpp_python-{version}/vendor/llama.cpp/"
            members = [
                m
                for m in tar.getmembers()
                if m.name.startswith(root) and m.name[len(root) :].startswith(_NEEDED)
            ]
            for m in members:
                m.name = m.name[len(root) :]
            tar.extractall(staged, members=members, filter="data")
        if not (staged / "convert_hf_to_gguf.py").is_file():
            raise BackendUnavailableError(
                f"llama-cpp-python {version}'s sources hold no convert_hf_to_gguf.py"
            )
        staged.rename(folder)


def write_gguf(
    hf_folder: str | os.PathLike[str], dest: str | os.PathLike[str], kind: str = "f32", force: bool = False
) -> Path:
    """`hf_folder` (config.json, weights, a tokenizer) as a GGUF file of type `kind` at `dest`:
    a new file, or one xbackend wrote (recorded), or any with `force`; placed whole."""
    kind = kind.lower()
    if kind not in TYPES:
        raise UsageError(f"GGUF type {kind!r}: choose one of {', '.join(TYPES)}")
    src = Path(hf_folder)
    if not (src / "config.json").is_file():
        raise UsageError(f"{src} is not a Hugging Face model folder (no config.json)")
    out = Path(dest)
    check_outputs([("the GGUF file", out)], [src / "config.json"], force)
    with tempfile.TemporaryDirectory(dir=out.resolve().parent) as tmp:
        first = Path(tmp) / ("model.gguf" if kind in CONVERTED else "model-f32.gguf")
        folder = converter_dir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder / "gguf-py"), str(folder)])}
        run = [
            sys.executable,
            str(folder / "convert_hf_to_gguf.py"),
            str(src.resolve()),
            "--outfile",
            str(first),
        ]
        done = subprocess.run(
            [*run, "--outtype", kind if kind in CONVERTED else "f32"],
            capture_output=True,
            text=True,
            env=env,
            timeout=_TIMEOUT,
            cwd=tmp,
        )
        if done.returncode or not first.is_file():
            tail = [ln for ln in done.stderr.strip().splitlines() if ln.strip()][-1:] or ["no output"]
            raise ExportError(f"llama.cpp's converter failed on {src}: {tail[0]}")
        final = first if kind in CONVERTED else quantize(first, Path(tmp) / "model.gguf", kind)
        place(final, out, file_digest(final), "GGUF file", force)
    return out


def quantize(src: str | os.PathLike[str], dest: str | os.PathLike[str], kind: str) -> Path:
    """llama.cpp's quantizer: `src` (a GGUF file) as `kind` (q4_k_m, q8_0, q4_0) at `dest`, in a
    process of its own (the quantizer's C code runs there)."""
    if kind not in QUANTIZED:
        raise UsageError(f"llama.cpp quantizes to {', '.join(QUANTIZED)}, not {kind!r}")
    code = (
        "import sys, llama_cpp as L\n"
        "p = L.llama_model_quantize_default_params()\n"
        "p.ftype = int(sys.argv[3])\n"
        "sys.exit(L.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(src), str(dest), str(QUANTIZED[kind])],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
    )
    if done.returncode:
        tail = [ln for ln in done.stderr.strip().splitlines() if ln.strip()][-1:] or [
            f"exit {done.returncode}"
        ]
        raise ExportError(f"llama.cpp's quantizer failed on {src} ({kind}): {tail[0]}")
    return Path(dest)


# llama_ftype (llama.h) -> its name, as llama.cpp's tools print it
_FTYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}  # fmt: skip
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
_LIMIT = 1 << 20  # a key or string longer than this is not a GGUF header's


def file_type(path: str | os.PathLike[str]) -> str:
    """A GGUF file's `general.file_type` by name (Q4_K_M, F32, ...), read from its header alone;
    "" where the header does not say. A file that is not GGUF is a UsageError."""
    with open(path, "rb") as f:

        def take(n: int) -> bytes:
            b = f.read(n)
            if len(b) != n:
                raise UsageError(f"{path} ends inside its GGUF header: not a whole GGUF file")
            return b

        def string() -> bytes:
            (n,) = struct.unpack("<Q", take(8))
            if n > _LIMIT:
                raise UsageError(f"{path}: a GGUF header string of {n} bytes: not a GGUF file")
            return take(n)

        def skip(kind: int) -> None:
            if kind in _SCALAR:
                take(_SCALAR[kind])
            elif kind == 8:
                string()
            elif kind == 9:
                item, count = struct.unpack("<IQ", take(12))
                if item in _SCALAR:
                    f.seek(_SCALAR[item] * count, os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                raise UsageError(f"{path}: GGUF value type {kind} unknown: not a GGUF file xbackend reads")

        if take(4) != b"GGUF":
            raise UsageError(f"{path} is not a GGUF file (it does not start with GGUF)")
        _version, _tensors, kvs = struct.unpack("<IQQ", take(20))
        for _ in range(min(kvs, _LIMIT)):
            key = string()
            (kind,) = struct.unpack("<I", take(4))
            if key == b"general.file_type" and kind in (4, 5):
                (value,) = struct.unpack("<I" if kind == 4 else "<i", take(4))
                return _FTYPES.get(value, f"type {value}")
            skip(kind)
    return ""
