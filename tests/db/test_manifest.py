"""compute_shards against a real PostgreSQL: exact, disjoint, balanced keyset shards of one snapshot, read once.

The helpers at the top are shared with test_loader.py and test_bad_rows.py (their fixtures ac and small_batches:
conftest.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import psycopg
import pytest
from psycopg import sql

from dev import examples
from pgtrain.config.params import TrainingConfig
from pgtrain.core.errors import PgtrainError, SourceError
from pgtrain.data import key_order, loader, manifest
from pgtrain.data.source.planned import PlannedRows
from pgtrain.data.source.resolve import Source, resolve_source
from pgtrain.data.source.rows import TRAIN, bad_row
from pgtrain.data.source.snapshot import (
    XID_HORIZON,
    XidClock,
    planned_rows,
    seen_xmins,
    snapshot_transaction,
    widen_xid,
    xmins_may_alias,
)
from pgtrain.runs import record


def make_table(conn: psycopg.Connection, name: str, rows: int, dim: int = 4, *, key_type: str = "bigint",
               fmt: str = "float4_array", gaps: bool = True, not_null: bool = True, classes: int = 3,
               seed: int = 0) -> None:
    examples.create_samples_table(conn, ("public", name), key_type=key_type, feature_format=fmt, not_null=not_null)
    features, labels = examples.synthetic(rows, dim, classes, seed)
    examples.insert_samples(conn, features, labels, ("public", name),
                            keys=examples.synthetic_keys(rows, key_type, seed, gaps=gaps))


def plan(conn: psycopg.Connection, table: str, dag_run: str = "run", *, input_dim: int | None = None,
         **params) -> tuple[record.Run, manifest.Plan]:
    run = record.plan_run(conn, "test_shards", dag_run, TrainingConfig.from_mapping({"source_table": table, **params}))
    planned = manifest.plan_shards(conn, run, input_dim=input_dim)
    return record.get_run(conn, run.run_id), planned


def load_all(conn: psycopg.Connection, run: record.Run, streams: int = 1) -> list[loader.ShardData]:
    source = manifest.source_for(conn, run)
    return [loader.load_shard(conn, source, shard, run.input_dim, run.config.validation_fraction, run.config.seed,
                              streams=streams, test_fraction=run.config.test_fraction)
            for shard in record.get_manifest(conn, run.run_id)]


def rows_in_key_order(conn: psycopg.Connection, table: str) -> tuple[np.ndarray, np.ndarray]:
    """(features float32, labels) of every row, ordered by the key in SQL: what the ranks should read, in order."""
    rows = conn.execute(sql.SQL("SELECT features, label FROM {} ORDER BY id").format(sql.Identifier(table))).fetchall()
    features = [np.frombuffer(f, "<f4") if isinstance(f, bytes) else np.array(f, np.float32) for f, _ in rows]
    return np.stack(features).astype(np.float32), np.array([label for _, label in rows])


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("key_type", ["bigint", "text", "uuid"])
@pytest.mark.parametrize("world_size", [1, 7])
@pytest.mark.parametrize("streams", [1, 2])
def test_shards_cover_every_row_once_balanced_in_key_order(ac, key_type, world_size, streams):
    make_table(ac, "t", 500, key_type=key_type, gaps=True)
    run, planned = plan(ac, "public.t", world_size=world_size, validation_fraction=0.2)

    shards = record.get_manifest(ac, run.run_id)
    assert shards == planned.shards and len(shards) == world_size
    sizes = [s.row_count for s in shards]
    assert sum(sizes) == planned.total_rows == 500 and max(sizes) - min(sizes) <= 1
    counted = [ac.execute(sql.SQL("SELECT count(*) FROM t WHERE id BETWEEN %s::{t} AND %s::{t}").format(
        t=sql.SQL(key_type)), (s.key_lo, s.key_hi)).fetchone()[0] for s in shards]
    assert counted == sizes  # each range holds exactly its rows: ranges are disjoint and cover the table
    batches = ac.execute("SELECT cardinality(batch_lo) FROM pgtrain.shard_batches WHERE run_id = %s ORDER BY rank",
                         (run.run_id,)).fetchall()
    assert all(n >= s // 16 for (n,), s in zip(batches, sizes, strict=True))

    data = load_all(ac, run, streams)
    assert [d.streams for d in data] == [streams] * world_size  # 500 / 7 rows: at least 4 batches of 16 each
    features, labels = rows_in_key_order(ac, "t")
    np.testing.assert_array_equal(np.concatenate([d.features for d in data]), features)
    np.testing.assert_array_equal(np.concatenate([d.labels for d in data]), labels)
    assert [int(d.is_validation.sum()) for d in data] == [s.val_count for s in shards]
    assert [int(d.is_test.sum()) for d in data] == [s.test_count for s in shards]
    assert [int((d.part == TRAIN).sum()) for d in data] == [s.train_count for s in shards]
    assert 50 < sum(s.val_count for s in shards) < 150  # about 20 %


def test_the_split_is_deterministic_and_depends_on_the_seed(ac):
    make_table(ac, "t", 400)
    first = plan(ac, "public.t", "a", world_size=3, seed=1)[1]
    again = plan(ac, "public.t", "b", world_size=3, seed=1)[1]
    other = plan(ac, "public.t", "c", world_size=3, seed=2)[1]
    assert [s.val_count for s in first.shards] == [s.val_count for s in again.shards]
    assert [s.val_count for s in first.shards] != [s.val_count for s in other.shards]


def test_more_ranks_than_rows_is_a_clear_error(ac):
    make_table(ac, "t", 3)
    with pytest.raises(SourceError, match=r"world_size 5 is larger than the 3 rows of public\.t: every rank needs"):
        plan(ac, "public.t", world_size=5)
    assert ac.execute("SELECT count(*) FROM pgtrain.shard_manifest").fetchone()[0] == 0


def test_an_empty_table_is_a_clear_error(ac):
    examples.create_samples_table(ac, ("public", "t"))
    with pytest.raises(SourceError, match=r"public\.t is empty"):
        plan(ac, "public.t")


def test_replanning_replaces_the_manifest(ac):
    make_table(ac, "t", 100)
    run, _ = plan(ac, "public.t", world_size=4)
    again = manifest.plan_shards(ac, record.get_run(ac, run.run_id))
    assert len(again.shards) == 4
    assert ac.execute("SELECT count(*) FROM pgtrain.shard_batches WHERE run_id = %s", (run.run_id,)).fetchone()[0] == 4
    assert sum(len(d.labels) for d in load_all(ac, run)) == 100


@pytest.mark.parametrize("key_type", ["bigint", "uuid", "text"])
def test_the_key_pass_finds_the_keys_at_exact_positions_and_counts_each_shards_validation_rows(ac, key_type):
    make_table(ac, "t", 20_000, key_type=key_type)  # freshly loaded: no visibility map, planner statistics stale
    ac.execute("UPDATE t SET label = 7 WHERE id IN (SELECT id FROM t ORDER BY id OFFSET 100 LIMIT 50)")
    source = resolve_source(ac, "public.t", "id", "features", "label")
    with snapshot_transaction(ac):
        for exclude in (None, bad_row(source, 4, 3)):
            where = sql.SQL("WHERE NOT {}").format(exclude) if exclude is not None else sql.SQL("")
            numbered = sql.SQL("SELECT id::text, row_number() OVER (ORDER BY id), "
                               "abs(mod(hashtextextended(id::text, 0), 1000000)) < 100000 FROM t {}").format(where)
            expected = ac.execute(numbered).fetchall()
            rows = len(expected)
            assert rows == (20_000 if exclude is None else 19_950)
            shards, batches = manifest.cut_shards(ac, source, rows, 3, 0.1, 0, 64, exclude)
            assert [s.row_count for s in shards] == [len(p) for p in np.array_split(np.arange(rows), 3)]
            first = 0
            for shard, (starts, ends) in zip(shards, batches, strict=True):
                mine = expected[first:first + shard.row_count]
                assert (shard.key_lo, shard.key_hi) == (mine[0][0], mine[-1][0])
                assert shard.val_count == sum(v for _, _, v in mine)
                assert starts[0] == mine[0][0] and ends[-1] == mine[-1][0]
                assert all(r[0] in starts for r in mine if r[1] % 64 == 1)  # the global grid of 64 rows
                first += shard.row_count


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("streams", [1, 2])
def test_rows_inserted_after_planning_are_not_read(ac, db_url, streams):
    make_table(ac, "t", 300, gaps=True)  # keys spread over 1..3010: new keys land inside every shard's range
    free = [k for (k,) in ac.execute("SELECT g FROM generate_series(1, 3010) g "
                                     "WHERE mod(g, 37) = 0 AND g NOT IN (SELECT id FROM t)").fetchall()]
    insert = "INSERT INTO t (id, features, label) SELECT unnest(%s::bigint[]), %s, 1"
    with psycopg.connect(db_url) as early:  # a transaction in progress while compute_shards plans
        early.execute(insert, (free[::2], [9.0] * 4))
        run, _ = plan(ac, "public.t", world_size=3)
        early.commit()
    ac.execute(insert, (free[1::2], [7.0] * 4))  # committed after planning
    assert ac.execute("SELECT count(*) FROM t").fetchone()[0] == 300 + len(free) > 350

    data = load_all(ac, run, streams)
    assert [(len(d.labels), d.streams) for d in data] == [(100, streams)] * 3
    features = np.concatenate([d.features for d in data])
    assert not np.isin(features, [7.0, 9.0]).all(axis=1).any()


_ONE_BY_ONE = """CREATE PROCEDURE insert_one_by_one(first bigint, n integer) LANGUAGE plpgsql AS $$
                   BEGIN
                     FOR i IN 0 .. n - 1 LOOP
                       INSERT INTO t (id, features, label) VALUES (first + 2 * i, '{1,2,3,4}', 1);
                       COMMIT;
                     END LOOP;
                   END $$"""


def test_thousands_of_transactions_beside_a_long_one_load_exactly_the_planned_rows(ac, db_url):
    """Issue 10: a writing transaction open through planning holds the snapshot's xmin back while 10,100
    single-row transactions commit; the plan must not need to list them, nor refuse."""
    make_table(ac, "t", 300, gaps=True)  # keys spread over 1..3010
    ac.execute(_ONE_BY_ONE)
    ac.execute("SET synchronous_commit = off")  # 10,100 commits, no fsync wait
    with psycopg.connect(db_url) as long_writer:
        long_writer.execute("INSERT INTO t (id, features, label) VALUES (1505, '{9,9,9,9}', 2), "
                            "(115001, '{9,9,9,9}', 2)")
        ac.execute("CALL insert_one_by_one(100000, 10100)")
        run, planned = plan(ac, "public.t", world_size=3)
        snapshot = ac.execute("SELECT pg_snapshot_xmax(snapshot)::text::bigint - pg_snapshot_xmin(snapshot)::text::"
                              "bigint, cardinality(seen_xmins) FROM pgtrain.shard_plans").fetchone()
        assert snapshot[0] > 10_100 and snapshot[1] == 0  # the long transaction held the xmin back; nothing listed
        # committed after planning, inside every rank's key range (the procedure's keys are even)
        ac.execute("INSERT INTO t (id, features, label) VALUES (1506, '{7,7,7,7}', 0), (110001, '{7,7,7,7}', 0)")
        ac.execute("CALL insert_one_by_one(119001, 3)")
        long_writer.commit()  # in progress at planning, committed since
    expected = ac.execute("SELECT features, label FROM t WHERE id NOT IN (1505, 115001, 1506, 110001, "
                          "119001, 119003, 119005) ORDER BY id").fetchall()
    assert planned.total_rows == 10_400 == len(expected)
    late = (1505, 115001, 1506, 110001, 119001)
    assert all(any(int(s.key_lo) < k < int(s.key_hi) for k in late) for s in planned.shards)  # every rank's range
    assert ac.execute("SELECT count(*) FROM t").fetchone()[0] == 10_400 + 7

    data = load_all(ac, run)
    assert [len(d.labels) for d in data] == [s.row_count for s in planned.shards]
    np.testing.assert_array_equal(np.concatenate([d.features for d in data]),
                                  np.array([f for f, _ in expected], np.float32))
    np.testing.assert_array_equal(np.concatenate([d.labels for d in data]), [label for _, label in expected])


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("streams", [1, 2])
def test_a_savepoint_row_of_a_transaction_in_progress_at_planning_refuses_rather_than_loading(ac, db_url, streams):
    """pg_snapshot lists no subtransaction xids: such a row looks committed before planning. The rank's count
    check must then refuse; it is never loaded silently."""
    make_table(ac, "t", 100, gaps=True)
    free = ac.execute("SELECT min(g) FROM generate_series((SELECT min(id) FROM t), (SELECT max(id) FROM t)) g "
                      "WHERE g NOT IN (SELECT id FROM t)").fetchone()[0]  # inside the planned key range
    with psycopg.connect(db_url) as writer:
        writer.execute("INSERT INTO t (id, features, label) VALUES (-1, '{9,9,9,9}', 2)")
        with writer.transaction():  # a savepoint: the row gets a subtransaction xid
            writer.execute("INSERT INTO t (id, features, label) VALUES (%s, '{9,9,9,9}', 2)", (free,))
        ac.execute("CREATE TABLE newer ()")  # a newer transaction commits: the snapshot's xmax passes the savepoint
        run, _ = plan(ac, "public.t", world_size=1)
        writer.commit()
    with pytest.raises(SourceError, match=r"read more rows than the 100 its manifest planned"):
        load_all(ac, run, streams)


def test_rows_frozen_by_vacuum_after_planning_are_still_read(ac):
    make_table(ac, "t", 200)
    run, _ = plan(ac, "public.t", world_size=2)
    ac.execute("VACUUM (FREEZE) t")
    assert sum(len(d.labels) for d in load_all(ac, run)) == 200


@pytest.mark.parametrize("change", ["DELETE FROM t WHERE id = (SELECT max(id) FROM t)",
                                    "UPDATE t SET label = 0 WHERE id = (SELECT min(id) FROM t)"])
@pytest.mark.parametrize("streams", [1, 2])
@pytest.mark.usefixtures("small_batches")
def test_rows_deleted_or_updated_after_planning_fail_the_rank_with_a_clear_error(ac, change, streams):
    make_table(ac, "t", 100)
    run, _ = plan(ac, "public.t", world_size=2)
    ac.execute(change)
    with pytest.raises(SourceError, match=r"read 49 rows in its key range but the manifest planned 50"):
        load_all(ac, run, streams)
    assert ac.execute("SELECT count(*) FROM t").fetchone() == (99 if change.startswith("DELETE") else 100,)


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("streams", [1, 2])
def test_a_rank_that_reads_more_rows_than_planned_stops_and_leaves_the_connection_usable(ac, streams):
    make_table(ac, "t", 2000, dim=2)
    run, _ = plan(ac, "public.t", world_size=1)
    shard = record.get_manifest(ac, run.run_id)[0]
    fewer = dataclasses.replace(shard, row_count=shard.row_count - 5)
    with pytest.raises(SourceError, match=r"read more rows than the 1995 its manifest planned"):
        loader.load_shard(ac, manifest.source_for(ac, run), fewer, 2, 0.1, 0, streams=streams)
    assert ac.execute("SELECT count(*) FROM t").fetchone() == (2000,)


def test_loading_needs_the_plan_and_its_own_transaction(ac):
    make_table(ac, "t", 10)
    run, _ = plan(ac, "public.t", world_size=1, allow_unvalidated=True)  # 10 rows: none for validation
    shard = record.get_manifest(ac, run.run_id)[0]
    with pytest.raises(PgtrainError, match="run compute_shards first"):
        loader.load_shard(ac, resolve_source(ac, "public.t", "id", "features", "label"), shard, 4, 0.1, 0)
    source = manifest.source_for(ac, run)
    with pytest.raises(PgtrainError, match="planned 4"):
        loader.load_shard(ac, source, shard, 5, 0.1, 0)
    with ac.transaction(), pytest.raises(PgtrainError, match="autocommit connection outside any transaction"):
        loader.load_shard(ac, source, shard, 4, 0.1, 0)


# --- the xid arithmetic behind "rows as of the planning snapshot" -------------------------------------------

def test_raw_xmins_can_alias_only_once_the_xids_pass_a_32_bit_round():
    young = XidClock("", 1000, 1010, 1010)
    assert not xmins_may_alias(young)
    below = (1 << 32) - XID_HORIZON  # its window ends at 2^32: no raw xmin (3 <= X < xmax) reaches it
    assert not xmins_may_alias(XidClock("", below, below, below))
    near = below + 10  # its window reaches past 2^32 + 3: a frozen row's raw xmin 3 may land in it
    assert xmins_may_alias(XidClock("", near, near, near))
    assert xmins_may_alias(XidClock("", (3 << 32) - 50, (3 << 32) - 50, (3 << 32) - 40))


def test_widen_xid_crosses_the_32_bit_wrap():
    assert widen_xid(5, 10) == (1 << 32) + 5
    assert widen_xid(12, 10) == 12
    assert widen_xid(3, (7 << 32) + 4_000_000_000) == (8 << 32) + 3


def test_seen_xmins_keep_wrapped_rows_on_in_progress_xids_and_the_nearest_after_xmax(monkeypatch):
    base = (3 << 32) - 50  # the planning snapshot's xmax, 50 xids before a 32-bit wrap
    clock = XidClock("", base - 30, base, base + 20, xip=(base - 30, base - 20))
    ages = [clock.now - xid for xid in (base - 20, base + 3, base, base + 3, base + 80)]  # base + 80: "future"
    seen, horizon = seen_xmins(ages, clock)
    assert seen == tuple(x % (1 << 32) for x in (base - 20, base, base + 3, base + 80)) == (
        4294967226, 4294967246, 4294967249, 30)
    assert horizon == base + (1 << 30)
    monkeypatch.setattr("pgtrain.data.source.snapshot.SEEN_XMINS_MAX", 2)
    seen, horizon = seen_xmins(ages, clock)
    assert seen == tuple(x % (1 << 32) for x in (base - 20, base, base + 3))  # in-progress ones always kept
    assert horizon == base + 80
    # A snapshot whose xmin is far behind its xmax: the horizon stays within age()'s reach of that xmin.
    old = XidClock("", base - (1 << 31) + 10, base, base)
    assert seen_xmins([], old) == ((), old.xmin + (1 << 31) - 1)


def test_a_load_long_after_planning_refuses_instead_of_guessing():
    planned = PlannedRows("r", "", xmin=1000, xmax=1010, in_progress=(1000,), seen_xmins=(), xid_horizon=5000,
                          input_dim=4, num_classes=3, exclude_bad_rows=False, batch_rows=16)
    source = Source("public", "t", "id", "features", "label", "bigint", "float4_array", planned)
    text = repr(planned_rows(source, XidClock("", 3990, 4000, 4000)))
    assert "Literal(3000)" in text and "Literal(2990)" in text  # xids since the planning xmin, and xmax
    with pytest.raises(SourceError, match="re-run the DAG run from compute_shards"):
        planned_rows(source, XidClock("", 4990, 5000, 5000))
    far = dataclasses.replace(planned, xid_horizon=1 << 40)
    with pytest.raises(SourceError, match="too far apart"):
        planned_rows(dataclasses.replace(source, plan=far), XidClock("", 0, 1000 + (1 << 31), 1000 + (1 << 31)))


# --- keys with type modifiers, sources that are not tables, and params that do not fit the source -----------

@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize(("key_type", "key"), [("char(6)", "to_hex(g * 7)"), ("varchar(5)", "to_hex(g * 7)"),
                                               ("numeric(8, 2)", "g * 1.5")])
@pytest.mark.parametrize("streams", [1, 2])
def test_keys_with_type_modifiers_are_read_in_their_full_type(ac, key_type, key, streams):
    """char(6) keys are blank-padded: read back as plain `character` (one character) they would all collide."""
    ac.execute(sql.SQL("CREATE TABLE t (id {} PRIMARY KEY, features real[], label integer)").format(sql.SQL(key_type)))
    ac.execute(sql.SQL("INSERT INTO t SELECT {}, ARRAY[g, -g], g % 3 FROM generate_series(1, 300) g").format(
        sql.SQL(key)))
    run, planned = plan(ac, "public.t", world_size=3)
    assert [s.row_count for s in planned.shards] == [100, 100, 100]
    data = load_all(ac, run, streams)
    assert [d.streams for d in data] == [streams] * 3
    features, labels = rows_in_key_order(ac, "t")
    np.testing.assert_array_equal(np.concatenate([d.features for d in data]), features)
    np.testing.assert_array_equal(np.concatenate([d.labels for d in data]), labels)


def test_a_view_gets_advice_that_fits_a_view_and_a_materialized_view_with_a_unique_index_works(ac):
    make_table(ac, "t", 50)
    ac.execute("CREATE VIEW v AS SELECT * FROM t WHERE id > 0")
    with pytest.raises(SourceError, match=r'"public"\."v" is a view.*cannot get a primary key.*materialized view '
                                          r"with a unique index") as failure:
        plan(ac, "public.v")
    assert "ALTER TABLE public.v" not in str(failure.value) and 'ALTER TABLE "public"."v"' not in str(failure.value)
    ac.execute("CREATE MATERIALIZED VIEW m AS SELECT * FROM t")
    with pytest.raises(SourceError, match=r'CREATE UNIQUE INDEX ON "public"\."m" \("id"\)'):
        plan(ac, "public.m", "m1")
    ac.execute("CREATE UNIQUE INDEX ON m (id)")
    run, planned = plan(ac, "public.m", "m2", world_size=2)
    assert sum(len(d.labels) for d in load_all(ac, run)) == planned.total_rows == 50
    ac.execute("CREATE TABLE nokey (id bigint, features real[], label integer)")
    with pytest.raises(SourceError, match=r'ALTER TABLE "public"\."nokey" ADD PRIMARY KEY \("id"\)'):
        plan(ac, "public.nokey", "n")


def test_a_mixed_case_name_given_unquoted_gets_a_quoting_hint(ac):
    examples.load_breast_cancer(ac)
    with pytest.raises(SourceError, match=r"""'Clinic\.Biopsies' does not exist.*did you mean "Clinic"\."Biopsies"\?"""
                                          r".*double quotes"):
        plan(ac, "Clinic.Biopsies", features_column=None, feature_columns=["mean radius"], label_column="diagnosis")
    with pytest.raises(SourceError, match=r'did you mean "Clinic"\."Biopsies"'):
        plan(ac, "biopsies", "b", features_column=None, feature_columns=["mean radius"], label_column="diagnosis")
    with pytest.raises(SourceError, match=r"'nothing_like_it' does not exist") as failure:
        plan(ac, "nothing_like_it", "c")
    assert "did you mean" not in str(failure.value)


@pytest.mark.parametrize(("params", "message"), [
    ({"features_column": "features", "feature_columns": ["mean radius"]},
     r"both features_column \('features'\) and feature_columns .* leave features_column empty"),
    ({"features_column": None}, r"features_column 'features' is not a column of Clinic\.Biopsies"),
    ({"features_column": None, "feature_columns": ["mean radius", "Mean Texture"]},
     r"feature_columns 'Mean Texture' is not a column of Clinic\.Biopsies; its columns are: .*'mean texture'.*"
     r"did you mean 'mean texture'\?"),
    ({"features_column": None, "feature_columns": ["mean radius", "mean radius"]}, r"'mean radius' more than once"),
    ({"features_column": None, "feature_columns": ["mean radius", "diagnosis"]}, r"also in feature_columns"),
    ({"features_column": None, "feature_columns": ["mean radius"], "input_dim": 3}, r"input_dim is 3, but"),
    ({"features_column": None, "feature_columns": ["mean radius"], "label_column": "mean area"},
     r"a class label is an integer, text, .* \(for a numeric target, set task='regression'\)"),
])
def test_source_params_that_do_not_fit_the_source_are_clear_errors(ac, params, message):
    examples.load_breast_cancer(ac)
    with pytest.raises(SourceError, match=message):
        plan(ac, '"Clinic"."Biopsies"', **{"label_column": "diagnosis", **params})
    assert ac.execute("SELECT count(*) FROM pgtrain.shard_manifest").fetchone()[0] == 0


def test_a_split_that_leaves_no_training_rows_is_a_clear_error_but_one_rank_without_any_is_fine(ac):
    def keys(validation: bool) -> list[int]:
        return [g for (g,) in ac.execute(
            "SELECT g FROM generate_series(1, 200) g WHERE (abs(mod(hashtextextended(g::text, 0), 1000000)) < 500000) "
            "= %s ORDER BY g LIMIT 2", (validation,)).fetchall()]

    held_out, trained = keys(True), keys(False)
    ac.execute("CREATE TABLE t (id bigint PRIMARY KEY, features real[], label integer)")
    ac.execute("INSERT INTO t SELECT unnest(%s::bigint[]), '{1,2}', 1", (held_out,))
    with pytest.raises(SourceError, match=r"validation_fraction 0\.5 and test_fraction 0 hold out all 2 usable "
                                          r"rows of public\.t"):
        plan(ac, "public.t", world_size=2, validation_fraction=0.5, test_fraction=0, num_classes=2)
    ac.execute("DELETE FROM t")
    ac.execute("INSERT INTO t SELECT unnest(%s::bigint[]), '{1,2}', 1", (sorted(held_out + trained),))
    ranks = [(s.train_count, s.val_count) for s in plan(ac, "public.t", "b", world_size=4, validation_fraction=0.5,
                                                         test_fraction=0, num_classes=2)[1].shards]
    assert sum(t for t, _ in ranks) == 2 and (0, 1) in ranks


def test_batch_keys_travel_as_text_array_literals_whatever_they_hold(ac):
    keys = ["a", "", "NULL", "x,y", "{}", 'q"uote', "back\\slash", " sp ", "éü", "tab\tnl\n", '\\"', "null"]
    assert ac.execute("SELECT %s::text[]", (manifest.text_array(keys),)).fetchone()[0] == keys
    assert ac.execute("SELECT %s::text[]", (manifest.text_array([]),)).fetchone()[0] == []


def test_the_key_sort_gets_work_mem_for_its_transaction_and_never_less(ac):
    with snapshot_transaction(ac):
        key_order.fit_key_sort(ac, 1_000_000)  # 64 MB
        assert ac.execute("SELECT pg_size_bytes(current_setting('work_mem'))").fetchone()[0] == 64_000_000 >> 10 << 10
        ac.execute("SET LOCAL work_mem = '300MB'")
        key_order.fit_key_sort(ac, 1_000_000)
        assert ac.execute("SELECT current_setting('work_mem')").fetchone()[0] == "300MB"
    assert ac.execute("SELECT current_setting('work_mem')").fetchone()[0] != "62500kB"


@pytest.mark.parametrize("key_type", ["smallint", "integer", "bigint", "numeric"])
def test_each_shards_validation_rows_are_counted_as_the_split_chooses_them(ac, key_type, monkeypatch):
    """Integer keys: the check scan hands over the validation rows' keys, counted per shard in Python (negative
    and extreme keys included); other keys: one more pass. Either way the split's own rows, per shard."""
    ac.execute(sql.SQL("CREATE TABLE t (id {} PRIMARY KEY, features real[], label integer)").format(
        sql.SQL(key_type)))
    top = {"smallint": 32767, "integer": 2**31 - 1}.get(key_type, 2**63 - 1)
    keys = sorted({-top, -top + 1, -1, 0, 1, top - 1, top, *range(-1500, 1500, 7)})
    ac.execute("INSERT INTO t SELECT k, '{1,2,3,4}', abs(k)::bigint %% 3 "
               "FROM unnest(%s::numeric[]) k", (keys,))
    if key_type == "numeric":
        ac.execute("UPDATE t SET id = id + 0.5 WHERE id = 0")
    run, planned = plan(ac, "public.t", world_size=5, validation_fraction=0.3, seed=3)
    expected = [ac.execute(sql.SQL(
        "SELECT count(*) FILTER (WHERE abs(mod(hashtextextended(id::text, 3), 1000000)) < 300000) FROM t "
        "WHERE id BETWEEN %s::{t} AND %s::{t}").format(t=sql.SQL(key_type)), (s.key_lo, s.key_hi)).fetchone()[0]
        for s in planned.shards]
    assert [s.val_count for s in planned.shards] == expected and 0 < sum(expected) < len(keys)
    assert [int(d.is_validation.sum()) for d in load_all(ac, run)] == expected
    source = resolve_source(ac, "public.t", "id", "features", "label")
    folded = manifest._keys_fold_into_the_check(ac, source, 0.3)
    assert folded == (key_type != "numeric" and ac.info.server_version >= 160000)
    # A table whose validation keys could outgrow FOLDED_KEYS_MAX_BYTES counts them in a pass of its own.
    monkeypatch.setattr(manifest, "FOLDED_KEYS_MAX_BYTES", 0)
    assert not manifest._keys_fold_into_the_check(ac, source, 0.3)
    _, again = plan(ac, "public.t", "run-2", world_size=5, validation_fraction=0.3, seed=3)
    assert [s.val_count for s in again.shards] == expected


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("key_type", ["bigint", "text"])
def test_the_key_pass_beside_the_check_cuts_the_plan_one_connection_cuts(ac, key_type, monkeypatch):
    """A large table's key pass runs on a second connection while the check scans (integer keys: collecting the
    validation rows' keys on the way); the plan is the one planning cuts on one connection, to every batch key. When
    the check finds bad rows (bad_rows='exclude'), the keys are sorted again without them."""
    make_table(ac, "t", 3000, key_type=key_type, not_null=False)
    ran_on = []

    def keys_at(conn, *args, **kwargs):
        ran_on.append(conn.info.backend_pid)
        return real(conn, *args, **kwargs)

    def grid_walk(conn, *args, **kwargs):
        ran_on.append(("walk", conn.info.backend_pid))
        return real_walk(conn, *args, **kwargs)

    real, real_walk = key_order.keys_at, key_order.grid_walk
    monkeypatch.setattr(key_order, "keys_at", keys_at)
    monkeypatch.setattr(manifest, "keys_at", keys_at)
    monkeypatch.setattr(key_order, "grid_walk", grid_walk)

    def planned(dag_run: str, beside: bool) -> tuple[list[record.Shard], list[tuple]]:
        monkeypatch.setattr(key_order, "KEY_PASS_BESIDE_MIN_BYTES", 0 if beside else 1 << 62)
        run, result = plan(ac, "public.t", dag_run, world_size=3, validation_fraction=0.2, bad_rows="exclude")
        return result.shards, ac.execute("SELECT rank, batch_lo, batch_hi FROM pgtrain.shard_batches WHERE run_id = %s "
                                         "ORDER BY rank", (run.run_id,)).fetchall()

    ran_on.clear()
    assert planned("beside", True) == planned("alone", False)
    # Beside: one grid walk (no count first) on another backend; alone: keys_at on planning's connection.
    assert ran_on[0][0] == "walk" and ran_on[0][1] != ac.info.backend_pid and ran_on[1:] == [ac.info.backend_pid]
    ac.execute("UPDATE t SET features = NULL WHERE id IN (SELECT id FROM t ORDER BY id LIMIT 7)")
    ran_on.clear()
    with_bad_rows = planned("beside-bad", True)
    assert sum(s.row_count for s in with_bad_rows[0]) == 2993
    assert with_bad_rows == planned("alone-bad", False)
    assert ran_on[-2:] == [ac.info.backend_pid] * 2  # the numbering without the bad rows, on planning's connection
