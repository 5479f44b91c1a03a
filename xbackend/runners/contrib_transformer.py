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


def _opt(value: Any, default: Any) -> Any:
    return default if value is None else value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _heads(hidden: Array, heads: int) -> Array:
    """[B, S, N·H] -> [B, N, S, H]."""
    batch, seq, width = hidden.shape
    if width % heads:
        raise ValueError(f"hidden size {width} is not a multiple of num_heads {heads}")
    return hidden.reshape(batch, seq, heads, width // heads).transpose(0, 2, 1, 3)


def _merge(per_head: Array) -> Array:
    """[B, N, S, H] -> [B, S, N·H]."""
    batch, heads, seq, head_size = per_head.shape
    return per_head.transpose(0, 2, 1, 3).reshape(batch, seq, heads * head_size)


def _hm(terms: int, elements: int) -> float:
    """Higham & Mary's coefficient of Σ|a||b| for `terms`-term dot products (see bounds.element)."""
    from xbackend.bounds.element import lam  # heavy: it imports onnx (foreign workers)

    return lam(terms, elements) * math.sqrt(terms + 1) + 1


def _exp() -> float:
    """Exp's measured relative bound, in u."""
    from xbackend.bounds.element import ELEMENTWISE  # heavy: it imports onnx (foreign workers)

    return float(ELEMENTWISE["Exp"][0])


def _attend(
    query: Array,
    key: Array,
    value: Array,
    add: Array | None,
    scale: float,
    errs: tuple[Array | None, Array | None, Array | None] = (None, None, None),
    want: bool = False,
) -> tuple[Array, Array | None]:
    """softmax(scale·Q·Kᵀ + add)·V per head (q: [B, N, S, H]; k, v: [B, Nk, T, H], Nk dividing N),
    and, with `want`, its bound in u: Q·Kᵀ's dot products and the operands' errors `errs` (in u,
    shaped as q, k, v) carried through the softmax (|δp| ≤ p·(|δs| + Σ p·|δs|)), the softmax's
    own rounding, then P·V's dot products."""
    group = query.shape[1] // key.shape[1]
    if group * key.shape[1] != query.shape[1]:
        raise ValueError(f"{query.shape[1]} query heads cannot share {key.shape[1]} key heads")
    if group > 1:
        key, value = np.repeat(key, group, axis=1), np.repeat(value, group, axis=1)
        ek, ev = (None if err is None else np.repeat(err, group, axis=1) for err in errs[1:])
        errs = (errs[0], ek, ev)
    scores = scale * np.matmul(query, np.swapaxes(key, -1, -2))
    if add is not None:
        scores = scores + add
    row_max = np.max(scores, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        exps = np.exp(scores - row_max)
        probs = exps / np.sum(exps, axis=-1, keepdims=True)
    out = np.matmul(probs, value)
    if not want:
        return out, None
    head_size, keys = query.shape[-1], key.shape[-2]
    live = probs > 0  # masked keys (added -inf or a filter value) take no part
    with np.errstate(invalid="ignore", over="ignore"):
        es = (
            _hm(head_size, scores.size)
            * abs(scale)
            * np.matmul(np.abs(query), np.swapaxes(np.abs(key), -1, -2))
        )
        if errs[0] is not None:
            es = es + abs(scale) * np.matmul(errs[0], np.swapaxes(np.abs(key), -1, -2))
        if errs[1] is not None:
            es = es + abs(scale) * np.matmul(np.abs(query), np.swapaxes(errs[1], -1, -2))
        es = es + 2 * np.abs(scores) + np.abs(scores - row_max)  # the scaling, the added mask, s - max
        es = np.where(live, es, 0.0)
    ep = (
        probs * (es + np.sum(probs * es, axis=-1, keepdims=True))
        + (_exp() + _hm(keys, probs.size) + 2) * probs
    )
    bound = np.matmul(ep + _hm(keys, out.size) * probs, np.abs(value))
    if errs[2] is not None:
        bound = bound + np.matmul(probs, errs[2])
    return out, bound


def _filter(keep: Array, value: float) -> Array:
    """An additive mask: 0 where kept, `value` where masked."""
    return np.where(keep, 0.0, value)


def _causal(seq: int, total: int, past: Array) -> Array:
    """[B, 1, S, T]: query i (at position past_b + i) sees keys j <= past_b + i."""
    position = np.arange(seq)[None, :, None] + np.asarray(past).reshape(-1, 1, 1)
    return np.asarray((np.arange(total)[None, None, :] <= position)[:, None])


def _key_mask(mask: Array | None, batch: int, seq: int, total: int, past: int) -> Array | None:
    """mask_index / key_padding_mask as [B, 1, S, T] booleans (True: attended)."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    key_position = np.arange(total)
    if mask.ndim == 1 and mask.shape[0] == batch:  # each batch's end position
        return np.asarray((key_position[None, :] < mask[:, None])[:, None, None, :].repeat(seq, axis=2))
    if mask.ndim == 1 and mask.shape[0] == 2 * batch:  # end, then start positions
        end, start = mask[:batch, None], mask[batch:, None]
        return np.asarray(
            ((key_position[None, :] < end) & (key_position[None, :] >= start))[:, None, None, :].repeat(
                seq, axis=2
            )
        )
    if mask.ndim == 2 and mask.shape == (batch, total):
        return np.asarray((mask != 0)[:, None, None, :].repeat(seq, axis=2))
    if mask.ndim == 3 and mask.shape == (batch, seq, total):
        return np.asarray((mask != 0)[:, None])
    if mask.ndim == 4 and mask.shape[0] == batch and mask.shape[1] == 1:
        return np.asarray(mask[:, :, past : past + seq, :total] != 0)
    raise ValueError(
        f"a mask of shape {list(mask.shape)} (batch {batch}, total length {total}) is not covered"
    )


def _additive(
    batch: int,
    seq: int,
    total: int,
    past: int,
    mask: Array | None,
    causal: bool,
    filt: float,
    bias: Array | None,
) -> Array | None:
    keep = _key_mask(mask, batch, seq, total, past)
    if causal:
        visible = _causal(seq, total, np.full(batch, past))
        keep = visible if keep is None else keep & visible
    add = None if keep is None else _filter(keep, filt)
    if bias is not None:
        add = bias if add is None else add + bias
    return add


def _dot_bound(left: Array, weight: Array) -> Array:
    """Higham & Mary's bound of x·w, in u."""
    kdim = left.shape[-1]
    return np.asarray(
        _hm(kdim, left.shape[0] * left.shape[1] * weight.shape[-1]) * np.matmul(np.abs(left), np.abs(weight))
    )


def _with_past(states: Array, error: Array | None, past: Array) -> tuple[Array, Array | None]:
    """`past` then `states` along the sequence ([B, N, T, H]); its error `error`, none on the past."""
    states = np.concatenate([past, states], axis=2)
    return states, None if error is None else np.concatenate([np.zeros_like(past), error], axis=2)


def _masked_attend(
    query: Array,
    key: Array,
    value: Array,
    errs: tuple[Array | None, Array | None, Array | None],
    past: int,
    mask: Array | None,
    bias: Array | None,
    at: dict[str, Any],
    want: bool,
) -> tuple[Array, Array | None]:
    """Attention and MultiHeadAttention past their inputs' layouts: scale, mask (`past` keys
    before the query), causal when unidirectional, the attention bias; output [B, S, N·H]."""
    batch, _, seq, hq = query.shape
    scale = float(_opt(at.get("scale"), 1 / math.sqrt(hq)))
    add = _additive(batch, seq, key.shape[2], past, mask, bool(at.get("unidirectional")),
                    float(_opt(at.get("mask_filter_value"), -10000.0)), bias)  # fmt: skip
    out, bound = _attend(query, key, value, add, scale, errs, want)
    return _merge(out), None if bound is None else _merge(bound)


def attention(
    hidden: Array,
    weights: Array,
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
    heads = int(at["num_heads"])
    sizes = list(at.get("qkv_hidden_sizes") or [weights.shape[1] // 3] * 3)
    qkv = np.matmul(hidden, weights) + (0 if bias is None else bias)
    cut = np.cumsum(sizes)[:2]
    q_heads, k_heads, v_heads = (_heads(p, heads) for p in np.split(qkv, cut, axis=-1))
    eq = ek = ev = None
    if want:
        error = _dot_bound(hidden, weights) + (0 if bias is None else np.abs(qkv))
        eq, ek, ev = (_heads(p, heads) for p in np.split(error, cut, axis=-1))
    p_len = 0 if past is None else past.shape[3]
    if past is not None:
        (k_heads, ek), (v_heads, ev) = _with_past(k_heads, ek, past[0]), _with_past(v_heads, ev, past[1])
    out, bound = _masked_attend(
        q_heads, k_heads, v_heads, (eq, ek, ev), p_len, mask, attention_bias, at, want
    )
    return (out, np.stack([k_heads, v_heads])), bound


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
    heads = int(at["num_heads"])
    eq: Array | None = None
    ek: Array | None = None
    ev: Array | None = None
    if key is None and query.ndim == 5:
        q_heads, k_heads, v_heads = (query[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
    else:
        if bias is not None:
            width = query.shape[-1]
            query = query + bias[:width]
            eq = np.abs(query) if want else None
        q_heads = _heads(query, heads)
        eq = None if eq is None else _heads(eq, heads)
        if key is not None and key.ndim == 5:  # [B, L, N, 2, H]
            k_heads, v_heads = key[:, :, :, 0].transpose(0, 2, 1, 3), key[:, :, :, 1].transpose(0, 2, 1, 3)
        elif key is not None and value is not None and key.ndim == 3:
            if bias is not None:
                width, dk = query.shape[-1], key.shape[-1]
                key, value = key + bias[width : width + dk], value + bias[width + dk :]
                ek, ev = (_heads(np.abs(key), heads), _heads(np.abs(value), heads)) if want else (None, None)
            k_heads, v_heads = _heads(key, heads), _heads(value, heads)
        elif key is not None and value is not None and key.ndim == 4:
            k_heads, v_heads = key, value
        else:
            raise ValueError("this MultiHeadAttention input layout is not covered")
    p_len = 0
    if past_key is not None and past_value is not None:
        p_len = past_key.shape[2]
        (k_heads, ek), (v_heads, ev) = _with_past(k_heads, ek, past_key), _with_past(v_heads, ev, past_value)
    out, bound = _masked_attend(
        q_heads, k_heads, v_heads, (eq, ek, ev), p_len, key_padding_mask, attention_bias, at, want
    )
    return (out, k_heads, v_heads), bound


def _rotate(x: Array, cos: Array, sin: Array, interleaved: bool, magnitude: bool = False) -> Array:
    """Rotary embedding of the first 2·cos.shape[-1] channels of x (cos, sin broadcast to x's
    leading dims); `magnitude`: |x1||cos| + |x2||sin| in each place instead."""
    size = cos.shape[-1]
    out = x.copy()
    if interleaved:
        x1, x2 = x[..., 0 : 2 * size : 2], x[..., 1 : 2 * size : 2]
    else:
        x1, x2 = x[..., :size], x[..., size : 2 * size]
    if magnitude:
        a1, a2, cos_abs, s_ = np.abs(x1), np.abs(x2), np.abs(cos), np.abs(sin)
        y1, y2 = a1 * cos_abs + a2 * s_, a2 * cos_abs + a1 * s_
        out = np.abs(out)
    else:
        y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if interleaved:
        out[..., 0 : 2 * size : 2], out[..., 1 : 2 * size : 2] = y1, y2
    else:
        out[..., :size], out[..., size : 2 * size] = y1, y2
    return out


def _positions(position_ids: Array, batch: int, seq: int) -> Array:
    pid = np.asarray(position_ids).astype(np.int64)
    if pid.size == 1:  # an offset: positions offset .. offset + S - 1
        return np.broadcast_to(int(pid.reshape(-1)[0]) + np.arange(seq), (batch, seq))
    return np.broadcast_to(pid, (batch, seq))


def rotary_embedding(
    states: Array, position_ids: Array, cos_cache: Array, sin_cache: Array, want: bool = False, **at: Any
) -> tuple[tuple[Array, ...], Array | None]:
    """com.microsoft RotaryEmbedding: x [B, S, D] or [B, N, S, H]; position_ids [B, S] or an offset."""
    interleaved = bool(at.get("interleaved"))
    if at.get("is_packed_batching"):
        raise ValueError("RotaryEmbedding with is_packed_batching is not covered")
    if states.ndim == 4:
        batch, _, seq, _ = states.shape
        xs = states
    else:
        batch, seq, width = states.shape
        heads = int(at.get("num_heads") or 0) or width // (2 * cos_cache.shape[-1])
        xs = _heads(states, heads)
    rot = int(at.get("rotary_embedding_dim") or 0) or 2 * cos_cache.shape[-1]
    pos = _positions(position_ids, batch, seq)
    cos, sin = cos_cache[pos][:, None, :, : rot // 2], sin_cache[pos][:, None, :, : rot // 2]
    rotated = _rotate(xs, cos, sin, interleaved)
    mag = _rotate(xs, cos, sin, interleaved, magnitude=True) if want else None
    if states.ndim == 3:
        rotated = _merge(rotated)
        mag = None if mag is None else _merge(mag)
    return (rotated,), mag


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
    heads, nk = int(at["num_heads"]), int(at["kv_num_heads"])
    batch, seq, width = query.shape
    if key is None:  # packed QKV
        head_size = width // (heads + 2 * nk)
        query, key, value = np.split(query, [heads * head_size, (heads + nk) * head_size], axis=-1)
    assert key is not None and value is not None
    q_heads, k_heads, v_heads = _heads(query, heads), _heads(key, nk), _heads(value, nk)
    total = int(np.asarray(total_sequence_length).reshape(-1)[0])
    lens = np.asarray(seqlens_k).reshape(-1).astype(np.int64) + 1
    past_b = lens - seq
    eq = ek = None
    if at.get("do_rotary"):
        if cos_cache is None or sin_cache is None:
            raise ValueError("GroupQueryAttention with do_rotary needs cos_cache and sin_cache")
        pos = past_b[:, None] + np.arange(seq)[None, :]
        cos, sin = cos_cache[pos][:, None], sin_cache[pos][:, None]
        il = bool(at.get("rotary_interleaved"))
        if want:
            eq, ek = 2 * _rotate(q_heads, cos, sin, il, True), 2 * _rotate(k_heads, cos, sin, il, True)
        q_heads, k_heads = _rotate(q_heads, cos, sin, il), _rotate(k_heads, cos, sin, il)
    p_len = 0 if past_key is None else past_key.shape[2]
    total_len = max(total, p_len, int(past_b.max()) + seq)
    pk, pv = (np.zeros((batch, nk, total_len, x.shape[-1]), q_heads.dtype) for x in (k_heads, v_heads))
    ekf = np.zeros_like(pk) if ek is not None else None
    if past_key is not None and past_value is not None:
        pk[:, :, :p_len], pv[:, :, :p_len] = past_key, past_value
    for i, start in enumerate(past_b):
        pk[i, :, start : start + seq], pv[i, :, start : start + seq] = k_heads[i], v_heads[i]
        if ekf is not None and ek is not None:
            ekf[i, :, start : start + seq] = ek[i]
    keep = _causal(seq, total_len, past_b) & (
        np.arange(total_len)[None, None, None, :] < lens[:, None, None, None]
    )
    window = int(_opt(at.get("local_window_size"), -1))
    if window > 0:
        i = past_b[:, None, None] + np.arange(seq)[None, :, None]
        keep = keep & (np.arange(total_len)[None, None, :] > i - window)[:, None]
    scale = float(at.get("scale") or 1 / math.sqrt(q_heads.shape[-1]))
    out, bound = _attend(q_heads, pk, pv, _filter(keep, -np.inf), scale, (eq, ekf, None), want)
    present_len = p_len if past_key is not None and p_len >= total else total_len
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
    batch, seq = input_ids.shape
    pos = np.broadcast_to(np.arange(seq) if position_ids is None else position_ids, (batch, seq))
    emb = word[input_ids] + position[pos]
    if segment is not None and segment_ids is not None:
        emb = emb + segment[segment_ids]
    if want:  # the rule in bounds.rules normalizes the sum
        return (emb,), emb
    eps = float(_opt(at.get("epsilon"), 1e-12))
    mu = np.mean(emb, axis=-1, keepdims=True)
    dv = emb - mu
    normed = dv / np.sqrt(np.mean(dv * dv, axis=-1, keepdims=True) + eps) * gamma
    normed = normed if beta is None else normed + beta
    count = (np.zeros(batch) if mask is None else np.sum(mask != 0, axis=-1)).astype(np.int32)
    return (normed, count, emb), None


def relative_position_bias(
    table: Array, query_length: Array, key_length: Array, want: bool = False, **at: Any
) -> tuple[tuple[Array, ...], Array | None]:
    """com.microsoft RelativePositionBias: T5's bucketed positions (float32 log, as T5 defines
    them), the table's values gathered: [1, heads, S, T]."""
    seq, total = int(np.asarray(query_length).reshape(-1)[0]), int(np.asarray(key_length).reshape(-1)[0])
    buckets, max_distance = table.shape[0], int(_opt(at.get("max_distance"), 128))
    rel = np.arange(total)[None, :] - np.arange(seq)[:, None]
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
    biased = x + bias
    left, right = np.split(biased, 2, axis=-1)
    erf = np.vectorize(math.erf, otypes=[right.dtype])(right / math.sqrt(2)) if right.size else right
    gated = left * 0.5 * right * (1 + erf)
    return (gated,), (np.abs(left) * np.abs(right) if want else None)


def bias_add(x: Array, bias: Array, skip: Array, want: bool = False, **_: Any) -> Out:
    """com.microsoft BiasAdd: x + bias + skip."""
    xb = x + bias
    return (xb + skip,), (np.abs(xb) if want else None)


def _unpack(packed: Array, bits: int, length: int) -> Array:
    """MatMulNBits' packed weights [N, blocks, blob] -> [N, blocks·block] unsigned integers, the
    low bits first."""
    raw = np.asarray(packed, np.uint8).reshape(packed.shape[0], -1)
    per = 8 // bits
    parts = [(raw >> (bits * i)) & ((1 << bits) - 1) for i in range(per)]
    return np.stack(parts, axis=-1).reshape(packed.shape[0], -1)[:, : max(length, 0) or None]


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
    inner, columns = int(at["K"]), int(at["N"])
    bits, block = int(_opt(at.get("bits"), 4)), int(at["block_size"])
    if g_idx is not None or int(_opt(at.get("weight_prepacked"), 0)):
        raise ValueError("MatMulNBits with g_idx or prepacked weights is not covered")
    if bits not in (2, 4, 8):
        raise ValueError(f"MatMulNBits with {bits} bits is not covered")
    blocks = -(-inner // block)
    quantized = _unpack(b, bits, blocks * block).astype(np.float64)
    sc = np.asarray(scales).reshape(columns, blocks)
    if zero_points is None:
        zp = np.full((columns, blocks), float(1 << (bits - 1)))
    elif zero_points.dtype == np.uint8:
        zp = _unpack(zero_points.reshape(columns, -1, 1), bits, blocks).astype(np.float64)
    else:
        zp = np.asarray(zero_points, np.float64).reshape(columns, blocks)
    weight = (quantized.reshape(columns, blocks, block) - zp[..., None]) * sc[..., None].astype(np.float64)
    weight = weight.reshape(columns, -1)[:, :inner]
    weight = weight.astype(a.dtype)
    product = np.matmul(a, weight.T) + (0 if bias is None else bias)
    if not want:
        return (product,), None
    flat = a.reshape(-1, inner)
    mag = _hm(inner, flat.shape[0] * columns) * np.matmul(np.abs(a), np.abs(weight.T)) + np.matmul(
        np.abs(a), np.abs(weight.T)
    )
    if bias is not None:
        mag = mag + np.abs(product)
    if int(_opt(at.get("accuracy_level"), 0)) == 4:  # a quantized to int8 per block: ±scale/2 each
        pad = blocks * block - inner
        ab = np.pad(np.abs(flat), ((0, 0), (0, pad))).reshape(-1, blocks, block)
        step = ab.max(axis=-1, keepdims=True) / 127 / 2 / 2.0**-24
        err = np.broadcast_to(step, ab.shape).reshape(-1, blocks * block)[:, :inner]
        mag = mag + np.matmul(err, np.abs(weight.T)).reshape(mag.shape)
    return (product,), mag


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
