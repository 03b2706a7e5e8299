"""Early stopping: the best epoch so far by the run's ``early_stopping_metric``, and when patience runs out.

Rank 0 decides from the epoch's metrics over all ranks and every rank learns the decision (a broadcast), so no rank
waits in an allreduce the others skipped. The state is a function of the epochs' metrics, which a checkpoint keeps:
a resumed run recovers its best epoch and its patience from them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pgtrain.config.metrics import METRICS, Metric
from pgtrain.config.params import TrainingConfig

BEST_EPOCH = "best_epoch"  # in each epoch's metrics while early stopping is on: the best epoch so far


@dataclass
class EarlyStopping:
    metric: Metric
    patience: int  # 0: off (the last epoch's parameters are the run's)
    best_epoch: int | None = None
    best_value: float | None = None

    @classmethod
    def for_run(cls, config: TrainingConfig, validation_rows: int, history: Iterable[Mapping[str, Any]] = ()
                ) -> EarlyStopping:
        """Off with patience 0 or without validation rows; else replayed over the epochs already trained."""
        stopping = cls(METRICS[config.early_stopping_metric], config.early_stopping_patience if validation_rows else 0)
        for figures in history:
            stopping.update(figures["epoch"], figures)
        return stopping

    @property
    def on(self) -> bool:
        return self.patience > 0

    def update(self, epoch: int, figures: Mapping[str, Any]) -> bool:
        """Take the epoch's figures; True when it is the best so far (an undefined or non-finite metric never is)."""
        value = figures.get(self.metric.name)
        if not self.on or value is None or not math.isfinite(value):
            return False
        if self.best_value is None or self.metric.worse(self.best_value, value):
            self.best_epoch, self.best_value = epoch, float(value)
            return True
        return False

    def should_stop(self, epoch: int) -> bool:
        """Patience epochs in a row without a better metric than the best one. A metric that was never defined
        (ROC AUC with a class missing from the validation rows, R² of constant targets) stops nothing: the run
        trains its epochs and keeps the last one's parameters."""
        return self.on and self.best_epoch is not None and epoch - self.best_epoch >= self.patience
