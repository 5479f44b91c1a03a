"""Files from others are read inside their own folder: an ONNX test-data folder's external data
and its links resolve in that folder alone, never in the working directory or through a link
out; a secret planted beside the working directory reaches no output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from tests.cli_helpers import one_line_error, relu_model, run

SECRET = b"SECRET-" + bytes(range(256)) * 4  # 1031 bytes no feed could hold by chance


def _external_pb(folder: Path, location: str) -> Path:
    """input_0.pb for x whose 32 bytes lie in `location`, as numpy_helper's external layout says."""
    folder.mkdir(parents=True, exist_ok=True)
    t = numpy_helper.from_array(np.zeros((2, 4), np.float32), "x")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "32")):
        t.external_data.add(key=k, value=v)
    (folder / "input_0.pb").write_bytes(t.SerializeToString())
    return folder


def _no_secret_in(root: Path) -> None:
    """No file xbackend may have written holds the secret's bytes (the planted ones aside)."""
    for p in root.rglob("*"):
        planted = p.name.startswith("secret") or "outside" in p.relative_to(root).parts or p.is_symlink()
        if p.is_file() and not planted:
            assert SECRET[:32] not in p.read_bytes(), p


@pytest.fixture
def plant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory holds secret.bin; the inputs folder beside it does not."""
    (tmp_path / "secret.bin").write_bytes(SECRET)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.bin").write_bytes(SECRET)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "location, said",
    [
        ("secret.bin", "is not a file in"),  # onnx's helpers read it from the working directory
        ("../secret.bin", "leads out of its own folder"),
        (str(Path("/") / "etc" / "hostname"), "is not a path inside its own folder"),
    ],
)
def test_test_data_external_data_stays_in_its_folder(
    plant: Path, location: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = relu_model(plant, (2, 4))
    d = _external_pb(plant / "d", location)
    for argv in (
        ["compare", str(model), "--inputs", str(d), "--backends", "reference", "--runs", "1",
         "--probes", "none", "--report", str(plant / "r" / "r.md"), "--json", str(plant / "r" / "r.json")],
        ["capture", str(model), "--backend", "reference", "--inputs", str(d), "-o", str(plant / "cap")],
    ):  # fmt: skip
        code, out, err = run(capsys, *argv)
        assert code == 2, (argv[0], out, err)
        one_line_error(err, said)
        assert "tensor 'x''s external data" in err
    assert not (plant / "cap").exists() and not (plant / "r").exists()
    _no_secret_in(plant)


def test_a_linked_input_pb_is_not_followed_out_of_its_folder(
    plant: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = relu_model(plant, (2, 4))
    outside = plant / "outside" / "input_0.pb"
    outside.write_bytes(numpy_helper.from_array(np.frombuffer(SECRET[:32], np.float32).reshape(2, 4), "x")
                        .SerializeToString())  # fmt: skip
    d = plant / "d"
    d.mkdir()
    (d / "input_0.pb").symlink_to(outside)
    code, _, err = run(capsys, "capture", str(model), "--backend", "reference", "--inputs", str(d),
                       "-o", str(plant / "cap"))  # fmt: skip
    assert code == 2
    one_line_error(err, "input_0.pb names 'input_0.pb', which leads out of its own folder")
    assert not (plant / "cap").exists()
    _no_secret_in(plant)


def test_external_data_beside_the_pb_file_is_read(plant: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The layout the ONNX test data uses, with the data file in the same folder: read, compared."""
    model = relu_model(plant, (2, 4))
    d = _external_pb(plant / "d", "x.bin")
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3.5
    (d / "x.bin").write_bytes(x.tobytes())
    import xbackend

    r = xbackend.compare(model, inputs=str(d), backends=["ort-cpu", "reference"], runs=1, probes="none")
    assert r.feeds.source == str(d)
    from xbackend.model.inputs import load_feeds
    from xbackend.model.load import load_model

    spec, _ = load_model(model)
    np.testing.assert_array_equal(load_feeds(d, spec).arrays["x"], x)


def test_export_reads_test_data_as_compare_does(plant: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """export torch --inputs takes compare's reader: the same refusal, before any module is loaded."""
    d = _external_pb(plant / "d", "secret.bin")
    (plant / "mod.py").write_text(
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x.relu()\n"
        "def build():\n    return M()\n"
    )
    code, _, err = run(capsys, "export", "torch", str(plant / "mod.py") + ":build",
                       "-o", str(plant / "e.onnx"), "--inputs", str(d))  # fmt: skip
    assert code == 2
    one_line_error(err, "is not a file in")
    assert not (plant / "e.onnx").exists()
    _no_secret_in(plant)
