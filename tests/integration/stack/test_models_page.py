"""The models page in a real browser: Debian's headless Chromium, driven by Selenium, logs in through Airflow's own
login page, opens the page and finds the model, its versions and a chart with one point per epoch; then a regression
model of two versions (scikit-learn's diabetes table): one chart per metric (R² on an axis of its own, not RMSE's),
the older version's curves, params and data, the compare view, and the dark theme. Nothing is downloaded at run time
(the driver is /usr/bin/chromedriver; Selenium Manager stays offline)."""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import httpx
import psycopg
import pytest

from dev import examples
from pgtrain.airflow.ui import charts
from pgtrain.runs.record import training_run_id
from tests.conftest import REPO
from tests.integration.stack.airflow_stack import AirflowStack

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1800)]

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = REPO / "test-artifacts"
WAIT = 180  # seconds for a page to show what the test waits for (a busy 2-core machine)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"{' and '.join(missing)} missing: install Debian's browser for this test with "
                    "`apt-get install -y chromium chromium-driver` (.ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pgtrain-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1600", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SE_OFFLINE", "true")  # Selenium Manager must not fetch a browser or a driver
        driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def log_in(driver, stack: AirflowStack, page_url: str) -> None:
    """Through Airflow's login page: the page redirects there and back once the form is sent."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page_url)
    wait = WebDriverWait(driver, WAIT)
    wait.until(lambda d: d.current_url.startswith(page_url) or d.find_elements(By.NAME, "username"))
    if driver.current_url.startswith(page_url):  # logged in already (an earlier test of this module)
        return
    wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys(stack.username)
    driver.find_element(By.NAME, "password").send_keys(stack.password)
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "button[type=submit]"))).click()
    wait.until(lambda d: d.current_url.startswith(page_url))


def test_the_models_page_shows_the_model_its_versions_and_its_curves(airflow_stack: AirflowStack,
                                                                      stack_training_run, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    model, epochs = stack_training_run["conf"]["model_name"], stack_training_run["conf"]["epochs"]
    log_in(browser, airflow_stack, f"{airflow_stack.base_url}/pgtrain/")
    wait = WebDriverWait(browser, WAIT)
    table = wait.until(ec.presence_of_element_located((By.ID, "models")))
    assert model in table.text

    browser.find_element(By.LINK_TEXT, model).click()
    versions = wait.until(ec.presence_of_element_located((By.ID, "versions")))
    rows = versions.find_elements(By.CSS_SELECTOR, "tr[data-version]")
    assert [row.get_attribute("data-version") for row in rows] == ["1"]
    assert "head" in rows[0].text and stack_training_run["dag_run_id"] in rows[0].text
    shown = browser.find_elements(By.CSS_SELECTOR, "#metrics tr[data-metric]")
    assert {"val_accuracy", "val_loss"} <= {row.get_attribute("data-metric") for row in shown}
    for series in ("train_loss", "val_loss"):
        points = browser.find_elements(By.CSS_SELECTOR,
                                       f'svg[data-chart="loss"] g[data-series="{series}"] circle.point')
        assert [p.get_attribute("data-epoch") for p in points] == [str(e) for e in range(1, epochs + 1)], series
    accuracy = browser.find_elements(By.CSS_SELECTOR,
                                     'svg[data-chart="val_accuracy"] g[data-series="val_accuracy"] circle.point')
    assert len(accuracy) == epochs
    # the best epoch marked on every chart (early stopping, on by default, recorded one)
    for svg in browser.find_elements(By.CSS_SELECTOR, "svg.chart"):
        markers = svg.find_elements(By.CSS_SELECTOR, "g.best-epoch")
        assert len(markers) == 1 and 1 <= int(markers[0].get_attribute("data-epoch")) <= epochs, (
            svg.get_attribute("data-chart"))
    # the quality gate in a group of its own, not among the training params
    gate = {r.get_attribute("data-param") for r in browser.find_elements(By.CSS_SELECTOR, "#gate tr[data-param]")}
    params = {r.get_attribute("data-param") for r in browser.find_elements(By.CSS_SELECTOR, "#params tr[data-param]")}
    assert {"max_accuracy_drop", "allow_unvalidated", "metric"} <= gate and "learning_rate" in params
    assert not gate & params
    assert_charts_fill_their_panel(browser)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "models-page.png"))

    dag_run_link = rows[0].find_element(By.LINK_TEXT, stack_training_run["dag_run_id"])
    assert dag_run_link.get_attribute("href").startswith(
        f"{airflow_stack.base_url}/dags/pgtrain_training/runs/")


def assert_charts_fill_their_panel(driver) -> None:
    """Each chart as wide as its column: in this 1280-pixel window two a row, each wider than its viewBox."""
    panel, chart, height = driver.execute_script(
        "const panel = document.querySelector('.charts'), svg = panel.querySelector('svg.chart');"
        "return [panel.getBoundingClientRect().width, svg.getBoundingClientRect().width,"
        " svg.getBoundingClientRect().height];")
    assert chart >= 0.45 * panel and chart > charts.WIDTH, (panel, chart)
    assert height == pytest.approx(chart * charts.HEIGHT / charts.WIDTH, rel=0.02), "drawn to scale"


def test_a_logged_out_request_gets_nothing(airflow_stack: AirflowStack, stack_training_run):
    model = stack_training_run["conf"]["model_name"]
    run_id = training_run_id(stack_training_run["dag_id"], stack_training_run["dag_run_id"])
    logged_in = httpx.get(f"{airflow_stack.base_url}/pgtrain/runs", params={"run_id": run_id},
                          headers={"Authorization": f"Bearer {airflow_stack.token()}"}, timeout=60)
    assert logged_in.status_code == 200 and model in logged_in.text  # the run's page exists: what is withheld
    for path in ("/pgtrain/", f"/pgtrain/models/{model}", "/pgtrain/runs?" + urlencode({"run_id": run_id})):
        anonymous = httpx.get(airflow_stack.base_url + path, timeout=60)
        assert anonymous.status_code == 401 and model not in anonymous.text, path
        browser_like = httpx.get(airflow_stack.base_url + path, headers={"Accept": "text/html"}, timeout=60)
        assert browser_like.status_code == 303 and model not in browser_like.text, path
        assert browser_like.headers["location"] == "/auth/login?" + urlencode({"next": path}), path
        forged = httpx.get(airflow_stack.base_url + path, headers={"Authorization": "Bearer not-a-token"}, timeout=60)
        assert forged.status_code in (401, 403) and model not in forged.text, path


# -- a regression model of two versions ------------------------------------------------------------------------------
REGRESSION_TABLE = ("public", "stack_diabetes")
REGRESSION_MODEL = "stack-diabetes"
# v1 and v2 differ in epochs and learning rate: the params diff shows those two, the curves 3 and 4 points. Their
# dropout and warmup_epochs are the same values spelled as a form sends them (0.0, 1.0) and as a REST client may
# (0, 1): no difference.
REGRESSION_RUNS = ({"epochs": 3, "learning_rate": 0.01, "dropout": 0, "warmup_epochs": 1},
                   {"epochs": 4, "learning_rate": 0.005, "dropout": 0.0, "warmup_epochs": 1.0})


@pytest.fixture(scope="module")
def stack_regression_versions(airflow_stack: AirflowStack) -> list[dict]:
    """pgtrain_training triggered twice, one run after the other, on the diabetes table (10 scalar columns, a target
    near 150 whose RMSE is tens and R² below 1): versions 1 and 2 of REGRESSION_MODEL."""
    with psycopg.connect(airflow_stack.training_url, autocommit=True) as conn:
        names = examples.diabetes()[0]
        examples.load_diabetes(conn, REGRESSION_TABLE)
    base = {"source_table": ".".join(REGRESSION_TABLE), "features_column": None, "feature_columns": names,
            "label_column": "progression", "task": "regression", "model_name": REGRESSION_MODEL, "world_size": 1,
            "hidden_sizes": [8], "batch_size": 32, "seed": 3}
    airflow_stack.wait_for_dag("pgtrain_training")  # active from its creation: a trigger runs
    runs = []
    for changes in REGRESSION_RUNS:
        conf = {**base, **changes}
        run_id = airflow_stack.trigger("pgtrain_training", conf)
        state = airflow_stack.wait_for_run("pgtrain_training", run_id)
        assert state == "success", airflow_stack.describe_failure("pgtrain_training", run_id)
        runs.append({"dag_run_id": run_id, "conf": conf})
    return runs


def test_a_regression_model_gets_a_chart_per_metric_each_versions_details_and_a_compare_view(
        airflow_stack: AirflowStack, stack_regression_versions, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT)
    log_in(browser, airflow_stack, f"{airflow_stack.base_url}/pgtrain/models/{REGRESSION_MODEL}")
    wait.until(ec.presence_of_element_located((By.ID, "version")))
    assert browser.find_element(By.ID, "version").get_attribute("data-version") == "2", "the head is shown"

    def charts() -> dict[str, object]:
        return {svg.get_attribute("data-chart"): svg for svg in browser.find_elements(By.CSS_SELECTOR, "svg.chart")}

    def points(svg, series: str, version: str = "") -> list[str]:
        return [p.get_attribute("data-epoch") for p in svg.find_elements(
            By.CSS_SELECTOR, f'g[data-series="{series}"][data-version="{version}"] circle.point')]

    shown = charts()
    assert list(shown) == ["loss", "val_rmse", "val_mae", "val_r2"], "one chart per metric, RMSE and R² apart"
    r2_axis = [float(shown["val_r2"].get_attribute(f"data-y-{end}")) for end in ("min", "max")]
    rmse_axis = [float(shown["val_rmse"].get_attribute(f"data-y-{end}")) for end in ("min", "max")]
    assert r2_axis[1] <= 1.0 and rmse_axis[0] >= 10.0, (r2_axis, rmse_axis)
    assert points(shown["val_r2"], "val_r2") == ["1", "2", "3", "4"]

    # the versions table says what changed since the version before
    changed = {row.get_attribute("data-version"): row.find_element(By.CSS_SELECTOR, "td.changed")
               for row in browser.find_elements(By.CSS_SELECTOR, "#versions tr[data-version]")}
    assert changed["2"].get_attribute("data-changed") == "epochs learning_rate", changed["2"].text
    assert changed["2"].text == "epochs 4, learning_rate 0.005" and changed["1"].text == "-"
    assert_charts_fill_their_panel(browser)

    # the older version: its own curves, params (its run's config snapshot) and data
    row = browser.find_element(By.CSS_SELECTOR, '#versions tr[data-version="1"]')
    row.find_element(By.LINK_TEXT, "v1").click()
    wait.until(lambda d: d.find_element(By.ID, "version").get_attribute("data-version") == "1")
    assert points(charts()["val_rmse"], "val_rmse") == ["1", "2", "3"]
    assert points(charts()["loss"], "train_loss") == ["1", "2", "3"]
    params = {r.get_attribute("data-param"): r.find_element(By.TAG_NAME, "td").text
              for r in browser.find_elements(By.CSS_SELECTOR, "#params tr[data-param]")}
    assert (params["learning_rate"], params["epochs"], params["task"]) == ("0.01", "3", '"regression"')
    data = {r.get_attribute("data-field"): r.find_element(By.TAG_NAME, "td").text
            for r in browser.find_elements(By.CSS_SELECTOR, "#data tr[data-field]")}
    assert data["source table"] == '"public"."stack_diabetes"' and data["rows"] == "442", data
    assert data["watermark: largest key"] == "442"
    assert sum(int(data[f"{part} rows"]) for part in ("training", "validation", "test")) == 442
    assert browser.find_element(By.CSS_SELECTOR, '#model-spec tr[data-field="target_column"] td').text == "progression"
    assert not browser.find_elements(By.ID, "confusion-matrix"), "a regression has no confusion matrix"
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "models-page-regression-v1.png"))

    # compare: both versions checked in the versions table, the form sent
    for version in ("1", "2"):
        browser.find_element(By.CSS_SELECTOR, f'#versions input[name="v"][value="{version}"]').click()
    browser.find_element(By.CSS_SELECTOR, "#compare-form button[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "compare-metrics")))
    for metric in ("val_rmse", "val_r2", "val_mae"):
        cells = browser.find_elements(By.CSS_SELECTOR, f'#compare-metrics tr[data-metric="{metric}"] td')
        assert len(cells) == 2 and all(math.isfinite(float(c.text)) for c in cells), metric
    differs = [r.get_attribute("data-param") for r in browser.find_elements(By.CSS_SELECTOR, "#params-diff tr")
               if r.get_attribute("data-param")]
    assert {"params.learning_rate", "params.epochs"} <= set(differs)
    assert "params.hidden_sizes" not in differs and "model.task" not in differs
    assert "params.dropout" not in differs and "params.warmup_epochs" not in differs, "0 and 0.0 are the same"
    overlaid = charts()
    assert list(overlaid) == ["loss", "val_rmse", "val_mae", "val_r2"]
    assert points(overlaid["val_r2"], "val_r2", "v1") == ["1", "2", "3"]
    assert points(overlaid["val_r2"], "val_r2", "v2") == ["1", "2", "3", "4"]
    browser.save_screenshot(str(ARTIFACTS / "models-page-compare.png"))

    # the dark theme follows prefers-color-scheme (as it does embedded: Airflow sets the color-scheme of its frame)
    def background() -> str:
        return browser.execute_script("return getComputedStyle(document.body).backgroundColor")

    assert background() == "rgb(255, 255, 255)"
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                            {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    try:
        assert background() == "rgb(17, 17, 17)"
        browser.save_screenshot(str(ARTIFACTS / "models-page-compare-dark.png"))
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
