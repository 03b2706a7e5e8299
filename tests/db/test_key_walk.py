"""The key pass's index walks (key_order.index_walk, and key_order.grid_walk through pgtrain.key_grid) against
percentile_disc's sort (key_order.boundary_query): the same key at every position, whatever the key's type and
order."""

from __future__ import annotations

import pytest

from pgtrain.core.errors import SourceError
from pgtrain.data import key_order
from pgtrain.data.source.resolve import resolve_source
from pgtrain.data.source.snapshot import snapshot_transaction
from tests.db.test_manifest import make_table


def _sorted_keys(conn, source, rows: int, wanted: list[int]) -> dict[int, str]:  # noqa: ANN001
    fractions = "{" + ",".join(repr((p - 0.5) / rows) for p in wanted) + "}"
    (keys,) = conn.execute(key_order.boundary_query(source), (fractions,)).fetchone()
    return dict(zip(wanted, keys, strict=True))


@pytest.mark.parametrize("key_type", ["bigint", "uuid", "text", "timestamptz"])
def test_the_index_walk_finds_the_keys_the_sort_finds(ac, key_type):
    if key_type == "timestamptz":
        make_table(ac, "t", 3_000)
        ac.execute("ALTER TABLE t ALTER COLUMN id TYPE timestamptz "
                   "USING timestamptz '2020-01-01' + id * interval '1 s'")
    else:
        make_table(ac, "t", 3_000, key_type=key_type)
    source = resolve_source(ac, "public.t", "id", "features", "label")
    with snapshot_transaction(ac):
        (rows,) = ac.execute("SELECT count(*) FROM t").fetchone()
        wanted = key_order.shard_grid(rows, 3, 7)[2]
        walked = key_order.keys_at(ac, source, rows, wanted)
        assert walked == key_order.index_walk(ac, source, wanted) == _sorted_keys(ac, source, rows, wanted)
        assert len(set(walked.values())) == len(wanted) and walked[1] == ac.execute(
            "SELECT t.id::text FROM t ORDER BY t.id LIMIT 1").fetchone()[0]


def test_the_index_walk_refuses_positions_past_the_rows(ac):
    make_table(ac, "t", 500)
    source = resolve_source(ac, "public.t", "id", "features", "label")
    with snapshot_transaction(ac):
        wanted = [1, 2, 100, 101, 500]
        assert key_order.index_walk(ac, source, wanted) == _sorted_keys(ac, source, 500, wanted)
        with pytest.raises(SourceError, match="changed while it was being planned"):
            key_order.index_walk(ac, source, [1, 501])


@pytest.mark.parametrize("key_type", ["bigint", "uuid", "text", "timestamptz", "character(40)"])
def test_the_grid_walk_counts_the_rows_and_finds_the_keys_the_sort_finds(ac, key_type):
    """grid_walk needs no count first: it counts the rows while it walks the batch grid, then reads the shard edges
    off the grid; every position's key is the sort's, for shard and batch sizes that do and do not divide the rows,
    and with fewer rows than ranks it gives up (None)."""
    if key_type == "timestamptz":
        make_table(ac, "t", 1_001)
        ac.execute("ALTER TABLE t ALTER COLUMN id TYPE timestamptz "
                   "USING timestamptz '2020-01-01' + id * interval '1 s'")
    elif key_type.startswith("character"):
        make_table(ac, "t", 1_001, key_type="text")
        ac.execute(f"ALTER TABLE t ALTER COLUMN id TYPE {key_type}")
    else:
        make_table(ac, "t", 1_001, key_type=key_type)
    source = resolve_source(ac, "public.t", "id", "features", "label")
    with snapshot_transaction(ac):
        (rows,) = ac.execute("SELECT count(*) FROM t").fetchone()
        for world_size, batch_rows in ((3, 7), (8, 16), (7, 1_000), (2, 5_000), (1, rows), (rows, 2), (5, rows - 1)):
            walked = key_order.grid_walk(ac, source, world_size, batch_rows)
            wanted = key_order.shard_grid(rows, world_size, batch_rows)[2]
            assert walked is not None and walked.rows == rows and walked.batch_rows == batch_rows
            assert walked.keys == _sorted_keys(ac, source, rows, wanted), (world_size, batch_rows)
        assert key_order.grid_walk(ac, source, rows + 1, 16) is None
