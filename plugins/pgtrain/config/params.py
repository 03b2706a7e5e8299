"""The training configuration: every parameter a triggerer may set, its default and its rule, under one name.

The DAG's Airflow params are generated from ``PARAMETERS`` (JSON schema: the trigger form validates with
it); the config snapshot stored with each run is ``TrainingConfig.from_mapping(params).to_dict()``, and
the trainer reads it back from there. What runs where (image, namespace, Secret, allowed tables and
models) is not here: those are the DAG author's settings (``pgtrain.config.settings``).

Each param is declared once, in ``pgtrain.config.param_schemas``; ``pgtrain.config.training`` builds
``TrainingConfig`` from the declarations, and ``pgtrain.config.param_checks`` checks params against them. This
module gathers their public names.
"""

from __future__ import annotations

from pgtrain.config.param_checks import param_problems, quality_gate_problems, unknown_keys, validate_params
from pgtrain.config.param_schemas import (
    ALL_COLUMNS,
    AUTO_MAX_BATCH,
    AUTO_MIN_BATCH,
    AUTO_STEPS_PER_EPOCH,
    AUTO_WEIGHT_DECAY,
    BACKENDS,
    BASE_GLOBAL_BATCH,
    BASE_LEARNING_RATE,
    CATEGORY_STORAGE,
    CLAMP_TARGET,
    CLASS_WEIGHTS,
    DEFAULT_COLLECTIVE_TIMEOUT,
    DEFAULT_ENSEMBLE_MEMBERS,
    DEFAULT_FEATURES_COLUMN,
    DEFAULT_STALL_TIMEOUT,
    END,
    INIT_FROM_WORDS,
    LIST_PARAMS,
    LR_SCHEDULES,
    MAX_AUTO_LEARNING_RATE,
    MAX_CLASSES,
    MAX_WORLD_SIZE,
    MISSING_VALUES,
    MODEL_REFERENCE,
    NORMALIZATIONS,
    OPTIMIZERS,
    PARAMETERS,
    PRECISIONS,
    QUALITY_GATE,
    RANK_SETTINGS,
    TASKS,
)
from pgtrain.config.training import TrainingConfig

__all__ = [
    "ALL_COLUMNS", "AUTO_MAX_BATCH", "AUTO_MIN_BATCH", "AUTO_STEPS_PER_EPOCH", "AUTO_WEIGHT_DECAY", "BACKENDS",
    "BASE_GLOBAL_BATCH", "BASE_LEARNING_RATE", "CATEGORY_STORAGE", "CLAMP_TARGET", "CLASS_WEIGHTS",
    "DEFAULT_COLLECTIVE_TIMEOUT", "DEFAULT_ENSEMBLE_MEMBERS", "DEFAULT_FEATURES_COLUMN", "DEFAULT_STALL_TIMEOUT", "END",
    "INIT_FROM_WORDS", "LIST_PARAMS", "LR_SCHEDULES", "MAX_AUTO_LEARNING_RATE", "MAX_CLASSES", "MAX_WORLD_SIZE",
    "MISSING_VALUES", "MODEL_REFERENCE", "NORMALIZATIONS", "OPTIMIZERS", "PARAMETERS", "PRECISIONS", "QUALITY_GATE",
    "RANK_SETTINGS", "TASKS", "TrainingConfig", "param_problems", "quality_gate_problems", "unknown_keys",
    "validate_params",
]
