"""The models page's part of a version chosen by a search: every trial (its params, what became of it, the metric it
was chosen by, its time), the choice in words, and the trials' curves overlaid. A pure function of what
``pgtrain.runs.trials.search_of`` returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgtrain.airflow.ui.charts import metric_charts
from pgtrain.airflow.ui.html import e, link, number, run_href
from pgtrain.config.metrics import METRICS
from pgtrain.config.search import describe


def search_section(search: Mapping[str, Any] | None, root: str) -> str:
    """Nothing for a version no search chose."""
    if not search:
        return ""
    choice, metric = search["choice"], search["choice"].metric
    rows = []
    for t in search["trials"]:
        chosen = t["run_id"] == choice.run_id
        status = t["status"] + (f": {t['status_reason'].splitlines()[0]}" if t["status_reason"] else "")
        rows.append(f'<tr data-trial="{e(t["trial"])}"{" class=chosen" if chosen else ""}>'
                    f"<td>{e(t['trial'])}{' <span class=badge>chosen</span>' if chosen else ''}</td>"
                    f"<td><code>{e(describe(t['params']))}</code></td><td>{e(status)}</td>"
                    f"<td class=num>{number(t['metrics'].get(metric))}</td>"
                    f"<td class=num>{number(float(t['seconds']))}</td>"
                    f"<td>{link(run_href(root, t['run_id']), t['run_id'])}</td></tr>")
    label = METRICS[metric].label if metric in METRICS else metric
    return (f'<h3 id="search">Search ({len(rows)} trials over one plan)</h3>'
            f'<p id="search-choice">{e(choice.explanation)}. The version\'s figures above are read on the test '
            "rows, which no trial was chosen by.</p>"
            f'<table id="search-trials"><thead><tr><th>Trial</th><th>Params</th><th>Status</th>'
            f"<th>{e(label)} (validation)</th><th>Seconds</th><th>Run</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
            + metric_charts([(f"trial {t['trial']}", t["curve"]) for t in search["trials"] if t["curve"]]))
