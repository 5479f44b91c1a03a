"""The trust boundary's second pass (issue 47): nothing a user wrote is overwritten, nothing
outside a model's folder is looked at, names from files are inert wherever printed, damaged input
is exit 2 and one line."""

from __future__ import annotations

import collections
import html.parser
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from roots import ROOT

import xbackend
from tests.cli_helpers import one_line_error, relu_model, run

X4 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
Y4 = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])


def test_a_reports_table_and_figures_never_overwrite_a_users_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """compare --report and report -o check every file the report writes beside it (its table,
    each figure) before anything runs, as the report itself: a user's file, or a link, is refused;
    what xbackend wrote is replaced."""
    model = relu_model(tmp_path)
    base = ("compare", str(model), "--backends", "ort-cpu,reference", "--runs", "1", "--no-progress")
    code, _, err = run(
        capsys, *base, "--report", str(tmp_path / "r1.md"), "--json", str(tmp_path / "r1.json")
    )
    assert code == 0, err
    written = sorted(p.name for p in tmp_path.glob("r1.*"))
    assert "r1.layers.csv" in written and "r1.error-depth.png" in written
    # its own files: replaced by the next run
    code, _, err = run(capsys, *base, "--report", str(tmp_path / "r1.md"))
    assert code == 0, err
    mine = "a user's own figure"
    for name, pattern in [
        (
            "r4.layers.csv",
            "--report .*r4.md's table .*r4.layers.csv exists and xbackend did not write it",
        ),
        ("r4.error-depth.png", "--report .*r4.md's figure .*r4.error-depth.png exists"),
        ("r4.ulp-distribution.png", "r4.ulp-distribution.png exists and xbackend did not write it"),
        ("r4.cost-ort-cpu.png", "r4.cost-ort-cpu.png exists and xbackend did not write it"),
    ]:
        (tmp_path / name).write_text(mine)
        code, _, err = run(capsys, *base, "--report", str(tmp_path / "r4.md"))
        assert code == 2
        one_line_error(err, pattern)
        assert (tmp_path / name).read_text("utf-8") == mine and not (tmp_path / "r4.md").exists()
        (tmp_path / name).unlink()
    # a link to a report's own table is still a link: never replaced by a regular file
    (tmp_path / "r2.layers.csv").symlink_to(tmp_path / "r1.layers.csv")
    code, _, err = run(capsys, *base, "--report", str(tmp_path / "r2.md"))
    assert code == 2
    one_line_error(err, "r2.layers.csv is a symbolic link; xbackend never writes through or replaces one")
    assert (tmp_path / "r2.layers.csv").is_symlink()
    # report -o: the same rule
    (tmp_path / "rr.ulp-distribution.png").write_bytes(b"\x89PNG\r\n\x1a\nsomeone's")
    code, _, err = run(capsys, "report", str(tmp_path / "r1.json"), "-o", str(tmp_path / "rr.md"))
    assert code == 2
    one_line_error(err, "-o .*rr.md's figure .*rr.ulp-distribution.png exists and xbackend did not write it")
    (tmp_path / "rr.ulp-distribution.png").unlink()
    code, _, err = run(capsys, "report", str(tmp_path / "r1.json"), "-o", str(tmp_path / "rr.md"))
    assert code == 0, err
    assert (tmp_path / "rr.layers.csv").read_bytes() == (tmp_path / "r1.layers.csv").read_bytes()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc on this system (Linux only)")
def test_outputs_that_cannot_be_regular_files_are_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under /proc and /sys, or a device: refused before anything runs, one line, exit 2."""
    model = relu_model(tmp_path)
    base = ("compare", str(model), "--backends", "reference", "--runs", "1", "--no-progress")
    for flag, path, pattern in [
        (
            "--json",
            "/proc/self/r.json",
            "--json /proc/self/r.json cannot be written: /proc/self is not a writable",
        ),
        ("--report", "/sys/kernel/r.md", "--report /sys/kernel/r.md cannot be written"),
        ("--json", "/dev/null", "--json /dev/null is not a regular file"),
        ("--json", "/proc/self/status", "--json /proc/self/status exists and xbackend did not write it"),
    ]:
        code, out, err = run(capsys, *base, flag, path)
        assert code == 2, (path, err)
        one_line_error(err, pattern)
        assert out == ""  # nothing ran
    # a capture folder, and the folder --save-captures fills: the same rule
    code, _, err = run(capsys, "capture", str(model), "--backend", "reference", "-o", "/proc/self/cap")
    assert code == 2
    one_line_error(err, "/proc/self/cap cannot be written: /proc/self takes no new file")
    code, _, err = run(capsys, *base, "--save-captures", "/proc/self/caps")
    assert code == 2
    one_line_error(err, "cannot be written: /proc/self takes no new file")


def test_keygen_into_a_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`keygen -o EXISTINGDIR` wrote EXISTINGDIR.key beside the folder: now one line, exit 2, and a
    suggestion that works."""
    folder = tmp_path / "keys"
    folder.mkdir()
    code, _, err = run(capsys, "keygen", "-o", str(folder))
    assert code == 2
    one_line_error(err, f"-o {folder} is a folder; give a name in it, such as {folder / 'signing'}")
    assert not (tmp_path / "keys.key").exists() and not any(folder.iterdir())
    code, out, err = run(capsys, "keygen", "-o", str(folder / "signing"))
    assert code == 0 and out.startswith(f"wrote {folder / 'signing.key'}"), err
    assert (folder / "signing.key").is_file() and (folder / "signing.pub").is_file()
    assert os.stat(folder / "signing.key").st_mode & 0o077 == 0


def _external(folder: Path, location: str) -> Path:
    """Relu + a weight whose external data location is `location`."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], vals=[0.0] * 4)
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        w.external_data.add(key=k, value=v)
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [X4], [Y4], initializer=[w])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_external_data_outside_the_folder_is_refused_from_its_path_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An external-data location outside the model's folder (absolute, `..`, a link, a linked
    folder) is refused with the same line whether a file lies there or not, and of what size: a
    model file learns nothing about the outside."""
    lines: dict[str, list[str]] = {}
    for there in (True, False):  # the same names, with a file outside and then without
        root = tmp_path / ("there" if there else "not-there")
        outside = root / "outside"
        outside.mkdir(parents=True)
        if there:
            (outside / "secret.bin").write_bytes(b"s" * 1221)
        cases = {
            "abs": str(outside / "secret.bin"),
            "dotdot": "../../outside/secret.bin",
            "link": "w.bin",
            "linked-folder": "d/secret.bin",
        }
        for case, location in cases.items():
            folder = root / case / "model"
            model = _external(folder, location)
            (folder / "w.bin").symlink_to(outside / "secret.bin")
            (folder / "d").symlink_to(outside)
            code, _, err = run(capsys, "compare", str(model), "--backends", "reference", "--no-progress")
            assert code == 2, err
            one_line_error(err, "external data names")
            assert "ends at byte" not in err and "1221" not in err
            lines.setdefault(case, []).append(err.replace(str(root), "ROOT"))
    for case, (a, b) in lines.items():
        assert a == b, case  # what lies outside changed nothing
    assert "which is not a path inside its own folder" in lines["abs"][0]
    for case in ("dotdot", "link", "linked-folder"):
        assert "which leads out of its own folder" in lines[case][0], lines[case][0]


EVIL = """
import pathlib
pathlib.Path(__file__).with_name("PWNED").write_text("ran")


def build():
    raise SystemExit("never here")
"""


def _recording(folder: Path, recorded: str) -> Path:
    """torch_mlp's export, its metadata naming `recorded` as its source module."""
    folder.mkdir(parents=True, exist_ok=True)
    proto = onnx.load(ROOT / "models" / "torch_mlp.onnx")
    for p in proto.metadata_props:
        if p.key == "xbackend.torch.module":
            p.value = recorded
    path = folder / "m.onnx"
    onnx.save(proto, path)
    return path


def test_trust_model_code_imports_only_the_file_beside_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--trust-model-code runs the Python file that ships beside the model: a dotted module, an
    absolute path, `..` or a link out named by the model's metadata is refused before anything
    runs, exit 2, one line, with a --torch-module that works once the user trusts it."""
    pytest.importorskip("torch")
    (tmp_path / "evil.py").write_text(EVIL)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "link.py").symlink_to(tmp_path / "evil.py")
    cases = {
        "../evil.py:build": "the model's source module names '../evil.py', which leads out of its own folder",
        f"{tmp_path / 'evil.py'}:build": "which is not a path inside its own folder",
        "os:system": "records its source module 'os:system', not a Python file beside it",
        "link.py:build": "the model's source module names 'link.py', which leads out of its own folder",
    }
    for recorded, message in cases.items():
        model = _recording(folder, recorded)
        code, out, err = run(
            capsys,
            "compare",
            str(model),
            "--backends",
            "ort-cpu,torch",
            "--trust-model-code",
            "--no-progress",
        )
        assert code == 2, err
        one_line_error(err, message)
        assert "--trust-model-code runs only a file in the model's own folder: pass it yourself with " in err
        assert out == "" and not (tmp_path / "PWNED").exists()
    # the suggestion works as given, from the working directory
    model = _recording(folder, "../evil.py:build")
    _, _, err = run(capsys, "compare", str(model), "--backends", "torch", "--trust-model-code")
    suggested = err.split("--torch-module ")[1].split(" ")[0]
    assert Path(suggested.rpartition(":")[0]).resolve() == (tmp_path / "evil.py").resolve()
    # a file beside the model runs
    beside = tmp_path / "good"
    beside.mkdir()
    shutil.copy(ROOT / "models" / "torch_mlp.py", beside / "torch_mlp.py")
    model = _recording(beside, "torch_mlp.py:build")
    r = xbackend.compare(
        model,
        backends="ort-cpu,torch",
        runs=1,
        probes="none",
        runner_options={"torch": {"trust_model_code": "true"}},
    )
    assert r.backend("torch").ok, r.backend("torch").reason


# names a model controls that GitHub would render as links, images, HTML, emphasis or a code fence,
# or that reorder or control a terminal
FORGING = [
    "o https://evil.example/a",
    "o_https://evil.example/b",
    "o www.evil.example",
    "o<https://evil.example/c>",
    "[a](b.md)",
    "![i](r.error-depth.png)",
    "mail me@evil.example",
    "``` fence",
    "csi\x9b31m",
    "rlo\u202egnp.exe",
    "<b>bold</b>",
    "*em* ~~del~~",
    "&lt;amp",
    "f\\[x](https:evil.example/d)",  # a backslash that would cancel the escape before [
    "g\\](https:evil.example/e)",
    "_under_ score_",
]


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: collections.Counter[str] = collections.Counter()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        self.links += [v or "" for k, v in attrs if k in ("href", "src")]


def _rendered(md: str) -> _Tags:
    """The report as GitHub renders it (cmark-gfm, its autolink and table extensions)."""
    cmarkgfm = pytest.importorskip("cmarkgfm")
    from cmarkgfm.cmark import Options

    page = cmarkgfm.github_flavored_markdown_to_html(md, options=Options.CMARK_OPT_UNSAFE)
    p = _Tags()
    p.feed(page)
    return p


def _chain(path: Path, names: list[str]) -> Path:
    nodes, prev = [], "x"
    for i, n in enumerate(names):
        nodes.append(helper.make_node("Sin" if i % 2 else "Exp", [prev], [n], name=f"{n} node"))
        prev = n
    nodes.append(helper.make_node("Relu", [prev], ["y"]))
    g = helper.make_graph(nodes, "g", [X4], [Y4])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_names_from_a_model_build_nothing_where_github_renders_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rendered as GitHub renders Markdown, a report on a model whose names hold URLs, links,
    images, HTML, emphasis, backticks and terminal controls has exactly the links, images,
    headings and tags of the same report on plainly named tensors; the terminal and the report
    never hold a C1 control or a bidirectional override; the JSON keeps every name exactly."""
    runs = {}
    for kind, names in (("plain", [f"t{k}" for k in range(len(FORGING))]), ("forged", FORGING)):
        folder = tmp_path / kind
        folder.mkdir()
        model = _chain(folder / "m.onnx", names)
        md, js = folder / "r.md", folder / "r.json"
        code, out, err = run(
            capsys, "compare", str(model), "--backends", "ort-cpu,reference", "--runs", "1",
            "--report", str(md), "--json", str(js), "--no-progress",
        )  # fmt: skip
        assert code == 0, err
        runs[kind] = (md.read_text("utf-8"), out + err, js)
    plain, forged = _rendered(runs["plain"][0]), _rendered(runs["forged"][0])
    assert plain.links == forged.links  # the report's own figures and table, nothing else
    assert all(not link.startswith(("http", "mailto", "//")) for link in forged.links)
    counts = {t: n for t, n in forged.tags.items() if t != "code"}
    assert counts == {t: n for t, n in plain.tags.items() if t != "code"}
    md, terminal, js = runs["forged"]
    for hidden in ("\x9b", "\u202e"):
        assert hidden not in md and hidden not in terminal
    assert "rlo\\u202egnp.exe" in md and "csi\\u009b31m" in md
    tensors = {t["name"] for t in json.loads(js.read_text("utf-8"))["result"]["cross_backend"][0]["tensors"]}
    assert set(FORGING) <= tensors


def test_a_forged_model_file_name_builds_no_link_in_the_title(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The H1 names the model file: 'f\\[x](https:evil.example).onnx' stays text there."""
    forged = _chain(tmp_path / "f\\[x](https:evil.example).onnx", ["t0"])
    md = tmp_path / "r.md"
    code, _, err = run(
        capsys, "compare", str(forged), "--backends", "reference", "--runs", "1", "--probes", "none",
        "--report", str(md), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    page = _rendered(md.read_text("utf-8"))
    assert all(not link.startswith(("http", "//")) for link in page.links), page.links


EARLY = """
import os, signal, sys
import xbackend.cli.entry


class Slow:  # the CLI's import, with a signal arriving in the middle of it
    def find_spec(self, name, path, target=None):
        if name == "xbackend.cli.main":
            os.kill(os.getpid(), signal.{sig})
        return None


sys.meta_path.insert(0, Slow())
sys.argv = ["xbackend", "backends"]
sys.exit(xbackend.cli.entry.main())
"""


@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_signal_while_the_cli_imports_is_one_line(sig: str, code: int) -> None:
    """Ctrl-C while the CLI is still importing gave a 26-37-line traceback, SIGTERM and SIGHUP
    no line at all: each is now one line and its exit code."""
    proc = subprocess.run(
        [sys.executable, "-c", EARLY.replace("{sig}", sig)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == code, proc.stderr
    what = "interrupted" if sig == "SIGINT" else f"stopped by {sig}"
    assert proc.stderr == f"xbackend: {what} before anything ran\n" and proc.stdout == ""


LATE = """
import atexit, os, signal, sys
import xbackend.cli.main


def command(argv=None):  # a command that has written what it writes
    print("wrote r.md")
    atexit.register(os.kill, os.getpid(), signal.{sig})  # the signal as the process winds down
    return 0


xbackend.cli.main.main = command
sys.exit(__import__("xbackend.cli.entry").cli.entry.main())
"""


@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_signal_as_the_command_ends_is_its_line_and_code(sig: str, code: int) -> None:
    """A signal in a command's last moments killed it with exit -2 or -15 and no line: it is now
    noted, the exit functions still run, and the process ends with its line and 128 + signum."""
    proc = subprocess.run(
        [sys.executable, "-c", LATE.replace("{sig}", sig)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "wrote r.md\n"
    assert proc.stderr == f"xbackend: {sig} as the command ended; what it wrote is whole\n"


@pytest.mark.slow
def test_a_run_killed_outright_leaves_its_folder_to_the_next_run(tmp_path: Path, plugin_path: Path) -> None:
    """SIGKILL leaves no chance to clean up: the run's folder (8.4 MB in the tester's case) stays,
    marked with the dead process; the next run removes it, and leaves alone a folder without the
    mark and the folder of a run that is still alive."""
    from xbackend.files import runfolders
    from xbackend.files.runfolders import MARK

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(tmp),
        "PYTHONPATH": os.pathsep.join([str(plugin_path), str(ROOT / "tests")]),
    }
    model = relu_model(tmp_path)
    argv = [sys.executable, "-m", "xbackend", "compare", str(model), "--backends", "test-hang,reference",
            "--timeout", "600", "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(tmp.rglob("engine.bin")) and time.monotonic() < deadline:
        time.sleep(0.2)  # waits for a state (the hanging worker's engine file), not a time
    assert any(tmp.rglob("engine.bin")), "the hanging worker never ran"
    proc.kill()
    proc.wait(timeout=60)
    (dead,) = tmp.glob("xbackend-*")
    assert (dead / MARK).read_text("utf-8").split()[0] == str(proc.pid)
    theirs = tmp / "xbackend-notes"  # someone's folder under a name like ours: no mark
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    alive = tmp / "xbackend-alive"  # a run still going (this test's own process)
    alive.mkdir()
    (alive / MARK).write_text(f"{os.getpid()} {runfolders.start_time(os.getpid())}\n")
    done = subprocess.run(
        [sys.executable, "-m", "xbackend", "compare", str(model), "--backends", "reference", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not dead.exists()
    assert (theirs / "keep.txt").read_text("utf-8") == "mine" and alive.is_dir()


def test_a_certificates_values_are_checked_not_only_its_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A probe named "rm -rf /", granted "yes", an input dtype complex512, a NaN or "fast" latency,
    a publicKey that is a string, options for another backend than the certified one: each is
    one line naming the field, exit 2, and nothing runs."""
    model = relu_model(tmp_path)
    out = str(tmp_path / "cert")
    code, _, err = run(capsys, "certify", str(model), "--backend", "ort-cpu", "--runs", "2", "--builds",
                       "2", "--set", "ort-cpu.threads=1", "-o", out, "--no-progress")  # fmt: skip
    assert code == 0, err
    path = tmp_path / "cert.json"
    stmt = json.loads(path.read_text("utf-8"))
    body = stmt["predicate"]
    assert body["battery"]["runner_options"] == [["ort-cpu", "threads", "1"]]
    bat, given = body["battery"], body["inputs"]
    cases = [
        ({**body, "battery": {**bat, "probes": ["rm -rf /"]}}, "battery: probes names 'rm -rf /', no probe"),
        ({**body, "granted": "yes"}, "granted must be bool, not 'yes'"),
        (
            {**body, "inputs": {**given, "tensors": [["x", "complex512", "[4]"]]}},
            "inputs: dtype 'complex512' of 'x' is no dtype xbackend feeds",
        ),
        (
            {**body, "latency": {**body["latency"], "median_ms": float("nan")}},
            "latency: median_ms must be a finite",
        ),
        (
            {**body, "latency": {**body["latency"], "median_ms": "fast"}},
            "latency: median_ms must be int or float",
        ),
        (
            {**body, "backend": {**body["backend"], "name": "reference"}},
            "battery: runner_options set 'ort-cpu', but the certificate is for 'reference'",
        ),
        (
            {**body, "properties": [{"name": "speed", "status": "held"}]},
            "properties: 'speed' 'held' is not a",
        ),
        ({**body, "outputs": {**body["outputs"], "sha256": "abc"}}, "is not 64 hex digits"),
    ]
    for predicate, message in cases:
        path.write_text(json.dumps({**stmt, "predicate": predicate}))
        code, out, err = run(capsys, "verify", str(path), "--allow-unsigned", "--no-progress")
        assert code == 2, (message, err)
        one_line_error(err, message)
        assert out == ""
    bundle = {
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"publicKey": "abc"},
        "dsseEnvelope": {"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": []},
    }
    path.write_text(json.dumps(bundle))
    code, _, err = run(capsys, "verify", str(path), "--allow-unsigned")
    assert code == 2
    one_line_error(err, "its verificationMaterial is not an object with a publicKey object")


def test_an_npz_is_judged_by_its_headers_before_any_array_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 1 MB .npz whose header declares 268M elements is refused from its header (it took 1.1 GB
    before); a structured or raw-bytes array never passes as float32; a <U1 array is a string
    array; a file that is no zip gets no advice about pickles."""
    import io
    import resource
    import zipfile

    import numpy as np

    model = relu_model(tmp_path, ("n", 4), "dyn.onnx")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**28,)})
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as z, z.open("x.npy", "w") as f:
        f.write(header.getvalue())
        for _ in range(1024):  # 268M zeros, deflated to 1 MB, written a MiB at a time
            f.write(bytes(1 << 20))
    assert (tmp_path / "bomb.npz").stat().st_size < 2 << 20
    np.savez(tmp_path / "struct.npz", x=np.zeros((2, 4), dtype=[("a", "<f4")]))
    np.savez(tmp_path / "void.npz", x=np.zeros((2, 4), dtype="V4"))
    np.savez(tmp_path / "u1.npz", x=np.array([["a"] * 4] * 2))
    np.savez(tmp_path / "rank.npz", x=np.zeros((2, 4, 1), np.float32))
    (tmp_path / "text.npz").write_text("x = 1, 2, 3")
    cases = {
        "bomb": "gives input 'x' shape [268435456], but the model expects",
        "struct": "array 'x' is a structured or raw-bytes array ([('a', '<f4')]), not numbers",
        "void": "array 'x' is a structured or raw-bytes array (|V4), not numbers",
        "u1": "input 'x' is a string array, the model expects float32",
        "rank": "gives input 'x' shape [2, 4, 1], but the model expects",
        "text": "text.npz: not an .npz (not a zip archive); save it with numpy.savez",
    }
    for name, message in cases.items():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        given = str(tmp_path / f"{name}.npz")
        code, _, err = run(capsys, "compare", str(model), "--inputs", given, "--backends", "reference",
                           "--runs", "1", "--probes", "none", "--no-progress")  # fmt: skip
        assert code == 2, (name, err)
        one_line_error(err, message)
        assert "allow_pickle" not in err
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown < 200 << 10, (name, grown)  # KiB: nothing the size of the declared array
    # a header declaring more than the archive holds: refused before anything is read
    with zipfile.ZipFile(tmp_path / "short.npz", "w") as z:
        z.writestr("x.npy", header.getvalue() + b"\0" * 1000)
    code, _, err = run(
        capsys, "compare", str(model), "--inputs", str(tmp_path / "short.npz"), "--no-progress"
    )
    assert code == 2
    one_line_error(err, "array 'x' declares shape [268435456] of float32 (1073741824 bytes), but holds 1000")


def test_a_negative_dimension_and_an_unknown_weight_type_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-5, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [Y4])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "neg.onnx")
    code, _, err = run(capsys, "compare", str(tmp_path / "neg.onnx"), "--no-progress")
    assert code == 2
    one_line_error(err, "neg.onnx declares dimension -5 for 'x'; a size is >= 0")
    model = _external(tmp_path / "ext", "w.bin")
    proto = onnx.load(model, load_external_data=False)
    proto.graph.initializer[0].data_type = 999
    onnx.save(proto, model)
    (tmp_path / "ext" / "w.bin").write_bytes(bytes(16))
    code, _, err = run(capsys, "compare", str(model), "--no-progress")
    assert code == 2
    one_line_error(err, "weight 'w' has data_type 999, no ONNX type")


def test_smaller_messages_say_what_happened() -> None:
    """A magnitude near float64's largest gives an infinite allowance without a RuntimeWarning;
    the progress count never passes its total; equal outputs with a differing intermediate do
    not read as a contradiction; a backend judged at its one exposed tensor says so."""
    import warnings

    import numpy as np

    from xbackend.bounds.element import NodeBound, allowance
    from xbackend.cli.run import _divergence
    from xbackend.execution.progress import LineProgress
    from xbackend.results.explanation import LocalErrors, explained_words

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = allowance(
            NodeBound("MatMul", "reduction", a=1.0, b=4.0), np.array([1.0]), np.array([1.7e308]), 1.0
        )
    assert np.isinf(got).all()
    bar = LineProgress()
    bar.start(2)
    bar.advance(3)
    assert (bar._done, bar._total) == (3, 3)
    assert _divergence(True, "h", {}) == "the outputs agree, an intermediate first differs at h"
    assert _divergence(False, "h", {}) == "first divergence h"
    one = LocalErrors("torch", "ok", compared=1, largest_ratio=0.0, largest_at="logits")
    assert explained_words(one, {}).startswith("judged at one tensor only, logits, the only one it exposes")
    # a whole model as one stretch uses little of its allowance: said in two figures, not as 0;
    # a share near the whole is floored (0.9996 is not 1)
    small = LocalErrors("executorch-xnnpack", "ok", compared=1, largest_ratio=4.37e-4, largest_at="logits")
    assert "exposes: 0.00044 of the allowance" in explained_words(small, {})
    near = LocalErrors("torch", "ok", compared=1, largest_ratio=0.9996, largest_at="logits")
    assert "exposes: 0.999 of the allowance" in explained_words(near, {})


def _ec_key(folder: Path, curve: object, name: str) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(curve)  # type: ignore[arg-type]
    ser = serialization
    (folder / f"{name}.key").write_bytes(
        key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    )
    (folder / f"{name}.pub").write_bytes(
        key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    )
    return folder / f"{name}.key"


def test_a_signed_certificate_round_trips_through_openssf_model_signing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """certify --key with a P-256 key: OpenSSF model-signing verifies STEM.model.sig over the
    model file (and refuses it once the file changes); it reads the certificate's own bundle,
    its key hint and signature included, and stops only at the predicate it does not know;
    sigstore's bundle model parses it; xbackend verifies it. A secp256k1 key is refused."""
    model_signing = pytest.importorskip("model_signing")
    from cryptography.hazmat.primitives.asymmetric import ec
    from sigstore_models.bundle.v1 import Bundle

    model = relu_model(tmp_path)
    key = _ec_key(tmp_path, ec.SECP256R1(), "release")
    out = str(tmp_path / "cert")
    code, text, err = run(capsys, "certify", str(model), "--backend", "reference", "--runs", "2", "--builds",
                          "2", "-o", out, "--key", str(key), "--no-progress")  # fmt: skip
    assert code == 0, err
    sig = tmp_path / "cert.model.sig"
    assert f"wrote {sig}: the model file signed in OpenSSF model-signing's format" in text
    verifier = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=tmp_path / "release.pub")
    verifier.verify(model, sig)  # raises if the file or the signature does not check
    bundle = (tmp_path / "cert.json").read_text("utf-8")
    assert Bundle.from_json(bundle).media_type == "application/vnd.dev.sigstore.bundle.v0.3+json"
    with pytest.raises(ValueError, match="Predicate type mismatch"):  # past its key and signature checks
        verifier.verify(model, tmp_path / "cert.json")
    pub = str(tmp_path / "release.pub")
    code, text, err = run(capsys, "verify", str(tmp_path / "cert.json"), "--key", pub, "--no-progress")
    assert code == 0 and "SIGNED: the signature checks with key" in text, err
    # certify again: its own signature file is replaced, never someone's
    code, _, err = run(capsys, "certify", str(model), "--backend", "reference", "--runs", "2", "--builds",
                       "2", "-o", out, "--key", str(key), "--no-progress")  # fmt: skip
    assert code == 0, err
    model.write_bytes(model.read_bytes() + b"\0")
    with pytest.raises(ValueError):
        verifier.verify(model, sig)
    k1 = _ec_key(tmp_path, ec.SECP256K1(), "k1")
    (tmp_path / "m").mkdir()
    code, _, err = run(capsys, "certify", str(relu_model(tmp_path / "m")), "--backend", "reference", "-o",
                       str(tmp_path / "c2"), "--key", str(k1), "--no-progress")  # fmt: skip
    assert code == 2
    one_line_error(
        err, "is an ECDSA key on curve secp256k1; certificates are signed with Ed25519 or ECDSA P-256"
    )


def test_every_test_docs_security_names_exists() -> None:
    """docs/security.md backs its promises with named tests: each name is a test of the suite."""
    import re

    text = (ROOT / "docs" / "security.md").read_text("utf-8")
    named = set(re.findall(r"`(test_\w+)`", text))
    defined = {
        m
        for f in (ROOT / "tests").rglob("test_*.py")
        for m in re.findall(r"^def (test_\w+)", f.read_text("utf-8"), re.M)
    }
    assert len(named) >= 10 and named <= defined, sorted(named - defined)


def test_the_terminal_never_receives_a_control_from_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever a command prints, to stdout or stderr, a C1 control (U+009B, CSI) or a
    bidirectional override (U+202E) is written out, never sent to the terminal raw."""
    from xbackend.cli.main import _visible_streams

    with _visible_streams():
        print("tensor y\u202eexe.gnp, then \x9b31m red")
        print("first divergence x\u2066", file=sys.stderr)
    out, err = capsys.readouterr()
    assert out == "tensor y\\u202eexe.gnp, then \\u009b31m red\n" and err == "first divergence x\\u2066\n"
