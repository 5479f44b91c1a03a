"""The trust boundary: files from others are read inside their folder, never run, never lose a
user's file; every user error is exit 2 and one line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from roots import TESTS

from tests.cli_helpers import one_line_error, relu_model, run

pytestmark = pytest.mark.slow

X4 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
Y4 = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
OPSET = [helper.make_opsetid("", 17)]


def _negative_offset(folder: Path) -> Path:
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "-16"), ("length", "16")):
        e = w.external_data.add()
        e.key, e.value = k, v
    (folder / "w.bin").write_bytes(np.ones(8, np.float32).tobytes())
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [X4], [Y4], [w])
    path = folder / "negoff.onnx"
    onnx.save(helper.make_model(g, opset_imports=OPSET), path)
    return path


def _custom_domain(folder: Path) -> Path:
    node = helper.make_node("Frob", ["x"], ["y"], domain="com.nobody")
    g = helper.make_graph([node], "g", [X4], [Y4])
    path = folder / "domain.onnx"
    opsets = [*OPSET, helper.make_opsetid("com.nobody", 1)]
    onnx.save(helper.make_model(g, opset_imports=opsets), path)
    return path


def _non_utf8_name(folder: Path) -> Path:
    data = relu_model(folder).read_bytes()
    path = folder / "badname.onnx"
    # the output's name "y" (a 1-byte string field) becomes the invalid UTF-8 byte 0xff
    path.write_bytes(data.replace(b"\x12\x01y", b"\x12\x01\xff").replace(b"\x0a\x01y", b"\x0a\x01\xff"))
    return path


def _dynamic(folder: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "m"])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = folder / "dyn.onnx"
    onnx.save(helper.make_model(g, opset_imports=OPSET), path)
    return path


@pytest.mark.parametrize(
    ("model", "args", "message"),
    [
        (_negative_offset, (), "weight 'w': external data offset -16 / length 16 are out of range"),
        (_custom_domain, (), "uses op(s) com.nobody:Frob from a domain no backend implements"),
        (_non_utf8_name, (), "has a tensor or node name that is not valid UTF-8"),
        (_dynamic, ("--shape", "x=1000000,1000000"), "has 1,000,000,000,000 elements"),
        (relu_model, ("--runs", "99999999999999999999"), "--runs must be at most 1,000,000"),
        (relu_model, ("--timeout", "nan"), "--timeout must be > 0 seconds, got nan"),
        (relu_model, ("--seed", "-1"), "--seed must be between 0 and 4294967295"),
    ],
)
def test_user_errors_are_exit_2_and_one_line(
    model: object, args: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = model(tmp_path)  # type: ignore[operator]
    code, _, err = run(
        capsys, "compare", str(path), "--backends", "ort-cpu,reference", *args, "--no-progress"
    )
    assert code == 2, err
    one_line_error(err, message)


def test_a_full_temp_disk_is_one_line_before_any_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = os.statvfs

    def nearly_full(path: object) -> object:
        st = real(path)  # type: ignore[arg-type]
        fields = list(st)
        fields[4] = (1 << 20) // st.f_frsize  # f_bavail: 1 MiB free
        return os.statvfs_result(fields)

    monkeypatch.setattr(os, "statvfs", nearly_full)
    code, _, err = run(capsys, "compare", str(relu_model(tmp_path)), "--no-progress")
    assert code == 2
    one_line_error(err, "no space left on the disk that holds ")
    assert "set TMPDIR to a folder on a larger disk" in err


def _capture(model: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "capture", str(model), "--backend", "ort-cpu", "--runs", "1", "-o", str(out),
                       "--no-progress")  # fmt: skip
    assert code == 0, err


def test_capture_never_writes_into_someones_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = relu_model(tmp_path)
    theirs = tmp_path / "userdir"
    theirs.mkdir()
    (theirs / "important.xbv").write_bytes(b"my data")
    (theirs / "SHA256SUMS").write_text("mine\n")
    code, _, err = run(
        capsys, "capture", str(model), "--backend", "ort-cpu", "-o", str(theirs), "--no-progress"
    )
    assert code == 2
    one_line_error(err, "is a non-empty folder xbackend did not write; xbackend never writes into it")
    assert (theirs / "important.xbv").read_bytes() == b"my data"
    assert (theirs / "SHA256SUMS").read_text("utf-8") == "mine\n"
    # a capture again into its own folder replaces only what the earlier capture listed
    cap = tmp_path / "cap"
    _capture(model, cap, capsys)
    (cap / "notes.txt").write_text("keep me")
    (cap / "mine.xbv").write_bytes(b"keep me too")
    _capture(model, cap, capsys)
    assert (cap / "notes.txt").read_text("utf-8") == "keep me" and (
        cap / "mine.xbv"
    ).read_bytes() == b"keep me too"
    code, _, err = run(
        capsys, "capture", str(model), "--backend", "ort-cpu", "-o", str(model), "--no-progress"
    )
    assert code == 2
    one_line_error(err, "is a file; give a folder for the capture")


def _reseal(cap: Path, manifest: dict) -> None:
    """A manifest edited by hand, its checksums recomputed: only the paths can refuse it."""
    text = json.dumps(manifest)
    (cap / "capture.json").write_text(text)
    sums = [f"{hashlib.sha256(text.encode()).hexdigest()}  capture.json"]
    for name in manifest["files"] if isinstance(manifest["files"], dict) else ():
        f = cap / name
        if f.is_file():
            sums.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {name}")
    (cap / "SHA256SUMS").write_text("\n".join(sums) + "\n")


def test_a_manifest_path_outside_its_folder_is_refused_and_nothing_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = relu_model(tmp_path)
    cap = tmp_path / "cap"
    _capture(model, cap, capsys)
    manifest = json.loads((cap / "capture.json").read_text("utf-8"))
    secret = tmp_path / "secret.txt"
    secret.write_text("a file outside the capture")
    (cap / "link.xbv").symlink_to(secret)
    size = secret.stat().st_size
    hostile = {
        "../secret.txt": "which leads out of its own folder",
        str(secret): "which is not a path inside its own folder",
        "link.xbv": "which leads out of its own folder",
    }
    for entry, message in hostile.items():
        _reseal(cap, {**manifest, "files": {**manifest["files"], entry: size}})
        if entry == str(secret):  # the right size and sha: it would pass every other check
            sums = (cap / "SHA256SUMS").read_text("utf-8")
            digest = hashlib.sha256(secret.read_bytes()).hexdigest()
            (cap / "SHA256SUMS").write_text(sums + f"{digest}  {entry}\n")
        code, _, err = run(capsys, "compare", str(model), "--load", str(cap), "--backends", "reference")
        assert code == 2, entry
        one_line_error(err, f"names {entry!r}, {message}")
        assert f"{size} bytes" not in err and "secret.txt has" not in err
    _reseal(cap, {**manifest, "files": ["outputs.xbv"]})
    code, _, err = run(capsys, "compare", str(model), "--load", str(cap), "--backends", "reference")
    assert code == 2
    one_line_error(err, "has a damaged capture.json (files must map names to sizes)")


def _unsigned_certificate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, dict]:
    model = relu_model(tmp_path)
    code, _, err = run(capsys, "certify", str(model), "--backend", "ort-cpu", "--runs", "2", "--builds", "2",
                       "-o", str(tmp_path / "cert"), "--no-progress")  # fmt: skip
    assert code == 0, err
    return tmp_path / "cert.json", json.loads((tmp_path / "cert.json").read_text("utf-8"))


def test_a_damaged_certificate_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, stmt = _unsigned_certificate(tmp_path, capsys)
    body = stmt["predicate"]
    cases = [
        ({k: v for k, v in body.items() if k != "battery"}, "battery must be dict, not missing"),
        ({**body, "battery": {**body["battery"], "runs": "many"}}, "battery: runs must be int, not 'many'"),
        ({**body, "battery": {**body["battery"], "runs": 10**30}}, "battery: runs must be between 2 and"),
        ({**body, "inputs": {**body["inputs"], "shapes": [["x", [-1]]]}}, "inputs: shapes or ranges are not"),
        ({**body, "schema": "other"}, "is not an xbackend.certificate/2 certificate"),
    ]
    for predicate, message in cases:
        path.write_text(json.dumps({**stmt, "predicate": predicate}))
        code, _, err = run(capsys, "verify", str(path), "--allow-unsigned")
        assert code == 2, message
        one_line_error(err, message)
    for text, message in (
        ("[1, 2]", "is not a certificate (a JSON list)"),
        ("{", "is not a certificate JSON"),
    ):
        path.write_text(text)
        code, _, err = run(capsys, "verify", str(path), "--allow-unsigned")
        assert code == 2
        one_line_error(err, message)


def test_outputs_never_overwrite_an_input_or_someones_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _unsigned_certificate(tmp_path, capsys)
    notes = tmp_path / "notes.md"
    notes.write_text("mine")
    model = tmp_path / "relu.onnx"
    before = model.read_bytes()
    cases = [
        (
            ("certify", str(model), "--backend", "ort-cpu", "-o", str(tmp_path / "notes")),
            "-o .*notes.md exists",
        ),
        (("certify", str(model), "--backend", "ort-cpu", "-o", str(model.with_suffix(""))), None),
        (("report", str(path), "-o", str(path)), "is an input of this command"),
        (("diff", str(path), str(path), "-o", str(notes)), "exists and xbackend did not write it"),
    ]
    for argv, message in cases:
        code, _, err = run(capsys, *argv, "--no-progress") if argv[0] == "certify" else run(capsys, *argv)
        if message is None:  # relu.json and relu.md are new files beside the model: written
            assert code == 0, err
            continue
        assert code == 2, argv
        one_line_error(err, message)
    assert notes.read_text("utf-8") == "mine" and model.read_bytes() == before
    # the certificate it wrote is its own: certify again overwrites it
    code, _, err = run(capsys, "certify", str(model), "--backend", "ort-cpu", "-o", str(tmp_path / "cert"),
                       "--runs", "2", "--builds", "2", "--no-progress")  # fmt: skip
    assert code == 0, err


def test_a_sweep_file_reads_inside_its_folder_and_runs_no_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from xbackend.sweep import load_sweep

    folder = tmp_path / "sweep"
    folder.mkdir()
    relu_model(folder)
    outside = relu_model(tmp_path)
    base = '[[backends]]\nname = "ort-cpu"\n[[models]]\npath = "relu.onnx"\n'
    cases = {
        base.replace("relu.onnx", str(outside)): "which is not a path inside its own folder",
        base.replace("relu.onnx", "../relu.onnx"): "which leads out of its own folder",
        '[sweep]\noutput = "../out"\n' + base: "output names '../out', which leads out of its own folder",
        base.replace(
            'name = "ort-cpu"', 'name = "ort-cpu"\nset = { python = "/bin/sh" }'
        ): "python names code",
        # a name is a heading in fleet.md and a folder name: a line break or an override is refused
        '[sweep]\nname = "zoo\\n# PASS"\n' + base: "sweep: name 'zoo # PASS' holds a line break or control",
        base + 'name = "m\\u202e"\n': "name 'm\\\\u202e' holds a line break or control character",
    }
    for text, message in cases.items():
        (folder / "s.toml").write_text(text)
        code, _, err = run(capsys, "sweep", str(folder / "s.toml"), "--no-progress")
        assert code == 2, text
        one_line_error(err, message)
    (folder / "s.toml").write_text(base)
    spec = load_sweep(folder / "s.toml", tmp_path / "out", (("ort-cpu", "threads", "1"),))
    assert spec.output == tmp_path / "out" and spec.backends[0].options == (("threads", "1"),)
    # a report folder that is someone's: refused before any job, the file intact
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "sweep", str(folder / "s.toml"), "-o", str(theirs), "--no-progress")
    assert code == 2
    one_line_error(err, "is a non-empty folder xbackend did not write; xbackend never writes into it")
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]
    # --save-captures: a backend's capture folder that is someone's, refused before the run
    (theirs / "reference").mkdir()
    (theirs / "reference" / "keep.xbv").write_text("mine")
    code, _, err = run(
        capsys, "compare", str(relu_model(tmp_path)), "--save-captures", str(theirs), "--no-progress"
    )
    assert code == 2
    one_line_error(err, "reference is a non-empty folder xbackend did not write")
    assert (theirs / "reference" / "keep.xbv").read_text("utf-8") == "mine"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_sweep_leaves_no_part_and_no_temp_folder(
    signum: int, code: int, tmp_path: Path, plugin_path: Path
) -> None:
    """A sweep stopped while a job's worker hangs left $TMPDIR/xbackend-* and
    jobs/m/.ort-cpu.partial while saying its temp files were removed: now the job's process group
    is killed, its half-built job folder and its temp folders removed, and the line is true."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tests = TESTS
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": os.pathsep.join([str(plugin_path), str(tests)])}
    relu_model(tmp_path)
    (tmp_path / "s.toml").write_text(
        '[[backends]]\nname = "test-hang"\n[[models]]\nname = "m"\npath = "relu.onnx"\n', "utf-8"
    )
    out = tmp_path / "fleet"
    argv = [
        sys.executable,
        "-m",
        "xbackend",
        "sweep",
        str(tmp_path / "s.toml"),
        "-o",
        str(out),
        "--no-progress",
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(tmp.rglob("engine.bin")) and time.monotonic() < deadline:
        time.sleep(0.2)  # waits for a state (the hanging worker's engine file written), not a time
    assert any(tmp.rglob("engine.bin")), "the hanging worker never ran"
    assert any(p.name.endswith(".partial") for p in (out / "jobs" / "m").iterdir())
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1].endswith("the run's temp files were removed")
    assert list(tmp.iterdir()) == []
    assert [p.name for p in (out / "jobs" / "m").iterdir()] == []
    assert subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True).stdout.split() == []


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)]
)
def test_a_signal_mid_run_stops_the_workers_and_leaves_no_temp_folder(
    signum: int, code: int, tmp_path: Path, plugin_path: Path
) -> None:
    """A cancelled CI job (SIGTERM), a closed terminal (SIGHUP), Ctrl-C: the worker that hangs
    is stopped, the run's temp folder with every capture is removed, and so is the engine's own
    temp file (the killed worker never cleans up after itself), and the exit says which."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tests = TESTS
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": os.pathsep.join([str(plugin_path), str(tests)])}
    model = relu_model(tmp_path)
    argv = [sys.executable, "-m", "xbackend", "compare", str(model), "--backends", "test-hang,reference",
            "--timeout", "600", "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(tmp.rglob("engine.bin")) and time.monotonic() < deadline:
        time.sleep(0.2)  # waits for a state (the hanging worker's engine file written), not a time
    assert any(tmp.rglob("engine.bin")), "the hanging worker never ran"
    hung = subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True).stdout.split()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] in (
        f"xbackend: stopped by {signal.Signals(signum).name}; the run's temp files were removed",
        "xbackend: interrupted; the run's temp files were removed",
    )
    assert list(tmp.iterdir()) == []
    alive = subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True).stdout.split()
    assert hung and alive == []


def test_an_interrupt_before_any_worker_leaves_no_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib
    import tempfile

    run_module = importlib.import_module("xbackend.comparison.run")

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    seen: list[Path] = []

    def interrupted(*args: object, **kwargs: object) -> None:
        seen.extend(tmp.iterdir())  # the run's folder exists, no worker has started
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(run_module, "memory_plan", interrupted)
    code, _, err = run(capsys, "compare", str(relu_model(tmp_path)), "--no-progress")
    assert code == 143 and seen and list(tmp.iterdir()) == []
    assert err.strip() == "xbackend: stopped by SIGTERM; the run's temp files were removed"


HOSTILE = [
    "<script>alert(1)</script>",
    "</td><img src=x onerror=alert(1)>",
    "[x](http://evil.example/t.png)",
    "a|b",
]


def test_hostile_names_come_out_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Tensor and file names that hold HTML, a link, a pipe: the report shows them and builds
    nothing from them; the JSON keeps them exactly. A line break, which would start a heading
    of its own, is refused in a file name, a tensor name and a label."""
    import re

    nodes, prev = [], "x"
    for i, n in enumerate(HOSTILE):
        nodes.append(helper.make_node("Sin" if i % 2 else "Exp", [prev], [n], name=f"{n}_node"))
        prev = n
    nodes.append(helper.make_node("Relu", [prev], ["y"]))
    model = tmp_path / "ev|il<img src=x>.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [X4], [Y4]), opset_imports=OPSET), model)
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    both = ("--report", str(md), "--json", str(js), "--no-progress")
    code, out, err = run(
        capsys, "compare", str(model), "--backends", "ort-cpu,reference,oracle", "--runs", "2", *both
    )
    assert code == 0, out + err
    text = md.read_text("utf-8")
    assert text.startswith("# xbackend report: ev|il&lt;img src=x>.onnx\n")
    tags = set(re.findall(r"</?([a-zA-Z]+)", text))
    assert tags == {"details", "summary"}  # the report's own folds, and nothing a name held
    assert "](http" not in text.replace("\\](http", "")  # no link a name made
    assert "&lt;script>alert(1)&lt;/script>" in text
    assert "a\\|b" in text
    for table in re.findall(r"(?:^\|.*\n)+", text, re.M):  # a pipe in a name never adds a column
        cols = {len(re.findall(r"(?<!\\)\|", line)) for line in table.splitlines()}
        assert len(cols) == 1, table
    assert set(HOSTILE) <= {
        t["name"] for t in json.loads(js.read_text("utf-8"))["result"]["cross_backend"][0]["tensors"]
    }
    # a line break: refused wherever it enters
    nl = tmp_path / "nl\n## PASS.onnx"
    shutil.copy(relu_model(tmp_path), nl)
    code, _, err = run(capsys, "compare", str(nl), "--no-progress")
    assert code == 2
    one_line_error(err, "holds a line break or control character; rename the file")
    code, _, err = run(
        capsys, "compare", str(relu_model(tmp_path)), "--backends", "ort-cpu@a\n## PASS", "--no-progress"
    )
    assert code == 2
    one_line_error(err, "a label after @ is letters, digits")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y\n## PASS"])], "g", [X4],
                          [helper.make_tensor_value_info("y\n## PASS", TensorProto.FLOAT, [4])])  # fmt: skip
    onnx.save(helper.make_model(g, opset_imports=OPSET), tmp_path / "n.onnx")
    code, _, err = run(capsys, "compare", str(tmp_path / "n.onnx"), "--no-progress")
    assert code == 2
    one_line_error(err, "has a tensor or node name with a line break or control character")
