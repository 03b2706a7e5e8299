"""Quantile bin edges of the numeric columns, for the built-in mlp's piecewise-linear encoding (issue 31;
``pgtrain.models.piecewise``), computed in the planning snapshot and recorded in the input record (each column's
``edges``), so that training, ``predict`` and ``load_predictor`` bin a raw value alike.

One query over the training rows of the plan (neither validation nor test rows, nor bad rows left out): per NUMBER
or DATE column, ``percentile_disc`` at 0, 1/B, ..., 1 of its values as the loader sends them (finite, within
float32; NULLs are not values: an imputed NULL is the column's mean, and its "was missing" input says so). Its own
scan rather than more aggregates of the row check's: an ordered-set aggregate would keep that scan from running in
parallel. The edges are rounded to float32 (the input rows' type) and made distinct: a column with fewer than two
distinct values keeps its standardized value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import psycopg
from psycopg import sql

from pgtrain.config.params import TrainingConfig
from pgtrain.data.source.resolve import COLUMNS, Column, Source, valued
from pgtrain.data.source.rows import is_held_out, scalar_value

_FLOAT32_MAX = 3.4028234663852886e38


def wanted(source: Source, config: TrainingConfig) -> bool:
    """Whether a plan of ``config`` records edges: the built-in mlp with numeric_bins, over scalar columns with a
    number or date among them."""
    return (config.model == "mlp" and config.numeric_bins > 0 and source.feature_format == COLUMNS
            and bool(valued(source.feature_columns)))


def edges_query(source: Source, bins: int, validation_fraction: float, test_fraction: float, seed: int,
                exclude: sql.Composable | None) -> sql.Composable:
    """SQL: one row, one float8[] per NUMBER or DATE column: its values' ``percentile_disc`` at i/``bins``,
    i = 0..bins, over the training rows (``exclude``: bad rows, left out)."""
    fractions = sql.Literal([i / bins for i in range(bins + 1)])
    held_out = is_held_out(source, validation_fraction, test_fraction, seed)
    aggregates = []
    for column in valued(source.feature_columns):
        value = sql.SQL("CAST({} AS double precision)").format(scalar_value(sql.Identifier(column.name), column.type))
        aggregates.append(sql.SQL(
            "percentile_disc(CAST({f} AS double precision[])) WITHIN GROUP (ORDER BY {v}) "
            "FILTER (WHERE {v} BETWEEN {low} AND {high})").format(
            f=fractions, v=value, low=sql.Literal(-_FLOAT32_MAX), high=sql.Literal(_FLOAT32_MAX)))
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
    """``source`` with each NUMBER or DATE column's edges (``edges_query``) when the plan wants them (``wanted``)."""
    if not wanted(source, config):
        return source
    row = conn.execute(edges_query(source, config.numeric_bins, config.validation_fraction, config.test_fraction,
                                   config.seed, exclude)).fetchone()
    found = dict(zip((c.name for c in valued(source.feature_columns)), row, strict=True))
    columns: list[Column] = [replace(c, edges=distinct_edges(found[c.name])) if c.name in found else c
                             for c in source.feature_columns]
    return replace(source, feature_columns=tuple(columns))
