"""Per-point features summed into a few cells with `index_add_`: on a GPU, atomic adds whose
order changes from run to run unless torch's deterministic algorithms are on.

Export:
    xbackend export torch models/torch_index_add.py:build --input x=2048,256 -o models/torch_index_add.onnx
"""

from __future__ import annotations

import torch
from torch import nn

CELLS = 2  # 2048 points into 2 cells: many collisions per cell


class IndexAddPool(nn.Module):
    def __init__(self, width: int = 256, cells: int = CELLS) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.cells = cells

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = torch.relu(self.proj(x))
        index = torch.arange(x.shape[0], device=x.device) % self.cells
        pooled = torch.zeros(self.cells, feats.shape[1], dtype=feats.dtype, device=feats.device)
        return pooled.index_add(0, index, feats)


def build() -> IndexAddPool:
    """Seeded weights: the same module every time."""
    torch.manual_seed(0)
    return IndexAddPool().eval()
