"""A search: N trials over one plan, the best one committed (issue 34). The ``search`` param's block, its check
against the author's caps (``search_limits``), and the trials it asks for. No Airflow, numpy or database here: the
DAG files import this when they are parsed.

The block (a models-file entry's ``params.search``, or the trigger's ``search`` param)::

    search:
      candidates:                         # each trial is one candidate with one value per knob
        - model: mlp
          params: {hidden_sizes: [[64], [128, 64]], learning_rate: {low: 0.001, high: 0.01, log: true}}
        - model: xgboost
          model_options: {max_depth: [4, 6]}
      strategy: grid                      # grid (every combination, in order) or random (seeded draws)
      seed: 0
      trials: 4                           # grid: at most this many of the combinations; random: this many draws
      metric: val_accuracy                # the validation metric the best trial is chosen by (its direction: METRICS;
                                          # default: early_stopping_metric, val_rmse for a regression's val_loss)

A knob's value is a list of choices, or (random only) a range ``{low, high, log, integer}``; the mlp's
``numeric_bins`` only a list (planning computes the quantile edges of each value, for every trial:
``pgtrain.config.bins.bin_counts``). The author's caps
(``search_limits`` in the settings file or a models-file entry): ``max_trials``, ``concurrency`` (trials at once:
the mapped train task's ``max_active_tis_per_dagrun``) and ``max_total_world_size`` (ranks of all trials running
at once); no ``search_limits``: no search.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgtrain.config.metrics import METRICS, metric_problems
from pgtrain.core.errors import ConfigError

STRATEGIES = ("grid", "random")
# Params a candidate may not set: they are the plan's (every trial reads the one manifest, and its rows are split by
# the run's seed and fractions: a trial with another seed would count other rows than the plan's) or the author's.
PLAN_PARAMS = ("source_table", "key_column", "features_column", "feature_columns", "exclude_columns",
               "categorical_columns", "hashed_columns", "max_clear_levels", "max_level_length", "label_column", "task",
               "missing_values", "max_categories", "min_category_count", "input_dim", "num_classes",
               "validation_fraction", "test_fraction", "seed", "bad_rows",
               "model_name", "world_size", "launcher", "backend", "collective_timeout", "precision", "stall_timeout",
               "init_from", "force", "search")
DEFAULT_TRIALS = 8
# numeric_bins values one search may ask for: planning computes and records the quantile edges of each (one sort per
# column for all of them), and the plan's record holds every one's
MAX_BIN_CHOICES = 4
MAX_TRIALS = 1000  # no author may allow more (LIMITS_SCHEMA), so a block asking for more is refused as it parses

_RANGE = {"type": "object", "additionalProperties": False, "required": ["low", "high"],
          "properties": {"low": {"type": "number"}, "high": {"type": "number"}, "log": {"type": "boolean"},
                         "integer": {"type": "boolean"}}}
_KNOB = {"anyOf": [{"type": "array", "minItems": 1}, _RANGE]}
_KNOBS = {"type": "object", "additionalProperties": _KNOB}
SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["candidates"],
    "properties": {
        "candidates": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["model"],
            "properties": {"model": {"type": "string", "minLength": 1}, "params": _KNOBS, "model_options": _KNOBS}}},
        "strategy": {"enum": list(STRATEGIES)},
        "seed": {"type": "integer", "minimum": 0},
        "trials": {"type": "integer", "minimum": 1, "maximum": MAX_TRIALS},
        "metric": {"enum": list(METRICS)},
    },
}
# The author's caps (AUTHOR_PROPERTIES' ``search_limits``).
LIMITS_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["max_trials"],
    "properties": {"max_trials": {"type": "integer", "minimum": 1, "maximum": MAX_TRIALS},
                   "concurrency": {"type": "integer", "minimum": 1, "maximum": 1000},
                   "max_total_world_size": {"type": "integer", "minimum": 1}},
}


@dataclass(frozen=True)
class SearchLimits:
    max_trials: int
    concurrency: int = 1  # locally, trials share the worker's CPUs
    max_total_world_size: int | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> SearchLimits | None:
        return cls(**data) if data else None


@dataclass(frozen=True)
class Trial:
    number: int  # 1, 2, ...
    params: dict[str, Any]  # the candidate's params over the run's (model, model_options and the knobs)


@dataclass(frozen=True)
class Search:
    trials: tuple[Trial, ...]
    metric: str
    higher_is_better: bool
    strategy: str


def schema_problems(block: Any, schema: Mapping[str, Any] = SEARCH_SCHEMA, where: str = "search") -> list[str]:
    import jsonschema  # Airflow depends on it; imported here so that parsing a DAG stays cheap

    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join([where, *map(str, e.absolute_path)])}: {e.message}"
            for e in sorted(validator.iter_errors(block), key=lambda e: list(map(str, e.absolute_path)))]


def plan_search(block: Mapping[str, Any], base: Mapping[str, Any], limits: SearchLimits | None,
                allowed_models: Sequence[str]) -> Search:
    """The trials ``block`` asks for over the run's params ``base``, checked against the author's ``limits``:
    ConfigError naming every problem (and what to change) before anything trains. Each trial's params are
    validated as a run's (``TrainingConfig``), so a bad knob value fails here, not in a rank."""
    from pgtrain.config.params import PARAMETERS, TrainingConfig

    if limits is None:
        raise ConfigError("search: this DAG's author allows no search (set search_limits: {max_trials: N} in the "
                          "settings file or the model's entry), so run without the search param")
    problems = schema_problems(block)
    if problems:
        raise ConfigError("invalid search: " + "; ".join(problems))
    task = base.get("task", PARAMETERS["task"]["default"])
    metric = choice_metric(block, base)
    problems += [f"search.metric: {p}" for p in metric_problems(metric, task)]
    if not base.get("test_fraction", PARAMETERS["test_fraction"]["default"]):
        problems.append("test_fraction: 0 leaves no test rows, and a search's version reports its figures from the "
                        "test rows (the validation rows chose the trial): set test_fraction > 0 so the reported "
                        "figure comes from rows no trial was chosen by")
    strategy = block.get("strategy", "grid")
    for i, candidate in enumerate(block["candidates"]):
        where = f"search.candidates[{i}]"
        if candidate["model"] not in allowed_models:
            problems.append(f"{where}.model: {candidate['model']!r} is not allowed by the DAG's author (allowed: "
                            f"{', '.join(allowed_models)})")
        knobs = candidate.get("params", {})
        problems += [f"{where}.params.{name}: not a training param" for name in knobs if name not in PARAMETERS]
        problems += [f"{where}.params.{name}: the plan's or the author's, the same for every trial; set it outside "
                     "the search" for name in knobs if name in PLAN_PARAMS]
        problems += [f"{where}.params.model_options: give the options under model_options" for name in knobs
                     if name in ("model", "model_options")]
        problems += [f"{where}.{part}.{name}: a range needs low < high (and low > 0 with log: true)"
                     for part in ("params", "model_options") for name, knob in candidate.get(part, {}).items()
                     if isinstance(knob, dict) and not (knob["low"] < knob["high"] and (
                         knob["low"] > 0 or not knob.get("log")))]
        problems += _bins_problems(where, candidate)
        if strategy == "grid":
            problems += [f"{where}.{part}.{name}: a range needs strategy: random; a grid takes a list of values"
                         for part in ("params", "model_options") for name, knob in candidate.get(part, {}).items()
                         if isinstance(knob, dict)]
    if len(asked := bins_asked(block)) > MAX_BIN_CHOICES:
        problems.append(f"numeric_bins: the candidates ask for {len(asked)} bin counts ({sorted(asked)}), and one plan "
                        f"records the quantile edges of at most {MAX_BIN_CHOICES}: ask for fewer")
    if problems:
        raise ConfigError("invalid search: " + "; ".join(problems))
    count = _count(block, strategy)  # before drawing: a grid's combinations can be far too many to build
    if count > limits.max_trials:
        problems.append(f"search.trials: {count} trials, and the DAG's author allows at most {limits.max_trials} "
                        "(search_limits.max_trials): ask for fewer")
    world_size = base.get("world_size", PARAMETERS["world_size"]["default"])
    at_once = min(limits.concurrency, count) * world_size
    if limits.max_total_world_size is not None and at_once > limits.max_total_world_size:
        problems.append(f"world_size: {min(limits.concurrency, count)} trials at once of {world_size} ranks "
                        f"each need {at_once} ranks, and the DAG's author allows {limits.max_total_world_size} in "
                        "all (search_limits.max_total_world_size): lower world_size")
    if problems:
        raise ConfigError("invalid search: " + "; ".join(problems))
    drawn = _grid(block) if strategy == "grid" else _random(block)
    trials = []
    for number, params in enumerate(drawn, 1):
        trial = Trial(number, params)
        try:
            TrainingConfig.from_mapping(trial_config(base, trial))
        except ConfigError as error:
            problems.append(f"search trial {number} ({describe(params)}): {error}")
        trials.append(trial)
    if task == "regression" and metric == "val_loss" and len(
            {(t.params["model"], t.params.get("standardize_target", base.get("standardize_target", True)))
             for t in trials}) > 1:
        problems.append("search.metric: val_loss is not comparable across these trials (the mlp's is on the "
                        "standardized target, xgboost's the squared error in the target's units): choose by val_rmse "
                        "or val_r2")
    if problems:
        raise ConfigError("invalid search: " + "; ".join(problems))
    return Search(tuple(trials), metric, METRICS[metric].higher_is_better, strategy)


def bins_asked(block: Mapping[str, Any]) -> set[int]:
    """The numeric_bins values > 0 the block's candidates list (a knob of another shape: none)."""
    return {b for c in block.get("candidates") or () if isinstance(c, Mapping)
            and isinstance(knob := (c.get("params") or {}).get("numeric_bins"), list)
            for b in knob if isinstance(b, int) and not isinstance(b, bool) and b > 0}


def _bins_problems(where: str, candidate: Mapping[str, Any]) -> list[str]:
    """A candidate's numeric_bins: a list of values (the plan computes each one's edges before any trial, for all of
    them), and only the built-in mlp's (others read standardized values)."""
    knob = candidate.get("params", {}).get("numeric_bins")
    if knob is None:
        return []
    if not isinstance(knob, list):
        return [f"{where}.params.numeric_bins: a list of values (e.g. [0, 32]), not a range: planning computes the "
                "quantile edges of each value once, for every trial"]
    if candidate["model"] != "mlp" and any(isinstance(b, int) and b > 0 for b in knob):
        return [f"{where}.params.numeric_bins: quantile bins are the built-in mlp's input encoding; "
                f"{candidate['model']} reads the standardized values: drop numeric_bins from this candidate"]
    return []


def choice_metric(block: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """The validation metric the best trial is chosen by: the block's, else the run's early stopping metric, but
    val_rmse for a regression's val_loss (trials' val_loss differ in scale: the mlp's is on the standardized
    target, xgboost's in the target's units)."""
    from pgtrain.config.params import PARAMETERS

    if block.get("metric"):
        return block["metric"]
    metric = base.get("early_stopping_metric") or PARAMETERS["early_stopping_metric"]["default"]
    task = base.get("task", PARAMETERS["task"]["default"])
    return "val_rmse" if task == "regression" and metric == "val_loss" else metric


def trial_config(base: Mapping[str, Any], trial: Trial) -> dict[str, Any]:
    """A trial's params: the run's, without its search, with the trial's over them."""
    merged = {**{k: v for k, v in base.items() if k != "search"}, **trial.params}
    if trial.params["model"] != base.get("model", "mlp") and "model_options" not in trial.params:
        merged["model_options"] = {}  # the run's options are its own model's, not this candidate's
    return merged


def describe(params: Mapping[str, Any]) -> str:
    """A trial's params in one line (``model=mlp hidden_sizes=[64] ...``)."""
    options = params.get("model_options") or {}
    return " ".join([f"model={params['model']}", *(f"{k}={v}" for k, v in params.items()
                                                    if k not in ("model", "model_options")),
                     *(f"{k}={v}" for k, v in options.items())])


def _knobs(candidate: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    return [("params", k, v) for k, v in candidate.get("params", {}).items()] + \
           [("model_options", k, v) for k, v in candidate.get("model_options", {}).items()]


def _count(block: Mapping[str, Any], strategy: str) -> int:
    """How many trials ``block`` asks for, without drawing them."""
    if strategy == "random":
        return block.get("trials", DEFAULT_TRIALS)
    combinations = sum(math.prod(len(v) for _, _, v in _knobs(c)) for c in block["candidates"])
    return min(combinations, block["trials"]) if "trials" in block else combinations


def _grid(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every candidate's combinations in order (the last knob fastest), the first ``trials`` of them (built lazily:
    only those are)."""
    def combos(candidate: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        knobs = _knobs(candidate)
        for values in itertools.product(*(v for _, _, v in knobs)):
            yield _trial_params(candidate, [(part, name, value) for (part, name, _), value
                                            in zip(knobs, values, strict=True)])

    every = itertools.chain.from_iterable(combos(c) for c in block["candidates"])
    return list(itertools.islice(every, block.get("trials")))


def _random(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``trials`` draws (seeded): the candidates in turn, each knob drawn from its choices or range."""
    rng = random.Random(block.get("seed", 0))
    drawn = []
    candidates = block["candidates"]
    for n in range(block.get("trials", DEFAULT_TRIALS)):
        candidate = candidates[n % len(candidates)]
        knobs = [(part, name, _draw(rng, knob)) for part, name, knob in _knobs(candidate)]
        drawn.append(_trial_params(candidate, knobs))
    return drawn


def _draw(rng: random.Random, knob: Any) -> Any:
    if isinstance(knob, list):
        return knob[rng.randrange(len(knob))]
    low, high = knob["low"], knob["high"]
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if knob.get("log") else rng.uniform(low, high)
    return round(value) if knob.get("integer") else value


def _trial_params(candidate: Mapping[str, Any], knobs: list[tuple[str, str, Any]]) -> dict[str, Any]:
    params: dict[str, Any] = {"model": candidate["model"]}
    options = {name: value for part, name, value in knobs if part == "model_options"}
    if options:
        params["model_options"] = options
    params.update({name: value for part, name, value in knobs if part == "params"})
    return params
