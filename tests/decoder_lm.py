"""Small causal language models in two styles, random weights from a seed, exported to ONNX with
dynamic batch and sequence axes by torch.onnx (dynamo), in the convention `--decode` reads:

- Llama: RMSNorm, rotary positions, SwiGLU, grouped KV heads (4 query heads, 2 KV heads);
- GPT-2: LayerNorm, learned positions, GELU.

With `cache=True` the model takes past_key_values.N.key/.value and returns present.N.key/.value.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rope(x: torch.Tensor, pos: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos[:, None, :, None].float() * inv  # [B, 1, T, d/2]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, llama: bool) -> None:
        super().__init__()
        self.h, self.kv, self.d, self.llama = heads, kv_heads, dim // heads, llama
        self.q = nn.Linear(dim, heads * self.d, bias=not llama)
        self.k = nn.Linear(dim, kv_heads * self.d, bias=not llama)
        self.v = nn.Linear(dim, kv_heads * self.d, bias=not llama)
        self.o = nn.Linear(heads * self.d, dim, bias=not llama)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, pk: Any, pv: Any
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv, self.d).transpose(1, 2)
        if self.llama:
            q, k = rope(q, pos), rope(k, pos)
        if pk is not None:
            k = torch.cat([pk, k], dim=2)
            v = torch.cat([pv, v], dim=2)
        rep = self.h // self.kv
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        s = kk.shape[2]
        att = (q @ kk.transpose(-1, -2)) / math.sqrt(self.d)
        qpos = torch.arange(t) + (s - t)
        causal = torch.arange(s)[None, :] <= qpos[:, None]  # [T, S]
        keep = causal[None, None] & (mask[:, None, None, :] > 0)
        att = att.masked_fill(~keep, -1e9).softmax(-1)
        y = (att @ vv).transpose(1, 2).reshape(b, t, self.h * self.d)
        return self.o(y), (k, v)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, llama: bool) -> None:
        super().__init__()
        self.n1 = RMSNorm(dim) if llama else nn.LayerNorm(dim)
        self.n2 = RMSNorm(dim) if llama else nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, llama)
        self.llama = llama
        if llama:
            self.gate = nn.Linear(dim, 4 * dim, bias=False)
            self.up = nn.Linear(dim, 4 * dim, bias=False)
            self.down = nn.Linear(4 * dim, dim, bias=False)
        else:
            self.fc = nn.Linear(dim, 4 * dim)
            self.proj = nn.Linear(4 * dim, dim)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, pk: Any, pv: Any
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        a, present = self.attn(self.n1(x), mask, pos, pk, pv)
        x = x + a
        h = self.n2(x)
        if self.llama:
            m = self.down(nn.functional.silu(self.gate(h)) * self.up(h))
        else:
            m = self.proj(nn.functional.gelu(self.fc(h)))
        return x + m, present


class TinyLM(nn.Module):
    def __init__(
        self,
        style: str = "llama",
        vocab: int = 512,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
        kv_heads: int = 2,
        cache: bool = False,
        max_pos: int = 512,
    ) -> None:
        super().__init__()
        llama = style == "llama"
        self.cache, self.llama, self.layers = cache, llama, layers
        self.emb = nn.Embedding(vocab, dim)
        if not llama:
            self.wpe = nn.Embedding(max_pos, dim)
        kv = kv_heads if llama else heads
        self.blocks = nn.ModuleList(Block(dim, heads, kv, llama) for _ in range(layers))
        self.norm = RMSNorm(dim) if llama else nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *past: Any
    ) -> Any:
        x = self.emb(input_ids)
        if not self.llama:
            x = x + self.wpe(position_ids)
        presents: list[torch.Tensor] = []
        for i, b in enumerate(self.blocks):
            pk, pv = (past[2 * i], past[2 * i + 1]) if self.cache else (None, None)
            x, p = b(x, attention_mask, position_ids, pk, pv)
            presents += list(p)
        logits = self.head(self.norm(x))
        return (logits, *presents) if self.cache else logits


def export(path: str, style: str = "llama", cache: bool = False, seed: int = 0, **kw: Any) -> TinyLM:
    """Write the model to `path` (external data beside it, as the exporter writes it)."""
    torch.manual_seed(seed)
    m = TinyLM(style, cache=cache, **kw).eval()
    b, t, p = 2, 5, 3  # example sizes; every axis below is dynamic
    ids = torch.randint(0, 16, (b, t))
    pos = torch.arange(p, p + t).expand(b, t) if cache else torch.arange(t).expand(b, t)
    mask = torch.ones(b, p + t if cache else t, dtype=torch.int64)
    hkv, d = m.blocks[0].attn.kv, m.blocks[0].attn.d
    past = [torch.randn(b, hkv, p, d) for _ in range(2 * m.layers)] if cache else []
    names = ["input_ids", "attention_mask", "position_ids"]
    outs = ["logits"]
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    shapes: list[Any] = [{0: batch, 1: seq}, {0: batch, 1: torch.export.Dim("total") if cache else seq}]
    shapes.append({0: batch, 1: seq})
    if cache:
        for i in range(m.layers):
            names += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
            outs += [f"present.{i}.key", f"present.{i}.value"]
        shapes.append(tuple([{0: batch, 2: torch.export.Dim("past")}] * (2 * m.layers)))
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


def gpt2_module() -> TinyLM:
    """The GPT-2-style model `export(path, "gpt2")` writes (seed 0), for the torch backends."""
    torch.manual_seed(0)
    return TinyLM("gpt2").eval()
