"""The summary of a run: rows per rank, loss curve, validation metrics (they chose the epoch), the kept parameters'
figures on the test rows (they chose nothing), committed version, wall time.

The report task stores it with the run; ``python -m pgtrain.cli.report`` prints it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgtrain.core.errors import PgtrainError
from pgtrain.runs import record, versions


def build_summary(conn: psycopg.Connection, run_id: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            """SELECT r.run_id, r.model_name, r.status, r.status_reason, r.input_dim, r.num_classes,
                      extract(epoch FROM r.updated_at - r.created_at)::float8 AS wall_seconds,
                      p.excluded_rows, r.test_metrics
               FROM pgtrain.training_runs r
               LEFT JOIN pgtrain.shard_plans p ON p.run_id = pgtrain.plan_of(r.run_id)
               WHERE r.run_id = %s""",
            (run_id,),
        ).fetchone()
        manifest = cur.execute(
            "SELECT rank, row_count, train_count, val_count, test_count FROM pgtrain.shard_manifest "
            "WHERE run_id = pgtrain.plan_of(%s) ORDER BY rank",
            (run_id,),
        ).fetchall()
    if row is None:
        raise PgtrainError(f"training run {run_id!r} does not exist; `python -m pgtrain.runs.report` lists the latest")
    committed = versions.of_run(conn, run_id)
    epochs = record.epoch_metrics(conn, run_id)
    last = epochs[-1] if epochs else {}
    kept = record.kept_epoch(epochs)  # the staged parameters' epoch: the best one with early stopping
    return {
        "run_id": run_id,
        "model_name": row["model_name"],
        "status": row["status"],
        "status_reason": row["status_reason"],
        "rows_per_rank": [m["row_count"] for m in manifest],
        "train_rows_per_rank": [m["train_count"] for m in manifest],
        "excluded_rows": row["excluded_rows"] or 0,
        "loss_per_epoch": [round(e["train_loss"], 5) for e in epochs],
        "val_accuracy": kept.get("val_accuracy"),
        "validation": {k: v for k, v in kept.items() if k.startswith("val_") and v is not None},
        "test_rows": sum(m["test_count"] for m in manifest),
        "test": {k: v for k, v in (row["test_metrics"] or {}).items() if isinstance(v, float)},
        "best_epoch": last.get("best_epoch"),
        "samples_per_second": last.get("samples_per_second"),
        "version": committed.version if committed else None,
        "is_head": bool(committed and committed.is_head),
        "wall_seconds": round(row["wall_seconds"], 1),
    }


def format_summary(summary: dict[str, Any]) -> str:
    validation, test = summary.get("validation") or {}, summary.get("test") or {}
    head = "" if summary.get("is_head", True) else f" (not the head: {summary['status_reason']})"
    lines = [
        f"run               {summary['run_id']} ({summary['status']})",
        f"rows per rank     {summary['rows_per_rank']} (training: {summary['train_rows_per_rank']})"
        + (f", {summary['excluded_rows']} bad rows excluded" if summary["excluded_rows"] else ""),
        "loss per epoch    " + _curve(summary["loss_per_epoch"]),
        "validation        " + (", ".join(f"{k.removeprefix('val_')} {v:.4f}" for k, v in validation.items())
                                 or "n/a")
        + (f" (best epoch {summary['best_epoch']} of {len(summary['loss_per_epoch'])})"
           if summary.get("best_epoch") else ""),
        "test              " + (", ".join(f"{k.removeprefix('test_')} {v:.4f}" for k, v in test.items())
                                 + f" ({summary.get('test_rows')} rows that chose nothing)" if test else "n/a"),
        f"committed version {summary['model_name']} v{summary['version']}{head}" if summary["version"]
        else f"committed version none ({summary['status_reason'] or 'not committed'})",
        f"wall time         {summary['wall_seconds']} s",
    ]
    return "\n".join(lines)


def _curve(losses: list[float], shown: int = 6) -> str:
    """The training loss of every epoch, or of the first and last ``shown`` of a long run."""
    text = [f"{loss:.4f}" for loss in losses]
    return " ".join(text if len(text) <= 2 * shown else [*text[:shown], "...", *text[-shown:]])

