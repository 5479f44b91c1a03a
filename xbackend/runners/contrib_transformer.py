"""The kernels `onnxruntime.transformers.optimizer`, optimum's `--optimize` and ONNX Runtime's
quantizers write into models (domain com.microsoft): Attention, MultiHeadAttention,
GroupQueryAttention, RotaryEmbedding, EmbedLayerNormalization, RelativePositionBias,
BiasSplitGelu, BiasAdd and MatMulNBits, computed from their definitions (ContribOperators.md) in
the precision they are fed: float64 on the oracle.

Beside each value, `bound` gives what a correct engine's float32 rounding may move it by, per
element and in units of u, composed to first order from the kernel's parts (the projections'
and Q·Kᵀ's dot products by Higham & Mary, the softmax's terms weighted by its probabilities,
P·V's dot products); xbackend.bounds.rules reads it as the node's magnitude (EmbedLayerNormalization's is the
embeddings' sum, which the rule normalizes). An option these
forms do not cover raises ValueError, which the report gives as the reason the node is not
judged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["KERNELS", "TRANSFORMER_OPS"]

Array = np.ndarray


def _opt(v: Any, default: Any) -> Any:
    return default if v is None else v


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def _heads(x: Array, n: int) -> Array:
    """[B, S, N·H] -> [B, N, S, H]."""
    b, s, d = x.shape
    if d % n:
        raise ValueError(f"hidden size {d} is not a multiple of num_heads {n}")
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _merge(x: Array) -> Array:
    """[B, N, S, H] -> [B, S, N·H]."""
    b, n, s, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def _hm(terms: int, elements: int) -> float:
    """Higham & Mary's coefficient of Σ|a||b| for `terms`-term dot products (see bounds.element)."""
    from xbackend.bounds.element import lam  # heavy: it imports onnx (foreign workers)

    return lam(terms, elements) * math.sqrt(terms + 1) + 1


def _exp() -> float:
    """Exp's measured relative bound, in u."""
    from xbackend.bounds.element import ELEMENTWISE  # heavy: it imports onnx (foreign workers)

    return float(ELEMENTWISE["Exp"][0])


def _attend(
    q: Array,
    k: Array,
    v: Array,
    add: Array | None,
    scale: float,
    errs: tuple[Array | None, Array | None, Array | None] = (None, None, None),
    want: bool = False,
) -> tuple[Array, Array | None]:
    """softmax(scale·Q·Kᵀ + add)·V per head (q: [B, N, S, H]; k, v: [B, Nk, T, H], Nk dividing N),
    and, with `want`, its bound in u: Q·Kᵀ's dot products and the operands' errors `errs` (in u,
    shaped as q, k, v) carried through the softmax (|δp| ≤ p·(|δs| + Σ p·|δs|)), the softmax's
    own rounding, then P·V's dot products."""
    group = q.shape[1] // k.shape[1]
    if group * k.shape[1] != q.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads cannot share {k.shape[1]} key heads")
    if group > 1:
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        ek, ev = (None if e is None else np.repeat(e, group, axis=1) for e in errs[1:])
        errs = (errs[0], ek, ev)
    s = scale * np.matmul(q, np.swapaxes(k, -1, -2))
    if add is not None:
        s = s + add
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(s - m)
        p = e / np.sum(e, axis=-1, keepdims=True)
    out = np.matmul(p, v)
    if not want:
        return out, None
    h, t = q.shape[-1], k.shape[-2]
    live = p > 0  # masked keys (added -inf or a filter value) take no part
    with np.errstate(invalid="ignore", over="ignore"):
        es = _hm(h, s.size) * abs(scale) * np.matmul(np.abs(q), np.swapaxes(np.abs(k), -1, -2))
        if errs[0] is not None:
            es = es + abs(scale) * np.matmul(errs[0], np.swapaxes(np.abs(k), -1, -2))
        if errs[1] is not None:
            es = es + abs(scale) * np.matmul(np.abs(q), np.swapaxes(errs[1], -1, -2))
        es = es + 2 * np.abs(s) + np.abs(s - m)  # the scaling, the added mask, s - max
        es = np.where(live, es, 0.0)
    ep = p * (es + np.sum(p * es, axis=-1, keepdims=True)) + (_exp() + _hm(t, p.size) + 2) * p
    bound = np.matmul(ep + _hm(t, out.size) * p, np.abs(v))
    if errs[2] is not None:
        bound = bound + np.matmul(p, errs[2])
    return out, bound


def _filter(keep: Array, value: float) -> Array:
    """An additive mask: 0 where kept, `value` where masked."""
    return np.where(keep, 0.0, value)


def _causal(s: int, t: int, past: Array) -> Array:
    """[B, 1, S, T]: query i (at position past_b + i) sees keys j <= past_b + i."""
    i = np.arange(s)[None, :, None] + np.asarray(past).reshape(-1, 1, 1)
    return np.asarray((np.arange(t)[None, None, :] <= i)[:, None])


def _key_mask(mask: Array | None, b: int, s: int, t: int, past: int) -> Array | None:
    """mask_index / key_padding_mask as [B, 1, S, T] booleans (True: attended)."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    j = np.arange(t)
    if mask.ndim == 1 and mask.shape[0] == b:  # each batch's end position
        return np.asarray((j[None, :] < mask[:, None])[:, None, None, :].repeat(s, axis=2))
    if mask.ndim == 1 and mask.shape[0] == 2 * b:  # end, then start positions
        end, start = mask[:b, None], mask[b:, None]
        return np.asarray(((j[None, :] < end) & (j[None, :] >= start))[:, None, None, :].repeat(s, axis=2))
    if mask.ndim == 2 and mask.shape == (b, t):
        return np.asarray((mask != 0)[:, None, None, :].repeat(s, axis=2))
    if mask.ndim == 3 and mask.shape == (b, s, t):
        return np.asarray((mask != 0)[:, None])
    if mask.ndim == 4 and mask.shape[0] == b and mask.shape[1] == 1:
        return np.asarray(mask[:, :, past : past + s, :t] != 0)
    raise ValueError(f"a mask of shape {list(mask.shape)} (batch {b}, total length {t}) is not covered")


def _additive(
    b: int, s: int, t: int, past: int, mask: Array | None, causal: bool, filt: float, bias: Array | None
) -> Array | None:
    keep = _key_mask(mask, b, s, t, past)
    if causal:
        c = _causal(s, t, np.full(b, past))
        keep = c if keep is None else keep & c
    add = None if keep is None else _filter(keep, filt)
    if bias is not None:
        add = bias if add is None else add + bias
    return add


def _dot_bound(x: Array, w: Array) -> Array:
    """Higham & Mary's bound of x·w, in u."""
    kdim = x.shape[-1]
    return np.asarray(_hm(kdim, x.shape[0] * x.shape[1] * w.shape[-1]) * np.matmul(np.abs(x), np.abs(w)))


def _with_past(x: Array, e: Array | None, past: Array) -> tuple[Array, Array | None]:
    """`past` then `x` along the sequence ([B, N, T, H]); its error `e`, none on the past."""
    x = np.concatenate([past, x], axis=2)
    return x, None if e is None else np.concatenate([np.zeros_like(past), e], axis=2)


def _masked_attend(
    q: Array,
    k: Array,
    v: Array,
    errs: tuple[Array | None, Array | None, Array | None],
    past: int,
    mask: Array | None,
    bias: Array | None,
    at: dict[str, Any],
    want: bool,
) -> tuple[Array, Array | None]:
    """Attention and MultiHeadAttention past their inputs' layouts: scale, mask (`past` keys
    before the query), causal when unidirectional, the attention bias; output [B, S, N·H]."""
    b, _, s, hq = q.shape
    scale = float(_opt(at.get("scale"), 1 / math.sqrt(hq)))
    add = _additive(b, s, k.shape[2], past, mask, bool(at.get("unidirectional")),
                    float(_opt(at.get("mask_filter_value"), -10000.0)), bias)  # fmt: skip
    out, bound = _attend(q, k, v, add, scale, errs, want)
    return _merge(out), None if bound is None else _merge(bound)


def attention(
    x: Array,
    w: Array,
    bias: Array | None = None,
    mask: Array | None = None,
    past: Array | None = None,
    attention_bias: Array | None = None,
    past_sequence_length: Array | None = None,
    want: bool = False,
    **at: Any,
) -> tuple[tuple[Array, ...], Array | None]:
    """com.microsoft Attention: QKV = x·W + bias, heads, past concatenated, the mask and bias added."""
    if at.get("do_rotary") or at.get("past_present_share_buffer"):
        raise ValueError("Attention with do_rotary or past_present_share_buffer is not covered")
    n = int(at["num_heads"])
    sizes = list(at.get("qkv_hidden_sizes") or [w.shape[1] // 3] * 3)
    qkv = np.matmul(x, w) + (0 if bias is None else bias)
    cut = np.cumsum(sizes)[:2]
    q, k, v = (_heads(p, n) for p in np.split(qkv, cut, axis=-1))
    eq = ek = ev = None
    if want:
        e = _dot_bound(x, w) + (0 if bias is None else np.abs(qkv))
        eq, ek, ev = (_heads(p, n) for p in np.split(e, cut, axis=-1))
    p_len = 0 if past is None else past.shape[3]
    if past is not None:
        (k, ek), (v, ev) = _with_past(k, ek, past[0]), _with_past(v, ev, past[1])
    out, bound = _masked_attend(q, k, v, (eq, ek, ev), p_len, mask, attention_bias, at, want)
    return (out, np.stack([k, v])), bound


def multihead_attention(
    query: Array,
    key: Array | None = None,
    value: Array | None = None,
    bias: Array | None = None,
    key_padding_mask: Array | None = None,
    attention_bias: Array | None = None,
    past_key: Array | None = None,
    past_value: Array | None = None,
    *rest: Any,
    want: bool = False,
    **at: Any,
) -> tuple[tuple[Array, ...], Array | None]:
    """com.microsoft MultiHeadAttention: 3D query, key and value (or BNSH key and value, or QKV
    packed in query, or KV packed in key), an optional bias, key padding mask, attention bias and
    past."""
    if any(r is not None for r in rest):
        raise ValueError("MultiHeadAttention with past_sequence_length or cache_indirection is not covered")
    n = int(at["num_heads"])
    eq: Array | None = None
    ek: Array | None = None
    ev: Array | None = None
    if key is None and query.ndim == 5:
        q, k, v = (query[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
    else:
        if bias is not None:
            d = query.shape[-1]
            query = query + bias[:d]
            eq = np.abs(query) if want else None
        q = _heads(query, n)
        eq = None if eq is None else _heads(eq, n)
        if key is not None and key.ndim == 5:  # [B, L, N, 2, H]
            k, v = key[:, :, :, 0].transpose(0, 2, 1, 3), key[:, :, :, 1].transpose(0, 2, 1, 3)
        elif key is not None and value is not None and key.ndim == 3:
            if bias is not None:
                d, dk = query.shape[-1], key.shape[-1]
                key, value = key + bias[d : d + dk], value + bias[d + dk :]
                ek, ev = (_heads(np.abs(key), n), _heads(np.abs(value), n)) if want else (None, None)
            k, v = _heads(key, n), _heads(value, n)
        elif key is not None and value is not None and key.ndim == 4:
            k, v = key, value
        else:
            raise ValueError("this MultiHeadAttention input layout is not covered")
    p_len = 0
    if past_key is not None and past_value is not None:
        p_len = past_key.shape[2]
        (k, ek), (v, ev) = _with_past(k, ek, past_key), _with_past(v, ev, past_value)
    out, bound = _masked_attend(q, k, v, (eq, ek, ev), p_len, key_padding_mask, attention_bias, at, want)
    return (out, k, v), bound


def _rotate(x: Array, cos: Array, sin: Array, interleaved: bool, magnitude: bool = False) -> Array:
    """Rotary embedding of the first 2·cos.shape[-1] channels of x (cos, sin broadcast to x's
    leading dims); `magnitude`: |x1||cos| + |x2||sin| in each place instead."""
    r = cos.shape[-1]
    out = x.copy()
    if interleaved:
        x1, x2 = x[..., 0 : 2 * r : 2], x[..., 1 : 2 * r : 2]
    else:
        x1, x2 = x[..., :r], x[..., r : 2 * r]
    if magnitude:
        a1, a2, c, s_ = np.abs(x1), np.abs(x2), np.abs(cos), np.abs(sin)
        y1, y2 = a1 * c + a2 * s_, a2 * c + a1 * s_
        out = np.abs(out)
    else:
        y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if interleaved:
        out[..., 0 : 2 * r : 2], out[..., 1 : 2 * r : 2] = y1, y2
    else:
        out[..., :r], out[..., r : 2 * r] = y1, y2
    return out


def _positions(position_ids: Array, b: int, s: int) -> Array:
    pid = np.asarray(position_ids).astype(np.int64)
    if pid.size == 1:  # an offset: positions offset .. offset + S - 1
        return np.broadcast_to(int(pid.reshape(-1)[0]) + np.arange(s), (b, s))
    return np.broadcast_to(pid, (b, s))


def rotary_embedding(
    x: Array, position_ids: Array, cos_cache: Array, sin_cache: Array, want: bool = False, **at: Any
) -> tuple[tuple[Array, ...], Array | None]:
    """com.microsoft RotaryEmbedding: x [B, S, D] or [B, N, S, H]; position_ids [B, S] or an offset."""
    interleaved = bool(at.get("interleaved"))
    if at.get("is_packed_batching"):
        raise ValueError("RotaryEmbedding with is_packed_batching is not covered")
    if x.ndim == 4:
        b, _, s, _ = x.shape
        xs = x
    else:
        b, s, d = x.shape
        n = int(at.get("num_heads") or 0) or d // (2 * cos_cache.shape[-1])
        xs = _heads(x, n)
    rot = int(at.get("rotary_embedding_dim") or 0) or 2 * cos_cache.shape[-1]
    pos = _positions(position_ids, b, s)
    cos, sin = cos_cache[pos][:, None, :, : rot // 2], sin_cache[pos][:, None, :, : rot // 2]
    y = _rotate(xs, cos, sin, interleaved)
    mag = _rotate(xs, cos, sin, interleaved, magnitude=True) if want else None
    if x.ndim == 3:
        y = _merge(y)
        mag = None if mag is None else _merge(mag)
    return (y,), mag


def group_query_attention(
    query: Array,
    key: Array | None,
    value: Array | None,
    past_key: Array | None,
    past_value: Array | None,
    seqlens_k: Array,
    total_sequence_length: Array,
    cos_cache: Array | None = None,
    sin_cache: Array | None = None,
    *rest: Any,
    want: bool = False,
    **at: Any,
) -> tuple[tuple[Array, ...], Array | None]:
    """com.microsoft GroupQueryAttention: causal, query i of batch b at position
    seqlens_k[b] + 1 - S + i, keys written into the present buffer there; rotary when asked."""
    if any(r is not None for r in rest):
        raise ValueError("GroupQueryAttention with position_ids, attention_bias or head_sink is not covered")
    # ONNX Runtime writes every attribute into the graphs it saves: smooth_softmax -1 is unset
    if float(_opt(at.get("softcap"), 0.0)) or int(_opt(at.get("smooth_softmax"), 0)) > 0:
        raise ValueError("GroupQueryAttention with softcap or smooth_softmax is not covered")
    quant = {_text(at.get(a)) or "NONE" for a in ("k_quant_type", "v_quant_type")}
    if quant != {"NONE"} or not int(_opt(at.get("causal"), 1)) or int(_opt(at.get("qk_output"), 0)):
        raise ValueError("GroupQueryAttention with a quantized cache, causal=0 or qk_output is not covered")
    n, nk = int(at["num_heads"]), int(at["kv_num_heads"])
    b, s, d = query.shape
    if key is None:  # packed QKV
        h = d // (n + 2 * nk)
        query, key, value = np.split(query, [n * h, (n + nk) * h], axis=-1)
    assert key is not None and value is not None
    q, k, v = _heads(query, n), _heads(key, nk), _heads(value, nk)
    total = int(np.asarray(total_sequence_length).reshape(-1)[0])
    lens = np.asarray(seqlens_k).reshape(-1).astype(np.int64) + 1
    past_b = lens - s
    eq = ek = None
    if at.get("do_rotary"):
        if cos_cache is None or sin_cache is None:
            raise ValueError("GroupQueryAttention with do_rotary needs cos_cache and sin_cache")
        pos = past_b[:, None] + np.arange(s)[None, :]
        cos, sin = cos_cache[pos][:, None], sin_cache[pos][:, None]
        il = bool(at.get("rotary_interleaved"))
        if want:
            eq, ek = 2 * _rotate(q, cos, sin, il, True), 2 * _rotate(k, cos, sin, il, True)
        q, k = _rotate(q, cos, sin, il), _rotate(k, cos, sin, il)
    p_len = 0 if past_key is None else past_key.shape[2]
    t = max(total, p_len, int(past_b.max()) + s)
    pk, pv = (np.zeros((b, nk, t, x.shape[-1]), q.dtype) for x in (k, v))
    ekf = np.zeros_like(pk) if ek is not None else None
    if past_key is not None and past_value is not None:
        pk[:, :, :p_len], pv[:, :, :p_len] = past_key, past_value
    for i, start in enumerate(past_b):
        pk[i, :, start : start + s], pv[i, :, start : start + s] = k[i], v[i]
        if ekf is not None and ek is not None:
            ekf[i, :, start : start + s] = ek[i]
    keep = _causal(s, t, past_b) & (np.arange(t)[None, None, None, :] < lens[:, None, None, None])
    window = int(_opt(at.get("local_window_size"), -1))
    if window > 0:
        i = past_b[:, None, None] + np.arange(s)[None, :, None]
        keep = keep & (np.arange(t)[None, None, :] > i - window)[:, None]
    scale = float(at.get("scale") or 1 / math.sqrt(q.shape[-1]))
    out, bound = _attend(q, pk, pv, _filter(keep, -np.inf), scale, (eq, ekf, None), want)
    present_len = p_len if past_key is not None and p_len >= total else t
    return (_merge(out), pk[:, :, :present_len], pv[:, :, :present_len]), (
        None if bound is None else _merge(bound)
    )


def embed_layer_normalization(
    input_ids: Array,
    segment_ids: Array | None,
    word: Array,
    position: Array,
    segment: Array | None,
    gamma: Array,
    beta: Array | None = None,
    mask: Array | None = None,
    position_ids: Array | None = None,
    want: bool = False,
    **at: Any,
) -> tuple[tuple[Array, ...], Array | None]:
    """com.microsoft EmbedLayerNormalization: LayerNorm(word[ids] + position[pos] + segment[seg]),
    the mask's per-batch count, and the embeddings' sum."""
    b, s = input_ids.shape
    pos = np.broadcast_to(np.arange(s) if position_ids is None else position_ids, (b, s))
    emb = word[input_ids] + position[pos]
    if segment is not None and segment_ids is not None:
        emb = emb + segment[segment_ids]
    if want:  # the rule in bounds.rules normalizes the sum
        return (emb,), emb
    eps = float(_opt(at.get("epsilon"), 1e-12))
    mu = np.mean(emb, axis=-1, keepdims=True)
    dv = emb - mu
    y = dv / np.sqrt(np.mean(dv * dv, axis=-1, keepdims=True) + eps) * gamma
    y = y if beta is None else y + beta
    count = (np.zeros(b) if mask is None else np.sum(mask != 0, axis=-1)).astype(np.int32)
    return (y, count, emb), None


def relative_position_bias(
    table: Array, query_length: Array, key_length: Array, want: bool = False, **at: Any
) -> tuple[tuple[Array, ...], Array | None]:
    """com.microsoft RelativePositionBias: T5's bucketed positions (float32 log, as T5 defines
    them), the table's values gathered: [1, heads, S, T]."""
    s, t = int(np.asarray(query_length).reshape(-1)[0]), int(np.asarray(key_length).reshape(-1)[0])
    buckets, max_distance = table.shape[0], int(_opt(at.get("max_distance"), 128))
    rel = np.arange(t)[None, :] - np.arange(s)[:, None]
    out = np.zeros_like(rel)
    if at.get("is_bidirectional"):
        buckets //= 2
        out += (rel > 0) * buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    exact = buckets // 2
    ratio = np.maximum(rel, exact).astype(np.float32) / np.float32(exact)  # small ones are exact below
    logs = np.log(ratio) / np.float32(math.log(max_distance / exact))
    large = exact + (logs * np.float32(buckets - exact)).astype(np.int64, copy=False)
    out += np.where(rel < exact, rel, np.minimum(large, buckets - 1))
    # ONNX Runtime's kernel reads the table head-major (row h·buckets + bucket of its flat
    # memory), whatever its declared [buckets, heads]: the optimizer writes it so
    heads = table.shape[1]
    flat = table.reshape(-1)
    index = np.arange(heads)[:, None, None] * table.shape[0] + out[None]
    return (flat[index][None],), None


Out = tuple[tuple[Array, ...], Array | None]


def bias_split_gelu(x: Array, bias: Array, want: bool = False, **_: Any) -> Out:
    """com.microsoft BiasSplitGelu: (x + bias) split in halves, the first times Gelu of the second."""
    v = x + bias
    left, right = np.split(v, 2, axis=-1)
    erf = np.vectorize(math.erf, otypes=[right.dtype])(right / math.sqrt(2)) if right.size else right
    y = left * 0.5 * right * (1 + erf)
    return (y,), (np.abs(left) * np.abs(right) if want else None)


def bias_add(x: Array, bias: Array, skip: Array, want: bool = False, **_: Any) -> Out:
    """com.microsoft BiasAdd: x + bias + skip."""
    xb = x + bias
    return (xb + skip,), (np.abs(xb) if want else None)


def _unpack(b: Array, bits: int, k: int) -> Array:
    """MatMulNBits' packed weights [N, blocks, blob] -> [N, blocks·block] unsigned integers, the
    low bits first."""
    raw = np.asarray(b, np.uint8).reshape(b.shape[0], -1)
    per = 8 // bits
    parts = [(raw >> (bits * i)) & ((1 << bits) - 1) for i in range(per)]
    return np.stack(parts, axis=-1).reshape(b.shape[0], -1)[:, : max(k, 0) or None]


def matmul_nbits(
    a: Array,
    b: Array,
    scales: Array,
    zero_points: Array | None = None,
    g_idx: Array | None = None,
    bias: Array | None = None,
    want: bool = False,
    **at: Any,
) -> tuple[tuple[Array, ...], Array | None]:
    """com.microsoft MatMulNBits: a · dequantized(b)ᵀ (+ bias), blockwise (q - zero point)·scale."""
    k, n = int(at["K"]), int(at["N"])
    bits, block = int(_opt(at.get("bits"), 4)), int(at["block_size"])
    if g_idx is not None or int(_opt(at.get("weight_prepacked"), 0)):
        raise ValueError("MatMulNBits with g_idx or prepacked weights is not covered")
    if bits not in (2, 4, 8):
        raise ValueError(f"MatMulNBits with {bits} bits is not covered")
    blocks = -(-k // block)
    q = _unpack(b, bits, blocks * block).astype(np.float64)
    sc = np.asarray(scales).reshape(n, blocks)
    if zero_points is None:
        zp = np.full((n, blocks), float(1 << (bits - 1)))
    elif zero_points.dtype == np.uint8:
        zp = _unpack(zero_points.reshape(n, -1, 1), bits, blocks).astype(np.float64)
    else:
        zp = np.asarray(zero_points, np.float64).reshape(n, blocks)
    w = (q.reshape(n, blocks, block) - zp[..., None]) * sc[..., None].astype(np.float64)
    w = w.reshape(n, -1)[:, :k]
    w = w.astype(a.dtype)
    y = np.matmul(a, w.T) + (0 if bias is None else bias)
    if not want:
        return (y,), None
    flat = a.reshape(-1, k)
    mag = _hm(k, flat.shape[0] * n) * np.matmul(np.abs(a), np.abs(w.T)) + np.matmul(np.abs(a), np.abs(w.T))
    if bias is not None:
        mag = mag + np.abs(y)
    if int(_opt(at.get("accuracy_level"), 0)) == 4:  # a quantized to int8 per block: ±scale/2 each
        pad = blocks * block - k
        ab = np.pad(np.abs(flat), ((0, 0), (0, pad))).reshape(-1, blocks, block)
        step = ab.max(axis=-1, keepdims=True) / 127 / 2 / 2.0**-24
        err = np.broadcast_to(step, ab.shape).reshape(-1, blocks * block)[:, :k]
        mag = mag + np.matmul(err, np.abs(w.T)).reshape(mag.shape)
    return (y,), mag


Kernel = Callable[..., tuple[tuple[Array, ...], Array | None]]
KERNELS: dict[str, Kernel] = {
    "Attention": attention,
    "MultiHeadAttention": multihead_attention,
    "GroupQueryAttention": group_query_attention,
    "RotaryEmbedding": rotary_embedding,
    "EmbedLayerNormalization": embed_layer_normalization,
    "RelativePositionBias": relative_position_bias,
    "BiasSplitGelu": bias_split_gelu,
    "BiasAdd": bias_add,
    "MatMulNBits": matmul_nbits,
}
TRANSFORMER_OPS = frozenset(KERNELS)
