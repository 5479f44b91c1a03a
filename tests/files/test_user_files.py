"""Every file a user names is looked at before it is read: a FIFO, a device, a folder, a link
loop, a name the system refuses or an archive numpy cannot read is one line with exit 2, at
once (never a hang, never /dev/zero read until memory runs out)."""

from __future__ import annotations

import os
import struct
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper

from tests.cli_helpers import one_line_error, relu_model, run
from xbackend.errors import InputError
from xbackend.files.npz import NpzError, read_npz
from xbackend.files.userfile import read_user_bytes, user_file

pytestmark = pytest.mark.unit  # the unit tier: make check


def _at_once(fn, *args):  # type: ignore[no-untyped-def]
    """fn(*args) in a thread that must finish within 10 s: a FIFO opened for reading would block."""
    box: dict[str, object] = {}

    def go() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed to the test
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), f"{fn.__name__} blocked"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


@pytest.fixture
def odd(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    return {"fifo": fifo, "folder": tmp_path, "device": Path("/dev/zero"), "loop": loop}


@pytest.mark.parametrize(
    "kind, said",
    [
        ("fifo", r"is a FIFO \(a named pipe\), not a file"),
        ("folder", "is a folder, not a file"),
        ("device", "is a character device, not a file"),
        ("loop", "is a symbolic link loop"),
    ],
)
def test_what_is_not_a_file_is_refused_before_it_is_opened(
    odd: dict[str, Path], kind: str, said: str
) -> None:
    with pytest.raises(InputError, match=said):
        _at_once(read_user_bytes, odd[kind], "the public key", "pass a PEM file")


def test_names_the_system_refuses_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="has a name part longer than 255 bytes"):
        user_file(tmp_path / ("x" * 300), "--inputs", "rename it")
    bad = os.fsdecode(bytes(tmp_path) + b"/caf\xe9.npz")  # a Latin-1 name: surrogates in Python
    with pytest.raises(InputError, match="has a name that is not valid UTF-8"):
        user_file(bad, "--inputs", "rename it")
    with pytest.raises(InputError, match="does not exist"):
        user_file(tmp_path / "none", "--inputs", "pass a file")
    (tmp_path / "big").write_bytes(b"k" * 100)
    with pytest.raises(InputError, match="is 100 bytes, more than such a file holds"):
        user_file(tmp_path / "big", "the private key", "pass a PEM file", limit=99)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file: no permission to refuse here")
def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "k.pub"
    p.write_text("x")
    p.chmod(0)
    with pytest.raises(InputError, match="cannot be read \\(no permission\\)"):
        read_user_bytes(p, "the public key", "pass a PEM file")


def test_keys_and_certificates_are_never_waited_on(
    odd: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO or /dev/zero as certificate, public key or private key: exit 2 at once."""
    for bad in (odd["fifo"], odd["device"]):
        code, _, err = _at_once(run, capsys, "verify", str(bad), "--allow-unsigned")
        assert code == 2
        one_line_error(err, "the certificate ")
        code, _, err = _at_once(run, capsys, "verify", str(tmp_path / "c.json"), "--key", str(bad))
        assert code == 2
        one_line_error(err, "the public key ")
    model = relu_model(tmp_path, (2, 4))
    code, _, err = _at_once(
        run, capsys, "certify", str(model), "--backend", "reference", "--key", str(odd["fifo"]), "-o",
        str(tmp_path / "cert"),
    )  # fmt: skip
    assert code == 2
    one_line_error(err, "the private key ")
    assert not (tmp_path / "cert.json").exists()


def test_test_data_that_is_not_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = relu_model(tmp_path, (2, 4))
    for kind in ("folder", "fifo"):
        d = tmp_path / kind
        d.mkdir()
        if kind == "folder":
            (d / "input_0.pb").mkdir()
        else:
            os.mkfifo(d / "input_0.pb")
        code, _, err = _at_once(
            run, capsys, "compare", str(model), "--inputs", str(d), "--backends", "reference", "--runs", "1",
            "--probes", "none",
        )  # fmt: skip
        assert code == 2, err
        one_line_error(err, "input_0.pb is not a file")


def _npz(path: Path, arrays: dict[str, np.ndarray], method: int = zipfile.ZIP_STORED) -> Path:
    np.savez(path, **arrays) if method == zipfile.ZIP_STORED else np.savez_compressed(path, **arrays)
    return path


def _patch_member(path: Path, offset_in_local_header: int, fmt: str, value: int) -> None:
    """Rewrite a field of the first member's local header and of its central directory entry."""
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset_in_local_header, value)  # local file header
    central = data.rfind(b"PK\x01\x02")
    struct.pack_into(fmt, data, central + offset_in_local_header + 2, value)  # shifted by 'version made by'
    path.write_bytes(bytes(data))


def test_archives_numpy_cannot_read_are_one_line_each(tmp_path: Path) -> None:
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    encrypted = _npz(tmp_path / "enc.npz", x)
    _patch_member(encrypted, 6, "<H", 0x1)  # general purpose flag: encrypted
    deflate64 = _npz(tmp_path / "d64.npz", x)
    _patch_member(deflate64, 8, "<H", 9)  # compression method 9: deflate64
    crc = _npz(tmp_path / "crc.npz", x)
    _patch_member(crc, 14, "<I", 0xDEADBEEF)  # a wrong CRC-32
    bomb = _npz(tmp_path / "bomb.npz", {"x": np.zeros((64, 1 << 20), np.float32)}, zipfile.ZIP_DEFLATED)
    assert bomb.stat().st_size < 1 << 20
    for path, said in (
        (encrypted, "is encrypted, which numpy cannot read"),
        (deflate64, "is compressed with zip method 9"),
        (crc, "Bad CRC-32"),
        (bomb, "as a zip bomb does"),
    ):
        with pytest.raises(NpzError, match=said):
            read_npz(path)


def test_export_and_decode_read_archives_as_compare_does(tmp_path: Path) -> None:
    from xbackend.comparison.decode import _given_prompts
    from xbackend.errors import ExportError
    from xbackend.execution.decoding import Convention
    from xbackend.export.example_inputs import read_examples

    bomb = _npz(tmp_path / "bomb.npz", {"input_ids": np.zeros((64, 1 << 20), np.int64)}, zipfile.ZIP_DEFLATED)
    with pytest.raises(ExportError, match="as a zip bomb does"):
        read_examples(bomb)
    with pytest.raises(InputError, match="input_ids declares 67108864 tokens, more than 16777216"):
        _given_prompts(str(bomb), Convention())
    fifo = tmp_path / "prompts.npz"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is a FIFO"):
        _at_once(_given_prompts, str(fifo), Convention())
    ok = _npz(tmp_path / "p.npz", {"input_ids": np.array([[1, 2, 3]], np.int64)})
    (row,) = _given_prompts(str(ok), Convention())
    assert row.tolist() == [1, 2, 3]
    t = numpy_helper.from_array(np.ones((2, 2), np.float32), "x")
    (tmp_path / "pb").mkdir()
    (tmp_path / "pb" / "input_0.pb").write_bytes(t.SerializeToString())
    assert read_examples(tmp_path / "pb")["x"].tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_a_candidate_or_option_typo_is_a_usage_error(
    odd: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anything runs: exit 2, not a comparison that ends in a WARN or a failed backend."""
    model = relu_model(tmp_path, (2, 4))
    base = ["compare", str(model), "--backends", "ort-cpu", "--runs", "1", "--probes", "none"]
    for cand, said in (
        (str(tmp_path / "missing.onnx"), "missing.onnx does not exist"),
        (str(odd["fifo"]), r"is a FIFO \(a named pipe\), not a file"),
        (str(odd["device"]), "is a character device, not a file"),
        (f"{model}@nosuch", "unknown backend 'nosuch'; known backends: "),
    ):
        code, out, err = _at_once(run, capsys, *base, "--candidate", cand)
        assert code == 2 and out == "", (cand, out)
        one_line_error(err, said)
    code, _, err = run(capsys, *base, "--set", "ort-cpu.threads=99999999999999999999")
    assert code == 2
    one_line_error(err, "ort-cpu option threads must be at most 2147483647")


def test_export_never_writes_over_the_module_or_someones_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """export -o is checked before the module is loaded: someone's file, the module itself, a FIFO
    and a weights file beside an output that is not an export are refused and left as they were;
    an earlier export is replaced, as a re-run expects."""
    mod = tmp_path / "mod.py"
    source = "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x.relu()\n"
    mod.write_text(source + "def build():\n    return M()\n", "utf-8")
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n", "utf-8")
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    (tmp_path / "theirs.onnx.data").write_bytes(b"their weights")
    spec = f"{mod}:build"
    for out, said in (
        (notes, "exists and xbackend did not write it"),
        (mod, "is an input of this command"),
        (fifo, "is not a regular file (a device or a pipe)"),
        (tmp_path / "theirs.onnx", "theirs.onnx.data exists and xbackend did not write it"),
    ):
        code, out_, err = _at_once(run, capsys, "export", "torch", spec, "-o", str(out), "--input", "x=2,3")
        assert code == 2 and out_ == "", (out, err)
        one_line_error(err, said)
    assert notes.read_text("utf-8") == "my notes\n" and mod.read_text("utf-8").startswith(source)
    assert (tmp_path / "theirs.onnx.data").read_bytes() == b"their weights"
    again = tmp_path / "m.onnx"
    for _ in range(2):
        code, _, err = run(capsys, "export", "torch", spec, "-o", str(again), "--input", "x=2,3")
        assert code == 0, err


def test_keygen_writes_both_keys_whole_or_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """-o /dev/null is refused (the keys would land in /dev); a public key that cannot be written
    (a full disk) takes the private one with it: no half pair, no temp file."""
    import errno

    from xbackend.files import attest

    code, _, err = run(capsys, "keygen", "-o", "/dev/null")
    assert code == 2 and not Path("/dev/null.key").exists()
    one_line_error(err, "-o /dev/null is a device or a pipe")
    whole = attest._whole_new_file

    def full_at_the_public_key(path: Path, data: bytes, mode: int) -> None:
        if path.suffix == ".pub":
            raise OSError(errno.ENOSPC, "No space left on device")
        whole(path, data, mode)

    monkeypatch.setattr(attest, "_whole_new_file", full_at_the_public_key)
    code, _, err = run(capsys, "keygen", "-o", str(tmp_path / "k"))
    assert code == 2 and list(tmp_path.iterdir()) == []
    one_line_error(err, "k.pub: No space left on device; nothing was kept")
    monkeypatch.setattr(attest, "_whole_new_file", whole)
    code, _, err = run(capsys, "keygen", "-o", str(tmp_path / "ok"))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.key", "ok.pub"]
    assert (tmp_path / "ok.key").stat().st_mode & 0o777 == 0o600


def test_a_key_and_allow_unsigned_exclude_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With both, a stripped and edited certificate passed as VERIFIED: now one line, exit 2,
    before the certificate is read."""
    code, out, err = run(
        capsys, "verify", str(tmp_path / "c.json"), "--key", str(tmp_path / "k.pub"), "--allow-unsigned"
    )
    assert code == 2 and out == ""
    one_line_error(err, "--key and --allow-unsigned exclude each other")
