"""A residual MLP: ``model="trainer.examples.resmlp:residual_mlp"``, ``model_options={"width": 64, "blocks": 2}``.

The contract every factory follows: called as ``factory(input_dim=..., output_dim=..., **model_options)``,
returns a ``torch.nn.Module`` mapping a float32 ``(batch, input_dim)`` of standardized features to
``(batch, output_dim)``: logits for classification, the standardized target for regression.
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.inner = nn.Linear(width, width)
        self.outer = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.outer(torch.relu(self.inner(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, width: int, blocks: int) -> None:
        super().__init__()
        self.stem = nn.Linear(input_dim, width)
        self.blocks = nn.Sequential(*(ResidualBlock(width) for _ in range(blocks)))
        self.head = nn.Linear(width, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.blocks(self.stem(x))))


def residual_mlp(input_dim: int, output_dim: int, width: int = 64, blocks: int = 2) -> ResidualMLP:
    if width < 1 or blocks < 1:
        raise ValueError(f"width={width} and blocks={blocks} should both be >= 1")
    return ResidualMLP(input_dim, output_dim, width, blocks)
