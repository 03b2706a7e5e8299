"""A run's note shows a conf's text as text: opening the DAG run in Airflow's UI (real Chromium) makes no request
to a URL that a conf string carried as a Markdown image, link or autolink (issue 20 item 4). The run is refused
as bad input (the columns do not exist), which is the point: its note quotes them."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import pytest

from tests.integration.stack.airflow_stack import AirflowStack
from tests.integration.stack.conftest import STACK_TABLE
from tests.integration.stack.test_models_page import ARTIFACTS, WAIT, browser, log_in  # noqa: F401 (browser: a fixture)

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1800)]


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that records the path of every request it gets: (its base URL, the paths)."""
    seen: list[str] = []

    class Record(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Record)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_opening_a_run_requests_no_url_its_conf_carried(airflow_stack: AirflowStack, stack_training_run,
                                                         browser, listener):  # noqa: F811 (the imported fixture)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    base, seen = listener
    markdown = [f"![x]({base}/image.png)", f"[y]({base}/link)", f"<{base}/autolink>"]
    conf = {"source_table": f"public.{STACK_TABLE}", "model_name": "stack-note", "epochs": 1, "world_size": 1,
            "feature_columns": [*markdown, "title"]}
    run_id = airflow_stack.trigger("pgtrain_training", conf)  # active from its creation: the trigger runs
    assert airflow_stack.wait_for_run("pgtrain_training", run_id) == "failed"  # refused: no such columns
    # The REST API returns the note raw: the list's own brackets and an ordinary name read as written, with a
    # backslash only where the conf's text would have made a link or an image.
    raw = airflow_stack.api("GET", f"/api/v2/dags/pgtrain_training/dagRuns/{quote(run_id, safe='')}").json()["note"]
    assert "title" in raw and "[" in raw and "\\[" not in raw, raw
    assert f"\\]({base}/image.png)" in raw and set(re.findall(r"\\(.)", raw)) == {"]", "<"}, raw

    page = f"{airflow_stack.base_url}/dags/pgtrain_training/runs/{quote(run_id, safe='')}"
    log_in(browser, airflow_stack, page)

    # The run page's header shows the note as rendered Markdown, one paragraph whose URLs the UI's GFM renderer
    # links as themselves (as in any note): the text is split over several nodes, so the paragraph is matched.
    note = "//p[contains(., 'stack-note: refused')]"

    def note_shown(driver) -> bool:
        return any(element.is_displayed() for element in driver.find_elements(By.XPATH, note))

    try:
        WebDriverWait(browser, WAIT).until(note_shown)
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "run-note.png"))
        (ARTIFACTS / "run-note.html").write_text(browser.page_source)
        raise
    shown = browser.find_element(By.XPATH, note).get_attribute("textContent")
    assert all(text in shown for text in markdown), shown  # the conf's strings, as written: no image, no link text
    # Nothing fetches from the listener (no src); a link to it only as GFM's bare-URL link, whose text is its URL
    # (a click would be the viewer's own request), never a Markdown link or image made of the conf's text.
    pointing = [(e.tag_name, a, e.get_attribute(a), e.get_attribute("textContent")) for a in ("src", "href")
                for e in browser.find_elements(By.CSS_SELECTOR, f"[{a}]") if base in (e.get_attribute(a) or "")]
    assert all(tag == "a" and a == "href" and text.startswith(base) for tag, a, _, text in pointing), pointing

    browser.get(f"{base}/control")  # the listener hears this browser; a request the page made came before
    WebDriverWait(browser, WAIT).until(lambda _: "/control" in seen)
    assert seen == ["/control"]
