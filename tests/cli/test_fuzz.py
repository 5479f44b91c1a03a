"""Fuzzing the command line's options and every file reader: whatever the input, the answer is
a result or one XbackendError (exit 2), never a traceback or an internal error.

Derandomized, so CI runs the same examples every time; each reader starts from a valid file
and mutates it, which reaches deeper than random bytes alone.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from roots import ROOT

from xbackend.errors import XbackendError

FUZZ = settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# a value that _dumps writes as this many levels of nesting (json.dumps itself would recurse)
DEEP = "\x00deep:"
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from([40, 71, 1000, 5001]).map(lambda n: f"{DEEP}{n}"),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _dumps(value: Any) -> str:
    """json.dumps, each DEEP marker written as that many nested lists (or objects, when odd)."""
    text = json.dumps(value)
    for n in (40, 71, 1000, 5001):
        marker = json.dumps(f"{DEEP}{n}")
        nest = "[" * n + "]" * n if n % 2 == 0 else '{"a":' * n + "1" + "}" * n
        text = text.replace(marker, nest)
    return text


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path into a JSON value."""
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, (*prefix, i))


def _replaced(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = json.loads(json.dumps(data))
    cur = out
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return out


def _mutations(valid: Any) -> st.SearchStrategy[Any]:
    """A valid JSON document with one of its values (at any depth) replaced or removed."""
    paths = list(_paths(valid))

    def mutate(choice: tuple[int, Any, bool]) -> Any:
        i, value, remove = choice
        path = paths[i % len(paths)]
        if remove and path:
            parent = _replaced(valid, (), valid)
            cur = parent
            for k in path[:-1]:
                cur = cur[k]
            del cur[path[-1]]
            return parent
        return _replaced(valid, path, value)

    return st.tuples(st.integers(0, 10**6), json_values, st.booleans()).map(mutate)


def _only_clean_errors(call: Callable[[], object]) -> None:
    try:
        call()
    except XbackendError as e:
        assert "\n" not in str(e).strip(), str(e)


def _relu(folder: Path, first: int | str) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [first, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [first, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = folder / f"relu_{first}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def relu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dynamic first dimension: --shape decides it."""
    return _relu(tmp_path_factory.mktemp("fuzz"), "n")


@pytest.fixture(scope="module")
def static(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fixed shapes: the options alone decide whether the feeds are made."""
    return _relu(tmp_path_factory.mktemp("fuzz"), 2)


@FUZZ
@given(data=st.binary(max_size=400), flips=st.lists(st.integers(0, 10**6), max_size=6))
def test_onnx_reader(
    relu: Path, tmp_path_factory: pytest.TempPathFactory, data: bytes, flips: list[int]
) -> None:
    from xbackend.model.load import load_model

    valid = bytearray(relu.read_bytes())
    for f in flips:
        valid[f % len(valid)] ^= 1 << (f % 8)
    folder = tmp_path_factory.mktemp("onnx")
    for i, blob in enumerate((data, bytes(valid))):
        path = folder / f"m{i}.onnx"
        path.write_bytes(blob)
        _only_clean_errors(lambda p=path: load_model(p))


@FUZZ
@given(
    data=st.binary(max_size=200),
    flips=st.lists(st.integers(0, 10**6), max_size=6),
    dims=st.lists(st.integers(-3, 2**31), max_size=4),
)
def test_input_pb_reader(
    relu: Path, tmp_path_factory: pytest.TempPathFactory, data: bytes, flips: list[int], dims: list[int]
) -> None:
    """--inputs DIR of input_N.pb files (ONNX's test-data layout): random bytes, a valid
    TensorProto with bits flipped, and one whose dims claim any size over the bytes it holds."""
    from onnx import numpy_helper

    from xbackend.model.inputs import load_feeds
    from xbackend.model.load import load_model

    spec, _ = load_model(relu)
    t = numpy_helper.from_array(np.ones((2, 4), np.float32), "x")
    valid = bytearray(t.SerializeToString())
    for f in flips:
        valid[f % len(valid)] ^= 1 << (f % 8)
    claimed = onnx.TensorProto()
    claimed.CopyFrom(t)
    del claimed.dims[:]
    claimed.dims.extend(dims)
    for blob in (data, bytes(valid), claimed.SerializeToString()):
        folder = tmp_path_factory.mktemp("pb")
        (folder / "input_0.pb").write_bytes(blob)
        _only_clean_errors(lambda d=folder: load_feeds(d, spec))


@FUZZ
@given(
    arrays=st.dictionaries(
        st.sampled_from(["x", "y", "z", ""]),
        st.tuples(
            st.sampled_from(["float32", "float64", "int64", "bool", "U3", "O"]),
            st.lists(st.integers(0, 5), max_size=3),
        ),
        max_size=3,
    ),
    cut=st.integers(0, 10**6),
)
def test_npz_reader(
    relu: Path, tmp_path_factory: pytest.TempPathFactory, arrays: dict[str, tuple[str, list[int]]], cut: int
) -> None:
    from xbackend.model.inputs import load_feeds
    from xbackend.model.load import load_model

    spec, _ = load_model(relu)
    folder = tmp_path_factory.mktemp("npz")
    made = {}
    for name, (dtype, shape) in arrays.items():
        made[name or "_"] = (
            np.zeros(shape, dtype=dtype) if dtype != "O" else np.array([{"a": 1}], dtype=object)
        )
    path = folder / "in.npz"
    np.savez(path, **made)
    _only_clean_errors(lambda: load_feeds(path, spec))
    whole = path.read_bytes()
    path.write_bytes(whole[: cut % (len(whole) + 1)])  # truncated
    _only_clean_errors(lambda: load_feeds(path, spec))


@pytest.fixture(scope="module")
def capture(relu: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xbackend.cli import main

    out = tmp_path_factory.mktemp("cap") / "cap"
    assert (
        main(
            [
                "capture",
                str(relu),
                "--backend",
                "reference",
                "--runs",
                "1",
                "--shape",
                "x=2,4",
                "-o",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    return out


@FUZZ
@given(data=st.data())
def test_capture_manifest_reader(
    capture: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    from xbackend.results.capture_record import open_capture

    valid = json.loads((capture / "capture.json").read_text("utf-8"))
    manifest = data.draw(_mutations(valid))
    folder = tmp_path_factory.mktemp("mf") / "cap"
    shutil.copytree(capture, folder)
    (folder / "capture.json").write_text(_dumps(manifest))
    _reseal(folder, "capture.json")  # the reader must judge it
    _only_clean_errors(lambda: open_capture(folder))


def _reseal(folder: Path, *files: str) -> None:
    """The capture's checksums of `files` recomputed: only the reader's own checks stand."""
    import hashlib

    sums = []
    for line in (folder / "SHA256SUMS").read_text("utf-8").splitlines():
        digest, _, file = line.partition("  ")
        if file in files:
            digest = hashlib.sha256((folder / file).read_bytes()).hexdigest()
        sums.append(f"{digest}  {file}")
    (folder / "SHA256SUMS").write_text("\n".join(sums) + "\n")


def _reseal_values(folder: Path, name: str, index_text: str) -> None:
    """`name` (a value file of the capture in `folder`) with `index_text` as its index, the
    manifest's size and the checksums made to match: only the reader's own checks stand."""
    from xbackend.files.storage import END

    path = folder / name
    raw = path.read_bytes()
    start = int.from_bytes(raw[-16:-8], "little")
    index = index_text.encode()
    body = raw[:start] + index + start.to_bytes(8, "little") + END
    path.write_bytes(body)
    manifest = json.loads((folder / "capture.json").read_text("utf-8"))
    manifest["files"][name] = len(body)
    (folder / "capture.json").write_text(json.dumps(manifest))
    _reseal(folder, name, "capture.json")


def _copied(capture: Path, factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    """A copy of the capture, its value file other than the inputs', and that file's index."""
    from xbackend.files.storage import ValueFile

    folder = factory.mktemp("vf") / "cap"
    shutil.copytree(capture, folder)
    name = next(
        n for n in json.loads((folder / "capture.json").read_text("utf-8"))["files"] if n != "inputs.xbv"
    )
    with ValueFile(folder / name) as f:
        return folder, name, {"entries": [[k, v] for k, v in f._index.items()]}


# crafted value-file records: each refused before anything large is allocated
CRAFTED = {
    "shape [1e5]^3": {"shape": [100000] * 3},
    "dtype object": {"dtype": "object"},
    "dtype structured": {"dtype": "[('a', '<f4')]"},
    "dtype void": {"dtype": "V4"},
    "shape [2^29] over its bytes": {"shape": [2**29]},
    "negative size": {"shape": [-5]},
    "garbage strings": {"kind": "strings", "shape": [2]},
    "a float offset": {"offset": 8.5},
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_value_file_in_a_resealed_capture_is_one_line(
    capture: Path, tmp_path_factory: pytest.TempPathFactory, case: str
) -> None:
    """A value file whose index is crafted and whose capture is resealed (checksums recomputed):
    load_capture raises InputError, one line, having allocated nothing its bytes do not hold."""
    from xbackend.errors import InputError
    from xbackend.results.capture_record import load_capture

    folder, name, index = _copied(capture, tmp_path_factory)
    first = index["entries"][0][1]
    first.update(CRAFTED[case])
    _reseal_values(folder, name, json.dumps(index))
    with pytest.raises(InputError) as e:
        load_capture(folder)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"capture {folder} ")


def test_a_value_file_nested_5000_deep_is_one_line(
    capture: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from xbackend.errors import InputError
    from xbackend.results.capture_record import load_capture

    folder, name, _ = _copied(capture, tmp_path_factory)
    deep = '{"kind": "sequence", "items": [' * 5000 + "]}" * 5000
    _reseal_values(folder, name, '{"entries": [["y", ' + deep + "]]}")
    with pytest.raises(InputError, match="nested 10003 levels deep"):
        load_capture(folder)


@FUZZ
@given(data=st.data())
def test_value_file_reader(
    capture: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Every field of a capture's value-file index replaced by any JSON value, nesting and type
    confusion included, the capture resealed: load_capture answers or raises one XbackendError."""
    from xbackend.results.capture_record import load_capture

    folder, name, index = _copied(capture, tmp_path_factory)
    _reseal_values(folder, name, _dumps(data.draw(_mutations(index))))
    _only_clean_errors(lambda: load_capture(folder))


@pytest.fixture(scope="module")
def certificate(relu: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from xbackend.cli import main

    folder = tmp_path_factory.mktemp("cert")
    assert (
        main(
            [
                "certify",
                str(relu),
                "--backend",
                "reference",
                "--runs",
                "2",
                "--builds",
                "2",
                "--shape",
                "x=2,4",
                "-o",
                str(folder / "c"),
                "--no-progress",
            ]
        )
        == 0
    )
    return dict(json.loads((folder / "c.json").read_text("utf-8")))


@FUZZ
@given(data=st.data())
def test_certificate_reader(
    certificate: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    from xbackend.certificates.certify import _consistent, read_certificate

    stmt = data.draw(_mutations(certificate))
    path = tmp_path_factory.mktemp("c") / "c.json"
    for doc in (
        stmt,
        {
            "dsseEnvelope": {
                "payloadType": "application/vnd.in-toto+json",
                "payload": base64.b64encode(_dumps(stmt).encode()).decode(),
                "signatures": data.draw(json_values),
            },
            "mediaType": "x",
        },
    ):
        path.write_text(_dumps(doc))

        def read(p: Path = path) -> None:
            body, _, _ = read_certificate(p, None, allow_unsigned=True)
            _consistent(body, p)

        _only_clean_errors(read)


@FUZZ
@given(data=st.data())
def test_report_and_baseline_reader(
    relu: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    from xbackend.comparison.baseline import load_baseline

    valid = json.loads((ROOT / "reports" / "torch_mlp.json").read_text("utf-8"))
    # the large per-tensor lists make mutations slow to draw: keep the top two levels' shape
    small = {k: v for k, v in valid.items() if k != "result"}
    small["result"] = {k: (v if not isinstance(v, list) else v[:1]) for k, v in valid["result"].items()}
    doc = data.draw(_mutations(small))
    path = tmp_path_factory.mktemp("b") / "r.json"
    path.write_text(_dumps(doc))
    _only_clean_errors(lambda: load_baseline(path))


TOML_LINES = [
    "[sweep]",
    'name = "s"',
    'output = "out"',
    "runs = 2",
    "runs = 'x'",
    "probes = []",
    "probes = 3",
    "[[models]]",
    'path = "relu.onnx"',
    'path = "../relu.onnx"',
    'path = "/etc/passwd"',
    "shapes = { x = [2, 4] }",
    "shapes = { x = 'a' }",
    "ranges = { x = [0] }",
    "[[backends]]",
    'name = "reference"',
    'name = "ort-cpu@a"',
    "set = { threads = 1 }",
    'set = { python = "/bin/sh" }',
    "requires = { num_gpus = -1 }",
    "job_timeout = 0",
    'inputs = "x.npz"',
    "retries = -1",
    "[models.set]",
    "=",
    "[",
    '"',
    "max_ulp = true",
    "runs = " + "[" * 5000 + "]" * 5000,  # nesting past Python's recursion
    "shapes = " + "{ x = " * 300 + "1" + " }" * 300,
    'name = "s\\u202e"',
    'name = "a\\nb"',
    "max_ulp = 1e999",
]


@FUZZ
@given(lines=st.lists(st.sampled_from(TOML_LINES), max_size=14), noise=st.text(max_size=12))
def test_sweep_file_reader(
    relu: Path, tmp_path_factory: pytest.TempPathFactory, lines: list[str], noise: str
) -> None:
    from xbackend.sweep import load_sweep

    folder = tmp_path_factory.mktemp("sw")
    shutil.copy(relu, folder / "relu.onnx")
    path = folder / "s.toml"
    path.write_text("\n".join([*lines, noise]), "utf-8")
    _only_clean_errors(lambda: load_sweep(path))


EDGE_VALUES = [
    "0",
    "-1",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "99999999999999999999",
    "",
    "x",
    "1,2",
    "ort-cpu",
    "a=b",
    "x=1,2",
    "x=-1",
    "x=0:1",
    "x=1:0",
    "x=nan:1",
    "none",
    "all",
    "3GiB",
    "-5B",
    "\r",
    "a\nb",
    "x=99999999,99999999",
    "ort-cpu.threads=-1",
    "ort-cpu.python=",
    "reference@a\n",
]
OPTION_VALUES = st.one_of(st.sampled_from(EDGE_VALUES), st.text(max_size=12))
OPTIONS = [
    "--runs",
    "--builds",
    "--seed",
    "--timeout",
    "--max-ulp",
    "--shape",
    "--range",
    "--set",
    "--backends",
    "--probes",
    "--batch-invariance",
    "--probe-threads",
    "--fail-on",
    "--tensors",
    "--max-memory",
    "--noise-samples",
    "--timed-runs",
    "--modes",
    "--reference",
    "--load",
]


def _answer(
    relu: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """The command line answers with one line and exit 2, or the options are valid and the run
    would start: everything before the first worker runs for real (the model, the probes, the
    captures, the feeds); the engines are tested elsewhere."""
    import importlib

    import xbackend.cli.run as cli_run
    from xbackend.cli import main

    run_module = importlib.import_module("xbackend.comparison.run")

    def would_run(model: str, opts: Any, *args: object, **kwargs: object) -> None:
        run_module.select_probes(opts.probes, opts.batch_invariance)
        spec, _ = run_module.load_model(model)
        spec = run_module.with_selection(spec, opts.tensors)
        run_module.feeds_for(spec, opts, run_module.load_captures(spec, opts))
        raise typer.Exit(99)

    monkeypatch.setattr(cli_run, "compare_with_options", would_run)
    code = main(["compare", str(relu), "--no-progress", *argv])
    _, err = capsys.readouterr()
    assert code in (2, 99), (argv, err)
    assert "internal error" not in err and "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (argv, err)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_at_its_edges(
    relu: Path, static: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    for value in EDGE_VALUES:
        _answer(static, monkeypatch, capsys, [option, value])
        _answer(relu, monkeypatch, capsys, ["--shape", "x=2,4", option, value])


@FUZZ
@given(opts=st.lists(st.tuples(st.sampled_from(OPTIONS), OPTION_VALUES), max_size=4))
def test_compare_options(
    relu: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    opts: list[tuple[str, str]],
) -> None:
    _answer(relu, monkeypatch, capsys, [x for pair in opts for x in pair])


def _valid_gguf() -> bytes:
    """A small whole GGUF file: scalars, a string, arrays of floats and strings, one F32 tensor."""
    import struct

    def string(s: bytes) -> bytes:
        return struct.pack("<Q", len(s)) + s

    def kv(key: str, kind: int, payload: bytes) -> bytes:
        return string(key.encode()) + struct.pack("<I", kind) + payload

    kvs = [
        kv("general.architecture", 8, string(b"llama")),
        kv("llama.block_count", 4, struct.pack("<I", 1)),
        kv("llama.embedding_length", 4, struct.pack("<I", 4)),
        kv("general.file_type", 4, struct.pack("<I", 0)),
        kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0, 1, 2)),
        kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + string(b"a") + string(b"bc")),
    ]
    tensor = (
        string(b"token_embd.weight")
        + struct.pack("<I", 2)
        + struct.pack("<QQ", 4, 2)
        + struct.pack("<IQ", 0, 0)
    )
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kvs)) + b"".join(kvs) + tensor
    return head + b"\0" * (-len(head) % 32) + b"\0" * 32


@FUZZ
@given(
    flips=st.lists(st.integers(0, 10**6), max_size=6),
    words=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2**64 - 1)), max_size=3),
    cut=st.integers(0, 10**6),
)
def test_gguf_header_reader(
    tmp_path_factory: pytest.TempPathFactory, flips: list[int], words: list[tuple[int, int]], cut: int
) -> None:
    """A GGUF file with bits flipped, any 8 bytes set to any count (2^62, 2^64-1), or cut short:
    its header is read, or refused in one line (never another exception, a hang or an allocation
    the bytes cannot hold)."""
    import struct

    from xbackend.files.gguf_header import claims_problem, read_header

    data = bytearray(_valid_gguf())
    for f in flips:
        data[f % len(data)] ^= 1 << (f % 8)
    for at, value in words:
        struct.pack_into("<Q", data, at % (len(data) - 8), value)
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    path.write_bytes(bytes(data[: max(4, cut % (len(data) + 1))]) if cut % 3 == 0 else bytes(data))
    _only_clean_errors(lambda: claims_problem(read_header(path)))


def test_the_fuzzed_gguf_is_read_whole_when_untouched(tmp_path: Path) -> None:
    from xbackend.files.gguf_header import claims_problem, read_header

    path = tmp_path / "m.gguf"
    path.write_bytes(_valid_gguf())
    header = read_header(path)
    assert header.architecture() == "llama" and header.values["llama.block_count"] == 1
    assert header.array_lengths == {"tokenizer.ggml.scores": 3, "tokenizer.ggml.tokens": 2}
    assert [(t.name, t.dims, t.type_name, t.nbytes()) for t in header.tensors] == [
        ("token_embd.weight", (4, 2), "F32", 32)
    ]
    assert claims_problem(header) == ""
