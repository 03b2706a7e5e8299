"""Versioned model store and small-parameter store, every write fenced by a lock lease.

A model version is immutable: its tensors, metrics, the run that produced it and the fencing token
that committed it. ``pgtrain.model_heads`` points at the version in use. Committing a run and moving
a head happen under the model's lock (``model:<name>``) in one transaction guarded by :func:`fenced`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgtrain.errors import CommitRejected, PgtrainError, StaleLockToken
from pgtrain.locks import DEFAULT_TTL, Lease, LockManager, fenced
from pgtrain.model_spec import ModelSpec
from pgtrain.runs import Run, epoch_metrics, get_run, set_status
from pgtrain.tensors import from_rows, read_staged, to_rows

MODEL_DTYPE = "float32"


@dataclass(frozen=True)
class CommitResult:
    model_name: str
    version: int
    created: bool  # False: the run had already been committed, this is its version
    fencing_token: int
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HeadMove:
    model_name: str
    version: int
    previous_version: int | None
    fencing_token: int


def model_lock_name(model_name: str) -> str:
    return f"model:{model_name}"


def model_spec_for(run: Run) -> ModelSpec:
    if run.input_dim is None or run.num_classes is None:
        raise CommitRejected(f"run {run.run_id!r} has no input_dim/num_classes: compute_shards has not run for it")
    return ModelSpec(run.input_dim, tuple(run.config.hidden_sizes), run.num_classes)


def check_parameters(arrays: Mapping[str, np.ndarray], spec: ModelSpec) -> list[str]:
    """Everything wrong with ``arrays`` as parameters of ``spec``: missing, extra, shape, dtype, non-finite."""
    expected = spec.parameter_shapes()
    problems = [f"missing tensor {name} {list(shape)}" for name, shape in expected.items() if name not in arrays]
    problems += [f"unexpected tensor {name}" for name in arrays if name not in expected]
    for name, array in arrays.items():
        if name not in expected:
            continue
        if tuple(array.shape) != expected[name]:
            problems.append(f"{name} has shape {list(array.shape)}, the model needs {list(expected[name])}")
        if array.dtype.name != MODEL_DTYPE:
            problems.append(f"{name} has dtype {array.dtype.name}, the model needs {MODEL_DTYPE}")
        elif not np.isfinite(array).all():
            problems.append(f"{name} has {int((~np.isfinite(array)).sum())} non-finite values")
    return problems


def commit_run(conn: psycopg.Connection, run_id: str, owner: Mapping[str, Any] | None = None,
               lock_timeout: float = 60.0, ttl: float = DEFAULT_TTL) -> CommitResult:
    """Make the run's staged parameters the next version of its model and move the head to it.

    Idempotent: a run already committed returns its version with ``created=False``. Incomplete,
    non-finite or wrongly shaped parameters, or a failed quality gate, mark the run 'rejected'
    (with the reason) and raise CommitRejected; the head is left alone. Raises LockTimeout when the
    model's lock cannot be taken within ``lock_timeout`` seconds.
    """
    _require_no_transaction(conn, "commit_run")
    with conn.transaction():
        run = get_run(conn, run_id)
        existing = _version_of_run(conn, run_id)
    if existing is not None:
        set_status(conn, run_id, "committed")
        return existing

    try:
        spec = model_spec_for(run)
        with conn.transaction():
            arrays = read_staged(conn, run_id)
            epochs = epoch_metrics(conn, run_id)
        if not arrays:
            raise CommitRejected(f"run {run_id!r} has no staged parameters: the train task did not write them")
        problems = check_parameters(arrays, spec)
        if problems:
            raise CommitRejected(f"staged parameters of run {run_id!r} do not fit the model "
                                 f"{spec.layer_dims()}: " + "; ".join(problems))
    except CommitRejected as rejected:
        set_status(conn, run_id, "rejected", str(rejected))
        raise
    metrics = version_metrics(epochs, arrays)

    rejection: str | None = None
    with LockManager(conn, ttl=ttl, owner=owner) as locks, \
            locks.lock(model_lock_name(run.model_name), timeout=lock_timeout) as lease, fenced(conn, lease):
        existing = _version_of_run(conn, run_id)  # a concurrent commit of this same run got here first
        if existing is not None:
            set_status(conn, run_id, "committed", None)
            return existing
        head = _head_for_update(conn, run.model_name)
        rejection = quality_gate(run.config.max_accuracy_drop, metrics, head)
        if rejection is not None:
            set_status(conn, run_id, "rejected", rejection)
        else:
            version = _write_version(conn, run.model_name, run_id, lease, metrics, arrays)
            _move_head(conn, run.model_name, version, head, lease, "commit")
            set_status(conn, run_id, "committed", None)
    if rejection is not None:
        raise CommitRejected(rejection)
    return CommitResult(run.model_name, version, True, lease.token, metrics)


def version_metrics(epochs: list[dict[str, Any]], arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The last epoch's figures, plus epochs, total training seconds and parameter count."""
    metrics: dict[str, Any] = {}
    if epochs:
        last = epochs[-1]
        metrics.update({k: _finite_or_none(v) for k, v in last.items() if k != "seconds"})
        metrics["epochs"] = len(epochs)
        metrics["training_seconds"] = _finite_or_none(sum(e["seconds"] for e in epochs))
    metrics["parameter_count"] = int(sum(a.size for a in arrays.values()))
    return metrics


def quality_gate(max_drop: float | None, metrics: Mapping[str, Any], head: dict[str, Any] | None) -> str | None:
    """None when the run may become the head, else the reason it may not."""
    if max_drop is None or head is None:
        return None
    head_accuracy = head["metrics"].get("val_accuracy")
    if head_accuracy is None:
        return None
    accuracy = metrics.get("val_accuracy")
    if accuracy is None:
        return (f"quality gate: the run has no validation accuracy to compare with head version "
                f"{head['version']} ({head_accuracy:.4f}); train with validation_fraction > 0")
    if accuracy < head_accuracy - max_drop - 1e-12:
        return (f"quality gate: validation accuracy {accuracy:.4f} is more than max_accuracy_drop={max_drop:g} "
                f"below head version {head['version']} ({head_accuracy:.4f}); the head stays at version "
                f"{head['version']}")
    return None


# -- reading the store ----------------------------------------------------------------------------------
def head_version(conn: psycopg.Connection, model_name: str) -> int | None:
    """The version the model's head points at, or None (no head yet)."""
    with conn.transaction():
        row = conn.execute("SELECT version FROM pgtrain.model_heads WHERE model_name = %s", (model_name,)).fetchone()
    return row[0] if row else None


def list_versions(conn: psycopg.Connection, model_name: str | None = None) -> list[dict[str, Any]]:
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT v.model_name, v.version, v.run_id, v.fencing_token, v.metrics, v.created_at,
                      h.version IS NOT NULL AS is_head
               FROM pgtrain.model_versions v
               LEFT JOIN pgtrain.model_heads h ON h.model_name = v.model_name AND h.version = v.version
               WHERE %(model)s::text IS NULL OR v.model_name = %(model)s
               ORDER BY v.model_name, v.version""",
            {"model": model_name},
        ).fetchall()


def get_version(conn: psycopg.Connection, model_name: str, version: int | None = None) -> dict[str, Any]:
    """One version (the head when ``version`` is None) with its run, spec and tensor list."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        if version is None:
            version = head_version(conn, model_name)
        row = cur.execute(
            """SELECT v.model_name, v.version, v.run_id, v.fencing_token, v.metrics, v.created_at,
                      h.version IS NOT NULL AS is_head, r.dag_id, r.dag_run_id, r.input_dim, r.num_classes,
                      r.config -> 'hidden_sizes' AS hidden_sizes
               FROM pgtrain.model_versions v
               LEFT JOIN pgtrain.model_heads h ON h.model_name = v.model_name AND h.version = v.version
               LEFT JOIN pgtrain.training_runs r ON r.run_id = v.run_id
               WHERE v.model_name = %s AND v.version = %s""",
            (model_name, version),
        ).fetchone()
        if row is None:
            raise PgtrainError(_no_version(conn, model_name, version))
        row["tensors"] = cur.execute(
            """SELECT name, shape, dtype FROM pgtrain.model_tensors
               WHERE model_name = %s AND version = %s ORDER BY name""",
            (model_name, row["version"]),
        ).fetchall()
    return row


def load_tensors(conn: psycopg.Connection, model_name: str, version: int | None = None
                 ) -> tuple[int, dict[str, np.ndarray]]:
    """(version, name -> array) of a version, the head when ``version`` is None, read in one snapshot."""
    with conn.transaction():
        if version is None:
            version = head_version(conn, model_name)
        rows = conn.execute(
            """SELECT t.version, t.name, t.shape, t.dtype, t.data FROM pgtrain.model_tensors t
               WHERE t.model_name = %s AND t.version = %s ORDER BY t.name""",
            (model_name, version),
        ).fetchall()
        if not rows:
            raise PgtrainError(_no_version(conn, model_name, version))
    return rows[0][0], from_rows(row[1:] for row in rows)


def export_state_dict(conn: psycopg.Connection, model_name: str, version: int | None, path: Path | str) -> int:
    """``torch.save`` the version's state dict (loads into ``trainer.model.MLP``); returns the version."""
    import torch  # only exporting needs torch

    version, arrays = load_tensors(conn, model_name, version)
    # from_rows gives read-only little-endian views; torch wants writable, native-order arrays.
    state = {name: torch.from_numpy(np.array(array, dtype=array.dtype.newbyteorder("=")))
             for name, array in arrays.items()}
    torch.save(state, Path(path))
    return version


# -- moving the head by hand ------------------------------------------------------------------------------
def promote(conn: psycopg.Connection, model_name: str, version: int, owner: Mapping[str, Any] | None = None,
            lock_timeout: float = 60.0, ttl: float = DEFAULT_TTL) -> HeadMove:
    """Point the head at an existing version (promote a newer one or roll back to an older one), under the lock."""
    _require_no_transaction(conn, "promote")
    with LockManager(conn, ttl=ttl, owner=owner) as locks, \
            locks.lock(model_lock_name(model_name), timeout=lock_timeout) as lease, fenced(conn, lease):
        exists = conn.execute("SELECT 1 FROM pgtrain.model_versions WHERE model_name = %s AND version = %s",
                              (model_name, version)).fetchone()
        if not exists:
            raise PgtrainError(_no_version(conn, model_name, version))
        head = _head_for_update(conn, model_name)
        _move_head(conn, model_name, version, head, lease, "promote")
    return HeadMove(model_name, version, head["version"] if head else None, lease.token)


def head_history(conn: psycopg.Connection, model_name: str) -> list[dict[str, Any]]:
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT version, previous_version, fencing_token, action, owner, moved_at
               FROM pgtrain.model_head_history WHERE model_name = %s ORDER BY id""",
            (model_name,),
        ).fetchall()


# -- small named parameters -----------------------------------------------------------------------------
def get_parameter(conn: psycopg.Connection, name: str, default: Any = None) -> Any:
    """The current value of parameter ``name`` (any JSON value), or ``default`` when it was never written."""
    found = read_parameter(conn, name)
    return default if found is None else found[0]


def read_parameter(conn: psycopg.Connection, name: str) -> tuple[Any, int] | None:
    """(value, version) of parameter ``name``, or None."""
    with conn.transaction():
        row = conn.execute("SELECT value, version FROM pgtrain.parameters WHERE name = %s", (name,)).fetchone()
    return None if row is None else (row[0], row[1])


def update_parameter(conn: psycopg.Connection, name: str, value: Any, lease: Lease) -> int:
    """Write a new version of parameter ``name`` under ``lease``; returns the version written.

    Refused with StaleLockToken when the lease is no longer current, or when the parameter was
    already written with a newer token. Guard one parameter with one lock.
    """
    with fenced(conn, lease):
        row = conn.execute(
            """INSERT INTO pgtrain.parameters AS p (name, value, version, fencing_token, lock_name)
               VALUES (%(name)s, %(value)s, 1, %(token)s, %(lock)s)
               ON CONFLICT (name) DO UPDATE
                  SET value = EXCLUDED.value, version = p.version + 1, fencing_token = EXCLUDED.fencing_token,
                      lock_name = EXCLUDED.lock_name, updated_at = now()
                  WHERE p.fencing_token <= EXCLUDED.fencing_token
               RETURNING version""",
            {"name": name, "value": Jsonb(value), "token": lease.token, "lock": lease.name},
        ).fetchone()
        if row is None:
            newest = conn.execute("SELECT fencing_token FROM pgtrain.parameters WHERE name = %s", (name,)).fetchone()
            raise StaleLockToken(f"write to parameter {name!r} refused: it was written with token {newest[0]}, "
                                 f"newer than yours ({lease.token})")
        conn.execute(
            """INSERT INTO pgtrain.parameter_history (name, version, value, fencing_token)
               VALUES (%s, %s, %s, %s)""",
            (name, row[0], Jsonb(value), lease.token),
        )
    return row[0]


def parameter_history(conn: psycopg.Connection, name: str) -> list[tuple[int, Any, int]]:
    """(version, value, fencing_token) of every write of ``name``, oldest first."""
    with conn.transaction():
        return conn.execute(
            "SELECT version, value, fencing_token FROM pgtrain.parameter_history WHERE name = %s ORDER BY version",
            (name,),
        ).fetchall()


# -- internals ------------------------------------------------------------------------------------------
def _require_no_transaction(conn: psycopg.Connection, what: str) -> None:
    # Inside a caller's transaction our writes would only commit with it, after the lock is released.
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise PgtrainError(f"{what} needs a connection with no transaction in progress (status "
                           f"{conn.info.transaction_status.name}): commit or roll back first, or use autocommit")


def _version_of_run(conn: psycopg.Connection, run_id: str) -> CommitResult | None:
    row = conn.execute(
        "SELECT model_name, version, fencing_token, metrics FROM pgtrain.model_versions WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    return None if row is None else CommitResult(row[0], row[1], False, row[2], row[3])


def _head_for_update(conn: psycopg.Connection, model_name: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT h.version, h.fencing_token, v.metrics FROM pgtrain.model_heads h
               JOIN pgtrain.model_versions v USING (model_name, version)
               WHERE h.model_name = %s FOR UPDATE OF h""",
            (model_name,),
        ).fetchone()


def _write_version(conn: psycopg.Connection, model_name: str, run_id: str, lease: Lease,
                   metrics: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
    newest_version, newest_token = conn.execute(
        """SELECT coalesce(max(version), 0), coalesce(max(fencing_token), 0)
           FROM pgtrain.model_versions WHERE model_name = %s""",
        (model_name,),
    ).fetchone()
    if newest_token > lease.token:
        raise StaleLockToken(f"commit to model {model_name!r} refused: version {newest_version} was written "
                             f"with token {newest_token}, newer than yours ({lease.token})")
    version = newest_version + 1
    conn.execute(
        """INSERT INTO pgtrain.model_versions (model_name, version, run_id, fencing_token, metrics)
           VALUES (%s, %s, %s, %s, %s)""",
        (model_name, version, run_id, lease.token, Jsonb(metrics)),
    )
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO pgtrain.model_tensors (model_name, version, name, shape, dtype, data)
               VALUES (%s, %s, %s, %s, %s, %s)""",
            [(model_name, version, *row) for row in to_rows(arrays)],
        )
    return version


def _move_head(conn: psycopg.Connection, model_name: str, version: int, head: dict[str, Any] | None,
               lease: Lease, action: str) -> None:
    moved = conn.execute(
        """INSERT INTO pgtrain.model_heads AS h (model_name, version, fencing_token)
           VALUES (%s, %s, %s)
           ON CONFLICT (model_name) DO UPDATE
              SET version = EXCLUDED.version, fencing_token = EXCLUDED.fencing_token, updated_at = now()
              WHERE h.fencing_token <= EXCLUDED.fencing_token
           RETURNING version""",
        (model_name, version, lease.token),
    ).fetchone()
    if moved is None:
        raise StaleLockToken(f"moving the head of {model_name!r} refused: it was moved with a newer token than "
                             f"yours ({lease.token})")
    conn.execute(
        """INSERT INTO pgtrain.model_head_history
           (model_name, version, previous_version, fencing_token, action, owner)
           VALUES (%s, %s, %s, %s, %s, %s)""",
        (model_name, version, head["version"] if head else None, lease.token, action, Jsonb(lease.owner)),
    )


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _no_version(conn: psycopg.Connection, model_name: str, version: int | None) -> str:
    versions = [r[0] for r in conn.execute(
        "SELECT version FROM pgtrain.model_versions WHERE model_name = %s ORDER BY version", (model_name,))]
    if not versions:
        return f"model {model_name!r} has no versions yet; commit a training run first"
    if version is None:
        return f"model {model_name!r} has no head; promote one of its versions {versions}"
    return f"model {model_name!r} has no version {version}; it has versions {versions}"
