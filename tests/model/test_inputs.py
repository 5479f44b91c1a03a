"""Seeded feeds, --shape and --inputs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from xbackend.errors import InputError
from xbackend.model.inputs import generate_feeds, load_feeds, parse_shape
from xbackend.model.load import ModelSpec
from xbackend.model.samples import build

pytestmark = pytest.mark.unit  # the unit tier: make check


def spec_of(m: onnx.ModelProto) -> ModelSpec:
    return ModelSpec.from_proto(m, "m.onnx", "0" * 64)


def mixed() -> ModelSpec:
    """Inputs of every kind of dtype."""
    ins = [
        helper.make_tensor_value_info("f", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("h", TensorProto.FLOAT16, [4]),
        helper.make_tensor_value_info("b16", TensorProto.BFLOAT16, [4]),
        helper.make_tensor_value_info("i", TensorProto.INT64, [5]),
        helper.make_tensor_value_info("u", TensorProto.UINT8, [5]),
        helper.make_tensor_value_info("m", TensorProto.BOOL, [6]),
    ]
    nodes = [helper.make_node("Identity", [i.name], [f"{i.name}_out"]) for i in ins]
    outs = [helper.make_tensor_value_info(f"{i.name}_out", i.type.tensor_type.elem_type, None) for i in ins]
    return spec_of(helper.make_model(helper.make_graph(nodes, "mixed", ins, outs)))


def test_every_dtype_is_generated_and_seeded() -> None:
    spec = mixed()
    a = generate_feeds(spec, seed=7)
    assert {k: str(v.dtype) for k, v in a.arrays.items()} == {
        "f": "float32",
        "h": "float16",
        "b16": "bfloat16",
        "i": "int64",
        "u": "uint8",
        "m": "bool",
    }
    assert a.arrays["i"].min() >= 0 and a.arrays["i"].max() < 16
    assert a.arrays["m"].any() and not a.arrays["m"].all()
    b = generate_feeds(spec, seed=7)
    assert a.sha256 == b.sha256
    assert generate_feeds(spec, seed=8).sha256 != a.sha256


def test_known_hash_of_seed_0() -> None:
    feeds = generate_feeds(spec_of(build("mlp_layernorm")), seed=0)
    assert feeds.arrays["x"].shape == (1, 16, 64)
    assert float(feeds.arrays["x"].ravel()[0]) == pytest.approx(float(feeds.arrays["x"].ravel()[0]))
    again = generate_feeds(spec_of(build("mlp_layernorm")), seed=0)
    assert np.array_equal(feeds.arrays["x"], again.arrays["x"]) and len(feeds.sha256) == 64


def test_dynamic_dims_need_shape() -> None:
    spec = spec_of(build("convnet"))
    with pytest.raises(
        InputError, match=r"input 'image' has dynamic dimension\(s\) N .*--shape image=1,3,32,32"
    ):
        generate_feeds(spec)
    feeds = generate_feeds(spec, shapes={"image": (2, 3, 32, 32)})
    assert feeds.arrays["image"].shape == (2, 3, 32, 32)


def test_shape_must_match_fixed_dims() -> None:
    spec = spec_of(build("convnet"))
    with pytest.raises(InputError, match=r"shape \[2, 4, 32, 32\], but the model expects \[N,3,32,32\]"):
        generate_feeds(spec, shapes={"image": (2, 4, 32, 32)})
    with pytest.raises(InputError, match="names 'img', which the model does not take; its inputs are image"):
        generate_feeds(spec, shapes={"img": (1, 3, 32, 32)})


@pytest.mark.parametrize("text", ["x", "=1,2", "x=1,a", "x=-1"])
def test_parse_shape_errors(text: str) -> None:
    with pytest.raises(InputError, match="--shape"):
        parse_shape(text)


def test_parse_shape() -> None:
    assert parse_shape("input.1=1,3,224,224") == ("input.1", (1, 3, 224, 224))


def test_npz_inputs(tmp_path: Path) -> None:
    spec = spec_of(build("convnet"))
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "ok.npz", image=x)
    feeds = load_feeds(tmp_path / "ok.npz", spec)
    assert feeds.source.endswith("ok.npz") and feeds.seed is None
    assert np.array_equal(feeds.arrays["image"], x)
    np.savez(tmp_path / "f64.npz", image=x.astype(np.float64))
    with pytest.raises(
        InputError, match=r"'image' is float64, the model expects float32; save it with .astype\('float32'\)"
    ):
        load_feeds(tmp_path / "f64.npz", spec)
    np.savez(tmp_path / "extra.npz", image=x, other=x)
    with pytest.raises(InputError, match="names 'other', which the model does not take"):
        load_feeds(tmp_path / "extra.npz", spec)
    np.savez(tmp_path / "empty.npz")
    with pytest.raises(InputError, match=r"lacks input\(s\) image"):
        load_feeds(tmp_path / "empty.npz", spec)
    (tmp_path / "junk.npz").write_text("junk")
    with pytest.raises(
        InputError, match=r"junk.npz: not an \.npz \(not a zip archive\); save it with numpy.savez"
    ):
        load_feeds(tmp_path / "junk.npz", spec)


def _language_like(metadata: dict[str, str] | None = None) -> ModelSpec:
    """Token ids into a 100-row table, a mask, positions and timesteps, as exporters name them."""
    ins = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [2, 8]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [2, 8]),
        helper.make_tensor_value_info("key_padding_mask", TensorProto.BOOL, [2, 8]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [2, 8]),
        helper.make_tensor_value_info("timestep", TensorProto.FLOAT, [2]),
        helper.make_tensor_value_info("timesteps", TensorProto.INT64, [64]),
    ]
    table = helper.make_tensor("table", TensorProto.FLOAT, [100, 4], np.ones(400, np.float32).tolist())
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["emb"])]
    nodes += [helper.make_node("Identity", [i.name], [f"{i.name}_out"]) for i in ins[1:]]
    outs = [helper.make_tensor_value_info("emb", TensorProto.FLOAT, None)]
    outs += [
        helper.make_tensor_value_info(f"{i.name}_out", i.type.tensor_type.elem_type, None) for i in ins[1:]
    ]
    m = helper.make_model(helper.make_graph(nodes, "lm", ins, outs, [table]))
    helper.set_model_props(m, metadata or {})
    return spec_of(m)


def test_named_inputs_get_what_a_model_sees() -> None:
    """A mask is ones (no padding), positions count 0..N-1, a timestep lies in a diffusion
    schedule's [0, 1000), token ids index their table; --range still decides where given, and
    the feeds say how each input was made."""
    f = generate_feeds(_language_like(), seed=3)
    a = f.arrays
    assert a["attention_mask"].dtype == np.int64 and (a["attention_mask"] == 1).all()
    assert a["key_padding_mask"].dtype == np.bool_ and a["key_padding_mask"].all()
    assert a["position_ids"].tolist() == [list(range(8))] * 2
    assert a["timestep"].min() >= 0 and a["timestep"].max() < 1000 and a["timestep"].max() > 16
    assert a["timesteps"].max() >= 100 and a["timesteps"].max() < 1000
    assert a["input_ids"].min() >= 0 and a["input_ids"].max() < 100 and a["input_ids"].max() >= 16
    made = dict(f.made)
    assert made["attention_mask"] == "ones (a mask: no position padded)"
    assert made["position_ids"] == "0, 1, ..., 7 along the last axis (positions)"
    assert made["timestep"] == "uniform in [0, 1000) (a diffusion timestep)"
    assert made["input_ids"] == "integers in [0, 100) (indices into a table of 100 rows)"
    assert dict(f.ranges)["timesteps"] == "[0, 1000)"  # the batch probe draws its other samples alike
    ranged = generate_feeds(_language_like(), seed=3, ranges={"attention_mask": (0, 2)})
    assert set(np.unique(ranged.arrays["attention_mask"])) == {0, 1}
    assert dict(ranged.made)["attention_mask"] == "integers in [0, 2) (--range)"


def test_ranges_given_at_export_are_kept_in_the_model_and_checked() -> None:
    """xbackend export torch --range writes xbackend.input_ranges; compare draws from it. A
    model is someone else's file: anything but NAME: [LO, HI] pairs naming inputs is ignored,
    and the feeds say so."""
    from xbackend.model.inputs import META_RANGES

    f = generate_feeds(_language_like({META_RANGES: '{"input_ids": [5, 7], "attention_mask": [0, 2]}'}))
    assert set(np.unique(f.arrays["input_ids"])) == {5, 6}
    assert set(np.unique(f.arrays["attention_mask"])) == {0, 1}
    assert dict(f.made)["input_ids"] == "integers in [5, 7) (the range given at export, kept in the model)"
    for bad, why in [
        ('{"input_ids": [7, 5]}', "a range is not finite with LO < HI"),
        ('{"nope": [0, 2]}', "not NAME: [LO, HI] pairs naming inputs"),
        ("[1, 2]", "not NAME: [LO, HI] pairs naming inputs"),
        ("{", "Expecting property name"),
    ]:
        g = generate_feeds(_language_like({META_RANGES: bad}))
        assert g.arrays["input_ids"].max() < 100
        assert why in dict(g.made)["input_ids"], dict(g.made)["input_ids"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "input_ids=0:batch,1:sequence",
            "one axis per --dynamic: --dynamic input_ids=0:batch --dynamic input_ids=1:sequence",
        ),
        ("x=0:ba-tch", "the dimension name 'ba-tch' must be an identifier"),
    ],
)
def test_dynamic_dimension_names_are_identifiers(text: str, says: str) -> None:
    from xbackend.errors import ExportError
    from xbackend.export.example_inputs import parse_dynamic

    with pytest.raises(ExportError, match=re.escape(says)):
        parse_dynamic([text])
    assert parse_dynamic(["x=0:batch", "x=1:seq"]) == {"x": {0: "batch", 1: "seq"}}
