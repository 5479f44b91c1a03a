"""optimum's decoder exports (tests/optimum) trained briefly, so their top-1/top-2 margins are
real: the Hugging Face model is built from the config export.py exported, given the ONNX file's
weights, trained a few hundred steps on a seeded synthetic language (each sequence a walk
t -> (a*t + b) mod V, its (a, b) from a small set), and its weights written back into a copy of
the ONNX file. Every initializer is matched to the parameter it holds by value before training
(transposed where a MatMul reads it); parameters that share an initializer, and those no
initializer holds, are frozen, so the graph stays the export's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from tests.optimum import optimum_torch

HERE = Path(__file__).resolve().parent / "optimum"


def _walks(n: int, length: int, vocab: int, rng: np.random.Generator) -> torch.Tensor:
    rules = [(3, 7), (5, 11), (7, 1), (9, 4)]
    out = np.empty((n, length), np.int64)
    for k in range(n):
        a, b = rules[rng.integers(len(rules))]
        t = int(rng.integers(vocab))
        for j in range(length):
            out[k, j] = t
            t = (a * t + b) % vocab
    return torch.from_numpy(out)


def trained(family: str, dest: Path, steps: int = 300, seed: int = 0, hf: Path | None = None) -> Path:
    """`tests/optimum/FAMILY.onnx` with its weights trained `steps` steps; written to `dest` (and,
    with `hf`, the trained Hugging Face model's folder there, as save_pretrained writes it)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    src = HERE / f"{family}.onnx"
    wrapper = getattr(optimum_torch, family)()
    model = wrapper.model
    proto = onnx.load(src)
    params = dict(model.named_parameters())
    holds: dict[str, list[tuple[str, bool]]] = {}  # parameter -> (initializer, transposed)
    for t in proto.graph.initializer:
        v = numpy_helper.to_array(t)
        if v.dtype != np.float32 or v.size < 2:
            continue
        for name, p in params.items():
            w = p.detach().numpy()
            if w.shape == v.shape and np.array_equal(w, v):
                holds.setdefault(name, []).append((t.name, False))
            elif v.ndim == 2 and w.shape == v.T.shape and np.array_equal(w, v.T):
                holds.setdefault(name, []).append((t.name, True))
    owners: dict[str, int] = {}
    for hs in holds.values():
        for i, _ in hs:
            owners[i] = owners.get(i, 0) + 1
    train = [n for n, hs in holds.items() if all(owners[i] == 1 for i, _ in hs)]
    for name, p in params.items():
        p.requires_grad_(name in train)
    model.train()
    opt = torch.optim.Adam([params[n] for n in train], lr=3e-3)
    vocab = int(model.config.vocab_size)
    for _ in range(steps):
        x = _walks(16, 24, vocab, rng)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    inits = {t.name: t for t in proto.graph.initializer}
    for name in train:
        w = params[name].detach().numpy()
        for i, transposed in holds[name]:
            inits[i].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(w.T if transposed else w), i))
    onnx.save(proto, dest)
    if hf is not None:
        model.save_pretrained(hf, safe_serialization=True)
    return dest
