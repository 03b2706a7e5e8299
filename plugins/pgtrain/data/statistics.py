"""The planning-time statistics a run's encoding is made of (``pgtrain.data.encoding``), computed in the planning
snapshot so that every rank encodes identically:

- each numeric or date column's imputation mean and whether it has NULLs: aggregates the row check's lean scan
  computes on the way (``lean_aggregates``: no scan of their own);
- each categorical column's levels and the classes of a class label: one more scan of the table that counts
  every level of every such column at once (``GROUPING SETS``, hashed), returning only the most frequent
  levels of each (``vocabularies``); classification by non-negative integer labels 0..K-1 needs none, when the
  lean scan's bit mask of the labels shows them all.

``encode`` turns them into the planned source, refusing what cannot be trained on (an all-NULL column, a text
column that is really a key, a single class, too many classes) with what to do, and keeping out of clear the
levels the author's rules say (``pgtrain.data.level_storage``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import sql

from pgtrain.config.bins import bin_counts
from pgtrain.config.params import MAX_CLASSES, TrainingConfig
from pgtrain.core.errors import SourceError
from pgtrain.data import level_storage, quantiles
from pgtrain.data.encoding import NULL_HASH
from pgtrain.data.source.resolve import CATEGORY, LABEL_TYPES, Column, Source, categories, valued
from pgtrain.data.source.rows import is_held_out, scalar_value
from pgtrain.data.source.snapshot import Beside

# A categorical column with more distinct values than max_categories and at least this share of the rows that have
# a value in it is a key or free text, not a category: refused (naming it and exclude_columns), not capped.
KEY_LIKE_SHARE = 0.5
LABEL_MASK_BITS = 62  # integer labels 0..61 are checked for completeness by one bit_or in the lean scan
EXAMPLE_CLASSES = 5


@dataclass(frozen=True)
class Encoded:
    source: Source  # with the encoded feature columns and the classes
    num_classes: int | None  # classification
    warnings: tuple[str, ...] = ()


def lean_aggregates(source: Source, num_classes: int | None) -> list[sql.Composable]:
    """The aggregates ``encode`` reads from the row check's lean scan (``check_rows(extra=...)``), over the rows it
    checks: per numeric or date column its mean over the values within float32's range and its non-NULL count;
    for integer labels without num_classes, their minimum and a bit mask of the labels 0..LABEL_MASK_BITS-1
    present."""
    aggregates = []
    for column in valued(source.feature_columns):
        value = sql.SQL("CAST({} AS double precision)").format(scalar_value(sql.Identifier(column.name), column.type))
        # Over the values a row may have (finite, within float32): a bad one must not make the mean NaN or overflow.
        aggregates += [sql.SQL("avg({v}) FILTER (WHERE {v} BETWEEN -3.4028234663852886e38 AND 3.4028234663852886e38)"
                               ).format(v=value),
                       sql.SQL("count({})").format(sql.Identifier(column.name))]
    if _integer_classes(source, num_classes):
        aggregates += [sql.SQL("min({})").format(source.label),
                       sql.SQL("bit_or(CAST(1 AS bigint) << CAST({l} AS integer)) FILTER (WHERE {l} BETWEEN 0 AND {n})"
                               ).format(l=source.label, n=sql.Literal(LABEL_MASK_BITS - 1))]
    return aggregates


def vocabularies_beside(conn: psycopg.Connection, source: Source, config: TrainingConfig) -> Beside | None:
    """The vocabulary scan started on a second connection in the planning snapshot, so that it runs while the row
    check scans (``encode(counted=...)`` takes its result); None when the source has no categorical column (a
    class list alone is one cheap HashAggregate, not needed at all for labels 0..K-1). It counts every row: when
    the check finds bad rows, ``encode`` scans again without them."""
    categorical = categories(source.feature_columns)
    if not categorical:
        return None
    classes = source.task == "classification" and (source.label_type not in LABEL_TYPES or not config.num_classes)
    return Beside(conn, lambda other: vocabularies(other, source, categorical, classes, config, None),
                  "pgtrain-plan", "planning")


def with_values(source: Source, total: int, lean: Sequence[Any]) -> Source:
    """``source`` with each numeric or date column's mean and "was missing" input, from the lean scan's ``lean``
    values over ``total`` rows; refuses a column that is NULL in every row. The input row's width follows (the
    vocabularies do not change it)."""
    stats = _lean_values(source, lean)
    impute = source.missing_values == "impute"
    columns = []
    for column in source.feature_columns:
        if column.kind == CATEGORY:
            columns.append(column)
            continue
        mean, present = stats[column.name]
        if present == 0:
            raise SourceError(_all_null(source, column.name, total))
        columns.append(replace(column, mean=float(mean) if impute and mean is not None else None,
                               missing=impute and present < total))
    return replace(source, feature_columns=tuple(columns))


def nullable_columns(source: Source, total: int, lean: Sequence[Any]) -> tuple[str, ...]:
    """The feature columns that are NULL in some of the ``total`` rows the lean scan checked (``lean``: its
    values): each numeric or date column with fewer values than rows, and every categorical one (not counted)."""
    stats = _lean_values(source, lean)
    return tuple(c.name for c in source.feature_columns if c.kind == CATEGORY or stats[c.name][1] < total)


def _lean_values(source: Source, lean: Sequence[Any]) -> dict[str, tuple[Any, int]]:
    """Each numeric or date column's (mean, non-NULL count) from the lean scan's values (``lean_aggregates``)."""
    names = [c.name for c in valued(source.feature_columns)]
    numbers = len(names)
    return dict(zip(names, zip(lean[0:2 * numbers:2], lean[1:2 * numbers:2], strict=True), strict=True))


def encode(conn: psycopg.Connection, source: Source, config: TrainingConfig, max_label: int | None,
           lean: Sequence[Any], exclude: sql.Composable | None, parent: Mapping[str, Any] | None = None,
           counted: Mapping[str | None, Mapping[str, Any]] | None = None) -> Encoded:
    """The planned source: ``source`` (``with_values``) with its categorical columns' levels and its classes,
    from the lean scan's ``lean`` values (the largest label ``max_label``) and the vocabulary scan when one is
    needed. ``exclude`` (SQL): bad rows, left out of the vocabularies. ``parent``: the encoding of the version a
    warm start begins from, whose vocabularies, means and classes are kept (levels new since then are
    "other"). ``counted``: the vocabularies of every row, already counted (``vocabularies_beside``), when no row
    is bad."""
    warnings: list[str] = []
    numbers = len(valued(source.feature_columns))
    num_classes = config.num_classes
    wants_classes = source.task == "classification" and source.label_type not in LABEL_TYPES or (
        _integer_classes(source, config.num_classes) and not _complete_class_numbers(max_label, lean[2 * numbers:]))
    categorical = categories(source.feature_columns)
    if parent is not None:
        source = _from_parent(conn, source, parent, config, exclude)
        if quantiles.wanted(source, config) and not any(c.edges for c in source.feature_columns):
            warnings.append(f"numeric_bins {max(bin_counts(config))}: the version this run starts from "
                            "has standardized numeric inputs, which a warm start keeps (its weights are for them); "
                            "train from scratch (init_from='scratch') for quantile bins")
    else:
        source = quantiles.with_edges(conn, source, config, exclude)
    if parent is None and (categorical or wants_classes):
        if counted is None or (wants_classes and None not in counted):
            counted = vocabularies(conn, source, categorical, wants_classes, config, exclude)
        columns = []
        for column in source.feature_columns:
            if column.kind == CATEGORY:
                column = _levels(source, column, counted[column.name], config, warnings)
            columns.append(column)
        source = replace(source, feature_columns=tuple(columns))
        if wants_classes:
            source, warning = _classes(source, counted[None])
            warnings += [warning] if warning else []
    source = level_storage.stored(source, config)
    if (problem := level_storage.class_problem(source, config)) is not None:
        raise SourceError(problem)
    if source.classes is not None:
        num_classes = len(source.classes)
    elif source.task == "classification" and not num_classes:
        num_classes = _class_numbers(source, max_label)
    _check_hashes(source)
    return Encoded(source, num_classes, tuple(warnings))


def _integer_classes(source: Source, num_classes: int | None) -> bool:
    return source.task == "classification" and source.label_type in LABEL_TYPES and not num_classes


def _complete_class_numbers(max_label: int | None, lean: Sequence[Any]) -> bool:
    """Whether the labels are exactly 0..max_label (then they are the class numbers, as before class lists)."""
    if not lean or max_label is None:
        return False
    low, mask = lean
    return low == 0 and max_label < LABEL_MASK_BITS and mask == (1 << (max_label + 1)) - 1 and max_label >= 1


def _class_numbers(source: Source, max_label: int | None) -> int:
    if max_label is None or max_label < 1:
        raise SourceError(
            f"the labels of {source.qualified_name} do not name at least two classes (largest usable label: "
            f"{max_label}); labels are class numbers 0..num_classes-1, or set num_classes")
    return max_label + 1


def vocabularies(conn: psycopg.Connection, source: Source, categorical: Sequence[Column], classes: bool,
                 config: TrainingConfig, exclude: sql.Composable | None) -> dict[str | None, dict[str, Any]]:
    """One scan: per categorical column (and the label, key None, when ``classes``) its distinct non-NULL levels,
    the rows (training and validation) with a value in it, the training rows of NULL, and its most frequent
    levels (at most max_categories; classes: all, up to MAX_CLASSES + 1) as (level, training rows, validation
    rows, hash)."""
    names = [c.name for c in categorical] + ([source.label_column] if classes else [])
    texts = [sql.Identifier(f"_pgtrain_t{i}") for i in range(len(names))]
    width = len(names)
    masks = [((1 << width) - 1) & ~(1 << (width - 1 - i)) for i in range(width)]
    level = sql.SQL("CASE GROUPING({}) {} END").format(sql.SQL(", ").join(texts),sql.SQL(" ").join(
        sql.SQL("WHEN {} THEN {}").format(sql.Literal(m), t) for m, t in zip(masks, texts, strict=True)))
    cap = sql.SQL("CASE g WHEN {} THEN {} ELSE {} END").format(
        sql.Literal(masks[-1] if classes else -1), sql.Literal(MAX_CLASSES + 1), sql.Literal(config.max_categories))
    split = is_held_out(source, config.validation_fraction, config.test_fraction, config.seed)
    query = sql.SQL(
        """SELECT g, level, n, val_n, levels, valued, hashtextextended(level, 0) FROM (
             SELECT g, level, n, val_n, count(level) OVER (PARTITION BY g) AS levels,
                    sum(n + val_n) FILTER (WHERE level IS NOT NULL) OVER (PARTITION BY g) AS valued,
                    row_number() OVER (PARTITION BY g ORDER BY level IS NULL, n DESC, level) AS r
             FROM (SELECT GROUPING({texts}) AS g, {level} AS level,
                          count(*) - count(*) FILTER (WHERE _pgtrain_v) AS n,
                          count(*) FILTER (WHERE _pgtrain_v) AS val_n
                   FROM (SELECT {columns}, {split} AS _pgtrain_v FROM {rel} {where}) AS _pgtrain_rows
                   GROUP BY GROUPING SETS ({sets})) AS grouped) AS ranked
           WHERE r <= {cap} OR level IS NULL""").format(
        level=level, texts=sql.SQL(", ").join(texts), split=split, rel=source.relation,
        columns=sql.SQL(", ").join(sql.SQL('CAST({} AS text) COLLATE "C" AS {}').format(sql.Identifier(n), t)
                                   for n, t in zip(names, texts, strict=True)),
        where=sql.SQL("WHERE NOT {}").format(exclude) if exclude is not None else sql.SQL(""),
        sets=sql.SQL(", ").join(sql.SQL("({})").format(t) for t in texts), cap=cap)
    found: dict[str | None, dict[str, Any]] = {
        (None if classes and i == width - 1 else name): {"levels": 0, "valued": 0, "null": 0, "top": []}
        for i, name in enumerate(names)}
    keys = list(found)
    for g, text, n, val_n, levels, with_value, hashed in conn.execute(query):
        entry = found[keys[masks.index(g)]]
        entry["levels"], entry["valued"] = levels, int(with_value or 0)
        if text is None:
            entry["null"] = n
        else:
            entry["top"].append((text, n, val_n, hashed))
    return found


def _levels(source: Source, column: Column, counted: Mapping[str, Any], config: TrainingConfig,
            warnings: list[str]) -> Column:
    top, distinct, valued = counted["top"], counted["levels"], counted["valued"]
    if not any(n for _, n, _, _ in top):
        raise SourceError(_all_null(source, column.name, sum(n for _, n, _, _ in top) + counted["null"]))
    # Counted over every row with a value, not over the most frequent levels' rows only.
    if distinct > config.max_categories and distinct >= KEY_LIKE_SHARE * valued:
        raise SourceError(
            f"feature column {column.name!r} of {source.qualified_name} has {distinct:,} distinct values in the "
            f"{valued:,} rows that have one: it identifies rows (a key, a name, free text) rather than sorting them "
            f"into categories; leave it out with exclude_columns: [{column.name!r}] (or raise max_categories, now "
            f"{config.max_categories}, if it really is a category)")
    kept = [(text, hashed) for text, n, _, hashed in top if n >= config.min_category_count][:config.max_categories]
    if distinct > len(kept):
        rare = distinct - len(kept)
        warnings.append(f"feature column {column.name!r}: {distinct:,} levels; kept the {len(kept):,} most frequent "
                        f"(max_categories {config.max_categories}, min_category_count {config.min_category_count}), "
                        f"the other {rare:,} are one 'other' level")
    return replace(column, levels=tuple(t for t, _ in kept), hashes=tuple(int(h) for _, h in kept))


def _classes(source: Source, counted: Mapping[str, Any]) -> tuple[Source, str | None]:
    top, distinct = counted["top"], counted["levels"]
    label = source.label_column
    if distinct > MAX_CLASSES:
        raise SourceError(f"label_column {label!r} of {source.qualified_name} has more than {MAX_CLASSES:,} distinct "
                          "values: too many classes for classification (is it a key, or a regression target? then "
                          "set task='regression')")
    trained = [(text, hashed) for text, n, _, hashed in top if n > 0]
    if len(trained) < 2:
        only = ", ".join(repr(t) for t, _ in trained) or "none"
        raise SourceError(f"label_column {label!r} of {source.qualified_name} has {len(trained)} class in its "
                          f"training rows ({only}): classification needs at least two; load rows of other classes")
    trained.sort(key=lambda item: _class_order(item[0], source.label_type))
    unseen = [(text, val_n) for text, n, val_n, _ in top if n == 0 and val_n > 0]
    warning = None
    if unseen:
        rows = sum(v for _, v in unseen)
        warning = (f"label_column {label!r}: {len(unseen)} classes appear only in held-out (validation or test) rows "
                   f"({rows} rows, "
                   "e.g. " + ", ".join(repr(t) for t, _ in unseen[:EXAMPLE_CLASSES]) + "); the model cannot "
                   "predict them and those rows count as wrong")
    classes = tuple(t for t, _ in trained)
    return replace(source, classes=classes, class_hashes=tuple(int(h) for _, h in trained)), warning


def _class_order(text: str, label_type: str) -> tuple[Any, ...]:
    if label_type in LABEL_TYPES:
        return (int(text),)
    return (text,)


def _from_parent(conn: psycopg.Connection, source: Source, parent: Mapping[str, Any], config: TrainingConfig,
                 exclude: sql.Composable | None) -> Source:
    """A warm start's source: encoded as the parent version was, checked to fit this source."""
    from pgtrain.data import encoding

    planned = encoding.apply(source, parent)
    if [(c.name, c.kind) for c in planned.feature_columns] != [(c.name, c.kind) for c in source.feature_columns]:
        raise SourceError("init_from: the version to start from was trained on the feature columns "
                          + ", ".join(f"{c.name} ({c.kind})" for c in planned.feature_columns) + "; this run has "
                          + ", ".join(f"{c.name} ({c.kind})" for c in source.feature_columns)
                          + ": train from scratch (init_from='scratch'), or give the same columns")
    means = {c.name: c.mean for c in planned.feature_columns}
    unimputed = [c.name for c in valued(source.feature_columns) if c.missing and means[c.name] is None]
    if unimputed:
        raise SourceError("init_from: the version to start from has no value to impute a NULL with in "
                          + ", ".join(map(repr, unimputed)) + " (a NULL was a bad row when it was trained), and this "
                          "run's rows have NULLs there: set missing_values='bad_row' (with bad_rows='exclude' to "
                          "leave those rows out), or train from scratch (init_from='scratch')")
    if source.task == "classification" and planned.classes is None and source.label_type not in LABEL_TYPES:
        raise SourceError(f"init_from: the version to start from predicts class numbers (it was trained on integer "
                          f"labels), and this run's label_column {source.label_column!r} is {source.label_type}: "
                          "train from scratch (init_from='scratch')")
    if planned.classes is not None:
        counted = vocabularies(conn, planned, [], True, config, exclude)[None]
        new = sorted({text for text, n, _, _ in counted["top"] if n > 0} - set(planned.classes))
        if new:
            raise SourceError("init_from: the training rows have classes the version to start from does not know ("
                              + ", ".join(map(repr, new[:EXAMPLE_CLASSES])) + "); its output layer has one unit "
                              "per known class: train from scratch (init_from='scratch')")
    return planned


def _all_null(source: Source, column: str, rows: int) -> str:
    return (f"feature column {column!r} of {source.qualified_name} is NULL in all {rows:,} rows it was planned on: "
            f"it tells the model nothing; leave it out with exclude_columns: [{column!r}]")


def _check_hashes(source: Source) -> None:
    for column in source.feature_columns:
        if NULL_HASH in column.hashes or len(set(column.hashes)) != len(column.hashes):
            raise SourceError(f"feature column {column.name!r}: two of its levels (or a level and NULL) have the "
                              "same 64-bit hash; rename one of them")
    if len(set(source.class_hashes)) != len(source.class_hashes):
        raise SourceError(f"label_column {source.label_column!r}: two classes have the same 64-bit hash")

