"""HTML of the models list and a run's page, and the pieces the version pages share (metrics, confusion matrix):
plain strings, every value escaped (``pgtrain.airflow.ui.html``), charts as inline SVG (``charts``).

Pure functions of what ``pgtrain.store.catalog`` returns; ``pgtrain.airflow.ui.app`` serves them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pgtrain.airflow.ui.charts import metric_charts
from pgtrain.airflow.ui.html import dag_run_href, e, link, model_href, number, page, version_label, when
from pgtrain.config.metrics import CONFUSION_MATRIX, METRICS, TEST_PREFIX, VALIDATION_PREFIX, figures_from
from pgtrain.config.params import QUALITY_GATE


def validation_keys(metrics: Mapping[str, Any], prefix: str = VALIDATION_PREFIX) -> list[str]:
    """The validation figures of ``metrics`` (or, with prefix test_, the test figures): the registry's in its
    order, then any other such key."""
    known = [TEST_PREFIX + k.removeprefix(VALIDATION_PREFIX) if prefix == TEST_PREFIX else k for k in METRICS]
    return ([k for k in known if k in metrics]
            + sorted(k for k in metrics if k.startswith(prefix) and k not in known
                     and k != prefix + CONFUSION_MATRIX))


def figure_keys(metrics: Mapping[str, Any]) -> list[str]:
    """Every figure of ``metrics``: those read on the test rows first, then the validation rows'."""
    return validation_keys(metrics, TEST_PREFIX) + validation_keys(metrics)


def metric_of(key: str) -> str:
    """The registry name of a figure's metric (test_accuracy -> val_accuracy)."""
    return VALIDATION_PREFIX + key.removeprefix(TEST_PREFIX) if key.startswith(TEST_PREFIX) else key


def rows_of(key: str) -> str:
    """Which rows a figure was read on: test rows chose nothing; validation rows chose the epoch."""
    return "test" if key.startswith(TEST_PREFIX) else "validation"


def _label(key: str) -> str:
    name = metric_of(key)
    return METRICS[name].label if name in METRICS else name.removeprefix(VALIDATION_PREFIX).replace("_", " ")


def metrics_text(metrics: Mapping[str, Any] | None) -> str:
    """The reported figures (the test rows' where the version has them, else the validation rows'), saying which
    rows they come from, then epochs; a short line."""
    metrics = metrics or {}
    rows = figures_from(metrics)
    shown = validation_keys(metrics, TEST_PREFIX if rows == "test" else VALIDATION_PREFIX)
    keys = shown + [k for k in ("best_epoch", "epochs") if k in metrics]
    text = ", ".join(f"{e(_label(k))} {number(metrics[k])}" for k in keys)
    return (f'<span class="rows muted" data-rows="{e(rows)}">{e(rows)}:</span> {text}' if shown else text) or "-"


def metrics_table(metrics: Mapping[str, Any] | None) -> str:
    """A version's figures, one row each, with the direction that is better and the rows it was read on (test
    rows, which chose nothing, first)."""
    metrics = metrics or {}
    rows = "".join(
        f'<tr data-metric="{e(k)}"><th>{e(_label(k))}</th><td>{number(metrics[k])}</td><td>'
        f"{e(METRICS[metric_of(k)].better if metric_of(k) in METRICS else None)}</td><td><code>{e(k)}</code></td>"
        f'<td class="rows">{e(rows_of(k))} rows</td></tr>'
        for k in figure_keys(metrics))
    if rows and metrics.get("best_epoch") is not None:  # early stopping: the figures are the best epoch's
        rows += (f'<tr data-metric="best_epoch"><th>best epoch</th><td>{number(metrics["best_epoch"])} of '
                 f'{number(metrics.get("epochs"))}</td><td>its parameters are the version\'s</td>'
                 "<td><code>best_epoch</code></td></tr>")
    return f'<table id="metrics">{rows}</table>' if rows else "<p>No validation metrics recorded.</p>"


def confusion_matrix(matrix: Mapping[str, Any] | None) -> str:
    """The confusion matrix (rows: true class, columns: predicted class), with the rows of classes the training
    rows lacked as one more row when there were any; empty when none was recorded."""
    if not matrix:
        return ""
    labels, counts, unseen = matrix["labels"], matrix["counts"], matrix.get("unseen") or []
    header = ("<tr class=\"header\"><th>true \\ predicted</th>" + "".join(f"<th>{e(label)}</th>" for label in labels)
              + "</tr>")
    body = "".join(f"<tr><th>{e(label)}</th>" + "".join(
        f'<td{" class=hit" if i == j else ""}>{e(count)}</td>' for j, count in enumerate(row)) + "</tr>"
        for i, (label, row) in enumerate(zip(labels, counts, strict=True)))
    if any(unseen):
        body += ("<tr><th>(a class not in the training rows)</th>"
                 + "".join(f"<td>{e(count)}</td>" for count in unseen) + "</tr>")
    return ('<table id="confusion-matrix" class="matrix"><caption>Confusion matrix: rows are the validation rows\' '
            f"true class, columns the predicted class</caption>{header}{body}</table>")


EMPTY_STATE = (
    '<div class="empty"><p>No model has a committed version in the training database yet '
    "(the Airflow connection <code>pgtrain_db</code>).</p>"
    "<p>Train one: load the digits with <code>make load-digits</code>, then trigger the "
    "<code>pgtrain_model_digits-mlp</code> DAG (DAGs, pgtrain_model_digits-mlp, Trigger), the digits model's DAG "
    "from <code>dags/models.yaml</code>. Its versions appear here once <code>commit_parameters</code> has run. "
    "(<code>make demo</code> trains the same model into the same database, though outside this Airflow, so its "
    "versions link to no DAG run here.)</p></div>"
)


def not_set_up_page(root: str) -> str:
    """A model's or a run's page before pgtrain's tables exist (the first run's provision_tables creates them)."""
    return page("Models", "<p>The training database has no pgtrain tables yet: nothing was trained into it, so "
                "there is no such model or run.</p>" + EMPTY_STATE, root)


def models_page(models: Sequence[Mapping[str, Any]], root: str) -> str:
    if not models:
        return page("Models", EMPTY_STATE, root)
    rows = "".join(
        f"<tr><td>{link(model_href(root, m['model_name']), m['model_name'])}</td>"
        f"<td>{version_label(m['head_version'])}</td>"
        f"<td>{when(m['head_moved_at'])}</td><td>{metrics_text(m['head_metrics'])}</td>"
        f"<td class=\"num\">{e(m['versions'])}</td><td>v{e(m['newest_version'])} at {when(m['newest_at'])}</td></tr>"
        for m in models)
    table = ("<table id=\"models\"><thead><tr><th>Model</th><th>Head</th><th>Head moved</th><th>Head metrics</th>"
             f"<th>Versions</th><th>Newest</th></tr></thead><tbody>{rows}</tbody></table>")
    return page("Models", table, root)


def normalized(value: Any) -> Any:
    """``value`` with every float that is a whole number as an int (in lists and mappings too): a REST conf's
    ``"dropout": 0`` and the form's ``0.0`` are the same param, and show and compare as the same text."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return int(value)
    if isinstance(value, list | tuple):
        return [normalized(v) for v in value]
    if isinstance(value, Mapping):
        return {k: normalized(v) for k, v in value.items()}
    return value


def flat_params(config: Mapping[str, Any] | None, prefix: str = "") -> dict[str, str]:
    """A config snapshot as {dotted key: its ``normalized`` value as compact JSON}, keys sorted: nested objects
    flattened. Equal texts are equal values (numbers compared by value)."""
    flat: dict[str, str] = {}
    for key in sorted(config or {}):
        value = config[key]
        if isinstance(value, Mapping) and value:
            flat.update(flat_params(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(normalized(value), sort_keys=True, default=str, ensure_ascii=False)
    return flat


def config_groups(config: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """A run's config snapshot in its two groups: ``params`` (the training params) and ``gate`` (the quality
    gate: the author's settings in force when the run was planned, not a triggerer's knob)."""
    config = config or {}
    return {"params": {k: v for k, v in config.items() if k not in QUALITY_GATE},
            "gate": {k: v for k, v in config.items() if k in QUALITY_GATE}}


NOT_SET = "(not set)"


def changed_params(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """(key, value before, value after) of each (flattened) config key whose normalized value differs, in key
    order; a key one side lacks shows as ``(not set)``."""
    old, new = flat_params(before), flat_params(after)
    return [(k, old.get(k, NOT_SET), new.get(k, NOT_SET)) for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k)]


def params_table(config: Mapping[str, Any] | None, table_id: str = "params") -> str:
    """The run's config snapshot, one row per (flattened) key."""
    rows = "".join(f'<tr data-param="{e(k)}"><th><code>{e(k)}</code></th><td><code>{e(v)}</code></td></tr>'
                   for k, v in flat_params(config).items())
    return f'<table id="{e(table_id)}">{rows}</table>' if rows else '<p class="muted">No config recorded.</p>'


def config_tables(config: Mapping[str, Any] | None, heading: str = "h3") -> str:
    """The config snapshot as two tables: the training params (``#params``), then the quality gate (``#gate``)."""
    groups = config_groups(config)
    return (f"<{heading}>Params (the run's config snapshot)</{heading}>" + params_table(groups["params"])
            + f"<{heading} id=\"gate-heading\">Quality gate (the author's, in force when the run was planned)"
            f"</{heading}>" + params_table(groups["gate"], "gate"))


def run_page(run: Mapping[str, Any], root: str, airflow_root: str) -> str:
    made = (link(model_href(root, run["model_name"], version=run["version"]), f"{run['model_name']} v{run['version']}")
            if run["version"] else e(run["model_name"]) + " (no version)")
    body = (f"<table id=\"run\"><tr><th>Status</th><td>{e(run['status'])}"
            f"{' (' + e(run['status_reason']) + ')' if run['status_reason'] else ''}</td></tr>"
            f"<tr><th>Model</th><td>{made}</td></tr>"
            f"<tr><th>Started from</th><td>{version_label(run['base_version'])}</td></tr>"
            f"<tr><th>DAG run</th><td>"
            f"{link(dag_run_href(airflow_root, run['dag_id'], run['dag_run_id']), run['dag_run_id'], top=True)}"
            f" of {e(run['dag_id'])}</td></tr></table>")
    body += "<h2>Curves</h2>" + metric_charts([("", run["epochs"])])
    keys = _epoch_keys(run["epochs"])
    header = "<thead><tr><th>Epoch</th>" + "".join(f"<th>{e(k)}</th>" for k in keys) + "</tr></thead>"
    lines = "".join("<tr><td class=\"num\">" + e(ep.get("epoch")) + "</td>"
                    + "".join(f"<td class=\"num\">{number(ep.get(k))}</td>" for k in keys) + "</tr>"
                    for ep in run["epochs"])
    body += f"<h2>Epochs</h2><table id=\"epochs\">{header}<tbody>{lines}</tbody></table>"
    last = next((ep for ep in reversed(run["epochs"]) if ep.get(CONFUSION_MATRIX)), None)
    if last is not None:
        body += f"<h2>Confusion matrix of epoch {e(last.get('epoch'))}</h2>" + confusion_matrix(last[CONFUSION_MATRIX])
    body += config_tables(run["config"], "h2")
    crumbs = link(model_href(root, run["model_name"]), run["model_name"]) + f"<span>run {e(run['run_id'])}</span>"
    return page(f"Run {run['run_id']}", body, root, crumbs)


def _epoch_keys(epochs: Sequence[Mapping[str, Any]]) -> list[str]:
    keys: list[str] = []
    for ep in epochs:
        keys += [k for k, v in ep.items() if k != "epoch" and k not in keys and isinstance(v, int | float)]
    return keys
