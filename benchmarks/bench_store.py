"""Tensor store benchmark: stage, commit and load a 1 GB state dict against a raw COPY of the same bytes.

    .venv/bin/python benchmarks/bench_store.py      # embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL
    PGTRAIN_BENCH_STORE_MB=64 .venv/bin/python benchmarks/bench_store.py      # quick

The state dict is float32 tensors of 64 MB (and a few small ones). Baselines, on the same server in the
same run: the same bytes COPYed in 16 MB bytea rows into a bare table, and COPYed back out into one
preallocated buffer. Each phase runs in its own forked process, so its peak RSS is its own.

- ``write_ratio_vs_raw_copy``: ``tensors.write_staged`` time / raw COPY in.
- ``commit_ratio_vs_raw_copy``: ``model_store.commit_run`` (checks, the version's tensor rows taking over the
  staged blobs, deleting the staged rows: no tensor byte is copied) / raw COPY in.
- ``load_ratio_vs_raw_copy``: ``model_store.load_tensors`` / raw COPY out.
- ``ratio_vs_raw_copy``: (write + commit + load) / (raw COPY in + raw COPY out): the whole round trip.
- ``peak_rss_over_tensor_bytes``: the largest peak RSS of the write, commit and load processes / tensor bytes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import struct

import numpy as np
import psycopg
from common import bench_database, report, stopwatch

from pgtrain.config.params import TrainingConfig
from pgtrain.runs.record import plan_run, set_model_layout
from pgtrain.store import tensors
from pgtrain.store.model_store import commit_run, load_tensors

MB = 1024 * 1024
SIZE_MB = int(os.environ.get("PGTRAIN_BENCH_STORE_MB", "1024"))
TENSOR_MB = 64
CTX = mp.get_context("fork")


def state_dict() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {f"layers.{i}.weight": rng.random(TENSOR_MB * MB // 4, dtype=np.float32).reshape(-1, 1024)
              for i in range(SIZE_MB // TENSOR_MB)}
    rest = SIZE_MB * MB - sum(a.nbytes for a in arrays.values())
    if rest:
        arrays["layers.last.weight"] = rng.random(rest // 4, dtype=np.float32)
    arrays["layers.last.bias"] = rng.random(10, dtype=np.float32)
    return arrays


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _in_child(target, *args):
    """Run ``target(*args) -> dict`` in a forked process; its result plus that process's peak RSS."""
    out = CTX.Queue()

    def main():
        result = target(*args)
        out.put({**result, "peak_rss": _peak()})

    proc = CTX.Process(target=main)
    proc.start()
    result = out.get(timeout=3600)
    proc.join()
    return result


def raw_copy(url: str) -> dict[str, float]:
    arrays = state_dict()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_chunks (seq integer PRIMARY KEY, data bytea NOT NULL)")
        conn.execute("ALTER TABLE raw_chunks ALTER COLUMN data SET STORAGE EXTERNAL")
        with stopwatch() as copy_in, conn.cursor() as cur, \
                cur.copy("COPY raw_chunks (seq, data) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0))
            seq = 0
            for array in arrays.values():
                raw = memoryview(array.reshape(-1).view(np.uint8))
                for start in range(0, len(raw), tensors.CHUNK_BYTES):
                    piece = raw[start:start + tensors.CHUNK_BYTES]
                    copy.write(struct.pack(">hiii", 2, 4, seq, len(piece)))
                    for offset in range(0, len(piece), MB):
                        copy.write(piece[offset:offset + MB])
                    seq += 1
            copy.write(struct.pack(">h", -1))
        total = sum(a.nbytes for a in arrays.values())
        del arrays
        out = np.empty(total, dtype=np.uint8)
        with stopwatch() as copy_out, conn.cursor() as cur, \
                cur.copy("COPY (SELECT data FROM raw_chunks ORDER BY seq) TO STDOUT (FORMAT BINARY)") as copy:
            filled, first = 0, True
            for block in copy:
                block = memoryview(block)[19 if first else 0:]
                first = False
                if len(block) > 2:
                    length = struct.unpack_from(">i", block, 2)[0]
                    out[filled:filled + length] = np.frombuffer(block, np.uint8, length, 6)
                    filled += length
        assert filled == total
        conn.execute("DROP TABLE raw_chunks")
    return {"copy_in": copy_in(), "copy_out": copy_out()}


def stage(url: str) -> dict[str, float]:
    arrays = state_dict()
    with psycopg.connect(url, autocommit=True) as conn:
        run = plan_run(conn, "bench", "store", TrainingConfig(model_name="bench-store"))
        conn.execute("UPDATE pgtrain.training_runs SET input_dim = 1024, output_dim = 10 WHERE run_id = %s",
                     (run.run_id,))
        set_model_layout(conn, run.run_id, {n: {"shape": list(a.shape), "dtype": "float32"}
                                            for n, a in arrays.items()})
        with stopwatch() as elapsed:
            tensors.write_staged(conn, run.run_id, arrays)
    return {"seconds": elapsed(), "run_id": run.run_id}


def commit(url: str, run_id: str) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn, stopwatch() as elapsed:
        assert commit_run(conn, run_id, owner={"task_id": "bench"}).created
    return {"seconds": elapsed()}


def load(url: str) -> dict[str, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        with stopwatch() as elapsed:
            _, arrays = load_tensors(conn, "bench-store")
    assert sum(a.nbytes for a in arrays.values()) == tensor_bytes()
    return {"seconds": elapsed()}


def tensor_bytes() -> int:
    return SIZE_MB * MB + 40


def main() -> None:
    total = tensor_bytes()
    mbytes = total / MB
    with bench_database() as (_, url):
        raw = _in_child(raw_copy, url)
        staged = _in_child(stage, url)
        committed = _in_child(commit, url, staged["run_id"])
        loaded = _in_child(load, url)
    key = "store.commit_1gb"
    round_trip = staged["seconds"] + committed["seconds"] + loaded["seconds"]
    peak = max(staged["peak_rss"], committed["peak_rss"], loaded["peak_rss"])
    report({
        f"{key}.tensor_mb": round(mbytes),
        f"{key}.chunk_mb": tensors.CHUNK_BYTES // MB,
        f"{key}.raw_copy_in_mb_s": round(mbytes / raw["copy_in"], 1),
        f"{key}.raw_copy_out_mb_s": round(mbytes / raw["copy_out"], 1),
        f"{key}.write_mb_s": round(mbytes / staged["seconds"], 1),
        f"{key}.commit_mb_s": round(mbytes / committed["seconds"], 1),
        f"{key}.load_mb_s": round(mbytes / loaded["seconds"], 1),
        f"{key}.write_ratio_vs_raw_copy": round(staged["seconds"] / raw["copy_in"], 2),
        f"{key}.commit_ratio_vs_raw_copy": round(committed["seconds"] / raw["copy_in"], 2),
        f"{key}.load_ratio_vs_raw_copy": round(loaded["seconds"] / raw["copy_out"], 2),
        f"{key}.ratio_vs_raw_copy": round(round_trip / (raw["copy_in"] + raw["copy_out"]), 2),
        f"{key}.write_peak_rss_mb": round(staged["peak_rss"] / MB),
        f"{key}.commit_peak_rss_mb": round(committed["peak_rss"] / MB),
        f"{key}.load_peak_rss_mb": round(loaded["peak_rss"] / MB),
        f"{key}.peak_rss_over_tensor_bytes": round(peak / total, 2),
    })


if __name__ == "__main__":
    main()
