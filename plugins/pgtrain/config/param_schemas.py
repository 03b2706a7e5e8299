"""Every param a run's config holds, declared once: its default, its rule (JSON schema), its title, description
and form section.

``PARAMETERS`` are the triggerer's (the DAG's Airflow params are generated from them, and the trigger form validates
with them); ``QUALITY_GATE``, ``CATEGORY_STORAGE`` and ``RANK_SETTINGS`` are the DAG author's, kept in the run's
config snapshot. ``pgtrain.config.training.TrainingConfig`` has one field per declaration here, its default this
one's; ``pgtrain.config.param_checks`` checks params against these rules.
"""

from __future__ import annotations

from typing import Any

from pgtrain.config.metrics import METRICS

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
BUILTIN_MLP = "mlp"  # the built-in model's name (pgtrain.models.network builds it)
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


# name -> JSON schema (default, title, description and form section) of each param.
PARAMETERS: dict[str, dict[str, Any]] = {
    "source_table": {"default": "public.samples", "type": "string", "minLength": 1, "section": _DATA,
                     "title": "Source table",
                     "description": "table holding the training rows, schema-qualified and quoted as in SQL "
                                    "(e.g. \"Clinic\".\"Biopsies\"); must be allowed by the DAG's author"},
    "key_column": {"default": "id", "type": "string", "minLength": 1, "section": _DATA, "title": "Key column",
                   "description": "unique, orderable key column used for keyset sharding"},
    "features_column": {"default": None, "type": ["string", "null"], "minLength": 1, "section": _DATA,
                        "title": "Features column (array)",
                        "description": "one real[], double precision[] or bytea (packed float32) column; empty = "
                                       f"{DEFAULT_FEATURES_COLUMN!r} unless feature_columns is given"},
    "feature_columns": {"default": None, "type": ["array", "string", "null"], "minItems": 1, "pattern": rf"^\*{END}",
                        "items": {"type": "string", "minLength": 1}, "section": _DATA,
                        "title": "Feature columns",
                        "description": "\"*\" (every column but the key, the target and exclude_columns) or a "
                                       "list of columns in input order: numbers, booleans, dates and timestamps, "
                                       "text, varchar, char and enum columns (categories)"},
    "exclude_columns": {"default": [], "type": "array", "items": {"type": "string", "minLength": 1},
                        "uniqueItems": True,
                        "section": _DATA, "title": "Exclude columns",
                        "description": "columns feature_columns \"*\" leaves out (ids, free text, json, ...)"},
    "categorical_columns": {"default": [], "type": "array", "items": {"type": "string", "minLength": 1},
                            "uniqueItems": True,
                            "section": _DATA, "title": "Categorical columns",
                            "description": "feature columns to treat as categories whatever their type (an "
                                           "integer zip or product code, a boolean); text and enum columns are "
                                           "categories anyway"},
    "label_column": {"default": "label", "type": "string", "minLength": 1, "section": _DATA,
                     "title": "Target column",
                     "description": "classification: the class (integer, text, varchar, char, boolean or enum; "
                                    "the classes are its values in the training rows); regression: a numeric "
                                    "column or numeric array"},
    "task": {"default": "classification", "type": "string", "enum": list(TASKS), "section": _DATA,
             "title": "Task", "description": "classification (cross-entropy) or regression (mean squared error)"},
    "missing_values": {"default": "impute", "type": "string", "enum": list(MISSING_VALUES), "section": _DATA,
                       "title": "Missing values",
                       "description": "NULL in a feature column: impute (the training mean, plus a 0/1 'was "
                                      "missing' input for each column that had NULLs; a NULL category is a level "
                                      "of its own) or bad_row (the row is bad: see bad_rows)"},
    "max_categories": {"default": 100, "type": "integer", "minimum": 1, "maximum": 10000, "section": _DATA,
                       "title": "Max categories",
                       "description": "the most frequent levels a categorical column keeps; the rest share one "
                                      "'other' level"},
    "min_category_count": {"default": 5, "type": "integer", "minimum": 1, "section": _DATA,
                           "title": "Min category count",
                           "description": "training rows a level needs to be kept; rarer levels are 'other'"},
    "input_dim": {"default": None, "type": ["integer", "null"], "minimum": 1, "section": _DATA,
                  "title": "Feature length",
                  "description": "array features only; empty = the most common length among the rows"},
    "num_classes": {"default": None, "type": ["integer", "null"], "minimum": 2, "maximum": MAX_CLASSES,
                    "section": _DATA, "title": "Classes",
                    "description": "classification with labels 0..num_classes-1 only; empty = the classes are "
                                   "the label's values (non-negative integers: 0..max(label))"},
    "validation_fraction": {"default": 0.1, "type": "number", "minimum": 0, "maximum": 0.5, "section": _DATA,
                            "title": "Validation fraction",
                            "description": "share of rows held out for validation (they choose the best epoch), "
                                           "chosen by a hash of the key"},
    "test_fraction": {"default": 0.1, "type": "number", "minimum": 0, "maximum": 0.5, "section": _DATA,
                      "title": "Test fraction",
                      "description": "share of rows held out as test rows, which choose nothing: the version's "
                                     "figures are read on them; chosen by the same hash of the key; 0 = none (the "
                                     "figures are then the validation rows')"},
    "bad_rows": {"default": "fail", "type": "string", "enum": ["fail", "exclude"], "section": _DATA,
                 "title": "Bad rows",
                 "description": "rows with NULL/non-finite values, wrong length or bad labels: fail or skip"},
    "model_name": {"default": "digits-mlp", "type": "string", "pattern": _MODEL_NAME, "section": _MODEL,
                   "title": "Model name", "description": "the model whose next version this run commits"},
    "model": {"default": "mlp", "type": "string", "pattern": MODEL_REFERENCE, "section": _MODEL,
              "title": "Model", "description": "mlp, xgboost (gradient-boosted trees), or package.module:factory "
                                               "(allowed by the DAG's author)"},
    "model_options": {"default": {}, "type": "object", "section": _MODEL, "title": "Model options",
                      "description": "keyword arguments of the factory: factory(input_dim=, output_dim=, ...); "
                                     "xgboost: its options (n_estimators, max_depth, ...: docs/models.md)"},
    # pgtrain.config.search: N trials over this run's plan, the best committed
    "search": {"default": None, "type": ["object", "null"], "section": _MODEL, "title": "Search",
               "description": "trials over one plan, the best by a validation metric committed: candidates (models "
                              "and knob values), strategy (grid or random), seed, trials, metric; within the DAG "
                              "author's search_limits (docs/configuration.md#search)"},
    "hidden_sizes": {"default": [50], "type": "array", "minItems": 1, "maxItems": 16,
                     "items": {"type": "integer", "minimum": 1, "maximum": 65536}, "section": _MODEL,
                     "title": "Hidden layers", "description": "hidden layer widths of the mlp model"},
    "ensemble_members": {"default": DEFAULT_ENSEMBLE_MEMBERS, "type": "integer", "minimum": 1, "maximum": 256,
                         "section": _MODEL,
                         "title": "Ensemble members",
                         "description": "mlp: members of a shared-weight ensemble (BatchEnsemble, as TabM), each "
                                        "trained on its own loss, their predictions averaged; 1 = one plain MLP"},
    "numeric_bins": {"default": DEFAULT_NUMERIC_BINS, "type": "integer", "minimum": 0, "maximum": MAX_NUMERIC_BINS,
                     "section": _MODEL, "title": "Numeric bins",
                     "description": "mlp: each numeric column through up to this many quantile bins of the training "
                                    "rows (piecewise-linear encoding); 0 = the standardized value"},
    "init_from": {"default": "scratch", "type": ["string", "integer"], "section": _MODEL, "title": "Start from",
                  "anyOf": [{"type": "string", "enum": list(INIT_FROM_WORDS)},
                            {"type": "string", "pattern": rf"^[1-9][0-9]{{0,8}}{END}"},
                            {"type": "integer", "minimum": 1}],
                  "description": "scratch, head (the model's current version), or a version number"},
    "standardize_target": {"default": True, "type": "boolean", "section": _MODEL, "title": "Standardize target",
                           "description": "regression: train on the standardized target, predict in its units"},
    "dropout": {"default": 0.0, "type": "number", "minimum": 0, "maximum": 0.9, "section": _MODEL, "title": "Dropout",
                "description": "mlp: the share of each hidden layer's units dropped while training"},
    "normalization": {"default": "none", "type": "string", "enum": list(NORMALIZATIONS), "section": _MODEL,
                      "title": "Normalization",
                      "description": "mlp: none, or layer (LayerNorm after each hidden Linear; per row, so any "
                                     "number of ranks trains the same model)"},
    "epochs": {"default": 50, "type": "integer", "minimum": 1, "maximum": 10000, "section": _TRAINING,
               "title": "Epochs", "description": "the most passes over the training rows (early stopping may "
                                                 "end sooner)"},
    "batch_size": {"default": None, "type": ["integer", "null"], "minimum": 1, "maximum": 1048576,
                   "section": _TRAINING, "title": "Batch size per rank",
                   "description": "rows per rank per step (global batch = world_size x batch_size); empty = "
                                  f"auto: the largest shard's training rows / {AUTO_STEPS_PER_EPOCH}, between "
                                  f"{AUTO_MIN_BATCH} and {AUTO_MAX_BATCH}"},
    "optimizer": {"default": "adamw", "type": "string", "enum": list(OPTIMIZERS), "section": _TRAINING,
                  "title": "Optimizer",
                  "description": "adamw (decoupled weight decay) or sgd (momentum 0.9)"},
    "learning_rate": {"default": None, "type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 10,
                      "section": _TRAINING, "title": "Learning rate",
                      "description": "the peak rate of the schedule; empty = auto: adamw "
                                     f"{BASE_LEARNING_RATE['adamw']} x sqrt(global batch / {BASE_GLOBAL_BATCH}), "
                                     f"at most {MAX_AUTO_LEARNING_RATE['adamw']}; sgd {BASE_LEARNING_RATE['sgd']} "
                                     f"x global batch / {BASE_GLOBAL_BATCH}, at most {MAX_AUTO_LEARNING_RATE['sgd']}"},
    "weight_decay": {"default": None, "type": ["number", "null"], "minimum": 0, "maximum": 1, "section": _TRAINING,
                     "title": "Weight decay",
                     "description": f"empty = auto: adamw {AUTO_WEIGHT_DECAY['adamw']}, "
                                    f"sgd {AUTO_WEIGHT_DECAY['sgd']}"},
    "lr_schedule": {"default": "cosine", "type": "string", "enum": list(LR_SCHEDULES), "section": _TRAINING,
                    "title": "Learning-rate schedule",
                    "description": "constant; cosine (linear warm-up over warmup_epochs, then cosine decay to 0 at "
                                   "the last epoch); one_cycle (up from rate/25 over 30% of the steps, then cosine "
                                   "down to rate/1e4, as torch's OneCycleLR)"},
    "warmup_epochs": {"default": 1.0, "type": "number", "minimum": 0, "maximum": 1000, "section": _TRAINING,
                      "title": "Warm-up epochs",
                      "description": "cosine: epochs of linear warm-up from 0 to the learning rate (at most half "
                                     "of the steps)"},
    "early_stopping_patience": {"default": 5, "type": "integer", "minimum": 0, "maximum": 10000, "section": _TRAINING,
                                "title": "Early stopping patience",
                                "description": "stop after this many epochs without a better "
                                               "early_stopping_metric and keep the best epoch's parameters; 0 = "
                                               "off (also off without validation rows)"},
    "early_stopping_metric": {"default": "val_loss", "type": "string", "enum": list(METRICS), "section": _TRAINING,
                              "title": "Early stopping metric",
                              "description": "the validation metric early stopping and the best epoch follow"},
    "class_weight": {"default": "none", "type": "string", "enum": list(CLASS_WEIGHTS), "section": _TRAINING,
                     "title": "Class weight",
                     "description": "classification: none, or balanced (each class weighs training rows / "
                                    "(classes x its rows), from the training rows of all ranks)"},
    "seed": {"default": 0, "type": "integer", "minimum": 0, "maximum": 2**31 - 1, "section": _TRAINING,
             "title": "Seed", "description": "initialization, split and shuffling seed"},
    "checkpoint_every": {"default": 1, "type": "integer", "minimum": 0, "maximum": 10000, "section": _TRAINING,
                         "title": "Checkpoint every",
                         "description": "epochs between checkpoints a retried train task resumes from; 0 = off"},
    "force": {"default": False, "type": "boolean", "section": _TRAINING, "title": "Train even if unchanged",
              "description": "scheduled (cron) runs skip training when no row of the source changed since the "
                             "head version was trained; set this to train anyway"},
    # One rank by default: on a CPU-only worker one rank's PyTorch threads use every core, and two ranks there
    # only add Horovod's per-step allreduce (docs/performance.md); GPUs want one rank each.
    "world_size": {"default": 1, "type": "integer", "minimum": 1, "maximum": MAX_WORLD_SIZE, "section": _CLUSTER,
                   "title": "Ranks",
                   "description": "Horovod ranks: one per GPU; on a CPU-only worker one rank uses every core"},
    "launcher": {"default": "local", "type": "string", "enum": ["local", "kubernetes"], "section": _CLUSTER,
                 "title": "Launcher",
                 "description": "local: horovodrun on the worker; kubernetes: an MPIJob on GPU pods"},
    "backend": {"default": "auto", "type": "string", "enum": list(BACKENDS), "section": _CLUSTER,
                "title": "Collectives backend",
                "description": "horovod, torch (torch.distributed: NCCL on GPUs, Gloo on CPUs) or auto (horovod "
                               "where horovod.torch imports, else torch); the DAG author's, never the triggerer's"},
    "collective_timeout": {"default": DEFAULT_COLLECTIVE_TIMEOUT, "type": "integer", "minimum": 10, "maximum": 86400,
                           "section": _CLUSTER,
                           "title": "Collective timeout (s)",
                           "description": "torch backend: the longest a rank waits in one collective or the "
                                          "rendezvous before the job fails; the DAG author's"},
    "precision": {"default": "fp32", "type": "string", "enum": list(PRECISIONS), "section": _CLUSTER,
                  "title": "Precision",
                  "description": "fp32 (TF32 matmuls on GPUs) or bf16 (the forward pass autocast to bfloat16); the "
                                 "DAG author's"},
    "stall_timeout": {"default": DEFAULT_STALL_TIMEOUT, "type": "integer", "minimum": 10, "maximum": 7 * 86400,
                      "section": _CLUSTER,
                      "title": "Stall timeout (s)",
                      "description": "a running Kubernetes job without a new epoch for this long is deleted and the "
                                     "train task fails naming the stall; the DAG author's"},
}

# The quality gate: the DAG author's (the settings file's ``quality_gate``), never the triggerer's. It is kept
# in the run's config snapshot so that the commit applies the gate that was in force when the run was planned.
QUALITY_GATE: dict[str, dict[str, Any]] = {
    "max_accuracy_drop": {"default": None, **_OPTIONAL_NUMBER, "minimum": 0, "maximum": 1,
                          "title": "Quality gate: max accuracy drop",
                          "description": "classification: reject if val_accuracy falls more than this below "
                                         "the head's; empty = no gate"},
    "max_rmse_rise": {"default": None, **_OPTIONAL_NUMBER, "minimum": 0,
                      "title": "Quality gate: max RMSE rise",
                      "description": "regression: reject if val_rmse rises more than this above the head's; "
                                     "empty = no gate"},
    "min_val_accuracy": {"default": None, **_OPTIONAL_NUMBER, "minimum": 0, "maximum": 1,
                         "title": "Quality floor: min accuracy",
                         "description": "classification: reject any run whose val_accuracy is below this"},
    "max_val_rmse": {"default": None, **_OPTIONAL_NUMBER, "minimum": 0,
                     "title": "Quality floor: max RMSE",
                     "description": "regression: reject any run whose val_rmse is above this"},
    "metric": {"default": None, "type": ["string", "null"], "enum": [*METRICS, None],
               "title": "Quality gate: metric",
               "description": "the validation metric max_drop and floor judge (pgtrain.config.metrics.METRICS)"},
    "max_drop": {"default": None, **_OPTIONAL_NUMBER, "minimum": 0,
                 "title": "Quality gate: max drop",
                 "description": "reject if the metric is more than this worse than the head's (below it for a "
                                "higher-is-better metric, above it for a lower-is-better one); empty = no gate"},
    "floor": {"default": None, **_OPTIONAL_NUMBER,
              "title": "Quality floor",
              "description": "reject any run whose metric is worse than this (below it for a higher-is-better "
                             "metric, above it for a lower-is-better one)"},
    "allow_unvalidated": {"default": False, "type": "boolean",
                          "title": "Quality gate: allow unvalidated versions",
                          "description": "false (the default): a run without validation rows is refused when its "
                                         "shards are planned, and a version without the task's validation metric "
                                         "does not become the head; true: both may"},
    "allow_retarget": {"default": False, "type": "boolean",
                       "title": "Quality gate: allow re-targeting the model",
                       "description": "false (the default): a run whose data (source, key, target, task or input "
                                      "columns) differs from the head version's is refused before planning, and a "
                                      "version of other data never moves the head; true: the model may move to "
                                      "other data"},
}

# What of a categorical column a version stores in clear: the DAG author's (the settings file's or a model entry's
# ``categories``), never the triggerer's. Kept in the run's config snapshot, as the gate is, so that planning
# applies the rules in force when the run was admitted. A level not stored in clear is stored as its hash, which
# is all scoring needs (pgtrain.data.level_storage).
CATEGORY_STORAGE: dict[str, dict[str, Any]] = {
    "hashed_columns": {"default": [], "type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True,
                       "title": "Hashed columns",
                       "description": "columns whose levels are never stored in clear, only their hashes"},
    "max_clear_levels": {"default": 100, "type": "integer", "minimum": 0, "maximum": 10000, "title": "Max clear levels",
                         "description": "a column keeping more levels than this stores all of them as hashes"},
    "max_level_length": {"default": 64, "type": "integer", "minimum": 0, "title": "Max level length",
                         "description": "a level longer than this (characters) is stored as its hash"},
}

# How each rank runs: the DAG author's (the settings file or a models-file entry), never the triggerer's. Kept in
# the run's config snapshot: the ranks read it from there, wherever they run, with no launcher passing it on.
RANK_SETTINGS: dict[str, dict[str, Any]] = {
    "intra_op_threads": {"default": None, "type": ["integer", "null"], "minimum": 1, "maximum": 1024,
                         "title": "Threads per rank",
                         "description": "torch's threads in each rank; empty = $OMP_NUM_THREADS if set, else the "
                                        "CPUs the rank may use shared by the ranks on its node (a small "
                                        "network's training steps take fewer)"},
}
