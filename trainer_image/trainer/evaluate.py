"""What an epoch is judged by: the training loss (class weights included) and the validation metrics over the
validation rows of all ranks, exactly (``pgtrain.data.metrics`` for classification); and, once after training, the
kept parameters' same metrics over the test rows of all ranks (``test_figures``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from pgtrain.config.metrics import CONFUSION_MATRIX, VALIDATION_PREFIX, test_name
from pgtrain.data.encoding import UNSEEN_CLASS
from pgtrain.data.metrics import classification_metrics
from pgtrain.models.network import PgtrainModel
from trainer import collectives

# Classification metrics gather every validation row's class probabilities (an allgather: on every rank, for rank 0
# to compute them); above this many values (rows x classes, float32: 64 MiB a rank) only accuracy and log loss are
# computed, from sums, and early stopping on another metric stops nothing.
GATHER_LIMIT = 1 << 24


def balanced_class_weights(labels: torch.Tensor, classes: int) -> torch.Tensor:
    """class_weight=balanced: training rows / (classes x the class's training rows), over all ranks (allreduced
    counts); a class without training rows weighs 0."""
    counts = torch.bincount(labels.cpu().long(), minlength=classes).double()
    counts = collectives.allreduce_sum(counts, "class_counts")
    weights = torch.where(counts > 0, counts.sum() / (classes * counts.clamp(min=1)), torch.zeros_like(counts))
    return weights.float()


class Task:
    """The loss, and the per-epoch figures every rank contributes to, of a classification or regression."""

    def __init__(self, regression: bool, output_dim: int, device: torch.device,
                 class_weights: torch.Tensor | None = None, classes: Sequence[Any] | None = None) -> None:
        self.regression = regression
        self.output_dim = output_dim
        self.device = device
        self.class_weights = None if class_weights is None else class_weights.to(device)
        self.classes = classes

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.regression:
            return F.mse_loss(out, y)
        if self.class_weights is None:
            return F.cross_entropy(out, y)
        # Weighted rows over the batch's row count, not over its weight sum: a sum of per-row terms, so averaging
        # the ranks' gradients still equals one process on their concatenated batches.
        return F.cross_entropy(out, y, weight=self.class_weights, reduction="sum") / len(y)

    def train_sums(self) -> torch.Tensor:
        """[loss summed over rows, correct predictions] accumulated on the device, read once per epoch."""
        return torch.zeros(2, dtype=torch.float64, device=self.device)

    def add_train(self, sums: torch.Tensor, loss: torch.Tensor, out: torch.Tensor, y: torch.Tensor) -> None:
        sums[0].add_(loss.detach(), alpha=len(y))
        if not self.regression:
            sums[1].add_((out.detach().argmax(1) == y).sum())

    @torch.no_grad()
    def validation(self, model: PgtrainModel, x: torch.Tensor, y: torch.Tensor, y_scaled: torch.Tensor,
                   gather: bool, chunk_rows: int = 65536) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(sums, probabilities) of this rank's validation rows. Classification sums: [log loss, correct, rows of a
        known class]; probabilities: each row's softmax (rows x classes, float32, host; written chunk by chunk into
        the one tensor, never a list concatenated) when ``gather``, else None. Regression sums: [loss
        (standardized), squared error, absolute error (target units), target sum per column, target sum of
        squares per column]."""
        d = self.output_dim
        sums = torch.zeros(3 if not self.regression else 3 + 2 * d, dtype=torch.float64, device=self.device)
        probabilities = torch.empty((len(x), d)) if gather and not self.regression else None
        for start in range(0, len(x), chunk_rows):  # rows kept in host memory come over chunk by chunk
            out = model.standardized(x[start:start + chunk_rows].to(self.device))
            target = y_scaled[start:start + chunk_rows].to(self.device)
            if not self.regression:
                # A class only validation rows have (UNSEEN_CLASS) adds no loss and is never predicted: wrong.
                sums[0] += F.cross_entropy(out, target, reduction="sum", ignore_index=UNSEEN_CLASS).double()
                sums[1] += (out.argmax(1) == target).sum()
                sums[2] += (target != UNSEEN_CLASS).sum()
                if probabilities is not None:
                    probabilities[start:start + chunk_rows] = out.softmax(1)
                continue
            sums[0] += F.mse_loss(out, target, reduction="sum").double() / d
            values = y[start:start + chunk_rows].to(self.device)
            error = (model.target(out) - values).double()
            sums[1] += (error * error).sum()
            sums[2] += error.abs().sum()
            values = values.double()
            sums[3:3 + d] += values.sum(0)
            sums[3 + d:] += (values * values).sum(0)
        return sums, probabilities

    def metrics(self, totals: torch.Tensor) -> dict[str, float | None]:
        """The epoch's figures from the allreduced [train sums, train rows, validation sums, validation rows]."""
        t = totals.tolist()
        train_rows, val_rows = t[2], t[-1]
        val = t[3:-1]
        figures: dict[str, float | None] = {"train_loss": t[0] / train_rows if train_rows else math.nan}
        if not self.regression:
            figures["train_accuracy"] = t[1] / train_rows if train_rows else None
            figures["val_loss"] = val[0] / val[2] if val[2] else None
            figures["val_accuracy"] = val[1] / val_rows if val_rows else None
            return figures
        d = self.output_dim
        elements = val_rows * d
        figures["val_loss"] = val[0] / val_rows if val_rows else None
        figures["val_rmse"] = math.sqrt(val[1] / elements) if val_rows else None
        figures["val_mae"] = val[2] / elements if val_rows else None
        # Pooled over the target's columns: 1 - SSE / sum of each column's squares about its own mean.
        sums, squares = val[3:3 + d], val[3 + d:3 + 2 * d]
        total = sum(sq - s * s / val_rows for s, sq in zip(sums, squares, strict=True)) if val_rows else 0.0
        figures["val_r2"] = 1.0 - val[1] / total if total > 0 else None
        return figures

    def gathers(self, validation_rows: int) -> bool:
        """Whether this epoch's classification metrics gather the probabilities (all ranks agree: global rows)."""
        return not self.regression and validation_rows * self.output_dim <= GATHER_LIMIT

    def exact_metrics(self, probabilities: torch.Tensor, labels: torch.Tensor) -> dict[str, Any] | None:
        """Every rank's validation probabilities and labels (an allgather, which every rank joins and every rank
        receives): the classification metrics of ``pgtrain.data.metrics`` on rank 0, None on the other ranks."""
        scores = collectives.allgather(probabilities, "val_probabilities")
        truth = collectives.allgather(labels.cpu().long(), "val_labels")
        if collectives.rank() != 0:
            return None
        return classification_metrics(scores.numpy(), truth.numpy(), self.classes)


def epoch_figures(task: Task, totals: torch.Tensor, exact: dict[str, Any] | None) -> dict[str, Any]:
    """The sums' figures, with the exact classification metrics over them where they were computed."""
    figures = task.metrics(totals)
    if exact is not None:
        figures.update(exact)
    return figures


def test_figures(task: Task, model: PgtrainModel, x: torch.Tensor, y: torch.Tensor, y_scaled: torch.Tensor,
                 test_rows: int) -> dict[str, Any]:
    """The kept parameters' figures on the test rows of all ranks (``test_rows`` of them): the validation metrics,
    computed exactly as an epoch's, named test_* (``pgtrain.config.metrics.test_name``). Every rank joins; rank 0's
    are complete (the exact classification metrics are gathered there)."""
    gather = task.gathers(test_rows)
    sums, probabilities = task.validation(model, x, y, y_scaled, gather)
    no_training = torch.zeros(3, dtype=torch.float64, device=sums.device)  # the epoch's train sums and rows
    count = torch.tensor([len(x)], dtype=torch.float64, device=sums.device)
    totals = collectives.allreduce_sum(torch.cat([no_training, sums, count]).cpu(), "test_totals")
    figures = epoch_figures(task, totals, task.exact_metrics(probabilities, y) if gather else None)
    return {test_name(k if k != CONFUSION_MATRIX else VALIDATION_PREFIX + k): v for k, v in figures.items()
            if k.startswith(VALIDATION_PREFIX) or k == CONFUSION_MATRIX}
