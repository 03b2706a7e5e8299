"""A model name is bound to what it learns from: its *data identity*, the source table, key, target, task and input
columns (in order) of its head version. A version's input record holds these facts (``pgtrain.data.input_record``),
so a head's identity is read from there; a run's is resolved in the catalog before it is planned (no row is read).

Two checks, the same comparison (``differences``): ``check_run`` refuses a run of other data in plan_run, before
anything is planned, and the commit (``pgtrain.store.model_store.commit_run``) never moves the head to a version of
other data (the head may have moved since planning). The DAG's author may allow a model to move to other data:
``quality_gate: {allow_retarget: true}`` in the settings file or the model's entry, kept in the run's config
snapshot like the rest of the gate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from pgtrain.config.params import TrainingConfig
from pgtrain.core.errors import ConfigError, SourceError
from pgtrain.data import input_record
from pgtrain.data.source.resolve import COLUMNS, source_from_config
from pgtrain.data.upgrade import current_record
from pgtrain.runs import versions
from pgtrain.runs.record import Run, set_status

# The facts of a data identity: (the version spec's key, how a message names it).
FACTS = (("source_table", "source"), ("key_column", "key"), ("target_column", "target"), ("task", "task"),
         ("feature_columns", "input columns"))
SHOWN_COLUMNS = 8  # input columns a message lists before "... (N columns)"
RETARGET_HINT = ("quality_gate: {allow_retarget: true} in the pgtrain settings file, or in the model's entry of the "
                 "models file")


def of_run(conn: psycopg.Connection, config: TrainingConfig) -> dict[str, Any] | None:
    """The data identity a run of ``config`` will record in its input record (its input columns as the catalog
    resolves them now, ``"*"`` included); None when its source does not resolve (compute_shards says why)."""
    try:
        source = source_from_config(conn, config)
    except SourceError:
        return None
    columns = list(source.column_names) if source.feature_format == COLUMNS else [source.features_column]
    return {"source_table": config.source_table, "key_column": config.key_column,
            "target_column": config.label_column, "task": config.task, "feature_columns": columns}


def of_version(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A version's data identity: that of its input record (``input_record.of_version``)."""
    return input_record.of_version(spec).identity()


def differences(conn: psycopg.Connection, head: Mapping[str, Any], run: Mapping[str, Any]) -> list[str]:
    """What of ``run``'s identity (``of_version`` or ``of_run``) differs from ``head``'s (``of_version``), one phrase
    per fact. A fact the head does not record (a version from before it was) is not compared. Tables are compared as
    the catalog resolves them (a table renamed since is the same table), by name when one no longer resolves."""
    found = []
    for key, label in FACTS:
        was, now = head.get(key), run.get(key)
        if was is None or was == now:
            continue
        if key == "source_table" and _same_relation(conn, was, now):
            continue
        if key == "feature_columns":
            found.append(f"input columns {_columns_change(list(was), list(now or ()))}")
        else:
            shown = str if key == "source_table" else repr  # a pinned name is quoted already
            found.append(f"{label} {shown(now)} (the head's: {shown(was)})")
    return found


def describe(facts: Mapping[str, Any]) -> str:
    """A data identity (``of_version``) in words: its table, key, target, task and input columns."""
    return (f"{facts.get('source_table')} (key {facts.get('key_column')!r}, target {facts.get('target_column')!r}, "
            f"{facts.get('task')}, input columns {_shown(facts.get('feature_columns') or ())})")


def check_run(conn: psycopg.Connection, run: Run) -> None:
    """plan_run: refuse a run whose data identity differs from its base version's (the head when the run was
    recorded), unless the author allows re-targeting: the run is recorded 'refused' with the reason, and
    ConfigError raised with it. Nothing is planned."""
    if run.base_version is None or run.config.allow_retarget:
        return
    stored = versions.spec(conn, run.model_name, run.base_version)
    identity = of_run(conn, run.config) if stored else None
    head = of_version(current_record(stored)) if identity is not None else {}
    found = differences(conn, head, identity) if identity is not None else []
    if not found:
        return
    reason = (f"model {run.model_name!r} is bound to the data its head version {run.base_version} learned from: "
              f"{describe(head)}; this run has {'; '.join(found)}. Choose another model_name for a model of this "
              f"data, or ask the DAG's author to allow re-targeting the model ({RETARGET_HINT})")
    set_status(conn, run.run_id, "refused", reason)
    raise ConfigError(reason)


def _same_relation(conn: psycopg.Connection, was: str, now: str | None) -> bool:
    if now is None:
        return False
    try:
        with conn.transaction():  # a savepoint: a name that no longer parses must not abort a commit
            same = conn.execute("SELECT to_regclass(%s) = to_regclass(%s)", (was, now)).fetchone()[0]
    except (psycopg.OperationalError, psycopg.InterfaceError):
        raise  # the connection, not the name
    except psycopg.Error:
        return False  # a name that no longer parses: not the same as one that does
    return bool(same)


def _columns_change(was: Sequence[str], now: Sequence[str]) -> str:
    added, removed = [c for c in now if c not in was], [c for c in was if c not in now]
    parts = ([f"{_shown(added)} that the head's lacks"] if added else []) + (
        [f"without the head's {_shown(removed)}"] if removed else [])
    return ", ".join(parts) if parts else f"in another order: {_shown(now)} (the head's: {_shown(was)})"


def _shown(columns: Sequence[str]) -> str:
    names = ", ".join(map(repr, columns[:SHOWN_COLUMNS]))
    return names + (f", ... ({len(columns)} columns)" if len(columns) > SHOWN_COLUMNS else "")
