"""The models page's queries (pgtrain.catalog) on a real PostgreSQL, and its HTML (escaped, inline SVG curves)."""

from __future__ import annotations

import re

from pgtrain import catalog
from pgtrain.airflow import ui_render
from pgtrain.model_store import commit_run, promote
from tests.test_model_store import MODEL, OWNER, prepare_run


def test_catalog_lists_models_versions_head_moves_and_runs(db_url, autocommit):
    assert catalog.list_models(autocommit) == []
    first = prepare_run(db_url, "manual__1", val_accuracy=0.8)
    second = prepare_run(db_url, "manual__2", val_accuracy=0.85)
    commit_run(autocommit, first, owner=OWNER, lock_timeout=5)
    commit_run(autocommit, second, owner=OWNER, lock_timeout=5)
    promote(autocommit, MODEL, 1, owner=OWNER, lock_timeout=5)

    [model] = catalog.list_models(autocommit)
    assert (model["model_name"], model["versions"], model["head_version"], model["newest_version"]) == (MODEL, 2, 1, 2)
    assert model["head_metrics"]["val_accuracy"] == 0.8 and model["head_moved_at"] is not None

    versions = catalog.list_versions(autocommit, MODEL)
    assert [(v["version"], v["is_head"], v["dag_run_id"]) for v in versions] == [
        (1, True, "manual__1"), (2, False, "manual__2")]
    assert all(v["dag_id"] == "pgtrain_training" and "parent_version" in v for v in versions)
    assert [(h["previous_version"], h["version"], h["action"]) for h in catalog.head_history(autocommit, MODEL)] == [
        (None, 1, "commit"), (1, 2, "commit"), (2, 1, "promote")]

    run = catalog.run_overview(autocommit, second)
    assert (run["version"], run["status"], run["dag_run_id"]) == (2, "committed", "manual__2")
    assert [e["epoch"] for e in run["epochs"]] == [1, 2] and run["config"]["model_name"] == MODEL
    html = ui_render.run_page(run, "/pgtrain", "")
    assert 'href="/dags/pgtrain_training/runs/manual__2"' in html and f'href="/pgtrain/models/{MODEL}"' in html
    assert html.count('class="point"') == 2 * 3  # train_loss, val_loss, val_accuracy: one point per epoch each


def test_pages_escape_what_they_show_and_draw_one_point_per_epoch():
    name = '<script>alert("x")</script>'
    html = ui_render.models_page([{"model_name": name, "versions": 1, "newest_version": 1, "newest_at": None,
                                   "head_version": 1, "head_moved_at": None, "head_metrics": {"val_x": "<b>"}}],
                                 "/pgtrain")
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;" in html and "/pgtrain/models/%3Cscript%3E" in html

    epochs = [{"epoch": i, "train_loss": 1.0 / i, "val_loss": 1.2 / i, "val_accuracy": 0.5 + i / 20}
              for i in range(1, 6)]
    svg = ui_render.curves(epochs)
    for series in ("train_loss", "val_loss", "val_accuracy"):
        group = re.search(rf'<g class="series" data-series="{series}">(.*?)</g>', svg).group(1)
        assert re.findall(r'data-epoch="(\d+)"', group) == ["1", "2", "3", "4", "5"], series
    assert "<script" not in svg and "http" not in svg.replace("http://www.w3.org/2000/svg", "")


def test_a_page_with_no_models_says_how_to_get_one():
    html = ui_render.models_page([], "/pgtrain")
    assert "make demo" in html and "pgtrain_training" in html


def test_the_cli_lists_through_the_same_queries(db_url, autocommit, capsys, monkeypatch):
    from pgtrain.models_cli import main

    commit_run(autocommit, prepare_run(db_url, "manual__1"), owner=OWNER, lock_timeout=5)
    monkeypatch.setenv("PGTRAIN_DATABASE_URL", db_url)
    assert main(["list", MODEL]) == 0 and main(["history", MODEL]) == 0 and main(["rollback", MODEL]) == 1
    out = capsys.readouterr()
    assert f"{MODEL:<20} *     1" in out.out and "commit" in out.out
    assert "has no version older than its head" in out.err
