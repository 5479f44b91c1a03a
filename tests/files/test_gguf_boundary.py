"""The boundary on llama.cpp's paths: no code from a model folder runs (llama.cpp's converter asks
transformers for remote code for dozens of families), every file of a folder is checked before
the converter starts, GGUF files stay inside the model's folder, headers and sweep files cannot
claim the machine, and ggml's abort is said in its own words."""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from roots import TESTS

import xbackend
from tests.cli_helpers import one_line_error, run
from xbackend.errors import UsageError
from xbackend.files.gguf_header import claims_problem, read_header

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python not installed (pip install 'xbackend[llama]')"
)
pytestmark = pytest.mark.slow

ROOT = TESTS.parent
SHAPES = {"batch_size": 1, "sequence_length": 12, "past_sequence_length": 0}


@pytest.fixture(scope="module")
def converter() -> Path:
    from xbackend.export.gguf import converter_dir

    return converter_dir()


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.gguf_models import with_gguf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return with_gguf("llama", tmp_path_factory.mktemp("gguf_boundary"))


def _planted(folder: Path, arch: str) -> Path:
    """An HF folder of family `arch` whose tokenizer maps to a module of its own that writes a
    marker beside the folder when imported; no weights (the tokenizer is reached first)."""
    folder.mkdir(parents=True)
    config = {"architectures": [arch], "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config), "utf-8")
    auto = {"AutoTokenizer": ["tokenization_planted.Planted", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto}), "utf-8")
    marker = folder.parent / f"{folder.name}.MARKER"
    (folder / "tokenization_planted.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n", "utf-8")
    return marker


def _xbackend(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xbackend", *argv], cwd=cwd, env=env, capture_output=True, text=True,
        encoding="utf-8", timeout=600,
    )  # fmt: skip


def _contained_env(tmp_path: Path, converter: Path) -> tuple[dict[str, str], Path, Path]:
    """xbackend's environment with HOME, TMPDIR and the state folder in `tmp_path`; the cache that
    holds llama.cpp's converter is the one already filled."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "TORCHINDUCTOR_CACHE_DIR")}
    env.update(HOME=str(home), TMPDIR=str(tmp), XDG_CACHE_HOME=str(converter.parents[2]),
               XDG_STATE_HOME=str(tmp_path / "state"), PYTHONPATH=str(ROOT))  # fmt: skip
    return env, home, tmp


def test_no_family_the_converter_trusts_runs_code_from_the_folder(tmp_path: Path, converter: Path) -> None:
    """Every family whose conversion calls transformers with trust_remote_code=True (41 in
    llama.cpp 0.3.36's converter), each with a planted auto_map module: through xbackend's
    launcher none of them runs it; 37 reach the tokenizer and are refused there (the other 4 stop
    earlier, at a size their config lacks). The same folders without the launcher: the plant runs
    (the test can fail)."""
    script = [sys.executable, "-I", str(TESTS / "converter_families.py"),
              str(ROOT / "xbackend" / "export" / "gguf_launch.py"), str(converter)]  # fmt: skip
    env = {**os.environ, "HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    (tmp_path / "ours").mkdir()
    done = subprocess.run(
        [*script, str(tmp_path / "ours")], capture_output=True, text=True, env=env, timeout=600
    )
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) >= 40 and {"QWenLMHeadModel", "ChatGLMModel", "MiniMaxM1ForCausalLM"} <= set(results)
    assert not [f for f, r in results.items() if r["ran"]]
    assert not list((tmp_path / "ours").glob("*.MARKER"))
    refused = sorted(f for f, r in results.items() if r["rc"] == 17)
    assert len(refused) >= 37, results
    (tmp_path / "plain").mkdir()
    done = subprocess.run(
        [*script, str(tmp_path / "plain"), "--plain"], capture_output=True, text=True, env=env, timeout=600
    )
    control = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(r["ran"] for r in control.values()), control  # the plant works where nothing stops it


@pytest.mark.parametrize("arch", ["QWenLMHeadModel", "ChatGLMModel"])
def test_export_gguf_refuses_a_folder_that_needs_its_own_code(
    tmp_path: Path, converter: Path, arch: str
) -> None:
    """`xbackend export gguf` on such a folder: one line naming the file, exit 2, the plant never
    ran, and HOME and TMPDIR hold nothing new (no ~/.cache/huggingface/modules copy)."""
    env, home, tmp = _contained_env(tmp_path, converter)
    marker = _planted(tmp_path / "hf", arch)
    done = _xbackend(["export", "gguf", "hf", "-o", "m.gguf"], tmp_path, env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "xbackend: error: hf: the folder needs code of its own to load: tokenizer_config.json"
    )
    assert "xbackend never runs code from a model folder" in lines[-1]
    assert not marker.exists()
    assert os.listdir(home) == [] and os.listdir(tmp) == []
    assert not (tmp_path / "m.gguf").exists() and not list(tmp_path.glob(".xbackend-gguf-*"))


def _hf(folder: Path) -> Path:
    """A tiny Llama's HF folder with a tokenizer (the converter writes a GGUF of it)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.gguf_models import with_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    return with_tokenizer(folder)


def test_the_folder_is_checked_before_the_converter_starts(tmp_path: Path, converter: Path) -> None:
    """A pipe as the weights: one line at once (the converter would wait on it for an hour). A
    link out of the folder (weights, tokenizer, config): the same line whether what it names
    exists or not. A vocabulary of 2^31-1: refused from the weights' size, in seconds. The
    folder's own files are inputs: `-o HF/model.safetensors --force` is refused."""
    from xbackend.export.gguf import write_gguf

    hf = _hf(tmp_path / "hf")
    weights = (hf / "model.safetensors").read_bytes()
    fifo = tmp_path / "fifo" / "model.safetensors"
    fifo.parent.mkdir()
    for name in ("config.json", "tokenizer.model"):
        (fifo.parent / name).write_bytes((hf / name).read_bytes())
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(UsageError, match=r"is not a regular file .* would wait on it; remove it"):
        write_gguf(fifo.parent, tmp_path / "out.gguf")
    assert time.monotonic() - start < 5
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.safetensors").write_bytes(weights)
    lines = []
    for name, target in (("model.safetensors", "secret.safetensors"), ("model.safetensors", "missing"),
                         ("tokenizer.model", "secret.safetensors"), ("config.json", "missing")):  # fmt: skip
        linked = tmp_path / f"linked-{len(lines)}"
        linked.mkdir()
        for f in ("config.json", "tokenizer.model", "model.safetensors"):
            if f != name:
                (linked / f).write_bytes((hf / f).read_bytes())
        (linked / name).symlink_to(outside / target)
        with pytest.raises(UsageError, match=r"leads out of .* \(or nowhere\)") as e:
            write_gguf(linked, tmp_path / "out.gguf")
        lines.append(str(e.value).replace(str(linked), "FOLDER"))
    assert lines[0] == lines[1]  # the same answer whether the file outside exists
    assert not (tmp_path / "out.gguf").exists()
    config = json.loads((hf / "config.json").read_text("utf-8"))
    big = tmp_path / "big"
    big.mkdir()
    for f in ("tokenizer.model", "model.safetensors"):
        (big / f).write_bytes((hf / f).read_bytes())
    (big / "config.json").write_text(json.dumps({**config, "vocab_size": 2**31 - 1}), "utf-8")
    start = time.monotonic()
    with pytest.raises(
        UsageError, match=r"vocab_size = 2147483647 is more than the .* bytes of the folder's weights"
    ):
        write_gguf(big, tmp_path / "out.gguf")
    assert time.monotonic() - start < 5
    named = tmp_path / "named"
    named.mkdir()
    for f in ("config.json", "tokenizer.model", "model.safetensors"):
        (named / f).write_bytes((hf / f).read_bytes())
    for value in ("/elsewhere/secret.json", "../secret.json"):
        (named / "tokenizer_config.json").write_text(json.dumps({"tokenizer_file": value}), "utf-8")
        with pytest.raises(UsageError, match=r"tokenizer_file names .*, outside .*: xbackend reads a model"):
            write_gguf(named, tmp_path / "out.gguf")
    for name in ("model.safetensors", "tokenizer.model", "config.json"):
        with pytest.raises(UsageError, match="is an input of this command"):
            write_gguf(hf, hf / name, force=True)
        assert (hf / "model.safetensors").read_bytes() == weights


def test_an_export_killed_outright_leaves_its_run_folder_to_the_next(tmp_path: Path, converter: Path) -> None:
    """The converter's run folder beside the output carries the process that made it; one whose
    process is gone (SIGKILL) is removed by the next export there, and a success leaves none."""
    from xbackend.export.gguf import write_gguf
    from xbackend.files.runfolders import MARK

    hf = _hf(tmp_path / "hf")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    left = tmp_path / ".xbackend-gguf-left"
    left.mkdir()
    (left / MARK).write_text(f"{dead.stdout.strip()} 1\n")
    (left / "model.gguf").write_bytes(b"half")
    write_gguf(hf, tmp_path / "m.gguf")
    assert not left.exists() and not list(tmp_path.glob(".xbackend-gguf-*"))
    assert read_header(tmp_path / "m.gguf").architecture() == "llama"


# --- GGUF headers ---------------------------------------------------------------------------------


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _kv(key: str, kind: int, payload: bytes) -> bytes:
    return _string(key.encode()) + struct.pack("<I", kind) + payload


def _gguf(kvs: list[bytes], tensors: list[bytes] = (), n_kv: int | None = None, n_tensors: int | None = None,
          tail: bytes = b"") -> bytes:  # fmt: skip
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)  # fmt: skip
    return head + b"".join(kvs) + b"".join(tensors) + tail


_ARCH = _kv("general.architecture", 8, _string(b"llama"))
_HOSTILE = {
    "array count 2^62": _gguf([_ARCH, _kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 2**62))]),
    "array count 2^63": _gguf([_ARCH, _kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 2**63))]),
    "string array 2^62": _gguf([_ARCH, _kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2**62))]),
    "5,000 nested arrays": _gguf(
        [_ARCH, _kv("x", 9, struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 6, 0))]
    ),
    "a string of 1 TiB": _gguf([_kv("general.name", 8, struct.pack("<Q", 1 << 40))]),
    "2^60 keys": _gguf([_ARCH], n_kv=2**60),
    "2^60 tensors": _gguf([_ARCH], n_tensors=2**60),
    "a tensor of 9 dimensions": _gguf([_ARCH], [_string(b"t") + struct.pack("<I", 9) + b"\0" * 80]),
    "a tensor past the end": _gguf([_ARCH], [_string(b"t") + struct.pack("<IQIQ", 1, 1 << 30, 0, 0)]),
    "value type 99": _gguf([_kv("x", 99, b"")]),
    "truncated": _gguf([_ARCH])[:-3],
    "not GGUF": b"ONNX" + b"\0" * 40,
}


@pytest.mark.parametrize("case", sorted(_HOSTILE))
def test_a_hostile_gguf_header_is_one_line(tmp_path: Path, case: str) -> None:
    """Each a UsageError of one line, in milliseconds: never a ValueError, a RecursionError, a
    MemoryError or a wait (the reader is iterative, every count held to the bytes left)."""
    path = tmp_path / "hostile.gguf"
    path.write_bytes(_HOSTILE[case])
    start = time.monotonic()
    with pytest.raises(UsageError) as e:
        read_header(path)
    assert time.monotonic() - start < 1
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def _patched(src: Path, dest: Path, key: str, value: int) -> Path:
    """`src` with the uint32 value of `key` set to `value` (the bytes after its name and type)."""
    data = bytearray(src.read_bytes())
    at = data.index(_string(key.encode())) + 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 4  # a uint32
    struct.pack_into("<I", data, at + 4, value)
    dest.write_bytes(bytes(data))
    return dest


def test_header_claims_are_held_to_its_tensors(llama: Path, tmp_path: Path) -> None:
    """A block count of 1e5 or 2^32-1, an embedding wider than any tensor: refused before
    llama.cpp allocates, the comparison stands, in seconds; a training context of 2^31-1 is not
    what llama.cpp's context is sized by (what the comparison feeds is), so it runs, small."""
    gguf = llama.with_suffix(".gguf")
    header = read_header(gguf)
    assert claims_problem(header) == "" and header.values["llama.block_count"] == 2
    for key, value, said in (
        ("llama.block_count", 100_000, "llama.block_count = 100000, more layers than its"),
        ("llama.block_count", 2**32 - 1, "llama.block_count = 4294967295"),
        ("llama.embedding_length", 2**31 - 1, "llama.embedding_length = 2147483647, wider than any"),
    ):
        bad = _patched(gguf, tmp_path / "llama.gguf", key, value)
        assert said in claims_problem(read_header(bad))
        model = tmp_path / "llama.onnx"
        model.write_bytes(llama.read_bytes())
        start = time.monotonic()
        r = xbackend.compare(model, backends=["ort-cpu", "llama.cpp"], probes=["none"], runs=1, shapes=SHAPES)
        b = next(x for x in r.backends if x.name == "llama.cpp")
        assert b.status == "failed" and said in b.reason and "llama.cpp was not started on it" in b.reason
        assert time.monotonic() - start < 60 and next(x for x in r.backends if x.name == "ort-cpu").ok
    _patched(gguf, tmp_path / "llama.gguf", "llama.context_length", 2**31 - 1)
    r = xbackend.compare(model, backends=["ort-cpu", "llama.cpp"], probes=["none"], runs=1, shapes=SHAPES,
                         runner_options={"llama.cpp": {"threads": "2"}})  # fmt: skip
    assert next(x for x in r.backends if x.name == "llama.cpp").ok


def test_a_context_larger_than_memory_is_refused_in_one_line(llama: Path) -> None:
    start = time.monotonic()
    r = xbackend.compare(llama, backends=["ort-cpu", "llama.cpp"], probes=["none"], runs=1, shapes=SHAPES,
                         runner_options={"llama.cpp": {"n_ctx": str(2**31 - 1)}})  # fmt: skip
    b = next(x for x in r.backends if x.name == "llama.cpp")
    assert b.status == "failed" and "a context of 2147483647 tokens needs" in b.reason
    assert "lower --set llama.cpp.n_ctx" in b.reason and time.monotonic() - start < 60


def test_a_context_grown_mid_decode_keeps_every_bit(llama: Path) -> None:
    """Sized by what is fed (512 tokens here), the context grows as a decode passes it, the cache
    carried over cell by cell: a prompt of 508 tokens decoded 8 steps (past 512 at the 5th) gives
    the tokens and logits of a context of 2048 made at once, bit for bit."""
    r = xbackend.compare(
        llama, backends=["llama.cpp", "llama.cpp@fixed"], probes=["none"], runs=1, decode=8, noise_samples=0,
        shapes={**SHAPES, "sequence_length": 508},
        runner_options={"llama.cpp": {"threads": "2"}, "llama.cpp@fixed": {"threads": "2", "n_ctx": "2048"}},
    )  # fmt: skip
    d = r.decode
    assert d is not None and d.cached
    grown, fixed = d.backend("llama.cpp"), d.backend("llama.cpp@fixed")
    assert grown.ok and fixed.ok, (grown.reason, fixed.reason)
    for a, b in zip(grown.prompts, fixed.prompts, strict=True):
        assert a.tokens == b.tokens and a.margins == b.margins
    (c,) = [x for x in r.cross_backend if x.backend == "llama.cpp@fixed"]
    assert all(t.max_ulp == 0 for t in c.tensors)


# --- paths beside the model and from a sweep file ----------------------------------------------------


def test_a_gguf_beside_the_model_is_read_inside_its_folder(llama: Path, tmp_path: Path) -> None:
    """llama.gguf -> a file outside (or nowhere), or a lone weights.gguf -> outside: never
    loaded, the same line whatever lies there; the comparison stands."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.gguf").write_bytes(llama.with_suffix(".gguf").read_bytes())
    reasons = []
    for link_name, target in (("llama.gguf", "secret.gguf"), ("llama.gguf", "missing.gguf"),
                              ("weights.gguf", "secret.gguf")):  # fmt: skip
        folder = tmp_path / f"m{len(reasons)}"
        folder.mkdir()
        model = folder / "llama.onnx"
        model.write_bytes(llama.read_bytes())
        (folder / link_name).symlink_to(outside / target)
        r = xbackend.compare(model, backends=["ort-cpu", "llama.cpp"], probes=["none"], runs=1, shapes=SHAPES)
        b = next(x for x in r.backends if x.name == "llama.cpp")
        assert b.status == "failed" and "leads out of its own folder" in b.reason, b.reason
        assert "secret" not in b.reason and next(x for x in r.backends if x.name == "ort-cpu").ok
        reasons.append(b.reason.replace(str(folder), "FOLDER"))
    assert reasons[0] == reasons[1]  # the same line whether the file outside exists


_MODEL = '[[models]]\npath = "m.onnx"\n'
_OUTSIDE = {
    "absolute": '[[backends]]\nname = "llama.cpp"\nset = { gguf = "/elsewhere/secret.gguf" }\n' + _MODEL,
    "dotdot": '[[backends]]\nname = "llama.cpp"\nset = { gguf = "../outside/secret.gguf" }\n' + _MODEL,
    "per-model": '[[backends]]\nname = "llama.cpp"\n'
    + _MODEL
    + 'set = { "llama.cpp.gguf" = "/elsewhere/x.gguf" }\n',
    "another runner's path": '[[backends]]\nname = "ort-cpu"\nset = { save_optimized = "/tmp/x.onnx" }\n'
    + _MODEL,
    "a plugin's _path": '[[backends]]\nname = "ort-cpu@x"\nset = { cache_path = "../x" }\n' + _MODEL,
}


@pytest.mark.parametrize("case", sorted(_OUTSIDE))
def test_a_sweep_file_names_no_path_outside_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """Every path-valued option a runner declares (and any *_path, *_file, *_dir) stays inside the
    sweep file's folder: one line naming the entry, nothing run, nothing written."""
    (tmp_path / "m.onnx").write_bytes((ROOT / "models" / "mlp_layernorm.onnx").read_bytes())
    (tmp_path / "s.toml").write_text(_OUTSIDE[case], "utf-8")
    code, _, err = run(capsys, "sweep", str(tmp_path / "s.toml"), "-o", str(tmp_path / "out"))
    assert code == 2
    one_line_error(err, "which ")
    assert "not a path inside its own folder" in err or "leads out of its own folder" in err
    assert not (tmp_path / "out").exists()


def test_a_sweep_file_claims_no_more_threads_than_the_machine_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "m.onnx").write_bytes((ROOT / "models" / "mlp_layernorm.onnx").read_bytes())
    for option in ("threads = 100000", "inter_op_threads = 100000"):
        (tmp_path / "s.toml").write_text(
            f'[[backends]]\nname = "ort-cpu"\nset = {{ {option} }}\n[[models]]\npath = "m.onnx"\n', "utf-8"
        )
        start = time.monotonic()
        code, _, err = run(capsys, "sweep", str(tmp_path / "s.toml"), "-o", str(tmp_path / "out"))
        assert code == 2 and time.monotonic() - start < 10
        one_line_error(err, f"= 100000 is past this machine's {os.cpu_count()} CPUs; lower it")
    code, _, err = run(capsys, "compare", str(tmp_path / "m.onnx"), "--backends", "ort-cpu", "--set",
                       "ort-cpu.threads=100000", "--no-progress")  # fmt: skip
    assert code == 2
    one_line_error(err, "ort-cpu option threads=100000 is past this machine's")


# --- ggml's abort, the interpreter ----------------------------------------------------------------------


def test_a_ggml_abort_is_said_in_ggmls_words_never_a_debuggers(tmp_path: Path) -> None:
    """ggml's abort handler runs gdb on the process unless GGML_NO_BACKTRACE is set: every worker
    has it set, so the last line of a crashed worker is ggml's own message."""
    from xbackend.execution.isolation import _env

    assert _env({})["GGML_NO_BACKTRACE"] == "1"
    lib = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    code = (
        "import ctypes, sys\n"
        f"lib = ctypes.CDLL({str(lib)!r})\n"
        "lib.ggml_abort(b'planted.c', 7, b'a planted abort (%d)', ctypes.c_int(42))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env({}), capture_output=True, text=True, timeout=60
    )
    assert done.returncode < 0
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    assert lines[-1] == "planted.c:7: a planted abort (42)"
    assert "gdb" not in done.stderr and "libc-start" not in done.stderr


def test_an_interpreter_this_user_cannot_start_is_said_as_such() -> None:
    from xbackend.execution.executor import _not_started

    exe = "/home/someone/.venv/bin/python"
    said = _not_started(PermissionError(13, "Permission denied", exe), exe)
    assert said.startswith(f"the interpreter {exe} cannot be started by this user (Permission denied)")
    assert "--set BACKEND.python=PATH" in said and "written" not in said
    assert _not_started(PermissionError(13, "Permission denied", "/tmp/job/x.json"), exe) == ""


def test_ggml_abort_takes_a_format(tmp_path: Path) -> None:
    """ggml_abort(file, line, fmt, ...) is exported by the library llama-cpp-python ships (the test
    above calls it)."""
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    assert hasattr(lib, "ggml_abort") and hasattr(lib, "ggml_print_backtrace")


def test_export_gguf_leaves_home_and_tmpdir_as_they_were(tmp_path: Path, converter: Path) -> None:
    """A successful export and one stopped by SIGTERM mid-conversion: HOME and TMPDIR hold
    nothing new (no Inductor cache, no Hugging Face modules), no run folder is left beside the
    output, and the stopped one is its line and exit 143."""
    import signal

    env, home, tmp = _contained_env(tmp_path, converter)
    _hf(tmp_path / "hf")
    done = _xbackend(["export", "gguf", "hf", "-o", "m.gguf"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert read_header(tmp_path / "m.gguf").architecture() == "llama"
    assert os.listdir(home) == [] and os.listdir(tmp) == []
    # The signal is sent once the converter's run folder exists; on a busy machine the conversion
    # may finish before it lands, so up to five tries: each must leave no run folder and either no
    # output or the whole one, and at least one must stop the conversion midway.
    stopped_midway = 0
    for attempt in range(5):
        out = tmp_path / f"stopped{attempt}.gguf"
        proc = subprocess.Popen(
            [sys.executable, "-m", "xbackend", "export", "gguf", "hf", "-o", out.name], cwd=tmp_path,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".xbackend-gguf-*")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the converter's run folder exists: it is converting
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert not list(tmp_path.glob(".xbackend-gguf-*")), err
        assert os.listdir(home) == [] and os.listdir(tmp) == []
        if proc.returncode == 0 or out.exists():  # the conversion ended before the signal landed
            assert read_header(out).architecture() == "llama", err
            continue
        assert proc.returncode == 143, err
        said = "xbackend: stopped by SIGTERM; the run's temp files were removed"
        assert err.strip().splitlines()[-1] == said
        stopped_midway += 1
        break
    assert stopped_midway == 1
