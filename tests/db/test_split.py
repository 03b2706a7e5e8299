"""The train / validation / test split against a real PostgreSQL: deterministic, disjoint, covering every row, the
same rows the manifest counts and the loader places, and exactly the SQL docs/configuration.md gives users."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from psycopg import sql

from pgtrain.data import manifest
from pgtrain.data.source.resolve import resolve_source
from pgtrain.data.source.rows import TEST, TRAIN, VALIDATION, held_out_key, split_part
from pgtrain.runs import record
from tests.db.test_manifest import load_all, make_table, plan

# docs/configuration.md, "The split": what a user runs to see each row's part (here with the run's values).
DOCUMENTED_SPLIT = """
SELECT id,
       CASE WHEN bucket < round(%(validation_fraction)s * 1000000) THEN 'validation'
            WHEN bucket < round((%(validation_fraction)s + %(test_fraction)s) * 1000000) THEN 'test'
            ELSE 'train' END AS part
FROM (SELECT id, abs(mod(hashtextextended(id::text, %(seed)s), 1000000)) AS bucket FROM {table}) AS keyed
ORDER BY id"""
PARTS = {"train": TRAIN, "validation": VALIDATION, "test": TEST}


def documented_parts(conn: psycopg.Connection, table: str, **split) -> np.ndarray:
    rows = conn.execute(DOCUMENTED_SPLIT.format(table=table), split).fetchall()  # table: a constant of this test
    return np.array([PARTS[part] for _, part in rows], np.uint8)


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("key_type", ["bigint", "text"])  # integer keys: counted by the check scan; text: a pass
def test_the_split_is_disjoint_deterministic_covers_every_row_and_is_the_documented_sql(ac, key_type):
    make_table(ac, "t", 3000, key_type=key_type)
    split = {"validation_fraction": 0.15, "test_fraction": 0.2, "seed": 7}
    run, planned = plan(ac, "public.t", world_size=3, **split)
    shards = record.get_manifest(ac, run.run_id)
    assert all(s.train_count + s.val_count + s.test_count == s.row_count for s in shards)

    expected = documented_parts(ac, "public.t", **split)
    loaded = np.concatenate([d.part for d in load_all(ac, run)])  # key order, as the SQL's ORDER BY id
    np.testing.assert_array_equal(loaded, expected)  # every row in exactly one part, the documented one
    counts = [int((expected == part).sum()) for part in (TRAIN, VALIDATION, TEST)]
    assert counts == [sum(s.train_count for s in shards), sum(s.val_count for s in shards),
                      sum(s.test_count for s in shards)]
    assert sum(counts) == planned.total_rows == 3000
    assert abs(counts[2] / 3000 - 0.2) < 0.03 and abs(counts[1] / 3000 - 0.15) < 0.03  # the fractions asked for

    again, _ = plan(ac, "public.t", "run-2", world_size=2, **split)  # another run, other ranks: the same rows
    np.testing.assert_array_equal(np.concatenate([d.part for d in load_all(ac, again)]), expected)
    other_seed = documented_parts(ac, "public.t", **{**split, "seed": 8})
    assert (other_seed != expected).mean() > 0.2  # the seed chooses the rows

    # Without a test part the validation rows are the same: what a run held out before the test part existed.
    untested, _ = plan(ac, "public.t", "run-3", world_size=3, **{**split, "test_fraction": 0})
    parts = np.concatenate([d.part for d in load_all(ac, untested)])
    np.testing.assert_array_equal(parts == VALIDATION, expected == VALIDATION)
    assert not (parts == TEST).any() and sum(s.test_count for s in record.get_manifest(ac, untested.run_id)) == 0


@pytest.mark.parametrize(("validation_fraction", "test_fraction"), [(0.15, 0.2), (0.1, 0.0), (0.0, 0.3), (0.0, 0.0)])
def test_each_rows_part_and_held_out_key_as_the_sql_sends_them_is_the_documented_part(ac, validation_fraction,
                                                                                     test_fraction):
    """What the loader receives (``split_part``) and what the check scan collects (``held_out_key``) for every
    row, also with an empty validation or test part."""
    make_table(ac, "t", 2000)
    split = {"validation_fraction": validation_fraction, "test_fraction": test_fraction, "seed": 3}
    source = resolve_source(ac, "public.t", "id", "features", "label")
    rows = ac.execute(sql.SQL("SELECT id, {}, {} FROM public.t ORDER BY id").format(
        split_part(source, validation_fraction, test_fraction, 3),
        held_out_key(source, validation_fraction, test_fraction, 3))).fetchall()
    expected = documented_parts(ac, "public.t", **split)
    np.testing.assert_array_equal([bytes(part)[0] for _, part, _ in rows], expected)
    for (key, _, held), part in zip(rows, expected, strict=True):
        assert (held is None) == (part == TRAIN)
        assert held is None or bytes(held) == key.to_bytes(8, "big", signed=True) + bytes([part])
    assert set(expected.tolist()) == {TRAIN} | ({VALIDATION} if validation_fraction else set()) | (
        {TEST} if test_fraction else set())


def test_a_row_whose_bucket_is_a_bound_takes_the_part_above_it(ac):
    """A bucket equal to the first bound is a test row, one equal to the second a training row, as documented."""
    make_table(ac, "t", 500)
    source = resolve_source(ac, "public.t", "id", "features", "label")
    key, bucket = ac.execute("SELECT id, b FROM (SELECT id, abs(mod(hashtextextended(id::text, 3), 1000000)) AS b "
                             "FROM public.t) AS keyed WHERE b BETWEEN 1000 AND 800000 ORDER BY id LIMIT 1").fetchone()
    for validation_fraction, test_fraction, part in ((bucket / 1e6, 0.1, TEST), (0.0, bucket / 1e6, TRAIN),
                                                     (bucket / 1e6, 0.0, TRAIN)):
        found = ac.execute(sql.SQL("SELECT {}, {} FROM public.t WHERE id = %s").format(
            split_part(source, validation_fraction, test_fraction, 3),
            held_out_key(source, validation_fraction, test_fraction, 3)), (key,)).fetchone()
        assert bytes(found[0])[0] == part
        assert (found[1] is None) == (part == TRAIN)
        assert part == documented_parts(ac, "public.t", validation_fraction=validation_fraction,
                                        test_fraction=test_fraction, seed=3)[
            ac.execute("SELECT count(*) FROM public.t WHERE id < %s", (key,)).fetchone()[0]]


def test_the_encoding_learns_categories_from_training_rows_only(ac):
    """A level seen only in test rows is no level of the encoding: the test rows chose nothing, not even it."""
    ac.execute("CREATE TABLE public.c (id bigint PRIMARY KEY, x real, colour text, label integer)")
    ac.execute("INSERT INTO public.c SELECT g, g, 'c' || g % 2, g % 2 FROM generate_series(1, 600) g")
    split = {"validation_fraction": 0.1, "test_fraction": 0.2, "seed": 0}
    parts = documented_parts(ac, "public.c", **split)
    test_keys = [int(k) for k in np.flatnonzero(parts == TEST)[:6] + 1]  # ids are 1..600 in key order
    ac.execute("UPDATE public.c SET colour = 'only-in-test' WHERE id = ANY(%s)", (test_keys,))
    run, _ = plan(ac, "public.c", features_column=None, feature_columns=["x", "colour"], categorical_columns=["colour"],
                  min_category_count=1, **split)
    levels = manifest.source_for(ac, run).feature_columns[1].levels
    assert "c0" in levels and "only-in-test" not in levels
