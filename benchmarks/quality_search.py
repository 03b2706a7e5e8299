"""bench_quality's search row (issue 34): a small default search on a table (8 trials over both built-ins, one plan,
trained one after another as the local launcher's concurrency 1 does), its best trial committed; the version's
figure on the test rows (which no trial was chosen by) and the search's wall time. Off unless
$PGTRAIN_BENCH_QUALITY_SEARCH is 1: it trains 8 times what a table's row trains."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import psycopg

from pgtrain.config.params import TrainingConfig
from pgtrain.config.search import describe
from pgtrain.config.settings import AuthorSettings
from pgtrain.data import manifest
from pgtrain.launch import local as launch_local
from pgtrain.planning import plan
from pgtrain.runs import record, trials
from pgtrain.store.model_store import get_version
from pgtrain.store.search_commit import commit_search

# 2 x 2 networks and 2 x 2 boosted: the two built-ins at their defaults and one step from them; the networks with
# standardized values or 32 quantile bins, as the validation rows say (both from the one plan).
DEFAULT_SEARCH: dict[str, Any] = {"candidates": [
    {"model": "mlp", "params": {"hidden_sizes": [[50], [128, 64]], "numeric_bins": [0, 32]}},
    {"model": "xgboost", "model_options": {"max_depth": [4, 6]}, "params": {"learning_rate": [0.05, 0.1]}},
]}
AUTHOR = AuthorSettings(allowed_sources=("public", "Clinic", "r"), allowed_models=("mlp", "xgboost"),
                        search_limits={"max_trials": 8, "concurrency": 1})


def enabled() -> bool:
    return os.environ.get("PGTRAIN_BENCH_QUALITY_SEARCH") == "1"


def search_figures(conn: psycopg.Connection, url: str, config: TrainingConfig, prefix: str,
                   figure: str) -> dict[str, Any]:
    """Plan once, train every trial, commit the best; ``figure`` (test_accuracy, test_r2) of the version, the
    chosen trial, and the seconds from planning to commit, under ``<prefix>.search.``."""
    started = time.perf_counter()
    params = {**config.to_dict(), "model_name": f"{config.model_name}-search", "search": DEFAULT_SEARCH}
    search = record.plan_run(conn, "bench_quality", f"{config.model_name}-search-{time.time_ns()}",
                             TrainingConfig.from_mapping(params))
    manifest.plan_shards(conn, search)
    log = logging.getLogger("bench.quality.search")
    for run_id in plan.plan_trials(conn, search.run_id, AUTHOR):
        try:
            launch_local.run_local(run_id, config.world_size, url, log, timeout_seconds=1800)
        except Exception as error:  # a failed trial does not fail the search
            print(f"  {run_id}: {error}".splitlines()[0], flush=True)
    result, choice = commit_search(conn, search.run_id, owner={"task_id": "bench_quality"})
    metrics = get_version(conn, result.model_name, result.version)["metrics"]
    chosen = next(t for t in trials.ledger(conn, search.run_id) if t["run_id"] == choice.run_id)
    return {f"{prefix}.search.{figure.removeprefix('test_')}": round(metrics[figure], 4),
            f"{prefix}.search.trials": len(trials.trial_runs(conn, search.run_id)),
            f"{prefix}.search.chosen": describe(chosen["params"]),
            f"{prefix}.search.figures_from": metrics["figures_from"],
            f"{prefix}.search.seconds": round(time.perf_counter() - started, 1)}
