"""A GGUF file from a Hugging Face folder, written by llama.cpp's own converter and quantizer.

The converter (`convert_hf_to_gguf.py`, with its `conversion` package and `gguf-py`) ships in
llama.cpp's sources, not in llama-cpp-python's wheel: it is read from a llama.cpp folder named by
$XBACKEND_LLAMA_CPP, else from the source distribution of the llama-cpp-python installed here
(the same llama.cpp it was built from), downloaded once from the package index pip is set to
(read, never built: nothing is installed) and kept in xbackend's cache. F32, F16, BF16 and Q8_0 are
the converter's; Q4_K_M (and Q8_0 from a float file) are llama.cpp's quantizer
(`llama_model_quantize`), each run in a process of its own.

The folder is untrusted: every file in it is checked before the converter starts (regular files
inside the folder, links included; no pipe, device or link out), its config's sizes are held to
the bytes of its weights, the converter runs through xbackend/export/gguf_launch.py (transformers
never grants `trust_remote_code`), with HOME, the Hugging Face caches and TMPDIR in a run folder of
its own beside the output, and a timeout sized to the weights.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import ssl
import stat
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from xbackend.errors import BackendUnavailableError, ExportError, UsageError
from xbackend.export.gguf_launch import REMOTE_CODE_EXIT
from xbackend.files.atomic import check_outputs
from xbackend.files.gguf_header import read_header
from xbackend.files.owned import file_digest, place
from xbackend.files.runfolders import MARK, remove_dead_runs, start_time

__all__ = ["TYPES", "check_hf_folder", "converter_dir", "file_type", "quantize", "write_gguf"]

CONVERTED = ("f32", "f16", "bf16", "q8_0")  # the converter's --outtype
QUANTIZED = {"q4_k_m": 15, "q8_0": 7, "q4_0": 2}  # llama_ftype of llama.cpp's quantizer (llama.h)
TYPES = (*CONVERTED, "q4_k_m", "q4_0")
_ENV = "XBACKEND_LLAMA_CPP"
_NEEDED = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
_LAUNCH = Path(__file__).with_name("gguf_launch.py")
_RUN_PREFIX = ".xbackend-gguf-"  # the converter's run folder beside the output
_FOLDER_LIMIT = 10_000  # entries of an HF folder looked at
_CONFIG_LIMIT = 4 << 20  # a config.json past this is not one
_SDIST_LIMIT = 512 << 20
# seconds: the converter reads and writes every weight about once (15 s for 2.2 GiB here)
_BASE_TIMEOUT, _PER_GIB = 180.0, 120.0
_SIZE_FLOOR = 1 << 20  # a size any folder may claim (a vocabulary of 2^20 pads in a second)
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
# config.json's sizes; none may pass the bytes of the weights that hold them
_SIZES = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "n_embd", "n_layer", "n_head",
    "n_positions", "d_model", "num_layers", "ffn_dim", "moe_intermediate_size", "num_experts",
)  # fmt: skip


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
    except importlib.metadata.PackageNotFoundError as error:
        raise BackendUnavailableError(
            f"llama-cpp-python is not installed (pip install 'xbackend[llama]'), or set ${_ENV} to a "
            "llama.cpp folder"
        ) from error
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xbackend" / "llama.cpp"
    folder = cache / version
    if (folder / "convert_hf_to_gguf.py").is_file():
        return folder
    _fetch(version, folder)
    return folder


def _pip_settings() -> dict[str, list[str]]:
    """pip's index-url, extra-index-url, find-links and cert, as `pip config list` reads them."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )  # fmt: skip
    out: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in ("index-url", "extra-index-url", "find-links", "cert", "proxy") and value:
            out.setdefault(name, []).extend(value.strip("'\"").split())
    return out


def _pip_default_index() -> list[str]:
    """pip's own default index, where no index-url is set."""
    try:
        from pip._internal.models.index import PyPI  # pip: its default, read rather than written again
    except ImportError:
        return []
    return [str(PyPI.simple_url)]


def _sdist_links(index: str, project: str, opener: urllib.request.OpenerDirector) -> Iterator[str]:
    """The file links of `project` on a PEP 503 simple index (or a find-links folder or page)."""
    if "://" not in index or index.startswith("file:"):
        folder = Path(urllib.parse.urlparse(index).path if index.startswith("file:") else index)
        for sub in (folder / project, folder):
            with contextlib.suppress(OSError):
                yield from (path.as_uri() for path in sorted(sub.iterdir()) if path.is_file())
        return
    url = index.rstrip("/") + f"/{project}/"
    try:
        with opener.open(url, timeout=60) as page:
            html = page.read(16 << 20).decode("utf-8", "replace")
    except OSError:
        return
    for href in re.findall(r'href="([^"]+)"', html):
        yield urllib.parse.urljoin(url, href.replace("&amp;", "&"))


def _download(url: str, dest: Path, opener: urllib.request.OpenerDirector) -> None:
    """`url` into `dest`, at most _SDIST_LIMIT bytes, its sha256 checked where the link gives one."""
    want = urllib.parse.urlparse(url).fragment.partition("sha256=")[2]
    digest = hashlib.sha256()
    with (
        opener.open(url.partition("#")[0], timeout=300) as src,
        dest.open("wb") as handle,
    ):
        size = 0
        while chunk := src.read(1 << 20):
            size += len(chunk)
            if size > _SDIST_LIMIT:
                raise OSError(f"past {_SDIST_LIMIT >> 20} MiB")
            digest.update(chunk)
            handle.write(chunk)
    if want and digest.hexdigest() != want:
        raise OSError("its sha256 is not the index's")


def _fetch(version: str, folder: Path) -> None:
    """The converter's files from llama-cpp-python's source distribution: downloaded from the
    package index pip is set to (pip builds nothing, writes nothing in HOME), three folders read
    out of the archive."""
    settings = _pip_settings()
    cert = next(iter(settings.get("cert", [])), "")
    context = ssl.create_default_context(cafile=cert if cert and Path(cert).is_file() else None)
    proxy = next(iter(settings.get("proxy", [])), "")
    handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPSHandler(context=context)]
    if proxy:  # pip's own proxy setting (the environment's is urllib's default)
        handlers.append(urllib.request.ProxyHandler({"http": proxy, "https": proxy}))
    opener = urllib.request.build_opener(*handlers)
    indexes = [*settings.get("find-links", []), *(settings.get("index-url") or _pip_default_index())]
    indexes += settings.get("extra-index-url", [])
    name = f"llama_cpp_python-{version}.tar.gz"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        archive = Path(tmp) / name
        tried = []
        for index in indexes:
            link = next(
                (
                    sdist_link
                    for sdist_link in _sdist_links(index, "llama-cpp-python", opener)
                    if name in sdist_link
                ),
                None,
            )
            if link is None:
                continue
            try:
                _download(link, archive, opener)
                break
            except OSError as error:
                tried.append(f"{index}: {error}")
        else:
            why = "; ".join(tried) or f"no {name} on {', '.join(indexes)}"
            raise BackendUnavailableError(
                f"could not fetch llama-cpp-python {version}'s sources for llama.cpp's converter ({why}); "
                f"set ${_ENV} to a llama.cpp folder"
            )
        staged = Path(tmp) / "llama.cpp"
        with tarfile.open(archive) as tar:
            root = f"llama_cpp_python-{version}/vendor/llama.cpp/"
            members = [
                getmember
                for getmember in tar.getmembers()
                if getmember.name.startswith(root) and getmember.name[len(root) :].startswith(_NEEDED)
            ]
            for member in members:
                member.name = member.name[len(root) :]
            tar.extractall(staged, members=members, filter="data")
        if not (staged / "convert_hf_to_gguf.py").is_file():
            raise BackendUnavailableError(
                f"llama-cpp-python {version}'s sources hold no convert_hf_to_gguf.py"
            )
        with contextlib.suppress(FileExistsError, OSError):  # another run may have placed it first
            staged.rename(folder)
        if not (folder / "convert_hf_to_gguf.py").is_file():
            raise BackendUnavailableError(f"could not keep llama.cpp's converter in {folder}")


# --- the folder, checked before the converter starts ----------------------------------------------


def check_hf_folder(hf_folder: str | os.PathLike[str]) -> tuple[Path, list[Path], int]:
    """An HF folder the converter may read: its root (resolved), every file in it (all inputs of
    the command) and the bytes of its weights. Every entry is a regular file or a folder inside it,
    links included; config.json's sizes are held to the weights' bytes. Else one UsageError."""
    given = Path(hf_folder)
    try:
        root = given.resolve(strict=True)
    except (OSError, RuntimeError):
        raise UsageError(f"{given} is not a Hugging Face model folder (it cannot be opened)") from None
    if root.is_dir() and os.path.lexists(root / "config.json"):
        _inside(given, root, root / "config.json")  # a link out: the same line whatever lies there
    if not root.is_dir() or not (root / "config.json").is_file():
        raise UsageError(f"{given} is not a Hugging Face model folder (no config.json)")
    files: list[Path] = []
    weights = seen = 0
    for here, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            entry = Path(here) / name
            seen += 1
            if seen > _FOLDER_LIMIT:
                raise UsageError(f"{given} holds more than {_FOLDER_LIMIT} entries: not a model folder")
            target = _inside(given, root, entry)
            st = os.stat(target)
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(
                    f"{entry} is not a regular file (a pipe, a device or a socket): llama.cpp's converter "
                    "would wait on it; remove it from the folder"
                )
            files.append(target)
            if name.endswith(_WEIGHTS):
                weights += st.st_size
        dirs[:] = [d for d in dirs if not (Path(here) / d).is_symlink()]  # checked above, not walked twice
    _check_config(given, root / "config.json", weights)
    for name in ("config.json", "tokenizer_config.json"):
        _check_named_files(given, root / name)
    return root, files, weights


def _check_named_files(given: Path, config: Path) -> None:
    """A config's values that name a file (`tokenizer_file`, `vocab_file`, `merges_file`) name one
    inside the folder: an absolute path or `..` is refused, read by no one. (`_name_or_path` is a
    label transformers reads no file from.)"""
    try:
        if not config.is_file() or config.stat().st_size > _CONFIG_LIMIT:
            return
        data = json.loads(config.read_text("utf-8"))
    except (OSError, ValueError, RecursionError):
        return  # the converter's own reader says what is wrong with it
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        named = isinstance(value, str) and key.endswith(("_file", "_files"))
        if named and (os.path.isabs(value) or ".." in Path(value).parts or value.startswith("~")):
            raise UsageError(
                f"{config}: {key} names {value[:120]!r}, outside {given}: xbackend reads a model folder's "
                "own files alone; remove the entry (the converter finds the folder's files by name)"
            )


def _inside(given: Path, root: Path, entry: Path) -> Path:
    """Where `entry` leads, which must be inside `root`; the same line whatever lies outside."""
    try:
        target = entry.resolve(strict=False)
    except (OSError, RuntimeError):
        target = None
    if target is None or not target.is_relative_to(root) or not os.path.lexists(target):
        raise UsageError(
            f"{entry} leads out of {given} (or nowhere): xbackend reads a model folder's own files alone; "
            f"copy the files in (cp -rL {given} NEW_FOLDER) and convert that"
        )
    return target


def _check_config(given: Path, config: Path, weights: int) -> None:
    """config.json's sizes within what its weights can hold (a header cannot claim the machine)."""
    try:
        if config.stat().st_size > _CONFIG_LIMIT:
            raise ValueError(f"past {_CONFIG_LIMIT >> 20} MiB")
        data = json.loads(config.read_text("utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise UsageError(
            f"{config} is not a readable config.json ({str(error)[:80]}); fix the file"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(f"{config} is not a JSON object; fix the file")
    tables = [
        data,
        *(value for key, value in data.items() if key.endswith("_config") and isinstance(value, dict)),
    ]
    bound = max(weights, _SIZE_FLOOR)
    for table in tables:
        for key in _SIZES:
            value = table.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if value < 0 or value > bound:
                raise UsageError(
                    f"{config}: {key} = {value} is more than the {weights:,} bytes of the folder's weights "
                    f"can hold (at most {bound:,}): not this model's size; fix the file"
                )
        vocab, width = table.get("vocab_size"), table.get("hidden_size") or table.get("d_model")
        if isinstance(vocab, int) and isinstance(width, int) and vocab * width > bound:
            raise UsageError(
                f"{config}: a vocabulary of {vocab} x {width} is more than the {weights:,} bytes of the "
                "folder's weights hold: not this model's size; fix the file"
            )


# --- the converter -------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """The child is killed with xbackend (SIGKILL, the OOM killer): never left reading a folder."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _run_folder(beside: Path) -> Iterator[Path]:
    """A temp folder of this run beside the output (marked with this process; a run killed
    outright leaves it to the next export there, which removes it)."""
    remove_dead_runs(beside, _RUN_PREFIX)
    tmp = Path(tempfile.mkdtemp(prefix=_RUN_PREFIX, dir=beside))
    try:
        (tmp / MARK).write_text(f"{os.getpid()} {start_time(os.getpid())}\n")
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _contained_env(tmp: Path) -> dict[str, str]:
    """The converter's environment: its HOME, caches and temp files in the run folder, offline."""
    home = tmp / "home"
    (home / "tmp").mkdir(parents=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "HF_", "TRANSFORMERS_"))
    }
    env.update(
        HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), XDG_CONFIG_HOME=str(home / ".config"),
        HF_HOME=str(home / "hf"), HF_MODULES_CACHE=str(home / "hf" / "modules"), TMPDIR=str(home / "tmp"),
        MPLCONFIGDIR=str(home / "mpl"), TORCHINDUCTOR_CACHE_DIR=str(home / "inductor"),
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
        PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1", GGML_NO_BACKTRACE="1",
    )  # fmt: skip
    return env


def _last_line(text: str, fallback: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else fallback)[:300]


def _run(
    argv: list[str], env: dict[str, str], timeout: float, cwd: Path, what: str
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ExportError(
            f"{what} took past {timeout:.0f} s (its limit for these weights); nothing was written"
        ) from None


def write_gguf(
    hf_folder: str | os.PathLike[str], dest: str | os.PathLike[str], kind: str = "f32", force: bool = False
) -> Path:
    """`hf_folder` (config.json, weights, a tokenizer) as a GGUF file of type `kind` at `dest`:
    a new file, or one xbackend wrote (recorded), or any with `force`; placed whole. Every file of
    the folder is an input: never the output, even with `force`."""
    kind = kind.lower()
    if kind not in TYPES:
        raise UsageError(f"GGUF type {kind!r}: choose one of {', '.join(TYPES)}")
    root, inputs, weights = check_hf_folder(hf_folder)
    out = Path(dest)
    check_outputs([("the GGUF file", out)], inputs, force)
    timeout = _BASE_TIMEOUT + _PER_GIB * weights / (1 << 30)
    folder = converter_dir()
    beside = out.resolve().parent
    beside.mkdir(parents=True, exist_ok=True)
    with _run_folder(beside) as tmp:
        env = _contained_env(tmp)
        first = tmp / ("model.gguf" if kind in CONVERTED else "model-f32.gguf")
        argv = [sys.executable, "-I", str(_LAUNCH), str(folder), str(root), "--outfile", str(first)]
        done = _run(
            [*argv, "--outtype", kind if kind in CONVERTED else "f32"],
            env,
            timeout,
            tmp,
            "llama.cpp's converter",
        )
        if done.returncode == REMOTE_CODE_EXIT:
            raise UsageError(
                f"{hf_folder}: {_last_line(done.stderr, 'it needs code of its own')}; xbackend never runs "
                "code from a model folder: convert a model whose classes transformers ships"
            )
        if done.returncode or not first.is_file():
            raise ExportError(
                f"llama.cpp's converter failed on {hf_folder}: {_last_line(done.stderr, 'no output')}"
            )
        final = first if kind in CONVERTED else quantize(first, tmp / "model.gguf", kind, timeout, env)
        place(final, out, file_digest(final), "GGUF file", force)
    return out


def quantize(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    kind: str,
    timeout: float = _BASE_TIMEOUT,
    env: dict[str, str] | None = None,
) -> Path:
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
    argv = [sys.executable, "-c", code, str(src), str(dest), str(QUANTIZED[kind])]
    done = _run(
        argv,
        env or {**os.environ, "GGML_NO_BACKTRACE": "1"},
        timeout,
        Path(dest).parent,
        "llama.cpp's quantizer",
    )
    if done.returncode:
        why = _last_line(done.stderr, f"exit {done.returncode}")
        raise ExportError(f"llama.cpp's quantizer failed on {src} ({kind}): {why}")
    return Path(dest)


# llama_ftype (llama.h) -> its name, as llama.cpp's tools print it
_FTYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}  # fmt: skip


def file_type(path: str | os.PathLike[str]) -> str:
    """A GGUF file's `general.file_type` by name (Q4_K_M, F32, ...), read from its header alone;
    "" where the header does not say. A file that is not GGUF is a UsageError."""
    value = read_header(path).values.get("general.file_type")
    if not isinstance(value, int) or isinstance(value, bool):
        return ""
    return _FTYPES.get(value, f"type {value}")
