"""The models page's HTML without a server: one chart (and one y axis) per metric, the compare view's metrics, params
diff and overlaid curves, hostile names and values escaped everywhere, and the stylesheet allowed by its hash."""

from __future__ import annotations

import base64
import hashlib
import math
import re
from datetime import UTC, datetime

import pytest

from pgtrain.airflow.ui import charts, html, render, versions

HOSTILE = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def regression_epochs(count: int, rmse: float = 200.0, r2: float = 0.8) -> list[dict]:
    return [{"epoch": i, "train_loss": 1.0 / i, "val_loss": 1.2 / i, "val_rmse": rmse + 10.0 / i,
             "val_mae": rmse * 0.8 + 5.0 / i, "val_r2": r2 - 0.1 / i, "seconds": 0.5} for i in range(1, count + 1)]


def version(number: int, epochs: list[dict], *, head: bool = False, **config) -> dict:
    last = epochs[-1]
    return {"version": number, "run_id": f"pgtrain_training/manual__{number}", "is_head": head,
            "created_at": datetime(2025, 1, number, tzinfo=UTC), "parent_version": None,
            "dag_id": "pgtrain_training", "dag_run_id": f"manual__{number}",
            "metrics": {k: last[k] for k in ("val_loss", "val_rmse", "val_mae", "val_r2")} | {"epochs": len(epochs)},
            "spec": {"model": "mlp", "task": "regression", "target_column": "price", "feature_columns": ["a", "b"],
                     "input_dim": 2, "output_dim": 1, "source_table": "public.houses", "key_column": "id",
                     "watermark": {"max_key": "300", "snapshot": "10:10:"}},
            "config": {"learning_rate": 0.01, "epochs": len(epochs), "hidden_sizes": [8], **config},
            "rows": 300, "train_rows": 240, "val_rows": 60, "excluded_rows": 0, "world_size": 1,
            "planned_at": datetime(2025, 1, number, tzinfo=UTC), "epochs": epochs}


def svg_of(page: str, chart: str) -> str:
    return re.search(rf'<svg class="chart" data-chart="{chart}".*?</svg>', page).group(0)


def plotted_ys(svg: str, series: str) -> list[float]:
    group = re.search(rf'<g class="series[^"]*" data-series="{series}"[^>]*>(.*?)</g>', svg).group(1)
    return [float(y) for y in re.findall(r'cy="([\d.]+)"', group)]


def test_each_metric_gets_a_chart_and_an_axis_of_its_own():
    page = charts.metric_charts([("", regression_epochs(5))])
    assert re.findall(r'data-chart="([^"]+)"', page) == ["loss", "val_rmse", "val_mae", "val_r2"]
    assert "seconds" not in re.findall(r'data-series="([^"]+)"', page)
    r2, rmse = svg_of(page, "val_r2"), svg_of(page, "val_rmse")
    assert float(re.search(r'data-y-max="([^"]+)"', r2).group(1)) <= 1.0
    assert float(re.search(r'data-y-min="([^"]+)"', rmse).group(1)) >= 150, "RMSE's axis is not stretched down to R²"
    # R² rises 0.7 -> 0.78 over the epochs: drawn across most of its plot's height, not as a flat line
    ys = plotted_ys(r2, "val_r2")
    assert ys == sorted(ys, reverse=True) and ys[0] - ys[-1] > 0.5 * (charts.HEIGHT - charts.TOP - charts.BOTTOM)
    loss = svg_of(page, "loss")
    assert {"train_loss", "val_loss"} == set(re.findall(r'data-series="([^"]+)"', loss))


@pytest.mark.parametrize(("lo", "hi"), [(0.71, 0.79), (190.0, 210.0), (-3.0, 4.5), (0.8, 0.8), (1e-5, 3e-5),
                                        (0.95, 0.9500000000000001), (1e17, 1e17), (0.95, 0.95 + 1e-14)])
def test_ticks_are_round_and_cover_the_values(lo, hi):
    ticks = charts.nice_ticks(lo, hi)
    steps = {round(b - a, 12) for a, b in zip(ticks, ticks[1:], strict=False)}
    assert ticks[0] <= lo and ticks[-1] >= hi and len(steps) == 1 and 3 <= len(ticks) <= 8
    step = steps.pop()
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert min(abs(mantissa - m) for m in (1, 2, 2.5, 5, 10)) < 1e-9


def test_a_chart_of_values_an_ulp_apart_has_an_axis():
    """Metrics that differ by float noise between epochs once hung the page (a step below one ulp) or divided by
    an axis of zero height."""
    epochs = [{"epoch": 1, "val_accuracy": 0.95}, {"epoch": 2, "val_accuracy": 0.9500000000000001}]
    svg = charts.line_chart("val_accuracy", [("", epochs)], ["val_accuracy"])
    assert float(re.search(r'data-y-min="([^"]+)"', svg).group(1)) < 0.95 < float(
        re.search(r'data-y-max="([^"]+)"', svg).group(1))
    assert len(re.findall(r'class="point"', svg)) == 2


def test_compare_shows_metrics_side_by_side_the_params_that_differ_and_overlaid_curves():
    older, newer = version(1, regression_epochs(4, rmse=210, r2=0.7)), version(2, regression_epochs(6), head=True,
                                                                              learning_rate=0.005)
    page = versions.compare_page("houses", [older, newer], "/pgtrain")
    rmse = re.search(r'<tr data-metric="val_rmse">(.*?)</tr>', page).group(1)
    r2 = re.search(r'<tr data-metric="val_r2">(.*?)</tr>', page).group(1)
    assert re.findall(r'<td class="num( best)?">', rmse) == ["", " best"], "lower RMSE is better: v2's"
    assert re.findall(r'<td class="num( best)?">', r2) == ["", " best"], "higher R² is better: v2's"
    diff = re.search(r'<table id="params-diff">.*?</table>', page).group(0)
    assert re.findall(r'data-param="([^"]+)"', diff) == ["data.planned at", "params.epochs", "params.learning_rate"]
    same = re.search(r'<table id="params-same">.*?</table>', page).group(0)
    assert 'data-param="params.hidden_sizes"' in same and 'data-param="model.task"' in same
    curves = svg_of(page, "val_r2")
    assert re.findall(r'data-series="val_r2" data-version="(v\d)"', curves) == ["v1", "v2"]
    assert len(plotted_ys(curves, 'val_r2" data-version="v2')) == 6


def test_hostile_names_and_values_are_shown_as_text():
    hostile = version(1, regression_epochs(2), **{HOSTILE: HOSTILE})
    hostile["epochs"] = [{**ep, f"val_{HOSTILE}": 0.5} for ep in hostile["epochs"]]
    hostile["spec"]["feature_columns"] = [HOSTILE]
    hostile["spec"]["source_table"] = HOSTILE
    hostile["metrics"][f"val_{HOSTILE}"] = 0.5
    other = version(2, regression_epochs(2), head=True)
    listing = [{**hostile, "parent_version": None}, {**other, "parent_version": 1}]
    for page in (versions.model_page(HOSTILE, listing, [], hostile, "/pgtrain", ""),
                 versions.compare_page(HOSTILE, [hostile, other], "/pgtrain")):
        assert "<script" not in page and "<img" not in page
        assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3
        assert "/pgtrain/models/%22%3E%3Cscript%3E" in page, "the model name is quoted into its links"


def test_the_only_style_is_the_stylesheet_the_policy_names_by_its_hash():
    page = html.page("t", "<p>x</p>", "/pgtrain")
    [style] = re.findall(r"<style>(.*?)</style>", page, re.S)
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}'" in html.CONTENT_SECURITY_POLICY
    assert "default-src 'none'" in html.CONTENT_SECURITY_POLICY and "script-src" not in html.CONTENT_SECURITY_POLICY
    assert "prefers-color-scheme: dark" in style and "url(" not in style and "@import" not in style


# -- issue 30, finding 7 ----------------------------------------------------------------------------------------------
def loss_epochs(count: int, *, best: int | None = None) -> list[dict]:
    """A classifier's epochs whose first loss (2.3, an untrained net's on ten classes) is ten times the later ones."""
    epochs = [{"epoch": i, "train_loss": 2.3 if i == 1 else 0.3 / i, "val_loss": 2.2 if i == 1 else 0.32 / i + 0.01 * i,
               "val_accuracy": 0.2 if i == 1 else 0.9 + i / 1000} for i in range(1, count + 1)]
    if best is not None:
        for ep in epochs:
            ep["best_epoch"] = min(ep["epoch"], best)
    return epochs


def test_the_params_diff_compares_numbers_by_value():
    """A REST conf's ``dropout: 0`` and the form's ``0.0`` are the same param: not a difference."""
    rest = version(1, regression_epochs(3), dropout=0, warmup_epochs=1, hidden_sizes=[8, 4])
    form = version(2, regression_epochs(3), head=True, dropout=0.0, warmup_epochs=1.0, hidden_sizes=[8.0, 4.0],
                   learning_rate=0.005)
    page = versions.compare_page("houses", [rest, form], "/pgtrain")
    diff = re.search(r'<table id="params-diff">.*?</table>', page).group(0)
    assert re.findall(r'data-param="(params\.[^"]+)"', diff) == ["params.learning_rate"]
    same = re.search(r'<table id="params-same">.*?</table>', page).group(0)
    assert re.search(r'data-param="params.dropout"><th><code>params.dropout</code></th>'
                     r"<td><code>0</code></td><td><code>0</code></td>", same)
    assert render.changed_params({"dropout": 0, "epochs": 3}, {"dropout": 0.0, "epochs": 4}) == [("epochs", "3", "4")]


def test_the_quality_gate_is_a_group_of_its_own():
    shown = version(1, regression_epochs(3), head=True, max_rmse_rise=0.5, metric="val_r2", floor=0.1)
    page = versions.model_page("houses", [shown], [], shown, "/pgtrain", "")
    params = re.search(r'<table id="params">.*?</table>', page).group(0)
    gate = re.search(r'<table id="gate">.*?</table>', page).group(0)
    assert re.findall(r'data-param="([^"]+)"', gate) == ["floor", "max_rmse_rise", "metric"]
    assert "learning_rate" in params and not {"floor", "max_rmse_rise", "metric"} & set(
        re.findall(r'data-param="([^"]+)"', params))
    other = version(2, regression_epochs(3), max_rmse_rise=1.0, metric="val_r2", floor=0.1)
    diff = re.search(r'<table id="params-diff">.*?</table>',
                     versions.compare_page("houses", [shown, other], "/pgtrain")).group(0)
    assert "gate.max_rmse_rise" in re.findall(r'data-param="([^"]+)"', diff)
    run = render.run_page({"run_id": "r", "dag_id": "d", "dag_run_id": "x", "model_name": "houses", "version": 1,
                           "status": "committed", "status_reason": None, "base_version": None,
                           "config": shown["config"], "epochs": shown["epochs"]}, "/pgtrain", "")
    assert re.search(r'<table id="gate">.*data-param="max_rmse_rise"', run)


def test_the_versions_table_says_which_params_changed_since_the_version_before():
    listing = [version(1, regression_epochs(3), dropout=0),
               version(2, regression_epochs(8), dropout=0.0, learning_rate=0.005),
               version(3, regression_epochs(8), head=True, dropout=0.0, learning_rate=0.005),
               version(4, regression_epochs(3), dropout=0.0, batch_size=16, seed=1, optimizer="sgd", weight_decay=0.1)]
    configs = {v["version"]: v["config"] for v in listing}
    page = versions.model_page("houses", listing, [], listing[2], "/pgtrain", "", configs)
    assert "<th>Changed</th>" in page

    def cell(number: int) -> str:
        row = re.search(rf'<tr class="[^"]*" data-version="{number}">(.*?)</tr>', page).group(1)
        return re.search(r'<td class="changed[^"]*"[^>]*>(.*?)</td>', row).group(0)

    assert ">-<" in cell(1), "the first version has no version before it"
    assert 'data-changed="epochs learning_rate"' in cell(2) and ">epochs 8, learning_rate 0.005<" in cell(2)
    assert "no param" in cell(3)
    assert "+3 more" in cell(4) and "since v3: batch_size" in cell(4)


def test_a_first_epoch_far_above_the_rest_does_not_set_the_loss_range():
    epochs = loss_epochs(10)
    loss = svg_of(charts.metric_charts([("", epochs)]), "loss")
    assert float(re.search(r'data-y-max="([^"]+)"', loss).group(1)) < 0.5, "the axis is the later epochs'"
    plot_h = charts.HEIGHT - charts.TOP - charts.BOTTOM
    ys = plotted_ys(loss, "train_loss")
    assert ys[0] == pytest.approx(charts.TOP, abs=0.1) and 'class="point clipped" data-epoch="1"' in loss
    assert max(ys[1:]) - min(ys[1:]) > 0.6 * plot_h, "epochs 2 to 10 use most of the height"
    assert "2.3 (off the scale)" in loss and "off the scale" in charts.metric_charts([("", epochs)])
    # a first epoch near the rest stays on the axis; so does every point of a short run
    assert charts.y_range([[1.0, 0.8, 0.7, 0.65]]) == (0.65, 1.0)
    assert charts.y_range([[2.3, 0.3, 0.2, 0.1]]) == (0.1, 0.3)
    assert charts.y_range([[2.3, 0.3]]) == (0.3, 2.3)
    assert charts.y_range([[0.2, 0.9, 0.9]]) == (0.2, 0.9), "later epochs all equal: nothing is flattened"


def test_every_chart_marks_the_best_epoch():
    page = charts.metric_charts([("", loss_epochs(8, best=5))])
    for chart in ("loss", "val_accuracy"):
        marker = re.findall(r'<g class="best-epoch[^"]*" data-epoch="(\d+)"', svg_of(page, chart))
        assert marker == ["5"], chart
    assert "best-epoch" not in charts.metric_charts([("", loss_epochs(8))]), "no early stopping: no best epoch"
    overlaid = charts.metric_charts([("v1", loss_epochs(8, best=5)), ("v2", loss_epochs(6, best=3))])
    assert re.findall(r'<g class="best-epoch (c\d)" data-epoch="(\d+)" data-version="(v\d)"',
                      svg_of(overlaid, "loss")) == [("c0", "5", "v1"), ("c1", "3", "v2")]


def test_charts_scale_to_their_panel():
    svg = svg_of(charts.metric_charts([("", loss_epochs(4))]), "loss")
    tag = re.match(r"<svg [^>]*>", svg).group(0)
    assert f'viewBox="0 0 {charts.WIDTH} {charts.HEIGHT}"' in tag and " width=" not in tag and " height=" not in tag
    assert re.search(r"svg\.chart \{[^}]*width: 100%", html.STYLE)
    assert re.search(r"\.charts \{[^}]*display: grid", html.STYLE)


def test_each_figure_says_which_rows_it_was_read_on_and_the_list_shows_the_reported_ones():
    tested = {"figures_from": "test", "test_accuracy": 0.81, "test_roc_auc": 0.9, "val_accuracy": 0.86,
              "test_confusion_matrix": {"labels": [0, 1], "counts": [[1, 0], [0, 1]]}, "epochs": 4}
    table = render.metrics_table(tested)
    rows = re.findall(r'<tr data-metric="([^"]+)"><th>([^<]*)</th><td>([^<]*)</td>.*?<td class="rows">([^<]*)</td>',
                      table)
    assert [(key, label, rows_of) for key, label, _, rows_of in rows] == [
        ("test_accuracy", "accuracy", "test rows"), ("test_roc_auc", "ROC AUC", "test rows"),
        ("val_accuracy", "accuracy", "validation rows")]
    assert 'data-rows="test">test:</span> accuracy 0.81' in render.metrics_text(tested)
    older = render.metrics_text({"val_accuracy": 0.86, "epochs": 4})  # a version from before the test part
    assert 'data-rows="validation">validation:</span> accuracy 0.86' in older and "test" not in older
