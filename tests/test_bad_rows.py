"""Bad rows, found by compute_shards in one pass before any rank starts: each kind named, counted, exemplified."""

from __future__ import annotations

import re

import numpy as np
import psycopg
import pytest

from pgtrain import examples
from pgtrain.errors import SourceError
from tests import test_manifest as shards
from tests.test_manifest import load_all, make_table, plan

ac, small_batches = shards.ac, shards.small_batches  # fixtures

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
    "negative_label": ("float4_array", ["UPDATE t SET label = -2 WHERE id = 16"], {}, {"label_out_of_range": [16]}),
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


@pytest.mark.parametrize("case", CASES)
def test_each_kind_of_bad_row_fails_compute_shards_naming_count_and_keys(ac, case):
    fmt, statements, params, expected = CASES[case]
    make_table(ac, "t", 40, fmt=fmt, not_null=False, gaps=False)
    for statement in statements:
        ac.execute(*(statement if isinstance(statement, tuple) else (statement,)))
    with pytest.raises(SourceError, match=r"bad_rows='exclude'") as failure:
        plan(ac, "public.t", world_size=2, **params)
    assert reported_kinds(str(failure.value)) == {
        kind: (len(keys), [str(k) for k in keys]) for kind, keys in expected.items()}, str(failure.value)
    assert ac.execute("SELECT count(*) FROM pgtrain.shard_manifest").fetchone()[0] == 0


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
    with pytest.raises(SourceError, match=r"25 bad rows of 60") as failure:
        plan(ac, "public.t")
    count, keys = reported_kinds(str(failure.value))["non_finite"]
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


def test_bad_rows_are_counted_in_one_pass_over_the_table(ac, db_url):
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
        assert scans() - before == 1


def test_a_given_input_dim_is_the_expected_length(ac):
    examples.create_samples_table(ac, ("public", "t"), feature_format="bytea")
    examples.insert_samples(ac, *examples.synthetic(20, 6, 2), ("public", "t"), keys=examples.synthetic_keys(20))
    with pytest.raises(SourceError, match=r"wrong_length: 20 rows \(the feature vector does not hold 4 values\)"):
        plan(ac, "public.t", input_dim=4)


def test_a_length_inferred_from_unrepresentative_first_rows_is_refused(ac, monkeypatch):
    monkeypatch.setattr("pgtrain.manifest.LENGTH_SAMPLE", 5)
    make_table(ac, "t", 50, gaps=False)
    ac.execute("UPDATE t SET features = features[1:2] WHERE id <= 5")
    with pytest.raises(SourceError, match=r"45 of 50 rows of public\.t do not have 2 features .* set input_dim"):
        plan(ac, "public.t", bad_rows="exclude")
    assert plan(ac, "public.t", bad_rows="exclude", input_dim=4)[1].excluded_rows == 5
