"""Small causal language models in two styles (Llama: RMSNorm, RoPE, SwiGLU, grouped KV heads;
GPT-2: LayerNorm, learned positions, GELU), with or without a KV cache, random weights from a
seed, exported to ONNX with dynamic batch and sequence axes."""

from __future__ import annotations

import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rope(x, pos, base=10000.0):
    d = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos[:, None, :, None].float() * inv  # [B,1,T,d/2]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attn(nn.Module):
    def __init__(s, dim, heads, kv_heads, llama):
        super().__init__()
        s.h, s.kv, s.d, s.llama = heads, kv_heads, dim // heads, llama
        s.q = nn.Linear(dim, heads * s.d, bias=not llama)
        s.k = nn.Linear(dim, kv_heads * s.d, bias=not llama)
        s.v = nn.Linear(dim, kv_heads * s.d, bias=not llama)
        s.o = nn.Linear(heads * s.d, dim, bias=not llama)

    def forward(s, x, mask, pos, pk, pv):
        B, T, _ = x.shape
        q = s.q(x).view(B, T, s.h, s.d).transpose(1, 2)
        k = s.k(x).view(B, T, s.kv, s.d).transpose(1, 2)
        v = s.v(x).view(B, T, s.kv, s.d).transpose(1, 2)
        if s.llama:
            q, k = rope(q, pos), rope(k, pos)
        if pk is not None:
            k = torch.cat([pk, k], dim=2)
            v = torch.cat([pv, v], dim=2)
        present = (k, v)
        rep = s.h // s.kv
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        S = kk.shape[2]
        att = (q @ kk.transpose(-1, -2)) / math.sqrt(s.d)
        qpos = torch.arange(T) + (S - T)
        causal = torch.arange(S)[None, :] <= qpos[:, None]  # [T,S]
        keep = causal[None, None] & (mask[:, None, None, :] > 0)
        att = att.masked_fill(~keep, -1e9).softmax(-1)
        y = (att @ vv).transpose(1, 2).reshape(B, T, s.h * s.d)
        return s.o(y), present


class Block(nn.Module):
    def __init__(s, dim, heads, kv_heads, llama):
        super().__init__()
        s.n1 = RMSNorm(dim) if llama else nn.LayerNorm(dim)
        s.n2 = RMSNorm(dim) if llama else nn.LayerNorm(dim)
        s.attn = Attn(dim, heads, kv_heads, llama)
        s.llama = llama
        if llama:
            s.gate = nn.Linear(dim, 4 * dim, bias=False)
            s.up = nn.Linear(dim, 4 * dim, bias=False)
            s.down = nn.Linear(4 * dim, dim, bias=False)
        else:
            s.fc = nn.Linear(dim, 4 * dim)
            s.proj = nn.Linear(4 * dim, dim)

    def forward(s, x, mask, pos, pk, pv):
        a, present = s.attn(s.n1(x), mask, pos, pk, pv)
        x = x + a
        h = s.n2(x)
        m = (
            s.down(nn.functional.silu(s.gate(h)) * s.up(h))
            if s.llama
            else s.proj(nn.functional.gelu(s.fc(h)))
        )
        return x + m, present


class TinyLM(nn.Module):
    def __init__(
        s, style="llama", vocab=512, dim=64, layers=2, heads=4, kv_heads=2, cache=False, max_pos=512
    ):
        super().__init__()
        llama = style == "llama"
        s.cache, s.llama, s.layers = cache, llama, layers
        s.emb = nn.Embedding(vocab, dim)
        if not llama:
            s.wpe = nn.Embedding(max_pos, dim)
        s.blocks = nn.ModuleList(
            Block(dim, heads, kv_heads if llama else heads, llama) for _ in range(layers)
        )
        s.norm = RMSNorm(dim) if llama else nn.LayerNorm(dim)
        s.head = nn.Linear(dim, vocab, bias=False)

    def forward(s, input_ids, attention_mask, position_ids, *past):
        x = s.emb(input_ids)
        if not s.llama:
            x = x + s.wpe(position_ids)
        presents = []
        for i, b in enumerate(s.blocks):
            pk, pv = (past[2 * i], past[2 * i + 1]) if s.cache else (None, None)
            x, p = b(x, attention_mask, position_ids, pk, pv)
            presents += list(p)
        logits = s.head(s.norm(x))
        return (logits, *presents) if s.cache else logits


def export(path, style="llama", cache=False, seed=0, **kw):
    torch.manual_seed(seed)
    m = TinyLM(style, cache=cache, **kw).eval()
    B, T, P = 2, 5, 3
    ids = torch.randint(0, 16, (B, T))
    pos = torch.arange(P, P + T).expand(B, T) if cache else torch.arange(T).expand(B, T)
    mask = torch.ones(B, P + T if cache else T, dtype=torch.int64)
    hkv = m.blocks[0].attn.kv
    d = m.blocks[0].attn.d
    past = [torch.randn(B, hkv, P, d) for _ in range(2 * m.layers)] if cache else []
    names = ["input_ids", "attention_mask", "position_ids"]
    outs = ["logits"]
    b, t = torch.export.Dim("batch"), torch.export.Dim("seq")
    shapes = [{0: b, 1: t}, {0: b, 1: (torch.export.Dim("total") if cache else t)}, {0: b, 1: t}]
    if cache:
        p = torch.export.Dim("past")
        for i in range(m.layers):
            names += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
            outs += [f"present.{i}.key", f"present.{i}.value"]
        shapes.append(tuple([{0: b, 2: p}] * (2 * m.layers)))
    with torch.no_grad():
        torch.onnx.export(
            m,
            (ids, mask, pos, *past),
            path,
            dynamo=True,
            input_names=names,
            output_names=outs,
            dynamic_shapes=tuple(shapes),
        )
    return m


def gpt2_module():
    torch.manual_seed(0)
    return TinyLM("gpt2").eval()


def llama_module():
    torch.manual_seed(0)
    return TinyLM("llama").eval()
