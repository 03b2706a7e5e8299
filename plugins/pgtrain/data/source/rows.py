"""The SQL fragments that select a source's rows, check them and send them, shared by the planner
(``compute_shards``) and the trainer's loader so that both sides agree on which rows a run trains on:

- ``split_part`` / ``held_out_key`` / ``is_validation`` / ``is_test`` / ``is_held_out`` (``by_part``): the
  deterministic train/validation/test split (a hash of the key: docs/configuration.md, "The split");
- ``row_checks`` / ``bad_row``: what makes a row unusable (NULLs, NaN/Inf, values beyond float32, wrong
  length, bad label or target);
- ``feature_payload`` / ``target_payload``: the binary form of a row's features and target the loader reads.
"""

from __future__ import annotations

from collections.abc import Collection

from psycopg import sql

from pgtrain.data.encoding import NULL_HASH, inputs
from pgtrain.data.source.resolve import (
    ARRAY_ELEMENTS,
    CATEGORY,
    COLUMNS,
    DATE_TYPES,
    SCALAR_TYPES,
    WIRE_ARRAYS,
    Column,
    Source,
    valued,
)

_FLOATING = {"real", "double precision", "numeric"}  # may hold NaN and infinities
_WIDER_THAN_FLOAT32 = {"double precision", "numeric"}  # may hold finite values float32 cannot
# float32's largest finite value, exactly, for each type that can exceed it.
_FLOAT32_MAX = {"double precision": "3.4028234663852886e38", "numeric": "340282346638528859811704183484516925440"}
# Resolution of the hash-based split: fractions are applied in millionths.
_SPLIT_BUCKETS = 1_000_000
# A packed little-endian float32 is NaN or infinite when its 8 exponent bits are all set: the high bit of its
# third byte and the low 7 bits of its fourth. In hex, 8 characters per value: the 5th is 8-f, the 7th 7 or f,
# the 8th f.
_BYTEA_NON_FINITE = r"^(?:.{8})*.{4}[89a-f].[7f]f"

# Bad-row kinds, cheapest check first (bad_row ORs them in this order), and what each means.
BAD_ROW_KINDS: dict[str, str] = {
    "null_key": "the key is NULL",
    "null_features": "the features are NULL",
    "wrong_length": "the feature vector does not hold {dim} values",
    "null_label": "the label is NULL",
    "label_out_of_range": "the label is outside [0, {num_classes})",
    "target_wrong_length": "the target array does not hold {outputs} values",
    "null_elements": "the feature array has NULL elements",
    "non_finite": "a feature is NaN or infinite",
    "out_of_range": "a feature is beyond float32's range (|x| > 3.4028235e38)",
    "target_null_elements": "the target array has NULL elements",
    "target_non_finite": "the target is NaN or infinite",
    "target_out_of_range": "the target is beyond float32's range (|x| > 3.4028235e38)",
}
# The feature kinds that need every value looked at. With bad_rows='fail', compute_shards leaves them to the
# loader, which sees every value anyway (one float32 sum per stored batch: a few percent of a load; the same
# test in SQL is one function call per element and costs 10-12 times the rest of the check): a rank
# that finds one refuses the run with the bad-row report (loader.load_shard). With bad_rows='exclude' the rows
# must be left out of the manifest, so compute_shards checks them too.
LOAD_KINDS = ("non_finite", "out_of_range")
# What a kind means when the features are scalar columns.
COLUMN_KINDS = {"null_features": "a feature column is NULL",
                "non_finite": "a feature column is NaN or infinite",
                "out_of_range": "a feature column is beyond float32's range (|x| > 3.4028235e38)"}


def array_length(value: sql.Composable, bytea: bool = False) -> sql.Composable:
    """SQL for the number of values in an array (or packed float32 bytea): NULL for NULL, -1 when it is no flat
    vector."""
    if bytea:
        return sql.SQL("CASE WHEN {f} IS NULL THEN NULL WHEN mod(octet_length({f}), 4) = 0 "
                       "THEN octet_length({f}) / 4 ELSE -1 END").format(f=value)
    return sql.SQL("CASE WHEN {f} IS NULL THEN NULL WHEN array_ndims({f}) = 1 THEN cardinality({f}) "
                   "ELSE -1 END").format(f=value)


def feature_length(source: Source) -> sql.Composable:
    """SQL for the number of features in a row: NULL for NULL features, -1 when they are no flat vector."""
    if source.feature_format == COLUMNS:
        return sql.Literal(len(source.feature_columns))
    return array_length(source.features, source.feature_format == "bytea")


def target_length(source: Source) -> sql.Composable:
    """SQL for the width of an array target (as feature_length)."""
    return array_length(source.label)


def split_bucket(source: Source, seed: int) -> sql.Composable:
    """SQL: the row's place in the split, 0..999999: a hash of the key's text form and ``seed``."""
    return sql.SQL("abs(mod(hashtextextended({}::text, {}), {}))").format(
        source.key, sql.Literal(seed), sql.Literal(_SPLIT_BUCKETS))


def split_bounds(validation_fraction: float, test_fraction: float = 0.0) -> tuple[int, int]:
    """(first test bucket, first training bucket): validation rows take buckets [0, the first), test rows
    [the first, the second), training rows the rest. Validation comes first so that a run without a test part
    holds out exactly the rows runs held out before there was one."""
    validation = int(round(validation_fraction * _SPLIT_BUCKETS))
    return validation, int(round((validation_fraction + test_fraction) * _SPLIT_BUCKETS))


def is_validation(source: Source, fraction: float, seed: int) -> sql.Composable:
    """SQL boolean: the row is held out for validation (it chooses the epoch). Deterministic in (key, seed)."""
    return sql.SQL("({} < {})").format(split_bucket(source, seed), sql.Literal(split_bounds(fraction)[0]))


def is_test(source: Source, validation_fraction: float, test_fraction: float, seed: int) -> sql.Composable:
    """SQL boolean: the row is held out as a test row (it chooses nothing: the version's figures are read on it)."""
    first, last = split_bounds(validation_fraction, test_fraction)
    return sql.SQL("({} BETWEEN {} AND {})").format(split_bucket(source, seed), sql.Literal(first),
                                                   sql.Literal(last - 1))


def is_held_out(source: Source, validation_fraction: float, test_fraction: float, seed: int) -> sql.Composable:
    """SQL boolean: the row is no training row (validation or test); one hash per row."""
    return sql.SQL("({} < {})").format(split_bucket(source, seed),
                                       sql.Literal(split_bounds(validation_fraction, test_fraction)[1]))


# A row's part of the split as the loader receives it (one byte): training rows 0, as runs before the test part.
TRAIN, VALIDATION, TEST = 0, 1, 2


def split_part(source: Source, validation_fraction: float, test_fraction: float, seed: int) -> sql.Composable:
    """SQL bytea, one byte: the row's part (TRAIN, VALIDATION, TEST)."""
    return by_part(source, validation_fraction, test_fraction, seed,
                   *(sql.Literal(bytes([part])) for part in (TRAIN, VALIDATION, TEST)))


def held_out_key(source: Source, validation_fraction: float, test_fraction: float, seed: int) -> sql.Composable:
    """SQL bytea: a held-out row's integer key (``int8send``) followed by its part's byte; NULL for a training row
    (``string_agg`` skips it)."""
    key = sql.SQL("int8send(CAST({} AS bigint))").format(source.key)
    return by_part(source, validation_fraction, test_fraction, seed, sql.SQL("NULL::bytea"),
                   *(sql.SQL("{} || {}").format(key, sql.Literal(bytes([part]))) for part in (VALIDATION, TEST)))


def by_part(source: Source, validation_fraction: float, test_fraction: float, seed: int, train: sql.Composable,
            validation: sql.Composable, test: sql.Composable) -> sql.Composable:
    """SQL: ``train``, ``validation`` or ``test`` by the row's part of the split: two comparisons, no array. A
    training row (most rows) is settled by the first, one hash; a held-out row hashes again for the second
    (docs/performance.md, "No ``width_bucket`` per row")."""
    first, last = split_bounds(validation_fraction, test_fraction)
    bucket = split_bucket(source, seed)
    return sql.SQL("(CASE WHEN {b} >= {last} THEN {train} WHEN {b} >= {first} THEN {test} ELSE {validation} END)"
                   ).format(b=bucket, last=sql.Literal(last), first=sql.Literal(first), train=train, test=test,
                            validation=validation)


def key_range(source: Source, lo: str | sql.Composable, hi: str | sql.Composable) -> sql.Composable:
    """SQL boolean: the key lies in [lo, hi]; bounds are the key's text form (values or SQL), cast to its type."""
    key_type = sql.SQL(source.key_type)  # from format_type() in the catalog, never user text
    lo, hi = (b if isinstance(b, sql.Composable) else sql.Literal(b) for b in (lo, hi))
    return sql.SQL("{k} BETWEEN CAST({lo} AS {t}) AND CAST({hi} AS {t})").format(
        k=source.key, lo=lo, hi=hi, t=key_type
    )


# --- values: checks and binary form ---------------------------------------------------------------------------

def _scalar_non_finite(value: sql.Composable, type_: str) -> sql.Composable | None:
    if type_ in DATE_TYPES:
        return sql.SQL("(NOT isfinite({}))").format(value)
    if type_ not in _FLOATING:
        return None
    # NaN sorts above +Infinity in PostgreSQL (numeric too), so one comparison finds both.
    return sql.SQL("({v} >= CAST('Infinity' AS {t}) OR {v} = CAST('-Infinity' AS {t}))").format(
        v=value, t=sql.SQL(type_))


def _scalar_out_of_range(value: sql.Composable, type_: str) -> sql.Composable | None:
    if type_ not in _WIDER_THAN_FLOAT32:
        return None
    return sql.SQL("(abs({v}) > CAST({m} AS {t}) AND abs({v}) < CAST('Infinity' AS {t}))").format(
        v=value, m=sql.Literal(_FLOAT32_MAX[type_]), t=sql.SQL(type_))


def _array_checks(value: sql.Composable, element: str) -> dict[str, sql.Composable]:
    """null_elements, non_finite and (double precision) out_of_range of a flat array; never NULL."""
    t = sql.SQL(element)
    non_finite = sql.SQL("(CAST('Infinity' AS {t}) <= ANY({f}) OR CAST('-Infinity' AS {t}) = ANY({f}))").format(
        f=value, t=t)
    checks = {
        "null_elements": sql.SQL(
            "CASE WHEN array_ndims({f}) = 1 THEN array_position({f}, NULL) IS NOT NULL ELSE false END").format(
            f=value),
        "non_finite": sql.SQL("coalesce({}, false)").format(non_finite),
    }
    if element in _WIDER_THAN_FLOAT32:
        # Only rows with a value past float32's largest are looked at twice; infinities count as non_finite.
        checks["out_of_range"] = sql.SQL(
            "coalesce((CAST({m} AS {t}) < ANY({f}) OR CAST({n} AS {t}) > ANY({f})) AND NOT {nf}, false)").format(
            m=sql.Literal(_FLOAT32_MAX[element]), n=sql.Literal("-" + _FLOAT32_MAX[element]), t=t, f=value,
            nf=non_finite)
    return checks


def _any_of(parts: list[sql.Composable]) -> sql.Composable | None:
    if not parts:
        return None
    return sql.SQL("coalesce({}, false)").format(sql.SQL(" OR ").join(parts))


def column_checks(column: Column, value: sql.Composable | None = None, *, nulls: bool = True
                  ) -> list[sql.Composable]:
    """SQL booleans (NULL when the value is NULL) of what makes one scalar feature value bad; ``value``: SQL for
    the column's value (default: the column). ``nulls``: a NULL is bad (missing_values='bad_row'). A category is
    never bad: NULL is a level of its own."""
    if column.kind == CATEGORY:
        return []
    value = value if value is not None else sql.Identifier(column.name)
    return ([sql.SQL("{} IS NULL").format(value)] if nulls else []) + [c for c in (
        _scalar_non_finite(value, column.type), _scalar_out_of_range(value, column.type)) if c is not None]


def row_checks(source: Source, dim: int, num_classes: int | None,
               output_dim: int | None = None, *, values: bool = True) -> dict[str, sql.Composable]:
    """SQL booleans (never NULL), one per bad-row kind of BAD_ROW_KINDS that applies to this source.

    ``num_classes``: labels are class numbers 0..num_classes-1 (None: any value is a class). ``output_dim``: the width
    of an array regression target. ``values=False`` leaves out the feature kinds of LOAD_KINDS (the loader checks
    every feature value it stores instead).
    """
    label = source.label
    checks = feature_checks(source, dim, values=values)
    checks["null_label"] = sql.SQL("({} IS NULL)").format(label)
    target = source.target_format
    if target == "label" and num_classes:
        checks["label_out_of_range"] = sql.SQL("coalesce({l} < 0 OR {l} >= {n}, false)").format(
            l=label, n=sql.Literal(num_classes))
    elif target in ("label", "class"):
        pass  # any value is a class; a NULL one is null_label
    elif target == "scalar":
        for kind, check in (("target_non_finite", _scalar_non_finite),
                            ("target_out_of_range", _scalar_out_of_range)):
            found = check(label, source.label_type)
            if found is not None:
                checks[kind] = sql.SQL("coalesce({}, false)").format(found)
    else:
        checks["target_wrong_length"] = sql.SQL("({} IS NOT NULL AND {} IS DISTINCT FROM {})").format(
            label, target_length(source), sql.Literal(output_dim))
        checks |= {f"target_{kind}": check
                   for kind, check in _array_checks(label, ARRAY_ELEMENTS[target]).items()}
    return {kind: checks[kind] for kind in BAD_ROW_KINDS if kind in checks}


def feature_checks(source: Source, dim: int, *, values: bool = True) -> dict[str, sql.Composable]:
    """The key's and features' part of ``row_checks`` (all a row needs to be scored), in BAD_ROW_KINDS order;
    without the per-value kinds of LOAD_KINDS unless ``values``."""
    checks = {"null_key": sql.SQL("({} IS NULL)").format(source.key)}
    if source.feature_format == COLUMNS:
        nulls = source.missing_values == "bad_row"
        scalars = [(sql.Identifier(c.name), c.type) for c in valued(source.feature_columns)]
        if nulls and scalars:
            checks["null_features"] = sql.SQL("({})").format(sql.SQL(" OR ").join(
                sql.SQL("{} IS NULL").format(v) for v, _ in scalars))
        for kind, check in (("non_finite", _scalar_non_finite), ("out_of_range", _scalar_out_of_range)):
            found = _any_of([c for c in (check(v, t) for v, t in scalars) if c is not None])
            if found is not None:
                checks[kind] = found
    else:
        f = source.features
        checks["null_features"] = sql.SQL("({} IS NULL)").format(f)
        checks["wrong_length"] = sql.SQL("({} IS NOT NULL AND {} IS DISTINCT FROM {})").format(
            f, feature_length(source), sql.Literal(dim))
        if source.feature_format == "bytea":
            checks["non_finite"] = sql.SQL("coalesce(encode({}, 'hex') ~ {}, false)").format(
                f, sql.Literal(_BYTEA_NON_FINITE))
        else:
            checks |= _array_checks(f, ARRAY_ELEMENTS[source.feature_format])
    return {kind: checks[kind] for kind in BAD_ROW_KINDS if kind in checks and (values or kind not in LOAD_KINDS)}


def bad_row(source: Source, dim: int, num_classes: int | None, output_dim: int | None = None, *,
            values: bool = True) -> sql.Composable:
    """SQL boolean: the row has any of the problems of ``row_checks`` (the bad_rows='exclude' filter; with
    ``values=False`` without the kinds of LOAD_KINDS, as compute_shards' first scan counts them).

    The same rows as OR-ing ``row_checks``, in fewer function calls: a flat array's NULL, length and NULL-element
    checks are one CASE, a packed bytea's NULL and length checks one comparison, a label's NULL and range checks
    one test: each function call per row is a good share of a check scan's CPU time (docs/performance.md).
    """
    checks = row_checks(source, dim, num_classes, output_dim, values=values)
    merged: dict[str, sql.Composable] = {}
    f = source.features if source.feature_format != COLUMNS else None
    if source.feature_format in ARRAY_ELEMENTS:
        # array_position refuses multi-dimensional arrays: the CASE calls it on flat ones only. NULL or empty
        # features (array_ndims NULL) and wrong shapes fall to ELSE.
        merged["null_features"] = sql.SQL(
            "CASE WHEN array_ndims({f}) = 1 AND cardinality({f}) = {dim} THEN array_position({f}, NULL) IS NOT NULL "
            "ELSE true END").format(f=f, dim=sql.Literal(dim))
        covered = {"null_features", "wrong_length", "null_elements"}
    elif source.feature_format == "bytea":
        merged["null_features"] = sql.SQL("(octet_length({}) IS DISTINCT FROM {})").format(f, sql.Literal(4 * dim))
        covered = {"null_features", "wrong_length"}
    else:
        covered = set()
    if source.target_format == "label" and num_classes:
        merged["null_label"] = sql.SQL("(({l} >= 0 AND {l} < {n}) IS NOT TRUE)").format(
            l=source.label, n=sql.Literal(num_classes))
        covered |= {"null_label", "label_out_of_range"}
    parts = [merged.get(kind, check) for kind, check in checks.items() if kind not in covered or kind in merged]
    return sql.SQL("({})").format(sql.SQL(" OR ").join(parts))


def scalar_value(value: sql.Composable, type_: str) -> sql.Composable:
    """SQL: one scalar as real or double precision (SCALAR_TYPES says which; dates: days since 1970-01-01 as
    double precision), never raising for a value the checks let through."""
    if type_ in DATE_TYPES:
        if type_ == "date":
            value = sql.SQL("CAST({} AS timestamp)").format(value)
        return sql.SQL("(date_part('epoch', {}) / 86400)").format(value)
    if type_ in ("real", "double precision"):
        return value
    if type_ == "numeric":
        # A numeric too small for float8 would raise: it is 0 in float32 anyway. One too large for it (or NaN,
        # which sorts above every number) is sent as 1e300, infinite in float32: the loader finds it and refuses.
        return sql.SQL("CAST(CASE WHEN abs({v}) < 1e-300 THEN 0 WHEN abs({v}) > 1e300 THEN 1e300 ELSE {v} END "
                       "AS double precision)").format(v=value)
    if type_ == "boolean":
        return sql.SQL("CAST(CAST({} AS integer) AS real)").format(value)
    return sql.SQL("CAST({v} AS {t})").format(
        v=value, t=sql.SQL("real" if SCALAR_TYPES[type_] == "f4" else "double precision"))


def _scalar_send(value: sql.Composable, type_: str) -> sql.Composable:
    """SQL bytea: one scalar as float4send or float8send (SCALAR_TYPES says which)."""
    return sql.SQL("float{}send({})").format(sql.SQL(SCALAR_TYPES[type_][1]), scalar_value(value, type_))


def text_hash(value: sql.Composable) -> sql.Composable:
    """SQL bigint: the 64-bit hash a categorical value or class travels as (NULL for NULL): of its text form, byte
    for byte (collation "C"), so that PostgreSQL and the recorded levels agree whatever the column's collation."""
    return sql.SQL('hashtextextended(CAST({} AS text) COLLATE "C", 0)').format(value)


def input_value(part: str, column: Column, null_hash: int, *, nulls: bool = True) -> sql.Composable:
    """SQL for one column of the input row (``pgtrain.data.encoding.inputs``): a value (a NULL imputed with the
    column's mean when it has one), a 0/1 "was missing", or a category's hash (``null_hash`` for NULL).
    ``nulls=False``: the rows read never hold a NULL in this column, which is sent as it is."""
    name = sql.Identifier(column.name)
    if part == "missing":
        return sql.SQL("CAST(CAST({} IS NULL AS integer) AS real)").format(name)
    if part == "code":
        return sql.SQL("coalesce({}, {})").format(text_hash(name), sql.Literal(null_hash)) if nulls else text_hash(name)
    value = scalar_value(name, column.type)
    if column.mean is None or not nulls:
        return value
    return sql.SQL("coalesce({}, CAST({} AS {}))").format(
        value, sql.Literal(repr(float(column.mean))), sql.SQL("real" if column.wire == "f4" else "double precision"))


def feature_groups(source: Source) -> dict[str, list[int]]:
    """Scalar feature columns: wire ('f4', 'f8', 'h8') -> positions in the input row
    (``pgtrain.data.encoding.inputs``); the payload holds the groups in that order, each in input order, each one
    real[], double precision[] or bigint[] (array_send)."""
    groups: dict[str, list[int]] = {"f4": [], "f8": [], "h8": []}
    for i, (part, column) in enumerate(_inputs(source)):
        groups["f4" if part == "missing" else column.wire].append(i)
    return {wire: positions for wire, positions in groups.items() if positions}


def _inputs(source: Source) -> list[tuple[str, Column]]:
    return inputs(source.feature_columns)


def feature_payload(source: Source, nullable: Collection[str] | None = None) -> sql.Composable:
    """SQL bytea: a row's features as the loader reads them. ``nullable``: the scalar feature columns that may be
    NULL in the rows read (None: any); the others skip the NULL replacement (a coalesce per value: 0.3-0.4 of
    the 2.5 server CPU-seconds of a 500k x 100 load, benchmarks/RESULTS.md)."""
    if source.feature_format == "bytea":
        return source.features
    if source.feature_format != COLUMNS:
        return sql.SQL("array_send({})").format(source.features)
    planned = _inputs(source)
    # One array per group, built in one allocation and sent by array_send: measured faster than concatenating
    # one float4send per column (each || copies the row so far) and than the plain COPY's 100 fields.
    return sql.SQL(" || ").join(
        sql.SQL("array_send(CAST(ARRAY[{}] AS {}))").format(
            sql.SQL(", ").join(input_value(*planned[i], NULL_HASH,
                                           nulls=nullable is None or planned[i][1].name in nullable)
                               for i in positions),
            sql.SQL(ARRAY_ELEMENTS[WIRE_ARRAYS[wire]] + "[]"))
        for wire, positions in feature_groups(source).items())


def target_payload(source: Source) -> sql.Composable:
    """SQL bytea: a row's label (int4; a class list's: its hash, int8) or regression target (scalar or array) as
    the loader reads it."""
    target = source.target_format
    if target == "label":
        return sql.SQL("int4send(CAST({} AS integer))").format(source.label)
    if target == "class":
        return sql.SQL("int8send({})").format(text_hash(source.label))
    if target == "scalar":
        return _scalar_send(source.label, source.label_type)
    return sql.SQL("array_send({})").format(source.label)
