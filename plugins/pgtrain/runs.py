"""The run record and everything written per run: manifest rows, metrics, staged parameters.

The SQL contract between the Airflow side and the trainer: both call these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgtrain import tensors
from pgtrain.config import TrainingConfig
from pgtrain.errors import PgtrainError


@dataclass(frozen=True)
class Run:
    run_id: str
    dag_id: str
    dag_run_id: str
    model_name: str
    config: TrainingConfig
    base_version: int | None
    input_dim: int | None
    num_classes: int | None
    status: str


@dataclass(frozen=True)
class Shard:
    rank: int
    world_size: int
    key_lo: str
    key_hi: str
    row_count: int
    train_count: int
    val_count: int


def training_run_id(dag_id: str, dag_run_id: str) -> str:
    return f"{dag_id}/{dag_run_id}"


def plan_run(conn: psycopg.Connection, dag_id: str, dag_run_id: str, config: TrainingConfig) -> Run:
    """Create the run record for a DAG run, or return the existing one (a re-run reuses it)."""
    run_id = training_run_id(dag_id, dag_run_id)
    with conn.transaction():
        conn.execute(
            """INSERT INTO pgtrain.training_runs (run_id, dag_id, dag_run_id, model_name, config, base_version)
               SELECT %(run_id)s, %(dag_id)s, %(dag_run_id)s, %(model)s, %(config)s,
                      (SELECT version FROM pgtrain.model_heads WHERE model_name = %(model)s)
               ON CONFLICT (run_id) DO NOTHING""",
            {"run_id": run_id, "dag_id": dag_id, "dag_run_id": dag_run_id,
             "model": config.model_name, "config": Jsonb(config.to_dict())},
        )
    return get_run(conn, run_id)


def get_run(conn: psycopg.Connection, run_id: str) -> Run:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            """SELECT run_id, dag_id, dag_run_id, model_name, config, base_version, input_dim, num_classes, status
               FROM pgtrain.training_runs WHERE run_id = %s""",
            (run_id,),
        ).fetchone()
    if row is None:
        raise PgtrainError(f"training run {run_id!r} does not exist; plan_run creates it")
    row["config"] = TrainingConfig.from_mapping(row["config"])
    return Run(**row)


def set_status(conn: psycopg.Connection, run_id: str, status: str, reason: str | None = None) -> None:
    """Record what became of the run; a no-op when nothing changes (so re-commits keep updated_at)."""
    with conn.transaction():
        conn.execute(
            """UPDATE pgtrain.training_runs SET status = %s, status_reason = %s, updated_at = now()
               WHERE run_id = %s AND (status IS DISTINCT FROM %s OR status_reason IS DISTINCT FROM %s)""",
            (status, reason, run_id, status, reason),
        )


def save_summary(conn: psycopg.Connection, run_id: str, summary: dict[str, Any]) -> None:
    with conn.transaction():
        conn.execute("UPDATE pgtrain.training_runs SET summary = %s WHERE run_id = %s", (Jsonb(summary), run_id))


def write_manifest(conn: psycopg.Connection, run_id: str, shards: list[Shard], input_dim: int,
                   num_classes: int) -> None:
    """Replace the run's manifest (same transaction as the caller's snapshot, if any)."""
    conn.execute("DELETE FROM pgtrain.shard_manifest WHERE run_id = %s", (run_id,))
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO pgtrain.shard_manifest
               (run_id, rank, world_size, key_lo, key_hi, row_count, train_count, val_count)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""",
            [(run_id, s.rank, s.world_size, s.key_lo, s.key_hi, s.row_count, s.train_count, s.val_count)
             for s in shards],
        )
    conn.execute("UPDATE pgtrain.training_runs SET input_dim = %s, num_classes = %s WHERE run_id = %s",
                 (input_dim, num_classes, run_id))
    set_status(conn, run_id, "sharded")


def get_manifest(conn: psycopg.Connection, run_id: str) -> list[Shard]:
    rows = conn.execute(
        """SELECT rank, world_size, key_lo, key_hi, row_count, train_count, val_count
           FROM pgtrain.shard_manifest WHERE run_id = %s ORDER BY rank""",
        (run_id,),
    ).fetchall()
    if not rows:
        raise PgtrainError(f"run {run_id!r} has no shard manifest; compute_shards writes it")
    return [Shard(*row) for row in rows]


def record_epoch(conn: psycopg.Connection, run_id: str, epoch: int, metrics: dict[str, float]) -> None:
    with conn.transaction():
        conn.execute(
            """INSERT INTO pgtrain.run_metrics
               (run_id, epoch, train_loss, train_accuracy, val_loss, val_accuracy, seconds)
               VALUES (%(run_id)s, %(epoch)s, %(train_loss)s, %(train_accuracy)s, %(val_loss)s,
                       %(val_accuracy)s, %(seconds)s)
               ON CONFLICT (run_id, epoch) DO UPDATE SET
                 train_loss = EXCLUDED.train_loss, train_accuracy = EXCLUDED.train_accuracy,
                 val_loss = EXCLUDED.val_loss, val_accuracy = EXCLUDED.val_accuracy,
                 seconds = EXCLUDED.seconds, recorded_at = now()""",
            {"run_id": run_id, "epoch": epoch, **metrics},
        )


def epoch_metrics(conn: psycopg.Connection, run_id: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT epoch, train_loss, train_accuracy, val_loss, val_accuracy, seconds
               FROM pgtrain.run_metrics WHERE run_id = %s ORDER BY epoch""",
            (run_id,),
        ).fetchall()


def clear_training_output(conn: psycopg.Connection, run_id: str) -> None:
    """Forget metrics and staged parameters of an earlier attempt of this run."""
    with conn.transaction():
        conn.execute("DELETE FROM pgtrain.run_metrics WHERE run_id = %s", (run_id,))
        tensors.delete_staged(conn, run_id)
