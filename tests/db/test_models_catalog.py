"""The models page's queries (pgtrain.store.catalog) on a real PostgreSQL, and its HTML (escaped, inline SVG curves)."""

from __future__ import annotations

import re
import secrets
from urllib.parse import urlencode

import numpy as np
import pytest

from pgtrain.airflow.ui import charts
from pgtrain.airflow.ui import html as ui_html
from pgtrain.airflow.ui import render as ui_render
from pgtrain.config.metrics import CONFUSION_MATRIX, METRICS
from pgtrain.data.encoding import UNSEEN_CLASS
from pgtrain.data.metrics import classification_metrics
from pgtrain.store import catalog
from pgtrain.store.model_store import commit_run, promote
from tests.db.test_model_store import MODEL, OWNER, custom, prepare_any, prepare_run


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
    configs = catalog.version_configs(autocommit, MODEL)  # the versions table's "changed" column
    assert sorted(configs) == [1, 2] and all(c["model_name"] == MODEL for c in configs.values())
    assert [(h["previous_version"], h["version"], h["action"]) for h in catalog.head_history(autocommit, MODEL)] == [
        (None, 1, "commit"), (1, 2, "commit"), (2, 1, "promote")]

    with autocommit.transaction():  # the rows compute_shards planned for the first run, over two ranks
        for rank, (rows, train, val) in enumerate([(60, 48, 12), (59, 47, 12)]):
            autocommit.execute("INSERT INTO pgtrain.shard_manifest (run_id, rank, world_size, key_lo, key_hi, "
                               "row_count, train_count, val_count) VALUES (%s, %s, 2, %s, %s, %s, %s, %s)",
                               (first, rank, str(rank * 60 + 1), str(rank * 60 + rows), rows, train, val))
    second_detail, first_detail = catalog.version_details(autocommit, MODEL, [2, 1, 7])
    assert (first_detail["version"], first_detail["is_head"], second_detail["is_head"]) == (1, True, False)
    assert (first_detail["rows"], first_detail["train_rows"], first_detail["val_rows"],
            first_detail["world_size"]) == (119, 95, 24, 2)
    assert second_detail["rows"] is None, "no manifest: no rows to show"
    assert first_detail["config"]["model_name"] == MODEL and [e["epoch"] for e in first_detail["epochs"]] == [1, 2]
    assert first_detail["spec"]["source_table"] and "watermark" in first_detail["spec"]

    run = catalog.run_overview(autocommit, second)
    assert (run["version"], run["status"], run["dag_run_id"]) == (2, "committed", "manual__2")
    assert [e["epoch"] for e in run["epochs"]] == [1, 2] and run["config"]["model_name"] == MODEL
    html = ui_render.run_page(run, "/pgtrain", "")
    assert 'href="/dags/pgtrain_training/runs/manual__2"' in html and f'href="/pgtrain/models/{MODEL}"' in html
    assert html.count('class="point"') == 2 * 4  # train_ and val_ loss and accuracy: one point per epoch each


def test_pages_escape_what_they_show_and_draw_one_point_per_epoch():
    name = '<script>alert("x")</script>'
    html = ui_render.models_page([{"model_name": name, "versions": 1, "newest_version": 1, "newest_at": None,
                                   "head_version": 1, "head_moved_at": None, "head_metrics": {"val_x": "<b>"}}],
                                 "/pgtrain")
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;" in html and "/pgtrain/models/%3Cscript%3E" in html

    epochs = [{"epoch": i, "train_loss": 1.0 / i, "val_loss": 1.2 / i, "val_accuracy": 0.5 + i / 20}
              for i in range(1, 6)]
    svg = charts.metric_charts([("", epochs)])
    for series in ("train_loss", "val_loss", "val_accuracy"):
        group = re.search(rf'<g class="series[^"]*" data-series="{series}"[^>]*>(.*?)</g>', svg).group(1)
        assert re.findall(r'data-epoch="(\d+)"', group) == ["1", "2", "3", "4", "5"], series
    assert "<script" not in svg and "http" not in svg.replace("http://www.w3.org/2000/svg", "")


def test_a_page_with_no_models_says_how_to_get_one():
    html = ui_render.models_page([], "/pgtrain")
    assert "make load-digits" in html and "pgtrain_model_digits-mlp" in html and "dags/models.yaml" in html


def test_metric_names_are_escaped_too():
    html = ui_render.metrics_text({"val_<i>x</i>": 0.5, "epochs": 3})
    assert "<i>" not in html and "&lt;i&gt;x&lt;/i&gt; 0.5" in html


@pytest.fixture
def page_client_of(monkeypatch, tmp_path):
    """Factory: the models page app mounted at /pgtrain as the api-server mounts it, behind Airflow's own
    authentication (the simple auth manager, in this process) and reading the Airflow connection pgtrain_db, here
    the database ``url``. Returns (client, bearer token)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER",
                       "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp_path / "passwords.json"))
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_urlsafe(64))
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    from pgtrain.airflow.ui.app import URL_PREFIX, create_app

    clients = []

    def start(url: str):
        monkeypatch.setenv("AIRFLOW_CONN_PGTRAIN_DB", url)
        token = init_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
        airflow = FastAPI()
        airflow.mount(URL_PREFIX, create_app())
        clients.append(TestClient(airflow, base_url="http://attacker.example").__enter__())
        return clients[-1], token

    yield start
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def page_client(make_database, page_client_of):
    """The models page on a database where nothing was trained yet (no pgtrain tables): (client, bearer token)."""
    return page_client_of(make_database(migrate=False))


def test_every_page_answers_on_a_database_nothing_was_trained_into(page_client):
    client, token = page_client
    logged_in = {"Authorization": f"Bearer {token}", "Accept": "text/html"}
    listing = client.get("/pgtrain/", headers=logged_in)
    assert listing.status_code == 200 and "pgtrain_model_digits-mlp" in listing.text
    for path in ("/pgtrain/models/digits-mlp", "/pgtrain/runs?run_id=pgtrain_training/manual__1"):
        page = client.get(path, headers=logged_in)
        assert page.status_code == 404, (path, page.text)
        assert "no pgtrain tables yet" in page.text and "pgtrain_model_digits-mlp" in page.text, path


def test_the_login_redirect_comes_back_to_a_path_not_to_the_requests_host(page_client):
    client, _ = page_client
    answer = client.get("/pgtrain/runs?run_id=r1", headers={"Accept": "text/html"}, follow_redirects=False)
    assert answer.status_code == 303 and "r1" not in answer.text
    assert answer.headers["location"] == "/auth/login?" + urlencode({"next": "/pgtrain/runs?run_id=r1"})


def test_the_cli_lists_through_the_same_queries(db_url, autocommit, capsys, monkeypatch):
    from pgtrain.cli.models import main

    commit_run(autocommit, prepare_run(db_url, "manual__1"), owner=OWNER, lock_timeout=5)
    monkeypatch.setenv("PGTRAIN_DATABASE_URL", db_url)
    assert main(["list", MODEL]) == 0 and main(["history", MODEL]) == 0 and main(["rollback", MODEL]) == 1
    out = capsys.readouterr()
    assert f"{MODEL:<20} *     1" in out.out and "commit" in out.out
    assert "has no version older than its head" in out.err


def test_a_version_shows_its_validation_metrics_and_confusion_matrix(db_url, autocommit, page_client_of, capsys,
                                                                    monkeypatch):
    """What the trainer records with each epoch (pgtrain.data.metrics) becomes the version's, and the page, the run
    page and ``pgtrain-models show`` show it, class labels escaped."""
    from pgtrain.cli.models import main

    labels = ["<b>cat</b>", "dog", "emu"]
    truth = np.array([0, 0, 1, 1, 2, 2, 2, UNSEEN_CLASS])
    probabilities = np.array([[.8, .1, .1], [.2, .7, .1], [.1, .8, .1], [.3, .6, .1], [.1, .1, .8], [.1, .2, .7],
                              [.6, .2, .2], [.2, .2, .6]])
    figures = classification_metrics(probabilities, truth, labels)
    assert figures[CONFUSION_MATRIX]["counts"] == [[1, 1, 0], [0, 2, 0], [1, 0, 2]]
    run_id = prepare_any(db_url, "manual__1", custom(), metrics=figures)
    commit_run(autocommit, run_id, owner=OWNER, lock_timeout=5)
    [version] = catalog.list_versions(autocommit, MODEL)
    assert {k: version["metrics"][k] for k in figures} == figures

    client, token = page_client_of(db_url)
    logged_in = {"Authorization": f"Bearer {token}", "Accept": "text/html"}
    html = client.get(f"/pgtrain/models/{MODEL}", params={"version": 1}, headers=logged_in).text
    for name, metric in METRICS.items():
        row = re.search(rf'<tr data-metric="{name}"><th>(.*?)</th><td>(.*?)</td><td>(.*?)</td>', html)
        if name not in figures:
            assert row is None, name
            continue
        assert row.group(1) == ui_render.e(metric.label) and row.group(2) == ui_render.number(figures[name]), name
        assert row.group(3) == ("higher is better" if metric.higher_is_better else "lower is better"), name
    matrix = re.search(r'<table id="confusion-matrix".*?</table>', html).group(0)
    assert "<b>" not in html and "&lt;b&gt;cat&lt;/b&gt;" in matrix
    cells = [re.findall(r"<td[^>]*>(\d+)</td>", row) for row in re.findall(r"<tr><th>[^<]*</th>(<td.*?)</tr>", matrix)]
    assert cells == [["1", "1", "0"], ["0", "2", "0"], ["1", "0", "2"], ["0", "0", "1"]], "true classes, then unseen"
    assert client.get(f"/pgtrain/models/{MODEL}", params={"version": 7}, headers=logged_in).status_code == 404

    run_page = client.get("/pgtrain/runs", params={"run_id": run_id}, headers=logged_in).text
    assert "Confusion matrix of epoch 1" in run_page and "&lt;b&gt;cat&lt;/b&gt;" in run_page

    monkeypatch.setenv("PGTRAIN_DATABASE_URL", db_url)
    assert main(["show", MODEL]) == 0
    out = capsys.readouterr().out
    assert re.search(r"val_roc_auc\s+0\.\d{4}  \(ROC AUC, higher is better\)", out)
    assert "val_loss" in out and "(loss, lower is better)" in out
    assert "true \\ predicted  <b>cat</b> dog emu" in out
    assert re.search(r"\n  dog\s+0\s+2\s+0\n", out) and re.search(r"\(not in training\)\s+0\s+0\s+1", out)


def test_the_app_compares_versions_and_sends_its_content_security_policy(db_url, autocommit, page_client_of):
    for dag_run_id in ("manual__1", "manual__2"):
        commit_run(autocommit, prepare_run(db_url, dag_run_id), owner=OWNER, lock_timeout=5)
    client, token = page_client_of(db_url)
    logged_in = {"Authorization": f"Bearer {token}", "Accept": "text/html"}

    compared = client.get(f"/pgtrain/models/{MODEL}/compare", params=[("v", 2), ("v", 1)], headers=logged_in)
    assert compared.status_code == 200, compared.text
    assert compared.headers["content-security-policy"] == ui_html.CONTENT_SECURITY_POLICY
    assert re.findall(r'data-series="val_loss" data-version="(v\d)"', compared.text) == ["v2", "v1"]
    assert 'id="compare-metrics"' in compared.text and 'data-param="params.model_name"' in compared.text
    for asked, status in (([("v", 1)], 400), ([("v", 1), ("v", 1)], 400), ([("v", 1), ("v", 5)], 404)):
        answer = client.get(f"/pgtrain/models/{MODEL}/compare", params=asked, headers=logged_in)
        assert answer.status_code == status, (asked, answer.text)
        assert answer.headers["content-security-policy"] == ui_html.CONTENT_SECURITY_POLICY
    assert "takes 2 to 12 different versions (got 1)" in client.get(
        f"/pgtrain/models/{MODEL}/compare", params={"v": 1}, headers=logged_in).text

    older = client.get(f"/pgtrain/models/{MODEL}", params={"version": 1}, headers=logged_in).text
    assert re.search(r'<h2 id="version" data-version="1">', older)
    assert 'data-param="model_name"' in older and 'data-field="source table"' in older
    assert f'href="/pgtrain/models/{MODEL}/compare?v=2&amp;v=1"' in older, "the older version's compare-with-head link"
