"""The COPY BINARY loader against a real PostgreSQL: every feature format gives the same tensors."""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
import uuid

import numpy as np
import psycopg
import pytest
import torch
from psycopg import sql

from dev import examples
from pgtrain.core.errors import SourceError
from pgtrain.data import encoding, loader, manifest
from pgtrain.data.source import snapshot
from pgtrain.data.source.resolve import Source
from pgtrain.data.source.rows import TEST, TRAIN, VALIDATION
from pgtrain.data.source.snapshot import planned_rows, prefer_index_order, read_xid_clock, snapshot_transaction
from pgtrain.runs import record
from tests import support
from tests.db.test_manifest import load_all, make_table, plan, rows_in_key_order

FORMATS = ["float4_array", "float8_array", "bytea"]


@pytest.mark.usefixtures("small_batches")
def test_bytea_and_array_loaders_return_identical_tensors(ac):
    features, labels = examples.synthetic(300, 6, classes=5, seed=3)
    keys = examples.synthetic_keys(300, "uuid", seed=3)
    loaded = {}
    for fmt in FORMATS:
        examples.create_samples_table(ac, ("public", fmt), key_type="uuid", feature_format=fmt)
        examples.insert_samples(ac, features, labels, ("public", fmt), keys=keys)
        run, planned = plan(ac, f"public.{fmt}", fmt, world_size=3, validation_fraction=0.25)
        assert (planned.input_dim, planned.num_classes) == (6, 5)  # inferred: length of the rows, max label + 1
        loaded[fmt] = load_all(ac, run)
    for fmt in FORMATS:
        for reference, data in zip(loaded["float4_array"], loaded[fmt], strict=True):
            assert data.features.dtype == np.float32 and data.features.flags.c_contiguous
            assert data.labels.dtype == np.int64 and data.is_validation.dtype == np.bool_
            np.testing.assert_array_equal(data.features, reference.features)
            np.testing.assert_array_equal(data.labels, reference.labels)
            np.testing.assert_array_equal(data.is_validation, reference.is_validation)
    everything = np.concatenate([d.features for d in loaded["bytea"]])
    assert sorted(map(tuple, everything.tolist())) == sorted(map(tuple, features.tolist()))


def test_tensors_share_the_loaded_memory_which_is_never_pinned(ac):
    """Pinned memory would create a CUDA context on GPU 0 before the rank selected its GPU, and torch's pinned
    allocator rounds up to a power of two: the loader's arrays are ordinary host memory (trainer/device.py)."""
    examples.create_samples_table(ac, ("public", "t"))
    examples.insert_samples(ac, *examples.synthetic(50, 3, 2), ("public", "t"), keys=examples.synthetic_keys(50))
    run, _ = plan(ac, "public.t", world_size=1)
    source = manifest.source_for(ac, run)
    shard = record.get_manifest(ac, run.run_id)[0]
    data = loader.load_shard(ac, source, shard, run.input_dim, 0.1, 0)
    features, labels, is_validation = data.tensors()
    features[0, 0] = 42.0
    assert data.features[0, 0] == 42.0 and labels.dtype == torch.int64 and is_validation.dtype == torch.bool
    assert not features.is_pinned() and not labels.is_pinned()


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("streams", [1, 2])
def test_validation_last_places_the_training_then_the_validation_rows_each_in_key_order(ac, task, streams):
    """What the trainer trains on: the rows ``features[~is_validation]`` and ``features[is_validation]`` of a load in
    key order, placed so by the load itself (both streams meeting in each part), split as views without a copy."""
    make_table(ac, "t", 700, dim=5)
    params = {"task": "regression", "label_column": "label"} if task == "regression" else {}
    run, _ = plan(ac, "public.t", world_size=2 if streams == 1 else 1, validation_fraction=0.3, **params)
    source = manifest.source_for(ac, run)
    for in_key_order, shard in zip(load_all(ac, run), record.get_manifest(ac, run.run_id), strict=True):
        data = loader.load_shard(ac, source, shard, run.input_dim, run.config.validation_fraction, run.config.seed,
                                 streams=streams, validation_last=True, test_fraction=run.config.test_fraction)
        assert data.streams == streams
        assert data.part.tolist() == [TRAIN] * shard.train_count + [VALIDATION] * shard.val_count + [
            TEST] * shard.test_count
        assert 0 < shard.val_count and 0 < shard.test_count and shard.train_count > 0
        parts = [in_key_order.part == part for part in (TRAIN, VALIDATION, TEST)]
        for (features, labels), rows in zip(data.split(), parts, strict=True):
            np.testing.assert_array_equal(features, in_key_order.features[rows])
            np.testing.assert_array_equal(labels, in_key_order.labels[rows])
            assert np.shares_memory(features, data.features) and np.shares_memory(labels, data.labels)
        with pytest.raises(ValueError, match="validation_last=True"):
            in_key_order.split()


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("streams", [1, 2])
def test_validation_last_fails_the_rank_when_the_rows_no_longer_split_as_planned(ac, streams):
    make_table(ac, "t", 500)
    run, _ = plan(ac, "public.t", world_size=1, validation_fraction=0.2)
    (shard,) = record.get_manifest(ac, run.run_id)
    moved = dataclasses.replace(shard, train_count=shard.train_count + 1, val_count=shard.val_count - 1)
    with pytest.raises(SourceError, match=rf"read more validation rows than the {shard.val_count - 1} its manifest "
                                          "planned: .*re-run the DAG run from compute_shards"):
        loader.load_shard(ac, manifest.source_for(ac, run), moved, 4, 0.2, run.config.seed, streams=streams,
                          validation_last=True, test_fraction=run.config.test_fraction)
    assert ac.execute("SELECT count(*) FROM t").fetchone() == (500,)  # the connection is usable


def test_each_batch_is_one_range_scan_of_the_key_index_and_no_rows_are_sorted(ac):
    examples.create_samples_table(ac, ("public", "t"), feature_format="bytea")
    examples.insert_samples(ac, *examples.synthetic(2000, 3, 2), ("public", "t"), keys=examples.synthetic_keys(2000))
    run, _ = plan(ac, "public.t", world_size=2, bad_rows="exclude")
    source = manifest.source_for(ac, run)
    shard = record.get_manifest(ac, run.run_id)[1]
    with snapshot_transaction(ac):
        prefer_index_order(ac)  # as shard_copy does
        query = loader.batch_query(source, shard, planned_rows(source, read_xid_clock(ac), loader.ROWS_ALIAS), 0.1,
                                   0)
        explain = "\n".join(row[0] for row in ac.execute(sql.SQL("EXPLAIN ") + query).fetchall())
    range_scan = r"Index Scan using t_pkey .*\n.*Index Cond: \(\(id >= \(b\.lo\)::bigint\) AND \(id <= \(b\.hi\)"
    assert re.search(range_scan, explain), explain
    assert re.findall(r"Sort Key: (.*)", explain) == ["b.i"], explain  # only the list of batches is sorted
    assert "Seq Scan on t" not in explain, explain


def test_table_and_column_names_never_clash_with_the_loaders_own(ac):
    """A table named like the loader's aliases, with columns named like its outputs, loads the same rows."""
    ac.execute('CREATE TABLE b ("lo" text PRIMARY KEY, "hi" double precision[], "n" smallint, "i" integer)')
    ac.execute("INSERT INTO b SELECT 'k' || g, ARRAY[g, -g], mod(g, 3), g FROM generate_series(1, 100) g")
    ac.execute('CREATE TABLE "s" AS SELECT * FROM b')
    ac.execute('ALTER TABLE "s" ADD PRIMARY KEY ("lo")')
    for table in ("b", "s"):
        run, _ = plan(ac, f"public.{table}", table, world_size=2, key_column="lo", features_column="hi",
                      label_column="n")
        data = load_all(ac, run)
        expected = sorted([float(g), float(-g)] for g in range(1, 101))
        assert sorted(np.concatenate([d.features for d in data]).tolist()) == expected


# --- scalar feature columns and regression targets --------------------------------------------------------------

def test_the_breast_cancer_example_loads_from_quoted_scalar_columns_as_sklearn_has_it(ac):
    assert examples.load_breast_cancer(ac) == 569
    assert examples.load_breast_cancer(ac) == 0  # already loaded: left as it is
    names, features, labels = examples.breast_cancer()
    assert "mean radius" in names and len(names) == 30
    run, planned = plan(ac, '"Clinic"."Biopsies"', world_size=3, **support.breast_cancer_params())
    assert (planned.input_dim, planned.num_classes, planned.output_dim) == (30, 2, 2)
    assert (run.input_dim, run.num_classes, run.output_dim) == (30, 2, 2)
    data = load_all(ac, run)
    np.testing.assert_array_equal(np.concatenate([d.features for d in data]), features.astype(np.float32))
    np.testing.assert_array_equal(np.concatenate([d.labels for d in data]), labels)
    assert all(d.labels.dtype == np.int64 for d in data)


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("streams", [1, 2])
def test_scalar_columns_of_every_type_load_in_the_given_order_like_a_direct_select(ac, streams):
    ac.execute('CREATE SCHEMA "Lab"')
    ac.execute('''CREATE TABLE "Lab"."Mixed Rows" (id bigint PRIMARY KEY, "mean radius" double precision,
                  "Texture" real, n integer, s smallint, flag boolean, big bigint, amount numeric(10, 3),
                  label smallint)''')
    ac.execute('''INSERT INTO "Lab"."Mixed Rows"
                  SELECT g * 3, sin(g) * 1e6, cos(g)::real, g - 150, -g, g % 3 = 0, g * 1000003, round(g / 7.0, 3),
                         g % 4 FROM generate_series(1, 300) g''')
    order = ["amount", "Texture", "mean radius", "flag", "big", "n", "s"]  # f4 and f8 columns interleaved
    run, planned = plan(ac, '"Lab"."Mixed Rows"', world_size=3, features_column=None, feature_columns=order,
                        validation_fraction=0.2)
    assert planned.input_dim == 7 and run.output_dim == run.num_classes == 4
    data = load_all(ac, run, streams)
    assert [d.streams for d in data] == [streams] * 3
    columns = sql.SQL(", ").join(sql.SQL("CAST({} AS double precision)").format(
        sql.SQL("CAST({} AS integer)").format(sql.Identifier(c)) if c == "flag" else sql.Identifier(c))
        for c in order)
    rows = ac.execute(sql.SQL('SELECT {}, label FROM "Lab"."Mixed Rows" ORDER BY id').format(columns)).fetchall()
    expected = np.array([r[:-1] for r in rows], np.float64).astype(np.float32)
    np.testing.assert_array_equal(np.concatenate([d.features for d in data]), expected)
    np.testing.assert_array_equal(np.concatenate([d.labels for d in data]), [r[-1] for r in rows])
    assert [int(d.is_validation.sum()) for d in data] == [s.val_count for s in planned.shards]


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("streams", [1, 2])
def test_only_columns_null_in_some_planned_row_are_imputed_and_the_rows_load_as_if_every_column_were(ac, streams):
    ac.execute("""CREATE TABLE public.gappy (id text PRIMARY KEY, a real, b double precision, n integer, colour text,
                  label integer)""")
    ac.execute("""INSERT INTO public.gappy
                  SELECT 'k' || lpad(g::text, 4, '0'), CASE WHEN g % 7 = 0 THEN NULL ELSE g / 3.0 END, sqrt(g), g - 100,
                         CASE WHEN g % 5 = 0 THEN NULL ELSE 'c' || g % 3 END, g % 3
                  FROM generate_series(1, 300) g""")
    run, _ = plan(ac, "public.gappy", world_size=2, features_column=None, feature_columns=["a", "b", "n", "colour"],
                  validation_fraction=0.2)
    shards = record.get_manifest(ac, run.run_id)

    def load(source: Source) -> list[loader.ShardData]:
        return [loader.load_shard(ac, source, shard, run.input_dim, 0.2, run.config.seed, streams=streams,
                                  validation_last=True, test_fraction=run.config.test_fraction) for shard in shards]

    source = manifest.source_for(ac, run)
    assert source.plan.nullable_columns == ("a", "colour")  # b and n hold a value in every row
    query = loader.batch_query(source, shards[0], sql.SQL("true"), 0.2, run.config.seed).as_string(ac)
    assert query.count("coalesce(") == 2  # a's mean and colour's NULL hash only
    sent_as_they_are = load(source)
    # A plan from before nullable_columns was recorded: every column's NULLs are replaced, as they always were.
    ac.execute("UPDATE pgtrain.shard_plans SET nullable_columns = NULL WHERE run_id = %s", (run.run_id,))
    every = manifest.source_for(ac, run)
    assert every.plan.nullable_columns is None
    assert loader.batch_query(every, shards[0], sql.SQL("true"), 0.2, run.config.seed).as_string(ac).count(
        "coalesce(") == 4  # a, b, n (imputed means) and colour
    for fast, slow in zip(sent_as_they_are, load(every), strict=True):
        assert fast.streams == streams
        np.testing.assert_array_equal(fast.features, slow.features)
        np.testing.assert_array_equal(fast.labels, slow.labels)
        np.testing.assert_array_equal(fast.is_validation, slow.is_validation)
    features = np.concatenate([d.features for d in sent_as_they_are])
    mean_a = next(c.mean for c in source.feature_columns if c.name == "a")
    assert run.input_dim == 5  # a, b, n, a was missing, colour's code
    missing = features[:, 3] == 1
    assert missing.sum() == 300 // 7 and (features[missing, 0] == np.float32(mean_a)).all()
    assert (features[~missing, 0] != np.float32(mean_a)).all()
    assert (features[:, 4] == encoding.NULL_LEVEL).sum() == 300 // 5


def test_a_scalar_regression_target_loads_as_float32_rows_by_one(ac):
    assert examples.load_diabetes(ac) == 442
    names, features, target = examples.diabetes()
    run, planned = plan(ac, "public.diabetes", world_size=2, num_classes=5, **support.diabetes_params())
    assert (planned.input_dim, planned.num_classes, planned.output_dim) == (10, None, 1)
    assert (run.input_dim, run.num_classes, run.output_dim) == (10, None, 1)  # num_classes is ignored
    data = load_all(ac, run)
    labels = np.concatenate([d.labels for d in data])
    assert labels.dtype == np.float32 and labels.shape == (442, 1)
    np.testing.assert_array_equal(labels[:, 0], target.astype(np.float32))
    np.testing.assert_array_equal(np.concatenate([d.features for d in data]), features.astype(np.float32))
    x, y, val = data[0].tensors()
    assert y.dtype == torch.float32 and tuple(y.shape) == (len(data[0].labels), 1) and x.shape[1] == 10


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("target_type", ["real[]", "double precision[]", "numeric", "integer"])
def test_regression_targets_of_each_type_load_like_a_direct_select(ac, target_type):
    width = 3 if target_type.endswith("[]") else 1
    ac.execute(f"CREATE TABLE t (id bigint PRIMARY KEY, features real[], y {target_type})")
    value = ("ARRAY[g * 0.5, -g, g / 3.0]" if width == 3 else "g * 0.25" if target_type == "numeric" else "g - 7")
    ac.execute(sql.SQL("INSERT INTO t SELECT g, ARRAY[g, g * 2]::real[], {} FROM generate_series(1, 200) g").format(
        sql.SQL(value)))
    run, planned = plan(ac, "public.t", world_size=2, label_column="y", task="regression")
    assert (planned.output_dim, run.output_dim, run.num_classes) == (width, width, None)
    labels = np.concatenate([d.labels for d in load_all(ac, run)])
    expected = [r[0] if width == 3 else [r[0]] for r in ac.execute("SELECT y FROM t ORDER BY id").fetchall()]
    assert labels.dtype == np.float32 and labels.shape == (200, width)
    np.testing.assert_array_equal(labels, np.array(expected, np.float64).astype(np.float32))


def test_an_array_target_of_the_wrong_width_is_excluded_and_never_loaded(ac):
    ac.execute("CREATE TABLE t (id bigint PRIMARY KEY, a real, b real, y double precision[])")
    ac.execute("INSERT INTO t SELECT g, g, -g, ARRAY[g, g + 1] FROM generate_series(1, 50) g")
    ac.execute("UPDATE t SET y = ARRAY[1, 2, 3] WHERE id = 7")
    run, planned = plan(ac, "public.t", world_size=2, features_column=None, feature_columns=["a", "b"],
                        label_column="y", task="regression", bad_rows="exclude")
    assert planned.output_dim == 2 and planned.bad_rows["target_wrong_length"].example_keys == ["7"]
    data = load_all(ac, run)
    labels = np.concatenate([d.labels for d in data])
    assert labels.shape == (49, 2) and 7.0 not in labels[:, 0]


@pytest.fixture
def second_connections(monkeypatch):
    """(connection, its backend pid, its application_name) of each connection load_shard opens for a second
    stream (real ones)."""
    opened = []

    def connect_like(conn, application_name):
        second = real(conn, application_name)
        opened.append((second, second.info.backend_pid,
                       second.execute("SELECT current_setting('application_name')").fetchone()[0]))
        return second

    real = snapshot.connect_like
    monkeypatch.setattr(snapshot, "connect_like", connect_like)
    return opened


@pytest.mark.usefixtures("small_batches")
def test_a_second_stream_reads_the_back_half_on_a_connection_of_its_own(ac, second_connections):
    make_table(ac, "t", 1001, dim=5)  # 63 batches of 16, claimed 8 at a time: the back stream reads last first
    run, _ = plan(ac, "public.t", world_size=1, validation_fraction=0.3)
    assert loader.streams_for(1) == 2 and loader.streams_for(2) == 1
    (one,) = load_all(ac, run)
    assert second_connections == []
    (two,) = load_all(ac, run, streams=2)
    assert (one.streams, two.streams) == (1, 2)
    for name in ("features", "labels", "is_validation"):
        np.testing.assert_array_equal(getattr(two, name), getattr(one, name))
    features, labels = rows_in_key_order(ac, "t")
    np.testing.assert_array_equal(two.features, features)
    np.testing.assert_array_equal(two.labels, labels)
    ((second, pid, application_name),) = second_connections
    assert second.closed and pid != ac.info.backend_pid and application_name == "pgtrain-load"


@pytest.mark.usefixtures("small_batches")
def test_a_second_stream_that_would_wait_behind_a_queued_lock_gives_its_batches_back(ac, db_url, monkeypatch, caplog):
    """The first connection holds shard_batches while a DDL queues behind it; the second connection's lock would
    queue behind the DDL, and the first would wait for the second for ever. It gives its batches back instead."""
    make_table(ac, "t", 500)
    run, _ = plan(ac, "public.t", world_size=1)
    (expected,) = load_all(ac, run)
    ddl, watcher = psycopg.connect(db_url), psycopg.connect(db_url, autocommit=True)
    ddl.execute("SET lock_timeout = '120s'")  # a broken fix would still end, and fail below
    queued = threading.Thread(target=ddl.execute, args=("LOCK TABLE pgtrain.shard_batches IN ACCESS EXCLUSIVE MODE",))
    real = snapshot.connect_like

    def connect_like(conn, application_name):  # in the loading thread, while the first connection streams
        queued.start()
        while not watcher.execute(
                "SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock' "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND relation = 'pgtrain.shard_batches'::regclass)").fetchone()[0]:
            assert queued.is_alive(), "the LOCK TABLE ended before it queued"
            time.sleep(0.01)
        return real(conn, application_name)

    monkeypatch.setattr(snapshot, "connect_like", connect_like)
    try:
        with caplog.at_level(logging.WARNING):
            (data,) = load_all(ac, run, streams=2)
    except BaseException:
        ddl.cancel_safe()  # the LOCK would wait for the load's transaction, which the failure may have left open
        raise
    finally:
        queued.join()  # granted as soon as the load's transaction ended
        ddl.close()
        watcher.close()
    assert data.streams == 1
    assert "gave its batches back before reading any of them" in caplog.text and "lock timeout" in caplog.text
    for name in ("features", "labels", "is_validation"):
        np.testing.assert_array_equal(getattr(data, name), getattr(expected, name))


@pytest.mark.usefixtures("small_batches")
def test_any_other_failure_of_the_second_stream_fails_the_load_and_leaves_the_first_connection_usable(
        ac, monkeypatch, caplog):
    role = f"pgtrain_no_rows_{uuid.uuid4().hex[:8]}"  # may read the plan, not the rows
    make_table(ac, "t", 500)
    run, _ = plan(ac, "public.t", world_size=1)
    ac.execute(sql.SQL("CREATE ROLE {r}; GRANT USAGE ON SCHEMA pgtrain TO {r}; GRANT SELECT ON pgtrain.shard_batches "
                       "TO {r}").format(r=sql.Identifier(role)))
    opened, real = [], snapshot.connect_like

    def connect_like(conn, application_name):
        opened.append(real(conn, application_name))
        opened[-1].execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        return opened[-1]

    monkeypatch.setattr(snapshot, "connect_like", connect_like)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(psycopg.errors.InsufficientPrivilege,
                                                             match="permission denied for table t"):
            load_all(ac, run, streams=2)
        assert "gave its batches back" not in caplog.text
        assert [c.closed for c in opened] == [True]
        assert ac.execute("SELECT count(*) FROM t").fetchone() == (500,)  # the first connection is usable
    finally:
        ac.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=sql.Identifier(role)))


@pytest.mark.usefixtures("small_batches")
def test_a_rank_refused_a_second_connection_loads_on_one(ac, db_url, caplog):
    role = f"pgtrain_one_connection_{uuid.uuid4().hex[:8]}"
    make_table(ac, "t", 300)
    run, _ = plan(ac, "public.t", world_size=1)
    source, (shard,) = manifest.source_for(ac, run), record.get_manifest(ac, run.run_id)
    (expected,) = load_all(ac, run)
    ac.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1").format(sql.Identifier(role)))
    try:
        ac.execute(sql.SQL("GRANT USAGE ON SCHEMA pgtrain TO {r}; GRANT SELECT ON public.t, pgtrain.shard_batches "
                           "TO {r}").format(r=sql.Identifier(role)))
        with psycopg.connect(db_url, user=role, autocommit=True) as limited, caplog.at_level(logging.WARNING):
            data = loader.load_shard(limited, source, shard, 4, 0.1, 0, streams=2)
        assert data.streams == 1
        assert "loading on one connection: a second one could not be opened" in caplog.text
        assert "too many connections for role" in caplog.text
        np.testing.assert_array_equal(data.features, expected.features)
        np.testing.assert_array_equal(data.is_validation, expected.is_validation)
    finally:
        ac.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=sql.Identifier(role)))


class OrderedClaims(loader.Claims):
    """The loader's claims, recorded; ``hold`` ("front" or "back") makes that stream wait, after its first chunk,
    until the other has claimed everything it can: the most uneven load there is, made deterministic."""

    instances: list[OrderedClaims] = []
    hold: str | None = None

    def __init__(self, batches):
        super().__init__(batches)
        self.spans = {"front": [], "back": []}
        self.done = {"front": threading.Event(), "back": threading.Event()}
        OrderedClaims.instances.append(self)

    def _claim(self, stream, claim):
        if stream == self.hold and self.spans[stream]:
            other = "back" if stream == "front" else "front"
            assert self.done[other].wait(60), f"the {other} stream never finished"
        span = claim()
        if span is None:
            self.done[stream].set()
        else:
            self.spans[stream].append(span)
        return span

    def front(self):
        return self._claim("front", super().front)

    def back(self):
        return self._claim("back", super().back)


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("held", ["front", "back"])
def test_two_streams_claim_chunks_until_they_meet_so_the_faster_reads_more(ac, monkeypatch, held):
    make_table(ac, "t", 1001, dim=5)  # 63 batches of 16: chunks of 8, the back's first (56-63) reserved for it
    run, _ = plan(ac, "public.t", world_size=1, validation_fraction=0.3)
    (one,) = load_all(ac, run)
    monkeypatch.setattr(OrderedClaims, "hold", held)
    monkeypatch.setattr(OrderedClaims, "instances", [])
    monkeypatch.setattr(loader, "Claims", OrderedClaims)
    (two,) = load_all(ac, run, streams=2)
    assert two.streams == 2
    for name in ("features", "labels", "is_validation"):
        np.testing.assert_array_equal(getattr(two, name), getattr(one, name))
    ((claims,),) = [OrderedClaims.instances]
    front, back = claims.spans["front"], claims.spans["back"]
    assert back[0] == loader.BatchSpan(56, 63, descending=True)
    if held == "back":  # it read its reserved chunk only
        assert back == [back[0]] and front == [loader.BatchSpan(i, min(i + 7, 55)) for i in range(1, 56, 8)]
    else:  # the front read its first chunk only
        assert front == [loader.BatchSpan(1, 8)]
        assert back[1:] == [loader.BatchSpan(max(i - 7, 9), i, descending=True) for i in range(55, 8, -8)]
    covered = sorted(b for span in front + back for b in range(span.first, span.last + 1))
    assert covered == list(range(1, 64))


@pytest.mark.parametrize("batches", [2, 3, 8, 9, 17, 1000])
@pytest.mark.parametrize("order", ["front first", "back first", "alternating"])
def test_claims_hand_out_every_batch_once_whatever_the_order_of_the_streams(batches, order):
    claims, spans, exhausted, turn = loader.Claims(batches), [], set(), 0
    while len(exhausted) < 2:
        back = {"front first": turn >= batches, "back first": turn < batches, "alternating": turn % 2 == 1}[order]
        back = back if back not in exhausted else not back
        turn += 1
        span = (claims.back if back else claims.front)()
        if span is None:
            exhausted.add(back)
            continue
        assert span.descending == back and span.first <= span.last
        spans.append(span)
    assert spans.count(claims.reserved) == 1
    assert sorted(b for s in spans for b in range(s.first, s.last + 1)) == list(range(1, batches + 1))


def test_prefaulting_maps_fresh_arrays_without_changing_rows_already_stored():
    features = np.empty((300_000, 10), np.float32)  # 12 MB: more than one prefault chunk
    features[:1000] = 7.0  # rows stored before (and while) the thread runs
    thread = loader.prefault_in_background([features])
    features[1000:2000] = 8.0
    if thread is not None:
        thread.join()
    assert (features[:1000] == 7.0).all() and (features[1000:2000] == 8.0).all()
    features[2000:] = 1.0
    assert features.sum(dtype=np.float64) == 7000 * 10 + 8000 * 10 + 298_000 * 10


@pytest.mark.parametrize("width", [1, 64, 1000])
def test_non_finite_rows_are_counted_exactly_and_large_finite_sums_are_not_mistaken_for_them(width):
    x = np.full((50, width), 3.0e38, np.float32)  # its sum overflows: every value is still finite
    assert loader.non_finite_rows(x) == 0
    x[7, -1], x[9, 0], x[9, -1] = np.nan, np.inf, -np.inf
    assert loader.non_finite_rows(x) == 2

