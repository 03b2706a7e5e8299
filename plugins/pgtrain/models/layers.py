"""The hidden layers every built-in mlp stacks (the plain one and each member of the shared-weight ensemble)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn


def hidden_layers(fan_in: int, hidden_sizes: Sequence[int], linear: Callable[[int, int, int], nn.Module],
                  normalization: str = "none", dropout: float = 0.0) -> tuple[list[nn.Module], int]:
    """``linear(fan_in, width, index)`` per hidden width, each followed by LayerNorm (``normalization="layer"``),
    ReLU and Dropout (when ``dropout``): the layers and the last width."""
    layers: list[nn.Module] = []
    for index, width in enumerate(hidden_sizes):
        layers.append(linear(fan_in, width, index))
        if normalization == "layer":
            layers.append(nn.LayerNorm(width))
        layers.append(nn.ReLU())
        if dropout:
            layers.append(nn.Dropout(dropout))
        fan_in = width
    return layers, fan_in
