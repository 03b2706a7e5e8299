"""Versioned model store, every write fenced by a lock lease.

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

from pgtrain.config.metrics import FIGURES_FROM
from pgtrain.core.errors import CommitRejected, PgtrainError, StaleLockToken
from pgtrain.data.upgrade import current_record
from pgtrain.runs import versions
from pgtrain.runs.record import epoch_metrics, get_run, kept_epoch, recorded_runs, set_status
from pgtrain.store import identity, tensors
from pgtrain.store.commit_checks import (
    architecture_change,
    expected_layout,
    layout_problems,
    nonfinite_problems,
    quality_gate,
    version_spec,
)
from pgtrain.store.locks import DEFAULT_TTL, Lease, LockManager, fenced


@dataclass(frozen=True)
class CommitResult:
    model_name: str
    version: int
    created: bool  # False: the run had already been committed, this is its version
    fencing_token: int
    metrics: dict[str, Any] = field(default_factory=dict)
    head_moved: bool = True  # False: a different architecture than the head's; promote it explicitly


@dataclass(frozen=True)
class HeadMove:
    model_name: str
    version: int
    previous_version: int | None
    fencing_token: int


def model_lock_name(model_name: str) -> str:
    return f"model:{model_name}"


def commit_run(conn: psycopg.Connection, run_id: str, owner: Mapping[str, Any] | None = None,
               lock_timeout: float = 60.0, ttl: float = DEFAULT_TTL) -> CommitResult:
    """Make the run's staged parameters the next version of its model and move the head to it.

    Idempotent: a run already committed returns its version with ``created=False``. Staged tensors that
    do not match the run's model layout (missing, extra, shape, dtype) or hold NaN/Inf, or a failed
    quality gate, mark the run 'rejected' (with the reason) and raise CommitRejected; the head is left
    alone. A version whose model, task or widths differ from the head's is committed but does not move
    the head (the run's status_reason says to promote it), and so does one of other data (``identity``) unless the
    author's gate allows re-targeting, and one without validation metrics unless the author's gate allows it
    (``commit_checks.quality_gate``); versions of other data are not compared by the gate. The version takes over
    the staged tensors' blobs (no byte is copied), and the run's staged rows and checkpoint are deleted once it is
    committed or rejected. Raises LockTimeout when the model's lock cannot be taken within ``lock_timeout`` seconds;
    the lock's lease is renewed in the background for as long as the commit works.
    """
    _require_no_transaction(conn, "commit_run")
    with conn.transaction():
        run = get_run(conn, run_id)
        existing = _version_of_run(conn, run_id)
    if existing is not None:
        if run.status != "committed":
            set_status(conn, run_id, "committed", None)
        return existing

    try:
        with conn.transaction():
            infos = tensors.staged_layout(conn, run_id)
            epochs = epoch_metrics(conn, run_id)
        if not infos:
            if run.status == "rejected" and run.status_reason:
                raise CommitRejected(run.status_reason)  # rejected before; its tensors are gone
            raise CommitRejected(f"run {run_id!r} has no staged parameters: the train task did not write them")
        problems = layout_problems(infos, expected_layout(run))
        if not problems:
            uncounted = [i for i in infos if i.nonfinite is None]  # staged before writers counted them
            problems = nonfinite_problems(infos, tensors.count_staged_nonfinite(conn, run_id, uncounted))
        if problems:
            raise CommitRejected(f"staged parameters of run {run_id!r} do not fit the run's model: "
                                 + "; ".join(problems))
        with conn.transaction():
            spec = version_spec(conn, run)
    except CommitRejected as rejected:
        with conn.transaction():
            set_status(conn, run_id, "rejected", str(rejected))
            _discard_run_tensors(conn, run_id)
        raise
    metrics = version_metrics(epochs, infos, run.test_metrics)

    rejection: str | None = None
    # heartbeat=True: the lease is renewed every ttl/3 while the commit works, however long it waits.
    with LockManager(conn, ttl=ttl, owner=owner, heartbeat=True) as locks, \
            locks.lock(model_lock_name(run.model_name), timeout=lock_timeout) as lease, fenced(conn, lease):
        existing = _version_of_run(conn, run_id)  # a concurrent commit of this same run got here first
        if existing is not None:
            set_status(conn, run_id, "committed", None)
            return existing
        head = _head_for_update(conn, run.model_name)
        changed = architecture_change(spec, head)
        # The head may have moved to other data since plan_run checked: versions of other data are not compared.
        head_data = identity.of_version(head["spec"]) if head and head["spec"] else None
        other_data = identity.differences(conn, head_data, identity.of_version(spec)) if head_data else []
        verdict = quality_gate(run.config, spec["task"], metrics, None if changed or other_data else head)
        rejection = verdict.rejection
        if rejection is not None:
            set_status(conn, run_id, "rejected", rejection)
        else:
            version = _write_version(conn, run.model_name, run_id, lease, metrics, spec, infos)
            reason, held = verdict.note, (
                f"its data differs from the head's, {identity.describe(head_data)}: it has {'; '.join(other_data)}, "
                f"and the DAG's author does not allow re-targeting the model ({identity.RETARGET_HINT})"
                if other_data and not run.config.allow_retarget else
                f"the architecture changed ({changed})" if changed else verdict.hold)
            if held is None:
                _move_head(conn, run.model_name, version, head, lease, "commit")
            else:
                reason = (f"committed as version {version} without moving the head (version "
                          f"{head['version'] if head else 'none'}): {held}; run `pgtrain-models promote "
                          f"{run.model_name} {version}` to make it the head")
            set_status(conn, run_id, "committed", reason)
        _discard_run_tensors(conn, run_id)
    if rejection is not None:
        raise CommitRejected(rejection)
    return CommitResult(run.model_name, version, True, lease.token, metrics, head_moved=held is None)


def version_metrics(epochs: list[dict[str, Any]], infos: list[tensors.TensorInfo],
                    test: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures of the epoch whose parameters the run staged (the best one, ``best_epoch``, with early stopping;
    else the last), plus epochs trained, total training seconds and parameter count; and ``test``, the staged
    parameters' figures on the test rows (test_*), with FIGURES_FROM saying which rows the reported figures come
    from."""
    metrics: dict[str, Any] = {k: _finite_or_none(v) for k, v in (test or {}).items()}
    metrics[FIGURES_FROM] = "test" if test else "validation"
    if epochs:
        metrics.update({k: _finite_or_none(v) for k, v in kept_epoch(epochs).items() if k != "seconds"})
        metrics["epoch"] = epochs[-1].get("epoch", metrics.get("epoch"))
        metrics["epochs"] = len(epochs)
        metrics["training_seconds"] = _finite_or_none(sum(e.get("seconds") or 0.0 for e in epochs))
    metrics["parameter_count"] = int(sum(math.prod(i.shape) for i in infos))
    return metrics


# -- reading the store ----------------------------------------------------------------------------------
def head_version(conn: psycopg.Connection, model_name: str) -> int | None:
    """The version the model's head points at, or None (no head yet)."""
    with conn.transaction():
        return versions.head_version(conn, model_name)


def get_version(conn: psycopg.Connection, model_name: str, version: int | None = None) -> dict[str, Any]:
    """One version (the head when ``version`` is None) with its run, spec and tensor list."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        if version is None:
            version = head_version(conn, model_name)
        row = versions.row(conn, model_name, version)
        if row is None:
            raise PgtrainError(_no_version(conn, model_name, version))
        run = recorded_runs(conn, [row["run_id"]]).get(row["run_id"], {})
        row.update({name: run.get(name) for name in ("dag_id", "dag_run_id", "input_dim", "num_classes")})
        row["hidden_sizes"] = (run.get("config") or {}).get("hidden_sizes")
        row["tensors"] = cur.execute(
            """SELECT name, shape, dtype, nbytes FROM pgtrain.model_tensors
               WHERE model_name = %s AND version = %s ORDER BY name""",
            (model_name, row["version"]),
        ).fetchall()
    return {**row, "spec": current_record(row["spec"])}


def version_layout(conn: psycopg.Connection, model_name: str, version: int | None = None
                   ) -> tuple[int, dict[str, Any], list[tensors.TensorInfo]]:
    """(version, spec, tensor layout) of a version, the head when ``version`` is None."""
    with conn.transaction():
        if version is None:
            version = head_version(conn, model_name)
        spec = versions.spec(conn, model_name, version)
        if spec is None:
            raise PgtrainError(_no_version(conn, model_name, version))
        infos = [tensors.TensorInfo(n, tuple(s), d, b, blob_id=i) for n, s, d, b, i in conn.execute(
            """SELECT name, shape, dtype, nbytes, blob_id FROM pgtrain.model_tensors
               WHERE model_name = %s AND version = %s ORDER BY name""", (model_name, version))]
    return version, current_record(spec), infos


def load_tensors(conn: psycopg.Connection, model_name: str, version: int | None = None
                 ) -> tuple[int, dict[str, np.ndarray]]:
    """(version, name -> array) of a version, the head when ``version`` is None.

    Each array is allocated once (writable, little-endian) and filled chunk by chunk from one COPY.
    """
    with conn.transaction():
        version, _, infos = version_layout(conn, model_name, version)
        arrays = tensors.read_chunks(conn, infos, f"version {version} of model {model_name!r}")
    return version, arrays


def export_state_dict(conn: psycopg.Connection, model_name: str, version: int | None, path: Path | str) -> int:
    """``torch.save`` the version's state dict (loads into ``pgtrain.models.network.build_model(...)`` of its spec);
    returns the version. The tensors share the arrays' memory: one copy of the model in memory."""
    import torch  # only exporting needs torch

    version, arrays = load_tensors(conn, model_name, version)
    state = {name: torch.from_numpy(np.asarray(array, dtype=array.dtype.newbyteorder("=")))
             for name, array in arrays.items()}
    torch.save(state, Path(path))
    return version


# -- moving the head by hand ------------------------------------------------------------------------------
def promote(conn: psycopg.Connection, model_name: str, version: int, owner: Mapping[str, Any] | None = None,
            lock_timeout: float = 60.0, ttl: float = DEFAULT_TTL) -> HeadMove:
    """Point the head at an existing version (promote a newer one or roll back to an older one), under the lock."""
    _require_no_transaction(conn, "promote")
    with LockManager(conn, ttl=ttl, owner=owner) as locks, \
            locks.lock(model_lock_name(model_name), timeout=lock_timeout) as lease:
        return move_head(conn, model_name, version, lease)


def move_head(conn: psycopg.Connection, model_name: str, version: int, lease: Lease) -> HeadMove:
    """Point the head at an existing version under ``lease`` (the model's lock, taken by the caller), in one fenced
    transaction: StaleLockToken when the lease is no longer current or the head was moved with a newer token."""
    with fenced(conn, lease):
        if not versions.exists(conn, model_name, version):
            raise PgtrainError(_no_version(conn, model_name, version))
        head = _head_for_update(conn, model_name)
        _move_head(conn, model_name, version, head, lease, "promote")
    return HeadMove(model_name, version, head["version"] if head else None, lease.token)


def collect_garbage(conn: psycopg.Connection, model_name: str, keep: int, force: bool = False,
                    owner: Mapping[str, Any] | None = None, lock_timeout: float = 60.0,
                    ttl: float = DEFAULT_TTL) -> list[int]:
    """Delete the model's versions (rows and tensors) except the ``keep`` newest, the head, and (unless
    ``force``) every version the head has ever pointed at; returns the versions deleted. Under the lock."""
    if keep < 0:
        raise PgtrainError(f"keep must be 0 or more versions, got {keep}")
    _require_no_transaction(conn, "collect_garbage")
    with LockManager(conn, ttl=ttl, owner=owner, heartbeat=True) as locks, \
            locks.lock(model_lock_name(model_name), timeout=lock_timeout) as lease, fenced(conn, lease):
        numbers = versions.numbers(conn, model_name)[::-1]
        if not numbers:
            raise PgtrainError(_no_version(conn, model_name, None))
        head = _head_for_update(conn, model_name)
        kept = set(numbers[:keep]) | ({head["version"]} if head else set())
        if not force:
            kept |= versions.ever_head(conn, model_name)
        doomed = sorted(set(numbers) - kept)
        if doomed:
            # their blobs' chunks go with the model_tensors rows (004's drop_unreferenced_chunks trigger)
            conn.execute("DELETE FROM pgtrain.model_tensors WHERE model_name = %s AND version = ANY(%s)",
                         (model_name, doomed))
            versions.delete(conn, model_name, doomed)
    return doomed


# -- internals ------------------------------------------------------------------------------------------
def _require_no_transaction(conn: psycopg.Connection, what: str) -> None:
    # Inside a caller's transaction our writes would only commit with it, after the lock is released.
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise PgtrainError(f"{what} needs a connection with no transaction in progress (status "
                           f"{conn.info.transaction_status.name}): commit or roll back first, or use autocommit")


def _version_of_run(conn: psycopg.Connection, run_id: str) -> CommitResult | None:
    made = versions.of_run(conn, run_id)
    return None if made is None else CommitResult(made.model_name, made.version, False, made.fencing_token,
                                                  made.metrics, head_moved=made.head_moved)


def _head_for_update(conn: psycopg.Connection, model_name: str) -> dict[str, Any] | None:
    head = versions.head_for_update(conn, model_name)
    return None if head is None else {**head, "spec": current_record(head["spec"])}


def _write_version(conn: psycopg.Connection, model_name: str, run_id: str, lease: Lease,
                   metrics: dict[str, Any], spec: dict[str, Any], checked: list[tensors.TensorInfo]) -> int:
    """The next version of the model: its row, and tensor rows that take over the run's staged blobs (the
    ``checked`` ones: a train attempt that staged others since is refused). No tensor byte is copied."""
    # FOR UPDATE: a rewrite or delete of the staged rows waits for this commit, which then has removed them.
    staged = conn.execute("SELECT name, blob_id FROM pgtrain.staged_parameters WHERE run_id = %s ORDER BY name "
                          "FOR UPDATE", (run_id,)).fetchall()
    if staged != [(i.name, i.blob_id) for i in checked]:
        raise PgtrainError(f"the staged parameters of run {run_id!r} were written again while it was being "
                           "committed (a later train attempt?); commit the run again")
    newest_version, newest_token = versions.newest(conn, model_name)
    if newest_token > lease.token:
        raise StaleLockToken(f"commit to model {model_name!r} refused: version {newest_version} was written "
                             f"with token {newest_token}, newer than yours ({lease.token})")
    version = newest_version + 1
    versions.insert(conn, model_name, version, run_id, lease.token, metrics, spec)
    # The staged rows are deleted after this (_discard_run_tensors); their blobs stay, referenced from here.
    conn.execute(
        """INSERT INTO pgtrain.model_tensors (model_name, version, name, shape, dtype, nbytes, blob_id)
           SELECT %s, %s, name, shape, dtype, nbytes, blob_id FROM pgtrain.staged_parameters WHERE run_id = %s""",
        (model_name, version, run_id),
    )
    return version


def _discard_run_tensors(conn: psycopg.Connection, run_id: str) -> None:
    """A committed or rejected run needs neither its staged tensors nor its checkpoint any more."""
    tensors.delete_staged(conn, run_id)
    tensors.delete_checkpoints(conn, run_id)


def _move_head(conn: psycopg.Connection, model_name: str, version: int, head: dict[str, Any] | None,
               lease: Lease, action: str) -> None:
    if not versions.point_head(conn, model_name, version, lease.token):
        raise StaleLockToken(f"moving the head of {model_name!r} refused: it was moved with a newer token than "
                             f"yours ({lease.token})")
    versions.record_head_move(conn, model_name, version, head["version"] if head else None, lease.token, action,
                              lease.owner)


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _no_version(conn: psycopg.Connection, model_name: str, version: int | None) -> str:
    numbers = versions.numbers(conn, model_name)
    if not numbers:
        return f"model {model_name!r} has no versions yet; commit a training run first"
    if version is None:
        return f"model {model_name!r} has no head; promote one of its versions {numbers}"
    return f"model {model_name!r} has no version {version}; it has versions {numbers}"
