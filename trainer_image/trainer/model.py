"""The MLP trained by pgtrain: input standardization, then Linear/ReLU layers (default 64 -> 50 -> 10)."""

from __future__ import annotations

import torch
from torch import nn

from pgtrain.model_spec import ModelSpec


class Standardize(nn.Module):
    """(x - mean) / std with statistics of the training rows, kept in the state dict so a version is usable alone."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.normalizer = Standardize(spec.input_dim)
        layers: list[nn.Module] = []
        dims = spec.layer_dims()
        for fan_in, fan_out in zip(dims, dims[1:], strict=False):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        self.layers = nn.Sequential(*layers[:-1])  # no activation after the output layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(self.normalizer(x))


def build_model(spec: ModelSpec, seed: int) -> MLP:
    torch.manual_seed(seed)
    return MLP(spec)
