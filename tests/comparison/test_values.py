"""Every ONNX value kind through xbackend's own storage, and compared element by element."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from xbackend.files.storage import ValueFile, save_values
from xbackend.numerics.metrics import TensorDiff, diff_values, is_constant
from xbackend.numerics.values import normalize, value_sha256

EXOTIC = [
    "bfloat16",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn",
    "int4",
    "uint4",
    "int2",
    "uint2",
]


def values() -> dict[str, object]:
    rng = np.random.default_rng(0)
    out: dict[str, object] = {
        f"t_{n}": rng.standard_normal((3, 5)).astype(np.float32).astype(getattr(ml_dtypes, n)) for n in EXOTIC
    }
    out.update(
        scalar=np.array(2.5, np.float32),
        empty=np.zeros((0, 4), np.float16),
        strings=np.array(["a", "bé", ""], dtype=object),
        raw_bytes=np.array([b"\xff\xfe", b"ok"], dtype=object),
        seq=[np.arange(3, dtype=np.int64), np.ones((2, 2), np.float32)],
        nested=[[np.array(1, np.int8)], []],
        optional=None,
        mapping={3: np.array([1.0], np.float32), 1: np.array([2.0], np.float32)},
    )
    return out


def test_every_value_kind_survives_storage_bit_for_bit(tmp_path: Path) -> None:
    vals = {k: normalize(v) for k, v in values().items()}
    save_values(tmp_path / "v.xbv", vals)
    with ValueFile(tmp_path / "v.xbv") as f:
        back = f.load_all()
    assert list(back) == list(vals)
    for n in EXOTIC:
        a, b = vals[f"t_{n}"], back[f"t_{n}"]
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
        assert str(b.dtype) == n and b.shape == (3, 5) and a.tobytes() == b.tobytes()
    assert back["scalar"].shape == () and float(back["scalar"]) == 2.5  # type: ignore[union-attr,arg-type]
    assert back["empty"].shape == (0, 4) and str(back["empty"].dtype) == "float16"  # type: ignore[union-attr]
    assert list(back["strings"]) == ["a", "bé", ""]  # type: ignore[arg-type]
    assert next(iter(back["raw_bytes"])).encode("utf-8", "surrogateescape") == b"\xff\xfe"  # type: ignore[arg-type]
    assert back["optional"] is None and back["nested"][1] == []  # type: ignore[index]
    assert list(back["mapping"]) == [1, 3]  # type: ignore[arg-type]
    assert value_sha256(back) == value_sha256(vals)


def test_truncated_and_foreign_files_are_refused(tmp_path: Path) -> None:
    save_values(tmp_path / "v.xbv", {"x": np.ones(1000, np.float32)})
    data = (tmp_path / "v.xbv").read_bytes()
    (tmp_path / "cut.xbv").write_bytes(data[:-5])
    with pytest.raises(ValueError, match="truncated"):
        ValueFile(tmp_path / "cut.xbv")
    (tmp_path / "npz.xbv").write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ValueError, match="not an xbackend value file"):
        ValueFile(tmp_path / "npz.xbv")


def test_normalize_keeps_scalars_and_unifies_strings() -> None:
    assert normalize(np.float32(3)).shape == ()  # type: ignore[union-attr]
    assert normalize(np.array(["x", "y"])).dtype == object  # type: ignore[union-attr]
    assert value_sha256({"s": normalize(np.array([b"x"], dtype=object))}) == value_sha256(
        {"s": normalize(np.array(["x"]))}
    )
    assert normalize((np.ones(1),))[0].shape == (1,)  # type: ignore[index]


def test_sequences_compare_element_by_element() -> None:
    a = [np.array([1.0, 2.0], np.float32), np.array([3.0], np.float32)]
    b = [np.array([1.0, 2.0], np.float32), np.nextafter(np.array([3.0], np.float32), np.float32(4))]
    diffs = diff_values("rows", a, b)
    assert [d.name for d in diffs] == ["rows[0]", "rows[1]"]
    assert diffs[0].bitwise_equal and diffs[1].max_ulp == 1
    (short,) = diff_values("rows", a, a[:1])
    assert short.status == "structure_mismatch" and short.detail == "sequence of 2 vs sequence of 1"
    (empty,) = diff_values("opt", None, None)
    assert empty.bitwise_equal and empty.dtype == "optional"
    (vs,) = diff_values("opt", np.ones(2), None)
    assert vs.status == "structure_mismatch" and vs.detail == "float64[2] vs empty optional"
    maps = diff_values("m", {1: np.ones(1)}, {1: np.zeros(1)})
    assert [d.name for d in maps] == ["m{1}"] and maps[0].max_abs == 1.0


def test_sub_byte_and_exponent_only_floats_in_their_own_ulps() -> None:
    f4 = ml_dtypes.float4_e2m1fn
    # e2m1 values in order: 0, 0.5, 1, 1.5, 2, 3, 4, 6: 1.0 and 1.5 are 1 ULP apart, 0.5 and -0.5 two.
    d = TensorDiff.from_arrays("f4", np.array([1.0, 0.5], f4), np.array([1.5, -0.5], f4))
    assert d.max_ulp == 2 and d.mismatches == 2
    e8 = ml_dtypes.float8_e8m0fnu
    d = TensorDiff.from_arrays("e8", np.array([1.0], e8), np.array([4.0], e8))  # powers of two: 2 steps
    assert d.max_ulp == 2
    i4 = ml_dtypes.int4
    d = TensorDiff.from_arrays("i4", np.array([-8, 7], i4), np.array([7, 7], i4))
    assert d.max_abs == 15.0 and d.max_ulp is None and d.mismatches == 1


def test_signed_zeros_differ_in_bits_but_not_in_ulps() -> None:
    d = TensorDiff.from_arrays("z", np.array([0.0, 1.0], np.float32), np.array([-0.0, 1.0], np.float32))
    assert not d.bitwise_equal and d.max_ulp == 0 and d.zero_sign_mismatch == 1
    assert d.zero_ulp_reason() == "1 signed zero(s) (+0 vs -0)"
    nan_a = np.array([np.nan], np.float32)
    nan_b = np.array([0x7FC00001], np.uint32).view(np.float32)
    d = TensorDiff.from_arrays("n", nan_a, nan_b)
    assert not d.bitwise_equal and d.nan_payload_mismatch == 1 and d.nan_mismatch == 0


def test_constant_tensors() -> None:
    assert is_constant(np.array([0.0, -0.0, 0.0], np.float32))  # +0 and -0 are one value
    assert not is_constant(np.array([0.0, 1.0], np.float32))
    assert not is_constant(np.array([1.0], np.float32))  # one element proves nothing either way
    assert TensorDiff.from_arrays("z", np.zeros(4), np.zeros(4)).constant


def test_a_worker_imports_none_of_the_comparator() -> None:
    """Each worker process starts with `import xbackend`: the package's names load on first use,
    so a worker does not pay for the comparator, onnx or the report writers."""
    import subprocess
    import sys

    code = "import sys, xbackend, xbackend.execution.worker; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(eval(out))
    assert "xbackend.execution.worker" in loaded
    assert not loaded & {"xbackend.comparison", "xbackend.report", "onnx", "xbackend.export.torch_onnx"}


def test_the_package_names_stay_the_api_after_submodule_imports() -> None:
    import xbackend
    import xbackend.comparison.run  # binds the submodule on the package, as any import would

    assert callable(xbackend.compare) and xbackend.compare.__name__ == "compare"
    assert xbackend.TensorDiff.__name__ == "TensorDiff"
