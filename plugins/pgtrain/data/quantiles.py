"""Quantile bin edges of the numeric columns, for the built-in mlp's piecewise-linear encoding (issue 31;
``pgtrain.models.piecewise``), computed in the planning snapshot and recorded in the input record (each column's
``edges``), so that training, ``predict`` and ``load_predictor`` bin a raw value alike.

One query over the training rows of the plan (neither validation nor test rows, nor bad rows left out): per NUMBER
or DATE column, ``percentile_disc`` at 0, 1/B, ..., 1 of its values as the loader sends them (finite, within
float32; NULLs are not values: an imputed NULL is the column's mean, and its "was missing" input says so). Its own
scan rather than more aggregates of the row check's: an ordered-set aggregate would keep that scan from running in
parallel. The edges are rounded to float32 (the input rows' type) and made distinct: a column with fewer than two
distinct values keeps its standardized value.

A search's trials share one plan but may each ask for their own numeric_bins (``pgtrain.config.bins.bin_counts``):
the one query takes ``percentile_disc`` at the union of every asked B's fractions k/B (one sort per column, as for
one B), and each B's edges are picked from it, exactly what a plan of that B alone records (k/B is the same float8
either way). The plan's record holds the largest B's as ``edges`` and the others' as ``bin_edges``; each trial's
record (``pgtrain.config.bins.for_bins``) holds exactly the edges its model uses, the largest's, another B's or
none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.config.bins import bin_counts
from pgtrain.config.params import TrainingConfig
from pgtrain.data.source.resolve import COLUMNS, Column, Source, valued
from pgtrain.data.source.rows import is_held_out, scalar_value

_FLOAT32_MAX = 3.4028234663852886e38


def wanted(source: Source, config: TrainingConfig) -> bool:
    """Whether a plan of ``config`` records edges: some numeric_bins of the built-in mlp (``bin_counts``), over
    scalar columns with a number or date among them."""
    return bool(bin_counts(config)) and source.feature_format == COLUMNS and bool(valued(source.feature_columns))


def fractions(bins: Sequence[int]) -> list[float]:
    """The fractions k/B of every B in ``bins`` (k = 0..B), each once, ascending."""
    return [float(f) for f in sorted({Fraction(k, b) for b in bins for k in range(b + 1)})]


def edges_query(source: Source, bins: Sequence[int], validation_fraction: float, test_fraction: float, seed: int,
                exclude: sql.Composable | None) -> sql.Composable:
    """SQL: one row, one float8[] per NUMBER or DATE column: its values' ``percentile_disc`` at the ``fractions``
    of ``bins``, over the training rows (``exclude``: bad rows, left out)."""
    at = sql.Literal(fractions(bins))
    held_out = is_held_out(source, validation_fraction, test_fraction, seed)
    aggregates = []
    for column in valued(source.feature_columns):
        value = sql.SQL("CAST({} AS double precision)").format(scalar_value(sql.Identifier(column.name), column.type))
        aggregates.append(sql.SQL(
            "percentile_disc(CAST({f} AS double precision[])) WITHIN GROUP (ORDER BY {v}) "
            "FILTER (WHERE {v} BETWEEN {low} AND {high})").format(
            f=at, v=value, low=sql.Literal(-_FLOAT32_MAX), high=sql.Literal(_FLOAT32_MAX)))
    where = sql.SQL("NOT {}").format(held_out)
    if exclude is not None:
        where = sql.SQL("{} AND NOT {}").format(where, exclude)
    return sql.SQL("SELECT {} FROM {} WHERE {}").format(sql.SQL(", ").join(aggregates), source.relation, where)


def distinct_edges(values: Sequence[float] | None) -> tuple[float, ...]:
    """Quantiles -> the edges recorded: float32-rounded, distinct, ascending; () when fewer than two remain."""
    found = np.unique(np.asarray([v for v in values or () if v is not None], np.float32))
    return tuple(float(v) for v in found) if len(found) >= 2 else ()


def with_edges(conn: psycopg.Connection, source: Source, config: TrainingConfig,
               exclude: sql.Composable | None) -> Source:
    """``source`` with each NUMBER or DATE column's edges (``edges_query``) when the plan wants them (``wanted``):
    the largest B's as ``edges``, every other B's in ``bin_edges``."""
    if not wanted(source, config):
        return source
    bins = bin_counts(config)
    row = conn.execute(edges_query(source, bins, config.validation_fraction, config.test_fraction, config.seed,
                                   exclude)).fetchone()
    index = {f: i for i, f in enumerate(fractions(bins))}
    found = dict(zip((c.name for c in valued(source.feature_columns)), row, strict=True))

    def of(quantiles: Sequence[float] | None, b: int) -> tuple[float, ...]:
        return distinct_edges([quantiles[index[f]] for f in fractions([b])] if quantiles is not None else None)

    columns: list[Column] = []
    for column in source.feature_columns:
        if column.name in found:
            quantiles, edges = found[column.name], of(found[column.name], bins[-1])
            column = replace(column, edges=edges,
                             bin_edges=tuple((b, of(quantiles, b)) for b in bins[:-1]) if edges else ())
        columns.append(column)
    return replace(source, feature_columns=tuple(columns))
