"""The training configuration: every parameter a triggerer may set, its default and its rule, in one place.

The DAG's Airflow params are generated from ``PARAMETERS`` (JSON schema: the trigger form validates with
it); the config snapshot stored with each run is ``TrainingConfig.from_mapping(params).to_dict()``, and
the trainer reads it back from there. What runs where (image, namespace, Secret, allowed tables and
models) is not here: those are the DAG author's settings (``pgtrain.config.settings``).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pgtrain.config.boosted import BOOSTED, DEFAULT_LEARNING_RATE, booster_options
from pgtrain.config.metrics import METRICS, metric_problems
from pgtrain.core.errors import ConfigError

# The end of the string in every pattern: Airflow's Param and jsonschema search a pattern with re.search, whose `$`
# also matches before a final newline ("digits-mlp\n"); a lookahead for no character at all does not (nor in the
# trigger form's JavaScript).
END = r"(?![\s\S])"
_MODEL_NAME = rf"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,62}}{END}"
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
MODEL_REFERENCE = rf"^(?:mlp|xgboost|{_DOTTED}:[A-Za-z_][A-Za-z0-9_]*){END}"
INIT_FROM_WORDS = ("scratch", "head")
TASKS = ("classification", "regression")
# The most Horovod ranks any run may have; a DAG's author may allow fewer (max_world_size).
MAX_WORLD_SIZE = 1024

_DATA, _MODEL, _TRAINING, _CLUSTER = "Data", "Model", "Training", "Cluster"

# batch_size / learning_rate left empty (the defaults): a per-rank batch large enough that one gradient
# allreduce per step costs little next to the step's compute (at batch 32, two CPU ranks spend most of each
# step waiting in it: benchmarks/RESULTS.md), yet at least AUTO_STEPS_PER_EPOCH steps per epoch so that small
# tables (the digits: 804 rows a rank -> 32) train as before; the learning rate scales linearly with the global
# batch from 0.05 at 64 (2 ranks x 32), capped.
AUTO_MIN_BATCH, AUTO_MAX_BATCH, AUTO_STEPS_PER_EPOCH = 32, 2048, 50
# The auto learning rate of each optimizer at BASE_GLOBAL_BATCH rows, and how it scales with the global batch:
# SGD linearly (Goyal et al.), AdamW with the square root (its update is normalized per parameter), each capped.
BASE_GLOBAL_BATCH = 64
OPTIMIZERS = ("adamw", "sgd")
BASE_LEARNING_RATE = {"sgd": 0.05, "adamw": 0.008}
MAX_AUTO_LEARNING_RATE = {"sgd": 0.8, "adamw": 0.01}
# The auto weight decay of each optimizer: AdamW's decoupled decay (its usual 0.01); none for SGD, as before.
AUTO_WEIGHT_DECAY = {"sgd": 0.0, "adamw": 0.01}
LR_SCHEDULES = ("constant", "cosine", "one_cycle")
CLASS_WEIGHTS = ("none", "balanced")
NORMALIZATIONS = ("none", "layer")
# One plain MLP by default: a shared-weight ensemble (TabM's k = 32) gained little here for its training time and
# would refuse every existing model's warm start from its head (benchmarks/RESULTS.md, "The mlp as a shared-weight
# ensemble").
DEFAULT_ENSEMBLE_MEMBERS = 1
# The mlp's numeric inputs: 0 = each value standardized (as before); B > 1 = through up to B quantile bins of the
# training rows, piecewise-linear encoded (pgtrain.data.quantiles, pgtrain.models.piecewise).
DEFAULT_NUMERIC_BINS = 0
MAX_NUMERIC_BINS = 256
# The mlp's model option that keeps a regression's outputs within its training targets' range (the bounds are the
# state dict's target.low and target.high); versions without it predict unclamped, as they always did.
CLAMP_TARGET = "clamp_target"
_OPTIONAL_NUMBER = {"type": ["number", "null"]}
# The features when neither features_column nor feature_columns is given (the example data's array column).
DEFAULT_FEATURES_COLUMN = "features"
ALL_COLUMNS = "*"  # feature_columns: every column but the key, the target and exclude_columns
MISSING_VALUES = ("impute", "bad_row")
MAX_CLASSES = 100_000  # the most classes a classification run may have (num_classes' maximum)
# Params whose JSON lists are tuples in TrainingConfig.
LIST_PARAMS = ("hidden_sizes", "feature_columns", "exclude_columns", "categorical_columns", "hashed_columns")
# The ranks' collectives (trainer.collectives): auto = horovod where ``import horovod.torch`` works, else torch.
BACKENDS = ("auto", "horovod", "torch")
# fp32: float32 throughout (TF32 matmuls on GPUs); bf16: the forward pass autocast to bfloat16 (weights, gradients and
# the optimizer stay float32).
PRECISIONS = ("fp32", "bf16")
# Seconds a running job may go without a new epoch (or its first one) before it is deleted: a hung collective must
# not hold its GPUs until activeDeadlineSeconds.
DEFAULT_STALL_TIMEOUT = 3600
# How long a rank of the torch backend waits in one collective (and in the rendezvous) before the job fails: a rank
# that hangs or died must not hold the job's GPUs for hours.
DEFAULT_COLLECTIVE_TIMEOUT = 300

@dataclass(frozen=True)
class TrainingConfig:
    """A run's training params: the one home of their defaults (``PARAMETERS`` takes them from here)."""

    source_table: str = "public.samples"
    key_column: str = "id"
    features_column: str | None = None
    feature_columns: tuple[str, ...] | str | None = None
    exclude_columns: tuple[str, ...] = ()
    categorical_columns: tuple[str, ...] = ()
    label_column: str = "label"
    task: str = "classification"
    missing_values: str = "impute"
    max_categories: int = 100
    min_category_count: int = 5
    input_dim: int | None = None
    num_classes: int | None = None
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    bad_rows: str = "fail"
    model_name: str = "digits-mlp"
    model: str = "mlp"
    model_options: dict[str, Any] = field(default_factory=dict)
    search: dict[str, Any] | None = None  # pgtrain.config.search: N trials over this run's plan, the best committed
    hidden_sizes: tuple[int, ...] = field(default=(50,))
    init_from: str | int = "scratch"
    standardize_target: bool = True
    dropout: float = 0.0
    normalization: str = "none"
    ensemble_members: int = DEFAULT_ENSEMBLE_MEMBERS
    numeric_bins: int = DEFAULT_NUMERIC_BINS
    epochs: int = 50
    batch_size: int | None = None
    optimizer: str = "adamw"
    learning_rate: float | None = None
    weight_decay: float | None = None
    lr_schedule: str = "cosine"
    warmup_epochs: float = 1.0
    early_stopping_patience: int = 5
    early_stopping_metric: str = "val_loss"
    class_weight: str = "none"
    seed: int = 0
    checkpoint_every: int = 1
    force: bool = False
    max_accuracy_drop: float | None = None
    max_rmse_rise: float | None = None
    min_val_accuracy: float | None = None
    max_val_rmse: float | None = None
    metric: str | None = None
    max_drop: float | None = None
    floor: float | None = None
    allow_unvalidated: bool = False
    allow_retarget: bool = False
    hashed_columns: tuple[str, ...] = ()
    max_clear_levels: int = 100
    max_level_length: int = 64
    # One rank by default: on a CPU-only worker one rank's PyTorch threads use every core, and two ranks there
    # only add Horovod's per-step allreduce (docs/performance.md); GPUs want one rank each.
    world_size: int = 1
    launcher: str = "local"
    backend: str = "auto"
    collective_timeout: int = DEFAULT_COLLECTIVE_TIMEOUT
    precision: str = "fp32"
    stall_timeout: int = DEFAULT_STALL_TIMEOUT
    # The DAG author's (RANK_SETTINGS), never the triggerer's: kept in the snapshot, which is how it reaches the ranks.
    intra_op_threads: int | None = None

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



def _with_defaults(schemas: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each schema with its ``default`` from TrainingConfig's field (tuples as JSON lists)."""
    fields = {f.name: f for f in dataclasses.fields(TrainingConfig)}
    result = {}
    for name, schema in schemas.items():
        f = fields[name]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        result[name] = {"default": list(default) if isinstance(default, tuple) else default, **schema}
    return result


# name -> JSON schema (title, description and form section; the default from TrainingConfig) of each param.
PARAMETERS: dict[str, dict[str, Any]] = _with_defaults({
    "source_table": {"type": "string", "minLength": 1, "section": _DATA,
                     "title": "Source table",
                     "description": "table holding the training rows, schema-qualified and quoted as in SQL "
                                    "(e.g. \"Clinic\".\"Biopsies\"); must be allowed by the DAG's author"},
    "key_column": {"type": "string", "minLength": 1, "section": _DATA, "title": "Key column",
                   "description": "unique, orderable key column used for keyset sharding"},
    "features_column": {"type": ["string", "null"], "minLength": 1, "section": _DATA,
                        "title": "Features column (array)",
                        "description": "one real[], double precision[] or bytea (packed float32) column; empty = "
                                       f"{DEFAULT_FEATURES_COLUMN!r} unless feature_columns is given"},
    "feature_columns": {"type": ["array", "string", "null"], "minItems": 1, "pattern": rf"^\*{END}",
                        "items": {"type": "string", "minLength": 1}, "section": _DATA,
                        "title": "Feature columns",
                        "description": "\"*\" (every column but the key, the target and exclude_columns) or a "
                                       "list of columns in input order: numbers, booleans, dates and timestamps, "
                                       "text, varchar, char and enum columns (categories)"},
    "exclude_columns": {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True,
                        "section": _DATA, "title": "Exclude columns",
                        "description": "columns feature_columns \"*\" leaves out (ids, free text, json, ...)"},
    "categorical_columns": {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True,
                            "section": _DATA, "title": "Categorical columns",
                            "description": "feature columns to treat as categories whatever their type (an "
                                           "integer zip or product code, a boolean); text and enum columns are "
                                           "categories anyway"},
    "label_column": {"type": "string", "minLength": 1, "section": _DATA,
                     "title": "Target column",
                     "description": "classification: the class (integer, text, varchar, char, boolean or enum; "
                                    "the classes are its values in the training rows); regression: a numeric "
                                    "column or numeric array"},
    "task": {"type": "string", "enum": list(TASKS), "section": _DATA,
             "title": "Task", "description": "classification (cross-entropy) or regression (mean squared error)"},
    "missing_values": {"type": "string", "enum": list(MISSING_VALUES), "section": _DATA,
                       "title": "Missing values",
                       "description": "NULL in a feature column: impute (the training mean, plus a 0/1 'was "
                                      "missing' input for each column that had NULLs; a NULL category is a level "
                                      "of its own) or bad_row (the row is bad: see bad_rows)"},
    "max_categories": {"type": "integer", "minimum": 1, "maximum": 10000, "section": _DATA,
                       "title": "Max categories",
                       "description": "the most frequent levels a categorical column keeps; the rest share one "
                                      "'other' level"},
    "min_category_count": {"type": "integer", "minimum": 1, "section": _DATA,
                           "title": "Min category count",
                           "description": "training rows a level needs to be kept; rarer levels are 'other'"},
    "input_dim": {"type": ["integer", "null"], "minimum": 1, "section": _DATA,
                  "title": "Feature length",
                  "description": "array features only; empty = the most common length among the rows"},
    "num_classes": {"type": ["integer", "null"], "minimum": 2, "maximum": MAX_CLASSES,
                    "section": _DATA, "title": "Classes",
                    "description": "classification with labels 0..num_classes-1 only; empty = the classes are "
                                   "the label's values (non-negative integers: 0..max(label))"},
    "validation_fraction": {"type": "number", "minimum": 0, "maximum": 0.5, "section": _DATA,
                            "title": "Validation fraction",
                            "description": "share of rows held out for validation (they choose the best epoch), "
                                           "chosen by a hash of the key"},
    "test_fraction": {"type": "number", "minimum": 0, "maximum": 0.5, "section": _DATA,
                      "title": "Test fraction",
                      "description": "share of rows held out as test rows, which choose nothing: the version's "
                                     "figures are read on them; chosen by the same hash of the key; 0 = none (the "
                                     "figures are then the validation rows')"},
    "bad_rows": {"type": "string", "enum": ["fail", "exclude"], "section": _DATA,
                 "title": "Bad rows",
                 "description": "rows with NULL/non-finite values, wrong length or bad labels: fail or skip"},
    "model_name": {"type": "string", "pattern": _MODEL_NAME, "section": _MODEL,
                   "title": "Model name", "description": "the model whose next version this run commits"},
    "model": {"type": "string", "pattern": MODEL_REFERENCE, "section": _MODEL,
              "title": "Model", "description": "mlp, xgboost (gradient-boosted trees), or package.module:factory "
                                               "(allowed by the DAG's author)"},
    "model_options": {"type": "object", "section": _MODEL, "title": "Model options",
                      "description": "keyword arguments of the factory: factory(input_dim=, output_dim=, ...); "
                                     "xgboost: its options (n_estimators, max_depth, ...: docs/models.md)"},
    "search": {"type": ["object", "null"], "section": _MODEL, "title": "Search",
               "description": "trials over one plan, the best by a validation metric committed: candidates (models "
                              "and knob values), strategy (grid or random), seed, trials, metric; within the DAG "
                              "author's search_limits (docs/configuration.md#search)"},
    "hidden_sizes": {"type": "array", "minItems": 1, "maxItems": 16,
                     "items": {"type": "integer", "minimum": 1, "maximum": 65536}, "section": _MODEL,
                     "title": "Hidden layers", "description": "hidden layer widths of the mlp model"},
    "ensemble_members": {"type": "integer", "minimum": 1, "maximum": 256, "section": _MODEL,
                         "title": "Ensemble members",
                         "description": "mlp: members of a shared-weight ensemble (BatchEnsemble, as TabM), each "
                                        "trained on its own loss, their predictions averaged; 1 = one plain MLP"},
    "numeric_bins": {"type": "integer", "minimum": 0, "maximum": MAX_NUMERIC_BINS, "section": _MODEL,
                     "title": "Numeric bins",
                     "description": "mlp: each numeric column through up to this many quantile bins of the training "
                                    "rows (piecewise-linear encoding); 0 = the standardized value"},
    "init_from": {"type": ["string", "integer"], "section": _MODEL, "title": "Start from",
                  "anyOf": [{"type": "string", "enum": list(INIT_FROM_WORDS)},
                            {"type": "string", "pattern": rf"^[1-9][0-9]{{0,8}}{END}"},
                            {"type": "integer", "minimum": 1}],
                  "description": "scratch, head (the model's current version), or a version number"},
    "standardize_target": {"type": "boolean", "section": _MODEL, "title": "Standardize target",
                           "description": "regression: train on the standardized target, predict in its units"},
    "dropout": {"type": "number", "minimum": 0, "maximum": 0.9, "section": _MODEL, "title": "Dropout",
                "description": "mlp: the share of each hidden layer's units dropped while training"},
    "normalization": {"type": "string", "enum": list(NORMALIZATIONS), "section": _MODEL, "title": "Normalization",
                      "description": "mlp: none, or layer (LayerNorm after each hidden Linear; per row, so any "
                                     "number of ranks trains the same model)"},
    "epochs": {"type": "integer", "minimum": 1, "maximum": 10000, "section": _TRAINING,
               "title": "Epochs", "description": "the most passes over the training rows (early stopping may "
                                                 "end sooner)"},
    "batch_size": {"type": ["integer", "null"], "minimum": 1, "maximum": 1048576,
                   "section": _TRAINING, "title": "Batch size per rank",
                   "description": "rows per rank per step (global batch = world_size x batch_size); empty = "
                                  f"auto: the largest shard's training rows / {AUTO_STEPS_PER_EPOCH}, between "
                                  f"{AUTO_MIN_BATCH} and {AUTO_MAX_BATCH}"},
    "optimizer": {"type": "string", "enum": list(OPTIMIZERS), "section": _TRAINING, "title": "Optimizer",
                  "description": "adamw (decoupled weight decay) or sgd (momentum 0.9)"},
    "learning_rate": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 10,
                      "section": _TRAINING, "title": "Learning rate",
                      "description": "the peak rate of the schedule; empty = auto: adamw "
                                     f"{BASE_LEARNING_RATE['adamw']} x sqrt(global batch / {BASE_GLOBAL_BATCH}), "
                                     f"at most {MAX_AUTO_LEARNING_RATE['adamw']}; sgd {BASE_LEARNING_RATE['sgd']} "
                                     f"x global batch / {BASE_GLOBAL_BATCH}, at most {MAX_AUTO_LEARNING_RATE['sgd']}"},
    "weight_decay": {"type": ["number", "null"], "minimum": 0, "maximum": 1, "section": _TRAINING,
                     "title": "Weight decay",
                     "description": f"empty = auto: adamw {AUTO_WEIGHT_DECAY['adamw']}, "
                                    f"sgd {AUTO_WEIGHT_DECAY['sgd']}"},
    "lr_schedule": {"type": "string", "enum": list(LR_SCHEDULES), "section": _TRAINING,
                    "title": "Learning-rate schedule",
                    "description": "constant; cosine (linear warm-up over warmup_epochs, then cosine decay to 0 at "
                                   "the last epoch); one_cycle (up from rate/25 over 30% of the steps, then cosine "
                                   "down to rate/1e4, as torch's OneCycleLR)"},
    "warmup_epochs": {"type": "number", "minimum": 0, "maximum": 1000, "section": _TRAINING,
                      "title": "Warm-up epochs",
                      "description": "cosine: epochs of linear warm-up from 0 to the learning rate (at most half "
                                     "of the steps)"},
    "early_stopping_patience": {"type": "integer", "minimum": 0, "maximum": 10000, "section": _TRAINING,
                                "title": "Early stopping patience",
                                "description": "stop after this many epochs without a better "
                                               "early_stopping_metric and keep the best epoch's parameters; 0 = "
                                               "off (also off without validation rows)"},
    "early_stopping_metric": {"type": "string", "enum": list(METRICS), "section": _TRAINING,
                              "title": "Early stopping metric",
                              "description": "the validation metric early stopping and the best epoch follow"},
    "class_weight": {"type": "string", "enum": list(CLASS_WEIGHTS), "section": _TRAINING, "title": "Class weight",
                     "description": "classification: none, or balanced (each class weighs training rows / "
                                    "(classes x its rows), from the training rows of all ranks)"},
    "seed": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1, "section": _TRAINING,
             "title": "Seed", "description": "initialization, split and shuffling seed"},
    "checkpoint_every": {"type": "integer", "minimum": 0, "maximum": 10000, "section": _TRAINING,
                         "title": "Checkpoint every",
                         "description": "epochs between checkpoints a retried train task resumes from; 0 = off"},
    "force": {"type": "boolean", "section": _TRAINING, "title": "Train even if unchanged",
              "description": "scheduled (cron) runs skip training when no row of the source changed since the "
                             "head version was trained; set this to train anyway"},
    "world_size": {"type": "integer", "minimum": 1, "maximum": MAX_WORLD_SIZE, "section": _CLUSTER,
                   "title": "Ranks",
                   "description": "Horovod ranks: one per GPU; on a CPU-only worker one rank uses every core"},
    "launcher": {"type": "string", "enum": ["local", "kubernetes"], "section": _CLUSTER,
                 "title": "Launcher",
                 "description": "local: horovodrun on the worker; kubernetes: an MPIJob on GPU pods"},
    "backend": {"type": "string", "enum": list(BACKENDS), "section": _CLUSTER, "title": "Collectives backend",
                "description": "horovod, torch (torch.distributed: NCCL on GPUs, Gloo on CPUs) or auto (horovod "
                               "where horovod.torch imports, else torch); the DAG author's, never the triggerer's"},
    "collective_timeout": {"type": "integer", "minimum": 10, "maximum": 86400, "section": _CLUSTER,
                           "title": "Collective timeout (s)",
                           "description": "torch backend: the longest a rank waits in one collective or the "
                                          "rendezvous before the job fails; the DAG author's"},
    "precision": {"type": "string", "enum": list(PRECISIONS), "section": _CLUSTER, "title": "Precision",
                  "description": "fp32 (TF32 matmuls on GPUs) or bf16 (the forward pass autocast to bfloat16); the "
                                 "DAG author's"},
    "stall_timeout": {"type": "integer", "minimum": 10, "maximum": 7 * 86400, "section": _CLUSTER,
                      "title": "Stall timeout (s)",
                      "description": "a running Kubernetes job without a new epoch for this long is deleted and the "
                                     "train task fails naming the stall; the DAG author's"},
})

# The quality gate: the DAG author's (the settings file's ``quality_gate``), never the triggerer's. It is kept
# in the run's config snapshot so that the commit applies the gate that was in force when the run was planned.
QUALITY_GATE: dict[str, dict[str, Any]] = _with_defaults({
    "max_accuracy_drop": {**_OPTIONAL_NUMBER, "minimum": 0, "maximum": 1,
                          "title": "Quality gate: max accuracy drop",
                          "description": "classification: reject if val_accuracy falls more than this below "
                                         "the head's; empty = no gate"},
    "max_rmse_rise": {**_OPTIONAL_NUMBER, "minimum": 0,
                      "title": "Quality gate: max RMSE rise",
                      "description": "regression: reject if val_rmse rises more than this above the head's; "
                                     "empty = no gate"},
    "min_val_accuracy": {**_OPTIONAL_NUMBER, "minimum": 0, "maximum": 1,
                         "title": "Quality floor: min accuracy",
                         "description": "classification: reject any run whose val_accuracy is below this"},
    "max_val_rmse": {**_OPTIONAL_NUMBER, "minimum": 0,
                     "title": "Quality floor: max RMSE",
                     "description": "regression: reject any run whose val_rmse is above this"},
    "metric": {"type": ["string", "null"], "enum": [*METRICS, None],
               "title": "Quality gate: metric",
               "description": "the validation metric max_drop and floor judge (pgtrain.config.metrics.METRICS)"},
    "max_drop": {**_OPTIONAL_NUMBER, "minimum": 0,
                 "title": "Quality gate: max drop",
                 "description": "reject if the metric is more than this worse than the head's (below it for a "
                                "higher-is-better metric, above it for a lower-is-better one); empty = no gate"},
    "floor": {**_OPTIONAL_NUMBER,
              "title": "Quality floor",
              "description": "reject any run whose metric is worse than this (below it for a higher-is-better "
                             "metric, above it for a lower-is-better one)"},
    "allow_unvalidated": {"type": "boolean",
                          "title": "Quality gate: allow unvalidated versions",
                          "description": "false (the default): a run without validation rows is refused when its "
                                         "shards are planned, and a version without the task's validation metric "
                                         "does not become the head; true: both may"},
    "allow_retarget": {"type": "boolean",
                       "title": "Quality gate: allow re-targeting the model",
                       "description": "false (the default): a run whose data (source, key, target, task or input "
                                      "columns) differs from the head version's is refused before planning, and a "
                                      "version of other data never moves the head; true: the model may move to "
                                      "other data"},
})

# What of a categorical column a version stores in clear: the DAG author's (the settings file's or a model entry's
# ``categories``), never the triggerer's. Kept in the run's config snapshot, as the gate is, so that planning
# applies the rules in force when the run was admitted. A level not stored in clear is stored as its hash, which
# is all scoring needs (pgtrain.data.level_storage).
CATEGORY_STORAGE: dict[str, dict[str, Any]] = _with_defaults({
    "hashed_columns": {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True,
                       "title": "Hashed columns",
                       "description": "columns whose levels are never stored in clear, only their hashes"},
    "max_clear_levels": {"type": "integer", "minimum": 0, "maximum": 10000, "title": "Max clear levels",
                         "description": "a column keeping more levels than this stores all of them as hashes"},
    "max_level_length": {"type": "integer", "minimum": 0, "title": "Max level length",
                         "description": "a level longer than this (characters) is stored as its hash"},
})

# How each rank runs: the DAG author's (the settings file or a models-file entry), never the triggerer's. Kept in
# the run's config snapshot: the ranks read it from there, wherever they run, with no launcher passing it on.
RANK_SETTINGS: dict[str, dict[str, Any]] = _with_defaults({
    "intra_op_threads": {"type": ["integer", "null"], "minimum": 1, "maximum": 1024,
                         "title": "Threads per rank",
                         "description": "torch's threads in each rank; empty = $OMP_NUM_THREADS if set, else the "
                                        "CPUs the rank may use shared by the ranks on its node"},
})

_SCHEMA = {"type": "object", "properties": {**PARAMETERS, **QUALITY_GATE, **CATEGORY_STORAGE,
                                                   **RANK_SETTINGS},
           "additionalProperties": False}


def quality_gate_problems(gate: Mapping[str, Any], task: str | None = None) -> list[str]:
    """What a quality gate's schema cannot say is wrong with it: ``max_drop`` or ``floor`` without the ``metric``
    they judge, or a metric of another task than ``task`` (None: any task)."""
    if gate.get("metric") is None:
        return [f"{key}: needs metric, the metric it judges" for key in ("max_drop", "floor")
                if gate.get(key) is not None]
    return [f"metric: {problem}" for problem in metric_problems(gate["metric"], task)]


def unknown_keys(values: dict[str, Any], known: dict[str, Any] = PARAMETERS) -> list[str]:
    """One message per key that is not a param, with the closest param name when there is one."""
    messages = []
    for key in sorted(set(values) - set(known)):
        # Two candidates: a typo is often equally close to two params (feature_column: features_column or
        # feature_columns), and naming the wrong one alone misleads.
        close = difflib.get_close_matches(key, PARAMETERS, n=2)
        hint = (f"; did you mean {' or '.join(map(repr, close))}?" if close
                else f"; the params are: {', '.join(PARAMETERS)}")
        messages.append(f"{key!r} is not a param of this DAG{hint}")
    return messages


def validate_params(values: dict[str, Any]) -> None:
    """Raise ConfigError listing every problem of ``values`` against PARAMETERS (JSON schema, full matches)."""
    problems = param_problems(values)
    if problems:
        raise ConfigError("invalid training parameters: " + "; ".join(problems))


def param_problems(values: dict[str, Any]) -> list[str]:
    """One message per problem of ``values`` against PARAMETERS, each starting with the param's name."""
    import jsonschema  # Airflow depends on it; imported here so that parsing a DAG stays cheap

    problems = unknown_keys(values, _SCHEMA["properties"])
    known = {k: v for k, v in values.items() if k in _SCHEMA["properties"]}
    validator = jsonschema.Draft202012Validator(_SCHEMA)
    for error in sorted(validator.iter_errors(known), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in error.absolute_path) or "params"
        problems.append(f"{where}: {_short(error)}")
    return problems


def _short(error: Any) -> str:
    if error.validator == "anyOf":
        return f"{error.instance!r} is not valid: {error.schema.get('description', 'see the param description')}"
    return error.message
