"""The second tester's classes that were internal errors (exit 4) or wrong exits, each a one-line
exit 2 (or the right verdict) now."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from onnx import TensorProto, helper
from roots import ROOT

from tests.cli_helpers import one_line_error, relu_model, run


def _typed(path: Path, where: str) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    (x if where == "input" else y).type.tensor_type.elem_type = 999
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


@pytest.mark.parametrize("where", ["input", "output"])
def test_an_element_type_onnx_does_not_define_is_one_line(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _typed(tmp_path / "m.onnx", where)
    for argv in (
        ["compare", str(model)],
        ["capture", str(model), "--backend", "ort-cpu", "-o", str(tmp_path / "cap")],
        ["certify", str(model), "--backend", "ort-cpu", "-o", str(tmp_path / "cert")],
    ):
        code, _, err = run(capsys, *argv, "--no-progress")
        assert code == 2, err
        one_line_error(
            err, f"graph {where} 'x' declares element type 999" if where == "input" else "'y' declares"
        )
    assert not (tmp_path / "cap").exists() and not (tmp_path / "cert.json").exists()


def test_a_model_name_that_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It exited 1 with an onnxruntime bindings error: ONNX Runtime takes UTF-8 paths alone."""
    model = relu_model(tmp_path)
    odd = os.fsdecode(bytes(tmp_path) + b"/m\xff.onnx")
    shutil.copy(model, odd)
    code, _, err = run(capsys, "compare", odd, "--no-progress")
    assert code == 2
    one_line_error(err, "has a name that is not valid UTF-8; rename it")


def test_a_backend_name_with_a_slash_stays_one_file_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report JSON naming a backend `a/b` made `report` write a figure into a folder a/ (or fail
    with exit 4): a runner's name is one file-name part in a figure's name."""
    model = relu_model(tmp_path)
    js = tmp_path / "r.json"
    argv = ["--modes", "ort-cpu", "--runs", "1", "--timed-runs", "3", "--probes", "none"]
    code, _, err = run(capsys, "compare", str(model), *argv, "--json", str(js), "--no-progress")
    assert code in (0, 1), err
    forged = tmp_path / "forged.json"
    forged.write_text(js.read_text("utf-8").replace('"ort-cpu', '"a/b'), "utf-8")
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = run(capsys, "report", str(forged), "-o", str(out / "f.md"))
    assert code == 0, err
    assert (out / "f.cost-a_b.png").is_file()
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == []


def test_certify_never_writes_beside_a_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """certify -o /dev/null wrote /dev/null.json and /dev/null.md (as root, /dev takes files)."""
    code, _, err = run(capsys, "certify", str(relu_model(tmp_path)), "--backend", "reference", "-o",
                       "/dev/null", "--no-progress")  # fmt: skip
    assert code == 2
    one_line_error(err, "-o /dev/null is a device or a pipe")
    assert not Path("/dev/null.json").exists()


def test_an_unsigned_certificates_false_claim_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unsigned certificate edited to claim batch-position held (the model has no batch axis:
    it does not apply) verified with exit 0; the claim is now re-checked and refused, exit 1."""
    model = relu_model(tmp_path)
    code, _, err = run(capsys, "certify", str(model), "--backend", "reference", "-o", str(tmp_path / "c"),
                       "--no-progress")  # fmt: skip
    assert code == 0, err
    cert = json.loads((tmp_path / "c.json").read_text("utf-8"))
    prop = next(p for p in cert["predicate"]["properties"] if p["name"] == "batch-position")
    assert prop["status"] == "not applicable"
    prop["status"], prop["evidence"] = "held", "bit-identical at every position"
    (tmp_path / "c.json").write_text(json.dumps(cert), "utf-8")
    code, out, err = run(capsys, "verify", str(tmp_path / "c.json"), "--allow-unsigned", "--no-progress")
    assert code == 1, out + err
    assert (
        "FALSE CLAIM: batch-position is held in the certificate, but it does not apply to this model; "
        "the claim is refused"
    ) in out
    assert "PASS" not in out


def test_stdout_closed_or_full_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    model = relu_model(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "xbackend", "compare", str(model), "--backends", "reference", "--runs", "1",
            "--no-progress"]  # fmt: skip
    with open("/dev/full", "w") as full:
        done = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "xbackend: error: cannot write to standard output (No space left on device)\n"
    closed = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=300, preexec_fn=lambda: os.close(1)
    )
    done = closed
    assert done.returncode == 2, done.stderr
    assert done.stderr == "xbackend: error: standard output is closed; run it with stdout open\n"


@pytest.mark.slow
def test_a_graph_past_the_layer_limit_is_refused_at_once_and_runs_at_its_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 100,000-node model had not finished after 240 s (ONNX Runtime's builds grow faster than
    linearly in the tensors they expose): past LAYER_NODE_LIMIT nodes the layer-by-layer run is
    refused before any engine starts, naming the limit, and the command it suggests runs."""
    import onnx

    from xbackend.comparison.run import LAYER_NODE_LIMIT

    n = LAYER_NODE_LIMIT + 1
    nodes = [helper.make_node("Relu" if i % 2 else "Neg", [f"t{i - 1}" if i else "x"],
                              [f"t{i}" if i < n - 1 else "y"]) for i in range(n)]  # fmt: skip
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    model = tmp_path / "big.onnx"
    onnx.save(
        helper.make_model(
            helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
        ),
        model,
    )
    code, _, err = run(capsys, "compare", str(model), "--no-progress")
    assert code == 2
    one_line_error(
        err, f"has {n:,} nodes, more than the {LAYER_NODE_LIMIT:,} xbackend compares layer by layer"
    )
    suggested = err.split("`")[1].split()
    assert suggested[:2] == ["xbackend", "compare"] and suggested[-1] == "--outputs-only"
    code, out, err = run(
        capsys, *suggested[1:], "--backends", "ort-cpu,reference", "--runs", "1", "--no-progress"
    )
    assert code in (0, 1), err
    assert "ort-cpu vs reference" in out


def test_many_feeds_run_through_a_binding_with_the_same_bits_and_shapes() -> None:
    """Past 256 feeds ONNX Runtime's run() checks names in quadratic time (minutes at 100,000), so
    run_session binds them instead: the same outputs bit for bit, 0-d scalars still 0-d."""
    import numpy as np
    import onnxruntime as ort

    from xbackend.runners.ort_cpu import run_session

    n = 300
    ins = [
        helper.make_tensor_value_info(f"i{k}", TensorProto.FLOAT, [] if k % 3 == 0 else [3]) for k in range(n)
    ]
    outs = [helper.make_tensor_value_info(f"o{k}", TensorProto.FLOAT, None) for k in range(n)]
    nodes = [
        helper.make_node("Sin", [f"i{k}"], [f"o{k}"])
        if k % 2
        else helper.make_node("Unsqueeze", [f"i{k}", "ax"], [f"o{k}"])
        for k in range(n)
    ]
    ax = helper.make_tensor("ax", TensorProto.INT64, [1], [0])
    g = helper.make_graph(nodes, "g", ins, outs, [ax])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {f"i{k}": rng.standard_normal(() if k % 3 == 0 else (3,)).astype(np.float32) for k in range(n)}
    names = [f"o{k}" for k in range(n)]
    bound = run_session(sess, names, [], feeds)
    plain = dict(zip(names, sess.run(names, feeds), strict=True))
    for k in names:
        assert bound[k].shape == plain[k].shape and bound[k].dtype == plain[k].dtype, k
        assert bound[k].tobytes() == plain[k].tobytes(), k
    assert bound["o0"].shape == (1,) and bound["o3"].shape == () and bound["o1"].shape == (3,)


@pytest.mark.parametrize("tool", ["dynamic", "fp16"])
def test_the_advice_snippet_runs_exactly_as_the_markdown_prints_it(tool: str, tmp_path: Path) -> None:
    """The Markdown held the advice's Python on one line, a literal \\x0a where its lines break
    (the JSON's was right): the block now keeps its lines, and run as printed, in a fresh process,
    it writes a model ONNX Runtime loads."""
    import subprocess
    import sys

    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from xbackend.candidates.convert import DYNAMIC, FP16, Converter, command
    from xbackend.report.candidate_section import _advice
    from xbackend.results.candidates import Advice, CandidateResult

    w = numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["y"], name="r"),
    ]
    original = tmp_path / "m.onnx"
    onnx.save(
        helper.make_model(
            helper.make_graph(nodes, "g", [x], [y], [w]),
            opset_imports=[helper.make_opsetid("", 17)],
            ir_version=9,
        ),
        original,
    )
    out = tmp_path / "kept.onnx"
    conv = Converter(DYNAMIC if tool == "dynamic" else FP16)
    code = command(conv, ["r"], str(original), str(original), str(out))
    advice = Advice(status="ok", converter=conv.tool, target="tokens", keep=("r",), command=code)
    lines = _advice(CandidateResult(path="c.onnx", sha256="", precision="int8", advice=advice))
    start = next(i for i, line in enumerate(lines) if line.startswith("```python"))
    end = lines.index("```", start + 1)
    printed = "\n".join(lines[start + 1 : end])
    assert printed == code.rstrip("\n") and "\\x0a" not in printed
    done = subprocess.run([sys.executable, "-c", printed], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
