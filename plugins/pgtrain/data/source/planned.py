"""What compute_shards planned for a run (``PlannedRows``): a plain record, which the described source
(``resolve.Source.plan``) carries and the snapshot's SQL (``snapshot.planned_rows``) reads; it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlannedRows:
    """What compute_shards planned for a run, as the loader needs it to read exactly those rows.

    Rows are selected "as of" the planning snapshot by their ``xmin``, with the snapshot's own rule: a row the
    loader sees was planned iff its inserting transaction had committed when the snapshot was taken, that is,
    its xid is below the snapshot's ``xmin``, or below its ``xmax`` and not one of its ``in_progress`` xids
    (``planned_rows``). That needs no list of the transactions that touched the table, however many there were.

    ``xmin`` is a 32-bit xid that wraps, and VACUUM freezes old rows but keeps their raw (possibly very old)
    ``xmin``, so such a row's xmin can wrap into the window that is judged by it. Wrapped rows that land on an
    in-progress xid or at/after ``xmax`` would look new: ``seen_xmins`` lists their raw xmins (planning can tell
    them apart, since the planning snapshot cannot see a row of such a transaction), complete for xids below
    ``xid_horizon``; a load that starts later refuses.
    """

    run_id: str  # the run that planned the rows (``pgtrain.plan_of``: a trial's is its search run)
    snapshot: str
    xmin: int  # 64-bit xmin of the planning snapshot
    xmax: int  # 64-bit xmax of the planning snapshot
    in_progress: tuple[int, ...]  # raw 32-bit xids the planning snapshot saw as in progress (pg_snapshot_xip)
    seen_xmins: tuple[int, ...]  # raw 32-bit xmins of wrapped frozen planned rows that look new
    xid_horizon: int  # 64-bit
    input_dim: int
    num_classes: int | None  # classification only
    exclude_bad_rows: bool
    batch_rows: int
    output_dim: int | None = None  # classes, or the regression target's width
    encoding: dict[str, Any] | None = None  # the run's input record (pgtrain.data.input_record), as JSON
    # The scalar feature columns NULL in some planned row (statistics.nullable_columns); None: any may be.
    nullable_columns: tuple[str, ...] | None = None
