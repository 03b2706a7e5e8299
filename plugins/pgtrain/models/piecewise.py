"""Piecewise-linear encoding of numeric inputs (Gorishniy et al. 2022, "On Embeddings for Numerical Features in
Tabular Deep Learning"; TabM's numeric inputs), over the quantile bin edges planning recorded
(``pgtrain.data.quantiles``).

A value x of a column with edges b_0 < b_1 < ... < b_T becomes T inputs, one per bin [b_(t-1), b_t]:
(x - b_(t-1)) / (b_t - b_(t-1)) kept within [0, 1] (1: x is past the bin, 0: x is before it), except that the first
bin has no lower bound and the last no upper one, so a value outside the training range still moves the input. The
edges are buffers derived from the input record (not in the state dict: the record is the one place they live).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class PiecewiseLinear(nn.Module):
    """``(raw, standardized)``, both ``(rows, columns)`` -> every bin of every column with ``edges`` (in column
    order), then the standardized value of each other column (``edges`` covers the leading columns; () for one
    without edges)."""

    def __init__(self, edges: Sequence[Sequence[float]], columns: int) -> None:
        super().__init__()
        column, left, width, low, high = [], [], [], [], []
        for index, bounds in enumerate(edges):
            bins = len(bounds) - 1
            for t in range(bins):
                column.append(index)
                left.append(bounds[t])
                width.append(bounds[t + 1] - bounds[t])
                low.append(-torch.inf if t == 0 else 0.0)
                high.append(torch.inf if t == bins - 1 else 1.0)
        kept = [i for i in range(columns) if i >= len(edges) or not edges[i]]
        self.bins = len(column)
        for name, values, dtype in (("column", column, torch.long), ("left", left, torch.float32),
                                    ("width", width, torch.float32), ("low", low, torch.float32),
                                    ("high", high, torch.float32), ("kept", kept, torch.long)):
            self.register_buffer(name, torch.tensor(values, dtype=dtype), persistent=False)

    @property
    def width_out(self) -> int:
        return self.bins + len(self.kept)

    def forward(self, raw: torch.Tensor, standardized: torch.Tensor) -> torch.Tensor:
        position = (raw[:, self.column] - self.left) / self.width
        encoded = torch.minimum(torch.maximum(position, self.low), self.high)
        return torch.cat([encoded, standardized[:, self.kept]], 1)
