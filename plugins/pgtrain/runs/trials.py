"""The trials ledger of a search (sql/015_search_trials.sql): each trial a training run of its own that reads the
search run's plan (``training_runs.plan_run``, sql/016_shared_plan.sql), what each trial did, and which one was chosen
and why."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgtrain.config.bins import bin_counts, for_bins
from pgtrain.config.params import TrainingConfig
from pgtrain.config.search import Search, trial_config
from pgtrain.runs.record import epoch_metrics, get_run, kept_epoch

# A trial's run starts as a fresh planned run: these columns of the search run's record are its own, not copied.
_FRESH = {"status": "sharded", "status_reason": None, "summary": None, "attempt": 0, "model_layout": None,
          "init_version": None, "backend": None, "test_metrics": None}


@dataclass(frozen=True)
class Choice:
    metric: str
    higher_is_better: bool
    trial: int | None  # None: no trial trained
    run_id: str | None
    explanation: str


def trial_run_id(search_run: str, number: int) -> str:
    return f"{search_run}/trial-{number}"


def create_trials(conn: psycopg.Connection, search_run: str, search: Search) -> list[str]:
    """Each trial's run, a copy of the search run's record that reads the search run's plan (one snapshot,
    manifest, batches and encoding for all: ``pgtrain.plan_of``), in one transaction; the trials already created by
    an earlier try are kept as they are. A trial's input record is the plan's with exactly the quantile edges of its
    own numeric_bins (``config.bins.for_bins``), so the version it may become records what its model uses."""
    parent = get_run(conn, search_run)
    base = parent.config.to_dict()
    planned = bin_counts(parent.config)
    with conn.transaction():
        for trial in search.trials:
            run_id = trial_run_id(search_run, trial.number)
            config = TrainingConfig.from_mapping(trial_config(base, trial))
            encoding = for_bins(parent.encoding, max(bin_counts(config), default=0), planned)
            created = conn.execute(
                """INSERT INTO pgtrain.training_runs
                   SELECT (jsonb_populate_record(NULL::pgtrain.training_runs,
                                                 to_jsonb(r) || %(fresh)s || jsonb_build_object(
                                                     'run_id', %(run)s::text, 'config', %(config)s::jsonb,
                                                     'encoding', %(encoding)s::jsonb,
                                                     'plan_run', coalesce(r.plan_run, r.run_id),
                                                     'created_at', now(), 'updated_at', now()))).*
                   FROM pgtrain.training_runs r WHERE r.run_id = %(parent)s
                   ON CONFLICT (run_id) DO NOTHING RETURNING run_id""",
                {"fresh": Jsonb(_FRESH), "run": run_id, "config": Jsonb(config.to_dict()),
                 "encoding": None if encoding is None else Jsonb(encoding), "parent": search_run}).fetchone()
            if created is None:
                continue
            conn.execute("INSERT INTO pgtrain.search_trials (search_run, trial, run_id, params) "
                         "VALUES (%s, %s, %s, %s)", (search_run, trial.number, run_id, Jsonb(trial.params)))
    return trial_runs(conn, search_run)


def trial_runs(conn: psycopg.Connection, search_run: str) -> list[str]:
    return [row[0] for row in conn.execute(
        "SELECT run_id FROM pgtrain.search_trials WHERE search_run = %s ORDER BY trial", (search_run,))]


def trial_of(conn: psycopg.Connection, run_id: str) -> tuple[str, int] | None:
    """(search run, trial number) of a trial's run; None for a run that is no trial."""
    row = conn.execute("SELECT search_run, trial FROM pgtrain.search_trials WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def ledger(conn: psycopg.Connection, search_run: str) -> list[dict[str, Any]]:
    """What each trial did, in trial order: its params, status (and why), the kept epoch's validation metrics, its
    test figures, its curve (every epoch) and its time (seconds its epochs took; the first try's to the last)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            """SELECT t.trial, t.run_id, t.params, r.status, r.status_reason, r.attempt, r.test_metrics,
                      extract(epoch FROM r.updated_at - t.created_at)::float8 AS elapsed
               FROM pgtrain.search_trials t JOIN pgtrain.training_runs r ON r.run_id = t.run_id
               WHERE t.search_run = %s ORDER BY t.trial""", (search_run,)).fetchall()
    for row in rows:
        epochs = epoch_metrics(conn, row["run_id"])
        row["curve"] = epochs
        row["metrics"] = kept_epoch(epochs)
        row["seconds"] = sum(e.get("seconds") or 0.0 for e in epochs)
    return rows


def choose(trials: Iterable[dict[str, Any]], metric: str, higher_is_better: bool) -> Choice:
    """The best trial by the validation ``metric`` among those that trained (status trained or committed, the
    metric finite); ties go to the earlier trial. The explanation names the runner-up and what the others did."""
    usable, left_out = [], []
    for trial in trials:
        value = (trial.get("metrics") or {}).get(metric)
        if trial["status"] not in ("trained", "committed"):
            left_out.append(f"trial {trial['trial']} {trial['status']}"
                            + (f" ({trial['status_reason'].splitlines()[0][:120]})" if trial["status_reason"] else ""))
        elif not isinstance(value, int | float) or not math.isfinite(value):
            left_out.append(f"trial {trial['trial']} has no {metric}")
        else:
            usable.append((value, trial))
    direction = "higher is better" if higher_is_better else "lower is better"
    if not usable:
        return Choice(metric, higher_is_better, None, None,
                      f"no trial trained with a {metric} to choose by: " + "; ".join(left_out))
    usable.sort(key=lambda pair: (-pair[0] if higher_is_better else pair[0], pair[1]["trial"]))
    value, best = usable[0]
    words = [f"trial {best['trial']} chosen: {metric} {value:.4f} on the validation rows ({direction})"]
    if len(usable) > 1:
        words.append(f"runner-up trial {usable[1][1]['trial']} {usable[1][0]:.4f}")
    if left_out:
        words.append("not candidates: " + "; ".join(left_out))
    return Choice(metric, higher_is_better, best["trial"], best["run_id"], "; ".join(words))


def record_choice(conn: psycopg.Connection, search_run: str, choice: Choice) -> None:
    """The search's choice (a retried choice replaces an earlier one's record)."""
    with conn.transaction():
        conn.execute(
            """INSERT INTO pgtrain.search_choices (search_run, metric, higher_is_better, chosen_trial, chosen_run,
                                                   explanation)
               VALUES (%s, %s, %s, %s, %s, %s)
               ON CONFLICT (search_run) DO UPDATE SET metric = EXCLUDED.metric,
                 higher_is_better = EXCLUDED.higher_is_better, chosen_trial = EXCLUDED.chosen_trial,
                 chosen_run = EXCLUDED.chosen_run, explanation = EXCLUDED.explanation, decided_at = now()""",
            (search_run, choice.metric, choice.higher_is_better, choice.trial, choice.run_id, choice.explanation))


def recorded_choice(conn: psycopg.Connection, search_run: str) -> Choice | None:
    row = conn.execute("SELECT metric, higher_is_better, chosen_trial, chosen_run, explanation "
                       "FROM pgtrain.search_choices WHERE search_run = %s", (search_run,)).fetchone()
    return None if row is None else Choice(*row)


def search_of(conn: psycopg.Connection, run_id: str) -> dict[str, Any] | None:
    """The search a trial's run belongs to, as the models page shows it: its run, choice and every trial's ledger
    row; None for a run that is no trial (or whose search has made no choice yet)."""
    trial = trial_of(conn, run_id)
    choice = recorded_choice(conn, trial[0]) if trial else None
    if trial is None or choice is None:
        return None
    return {"search_run": trial[0], "choice": choice, "trials": ledger(conn, trial[0])}
