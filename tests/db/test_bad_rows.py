"""Bad rows, each kind named, counted, exemplified: found by compute_shards before any rank starts, except NaN,
infinite and too large feature values (source.LOAD_KINDS), which the loader finds as the rows load (bad_rows='fail';
with bad_rows='exclude' compute_shards finds them too, to leave them out). A rank loading a NaN:
tests/integration/horovod/test_bad_rows_ranks.py."""

from __future__ import annotations

import re

import numpy as np
import psycopg
import pytest

from dev import examples
from pgtrain.core.errors import SourceError
from pgtrain.data.source.rows import LOAD_KINDS
from tests.db.test_manifest import load_all, make_table, plan

NAN, INF, NEG_INF, MAX_FINITE = (np.array([v], "<f4").tobytes() for v in (np.nan, np.inf, -np.inf, 3.4028235e38))
# The bytea features with the float at (0-based) position %(at)s replaced by %(value)s:
CORRUPT_BYTEA = "UPDATE t SET features = overlay(features placing %(value)s from 4 * %(at)s + 1 for 4) WHERE id = "


CASES = {  # name: (format, SQL statements (or (statement, arguments)), plan params, {kind: bad keys})
    "nan": ("float4_array", ["UPDATE t SET features[2] = 'NaN' WHERE id IN (3, 17)"], {}, {"non_finite": [3, 17]}),
    "infinities": ("float4_array", ["UPDATE t SET features[1] = 'Infinity' WHERE id = 5",
                                    "UPDATE t SET features[4] = '-Infinity' WHERE id = 6"], {},
                   {"non_finite": [5, 6]}),
    "float8_nan": ("float8_array", ["UPDATE t SET features[3] = 'NaN' WHERE id = 7"], {}, {"non_finite": [7]}),
    "null_element": ("float4_array", ["UPDATE t SET features[3] = NULL WHERE id = 8"], {}, {"null_elements": [8]}),
    "wrong_length": ("float4_array", ["UPDATE t SET features = features || 1.0::real WHERE id = 9",
                                      "UPDATE t SET features = '{1,2}' WHERE id = 10",
                                      "UPDATE t SET features = '{{1,2},{3,4}}' WHERE id = 11",
                                      "UPDATE t SET features = '{}' WHERE id = 12"], {},
                     {"wrong_length": [9, 10, 11, 12]}),
    "null_features": ("float4_array", ["UPDATE t SET features = NULL WHERE id IN (12, 13)"], {},
                      {"null_features": [12, 13]}),
    "null_label": ("float4_array", ["UPDATE t SET label = NULL WHERE id = 14"], {}, {"null_label": [14]}),
    "label_above_num_classes": ("float4_array", ["UPDATE t SET label = 3 WHERE id = 15",
                                                 "UPDATE t SET label = -1 WHERE id = 16"], {"num_classes": 3},
                                {"label_out_of_range": [15, 16]}),
    "bytea_nan_inf": ("bytea", [(CORRUPT_BYTEA + "18", {"value": NAN, "at": 0}),
                                (CORRUPT_BYTEA + "19", {"value": INF, "at": 3}),
                                (CORRUPT_BYTEA + "20", {"value": NEG_INF, "at": 2}),
                                (CORRUPT_BYTEA + "21", {"value": MAX_FINITE, "at": 1})], {},
                      {"non_finite": [18, 19, 20]}),
    "bytea_wrong_length": ("bytea", ["UPDATE t SET features = features || '\\x00'::bytea WHERE id = 22",
                                     "UPDATE t SET features = substring(features from 1 for 12) WHERE id = 23"],
                           {}, {"wrong_length": [22, 23]}),
    "bytea_null": ("bytea", ["UPDATE t SET features = NULL WHERE id = 24"], {}, {"null_features": [24]}),
}


def reported_kinds(message: str) -> dict[str, tuple[int, list[str]]]:
    """kind -> (count, example keys) from a bad-rows error message."""
    found = re.findall(r"^  (\w+): (\d+) rows \(.*\), e\.g\. keys (.*)$", message, re.MULTILINE)
    return {kind: (int(count), keys.split(", ")) for kind, count, keys in found}


def refusal(conn: psycopg.Connection, table: str, **params) -> tuple[str, bool]:
    """The bad-row error of planning ``table`` (nothing written), else of loading its shards; and whether it came
    from the loader."""
    try:
        run, _ = plan(conn, table, **params)
    except SourceError as error:
        assert conn.execute("SELECT count(*) FROM pgtrain.shard_manifest").fetchone()[0] == 0
        return str(error), False
    with pytest.raises(SourceError) as failure:
        load_all(conn, run)
    assert re.match(r"rank \d+ found \d+ rows with NaN, infinite or out-of-range features in its shard", str(
        failure.value)), str(failure.value)
    return str(failure.value), True


@pytest.mark.parametrize("case", CASES)
def test_each_kind_of_bad_row_fails_the_run_naming_count_and_keys(ac, case):
    fmt, statements, params, expected = CASES[case]
    make_table(ac, "t", 40, fmt=fmt, not_null=False, gaps=False)
    for statement in statements:
        ac.execute(*(statement if isinstance(statement, tuple) else (statement,)))
    message, at_load = refusal(ac, "public.t", world_size=2, **params)
    assert "bad_rows='exclude'" in message
    assert reported_kinds(message) == {
        kind: (len(keys), [str(k) for k in keys]) for kind, keys in expected.items()}, message
    assert at_load == (set(expected) <= set(LOAD_KINDS))


@pytest.mark.parametrize("fmt", ["float4_array", "bytea", "float8_array"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_value_in_the_last_of_1000_features_refuses_the_load(ac, fmt, value):
    make_table(ac, "t", 30, dim=1000, fmt=fmt, gaps=False)
    if fmt == "bytea":
        packed = {"NaN": NAN, "Infinity": INF, "-Infinity": NEG_INF}[value]
        ac.execute(CORRUPT_BYTEA + "29", {"value": packed, "at": 999})
    else:
        ac.execute("UPDATE t SET features[1000] = %s WHERE id = 29", (value,))
    message, at_load = refusal(ac, "public.t", world_size=2)
    assert at_load and message.startswith("rank 1 found 1 rows")
    assert reported_kinds(message) == {"non_finite": (1, ["29"])}, message


def test_a_null_key_is_a_bad_row(ac):
    ac.execute("CREATE TABLE t (id bigint UNIQUE, features real[], label integer)")
    ac.execute("INSERT INTO t SELECT CASE WHEN g = 4 THEN NULL ELSE g END, '{1,2}', mod(g, 2) "
               "FROM generate_series(1, 10) g")
    with pytest.raises(SourceError) as failure:
        plan(ac, "public.t")
    assert reported_kinds(str(failure.value)) == {"null_key": (1, ["NULL"])}


def test_many_bad_rows_report_the_count_and_ten_examples(ac):
    make_table(ac, "t", 60, gaps=False)
    ac.execute("UPDATE t SET features[1] = 'NaN' WHERE id > 35")
    message, _ = refusal(ac, "public.t")
    assert "25 bad rows of 60" in message
    count, keys = reported_kinds(message)["non_finite"]
    assert count == 25 and len(keys) == 10 and set(keys) <= {str(k) for k in range(36, 61)}


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("fmt", ["float4_array", "bytea"])
def test_excluded_bad_rows_are_counted_and_never_loaded(ac, fmt):
    make_table(ac, "t", 200, fmt=fmt, not_null=False, gaps=False, classes=4)
    bad = {"null_features": [5, 6], "wrong_length": [50], "null_label": [90], "label_out_of_range": [120],
           "non_finite": [150, 151, 199]}
    ac.execute("UPDATE t SET features = NULL WHERE id IN (5, 6)")
    ac.execute("UPDATE t SET label = NULL WHERE id = 90")
    ac.execute("UPDATE t SET label = 4 WHERE id = 120")
    if fmt == "bytea":
        ac.execute("UPDATE t SET features = substring(features from 1 for 8) WHERE id = 50")
        for key in (150, 151, 199):
            ac.execute(CORRUPT_BYTEA + str(key), {"value": NAN, "at": 1})
    else:
        ac.execute("UPDATE t SET features = features[1:3] WHERE id = 50")
        ac.execute("UPDATE t SET features[2] = 'Infinity' WHERE id IN (150, 151, 199)")
    good = sorted(set(range(1, 201)) - {k for keys in bad.values() for k in keys})
    run, planned = plan(ac, "public.t", world_size=3, bad_rows="exclude", num_classes=4)

    assert planned.excluded_rows == 8 and planned.total_rows == len(good) == 192
    assert {kind: (b.count, b.example_keys) for kind, b in planned.bad_rows.items()} == {
        kind: (len(keys), [str(k) for k in keys]) for kind, keys in bad.items()}
    stored = ac.execute("SELECT excluded_rows, bad_rows FROM pgtrain.shard_plans WHERE run_id = %s",
                        (run.run_id,)).fetchone()
    assert stored[0] == 8 and stored[1]["non_finite"] == {"count": 3, "example_keys": ["150", "151", "199"]}
    sizes = [s.row_count for s in planned.shards]
    assert sum(sizes) == 192 and max(sizes) - min(sizes) <= 1

    data = load_all(ac, run)
    expected = ac.execute("SELECT label FROM t WHERE id = ANY(%s) ORDER BY id", (good,)).fetchall()
    np.testing.assert_array_equal(np.concatenate([d.labels for d in data]), [label for (label,) in expected])
    assert np.isfinite(np.concatenate([d.features for d in data])).all()


def test_when_every_row_is_bad_excluding_them_leaves_nothing_to_train_on(ac):
    make_table(ac, "t", 10, gaps=False)
    ac.execute("UPDATE t SET features[1] = 'NaN'")
    with pytest.raises(SourceError, match=r"all 10 rows of public\.t are bad"):
        plan(ac, "public.t", bad_rows="exclude")


def test_bad_rows_are_found_in_one_pass_and_named_in_one_more(ac, db_url):
    make_table(ac, "t", 100, not_null=False)
    ac.execute("UPDATE t SET features = NULL WHERE id < 30")
    ac.execute("VACUUM t")
    with psycopg.connect(db_url, autocommit=True) as stats:
        def scans() -> int:
            stats.execute("SELECT pg_stat_clear_snapshot()")
            return stats.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 't'").fetchone()[0]

        ac.execute("SELECT pg_stat_force_next_flush()")  # the statistics of the UPDATE above
        before = scans()
        with pytest.raises(SourceError):
            plan(ac, "public.t", input_dim=4)
        ac.execute("SELECT pg_stat_force_next_flush()")
        assert scans() - before == 2  # the lean check finds bad rows, a second scan names them by kind


def test_a_given_input_dim_is_the_expected_length(ac):
    examples.create_samples_table(ac, ("public", "t"), feature_format="bytea")
    examples.insert_samples(ac, *examples.synthetic(20, 6, 2), ("public", "t"), keys=examples.synthetic_keys(20))
    with pytest.raises(SourceError, match=r"wrong_length: 20 rows \(the feature vector does not hold 4 values\)"):
        plan(ac, "public.t", input_dim=4)


def test_a_length_inferred_from_unrepresentative_first_rows_is_refused(ac, monkeypatch):
    monkeypatch.setattr("pgtrain.data.manifest.LENGTH_SAMPLE", 5)
    make_table(ac, "t", 50, gaps=False)
    ac.execute("UPDATE t SET features = features[1:2] WHERE id <= 5")
    with pytest.raises(SourceError, match=r"45 of 50 rows of public\.t do not have 2 features .* set input_dim"):
        plan(ac, "public.t", bad_rows="exclude")
    assert plan(ac, "public.t", bad_rows="exclude", input_dim=4)[1].excluded_rows == 5


# --- scalar feature columns, float32 range, regression targets ----------------------------------------------

SCALAR_TABLE = """CREATE TABLE "Lab"."Rows" (id bigint PRIMARY KEY, "a b" real, "C" double precision, n numeric,
                  i integer, y double precision, ys double precision[])"""
SCALAR_PARAMS = {"features_column": None, "feature_columns": ["a b", "C", "n", "i"], "label_column": "y",
                 "task": "regression", "missing_values": "bad_row"}
SCALAR_CASES = {  # name: (UPDATE ... SET <this> WHERE id = <key>, keys, {kind: bad keys}, bad columns, params)
    "null": ('"a b" = NULL', [3], {"null_features": [3]}, ["a b"], {}),
    "real_nan": ('"a b" = \'NaN\'', [4], {"non_finite": [4]}, ["a b"], {}),
    "double_infinities": ('"C" = \'Infinity\'', [5], {"non_finite": [5]}, ["C"], {}),
    "numeric_nan_and_integer_null": ("n = 'NaN', i = NULL", [6], {"null_features": [6], "non_finite": [6]},
                                     ["n", "i"], {}),
    "double_beyond_float32": ('"C" = -3.5e38', [7, 8], {"out_of_range": [7, 8]}, ["C"], {}),
    "numeric_beyond_float64": ("n = 1e400", [9], {"out_of_range": [9]}, ["n"], {}),
    "target_null": ("y = NULL", [10], {"null_label": [10]}, [], {}),
    "target_nan_and_too_large": ("y = CASE WHEN id = 11 THEN 'NaN' ELSE 1e39 END", [11, 12],
                                 {"target_non_finite": [11], "target_out_of_range": [12]}, [], {}),
    "array_target": ("ys = CASE id WHEN 13 THEN '{1,NULL}' WHEN 14 THEN '{1,2,3}' WHEN 15 THEN '{1,-Infinity}' "
                     "ELSE '{1,4e38}' END::double precision[]", [13, 14, 15, 16],
                     {"target_wrong_length": [14], "target_null_elements": [13], "target_non_finite": [15],
                      "target_out_of_range": [16]}, [], {"label_column": "ys"}),
}


def make_scalar_table(conn: psycopg.Connection, rows: int = 40) -> None:
    conn.execute('CREATE SCHEMA "Lab"')
    conn.execute(SCALAR_TABLE)
    conn.execute("""INSERT INTO "Lab"."Rows" SELECT g, g / 4.0, g * 1e30, g / 3.0, g, g * 2.5, ARRAY[g, -g]
                    FROM generate_series(1, %s) g""", (rows,))


@pytest.mark.parametrize("case", SCALAR_CASES)
def test_each_bad_scalar_value_fails_the_run_naming_kind_keys_and_columns(ac, case):
    change, keys, expected, columns, params = SCALAR_CASES[case]
    make_scalar_table(ac)
    ac.execute(f'UPDATE "Lab"."Rows" SET {change} WHERE id = ANY(%s)', (keys,))  # noqa: S608 (fixed test SQL)
    message, at_load = refusal(ac, '"Lab"."Rows"', world_size=2, **{**SCALAR_PARAMS, **params})
    assert "bad_rows='exclude'" in message and at_load == (set(expected) <= set(LOAD_KINDS))
    assert reported_kinds(message) == {kind: (len(k), [str(x) for x in k]) for kind, k in expected.items()}, message
    named = re.findall(r"feature columns with NULL, NaN, infinite or out-of-range values: (.*)$", message, re.M)
    assert named == ([", ".join(map(repr, columns))] if columns else []), message


@pytest.mark.usefixtures("small_batches")
def test_excluded_bad_scalar_rows_never_reach_the_loader_and_tiny_doubles_load_as_zero(ac):
    make_scalar_table(ac, 100)
    ac.execute("""UPDATE "Lab"."Rows" SET "C" = CASE id WHEN 5 THEN 4e38 WHEN 6 THEN 'NaN' ELSE "C" END,
                  n = CASE id WHEN 7 THEN 1e400 WHEN 8 THEN 'NaN' WHEN 9 THEN 1e-400 ELSE n END,
                  "a b" = CASE WHEN id = 10 THEN NULL ELSE "a b" END,
                  y = CASE id WHEN 11 THEN 'Infinity' WHEN 12 THEN -1e300 ELSE y END""")
    ac.execute("""UPDATE "Lab"."Rows" SET "C" = 1e-300 WHERE id = 20""")  # underflows float32: 0, not a bad row
    run, planned = plan(ac, '"Lab"."Rows"', world_size=3, bad_rows="exclude", **SCALAR_PARAMS)
    assert planned.excluded_rows == 7 and planned.total_rows == 93
    assert planned.bad_columns == ("a b", "C", "n")
    data = load_all(ac, run)
    features, targets = np.concatenate([d.features for d in data]), np.concatenate([d.labels for d in data])
    good = [k for k in range(1, 101) if k not in (5, 6, 7, 8, 10, 11, 12)]  # 9: 1e-400 is 0 in float32
    assert np.isfinite(features).all() and np.isfinite(targets).all()
    np.testing.assert_array_equal(features[:, 0], np.array(good, np.float32) / 4)
    np.testing.assert_array_equal(targets[:, 0], np.array(good, np.float32) * 2.5)
    assert features[good.index(20), 1] == 0.0 and features[good.index(9), 2] == 0.0


def test_double_precision_array_values_beyond_float32_are_bad_rows(ac):
    make_table(ac, "t", 30, fmt="float8_array", gaps=False)
    ac.execute("UPDATE t SET features[2] = 1e39 WHERE id = 3")
    ac.execute("UPDATE t SET features[1] = -3.41e38 WHERE id = 4")
    ac.execute("UPDATE t SET features[3] = 3.4028234e38 WHERE id = 5")  # the largest float32 values are fine
    ac.execute("UPDATE t SET features[1] = 'Infinity', features[2] = 1e39 WHERE id = 6")
    message, at_load = refusal(ac, "public.t")
    assert at_load and reported_kinds(message) == {"out_of_range": (2, ["3", "4"]), "non_finite": (1, ["6"])}


@pytest.mark.usefixtures("small_batches")
def test_non_finite_rows_in_both_halves_of_a_two_stream_load_are_all_reported(ac):
    make_table(ac, "t", 200, gaps=False)
    ac.execute("UPDATE t SET features[1] = 'NaN' WHERE id IN (3, 198)")
    ac.execute("UPDATE t SET features[4] = '-Infinity' WHERE id = 101")
    run, _ = plan(ac, "public.t", world_size=1)
    with pytest.raises(SourceError) as failure:
        load_all(ac, run, streams=2)
    count, keys = reported_kinds(str(failure.value))["non_finite"]
    assert str(failure.value).startswith("rank 0 found 3 rows") and (count, sorted(keys, key=int)) == (
        3, ["3", "101", "198"]), str(failure.value)


# Feature values that the combined bad-row test (source.bad_row) must judge as the per-kind checks do, by format;
# dim 4. The last ones have the byte size of a good flat array of 4 (real: 24 + 4 x 4 = 40 bytes; a 2-D array has
# 8 more bytes of header, a NULL bitmap takes the header to 32): a size test could not tell them apart.
SHAPES = {
    "float4_array": ["NULL", "'{}'", "'{1,2}'", "'{1,2,3,4,5}'", "'{{1,2},{3,4}}'", "'{{1,2,3,4}}'",
                     "'{1,NULL,3,4}'", "'{1,2,3,NULL,5}'", "'{NULL,NULL,NULL,NULL}'", "'[0:3]={1,2,3,4}'",
                     "'{1,2,3,NaN}'", "'{1,2,3,Infinity}'", "'{{1,2}}'", "'{1,NULL,NULL,4}'"],
    "float8_array": ["NULL", "'{}'", "'{{1,2},{3,4}}'", "'{1,NULL,3,4}'", "'{1,2,3,1e39}'", "'{1,2,3,-1e39}'",
                     "'{1,2,3,-Infinity}'", "'{{1,2,3}}'"],
    "bytea": ["NULL", "''::bytea", "'\\x00'::bytea", "decode(repeat('00', 15), 'hex')",
              "decode(repeat('00', 17), 'hex')", "decode(repeat('00', 32), 'hex')",
              "decode('0000c07f' || repeat('00', 12), 'hex')"],
}

GOOD_SHAPES = {"float4_array": {10}}  # 1-based positions in SHAPES: a flat array of 4 with lower bound 0
VALUE_SHAPES = {"float4_array": {11, 12}, "float8_array": {5, 6, 7}, "bytea": {7}}  # bad by LOAD_KINDS only


@pytest.mark.parametrize("fmt", SHAPES)
@pytest.mark.parametrize("num_classes", [None, 3])
def test_the_combined_bad_row_test_picks_exactly_the_rows_of_the_per_kind_checks(ac, fmt, num_classes):
    from psycopg import sql

    from pgtrain.data.source.resolve import resolve_source
    from pgtrain.data.source.rows import bad_row, row_checks

    shapes = SHAPES[fmt]
    make_table(ac, "t", len(shapes) + 6, fmt=fmt, gaps=False, not_null=False)
    for key, shape in enumerate(shapes, start=1):
        ac.execute(sql.SQL("UPDATE t SET features = {} WHERE id = %s").format(sql.SQL(shape)), (key,))
    labels = {len(shapes) + 1: "NULL", len(shapes) + 2: "-1", len(shapes) + 3: "3", len(shapes) + 4: "2"}
    for key, label in labels.items():
        ac.execute(sql.SQL("UPDATE t SET label = {} WHERE id = %s").format(sql.SQL(label)), (key,))
    if fmt != "bytea":  # the last shapes are the size of a good row (as the comment on SHAPES says)
        good, *same = ac.execute(sql.SQL("SELECT pg_column_size(CAST(v AS {t}[])) FROM unnest(%s::text[]) v").format(
            t=sql.SQL("real" if fmt == "float4_array" else "double precision")),
            (["{1,2,3,4}", *[v.strip("'") for v in shapes[-2 if fmt == "float4_array" else -1:]]],)).fetchall()
        assert same == [good] * len(same)
    source = resolve_source(ac, "public.t", "id", "features", "label")
    for values in (True, False):
        kinds = row_checks(source, 4, num_classes, values=values)
        rows = ac.execute(sql.SQL("SELECT id, {}, {} FROM t ORDER BY id").format(
            bad_row(source, 4, num_classes, values=values), sql.SQL(" OR ").join(kinds.values()))).fetchall()
        assert [(key, lean) for key, lean, _ in rows] == [(key, every) for key, _, every in rows], (values, rows)
        n = len(shapes)
        expected = (set(range(1, n + 1)) - GOOD_SHAPES.get(fmt, set()) - (set() if values else VALUE_SHAPES[fmt])
                    | {n + 1} | ({n + 2, n + 3} if num_classes else set()))
        assert {key for key, lean, _ in rows if lean} == expected, (values, rows)
