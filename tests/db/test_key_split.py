"""The split of integer keys on the client (pgtrain.data.key_split) against PostgreSQL's: the same hash of every
key's text form, the same part for every row the loader reads, and the loader's query leaves the hash to it."""

from __future__ import annotations

import numpy as np
import pytest
from psycopg import sql

from pgtrain.data import key_split, loader, manifest
from pgtrain.data.source.resolve import resolve_source
from pgtrain.data.source.rows import split_part
from pgtrain.runs import record
from tests.db.test_manifest import load_all, make_table, plan


@pytest.mark.parametrize("seed", [0, 1, 7, -3, 2**40 + 5])
def test_the_hash_of_each_keys_text_is_postgresqls(ac, seed):
    rng = np.random.default_rng(seed & 0xFFFF)
    keys = np.concatenate([np.arange(-1100, 1100), rng.integers(-2**63, 2**63 - 1, 3000, dtype=np.int64),
                           [-2**63, 2**63 - 1, 10**18, -10**18, 999_999_999_999, 10**11]]).astype(np.int64)
    (expected,) = ac.execute("SELECT array_agg(hashtextextended(k::text, %s) ORDER BY o) "
                             "FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(k, o)", (seed, keys.tolist())).fetchone()
    np.testing.assert_array_equal(key_split.hash_key_texts(keys, seed), np.array(expected, np.int64))
    split = (0.15, 0.2, seed)
    (parts,) = ac.execute(sql.SQL("SELECT array_agg(get_byte({}, 0) ORDER BY o) FROM unnest(%s::bigint[]) "
                                  "WITH ORDINALITY AS u(id, o)").format(
        split_part(_keyed_source(ac), *split)), (keys.tolist(),)).fetchone()
    np.testing.assert_array_equal(key_split.split_parts(keys, *split), np.array(parts, np.uint8))


def _keyed_source(ac):  # noqa: ANN001, ANN202 (a source whose key is "id", for split_part's SQL)
    make_table(ac, "keyed", 10)
    return resolve_source(ac, "public.keyed", "id", "features", "label")


@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("key_type", ["smallint", "integer", "bigint", "text"])
def test_the_loader_splits_integer_keys_on_the_client_as_the_server_would(ac, key_type):
    make_table(ac, "t", 1500, key_type="text" if key_type == "text" else "bigint")
    if key_type in ("smallint", "integer"):
        ac.execute(sql.SQL("ALTER TABLE t ALTER COLUMN id TYPE {}").format(sql.SQL(key_type)))
    split = {"validation_fraction": 0.2, "test_fraction": 0.1, "seed": 11}
    run, _ = plan(ac, "public.t", world_size=2, **split)
    source = manifest.source_for(ac, run)
    query = loader.batch_query(source, record.get_manifest(ac, run.run_id)[0], sql.SQL("true"), 0.2, 11,
                               test_fraction=0.1).as_string(ac)
    assert ("hashtextextended" in query) == (key_type == "text")  # integer keys travel in place of their part
    expected = ac.execute(sql.SQL("SELECT get_byte({}, 0) FROM t ORDER BY id").format(
        split_part(source, 0.2, 0.1, 11))).fetchall()
    loaded = np.concatenate([d.part for d in load_all(ac, run, streams=2)])
    np.testing.assert_array_equal(loaded, np.array([p for (p,) in expected], np.uint8))
