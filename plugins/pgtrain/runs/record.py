"""The run record and everything written per run: manifest rows, metrics, staged parameters.

The SQL contract between the Airflow side and the trainer: both call these functions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgtrain.config.params import TrainingConfig
from pgtrain.core.errors import PgtrainError
from pgtrain.runs import versions


@dataclass(frozen=True)
class Run:
    run_id: str
    dag_id: str
    dag_run_id: str
    model_name: str
    config: TrainingConfig
    base_version: int | None
    input_dim: int | None
    num_classes: int | None  # classification only
    output_dim: int | None  # classes (classification) or target width (regression)
    status: str
    status_reason: str | None = None
    attempt: int = 0  # the latest train attempt (begin_attempt); the trainer's writes are fenced by it
    encoding: dict[str, Any] | None = None  # how raw columns become input (pgtrain.data.encoding); None: as they are
    # What the trainer records (rank 0): the state dict's layout, the version its weights started from, the
    # collectives backend, the kept parameters' figures on the test rows.
    model_layout: dict[str, Any] | None = None
    init_version: int | None = None
    backend: str | None = None
    test_metrics: dict[str, Any] | None = None


@dataclass(frozen=True)
class Shard:
    rank: int
    world_size: int
    key_lo: str
    key_hi: str
    row_count: int
    train_count: int
    val_count: int
    test_count: int = 0  # rows that choose nothing (the figures are read on them); 0 before the test part


def training_run_id(dag_id: str, dag_run_id: str) -> str:
    return f"{dag_id}/{dag_run_id}"


def plan_run(conn: psycopg.Connection, dag_id: str, dag_run_id: str, config: TrainingConfig, *,
             run_id: str | None = None) -> Run:
    """Create the run record for a DAG run, or return the existing one (a re-run reuses it).

    ``run_id``: the record's id when not ``<dag_id>/<dag_run_id>``: the one ``unused_run_id`` chose for a DAG run
    that reuses an earlier DAG run's id (a reset metadata database), bound to it before the record exists.
    """
    run_id = run_id or training_run_id(dag_id, dag_run_id)
    with conn.transaction():
        conn.execute(
            """INSERT INTO pgtrain.training_runs (run_id, dag_id, dag_run_id, model_name, config, base_version)
               VALUES (%(run_id)s, %(dag_id)s, %(dag_run_id)s, %(model)s, %(config)s, %(base)s)
               ON CONFLICT (run_id) DO NOTHING""",
            {"run_id": run_id, "dag_id": dag_id, "dag_run_id": dag_run_id, "model": config.model_name,
             "config": Jsonb(config.to_dict()), "base": versions.head_version(conn, config.model_name)},
        )
    run = get_run(conn, run_id)
    if (run.dag_id, run.dag_run_id) != (dag_id, dag_run_id):
        raise PgtrainError(f"training run {run_id!r} belongs to DAG run {run.dag_id}/{run.dag_run_id}, not to "
                           f"{dag_id}/{dag_run_id}")
    return run


def unused_run_id(conn: psycopg.Connection, dag_id: str, dag_run_id: str) -> str:
    """The first of ``<dag_id>/<dag_run_id>``, ``...#2``, ``...#3``, ... that no run record has: the id of a new
    DAG run's training run, chosen (and bound to the DAG run) before its record is created, so that a try killed
    in between plans the same run again rather than a second one."""
    base = training_run_id(dag_id, dag_run_id)
    taken = {row[0] for row in conn.execute(
        "SELECT run_id FROM pgtrain.training_runs WHERE dag_id = %s AND dag_run_id = %s", (dag_id, dag_run_id))}
    return next(candidate for n in itertools.count(1)
                if (candidate := base if n == 1 else f"{base}#{n}") not in taken)


def get_run(conn: psycopg.Connection, run_id: str) -> Run:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            """SELECT run_id, dag_id, dag_run_id, model_name, config, base_version, input_dim, num_classes, output_dim,
                      status, status_reason, attempt, encoding, model_layout, init_version, backend, test_metrics
               FROM pgtrain.training_runs WHERE run_id = %s""",
            (run_id,),
        ).fetchone()
    if row is None:
        raise PgtrainError(f"training run {run_id!r} does not exist; plan_run creates it")
    row["config"] = TrainingConfig.from_mapping(row["config"])
    return Run(**row)


def recorded_runs(conn: psycopg.Connection, run_ids: Iterable[str | None]) -> dict[str, dict[str, Any]]:
    """Runs as recorded, for display (the config snapshot as it was written, no default filled in): run_id ->
    {run_id, dag_id, dag_run_id, config, input_dim, num_classes}. Ids of no run (None, or deleted) are left out."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            """SELECT run_id, dag_id, dag_run_id, config, input_dim, num_classes
               FROM pgtrain.training_runs WHERE run_id = ANY(%s)""",
            ([run_id for run_id in run_ids if run_id is not None],),
        ).fetchall()
    return {row["run_id"]: row for row in rows}


def latest_run_id(conn: psycopg.Connection) -> str | None:
    """The most recently planned run; a search's, never one of its trials (planned after it, part of it)."""
    row = conn.execute(
        """SELECT run_id FROM pgtrain.training_runs r
           WHERE NOT EXISTS (SELECT FROM pgtrain.search_trials t WHERE t.run_id = r.run_id)
           ORDER BY created_at DESC LIMIT 1""").fetchone()
    return row[0] if row else None


def set_status(conn: psycopg.Connection, run_id: str, status: str, reason: str | None = None) -> None:
    """Record what became of the run; a no-op when nothing changes (so re-commits keep updated_at)."""
    with conn.transaction():
        conn.execute(
            """UPDATE pgtrain.training_runs SET status = %s, status_reason = %s, updated_at = now()
               WHERE run_id = %s AND (status IS DISTINCT FROM %s OR status_reason IS DISTINCT FROM %s)""",
            (status, reason, run_id, status, reason),
        )


def begin_attempt(conn: psycopg.Connection, run_id: str) -> int:
    """Start a new train attempt: returns its number. Writes of every older attempt are refused from now on
    (sql/007_verdicts.sql), and the run is 'training' until the attempt's trainer records its verdict."""
    with conn.transaction():
        row = conn.execute(
            """UPDATE pgtrain.training_runs
               SET attempt = attempt + 1, status = 'training', status_reason = NULL, updated_at = now()
               WHERE run_id = %s RETURNING attempt""",
            (run_id,),
        ).fetchone()
    if row is None:
        raise PgtrainError(f"training run {run_id!r} does not exist; plan_run creates it")
    return row[0]


def mark_training(conn: psycopg.Connection, run_id: str) -> None:
    """A trainer rank has started (always touches the row, so a stale attempt is refused right away).

    A verdict already recorded by a faster peer of the same attempt stays.
    """
    with conn.transaction():
        conn.execute(
            """UPDATE pgtrain.training_runs SET status = 'training', updated_at = now()
               WHERE run_id = %s AND status NOT IN ('refused', 'failed')""",
            (run_id,),
        )


def trainer_verdict(conn: psycopg.Connection, run_id: str, attempt: int | None = None) -> tuple[str, str] | None:
    """(status, reason) the trainer recorded when it stopped, 'refused' or 'failed', if it did (for ``attempt``,
    when given: begin_attempt clears an earlier attempt's verdict, and a later attempt's is not this one's)."""
    run = get_run(conn, run_id)
    if run.status in ("refused", "failed") and run.status_reason and attempt in (None, run.attempt):
        return run.status, run.status_reason
    return None


def record_verdict(conn: psycopg.Connection, run_id: str, status: str, reason: str) -> None:
    """The trainer's verdict before it exits: 'refused' (bad input) or 'failed' (a crash), with the reason.

    A refusal is the cause of the failures it makes in its peers (their collectives lose a rank), so
    'refused' replaces 'failed' but never the other way round; the first reason of each kind stays.
    """
    if status not in ("refused", "failed"):
        raise ValueError(f"a verdict is 'refused' or 'failed', not {status!r}")
    kept = ("refused",) if status == "refused" else ("refused", "failed")
    with conn.transaction():
        conn.execute(
            """UPDATE pgtrain.training_runs SET status = %s, status_reason = %s, updated_at = now()
               WHERE run_id = %s AND status <> ALL(%s)""",
            (status, reason, run_id, list(kept)),
        )


def save_summary(conn: psycopg.Connection, run_id: str, summary: dict[str, Any]) -> None:
    with conn.transaction():
        conn.execute("UPDATE pgtrain.training_runs SET summary = %s WHERE run_id = %s", (Jsonb(summary), run_id))


def write_manifest(conn: psycopg.Connection, run_id: str, shards: list[Shard], input_dim: int,
                   num_classes: int | None, output_dim: int | None = None,
                   encoding: dict[str, Any] | None = None) -> None:
    """Replace the run's manifest and its input encoding (``pgtrain.data.encoding``; same transaction as the
    caller's snapshot, if any). Raises PgtrainError for a plan that a search's trials read (sql/016_shared_plan.sql):
    it is never planned again under them."""
    try:
        conn.execute("DELETE FROM pgtrain.shard_manifest WHERE run_id = %s", (run_id,))
    except psycopg.errors.RestrictViolation as shared:
        raise PgtrainError(str(shared.diag.message_primary)) from None
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO pgtrain.shard_manifest
               (run_id, rank, world_size, key_lo, key_hi, row_count, train_count, val_count, test_count)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)""",
            [(run_id, s.rank, s.world_size, s.key_lo, s.key_hi, s.row_count, s.train_count, s.val_count,
              s.test_count)
             for s in shards],
        )
    conn.execute("UPDATE pgtrain.training_runs SET input_dim = %s, num_classes = %s, output_dim = %s, encoding = %s "
                 "WHERE run_id = %s", (input_dim, num_classes, output_dim or num_classes,
                                       Jsonb(encoding) if encoding is not None else None, run_id))
    set_status(conn, run_id, "sharded")


def plan_readers(conn: psycopg.Connection, run_id: str) -> list[str]:
    """The runs besides ``run_id`` that read its plan (a search's trials: sql/016_shared_plan.sql)."""
    return [row[0] for row in conn.execute(
        "SELECT run_id FROM pgtrain.training_runs WHERE plan_run = %s ORDER BY run_id", (run_id,))]


def get_manifest(conn: psycopg.Connection, run_id: str) -> list[Shard]:
    rows = conn.execute(
        """SELECT rank, world_size, key_lo, key_hi, row_count, train_count, val_count, test_count
           FROM pgtrain.shard_manifest WHERE run_id = pgtrain.plan_of(%s) ORDER BY rank""",
        (run_id,),
    ).fetchall()
    if not rows:
        raise PgtrainError(f"run {run_id!r} has no shard manifest; compute_shards writes it")
    return [Shard(*row) for row in rows]


def record_epoch(conn: psycopg.Connection, run_id: str, epoch: int, metrics: dict[str, Any]) -> None:
    """Store an epoch's metrics: the keys both tasks share in their columns, the whole dict in ``metrics``."""
    columns = {key: metrics.get(key) for key in _METRIC_COLUMNS}
    with conn.transaction():
        conn.execute(
            """INSERT INTO pgtrain.run_metrics
               (run_id, epoch, train_loss, train_accuracy, val_loss, val_accuracy, seconds, metrics)
               VALUES (%(run_id)s, %(epoch)s, %(train_loss)s, %(train_accuracy)s, %(val_loss)s,
                       %(val_accuracy)s, %(seconds)s, %(metrics)s)
               ON CONFLICT (run_id, epoch) DO UPDATE SET
                 train_loss = EXCLUDED.train_loss, train_accuracy = EXCLUDED.train_accuracy,
                 val_loss = EXCLUDED.val_loss, val_accuracy = EXCLUDED.val_accuracy,
                 seconds = EXCLUDED.seconds, metrics = EXCLUDED.metrics, recorded_at = now()""",
            {"run_id": run_id, "epoch": epoch, **columns, "metrics": Jsonb(json_safe(metrics))},
        )


def epoch_metrics(conn: psycopg.Connection, run_id: str) -> list[dict[str, Any]]:
    """Every epoch's metrics dict, oldest first: ``epoch``, the shared columns, and whatever else was recorded."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            """SELECT epoch, train_loss, train_accuracy, val_loss, val_accuracy, seconds, metrics
               FROM pgtrain.run_metrics WHERE run_id = %s ORDER BY epoch""",
            (run_id,),
        ).fetchall()
    return [_merged(row) for row in rows]


def seconds_since_last_epoch(conn: psycopg.Connection, run_id: str) -> float | None:
    """Seconds since the run's latest epoch was recorded, by the database's clock; None before its first."""
    row = conn.execute("SELECT extract(epoch FROM now() - max(recorded_at))::float8 FROM pgtrain.run_metrics "
                       "WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None or row[0] is None else max(0.0, float(row[0]))


def kept_epoch(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """The metrics of the epoch whose parameters the run staged: the best one (``best_epoch``, recorded while early
    stopping is on), else the last; {} without epochs."""
    if not epochs:
        return {}
    best = epochs[-1].get("best_epoch")
    return next((e for e in epochs if best is not None and e.get("epoch") == best), epochs[-1])


def _merged(row: dict[str, Any]) -> dict[str, Any]:
    """The JSON copy, overlaid with the columns that hold a value: they keep non-finite values JSON cannot hold.
    A column that is NULL and absent from the JSON does not apply to the task (val_accuracy of a regression)."""
    recorded = row.pop("metrics") or {}
    return {**recorded, **{k: v for k, v in row.items() if v is not None or k in recorded}}


def set_model_layout(conn: psycopg.Connection, run_id: str, layout: dict[str, dict[str, Any]]) -> None:
    """Record the run's state-dict layout ``{name: {"shape": [...], "dtype": "float32"}}`` (rank 0, before training)."""
    with conn.transaction():
        conn.execute("UPDATE pgtrain.training_runs SET model_layout = %s, updated_at = now() WHERE run_id = %s",
                     (Jsonb(layout), run_id))


def set_backend(conn: psycopg.Connection, run_id: str, backend: str) -> None:
    """Record the collectives backend the run's ranks train with (rank 0, once they have started)."""
    with conn.transaction():
        conn.execute("UPDATE pgtrain.training_runs SET backend = %s, updated_at = now() WHERE run_id = %s",
                     (backend, run_id))


def set_init_version(conn: psycopg.Connection, run_id: str, version: int | None) -> None:
    """Record the model version the run's weights started from (None: from scratch)."""
    with conn.transaction():
        conn.execute("UPDATE pgtrain.training_runs SET init_version = %s, updated_at = now() WHERE run_id = %s",
                     (version, run_id))


def set_test_metrics(conn: psycopg.Connection, run_id: str, metrics: dict[str, Any]) -> None:
    """Record the kept parameters' figures on the test rows (rank 0, once, before staging them)."""
    with conn.transaction():
        conn.execute("UPDATE pgtrain.training_runs SET test_metrics = %s, updated_at = now() WHERE run_id = %s",
                     (Jsonb(json_safe(metrics)), run_id))


_METRIC_COLUMNS = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "seconds")


def json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinities as null: JSON has no spelling for them (the typed columns keep them)."""
    return {key: None if isinstance(value, float) and not math.isfinite(value) else value
            for key, value in metrics.items()}


def delete_epoch_metrics(conn: psycopg.Connection, run_id: str) -> None:
    """Forget the epochs an earlier attempt of this run recorded (pgtrain.launch.attempt.start_attempt)."""
    conn.execute("DELETE FROM pgtrain.run_metrics WHERE run_id = %s", (run_id,))


def outcome(conn: psycopg.Connection, run_id: str) -> str:
    """What became of the run, in one line (the DAG run's note): the version committed and its validation
    metric, or why not; and what happened to the model's head. Only this run's own commit says the head moved
    to its version (``model_head_history``); a head another run moved meanwhile is said to be that."""
    row = conn.execute("SELECT model_name, status, status_reason, base_version FROM pgtrain.training_runs "
                       "WHERE run_id = %s", (run_id,)).fetchone()
    if row is None:
        raise PgtrainError(f"training run {run_id!r} does not exist; plan_run creates it")
    model, status, reason, before = row
    committed, after = versions.of_run(conn, run_id), versions.head_version(conn, model)
    head = (f"head stays {_v(after)}" if before == after
            else f"head {_v(before)} -> {_v(after)} (moved by another run)")
    if committed is not None:
        version, metrics = committed.version, committed.metrics or {}
        metric = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("val_accuracy", "val_rmse", "val_loss")
                           if isinstance(metrics.get(k), int | float))[:80] or "no validation metric"
        if committed.head_moved:
            later = "" if after == version else f" (since moved to {_v(after)})"
            return f"{model} v{version} committed: {metric}; head {_v(committed.previous_version)} -> v{version}{later}"
        why = reason or "promote it to make it the head"
        return f"{model} v{version} committed, not made the head: {why}; {metric}; {head}"
    return f"{model}: {status}" + (f": {reason}" if reason else "") + f"; {head}"


def _v(version: int | None) -> str:
    return "none" if version is None else f"v{version}"
