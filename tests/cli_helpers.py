"""Running the CLI in-process from tests, the one-line error every failure must give, and the
smallest model to run it on."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from xbackend.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, pattern: str) -> None:
    """One line on stderr, holding `pattern` as text or, failing that, as a regular expression."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("xbackend: error: ")
    assert pattern in lines[0] or re.search(pattern, lines[0]), lines[0]


def relu_model(folder: Path, dims: tuple[int | str, ...] = (4,), name: str = "relu.onnx") -> Path:
    """y = Relu(x), x float32 of shape `dims`, saved as folder/name."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(dims))
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = folder / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path
