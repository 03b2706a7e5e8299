"""The built-in MLP as a shared-weight ensemble of k members (BatchEnsemble, as TabM uses it; issue 31).

Each hidden Linear layer has one weight matrix every member shares, and per member a scaling of its input (``r``),
of its output (``s``) and a bias: ``(x * r) @ W.T * s + b``. The first layer's input scalings start as random
signs (the members differ from the first step), every other scaling at one; each member has its own output layer.
While training, the network returns every member's output, ``(rows, members, outputs)``, and each member is
trained on the batch by its own loss (``member_loss``: the mean of the members' losses); in eval mode it returns
the members' average: of the values (regression), or of the class probabilities (classification: the log of the
mean softmax, so that a softmax of the output is that average).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pgtrain.models.layers import hidden_layers

AVERAGES = ("values", "probabilities")


def _uniform(tensor: torch.Tensor, fan_in: int) -> torch.Tensor:
    bound = fan_in ** -0.5  # nn.Linear's default range
    return nn.init.uniform_(tensor, -bound, bound)


class BatchEnsembleLinear(nn.Module):
    """k Linear layers in one: a shared ``weight``, per member ``r`` (input scaling), ``s`` (output scaling) and
    ``bias``. Input and output ``(rows, members, features)``."""

    def __init__(self, in_features: int, out_features: int, members: int, random_signs: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(_uniform(torch.empty(out_features, in_features), in_features))
        r = torch.ones(members, in_features)
        self.r = nn.Parameter(r.bernoulli_(0.5).mul_(2).sub_(1) if random_signs else r)
        self.s = nn.Parameter(torch.ones(members, out_features))
        # every member's bias starts the same: one shared bias plus members' zero differences
        self.bias = nn.Parameter(_uniform(torch.empty(out_features), in_features).repeat(members, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.r) @ self.weight.t() * self.s + self.bias


class MembersLinear(nn.Module):
    """One Linear layer per member (the members' output layers). Input and output ``(rows, members, features)``."""

    def __init__(self, in_features: int, out_features: int, members: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(_uniform(torch.empty(members, in_features, out_features), in_features))
        self.bias = nn.Parameter(_uniform(torch.empty(members, out_features), in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bki,kio->bko", x, self.weight) + self.bias


class EnsembleMLP(nn.Module):
    """``members`` MLPs of ``hidden_sizes`` sharing their hidden weights; see the module's doc."""

    def __init__(self, input_dim: int, output_dim: int, hidden_sizes: Sequence[int], members: int,
                 dropout: float = 0.0, normalization: str = "none", average: str = "values") -> None:
        super().__init__()
        if average not in AVERAGES:
            raise ValueError(f"average={average!r} should be one of {', '.join(AVERAGES)}")
        self.members, self.average = members, average
        layers, fan_in = hidden_layers(
            input_dim, hidden_sizes,
            lambda fan_in, width, index: BatchEnsembleLinear(fan_in, width, members, random_signs=index == 0),
            normalization, dropout)
        self.hidden = nn.Sequential(*layers)
        self.output = MembersLinear(fan_in, output_dim, members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.output(self.hidden(x.unsqueeze(1).expand(-1, self.members, -1)))
        return out if self.training else combine(out, self.average)


def combine(out: torch.Tensor, average: str) -> torch.Tensor:
    """The members' ``(rows, members, outputs)`` -> their average ``(rows, outputs)`` (``average``: of the values,
    or of the softmax probabilities, returned as their log)."""
    if average == "values":
        return out.mean(1)
    return torch.logsumexp(torch.log_softmax(out, -1), 1) - math.log(out.shape[1])


def member_loss(loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], out: torch.Tensor,
                y: torch.Tensor) -> torch.Tensor:
    """``loss`` of a batch: of each member's output against the same targets, averaged over the members (a network
    of one output per row: ``loss`` itself). A mean over rows x members, so averaging ranks' gradients still equals
    one process on their concatenated batches."""
    if out.dim() != 3:
        return loss(out, y)
    return loss(out.flatten(0, 1), y.repeat_interleave(out.shape[1], 0))


def trained_output(out: torch.Tensor, regression: bool) -> torch.Tensor:
    """A training step's output as one prediction per row, for the epoch's training figures."""
    if out.dim() != 3:
        return out
    return combine(out.detach(), "values" if regression else "probabilities")
