"""The gradient-boosted built-in (``model: xgboost``): its options, their defaults, and the early stopping it can
follow. No xgboost here: the DAG files import this (through the params) when they are parsed; the trainer's
``trainer.boosted`` trains with what ``booster_options`` returns.

Who sets what follows the params' rules: the triggerer sets ``model_options`` (the keys below, nothing else) and
the run's ``learning_rate``; ``early_stopping_patience`` 0 turns early stopping off, and ``early_stopping_metric``
names what it follows (one of ``EARLY_STOPPING``). The author allows the model itself (``allowed_models``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgtrain.config.metrics import REGRESSION
from pgtrain.core.errors import ConfigError

BOOSTED = "xgboost"

# Defaults measured on benchmarks/bench_quality.py's tables (docs/models.md, benchmarks/RESULTS.md): a small
# learning rate with many rounds, stopped by the validation rows, beats the library's 0.3 x 100 rounds there.
DEFAULT_LEARNING_RATE = 0.05
DEFAULTS: dict[str, Any] = {
    "n_estimators": 2000,  # the most boosting rounds; early stopping usually ends far sooner
    "early_stopping_rounds": 100,  # rounds without a better validation figure before stopping
    "max_depth": 6,
    "min_child_weight": 1.0,
    "subsample": 1.0,  # 1: every rank's rows every round, so 2 ranks grow the trees 1 process grows
    "colsample_bytree": 1.0,
    "reg_lambda": 1.0,
    "reg_alpha": 0.0,
    "gamma": 0.0,
    "max_bin": 256,
    "max_cat_to_onehot": 4,  # categories with at most this many codes split one-vs-rest, larger ones partition
    "categorical": "native",  # category codes as XGBoost categories; "codes": as ordered numbers
}
_TYPES: dict[str, tuple[type, ...]] = {name: (int,) if isinstance(value, int) else (int, float) if isinstance(
    value, float) else (str,) for name, value in DEFAULTS.items()}
_RANGES: dict[str, tuple[float, float]] = {
    "n_estimators": (1, 100_000), "early_stopping_rounds": (1, 100_000), "max_depth": (1, 32),
    "min_child_weight": (0, 1e9), "subsample": (1e-9, 1), "colsample_bytree": (1e-9, 1), "reg_lambda": (0, 1e9),
    "reg_alpha": (0, 1e9), "gamma": (0, 1e9), "max_bin": (2, 65536), "max_cat_to_onehot": (1, 1_000_000),
}
CATEGORICAL = ("native", "codes")
_KIND = {(int,): "an integer", (int, float): "a number", (str,): "text"}

# early_stopping_metric -> XGBoost's eval metric that orders rounds the same way, per task (binary, multi-class).
EARLY_STOPPING: dict[str, dict[str, str]] = {
    "val_loss": {REGRESSION: "rmse", "binary": "logloss", "multi": "mlogloss"},
    "val_rmse": {REGRESSION: "rmse"},
    "val_mae": {REGRESSION: "mae"},
    "val_accuracy": {"binary": "error", "multi": "merror"},
    "val_roc_auc": {"binary": "auc"},
}


def booster_options(options: Mapping[str, Any] | None, task: str, early_stopping_metric: str) -> dict[str, Any]:
    """``options`` (a run's model_options) filled with DEFAULTS; ConfigError naming every unknown key, wrong type
    or value out of range, and an early stopping metric the booster cannot follow."""
    given = dict(options or {})
    problems = [f"unknown option {key!r} (the options are {', '.join(DEFAULTS)})" for key in given
                if key not in DEFAULTS]
    for key, value in given.items():
        if key not in DEFAULTS:
            continue
        if isinstance(value, bool) or not isinstance(value, _TYPES[key]):
            problems.append(f"{key}={value!r} should be {_KIND[_TYPES[key]]}")
        elif key in _RANGES and not _RANGES[key][0] <= value <= _RANGES[key][1]:
            problems.append(f"{key}={value!r} should be between {_RANGES[key][0]:g} and {_RANGES[key][1]:g}")
        elif key == "categorical" and value not in CATEGORICAL:
            problems.append(f"categorical={value!r} should be one of {', '.join(CATEGORICAL)}")
    follows = EARLY_STOPPING.get(early_stopping_metric, {})
    if not any(kind == task or (task != REGRESSION and kind != REGRESSION) for kind in follows):
        usable = [m for m, kinds in EARLY_STOPPING.items() if task in kinds or (task != REGRESSION and (
            "binary" in kinds or "multi" in kinds))]
        problems.append(f"early_stopping_metric={early_stopping_metric!r} cannot be followed by the booster for a "
                        f"{task} (it follows {', '.join(usable)})")
    if problems:
        raise ConfigError(f"model {BOOSTED!r}: " + "; ".join(problems))
    return {**DEFAULTS, **given}


def eval_metric(early_stopping_metric: str, task: str, classes: int) -> str:
    """XGBoost's eval metric for ``early_stopping_metric``; ConfigError where only binary classification has it."""
    kind = task if task == REGRESSION else "binary" if classes == 2 else "multi"
    metric = EARLY_STOPPING.get(early_stopping_metric, {}).get(kind)
    if metric is None:
        raise ConfigError(f"model {BOOSTED!r}: early_stopping_metric={early_stopping_metric!r} cannot be followed "
                          f"with {classes} classes (only with two); use val_loss or val_accuracy")
    return metric
