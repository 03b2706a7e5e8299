"""The COPY BINARY loader against a real PostgreSQL: every feature format gives the same tensors."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from psycopg import sql

from pgtrain import examples, loader, manifest, runs
from pgtrain.source import planned_rows, prefer_index_order, read_xid_clock, snapshot_transaction
from tests import test_manifest as shards
from tests.test_manifest import load_all, plan

ac, small_batches = shards.ac, shards.small_batches  # fixtures

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


def test_tensors_share_the_loaded_memory(ac):
    examples.create_samples_table(ac, ("public", "t"))
    examples.insert_samples(ac, *examples.synthetic(50, 3, 2), ("public", "t"), keys=examples.synthetic_keys(50))
    run, _ = plan(ac, "public.t", world_size=1)
    source = manifest.source_for(ac, run)
    shard = runs.get_manifest(ac, run.run_id)[0]
    data = loader.load_shard(ac, source, shard, run.input_dim, 0.1, 0)  # pin_memory=None: pinned iff CUDA
    assert data.pinned == torch.cuda.is_available()
    features, labels, is_validation = data.tensors()
    features[0, 0] = 42.0
    assert data.features[0, 0] == 42.0 and labels.dtype == torch.int64 and is_validation.dtype == torch.bool
    assert features.is_pinned() == data.pinned


def test_each_batch_is_one_range_scan_of_the_key_index_and_no_rows_are_sorted(ac):
    examples.create_samples_table(ac, ("public", "t"), feature_format="bytea")
    examples.insert_samples(ac, *examples.synthetic(2000, 3, 2), ("public", "t"), keys=examples.synthetic_keys(2000))
    run, _ = plan(ac, "public.t", world_size=2, bad_rows="exclude")
    source = manifest.source_for(ac, run)
    shard = runs.get_manifest(ac, run.run_id)[1]
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
