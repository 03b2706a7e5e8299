"""What one row costs a network's forward pass, in multiply-adds: what a rank sizes its CPU threads by."""

from __future__ import annotations

from torch import nn

from pgtrain.models.ensemble import BatchEnsembleLinear


def multiply_adds_per_row(model: nn.Module) -> int:
    """The multiply-adds of one row's forward pass through the model's dense layers: each weight of two or more
    dimensions is used once a row, a shared-weight ensemble's once per member. Lookups (``nn.Embedding``) and
    elementwise work are left out: small beside the matrix products wherever threads could pay."""
    total = 0
    for module in model.modules():
        weight = module._parameters.get("weight")  # the module's own, not its children's
        if weight is None or weight.dim() < 2 or isinstance(module, nn.Embedding):
            continue
        total += weight.numel() * (module.r.shape[0] if isinstance(module, BatchEnsembleLinear) else 1)
    return total
