"""A 2-block MLP wide enough that Inductor's C++ micro-GEMM and MKL round differently
(Linear 512->1024, GELU, Linear 1024->512, batch 64): the autotune tests' module."""

from __future__ import annotations

import torch
from torch import nn


def build() -> nn.Module:
    """Seeded weights: the same module every time."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512)) for _ in range(2)]
    return nn.Sequential(*blocks).eval()
