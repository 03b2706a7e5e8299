"""``TrainingConfig``: a run's params as one frozen dataclass, a field for each declaration of
``pgtrain.config.param_schemas`` (its default that one's), with the rules that read them: the auto batch size,
learning rate and weight decay, and the options the model is built with."""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgtrain.config.boosted import BOOSTED, DEFAULT_LEARNING_RATE, booster_options
from pgtrain.config.metrics import metric_problems
from pgtrain.config.param_checks import quality_gate_problems, validate_params
from pgtrain.config.param_schemas import (
    AUTO_MAX_BATCH,
    AUTO_MIN_BATCH,
    AUTO_STEPS_PER_EPOCH,
    AUTO_WEIGHT_DECAY,
    BASE_GLOBAL_BATCH,
    BASE_LEARNING_RATE,
    CATEGORY_STORAGE,
    CLAMP_TARGET,
    DEFAULT_FEATURES_COLUMN,
    LIST_PARAMS,
    MAX_AUTO_LEARNING_RATE,
    PARAMETERS,
    QUALITY_GATE,
    RANK_SETTINGS,
)
from pgtrain.core.errors import ConfigError

_PYTHON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict[str, Any],
                 "null": type(None)}


def _annotation(schema: dict[str, Any]) -> Any:
    """The field's type for a param's JSON type(s): a JSON list is a tuple of its items' type."""
    names = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
    item = _PYTHON_TYPES.get(schema.get("items", {}).get("type"))
    return functools.reduce(operator.or_, [tuple[item, ...] if name == "array" else _PYTHON_TYPES[name]
                                           for name in names])


def _declared_fields(cls: type) -> type:
    """``cls`` with a dataclass field per declared param, in declaration order, its default the declaration's (a
    JSON list as a tuple, an object copied for each config)."""
    cls.__annotations__ = {}
    for name, schema in {**PARAMETERS, **QUALITY_GATE, **CATEGORY_STORAGE, **RANK_SETTINGS}.items():
        cls.__annotations__[name] = _annotation(schema)
        default = schema["default"]
        if isinstance(default, dict):
            setattr(cls, name, dataclasses.field(default_factory=functools.partial(copy.deepcopy, default)))
        else:
            setattr(cls, name, tuple(default) if isinstance(default, list) else default)
    return cls


@dataclass(frozen=True)
@_declared_fields
class TrainingConfig:
    """A run's training params, one field per declared param (``pgtrain.config.param_schemas``)."""

    if TYPE_CHECKING:  # the fields _declared_fields adds, for type checkers (a test holds them to the declarations)
        source_table: str
        key_column: str
        features_column: str | None
        feature_columns: tuple[str, ...] | str | None
        exclude_columns: tuple[str, ...]
        categorical_columns: tuple[str, ...]
        label_column: str
        task: str
        missing_values: str
        max_categories: int
        min_category_count: int
        input_dim: int | None
        num_classes: int | None
        validation_fraction: float
        test_fraction: float
        bad_rows: str
        model_name: str
        model: str
        model_options: dict[str, Any]
        search: dict[str, Any] | None
        hidden_sizes: tuple[int, ...]
        ensemble_members: int
        numeric_bins: int
        init_from: str | int
        standardize_target: bool
        dropout: float
        normalization: str
        epochs: int
        batch_size: int | None
        optimizer: str
        learning_rate: float | None
        weight_decay: float | None
        lr_schedule: str
        warmup_epochs: float
        early_stopping_patience: int
        early_stopping_metric: str
        class_weight: str
        seed: int
        checkpoint_every: int
        force: bool
        world_size: int
        launcher: str
        backend: str
        collective_timeout: int
        precision: str
        stall_timeout: int
        max_accuracy_drop: float | None
        max_rmse_rise: float | None
        min_val_accuracy: float | None
        max_val_rmse: float | None
        metric: str | None
        max_drop: float | None
        floor: float | None
        allow_unvalidated: bool
        allow_retarget: bool
        hashed_columns: tuple[str, ...]
        max_clear_levels: int
        max_level_length: int
        intra_op_threads: int | None

        def __init__(self, **params: Any) -> None: ...

    def __post_init__(self) -> None:
        problems = quality_gate_problems(vars(self), self.task)
        if problems:
            raise ConfigError("invalid quality gate: " + "; ".join(problems))
        problems = [f"early_stopping_metric: {p}" for p in metric_problems(self.early_stopping_metric, self.task)]
        if self.validation_fraction + self.test_fraction >= 1:
            problems.append(f"validation_fraction {self.validation_fraction} and test_fraction {self.test_fraction} "
                            "hold out every row: lower them so that some rows are left to train on")
        if problems:
            raise ConfigError("invalid training parameters: " + "; ".join(problems))
        if self.model == BOOSTED:
            booster_options(self.model_options, self.task, self.early_stopping_metric)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> TrainingConfig:
        """Build from params; a key that is not a param is an error naming the closest param."""
        validate_params(values)
        kwargs = dict(values)
        for name in LIST_PARAMS:
            if isinstance(kwargs.get(name), list | tuple):
                kwargs[name] = tuple(kwargs[name])
        if isinstance(kwargs.get("init_from"), str) and kwargs["init_from"].isdigit():
            kwargs["init_from"] = int(kwargs["init_from"])
        if kwargs.get("model_options") is not None:
            kwargs["model_options"] = dict(kwargs["model_options"])
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in LIST_PARAMS:
            if isinstance(data[name], tuple):
                data[name] = list(data[name])
        return data

    @property
    def array_features_column(self) -> str | None:
        """The array (or bytea) features column: ``features_column``, or DEFAULT_FEATURES_COLUMN when neither it
        nor ``feature_columns`` is given; None when the features are scalar columns."""
        if self.features_column is None and self.feature_columns is None:
            return DEFAULT_FEATURES_COLUMN
        return self.features_column

    @property
    def model_options_for_build(self) -> dict[str, Any]:
        """The keyword arguments the model is built with (the mlp's come from hidden_sizes)."""
        if self.model == "mlp":
            options: dict[str, Any] = {"hidden_sizes": list(self.hidden_sizes), "dropout": self.dropout,
                                       "normalization": self.normalization}
            if self.ensemble_members > 1:  # the members and how their outputs are averaged (pgtrain.models.ensemble)
                options |= {"members": self.ensemble_members,
                            "average": "values" if self.task == "regression" else "probabilities"}
            if self.task == "regression":
                options[CLAMP_TARGET] = True
            return options
        if self.model == BOOSTED:  # the version records every option it was trained with, defaults included
            return {**booster_options(self.model_options, self.task, self.early_stopping_metric),
                    "learning_rate": self.learning_rate or DEFAULT_LEARNING_RATE}
        return dict(self.model_options)

    def batch_size_for(self, largest_train_rows: int) -> int:
        """Rows per rank per step: ``batch_size``, or the auto size for a largest shard of that many training rows."""
        if self.batch_size is not None:
            return self.batch_size
        return min(AUTO_MAX_BATCH, max(AUTO_MIN_BATCH, largest_train_rows // AUTO_STEPS_PER_EPOCH))

    def learning_rate_for(self, batch_size: int) -> float:
        """``learning_rate``, or the optimizer's auto rate for ``world_size`` ranks of ``batch_size`` rows."""
        if self.learning_rate is not None:
            return self.learning_rate
        ratio = self.world_size * batch_size / BASE_GLOBAL_BATCH
        scaled = BASE_LEARNING_RATE[self.optimizer] * (ratio if self.optimizer == "sgd" else ratio ** 0.5)
        return min(MAX_AUTO_LEARNING_RATE[self.optimizer], scaled)

    @property
    def weight_decay_value(self) -> float:
        """``weight_decay``, or the optimizer's auto one."""
        return AUTO_WEIGHT_DECAY[self.optimizer] if self.weight_decay is None else self.weight_decay

    @property
    def init_version(self) -> int | None:
        """The version number init_from names, or None for scratch/head."""
        return self.init_from if isinstance(self.init_from, int) else None
