"""What is wrong with a source's rows: one scan that counts them and the bad ones (``check_rows``), and the
bad-row report that names each kind with example keys (``bad_rows_message``). compute_shards checks before it
cuts the shards (``pgtrain.data.manifest``); a rank that finds NaN or infinite values while it loads asks for
the same report (``load_refusal``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from pgtrain.core.errors import SourceError
from pgtrain.data.source.resolve import COLUMNS, Column, Source, valued
from pgtrain.data.source.rows import BAD_ROW_KINDS, COLUMN_KINDS, bad_row, column_checks, row_checks
from pgtrain.data.source.snapshot import (
    XidClock,
    alias_xmin_age,
    planned_rows,
    read_xid_clock,
    snapshot_transaction,
    xmins_may_alias,
)

EXAMPLE_KEYS = 10  # as many as pgtrain.example_keys keeps


@dataclass(frozen=True)
class BadRows:
    count: int
    example_keys: list[str]


@dataclass(frozen=True)
class RowCheck:
    total: int
    bad: int
    max_label: int | None
    kinds: dict[str, BadRows]
    alias_xmin_ages: list[int]  # alias_xmin_age of the rows that have one
    bad_columns: tuple[str, ...] = ()
    # the held-out rows' keys as big-endian int8s, each followed by its part of the split (one byte), when asked
    # (split): up to FOLDED_KEYS_MAX_BYTES, kept out of reprs
    held_keys: bytes | None = field(default=None, repr=False)
    extra: tuple[Any, ...] = ()  # the values of check_rows' ``extra`` aggregates, over every row checked


def bad_rows_report(kinds: dict[str, BadRows]) -> dict[str, dict[str, object]]:
    """kind -> {"count", "example_keys"}: as stored in pgtrain.shard_plans.bad_rows."""
    return {kind: {"count": bad.count, "example_keys": bad.example_keys} for kind, bad in kinds.items()}


def check_rows(conn: psycopg.Connection, source: Source, dim: int, num_classes: int | None,
               clock: XidClock, output_dim: int | None = None, *, values: bool = True,
               where: sql.Composable | None = None,
               split: sql.Composable | None = None,
               extra: Sequence[sql.Composable] = ()) -> RowCheck:
    """Row count, largest good label (classification without num_classes), each bad-row kind's count and example
    keys, and (scalar feature columns) which columns hold bad values; ``values=False`` leaves the kinds of
    LOAD_KINDS to the loader; ``where`` (SQL) restricts the rows checked. ``split`` (SQL: ``held_out_key``, a
    held-out row's key and part, NULL for the others; integer keys only): the lean scan also collects those
    (``held_keys``), so that ``cut_shards`` needs no pass of its own to count each shard's validation and test
    rows. ``extra``: more aggregates the lean scan computes on the way (``pgtrain.data.statistics``: the numeric
    columns' training means).

    One lean scan counts the rows and the bad ones (``source.bad_row``: the kinds' checks in fewer calls); only
    when it finds some (or rows whose xmin needs noting) does a second scan break them down by kind with example
    keys, then with every kind (so a report names the NaN rows too, whoever would have found them).
    """
    restrict = sql.SQL("WHERE {}").format(where) if where is not None else sql.SQL("")
    xmin_age = alias_xmin_age(source, clock)
    # age() is parallel restricted and costs more than the other checks together: counted only when a raw xmin
    # can alias at all (source.xmins_may_alias), so the lean scan may run in parallel.
    aliasing = (sql.SQL("count(*) FILTER (WHERE {} IS NOT NULL)").format(xmin_age) if xmins_may_alias(clock)
                else sql.SQL("0"))
    # The largest label only matters when num_classes is inferred from it (max_label is None otherwise).
    infer = source.target_format == "label" and not num_classes
    keys = (sql.SQL("string_agg({}, ''::bytea)").format(split) if split is not None else sql.SQL("NULL::bytea"))
    total, bad, max_label, aliased, held_keys, *extras = conn.execute(sql.SQL(
        """SELECT count(*), count(*) FILTER (WHERE {any_bad}), {max_label}, {aliasing}, {keys}{extra}
           FROM {rel} {where}""").format(
        any_bad=bad_row(source, dim, num_classes, output_dim, values=values), rel=source.relation, where=restrict,
        aliasing=aliasing, max_label=sql.SQL("max({})").format(source.label) if infer else sql.SQL("NULL"),
        keys=keys, extra=sql.SQL("").join(sql.SQL(", {}").format(e) for e in extra)),
        binary=split is not None  # the keys as bytes, not as hex text twice their size
    ).fetchone()
    if split is not None:
        held_keys = bytes(held_keys or b"")
    if not bad and not aliased:
        return RowCheck(total, 0, max_label, {}, [], held_keys=held_keys, extra=tuple(extras))
    checks = row_checks(source, dim, num_classes, output_dim)
    flags = [sql.Identifier(f"is_{kind}") for kind in checks]
    any_bad = sql.SQL(" OR ").join(flags)
    per_kind = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE {f}), pgtrain.example_keys(key::text) FILTER (WHERE {f})").format(f=f)
        for f in flags)
    feature_flags = [sql.Identifier(f"is_{kind}") for kind in COLUMN_KINDS if kind in checks]
    column_values = sql.SQL("")
    columns = sql.SQL("NULL::text")
    nulls = source.missing_values == "bad_row"
    checked = valued(source.feature_columns)
    if source.feature_format == COLUMNS and feature_flags and checked:
        # One bit per column, set when the column is bad in some row: computed for bad rows only.
        names = [sql.Identifier(f"_pgtrain_c{i}") for i in range(len(checked))]
        column_values = sql.SQL(", ").join(sql.SQL("{} AS {}").format(sql.Identifier(c.name), name)
                                           for c, name in zip(checked, names, strict=True)) + sql.SQL(", ")
        bits = sql.SQL(" || ").join(_column_bit(column, name, nulls) for column, name in zip(checked, names,
                                                                                            strict=True))
        columns = sql.SQL("bit_or(CASE WHEN {} THEN {} END)::text").format(sql.SQL(" OR ").join(feature_flags),
                                                                          bits)
    max_label = sql.SQL("max(label)") if infer else sql.SQL("max(NULL::bigint)")
    query = sql.SQL(
        """SELECT count(*), count(*) FILTER (WHERE {any_bad}), {max_label} FILTER (WHERE NOT ({any_bad})),
                  array_agg(DISTINCT xmin_age) FILTER (WHERE xmin_age IS NOT NULL), {columns}, {per_kind}
           FROM (SELECT {values}{key} AS key, {label} AS label, {xmin_age} AS xmin_age, {checks}
                 FROM {rel} {where} OFFSET 0) checked"""  # OFFSET 0: compute each check once per row
    ).format(any_bad=any_bad, per_kind=per_kind, key=source.key, label=source.label, rel=source.relation,
             max_label=max_label, columns=columns, values=column_values, xmin_age=xmin_age, where=restrict,
             checks=sql.SQL(", ").join(sql.SQL("{} AS {}").format(c, f) for c, f in zip(checks.values(), flags,
                                                                                        strict=True)))
    total, bad, max_label, ages, column_bits, *found = conn.execute(query).fetchone()
    kinds = {kind: BadRows(count, list(examples))
             for kind, count, examples in zip(checks, found[::2], found[1::2], strict=True) if count}
    bad_columns = tuple(c.name for c, bit in zip(checked, column_bits or "", strict=False) if bit == "1")
    return RowCheck(total, bad, max_label, kinds, ages or [], bad_columns, held_keys, tuple(extras))


def _column_bit(column: Column, value: sql.Composable, nulls: bool) -> sql.Composable:
    """SQL bit(1): the column's value is bad (a NULL only when ``nulls``)."""
    checks = column_checks(column, value, nulls=False)
    if not checks:
        return sql.SQL("CASE WHEN {} IS NULL THEN B'1' ELSE B'0' END" if nulls else "B'0'").format(value)
    return sql.SQL("CASE WHEN coalesce({}, {}) THEN B'1' ELSE B'0' END").format(
        sql.SQL(" OR ").join(checks), sql.Literal(nulls))


def load_refusal(conn: psycopg.Connection, source: Source, rank: int, found: int) -> SourceError:
    """The error of a rank that found ``found`` rows with NaN, infinite or too large features in its shard:
    the bad-row report compute_shards would have given, from one more scan (of the planned rows), naming every
    kind with counts and example keys. compute_shards leaves these per-value checks to the loader (LOAD_KINDS)."""
    plan = source.plan
    with snapshot_transaction(conn):
        clock = read_xid_clock(conn)
        check = check_rows(conn, source, plan.input_dim, plan.num_classes, clock, plan.output_dim,
                           where=planned_rows(source, clock))
    report = (bad_rows_message(source, check, plan.input_dim, plan.num_classes, outputs=plan.output_dim)
              if check.bad else f"{source.qualified_name} holds them (no longer as planned: re-run compute_shards)")
    return SourceError(f"rank {rank} found {found} rows with NaN, infinite or out-of-range features in its shard "
                       f"(checked as the rows load, not by compute_shards): {report}")


def bad_rows_message(source: Source, check: RowCheck, dim: int, num_classes: int | None,
                      details: bool = False, outputs: int | None = None) -> str:
    """The bad-row report: a headline (unless only ``details``), then one line per kind with example keys, and
    the scalar feature columns that hold the bad values."""
    classes = num_classes if num_classes else "max label + 1"
    lines = [] if details else [f"{source.qualified_name} has {check.bad} bad rows of {check.total}; fix or "
                                "delete them, or set bad_rows='exclude' to train without them:"]
    meanings = BAD_ROW_KINDS | (COLUMN_KINDS if source.feature_format == COLUMNS else {})
    for kind, bad in check.kinds.items():
        meaning = meanings[kind].format(dim=dim, num_classes=classes, outputs=outputs)
        lines.append(f"  {kind}: {bad.count} rows ({meaning}), e.g. keys " + ", ".join(
            "NULL" if k is None else k for k in bad.example_keys[:EXAMPLE_KEYS]))
    if check.bad_columns:
        lines.append("  feature columns with NULL, NaN, infinite or out-of-range values: "
                     + ", ".join(map(repr, check.bad_columns)))
    return "\n".join(lines)


def empty_source(source: Source) -> SourceError:
    return SourceError(
        f"source table {source.qualified_name} is empty: load training rows first "
        "(for the example data: make load-digits)"
    )
