"""What one row costs a network's forward pass, in multiply-adds: what a rank sizes its training threads by."""

from __future__ import annotations

from torch import nn

from pgtrain.models.ensemble import BatchEnsembleLinear, MembersLinear

# Layers whose every weight of two or more dimensions is used once a row (a shared-weight ensemble's: once per
# member). Any other layer with such a weight (a convolution, a recurrent or attention layer, a parametrized
# weight, a user's own) makes the count unknown.
DENSE = (nn.Linear, nn.Bilinear, BatchEnsembleLinear, MembersLinear)


def multiply_adds_per_row(model: nn.Module) -> int | None:
    """The multiply-adds of one row's forward pass through the model's dense layers (elementwise work and lookups
    left out: small beside the matrix products); None when the model has a layer of another kind, whose cost this
    cannot tell."""
    total = 0
    for module in model.modules():
        weights = [p for _, p in module.named_parameters(recurse=False) if p.dim() >= 2]
        if not weights or isinstance(module, nn.Embedding):
            continue
        if not isinstance(module, DENSE):
            return None
        uses = module.r.shape[0] if isinstance(module, BatchEnsembleLinear) else 1  # its other tensors: scalings
        total += module.weight.numel() * uses
    return total
