"""The residual MLP + LayerNorm stack as a PyTorch module (the source of torch_mlp.onnx).

Export: xbackend export torch models/torch_mlp.py:build --input x=1,16,64 -o models/torch_mlp.onnx
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """Pre-norm residual MLP block: x + fc2(SiLU(fc1(LN(x))))."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.SiLU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


class ResidualMLP(nn.Module):
    def __init__(self, blocks: int = 6, width: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block(width, hidden) for _ in range(blocks)])
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(x))


def build() -> ResidualMLP:
    """Seeded weights: the same module every time."""
    torch.manual_seed(0)
    return ResidualMLP().eval()
