"""What a commit checks and records, without touching the store: the staged layout against the run's model
layout, the quality gate per task, whether the architecture changed, and the version's spec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from pgtrain.config.metrics import METRICS, REGRESSION, TEST_PREFIX, VALIDATION_PREFIX, Metric, figures_from, reported
from pgtrain.config.params import TrainingConfig
from pgtrain.core.errors import CommitRejected
from pgtrain.data import input_record
from pgtrain.models.spec import ModelSpec
from pgtrain.runs.record import Run
from pgtrain.store.tensors import FLOAT_DTYPES, TensorInfo

# What a head and a new version must share for the new one to replace the head without an explicit promote.
ARCHITECTURE_KEYS = ("model", "task", "input_dim", "output_dim")


def expected_layout(run: Run) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) the staged tensors must have: the trainer's model_layout, else (runs from before
    it was recorded) the built-in MLP of the run's dimensions."""
    layout = run.model_layout
    if layout:
        return {name: (tuple(t["shape"]), t["dtype"]) for name, t in layout.items()}
    output_dim = run.output_dim or run.num_classes
    if run.input_dim is None or output_dim is None:
        raise CommitRejected(f"run {run.run_id!r} has no model_layout and no input_dim/output_dim: the trainer "
                             "did not record its model; re-run the train task")
    spec = ModelSpec(run.input_dim, tuple(run.config.hidden_sizes), output_dim)
    return {name: (shape, "float32") for name, shape in spec.parameter_shapes().items()}


def layout_problems(infos: list[TensorInfo], expected: Mapping[str, tuple[tuple[int, ...], str]]) -> list[str]:
    """Everything wrong with the staged tensors: missing, unexpected, wrong shape or dtype."""
    staged = {i.name: i for i in infos}
    problems = [f"missing tensor {name} {list(shape)}" for name, (shape, _) in expected.items() if name not in staged]
    problems += [f"unexpected tensor {name}" for name in staged if name not in expected]
    for name, info in staged.items():
        if name not in expected:
            continue
        shape, dtype = expected[name]
        if info.shape != tuple(shape):
            problems.append(f"{name} has shape {list(info.shape)}, the model needs {list(shape)}")
        if info.dtype != dtype:
            problems.append(f"{name} has dtype {info.dtype}, the model needs {dtype}")
    return problems


def nonfinite_problems(infos: list[TensorInfo], counted: Mapping[str, int]) -> list[str]:
    """One line per float tensor with NaN/Inf values (``counted`` fills in counts the writer did not record)."""
    problems = []
    for info in infos:
        if info.dtype not in FLOAT_DTYPES:
            continue
        count = info.nonfinite if info.nonfinite is not None else counted.get(info.name, 0)
        if count:
            problems.append(f"{info.name} has {count} non-finite values")
    return problems


def version_spec(conn: psycopg.Connection, run: Run) -> dict[str, Any]:
    """What rebuilding and using the version takes, and where it came from (stored as model_versions.spec)."""
    config = run.config
    plan = conn.execute("SELECT snapshot::text FROM pgtrain.shard_plans WHERE run_id = pgtrain.plan_of(%s)",
                        (run.run_id,)).fetchone()
    last = conn.execute("SELECT key_hi FROM pgtrain.shard_manifest WHERE run_id = pgtrain.plan_of(%s) "
                        "ORDER BY rank DESC LIMIT 1", (run.run_id,)).fetchone()
    planned = input_record.of_run(run)
    return {
        "model": config.model,
        "model_options": config.model_options_for_build,
        "input_dim": planned.input_dim,
        "output_dim": planned.output_dim,
        "feature_columns": list(planned.feature_columns),
        "encoding": run.encoding,  # the run's input record, verbatim (input_record.of_version reads it)
        "target_column": planned.target_column,
        "task": planned.task,
        "standardize_target": config.standardize_target,
        "parent_version": run.init_version,
        "backend": run.backend,
        "source_table": planned.source_table,
        "key_column": planned.key_column,
        "watermark": {"snapshot": plan[0] if plan else None, "max_key": last[0] if last else None},
    }


def architecture_change(spec: Mapping[str, Any], head: Mapping[str, Any] | None) -> str | None:
    """How the version differs from the head's in model, task or widths (None: same, or no head to compare)."""
    head_spec = (head or {}).get("spec")
    if not head_spec:
        return None
    diffs = [f"{key} {head_spec.get(key)!r} -> {spec.get(key)!r}" for key in ARCHITECTURE_KEYS
             if head_spec.get(key) != spec.get(key)]
    return ", ".join(diffs) or None


@dataclass(frozen=True)
class GateVerdict:
    rejection: str | None = None  # why the run may not become a version; None: it may
    note: str | None = None  # what the gate could not check, for the run's status_reason
    hold: str | None = None  # why the version may be committed but not become the head; None: it may


def quality_gate(config: TrainingConfig, task: str, metrics: Mapping[str, Any],
                 head: Mapping[str, Any] | None) -> GateVerdict:
    """Whether the run may become a version (and the head), and why not.

    Each rule of the run's gate in turn: the task's (max_accuracy_drop and the floor min_val_accuracy on
    val_accuracy, max_rmse_rise and max_val_rmse on val_rmse), then ``metric``'s (max_drop and floor), each
    in the metric's direction (``pgtrain.config.metrics.METRICS``), on the figure the version reports: read on its
    test rows (rows that chose nothing) where it has them, else on its validation rows. The head is compared on
    the rows both have: test rows, or (a head from before the test part, or either without test rows) both
    versions' validation rows, which the note says. Floors hold whatever the head; the
    comparison with the head only when there is a comparable head (``head`` None: none, or a different
    architecture) that recorded the metric (else the verdict's note says so). A metric the run did not record
    (None) fails a floor, and a comparison with a head that recorded it. A run that recorded no validation metric
    at all (no validation rows) and that no rule rejects is held from the head unless the author's gate
    ``allow_unvalidated``.
    """
    rules = ([("val_rmse", config.max_val_rmse, "max_val_rmse", config.max_rmse_rise, "max_rmse_rise")]
             if task == REGRESSION else
             [("val_accuracy", config.min_val_accuracy, "min_val_accuracy", config.max_accuracy_drop,
               "max_accuracy_drop")])
    if config.metric is not None:
        rules.append((config.metric, config.floor, "floor", config.max_drop, "max_drop"))
    notes = []
    for key, floor, floor_name, slack, slack_name in rules:
        rejection, note = _gate(METRICS[key], metrics, head, floor, floor_name, slack, slack_name)
        if rejection is not None:
            return GateVerdict(rejection)
        notes += [note] if note else []
    validated = any(key.startswith((VALIDATION_PREFIX, TEST_PREFIX)) and value is not None
                    for key, value in metrics.items())
    hold = None if validated or config.allow_unvalidated else (
        "the run recorded no validation metric (it had no validation rows), and the DAG's author's quality gate "
        "does not set allow_unvalidated")
    return GateVerdict(note="; ".join(notes) or None, hold=hold)


def _gate(metric: Metric, metrics: Mapping[str, Any], head: Mapping[str, Any] | None, floor: float | None,
          floor_name: str, slack: float | None, slack_name: str) -> tuple[str | None, str | None]:
    """(rejection, note) of one rule: a floor and a slack on one metric."""
    rows = figures_from(metrics)
    value = reported(metrics, metric.name)
    label = f"{rows} {metric.label}"
    compared = head is not None and slack is not None
    head_metrics = (head or {}).get("metrics") or {}
    common = "test" if rows == figures_from(head_metrics) == "test" else "validation"
    head_value = reported(head_metrics, metric.name, common) if compared else None
    fallback = None
    if compared and common != rows:
        fallback = (f"quality gate: head version {head['version']} has no test figures: it was compared on both "
                    "versions' validation rows")
    if value is None and (floor is not None or head_value is not None):
        against = (f"check against {floor_name}={floor:g}" if floor is not None else
                   f"compare with head version {head['version']} ({head_value:.4f})")
        why = f"; it is undefined when {metric.undefined_when}" if metric.undefined_when else ""
        return (f"quality gate: the run has no {label} to {against}; train with validation_fraction > 0{why}",
                None)
    if value is not None and floor is not None and metric.worse(value, floor):
        return (f"quality gate: {label} {value:.4f} is {'below' if metric.higher_is_better else 'above'} "
                f"{floor_name}={floor:g}"), None
    if not compared:
        return None, None
    if head_value is None:
        return None, (f"quality gate: head version {head['version']} recorded no {common} {metric.label}: "
                      f"{slack_name} was not applied")
    value = reported(metrics, metric.name, common)
    if value is not None and metric.worse(value, metric.worsened(head_value, slack)):
        direction = "below" if metric.higher_is_better else "above"
        return (f"quality gate: {common} {metric.label} {value:.4f} is more than {slack_name}={slack:g} {direction} "
                f"head version {head['version']} ({head_value:.4f}); the head stays at version {head['version']}"), None
    return None, fallback
