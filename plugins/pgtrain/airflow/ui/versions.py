"""HTML of a model's page (its versions, head moves, and one version in full: validation, curves, model, data,
params) and of the compare view of two or more versions (metrics side by side, what differs in their params,
model and data, the curves overlaid). Pure functions of what ``pgtrain.store.catalog`` returns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pgtrain.airflow.ui.charts import metric_charts
from pgtrain.airflow.ui.html import (
    compare_href,
    dag_run_href,
    e,
    link,
    model_href,
    number,
    page,
    run_href,
    version_label,
    when,
)
from pgtrain.airflow.ui.render import (
    EMPTY_STATE,
    NOT_SET,
    changed_params,
    config_groups,
    config_tables,
    confusion_matrix,
    figure_keys,
    flat_params,
    metric_of,
    metrics_table,
    metrics_text,
    normalized,
    rows_of,
)
from pgtrain.airflow.ui.search_section import search_section
from pgtrain.config.metrics import CONFUSION_MATRIX, METRICS

MAX_COMPARED = 12  # versions in one compare view
# What the page shows of a version's spec (its encoding, statistics and vocabularies, is left to the CLI)
SPEC_SHOWN = ("model", "model_options", "task", "target_column", "feature_columns", "input_dim", "output_dim",
              "standardize_target", "parent_version")


def model_page(model_name: str, versions: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, Any]],
               shown: Mapping[str, Any] | None, root: str, airflow_root: str,
               configs: Mapping[int, Mapping[str, Any] | None] | None = None) -> str:
    """The model's versions (a form to compare any of them; with ``configs``, each version's run config snapshot,
    what changed since the version before), head moves, and the ``shown`` version (``catalog.version_details``)
    in full."""
    if not versions:
        return page(f"Model {model_name}", f"<p>No versions of {e(model_name)}.</p>" + EMPTY_STATE, root)
    head = next((v["version"] for v in versions if v["is_head"]), None)
    body = "<h2>Versions</h2>" + _versions_form(model_name, versions, head, shown, root, airflow_root, configs or {})
    moves = "".join(f"<tr><td>{when(h['moved_at'])}</td><td>{e(h['action'])}</td>"
                    f"<td>{version_label(h['previous_version'])} &rarr; {version_label(h['version'])}</td></tr>"
                    for h in reversed(history))
    body += ("<h2>Head moves</h2><table id=\"head-history\"><thead><tr><th>When</th><th>Action</th><th>Head</th>"
             f"</tr></thead><tbody>{moves}</tbody></table>")
    if shown is not None:
        body += _version_section(model_name, shown, root)
    return page(f"Model {model_name}", body, root, link(model_href(root, model_name), model_name))


def _versions_form(model_name: str, versions: Sequence[Mapping[str, Any]], head: int | None,
                   shown: Mapping[str, Any] | None, root: str, airflow_root: str,
                   configs: Mapping[int, Mapping[str, Any] | None]) -> str:
    rows = []
    previous = {v["version"]: p["version"] for p, v in zip(versions, versions[1:], strict=False)}
    for v in reversed(versions):
        dag_run = (link(dag_run_href(airflow_root, v["dag_id"], v["dag_run_id"]), v["dag_run_id"], top=True)
                   if v.get("dag_id") and v.get("dag_run_id") else "-")
        run = link(run_href(root, v["run_id"]), v["run_id"]) if v.get("run_id") else "-"
        classes = " ".join(c for c, on in (("head", v["is_head"]),
                                           ("shown", shown is not None and shown["version"] == v["version"])) if on)
        with_head = ("" if head is None or v["is_head"] else
                     link(compare_href(root, model_name, [head, v["version"]]), "compare with head"))
        rows.append(f'<tr class="{classes}" data-version="{e(v["version"])}">'
                    f'<td><input type="checkbox" name="v" value="{e(v["version"])}" '
                    f'aria-label="compare v{e(v["version"])}"></td>'
                    f"<td>{link(model_href(root, model_name, version=v['version']), 'v' + str(v['version']))}"
                    f"{' <span class=badge>head</span>' if v['is_head'] else ''}</td><td>{when(v['created_at'])}</td>"
                    f"<td>{metrics_text(v['metrics'])}</td><td>{version_label(v['parent_version'])}</td>"
                    f"{changed_cell(configs, previous.get(v['version']), v['version'])}"
                    f"<td>{run}</td><td>{dag_run}</td><td>{with_head}</td></tr>")
    return (f'<form id="compare-form" method="get" action="{e(model_href(root, model_name))}/compare">'
            "<table id=\"versions\"><thead><tr><th></th><th>Version</th><th>Created</th><th>Metrics</th><th>Parent</th>"
            "<th>Changed</th><th>Run</th><th>DAG run</th><th></th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>"
            '<button type="submit">Compare the checked versions</button></form>')


CHANGED_SHOWN = 3  # params named in a version's "changed" cell; the rest counted (all of them in its tooltip)


def changed_cell(configs: Mapping[int, Mapping[str, Any] | None], before: int | None, after: int) -> str:
    """The versions table's "changed" cell: the params (and gate fields) whose value differs from the previous
    version's, with their new value; a dash for the first version or one without a config snapshot."""
    if before is None or configs.get(before) is None or configs.get(after) is None:
        return '<td class="changed">-</td>'
    changes = changed_params(configs[before], configs[after])
    if not changes:
        return '<td class="changed muted">no param</td>'
    text = ", ".join(f"{key} {new}" for key, _, new in changes[:CHANGED_SHOWN])
    if len(changes) > CHANGED_SHOWN:
        text += f" +{len(changes) - CHANGED_SHOWN} more"
    full = f"since v{before}: " + "; ".join(f"{key} {old} \u2192 {new}" for key, old, new in changes)
    keys = " ".join(key for key, *_ in changes)
    return f'<td class="changed" data-changed="{e(keys)}" title="{e(full)}">{e(text)}</td>'


def _version_section(model_name: str, shown: Mapping[str, Any], root: str) -> str:
    metrics = shown["metrics"] or {}
    title = f"v{shown['version']}" + (" (head)" if shown["is_head"] else "")
    run = f" (run {link(run_href(root, shown['run_id']), shown['run_id'])})" if shown["run_id"] else ""
    return (f"<h2 id=\"version\" data-version=\"{e(shown['version'])}\">Version {e(title)}</h2>"
            "<div class=\"grid2\"><section><h3>Figures</h3>" + metrics_table(metrics)
            + confusion_matrix(metrics.get(CONFUSION_MATRIX)) + "</section>"
            "<section><h3>Data</h3>" + _facts_table("data", data_facts(shown)) + "</section>"
            "<section><h3>Model</h3>" + _facts_table("model-spec", model_facts(shown)) + "</section></div>"
            f"<h3>Training curves{run}</h3>" + metric_charts([("", shown["epochs"])])
            + search_section(shown.get("search"), root) + config_tables(shown["config"]))


def model_facts(version: Mapping[str, Any]) -> dict[str, Any]:
    """What the version is: the shown part of its spec."""
    spec = version.get("spec") or {}
    return {key: spec.get(key) for key in SPEC_SHOWN if key in spec}


def data_facts(version: Mapping[str, Any]) -> dict[str, Any]:
    """What the version was trained on: source, rows planned, watermark."""
    spec = version.get("spec") or {}
    watermark, planned = spec.get("watermark") or {}, version.get("planned_at")
    return {"source table": spec.get("source_table"), "key column": spec.get("key_column"),
            "rows": version.get("rows"), "training rows": version.get("train_rows"),
            "validation rows": version.get("val_rows"), "test rows": version.get("test_rows"),
            "excluded rows (bad)": version.get("excluded_rows"),
            "ranks": version.get("world_size"), "watermark: largest key": watermark.get("max_key"),
            "watermark: snapshot": watermark.get("snapshot"),
            "planned at": planned.isoformat(sep=" ", timespec="seconds") if planned else None}


def _shown(value: Any) -> str:
    """A fact as text: strings as they are, anything else as compact JSON."""
    if value is None or isinstance(value, str):
        return e(value)
    return e(json.dumps(normalized(value), sort_keys=True, default=str, ensure_ascii=False))


def _facts_table(table_id: str, facts: Mapping[str, Any]) -> str:
    rows = "".join(f'<tr data-field="{e(k)}"><th>{e(k)}</th><td>{_shown(v)}</td></tr>' for k, v in facts.items())
    return f'<table id="{e(table_id)}">{rows}</table>'


def compare_page(model_name: str, compared: Sequence[Mapping[str, Any]], root: str) -> str:
    """Two or more versions (``catalog.version_details``): metrics side by side with the best of each row marked,
    what differs in their model, data and params (the rest folded away), and every metric's curves overlaid."""
    labels = [f"v{d['version']}" for d in compared]
    header = "".join(f"<th>{link(model_href(root, model_name, version=d['version']), label)}"
                     f"{' <span class=badge>head</span>' if d['is_head'] else ''}</th>"
                     for d, label in zip(compared, labels, strict=True))
    body = (f"<p>Versions {e(', '.join(labels))} of {link(model_href(root, model_name), model_name)}.</p>"
            "<h2>Metrics</h2>" + _compare_metrics(compared, header)
            + "<h2>Params diff</h2>" + _params_diff(compared, header)
            + "<h2>Curves</h2>" + metric_charts([(label, d["epochs"]) for d, label in zip(compared, labels,
                                                                                          strict=True)]))
    crumbs = link(model_href(root, model_name), model_name) + f"<span>compare {e(' '.join(labels))}</span>"
    return page(f"Compare {model_name} {' '.join(labels)}", body, root, crumbs)


def _compare_metrics(compared: Sequence[Mapping[str, Any]], header: str) -> str:
    figures = [d["metrics"] or {} for d in compared]
    keys = figure_keys({k: None for m in figures for k in m})
    keys += [k for k in ("best_epoch", "epochs") if any(k in m for m in figures)]
    rows = []
    for key in keys:
        values = [m.get(key) for m in figures]
        best = _best(key, values)
        cells = "".join(f'<td class="num{" best" if best is not None and v == best else ""}">{number(v)}</td>'
                        for v in values)
        name = metric_of(key)
        label = f"{METRICS[name].label if name in METRICS else key} ({rows_of(key)})"
        rows.append(f'<tr data-metric="{e(key)}"><th>{e(label)} <code>{e(key)}</code></th>{cells}</tr>')
    return (f'<table id="compare-metrics"><thead><tr><th>Metric</th>{header}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def _best(key: str, values: Sequence[Any]) -> float | None:
    """The best of a registry metric's finite values (by its direction), when they are not all the same."""
    finite = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    key = metric_of(key)
    if key not in METRICS or len(set(finite)) < 2:
        return None
    return max(finite) if METRICS[key].higher_is_better else min(finite)


def _params_diff(compared: Sequence[Mapping[str, Any]], header: str) -> str:
    """One row per model fact, data fact, (flattened) param and quality-gate field, named ``model.``, ``data.``,
    ``params.`` and ``gate.``: those that differ first, highlighted; the rest inside a folded table. Values are
    compared normalized (``flat_params``): 0 and 0.0 are the same."""
    sides = [flat_params({"model": model_facts(d), "data": data_facts(d), **config_groups(d["config"])})
             for d in compared]
    keys = list(dict.fromkeys(k for side in sides for k in side))
    differ = [k for k in keys if len({side.get(k) for side in sides}) > 1]
    same = [k for k in keys if k not in differ]

    def rows(selected: Sequence[str], kind: str) -> str:
        return "".join(f'<tr class="{kind}" data-param="{e(k)}"><th><code>{e(k)}</code></th>'
                       + "".join(f"<td><code>{e(side.get(k, NOT_SET))}</code></td>" for side in sides) + "</tr>"
                       for k in selected)

    table = (f'<table id="params-diff"><thead><tr><th>What differs</th>{header}</tr></thead>'
             f"<tbody>{rows(differ, 'differs')}</tbody></table>" if differ
             else '<p id="params-diff" class="muted">Their model, data and params are the same.</p>')
    return (table + f"<details><summary>{len(same)} the same</summary><table id=\"params-same\"><thead><tr>"
            f"<th>The same</th>{header}</tr></thead><tbody>{rows(same, 'same')}</tbody></table></details>")
