"""The chunked tensor store on a real PostgreSQL: round trips, chunking, checkpoints, migration of 001 rows."""

from __future__ import annotations

import shutil

import numpy as np
import psycopg
import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.core.migrations import apply_migrations, discover
from pgtrain.runs.record import plan_run
from pgtrain.store import tensors
from pgtrain.store.model_store import load_tensors


@pytest.fixture
def small_chunks(monkeypatch) -> int:
    monkeypatch.setattr(tensors, "CHUNK_BYTES", 64)
    return 64


STAGED_CHUNKS = ("SELECT {} FROM pgtrain.tensor_chunks JOIN pgtrain.staged_parameters p USING (blob_id) "
                 "WHERE p.run_id = %s")
CHECKPOINT_BLOBS = ("SELECT count(DISTINCT c.blob_id) FROM pgtrain.tensor_chunks c JOIN pgtrain.checkpoints k "
                    "ON k.tensors @> jsonb_build_array(jsonb_build_object('blob_id', c.blob_id)) WHERE k.run_id = %s")


def a_run(conn: psycopg.Connection, name: str = "r1") -> str:
    return plan_run(conn, "pgtrain_training", name, TrainingConfig(model_name="m")).run_id


def every_dtype(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "f32": rng.standard_normal((7, 9)).astype(np.float32),  # 252 bytes: 4 chunks of 64
        "f64": rng.standard_normal(33),
        "f16": rng.standard_normal((3, 5)).astype(np.float16),
        "i64": rng.integers(-2**62, 2**62, 20, dtype=np.int64),
        "i32": rng.integers(-2**31, 2**31 - 1, 17, dtype=np.int32),
        "i16": rng.integers(-2**15, 2**15 - 1, 5, dtype=np.int16),
        "i8": rng.integers(-128, 127, 65, dtype=np.int8),
        "u8": rng.integers(0, 255, 64, dtype=np.uint8),  # exactly one chunk
        "bool": rng.random((4, 4)) > 0.5,
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "big_endian": rng.standard_normal(12).astype(">f4"),
        "strided": rng.standard_normal((6, 8)).astype(np.float32)[:, ::2],
        "nan": np.array([1.0, np.nan, np.inf, -np.inf], dtype=np.float32),
    }


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name, array in want.items():
        assert got[name].shape == array.shape, name
        assert got[name].dtype.name == array.dtype.name, name
        # bit for bit: compare the bytes of the little-endian forms (NaN payloads included)
        assert got[name].astype(array.dtype.newbyteorder("<")).tobytes() == \
            np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"))).tobytes(), name
        assert got[name].flags.writeable and got[name].dtype.isnative, name


def test_staged_round_trip_is_bit_for_bit_for_every_dtype_across_chunks(aconn, small_chunks):
    run_id = a_run(aconn)
    arrays = every_dtype(np.random.default_rng(1))

    tensors.write_staged(aconn, run_id, arrays)

    assert_same(tensors.read_staged(aconn, run_id), arrays)
    chunks = dict(aconn.execute(STAGED_CHUNKS.format("name, count(*)") + " GROUP BY name", (run_id,)).fetchall())
    assert chunks["f32"] == 4 and chunks["u8"] == 1 and "empty" not in chunks
    assert aconn.execute("SELECT max(length(data)) FROM pgtrain.tensor_chunks").fetchone()[0] == small_chunks
    counted = {i.name: i.nonfinite for i in tensors.staged_layout(aconn, run_id)}
    assert counted["nan"] == 3 and counted["f32"] == 0 and counted["i64"] is None


def test_rewriting_staged_tensors_replaces_them(aconn, small_chunks):
    run_id = a_run(aconn)
    tensors.write_staged(aconn, run_id, {"a": np.ones(100, np.float32), "b": np.ones(3, np.float32)})
    tensors.write_staged(aconn, run_id, {"a": np.full(10, 2.0, np.float32)})

    assert_same(tensors.read_staged(aconn, run_id), {"a": np.full(10, 2.0, np.float32)})
    assert aconn.execute(STAGED_CHUNKS.format("count(*)"), (run_id,)).fetchone() == (1,)
    assert aconn.execute("SELECT count(*) FROM pgtrain.tensor_chunks").fetchone() == (1,), "the first write's are gone"


def test_a_dtype_that_is_not_stored_is_refused_before_anything_is_written(aconn):
    run_id = a_run(aconn)
    tensors.write_staged(aconn, run_id, {"a": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match="tensor c: dtype complex64 is not stored"):
        tensors.write_staged(aconn, run_id, {"b": np.ones(3, np.float32), "c": np.ones(2, np.complex64)})
    assert list(tensors.read_staged(aconn, run_id)) == ["a"]


def test_a_missing_chunk_is_an_error_not_a_short_tensor(aconn, small_chunks):
    run_id = a_run(aconn)
    tensors.write_staged(aconn, run_id, {"w": np.arange(64, dtype=np.float32)})
    blob = "(SELECT blob_id FROM pgtrain.staged_parameters WHERE run_id = %s)"
    aconn.execute(f"DELETE FROM pgtrain.tensor_chunks WHERE blob_id = {blob} AND seq = 1", (run_id,))  # noqa: S608
    with pytest.raises(Exception, match="misses chunk"):
        tensors.read_staged(aconn, run_id)
    aconn.execute(f"DELETE FROM pgtrain.tensor_chunks WHERE blob_id = {blob} AND seq > 1", (run_id,))  # noqa: S608
    with pytest.raises(Exception, match=r"incomplete tensors .* w \(64 of 256 bytes\)"):
        tensors.read_staged(aconn, run_id)


def test_checkpoint_is_replaced_read_and_deleted(aconn, small_chunks):
    run_id, other = a_run(aconn), a_run(aconn, "r2")
    rng = np.random.default_rng(2)
    assert tensors.read_checkpoint(aconn, run_id) is None

    first = {"w": rng.standard_normal((10, 10)).astype(np.float32), "opt.momentum": rng.standard_normal(40)}
    tensors.write_checkpoint(aconn, run_id, 1, first, {"epoch": 1, "param_groups": [{"lr": 0.05}]})
    second = {"w": rng.standard_normal((10, 10)).astype(np.float32)}
    tensors.write_checkpoint(aconn, run_id, 2, second, {"epoch": 2, "param_groups": [{"lr": 0.01}]})
    tensors.write_checkpoint(aconn, other, 5, first, {})

    epoch, arrays, meta = tensors.read_checkpoint(aconn, run_id)
    assert epoch == 2 and meta == {"epoch": 2, "param_groups": [{"lr": 0.01}]}
    assert_same(arrays, second)
    assert aconn.execute("SELECT count(*) FROM pgtrain.checkpoints WHERE run_id = %s", (run_id,)).fetchone() == (1,)
    assert aconn.execute(CHECKPOINT_BLOBS, (run_id,)).fetchone() == (1,), "the first checkpoint's chunks are gone"
    others = aconn.execute(CHECKPOINT_BLOBS, (other,)).fetchone()

    tensors.delete_checkpoints(aconn, run_id)
    assert tensors.read_checkpoint(aconn, run_id) is None
    assert aconn.execute("SELECT count(DISTINCT blob_id) FROM pgtrain.tensor_chunks").fetchone() == others
    assert_same(tensors.read_checkpoint(aconn, other)[1], first)


def test_migration_moves_001_rows_into_chunks_and_old_versions_keep_loading(make_database, tmp_path, monkeypatch):
    """A database at 003 with a committed 001-format MLP version and a staged run is upgraded in place."""
    for migration in discover():
        if migration.version <= 3:
            shutil.copy(migration.path, tmp_path / migration.path.name)
    url = make_database(migrate=False)
    rng = np.random.default_rng(3)
    old = {"normalizer.mean": rng.standard_normal(4).astype(np.float32),
           "normalizer.std": rng.random(4).astype(np.float32) + 0.5,
           "layers.0.weight": rng.standard_normal((3, 4)).astype(np.float32),
           "layers.0.bias": rng.standard_normal(3).astype(np.float32),
           "layers.2.weight": rng.standard_normal((2, 3)).astype(np.float32),
           "layers.2.bias": rng.standard_normal(2).astype(np.float32)}
    big = rng.standard_normal(5_000_000).astype(np.float32)  # 20 MB: two 16 MB chunks after the move
    with psycopg.connect(url, autocommit=True) as conn:
        apply_migrations(conn, tmp_path)
        config = {"model_name": "old", "hidden_sizes": [3], "features_column": "features",
                  "label_column": "label", "source_table": "public.samples", "key_column": "id"}
        for run_id in ("d/committed", "d/staged"):
            conn.execute("""INSERT INTO pgtrain.training_runs (run_id, dag_id, dag_run_id, model_name, config,
                                input_dim, num_classes, status) VALUES (%s, 'd', %s, 'old', %s, 4, 2, 'trained')""",
                         (run_id, run_id[2:], psycopg.types.json.Jsonb(config)))
        conn.execute("INSERT INTO pgtrain.model_versions (model_name, version, run_id, fencing_token) "
                     "VALUES ('old', 1, 'd/committed', 1)")
        conn.execute("INSERT INTO pgtrain.model_heads (model_name, version, fencing_token) VALUES ('old', 1, 1)")
        for name, array in old.items():
            conn.execute("INSERT INTO pgtrain.model_tensors (model_name, version, name, shape, dtype, data) "
                         "VALUES ('old', 1, %s, %s, 'float32', %s)", (name, list(array.shape), array.tobytes()))
            conn.execute("INSERT INTO pgtrain.staged_parameters (run_id, name, shape, dtype, data) "
                         "VALUES ('d/staged', %s, %s, 'float32', %s)", (name, list(array.shape), array.tobytes()))
        conn.execute("INSERT INTO pgtrain.staged_parameters (run_id, name, shape, dtype, data) "
                     "VALUES ('d/staged', 'big', %s, 'float32', %s)", ([big.size], big.tobytes()))
        conn.execute("INSERT INTO public.samples (features, label) VALUES ('{1,2,3,4}', 1)")

        assert apply_migrations(conn) == [m.version for m in discover() if m.version > 3]

        renamed = {name.replace("layers.", "net."): array for name, array in old.items()}
        identity = {"target.mean": np.zeros(2, np.float32), "target.std": np.ones(2, np.float32)}
        version, arrays = load_tensors(conn, "old")
        assert version == 1
        assert_same(arrays, {**renamed, **identity})
        assert_same(tensors.read_staged(conn, "d/staged"), {**renamed, **identity, "big": big})
        assert conn.execute(STAGED_CHUNKS.format("count(*), max(length(data))") + " AND p.name = 'big'",
                            ("d/staged",)).fetchone() == (2, 16 * 1024 * 1024)
        spec = conn.execute("SELECT spec FROM pgtrain.model_versions WHERE version = 1").fetchone()[0]
        assert (spec["model"], spec["model_options"], spec["input_dim"], spec["output_dim"], spec["task"]) == \
            ("mlp", {"hidden_sizes": [3]}, 4, 2, "classification")
        assert spec["feature_columns"] == ["features"] and spec["target_column"] == "label"
        columns = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns "
                                              "WHERE table_schema = 'pgtrain' AND table_name = 'model_tensors'")}
        assert "data" not in columns and "nbytes" in columns
        assert conn.execute("SELECT count(*) FROM public.samples").fetchone() == (1,), "user rows are kept"

    torch = pytest.importorskip("torch")
    from pgtrain.models.network import build_model

    model = build_model(spec["model"], spec["input_dim"], spec["output_dim"], spec["model_options"], seed=0)
    model.load_state_dict({n: torch.from_numpy(a) for n, a in arrays.items()}, strict=True)


# -- a state dict over 1 GB ---------------------------------------------------------------------------------
_BIG_WORKER = r"""
import json, resource, sys
import numpy as np, psycopg
from pgtrain.store import tensors
from pgtrain.config.params import TrainingConfig
from pgtrain.store.model_store import commit_run, load_tensors
from pgtrain.runs.record import plan_run, set_model_layout

url, phase, sizes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

def tensor(i, n):
    return np.random.default_rng(i).random(n, dtype=np.float32)

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

with psycopg.connect(url, autocommit=True) as conn:
    base = peak()
    if phase == "commit":
        arrays = {f"layer{i}.weight": tensor(i, n) for i, n in enumerate(sizes)}
        run = plan_run(conn, "big", "big", TrainingConfig(model_name="big", allow_unvalidated=True))
        conn.execute("UPDATE pgtrain.training_runs SET input_dim = 1, output_dim = 2 WHERE run_id = %s",
                     (run.run_id,))
        set_model_layout(conn, run.run_id, {n: {"shape": list(a.shape), "dtype": "float32"} for n, a in arrays.items()})
        tensors.write_staged(conn, run.run_id, arrays)
        result = commit_run(conn, run.run_id, owner={"task_id": "big"})
        ok = result.version == 1
    else:
        version, arrays = load_tensors(conn, "big")
        loaded = peak()
        ok = version == 1 and len(arrays) == len(sizes)
        for i, n in enumerate(sizes):  # bit for bit, one regenerated tensor at a time
            ok = ok and np.array_equal(arrays.pop(f"layer{i}.weight").view(np.uint32), tensor(i, n).view(np.uint32))
print(json.dumps({"ok": bool(ok), "base": base, "peak": peak() if phase == "commit" else loaded}))
"""


@pytest.mark.slow
def test_a_state_dict_over_1_gb_commits_and_loads_bit_for_bit_in_about_one_copy_of_memory(db_url):
    import json
    import os
    import subprocess
    import sys

    sizes = [70_000_000] * 4 + [1_000, 7]  # 1.12 GB of float32
    total = 4 * sum(sizes)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    figures = {}
    for phase in ("commit", "load"):
        proc = subprocess.run([sys.executable, "-c", _BIG_WORKER, db_url, phase, json.dumps(sizes)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        figures[phase] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert figures[phase]["ok"], phase
    print({phase: f"peak RSS {f['peak'] / 2**20:.0f} MiB ({f['peak'] / total:.2f}x the {total / 2**20:.0f} MiB "
                  f"of tensors; {f['base'] / 2**20:.0f} MiB at start)" for phase, f in figures.items()})
    # One copy of the tensors, the interpreter, and a chunk or two in flight; a second copy would be > 2x.
    assert figures["commit"]["peak"] < 1.5 * total
    assert figures["load"]["peak"] < 1.5 * total


def test_chunks_go_with_the_last_row_that_references_them_whoever_deletes_it(aconn, small_chunks):
    kept, doomed = a_run(aconn), a_run(aconn, "r2")
    for run_id in (kept, doomed):
        tensors.write_staged(aconn, run_id, {"w": np.arange(50, dtype=np.float32), "b": np.ones(3, np.float32)})
        tensors.write_checkpoint(aconn, run_id, 1, {"w": np.zeros(40, np.float32)}, {})
    per_run = aconn.execute("SELECT count(*) FROM pgtrain.tensor_chunks").fetchone()[0] // 2
    assert per_run == 4 + 1 + 3  # 200 bytes of w, 12 of b, 160 of the checkpoint's w in chunks of 64

    aconn.execute("DELETE FROM pgtrain.training_runs WHERE run_id = %s", (doomed,))  # cascades to both owners

    assert aconn.execute("SELECT count(*) FROM pgtrain.tensor_chunks").fetchone() == (per_run,)
    assert_same(tensors.read_staged(aconn, kept), {"w": np.arange(50, dtype=np.float32), "b": np.ones(3, np.float32)})
    assert_same(tensors.read_checkpoint(aconn, kept)[1], {"w": np.zeros(40, np.float32)})
