"""The classification metrics (pgtrain.data.metrics) against scikit-learn's on the same predictions, and the metric
registry (pgtrain.config.metrics)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn import metrics as sk

from pgtrain.config.metrics import CONFUSION_MATRIX, METRICS
from pgtrain.data.encoding import UNSEEN_CLASS
from pgtrain.data.metrics import CONFUSION_MATRIX_MAX_CLASSES, classification_metrics

SKLEARN = {"val_accuracy", "val_loss", "val_balanced_accuracy", "val_f1_macro", "val_precision_macro",
           "val_recall_macro", "val_roc_auc"}


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def reference(probabilities: np.ndarray, labels: np.ndarray) -> dict[str, float | None]:
    """scikit-learn's figures; UNSEEN_CLASS rows are true labels the model cannot predict (labels=None keeps them
    as a class), left out of the log loss and ROC AUC (no probability column is theirs)."""
    k = probabilities.shape[1]
    predicted = probabilities.argmax(axis=1)
    known = labels != UNSEEN_CLASS
    expected = {
        "val_accuracy": sk.accuracy_score(labels, predicted),
        "val_balanced_accuracy": sk.balanced_accuracy_score(labels, predicted),
        "val_f1_macro": sk.f1_score(labels, predicted, average="macro"),
        "val_precision_macro": sk.precision_score(labels, predicted, average="macro"),
        "val_recall_macro": sk.recall_score(labels, predicted, average="macro"),
        "val_loss": sk.log_loss(labels[known], probabilities[known], labels=list(range(k))),
    }
    y, p = labels[known], probabilities[known]
    try:
        expected["val_roc_auc"] = (sk.roc_auc_score(y, p[:, 1]) if k == 2 else
                                   sk.roc_auc_score(y, p, multi_class="ovr", average="macro", labels=list(range(k))))
    except ValueError:  # a class with no rows: undefined
        expected["val_roc_auc"] = None
    if expected["val_roc_auc"] is not None and np.isnan(expected["val_roc_auc"]):  # undefined, as newer versions say
        expected["val_roc_auc"] = None
    return expected


def check(probabilities: np.ndarray, labels: np.ndarray, classes=None) -> dict:
    got = classification_metrics(probabilities, labels, classes)
    with warnings.catch_warnings():  # scikit-learn warns of each zero division it resolves
        warnings.simplefilter("ignore")
        expected = reference(probabilities, labels)
    for name, value in expected.items():
        if value is None:
            assert got[name] is None, name
        else:
            assert got[name] == pytest.approx(value, abs=1e-6, rel=1e-6), name
    k = probabilities.shape[1]
    known = labels != UNSEEN_CLASS
    matrix = got[CONFUSION_MATRIX]
    assert matrix["counts"] == sk.confusion_matrix(labels[known], probabilities[known].argmax(axis=1),
                                                   labels=list(range(k))).tolist()
    assert matrix["unseen"] == np.bincount(probabilities[~known].argmax(axis=1), minlength=k).tolist()
    assert matrix["labels"] == (list(range(k)) if classes is None else list(classes))
    return got


def test_binary_auc_is_of_the_second_class():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    probabilities = softmax(rng.normal(size=(300, 2)) + 1.5 * np.eye(2)[labels])
    got = check(probabilities, labels, ["no", "yes"])
    assert got["val_roc_auc"] > 0.7 and got["val_roc_auc"] == pytest.approx(
        sk.roc_auc_score(labels == 1, probabilities[:, 1]), abs=1e-12)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_multiclass(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, 500)
    check(softmax(rng.normal(size=(500, 5)) + np.eye(5)[labels]), labels)


def test_ties_share_their_average_rank():
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 3, 400)
    # probabilities on a coarse grid: many rows tie in every column, and argmax ties pick the first class
    probabilities = rng.integers(0, 4, size=(400, 3)).astype(np.float64) + 1
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    assert len(np.unique(probabilities[:, 0])) < 40
    check(probabilities, labels)


def test_a_class_the_model_never_predicts_and_imbalanced_classes():
    rng = np.random.default_rng(5)
    labels = np.where(rng.random(1000) < 0.95, 0, rng.integers(1, 4, 1000))
    logits = rng.normal(size=(1000, 4))
    logits[:, 3] -= 100  # class 3 is never the most probable
    got = check(softmax(logits), labels)
    assert got["val_precision_macro"] < got["val_accuracy"]


def test_a_class_without_validation_rows_leaves_roc_auc_undefined():
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 3, 200)  # class 3 of 4 has no row
    got = check(softmax(rng.normal(size=(200, 4))), labels)
    assert got["val_roc_auc"] is None and got["val_accuracy"] is not None
    binary = check(softmax(rng.normal(size=(50, 2))), np.zeros(50, np.int64))
    assert binary["val_roc_auc"] is None


def test_rows_of_a_class_the_training_rows_lacked_count_as_wrong():
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 3, 300)
    labels[rng.random(300) < 0.1] = UNSEEN_CLASS
    probabilities = softmax(rng.normal(size=(300, 3)) + 3 * np.eye(3)[np.maximum(labels, 0)])
    got = check(probabilities, labels)
    seen = labels != UNSEEN_CLASS
    assert got["val_accuracy"] == pytest.approx(
        (probabilities.argmax(axis=1) == labels)[seen].sum() / len(labels)), "unseen rows are in the denominator"
    assert sum(got[CONFUSION_MATRIX]["unseen"]) == (~seen).sum()


def test_float32_probabilities_clip_at_their_own_epsilon():
    probabilities = np.array([[1.0, 0.0], [0.0, 1.0], [0.3, 0.7]], np.float32)
    got = check(probabilities, np.array([1, 1, 0]))
    assert got["val_loss"] == pytest.approx(-(np.log(np.finfo(np.float32).eps) + np.log(1 - np.finfo(np.float32).eps)
                                              + np.log(np.float32(0.3))) / 3, rel=1e-6)


def test_no_validation_rows_no_figures():
    got = classification_metrics(np.zeros((0, 3)), np.zeros(0, np.int64), ["a", "b", "c"])
    assert all(got[name] is None for name in SKLEARN)
    assert got[CONFUSION_MATRIX] == {"labels": ["a", "b", "c"], "counts": [[0] * 3] * 3, "unseen": [0] * 3}


def test_many_classes_record_no_matrix_and_bad_input_is_refused():
    k = CONFUSION_MATRIX_MAX_CLASSES + 1
    assert classification_metrics(np.full((2, k), 1 / k), np.array([0, 1]))[CONFUSION_MATRIX] is None
    with pytest.raises(ValueError, match="class numbers"):
        classification_metrics(np.full((2, 3), 1 / 3), np.array([0, 3]))
    with pytest.raises(ValueError, match="2 class labels for 3 columns"):
        classification_metrics(np.full((2, 3), 1 / 3), np.array([0, 1]), ["a", "b"])


def test_every_metric_a_run_records_is_in_the_registry():
    assert SKLEARN | {"val_rmse", "val_mae", "val_r2"} == set(METRICS)
    assert [m.higher_is_better for m in map(METRICS.get, ("val_roc_auc", "val_loss", "val_rmse", "val_r2"))] == [
        True, False, False, True]


def test_a_version_keeps_the_metrics_of_the_epoch_whose_parameters_it_holds():
    """Early stopping stages the best epoch's parameters: the version's figures are that epoch's, with best_epoch and
    the epochs trained; without early stopping (no best_epoch) they are the last epoch's."""
    from pgtrain.store.model_store import version_metrics

    epochs = [{"epoch": 1, "val_loss": 0.9, "seconds": 1.0, "best_epoch": 1},
              {"epoch": 2, "val_loss": 0.5, "seconds": 1.0, "best_epoch": 2},
              {"epoch": 3, "val_loss": 0.7, "seconds": 1.0, "best_epoch": 2}]
    kept = version_metrics(epochs, [])
    assert (kept["val_loss"], kept["best_epoch"], kept["epochs"], kept["training_seconds"]) == (0.5, 2, 3, 3.0)
    plain = version_metrics([{k: v for k, v in e.items() if k != "best_epoch"} for e in epochs], [])
    assert (plain["val_loss"], plain["epochs"], "best_epoch" in plain) == (0.7, 3, False)


def test_the_run_summary_shows_the_kept_epoch_s_figures_and_a_long_curve_shortened():
    from pgtrain.runs.report import format_summary

    summary = {"run_id": "d/r", "status": "committed", "status_reason": None, "rows_per_rank": [10],
               "train_rows_per_rank": [9], "excluded_rows": 0, "loss_per_epoch": [1.0 / e for e in range(1, 21)],
               "validation": {"val_loss": 0.25}, "best_epoch": 15, "version": 3, "is_head": True, "model_name": "m",
               "wall_seconds": 1.0}
    text = format_summary(summary)
    assert "loss per epoch    1.0000 0.5000 0.3333 0.2500 0.2000 0.1667 ... 0.0667 0.0625" in text
    assert "validation        loss 0.2500 (best epoch 15 of 20)" in text
    assert "1.0000 0.5000" in format_summary({**summary, "loss_per_epoch": [1.0, 0.5], "best_epoch": None})


def test_a_version_records_its_test_figures_and_says_which_rows_its_figures_come_from():
    from pgtrain.config.metrics import figures_from, reported
    from pgtrain.store.model_store import version_metrics

    epochs = [{"epoch": 1, "val_accuracy": 0.9, "seconds": 1.0}]
    tested = version_metrics(epochs, [], {"test_accuracy": 0.8, "test_loss": float("nan")})
    assert (tested["figures_from"], tested["test_accuracy"], tested["test_loss"], tested["val_accuracy"]) == (
        "test", 0.8, None, 0.9)
    assert reported(tested, "val_accuracy") == 0.8 and reported(tested, "val_accuracy", "validation") == 0.9
    untested = version_metrics(epochs, [])
    assert untested["figures_from"] == "validation" and reported(untested, "val_accuracy") == 0.9
    older = {"val_accuracy": 0.7}  # a version from before the test part: no figures_from, no test figures
    assert figures_from(older) == "validation" and reported(older, "val_accuracy") == 0.7


def gate(head_metrics: dict | None, metrics: dict, **gate_params):
    from pgtrain.config.params import TrainingConfig
    from pgtrain.store.commit_checks import quality_gate

    head = None if head_metrics is None else {"version": 4, "metrics": head_metrics}
    return quality_gate(TrainingConfig(**gate_params), "classification", metrics, head)


def test_the_gate_judges_the_test_figure_and_compares_an_older_head_on_validation_rows():
    """The test figure is the honest one: floors and the head comparison read it; a head from before the test part
    is compared on both versions' validation rows (comparable: both chose their epoch on them), which the note
    says."""
    run = {"figures_from": "test", "test_accuracy": 0.80, "val_accuracy": 0.95}
    assert "test accuracy 0.8000 is below min_val_accuracy=0.9" in gate(None, run, min_val_accuracy=0.9).rejection
    assert gate(None, {**run, "test_accuracy": 0.91}, min_val_accuracy=0.9).rejection is None
    tested_head = {"figures_from": "test", "test_accuracy": 0.90, "val_accuracy": 0.90}
    verdict = gate(tested_head, run, max_accuracy_drop=0.05)
    assert "test accuracy 0.8000 is more than max_accuracy_drop=0.05 below head version 4 (0.9000)" in (
        verdict.rejection)
    older_head = {"val_accuracy": 0.93}
    verdict = gate(older_head, run, max_accuracy_drop=0.05)
    assert verdict.rejection is None and "head version 4 has no test figures" in verdict.note
    assert "validation accuracy 0.9500 is more than" in gate({"val_accuracy": 0.99}, run,
                                                             max_accuracy_drop=0.01).rejection


def test_the_run_summary_shows_the_test_figures():
    from pgtrain.runs.report import format_summary

    summary = {"run_id": "d/r", "status": "committed", "status_reason": None, "rows_per_rank": [10],
               "train_rows_per_rank": [8], "excluded_rows": 0, "loss_per_epoch": [1.0],
               "validation": {"val_loss": 0.25}, "test": {"test_loss": 0.3}, "test_rows": 1, "best_epoch": None,
               "version": 3, "is_head": True,
               "model_name": "m", "wall_seconds": 1.0}
    assert "test              loss 0.3000 (1 rows that chose nothing)" in format_summary(summary)
    assert "test              n/a" in format_summary({**summary, "test": {}})
