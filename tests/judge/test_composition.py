"""Inside a stretch the nodes' roundings compose as a numerical analyst composes them: Higham &
Mary's λ·sqrt(n) parts of different nodes root-sum-square (independent roundings, the same λ),
the rest first order and worst case, and errors meeting from two paths (which may share a source)
add linearly. A correct engine's fused stretch stays under the composed bound; a float16 rounding
at any one of its nodes is past it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from xbackend.bounds.element import AUX, allowance, unit_roundoff
from xbackend.bounds.propagation import PROP
from xbackend.bounds.rules import node_bound
from xbackend.judge.judged_graph import judged_model
from xbackend.runners.oracle import promote_to_float64

pytestmark = pytest.mark.unit  # the unit tier: make check

U = unit_roundoff("float32")
WIDTH, ROWS = 256, 8
F = onnx.TensorProto.FLOAT


def _model(
    nodes: list[onnx.NodeProto], ins: dict[str, list[int]], out: tuple[str, list[int]], **consts: np.ndarray
) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "stretch",
        [helper.make_tensor_value_info(n, F, s) for n, s in ins.items()],
        [helper.make_tensor_value_info(out[0], F, out[1])],
        [onnx.numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 9
    return proto


def _shapes(proto: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inferred = onnx.shape_inference.infer_shapes(proto).graph
    return {
        v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
        for v in (*inferred.value_info, *inferred.input, *inferred.output)
    }


def _evaluate(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    run = ReferenceEvaluator(promote_to_float64(proto))
    names = [o.name for o in proto.graph.output]
    return dict(zip(names, run.run(names, feeds), strict=True))


def test_two_products_compose_root_sum_square() -> None:
    """x -> h -> y through two products of width 256, h not exposed: h's allowance reaches y
    first order, and of it and y's own, the λ·sqrt(n+1)·M parts add root-sum-square."""
    rng = np.random.default_rng(0)
    w0, w1 = ((rng.standard_normal((WIDTH, WIDTH)) / 16).astype(np.float32) for _ in range(2))
    proto = _model(
        [helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("MatMul", ["h", "w1"], ["y"])],
        {"x": [ROWS, WIDTH]},
        ("y", [ROWS, WIDTH]),
        w0=w0,
        w1=w1,
    )
    shapes = _shapes(proto)
    judged = judged_model(proto, shapes, {"y": "float32"})
    assert "root-sum-square" in judged.composed["y"]
    x = rng.standard_normal((ROWS, WIDTH))
    got = _evaluate(judged.proto, {"x": x})[PROP + "y"]
    bound, _, _ = node_bound(proto.graph.node[0], shapes, 18)
    a0, a1 = np.abs(w0.astype(np.float64)), np.abs(w1.astype(np.float64))
    h = x @ w0.astype(np.float64)
    m_h, m_y = np.abs(x) @ a0, np.abs(h) @ a1  # a product's M: |its operand| @ |W|
    p = bound.prob_b
    inherited = U * (np.abs(h) + (bound.b - p) * m_h) @ a1  # first order, worst case
    rss = np.sqrt(((U * p * m_h) @ a1) ** 2 + (U * p * m_y) ** 2)
    expected = inherited + (U * p * m_h) @ a1 - ((U * p * m_h) @ a1 + U * p * m_y - rss)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    worst_case = U * (np.abs(h) + bound.b * m_h) @ a1
    # the inherited part, carried by |W| first order, is the larger: root-sum-square saves most
    # of y's own λ·sqrt(n+1)·M against adding it
    saved = (worst_case - got) / (U * p * m_y)
    assert 0.7 < float(np.median(saved)) < 1.0, np.median(saved)


def _attention() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An attention core as one kernel (flash attention): scores, scale, softmax, weighted sum."""
    b, h, t, d = 1, 2, 64, 32
    proto = _model(
        [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", "kt"], ["s"]),
            helper.make_node("Mul", ["s", "scale"], ["z"]),
            helper.make_node("Softmax", ["z"], ["p"], axis=-1),
            helper.make_node("MatMul", ["p", "v"], ["o"]),
        ],
        {n: [b, h, t, d] for n in "qkv"},
        ("o", [b, h, t, d]),
        scale=np.array(d**-0.5),
    )
    feeds = {n: 2 * np.random.default_rng(k).standard_normal((b, h, t, d)) for k, n in enumerate("qkv")}
    return proto, feeds


def _linear_gelu() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A linear layer with its erf GELU epilogue as one kernel, as exported (seven nodes)."""
    rng = np.random.default_rng(3)
    make = helper.make_node
    proto = _model(
        [
            make("MatMul", ["x", "w"], ["m"]),
            make("Add", ["m", "b"], ["a"]),
            make("Div", ["a", "r2"], ["d"]),
            make("Erf", ["d"], ["e"]),
            make("Add", ["e", "one"], ["e1"]),
            make("Mul", ["a", "e1"], ["g"]),
            make("Mul", ["g", "half"], ["o"]),
        ],
        {"x": [ROWS, WIDTH]},
        ("o", [ROWS, WIDTH]),
        w=rng.standard_normal((WIDTH, WIDTH)) / 16,
        b=rng.standard_normal(WIDTH) / 10,
        r2=np.array(2**0.5),
        one=np.array(1.0),
        half=np.array(0.5),
    )
    return proto, {"x": np.random.default_rng(5).standard_normal((ROWS, WIDTH))}


def _rounded_at(proto: onnx.ModelProto, t: str) -> onnx.ModelProto:
    """`proto` with tensor `t` rounded to float16 before any node reads it."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    nodes = list(out.graph.node)
    for n in nodes:
        n.input[:] = [f"{t}/f32" if i == t else i for i in n.input]
    k = next(i for i, n in enumerate(nodes) if t in n.output) + 1
    nodes[k:k] = [
        helper.make_node("Cast", [t], [f"{t}/f16"], to=onnx.TensorProto.FLOAT16),
        helper.make_node("Cast", [f"{t}/f16"], [f"{t}/f32"], to=F),
    ]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


@pytest.mark.parametrize("stretch", ["attention", "linear-gelu"])
def test_a_fused_stretch_holds_a_correct_engine_and_catches_float16_at_each_node(stretch: str) -> None:
    """The stretch's output allowed its own rounding plus every hidden node's, composed: ONNX
    Runtime's float32 run stays well inside; a float16 rounding of any one hidden tensor is past."""
    import onnxruntime as ort

    proto, feeds = _attention() if stretch == "attention" else _linear_gelu()
    shapes = _shapes(proto)
    judged = judged_model(proto, shapes, {"o": "float32"})
    f32 = {k: v.astype(np.float32) for k, v in feeds.items()}
    got = _evaluate(judged.proto, {k: v.astype(np.float64) for k, v in f32.items()})
    own, _, _ = node_bound(proto.graph.node[-1], shapes, 18)
    v = got["o"]
    allowed = got[PROP + "o"] + allowance(own, v, got.get(AUX + "o"), U)

    def ratio(model: onnx.ModelProto) -> float:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        y = sess.run(None, f32)[0].astype(np.float64)
        return float(np.max(np.abs(y - v) / allowed))

    assert ratio(proto) < 0.1, ratio(proto)
    hidden = [n.output[0] for n in proto.graph.node[:-1] if n.op_type != "Transpose"]
    ratios = {t: ratio(_rounded_at(proto, t)) for t in hidden}
    assert min(ratios.values()) > 3, ratios


def test_errors_meeting_from_one_source_add_linearly() -> None:
    """The same product computed twice and summed (a repeated input): the two roundings are one,
    so the sum inherits twice the allowance, not sqrt(2) times it."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((WIDTH, WIDTH)) / 16).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"]),
            helper.make_node("MatMul", ["x", "w"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ],
        "twice",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [ROWS, WIDTH])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [ROWS, WIDTH])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    shapes = dict.fromkeys(("x", "a", "b", "y"), (ROWS, WIDTH))
    judged = judged_model(proto, shapes, {"y": "float32"})
    x = rng.standard_normal((ROWS, WIDTH))
    got = _evaluate(judged.proto, {"x": x})[PROP + "y"]
    bound, _, _ = node_bound(proto.graph.node[0], shapes, 18)
    w64 = w.astype(np.float64)
    one = allowance(bound, x @ w64, np.abs(x) @ np.abs(w64), U)
    np.testing.assert_allclose(got, 2 * one, rtol=1e-6)


def test_a_running_sum_keeps_its_allowance_first_order() -> None:
    """A constant input's partial sums round alike (the rule then takes the deterministic bound),
    so a CumSum's allowance is never counted as independent roundings: the product after it
    inherits all of it, first order."""
    g = helper.make_graph(
        [helper.make_node("CumSum", ["x", "axis"], ["c"]), helper.make_node("MatMul", ["c", "w"], ["y"])],
        "run",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 64])],
        [
            onnx.numpy_helper.from_array(np.array(1, np.int64), "axis"),
            onnx.numpy_helper.from_array(np.eye(64, dtype=np.float32), "w"),
        ],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    shapes = {"x": (4, 64), "c": (4, 64), "y": (4, 64)}
    bound, _, _ = node_bound(proto.graph.node[0], shapes, 18)
    assert bound.prob_b == 0.0  # the rule chooses per tensor: its whole allowance is carried first order
    judged = judged_model(proto, shapes, {"y": "float32"})
    x = np.full((4, 64), 0.1)
    got = _evaluate(judged.proto, {"x": x})
    c = np.cumsum(x, axis=1)
    mag = got.get(AUX + "c")
    assert mag is not None
    # the identity product passes the CumSum's allowance unchanged, all of it first order
    np.testing.assert_allclose(got[PROP + "y"], allowance(bound, c, mag, U), rtol=1e-6)
