"""HTML of the models page: plain strings, every value escaped, charts as inline SVG (no script, nothing fetched).

Pure functions of what ``pgtrain.store.catalog`` returns; ``pgtrain.airflow.ui.app`` serves them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from pgtrain.config.metrics import CONFUSION_MATRIX, METRICS

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1a202c; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 0.3rem 0.8rem; text-align: left; font-size: 0.9rem; }
th { background: #f7fafc; }
.head { font-weight: 600; color: #2f855a; }
.empty { padding: 1rem; background: #fffbea; border: 1px solid #f6e05e; max-width: 48rem; }
code { background: #edf2f7; padding: 0 0.2rem; }
svg.chart { border: 1px solid #e2e8f0; margin: 0.5rem 1rem 1rem 0; }
nav a { margin-right: 1rem; }
table.matrix td { text-align: right; }
table.matrix td.hit { background: #f0fff4; font-weight: 600; }
"""


def e(value: Any) -> str:
    """Escaped text of any value (None shows as a dash)."""
    return "-" if value is None else escape(str(value), quote=True)


def when(value: datetime | None) -> str:
    return e(value.isoformat(sep=" ", timespec="seconds") if value else None)


def number(value: Any) -> str:
    if isinstance(value, float):
        return e(f"{value:.4g}")
    return e(value)


def page(title: str, body: str, root: str) -> str:
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>"
            f"<style>{_STYLE}</style></head><body><nav><a href=\"{e(root)}/\">All models</a></nav>"
            f"<h1>{e(title)}</h1>{body}</body></html>")


def model_href(root: str, model_name: str) -> str:
    return f"{root}/models/{quote(model_name, safe='')}"


def run_href(root: str, run_id: str) -> str:
    return f"{root}/runs?{urlencode({'run_id': run_id})}"


def dag_run_href(airflow_root: str, dag_id: str, dag_run_id: str) -> str:
    """The Airflow UI's page of a DAG run."""
    return f"{airflow_root}/dags/{quote(dag_id, safe='')}/runs/{quote(dag_run_id, safe='')}"


def link(href: str, text: Any, *, top: bool = False) -> str:
    target = ' target="_top"' if top else ""
    return f'<a href="{e(href)}"{target}>{e(text)}</a>'


def _validation_keys(metrics: Mapping[str, Any]) -> list[str]:
    """The validation figures of ``metrics``: the registry's in its order, then any other val_* key."""
    return ([k for k in METRICS if k in metrics]
            + sorted(k for k in metrics if k.startswith("val_") and k not in METRICS))


def _label(key: str) -> str:
    return METRICS[key].label if key in METRICS else key.removeprefix("val_").replace("_", " ")


def metrics_text(metrics: Mapping[str, Any] | None) -> str:
    """The validation figures first, then epochs; a short line."""
    metrics = metrics or {}
    keys = _validation_keys(metrics) + [k for k in ("best_epoch", "epochs") if k in metrics]
    return ", ".join(f"{e(_label(k))} {number(metrics[k])}" for k in keys) or "-"


def metrics_table(metrics: Mapping[str, Any] | None) -> str:
    """A version's validation figures, one row each, with the direction that is better."""
    metrics = metrics or {}
    rows = "".join(
        f'<tr data-metric="{e(k)}"><th>{e(_label(k))}</th><td>{number(metrics[k])}</td><td>'
        f"{e(METRICS[k].better if k in METRICS else None)}</td><td><code>{e(k)}</code></td></tr>"
        for k in _validation_keys(metrics))
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
    header = "<tr><th>true \\ predicted</th>" + "".join(f"<th>{e(label)}</th>" for label in labels) + "</tr>"
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
        f"<td class=\"head\">{e(m['head_version'] and 'v' + str(m['head_version']))}</td>"
        f"<td>{when(m['head_moved_at'])}</td><td>{metrics_text(m['head_metrics'])}</td>"
        f"<td>{e(m['versions'])}</td><td>v{e(m['newest_version'])} at {when(m['newest_at'])}</td></tr>"
        for m in models)
    table = ("<table id=\"models\"><tr><th>Model</th><th>Head</th><th>Head moved</th><th>Head metrics</th>"
             f"<th>Versions</th><th>Newest</th></tr>{rows}</table>")
    return page("Models", table, root)


def model_page(model_name: str, versions: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, Any]],
               shown: Mapping[str, Any] | None, shown_run: Mapping[str, Any] | None, root: str,
               airflow_root: str) -> str:
    """The model's versions and head moves, and the ``shown`` version's validation (metrics, confusion matrix)
    and training curves (``shown_run``: the run that made it)."""
    if not versions:
        return page(f"Model {model_name}", f"<p>No versions of {e(model_name)}.</p>" + EMPTY_STATE, root)
    rows = []
    for v in reversed(versions):
        dag_run = (link(dag_run_href(airflow_root, v["dag_id"], v["dag_run_id"]), v["dag_run_id"], top=True)
                   if v.get("dag_id") and v.get("dag_run_id") else "-")
        run = link(run_href(root, v["run_id"]), v["run_id"]) if v.get("run_id") else "-"
        head = ' class="head"' if v["is_head"] else ""
        version = link(f"{model_href(root, model_name)}?{urlencode({'version': v['version']})}", f"v{v['version']}")
        rows.append(f"<tr{head} data-version=\"{e(v['version'])}\"><td>{version}"
                    f"{' (head)' if v['is_head'] else ''}</td><td>{when(v['created_at'])}</td>"
                    f"<td>{metrics_text(v['metrics'])}</td>"
                    f"<td>{e(v['parent_version'] and 'v' + str(v['parent_version']))}</td>"
                    f"<td>{run}</td><td>{dag_run}</td></tr>")
    body = ("<h2>Versions</h2><table id=\"versions\"><tr><th>Version</th><th>Created</th><th>Metrics</th>"
            "<th>Parent</th><th>Run</th><th>DAG run</th></tr>" + "".join(rows) + "</table>")
    moves = "".join(f"<tr><td>{when(h['moved_at'])}</td><td>{e(h['action'])}</td>"
                    f"<td>{e(h['previous_version'] and 'v' + str(h['previous_version']))} &rarr; v{e(h['version'])}"
                    f"</td></tr>" for h in reversed(history))
    body += ("<h2>Head moves</h2><table id=\"head-history\"><tr><th>When</th><th>Action</th><th>Head</th></tr>"
             f"{moves}</table>")
    if shown is not None:
        metrics = shown["metrics"] or {}
        body += (f"<h2>Validation of v{e(shown['version'])}{' (head)' if shown['is_head'] else ''}</h2>"
                 + metrics_table(metrics) + confusion_matrix(metrics.get(CONFUSION_MATRIX)))
    if shown_run is not None:
        body += (f"<h2>Training curves of v{e(shown_run['version'])} "
                 f"(run {link(run_href(root, shown_run['run_id']), shown_run['run_id'])})</h2>"
                 + curves(shown_run["epochs"]))
    return page(f"Model {model_name}", body, root)


def run_page(run: Mapping[str, Any], root: str, airflow_root: str) -> str:
    made = (link(model_href(root, run["model_name"]), f"{run['model_name']} v{run['version']}")
            if run["version"] else e(run["model_name"]) + " (no version)")
    body = (f"<table id=\"run\"><tr><th>Status</th><td>{e(run['status'])}"
            f"{' (' + e(run['status_reason']) + ')' if run['status_reason'] else ''}</td></tr>"
            f"<tr><th>Model</th><td>{made}</td></tr>"
            f"<tr><th>Started from</th><td>{e(run['base_version'] and 'v' + str(run['base_version']))}</td></tr>"
            f"<tr><th>DAG run</th><td>"
            f"{link(dag_run_href(airflow_root, run['dag_id'], run['dag_run_id']), run['dag_run_id'], top=True)}"
            f" of {e(run['dag_id'])}</td></tr></table>")
    body += "<h2>Curves</h2>" + curves(run["epochs"])
    keys = _epoch_keys(run["epochs"])
    header = "<tr><th>Epoch</th>" + "".join(f"<th>{e(k)}</th>" for k in keys) + "</tr>"
    lines = "".join("<tr><td>" + e(ep.get("epoch")) + "</td>"
                    + "".join(f"<td>{number(ep.get(k))}</td>" for k in keys) + "</tr>"
                    for ep in run["epochs"])
    body += f"<h2>Epochs</h2><table id=\"epochs\">{header}{lines}</table>"
    last = next((ep for ep in reversed(run["epochs"]) if ep.get(CONFUSION_MATRIX)), None)
    if last is not None:
        body += f"<h2>Confusion matrix of epoch {e(last.get('epoch'))}</h2>" + confusion_matrix(last[CONFUSION_MATRIX])
    body += f"<h2>Config</h2><pre>{e(json.dumps(run['config'], indent=2, sort_keys=True, default=str))}</pre>"
    return page(f"Run {run['run_id']}", body, root)


def _epoch_keys(epochs: Sequence[Mapping[str, Any]]) -> list[str]:
    keys: list[str] = []
    for ep in epochs:
        keys += [k for k, v in ep.items() if k != "epoch" and k not in keys and isinstance(v, int | float)]
    return keys


def curves(epochs: Sequence[Mapping[str, Any]]) -> str:
    """A loss chart (train_loss, val_loss) and a validation-metric chart (the other val_* figures)."""
    if not epochs:
        return "<p>No epochs recorded for this run.</p>"
    keys = _epoch_keys(epochs)
    metric_keys = [k for k in keys if k.startswith("val_") and k != "val_loss"]
    return (line_chart("loss", epochs, [k for k in ("train_loss", "val_loss") if k in keys])
            + (line_chart("validation", epochs, metric_keys) if metric_keys else ""))


def line_chart(name: str, epochs: Sequence[Mapping[str, Any]], keys: Sequence[str],
               width: int = 520, height: int = 260) -> str:
    """An SVG line chart, one series per key, one circle (class "point") per epoch with a finite value."""
    left, right, top, bottom = 60, 130, 20, 40
    points = {k: [(ep["epoch"], float(ep[k])) for ep in epochs
                  if isinstance(ep.get(k), int | float) and math.isfinite(ep[k])] for k in keys}
    values = [y for series in points.values() for _, y in series]
    xs = [ep["epoch"] for ep in epochs]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    x_lo, x_hi = min(xs), max(max(xs), min(xs) + 1)
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return top + (hi - y) / (hi - lo) * plot_h

    parts = [f'<svg class="chart" data-chart="{e(name)}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{e(name)} per epoch">',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#cbd5e0"/>',
             f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" font-size="11">{number(hi)}</text>',
             f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end" font-size="11">{number(lo)}</text>',
             f'<text x="{left}" y="{height - 22}" text-anchor="middle" font-size="11">{e(x_lo)}</text>',
             f'<text x="{left + plot_w}" y="{height - 22}" text-anchor="middle" font-size="11">{e(max(xs))}</text>',
             f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle" font-size="12">epoch</text>']
    for i, (key, series) in enumerate(points.items()):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in series)
        parts.append(f'<g class="series" data-series="{e(key)}">')
        if len(series) > 1:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        parts += [f'<circle class="point" data-epoch="{e(x)}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" '
                  f'fill="{color}"><title>{e(key)} epoch {e(x)}: {number(y)}</title></circle>' for x, y in series]
        parts.append(f'<text x="{width - right + 8}" y="{top + 14 + 16 * i}" font-size="12" fill="{color}">'
                     f'{e(key)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)
