"""The models page in a real browser: Debian's headless Chromium, driven by Selenium, logs in through Airflow's own
login page, opens the page and finds the model, its versions and a chart with one point per epoch. Nothing is
downloaded at run time (the driver is /usr/bin/chromedriver; Selenium Manager stays offline)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest

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
    assert "(head)" in rows[0].text and stack_training_run["dag_run_id"] in rows[0].text
    shown = browser.find_elements(By.CSS_SELECTOR, "#metrics tr[data-metric]")
    assert {"val_accuracy", "val_loss"} <= {row.get_attribute("data-metric") for row in shown}
    for series in ("train_loss", "val_loss"):
        points = browser.find_elements(By.CSS_SELECTOR,
                                       f'svg[data-chart="loss"] g[data-series="{series}"] circle.point')
        assert [p.get_attribute("data-epoch") for p in points] == [str(e) for e in range(1, epochs + 1)], series
    accuracy = browser.find_elements(By.CSS_SELECTOR,
                                     'svg[data-chart="validation"] g[data-series="val_accuracy"] circle.point')
    assert len(accuracy) == epochs
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "models-page.png"))

    dag_run_link = rows[0].find_element(By.LINK_TEXT, stack_training_run["dag_run_id"])
    assert dag_run_link.get_attribute("href").startswith(
        f"{airflow_stack.base_url}/dags/pgtrain_training/runs/")


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
