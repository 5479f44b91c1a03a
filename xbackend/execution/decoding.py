"""Greedy decoding inside the worker: a causal language model's next token, step after step, for
each batch composition of the prompts, on the engine the worker built.

The model's convention (xbackend.execution.decoding.Convention) names its inputs and outputs:
`input_ids` [B, T] and `logits` [B, T, V], with `attention_mask` and `position_ids` when it takes
them; with a KV cache, `past_key_values.N.key/.value` in and `present.N.key/.value` out (the
names optimum and torch.onnx exports use). Without a cache every step runs the whole grown
sequence; with one, the first step runs the prompt against an empty cache and each later step
one token against the cache the step before returned. Prompts of different lengths share a
batch padded on the left (attention mask 0, positions counted over the real tokens only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Convention", "DecodeTask", "RowTrace", "decode", "prompt_key", "top_two"]


def prompt_key(k: int) -> str:
    """The name prompt k has in a prompts file."""
    return f"prompt.{k}"


@dataclass(frozen=True)
class Convention:
    """A causal language model's I/O names, and what an empty KV cache looks like."""

    input_ids: str = "input_ids"
    logits: str = "logits"
    attention_mask: str = ""
    position_ids: str = ""
    # per layer: (past key in, past value in, present key out, present value out)
    past: tuple[tuple[str, str, str, str], ...] = ()
    past_heads: int = 0
    past_dim: int = 0
    past_dtype: str = "float32"
    ids_dtype: str = "int64"
    mask_dtype: str = "int64"
    pad_id: int = 0

    @property
    def cached(self) -> bool:
        """Whether the model decodes with a KV cache (past in, present out)."""
        return bool(self.past)

    def outputs(self) -> tuple[str, ...]:
        """What each step reads back: the logits, and the cache it hands the next step."""
        return (self.logits, *(n for p in self.past for n in p[2:]))

    def to_dict(self) -> dict[str, Any]:
        """The convention as JSON data."""
        return {
            "input_ids": self.input_ids,
            "logits": self.logits,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "past": [list(p) for p in self.past],
            "past_heads": self.past_heads,
            "past_dim": self.past_dim,
            "past_dtype": self.past_dtype,
            "ids_dtype": self.ids_dtype,
            "mask_dtype": self.mask_dtype,
            "pad_id": self.pad_id,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Convention:
        """The convention as to_dict wrote it."""
        return cls(
            str(d["input_ids"]),
            str(d["logits"]),
            str(d["attention_mask"]),
            str(d["position_ids"]),
            tuple((str(a), str(b), str(c), str(e)) for a, b, c, e in d["past"]),
            int(d["past_heads"]),
            int(d["past_dim"]),
            str(d["past_dtype"]),
            str(d["ids_dtype"]),
            str(d["mask_dtype"]),
            int(d["pad_id"]),
        )


@dataclass(frozen=True)
class DecodeTask:
    """What a decode job does: `steps` greedy tokens for each composition (a batch of prompt
    indices; a single index is the prompt alone), the prompts in a value file."""

    convention: Convention
    steps: int
    prompts: str
    compositions: tuple[tuple[int, ...], ...]
    logits: str = ""  # where each prompt's chosen-position logits go, step by step (alone only)

    def to_dict(self) -> dict[str, Any]:
        """The task as JSON data, for the worker's job file."""
        return {
            "convention": self.convention.to_dict(),
            "steps": self.steps,
            "prompts": self.prompts,
            "compositions": [list(composition) for composition in self.compositions],
            "logits": self.logits,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecodeTask:
        """The task as to_dict wrote it."""
        return cls(
            Convention.from_dict(d["convention"]),
            int(d["steps"]),
            str(d["prompts"]),
            tuple(tuple(int(i) for i in composition) for composition in d["compositions"]),
            str(d.get("logits", "")),
        )


@dataclass(frozen=True)
class RowTrace:
    """One prompt decoded in one composition: its tokens and each step's top-1/top-2 margin."""

    composition: int
    prompt: int
    row: int
    tokens: tuple[int, ...]
    margins: tuple[float, ...]
    # in a batch: the largest |logit - the prompt alone's| while its tokens still agree
    moved: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The row's trace as JSON data, for the worker's result."""
        return {
            "composition": self.composition,
            "prompt": self.prompt,
            "row": self.row,
            "tokens": list(self.tokens),
            "margins": list(self.margins),
            "moved": self.moved,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RowTrace:
        """The trace as to_dict wrote it."""
        return cls(
            int(d["composition"]),
            int(d["prompt"]),
            int(d["row"]),
            tuple(int(token) for token in d["tokens"]),
            tuple(float(margin) for margin in d["margins"]),
            float(d.get("moved", 0.0)),
        )


def top_two(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Along the last axis: the argmax (the lowest index among ties) and top-1 minus top-2, in
    float64 (exact for float32 scores). Two passes of max: a partition or a sort of the
    vocabulary cost more than a small model's step."""
    if scores.dtype not in (np.float16, np.float32, np.float64):  # bfloat16, float8, integers: widened
        scores = scores.astype(np.float64)
    chosen = np.argmax(scores, axis=-1)
    if scores.shape[-1] < 2:
        return chosen, np.zeros(scores.shape[:-1])
    at = chosen[..., None]
    top = np.take_along_axis(scores, at, axis=-1)[..., 0].astype(np.float64)
    rest = np.array(scores, copy=True)
    np.put_along_axis(rest, at, -np.inf, axis=-1)
    return chosen, top - rest.max(axis=-1).astype(np.float64)


class _Batch:
    """One composition's growing inputs."""

    def __init__(self, conv: Convention, prompts: Sequence[np.ndarray]) -> None:
        self.conv = conv
        width = max(len(prompt) for prompt in prompts)
        ids = np.full((len(prompts), width), conv.pad_id, dtype=conv.ids_dtype)
        mask = np.zeros((len(prompts), width), dtype=conv.mask_dtype)
        for index, p in enumerate(prompts):  # padded on the left: every row ends at its last token
            ids[index, width - len(p) :] = p
            mask[index, width - len(p) :] = 1
        self.ids, self.mask = ids, mask
        self.pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int64)
        self.past: dict[str, np.ndarray] = {}
        if conv.cached:
            empty = np.zeros((len(prompts), conv.past_heads, 0, conv.past_dim), dtype=conv.past_dtype)
            self.past = {n: empty for p in conv.past for n in p[:2]}
        self.fed = ids  # what the next step feeds as input_ids
        self.fed_pos = self.pos

    def feeds(self) -> dict[str, Any]:
        conv = self.conv
        out: dict[str, Any] = {conv.input_ids: self.fed}
        if conv.attention_mask:
            out[conv.attention_mask] = self.mask
        if conv.position_ids:
            out[conv.position_ids] = self.fed_pos.astype(np.int64)
        out.update(self.past)
        return out

    def advance(self, chosen: np.ndarray, outputs: Mapping[str, Any]) -> None:
        conv = self.conv
        col = chosen.astype(conv.ids_dtype)[:, None]
        self.ids = np.concatenate([self.ids, col], axis=1)
        self.mask = np.concatenate([self.mask, np.ones_like(self.mask[:, :1])], axis=1)
        self.pos = np.concatenate([self.pos, self.pos[:, -1:] + 1], axis=1)
        if conv.cached:
            self.past = {}
            for pk, pv, ok, ov in conv.past:
                self.past[pk] = np.asarray(outputs[ok])
                self.past[pv] = np.asarray(outputs[ov])
            self.fed, self.fed_pos = col, self.pos[:, -1:]
        else:
            self.fed, self.fed_pos = self.ids, self.pos


def decode(
    run: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    task: DecodeTask,
    prompts: Sequence[np.ndarray],
    tick: Callable[[str], None] = lambda _text: None,
) -> tuple[list[RowTrace], dict[str, np.ndarray], list[float], list[tuple[str, str]]]:
    """Decode every composition; returns each row's trace, each prompt's chosen-position logits
    per step ([steps, V], from its composition alone), the seconds of each alone step, and the
    batch compositions that failed (the prompts alone still count), with the reason."""
    rows: list[RowTrace] = []
    logits: dict[str, np.ndarray] = {}
    seconds: list[float] = []
    failed: list[tuple[str, str]] = []
    alone_tokens: dict[int, list[int]] = {}
    for ci, comp in enumerate(task.compositions):
        try:
            rows += _composition(run, task, prompts, ci, comp, logits, seconds, alone_tokens, tick)
        except Exception as error:
            if len(comp) == 1:
                raise  # a prompt alone is what every comparison needs
            failed.append((f"batch {list(comp)}", f"{type(error).__name__}: {error}".splitlines()[0][:300]))
    return rows, logits, seconds, failed


def _composition(
    run: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    task: DecodeTask,
    prompts: Sequence[np.ndarray],
    ci: int,
    comp: tuple[int, ...],
    logits: dict[str, np.ndarray],
    seconds: list[float],
    alone_tokens: dict[int, list[int]],
    tick: Callable[[str], None],
) -> list[RowTrace]:
    """One composition decoded; a prompt alone keeps its logits and step times."""
    conv = task.convention
    batch = _Batch(conv, [prompts[p] for p in comp])
    tokens: list[list[int]] = [[] for _ in comp]
    margins: list[list[float]] = [[] for _ in comp]
    moved = [0.0] * len(comp)
    kept: list[np.ndarray] = []
    for step in range(task.steps):
        tick(f"composition {ci + 1}/{len(task.compositions)}: step {step + 1}/{task.steps}")
        t0 = time.perf_counter()
        out = run(batch.feeds())
        last = np.asarray(out[conv.logits])[:, -1, :]
        chosen, margin = top_two(last)
        batch.advance(chosen, out)
        if len(comp) == 1:
            seconds.append(time.perf_counter() - t0)
            kept.append(np.array(last[0], dtype=np.float32))
        for r, p in enumerate(comp):
            alone = logits.get(f"logits.{p}")
            agree = alone is not None and step < len(alone) and tokens[r] == alone_tokens.get(p, [])[:step]
            if len(comp) > 1 and agree and alone is not None:
                diff = np.abs(last[r].astype(np.float64) - alone[step].astype(np.float64))
                moved[r] = max(moved[r], float(np.max(diff)))
            tokens[r].append(int(chosen[r]))
            margins[r].append(float(margin[r]))
    if len(comp) == 1:
        logits[f"logits.{comp[0]}"] = np.stack(kept) if kept else np.zeros((0, 0), np.float32)
        alone_tokens[comp[0]] = tokens[0]
    return [
        RowTrace(ci, p, index, tuple(tokens[index]), tuple(margins[index]), moved[index])
        for index, p in enumerate(comp)
    ]
