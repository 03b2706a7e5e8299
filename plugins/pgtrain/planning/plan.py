"""Planning a training run, as plain functions: what the DAG's ``plan_run`` and ``compute_shards`` tasks do, and
what the tests' helper and the benchmarks call to plan a run the same way (no Airflow here).

``admit_run``: the run checked against the author's settings (ownership, the launcher's capacity, the allow-lists),
a scheduled run of an unchanged source skipped, the run recorded, its data identity checked. ``plan_shards_checked``:
the source's rows checked and cut into shards, refusals recorded with the run. ``plan_training``: both, for a run
triggered by hand. ``plan_trials``: a search's trials over the planned run's plan (the DAG's ``plan_trials`` task).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgtrain.config.params import CATEGORY_STORAGE, QUALITY_GATE, TrainingConfig, unknown_keys
from pgtrain.config.search import MAX_TRIALS, SearchLimits, plan_search
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import ConfigError, PgtrainError
from pgtrain.data import freshness, manifest, policy
from pgtrain.launch import capacity
from pgtrain.runs import record, trials
from pgtrain.store import identity


@dataclass(frozen=True)
class Skip:
    """A scheduled run that does not train: its source is as the head version saw it (``reason`` says how)."""

    model_name: str
    reason: str


def requested_config(conf: Mapping[str, Any], params: Mapping[str, Any], fixed: Mapping[str, Any]) -> TrainingConfig:
    """The run's config from its params, with the author's ``fixed`` ones over them. A conf key that is not a param
    of the DAG (or one the author fixed) is a ConfigError naming the closest param."""
    problems = unknown_keys(dict(conf))
    problems += [f"{key!r} is fixed by the DAG's author (the models file's entry, or the settings file), not a "
                 "param of this DAG" for key in sorted(set(conf) & set(fixed))]
    if problems:
        raise ConfigError("the run's conf has keys this DAG does not define: " + "; ".join(problems))
    return TrainingConfig.from_mapping({**dict(params), **dict(fixed)})


def admit_run(conn: psycopg.Connection, config: TrainingConfig, author: AuthorSettings, dag_id: str,
              dag_run_id: str, *, run_type: str = "manual", models_file: str | None = None,
              run_id: Callable[[psycopg.Connection], str] | None = None) -> record.Run | Skip:
    """Admit the run and record it, or say why a scheduled run skips. ``models_file``: the generic DAG's, whose
    models it may not train (they belong to their own DAGs). ``run_id``: the id of the run's record, chosen on
    ``conn`` (the DAG task binds it to its DAG run); by default ``<dag_id>/<dag_run_id>``.

    Raises a PgtrainError (nothing recorded) for a run the author's settings or the launcher refuse; a run whose
    data identity differs from its base version's is recorded 'refused' (``store.identity.check_run``)."""
    if models_file is not None:
        from pgtrain.config.model_entries import model_owners

        policy.check_unowned(config.model_name, model_owners(default=models_file))
    capacity.check_launch(config, author)
    config = policy.admit(conn, config, author)
    skip = freshness.skip_reason(conn, config, run_type)
    if skip:
        return Skip(config.model_name, skip)
    run = record.plan_run(conn, dag_id, dag_run_id, config, run_id=None if run_id is None else run_id(conn))
    identity.check_run(conn, run)
    return run


def plan_shards_checked(conn: psycopg.Connection, run_id: str, author: AuthorSettings) -> manifest.Plan:
    """Plan the run's shards (``data.manifest.plan_shards``) after checking it against the author's settings again
    (they may have changed since the run was recorded), and the mlp it makes against this worker's memory. A
    refusal is recorded with the run ('refused', with the reason; not left 'planned') and raised. A run whose plan a
    search's trials read is refused before anything is scanned, its status left as it is."""
    run = record.get_run(conn, run_id)
    readers = record.plan_readers(conn, run_id)
    if readers:  # a retried or cleared compute_shards of a search: its run's verdict stands, nothing is scanned
        raise PgtrainError(f"run {run_id} is planned already and its plan is read by {len(readers)} trial(s) of its "
                           f"search ({readers[0]}, ...): it is never planned again; start a new DAG run to plan anew")
    try:
        policy.check_run(conn, run.config, author)
        plan = manifest.plan_shards(conn, run)
        capacity.check_model_size(run.config, plan.input_dim, plan.output_dim,
                                  record.get_run(conn, run_id).encoding)
    except PgtrainError as refused:
        record.set_status(conn, run_id, "refused", str(refused))
        raise
    return plan


def plan_training(conn: psycopg.Connection, config: TrainingConfig, dag_id: str, dag_run_id: str,
                  author: AuthorSettings | None = None) -> record.Run:
    """A run triggered by hand, planned as the DAG's plan_run and compute_shards do: the run with its dimensions.
    ``author``: the DAG's settings; None: ``author_admitting`` the config (tests, benchmarks)."""
    author = author or author_admitting(conn, config)
    run = admit_run(conn, config, author, dag_id, dag_run_id)
    assert isinstance(run, record.Run)  # only a scheduled run skips
    plan_shards_checked(conn, run.run_id, author)
    return record.get_run(conn, run.run_id)


def author_admitting(conn: psycopg.Connection, config: TrainingConfig) -> AuthorSettings:
    """The author's settings that admit ``config`` as it is: its source (as the catalog resolves it now), its models
    (a search's too) and search, its quality gate, category rules and threads. For planning a run outside a DAG
    (tests, benchmarks), where whoever wrote the config is its author; capacity still applies."""
    relation = policy.resolve_relation(conn, config.source_table)
    source = config.source_table if relation is None else sql.Identifier(*relation).as_string(conn)
    models = [config.model, *(c["model"] for c in (config.search or {}).get("candidates", ()))]
    return AuthorSettings(
        allowed_sources=(source,), allowed_models=tuple(dict.fromkeys(models)),
        search_limits=None if config.search is None else {"max_trials": MAX_TRIALS},
        quality_gate={name: getattr(config, name) for name in QUALITY_GATE},
        categories={name: getattr(config, name)
                    for name in ("max_categories", "min_category_count", *CATEGORY_STORAGE)},
        intra_op_threads=config.intra_op_threads)


def plan_trials(conn: psycopg.Connection, run_id: str, author: AuthorSettings) -> list[str]:
    """The runs the train task is mapped over: the run itself when it has no search, else its trials (checked
    against the author's caps, then created) that fit in this worker's memory. A trial too big to train here is
    recorded 'refused' with the reason and not trained; the search goes on with the others. A search the author
    does not allow, a bad one, or one no trial of which fits, marks the run 'refused' with the reason and raises
    ConfigError: nothing has trained."""
    run = record.get_run(conn, run_id)
    if run.config.search is None:
        return [run_id]
    try:
        search = plan_search(run.config.search, run.config.to_dict(), SearchLimits.from_dict(author.search_limits),
                             author.allowed_models)
        runs = [r for r in trials.create_trials(conn, run_id, search) if _trial_fits(conn, r)]
        if not runs:
            raise ConfigError(f"search {run_id}: no trial fits in this worker's memory (each trial's reason is its "
                              "run's status): ask for smaller models or launcher=kubernetes")
    except ConfigError as refused:
        record.set_status(conn, run_id, "refused", str(refused))
        raise
    return runs


def _trial_fits(conn: psycopg.Connection, run_id: str) -> bool:
    """Whether the trial's model fits in this worker's memory (``capacity.check_model_size``, as plan_run checks a
    run's); one that does not is recorded 'refused' with the reason. A trial that has trained already is kept."""
    trial = record.get_run(conn, run_id)
    if trial.status in ("trained", "committed"):
        return True
    try:
        capacity.check_model_size(trial.config, trial.input_dim or 0, trial.output_dim or 1, trial.encoding)
    except ConfigError as refused:
        record.set_status(conn, run_id, "refused", f"not trained: {refused}")
        return False
    return True
