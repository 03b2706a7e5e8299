"""A classification run's validation metrics, computed exactly from every validation row of every rank (the trainer
gathers the rows' class probabilities and labels on rank 0 and records what this returns with the epoch).

Pure numpy: the trainer image has no scikit-learn. Each figure is what ``sklearn.metrics`` reports for the same
predictions (tests/unit/test_metrics.py checks them against it), with the prediction the most probable class (the
first one on a tie) and these choices:

- zero division as scikit-learn's default: a class never predicted has precision 0, a class with no validation
  rows recall 0, and F1 is 0 where its denominator is;
- the macro averages (precision, recall, F1) are over the classes the validation rows have or the model predicts
  (scikit-learn's ``labels=None``), and balanced accuracy over the classes the validation rows have;
- a validation row of a class the training rows lacked (``UNSEEN_CLASS``: the model has no output for it) is
  wrong: it counts in accuracy's denominator, and all such rows form one more class of the macro averages and of
  balanced accuracy, never predicted (precision, recall and F1 0). It has no probability to score, so it is left
  out of the log loss and of ROC AUC, and its predictions are the confusion matrix's ``unseen`` row;
- the log loss clips each probability to [eps, 1 - eps], eps the machine epsilon of the probabilities' dtype;
- ROC AUC: of the second class with two classes; the unweighted mean over the classes of each class against
  the rest with more (one-vs-rest, macro). None when undefined: a class without validation rows, or without any
  other class's. Computed from ranks (Mann-Whitney U, ties sharing their average rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pgtrain.config.metrics import CONFUSION_MATRIX
from pgtrain.data.encoding import UNSEEN_CLASS

# More classes than this record no confusion matrix: each epoch's row would hold classes**2 counts.
CONFUSION_MATRIX_MAX_CLASSES = 100


def classification_metrics(probabilities: np.ndarray, labels: np.ndarray,
                           classes: Sequence[Any] | None = None) -> dict[str, Any]:
    """The validation metrics of ``probabilities`` (rows x classes: each row's softmax, in the recorded class order)
    for the true class numbers ``labels`` (0..classes-1, or UNSEEN_CLASS): val_accuracy, val_loss (log loss),
    val_balanced_accuracy, val_f1_macro, val_precision_macro, val_recall_macro, val_roc_auc (each a float, or None
    when undefined or there are no rows) and CONFUSION_MATRIX: {"labels": ``classes`` (default 0..classes-1),
    "counts": rows = true class, columns = predicted, "unseen": the predictions of the UNSEEN_CLASS rows}, None
    with more than CONFUSION_MATRIX_MAX_CLASSES classes."""
    scores = np.asarray(probabilities)
    y = np.asarray(labels)
    if scores.ndim != 2 or y.shape != (scores.shape[0],):
        raise ValueError(f"probabilities of shape {scores.shape} and labels of shape {y.shape}: expected "
                         "(rows, classes) and (rows,)")
    rows, k = scores.shape
    names = list(range(k)) if classes is None else [c.item() if isinstance(c, np.generic) else c for c in classes]
    if len(names) != k:
        raise ValueError(f"{len(names)} class labels for {k} columns of probabilities")
    y = y.astype(np.int64, copy=False)
    if rows and (y.min() < UNSEEN_CLASS or y.max() >= k):
        raise ValueError(f"labels must be class numbers 0..{k - 1} or UNSEEN_CLASS ({UNSEEN_CLASS})")
    known = y != UNSEEN_CLASS
    predicted = scores.argmax(axis=1) if k else np.zeros(rows, np.int64)
    counts = np.bincount(y[known] * k + predicted[known], minlength=k * k).reshape(k, k)
    unseen = np.bincount(predicted[~known], minlength=k)
    figures: dict[str, Any] = {
        **_counted(counts, unseen, rows),
        "val_loss": _log_loss(scores[known], y[known]),
        "val_roc_auc": roc_auc(scores[known], y[known]),
        CONFUSION_MATRIX: None if k > CONFUSION_MATRIX_MAX_CLASSES else
        {"labels": names, "counts": counts.tolist(), "unseen": unseen.tolist()},
    }
    return figures


def _counted(counts: np.ndarray, unseen: np.ndarray, rows: int) -> dict[str, float | None]:
    """The figures of the confusion matrix: accuracy, balanced accuracy and the macro averages."""
    names = ("val_accuracy", "val_balanced_accuracy", "val_f1_macro", "val_precision_macro", "val_recall_macro")
    if rows == 0:
        return dict.fromkeys(names)
    hits = np.diag(counts).astype(np.float64)
    truths, guesses = counts.sum(axis=1), counts.sum(axis=0) + unseen
    # The UNSEEN_CLASS rows as one more class: never predicted, so no hit, and 0 for each ratio.
    extra = [0.0] if unseen.sum() else []
    present = (truths > 0) | (guesses > 0)
    precision, recall = _ratio(hits, guesses), _ratio(hits, truths)
    f1 = _ratio(2 * hits, truths + guesses)

    def mean(values: np.ndarray) -> float:
        return float(np.mean(np.concatenate([values, extra])))

    return dict(zip(names, (float(hits.sum() / rows), mean(recall[truths > 0]), mean(f1[present]),
                            mean(precision[present]), mean(recall[present])), strict=True))


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (scikit-learn's default zero_division)."""
    return np.divide(numerator, denominator, out=np.zeros(len(numerator)), where=denominator > 0)


def _log_loss(scores: np.ndarray, y: np.ndarray) -> float | None:
    if len(y) == 0:
        return None
    dtype = scores.dtype if np.issubdtype(scores.dtype, np.floating) else np.float64
    eps = np.finfo(dtype).eps
    chosen = np.clip(scores[np.arange(len(y)), y], eps, 1 - eps)
    return float(-np.mean(np.log(chosen.astype(np.float64))))


def roc_auc(scores: np.ndarray, y: np.ndarray) -> float | None:
    """ROC AUC of ``scores`` (rows x classes) for the class numbers ``y`` (0..classes-1): of class 1 with two
    classes, else the macro one-vs-rest mean; None when a class has no row or every row is of one class."""
    rows, k = scores.shape
    if k < 2:
        return None
    columns = scores[:, 1:] if k == 2 else scores
    positives = np.bincount(y, minlength=k)[1:] if k == 2 else np.bincount(y, minlength=k)
    negatives = rows - positives
    if (positives == 0).any() or (negatives == 0).any():
        return None
    # Mann-Whitney U of each column's class: the sum of its rows' ranks, less the least that sum can be. One column
    # at a time: ranking holds several arrays of the validation rows' size, not of rows x classes.
    own = y - 1 if k == 2 else y
    rank_sums = np.array([_average_ranks(columns[:, [c]])[own == c, 0].sum() for c in range(columns.shape[1])])
    u = rank_sums - positives * (positives + 1) / 2.0
    return float(np.mean(u / (positives * negatives.astype(np.float64))))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Each column's ranks (1-based), tied values sharing the mean of the ranks they span."""
    rows = values.shape[0]
    order = np.argsort(values, axis=0, kind="stable")
    ordered = np.take_along_axis(values, order, axis=0)
    position = np.arange(rows)[:, None]
    starts = np.ones(ordered.shape, bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    ends = np.ones(ordered.shape, bool)
    ends[:-1] = starts[1:]
    first = np.maximum.accumulate(np.where(starts, position, 0), axis=0)
    last = np.minimum.accumulate(np.where(ends, position, rows - 1)[::-1], axis=0)[::-1]
    ranks = np.empty(ordered.shape, np.float64)
    np.put_along_axis(ranks, order, (first + last) / 2.0 + 1.0, axis=0)
    return ranks
