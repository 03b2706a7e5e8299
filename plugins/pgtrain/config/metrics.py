"""The validation metrics a run records and a quality gate may name: the one place that knows each metric's name,
task, direction and label. ``pgtrain.data.metrics`` computes the classification ones; the trainer computes the
regression ones. No numpy here: the DAG files import this (through the params) when they are parsed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CLASSIFICATION, REGRESSION = "classification", "regression"
# The key of a classification run's confusion matrix in its epoch metrics and its version's metrics:
# {"labels": [...], "counts": [[...]] (rows: true class, columns: predicted), "unseen": [...]}.
CONFUSION_MATRIX = "confusion_matrix"


@dataclass(frozen=True)
class Metric:
    name: str
    label: str  # what a page or a message calls it
    tasks: tuple[str, ...]
    higher_is_better: bool
    undefined_when: str | None = None  # when the run records None for it (validation rows aside)

    @property
    def better(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def worse(self, value: float, than: float) -> bool:
        """Whether ``value`` is worse than ``than`` (beyond float noise)."""
        return value < than - 1e-12 if self.higher_is_better else value > than + 1e-12

    def worsened(self, value: float, by: float) -> float:
        """``value`` made worse by ``by``: the bound a value ``by`` worse than the head's may reach."""
        return value - by if self.higher_is_better else value + by


_BOTH = (CLASSIFICATION, REGRESSION)
# In the order pages show them.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("val_accuracy", "accuracy", (CLASSIFICATION,), True),
    Metric("val_balanced_accuracy", "balanced accuracy", (CLASSIFICATION,), True),
    Metric("val_f1_macro", "F1 (macro)", (CLASSIFICATION,), True),
    Metric("val_precision_macro", "precision (macro)", (CLASSIFICATION,), True),
    Metric("val_recall_macro", "recall (macro)", (CLASSIFICATION,), True),
    Metric("val_roc_auc", "ROC AUC", (CLASSIFICATION,), True,
           "a class the model knows has no validation rows"),
    # classification: log loss; regression: mean squared error of the (standardized) target
    Metric("val_loss", "loss", _BOTH, False),
    Metric("val_rmse", "RMSE", (REGRESSION,), False),
    Metric("val_mae", "MAE", (REGRESSION,), False),
    Metric("val_r2", "R²", (REGRESSION,), True, "the validation targets are constant"),
)}


# A version's figures on its test rows (rows that chose nothing): each validation metric's name with this prefix for
# "val_" (test_accuracy, test_rmse, ..., test_confusion_matrix). FIGURES_FROM in a version's metrics says which
# rows its reported figures come from: "test", or "validation" (no test rows: a run with test_fraction 0, or a
# version from before the test part).
TEST_PREFIX, VALIDATION_PREFIX = "test_", "val_"
FIGURES_FROM = "figures_from"


def test_name(name: str) -> str:
    """The test-row figure of validation metric ``name`` (val_accuracy -> test_accuracy)."""
    return TEST_PREFIX + name.removeprefix(VALIDATION_PREFIX)


def figures_from(metrics: Mapping[str, Any]) -> str:
    """Which rows a version's reported figures come from: "test" when it recorded test figures, else "validation"."""
    return metrics.get(FIGURES_FROM) or ("test" if any(k.startswith(TEST_PREFIX) for k in metrics) else "validation")


def reported(metrics: Mapping[str, Any], name: str, rows: str | None = None) -> Any:
    """Validation metric ``name``'s reported figure: read on the test rows where the version has them (or on the
    rows ``rows`` says: "test" or "validation")."""
    return metrics.get(test_name(name) if (rows or figures_from(metrics)) == "test" else name)


def metric_problems(name: str, task: str | None) -> list[str]:
    """Why ``name`` cannot judge a run of ``task`` (None: any task): not a metric, or one of the other task."""
    if name not in METRICS:
        return [f"{name!r} is not a metric; the metrics are: {', '.join(METRICS)}"]
    metric = METRICS[name]
    if task is not None and task not in metric.tasks:
        return [f"{name} is a {' and '.join(metric.tasks)} metric, and the run's task is {task}"]
    return []
