"""predict benchmark: scoring a table against its floor, and predict's peak memory at two table sizes, every
measurement in a fresh process.

    .venv/bin/python benchmarks/bench_predict.py [ROWS [DIM]]   # default 500,000 x 100
    PGTRAIN_BENCH_ROWS / PGTRAIN_BENCH_DIM set the size, PGTRAIN_BENCH_ROUNDS the rounds (default 3); embedded
    PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL.

The synthetic rows (dev.examples.synthetic) are stored as ``bench_predict`` (bigint key "id", ``real[]`` features,
integer label) and, for the memory figure, their first quarter as ``bench_predict_small``. One version of an mlp
(the default hidden_sizes, random weights, 10 classes; built as the trainer builds it) scores them. Contenders, each
timed in its own fresh process (imports, the connection and the floor's input tensors before the clock),
interleaved, their order rotated every round:

- ``floor``: the parts of predict done the plainest way, each timed (issue 32's tightened floor):
  ``COPY (SELECT id, features FROM bench_predict) TO STDOUT (FORMAT BINARY)`` drained by psql into /dev/null,
  psql's start included (the C-level drain: no Python per COPY message), on one connection (``read_1``) and as
  two halves of the keys by two psql processes in parallel (``read_2``); predict's own forward: the version's
  module (``pgtrain.load_model``) over pages of ``DEFAULT_BATCH_ROWS`` rows with predict's thread setting, the
  class taken per page (``forward``); one binary COPY of (id, prediction) into a new table with predict's
  columns, built with numpy (``write``). The floor is min(read_1, read_2) + forward + write. Diagnostics beside
  it: the same reads drained by psycopg (``psycopg_read_1``, ``psycopg_read_2``: the floor until issue 32) and
  the whole table's features as one tensor on every thread (``forward_one_tensor``);
- ``predict``: ``pgtrain.store.inference.predict`` over ``bench_predict`` into a new table, on an autocommit
  connection (its own snapshot: a second connection reads while the first writes);
- ``predict_one_connection``: the same inside the caller's transaction (a page per COPY on one connection,
  no overlap; diagnostic);
- ``predict_small``: ``predict`` over ``bench_predict_small`` (a quarter of the rows): the second size of the
  memory figure.

Every table written is checked against the floor's: the same (count, sum of ids, sum of prediction x (id mod
7919)), exact integers. Ratios are per round (contender seconds / the same round's floor seconds); figures are
the median over rounds and the min. ``predict.vs_floor``: predict's median ratio (target <= 1.5).
``predict.peak_rss_mb``: predict's largest peak RSS over its process's RSS before the call (VmHWM reset
first), with ``predict.peak_rss_mb_small`` the same at a quarter of the rows and ``predict.peak_rss_growth``
their ratio (1.0: independent of the table's size).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from common import bench_database, entry, in_threads, interleaved, machine, report, size_and_rounds

CONTENDERS = ("floor", "predict", "predict_one_connection", "predict_small")
TABLE, SMALL, MODEL = "bench_predict", "bench_predict_small", "bench_predict_model"
MB = 1 << 20


def table_checksum(conn, table: str) -> list[int]:  # noqa: ANN001 (a psycopg connection)
    from psycopg import sql

    return [int(v) for v in conn.execute(sql.SQL(
        "SELECT count(*), sum(id), sum(prediction::bigint * (id % 7919)) FROM {}").format(
        sql.Identifier(table))).fetchone()]


def _drain(url: str, lo: int | None, hi: int | None) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur, cur.copy(
            sql_copy(_read(lo, hi))) as copy:
        return sum(map(len, copy))


def _read(lo: int | None, hi: int | None):  # noqa: ANN202 (a sql.Composed)
    from psycopg import sql

    where = sql.SQL("") if lo is None else sql.SQL(" WHERE id BETWEEN {} AND {}").format(lo, hi)
    return sql.SQL("SELECT id, features FROM {}{}").format(sql.Identifier(TABLE), where)


def sql_copy(query):  # noqa: ANN001, ANN201 (sql.Composable)
    from psycopg import sql

    return sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(query)


def _timed(what: Callable[[], object]) -> float:
    start = time.perf_counter()
    what()
    return time.perf_counter() - start


def floor(url: str, spec: dict) -> dict:
    """The floor's parts, each timed (see the module's docstring)."""
    import numpy as np
    import psycopg
    import torch
    from bench_loader import _psql_drain
    from psycopg import sql

    from dev import examples
    from pgtrain.data import copy_binary
    from pgtrain.store import inference

    rows, result = spec["rows"], {}
    features, _ = examples.synthetic(rows, spec["dim"], classes=10, seed=0)
    ids = examples.synthetic_keys(rows)
    half = rows // 2
    halves = ((1, half), (half + 1, rows))
    with psycopg.connect(url, autocommit=True) as conn:
        model = inference.load_model(conn, MODEL)
        result["read_1"] = _timed(lambda: _psql_drain(url, [_read(None, None)]))
        result["read_2"] = _timed(lambda: _psql_drain(url, [_read(lo, hi) for lo, hi in halves]))
        result["psycopg_read_1"] = _timed(lambda: _drain(url, None, None))
        result["psycopg_read_2"] = _timed(lambda: in_threads(*(lambda b=b: _drain(url, *b) for b in halves)))
        pages = range(0, rows, inference.DEFAULT_BATCH_ROWS)
        predictions = np.empty(rows, np.int32)
        start = time.perf_counter()
        with inference._torch_beside_a_reader():
            for at in pages:
                page = slice(at, at + inference.DEFAULT_BATCH_ROWS)
                predictions[page] = inference._forward(model, features[page]).argmax(axis=1)
        result["forward"] = time.perf_counter() - start
        start = time.perf_counter()
        with torch.no_grad():
            whole = model(torch.from_numpy(features)).argmax(dim=1).numpy()
        result["forward_one_tensor"] = time.perf_counter() - start
        assert (whole == predictions).all()
        into = sql.Identifier(spec["into"])
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, prediction integer NOT NULL)").format(into))
        start = time.perf_counter()
        out = np.empty(rows, [("n", ">i2"), ("klen", ">i4"), ("k", ">i8"), ("plen", ">i4"), ("p", ">i4")])
        out["n"], out["klen"], out["k"], out["plen"], out["p"] = 2, 8, ids, 4, predictions
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(into)) as copy:
            copy.write(copy_binary.HEADER + out.tobytes() + copy_binary.TRAILER)
        result["write"] = time.perf_counter() - start
        result["seconds"] = min(result["read_1"], result["read_2"]) + result["forward"] + result["write"]
        result["psycopg_floor"] = (min(result["psycopg_read_1"], result["psycopg_read_2"])
                                   + result["forward_one_tensor"] + result["write"])
        result["checksum"] = table_checksum(conn, spec["into"])
        conn.execute(sql.SQL("DROP TABLE {}").format(into))
    return result


def measure(contender: str, url: str, spec: dict) -> dict:
    """In this fresh process: one timed run of ``contender``."""
    import psycopg
    from bench_loader import _reset_peak, _rss
    from psycopg import sql

    from pgtrain.store.inference import predict

    if contender == "floor":
        return floor(url, spec)
    table = SMALL if contender == "predict_small" else TABLE
    with psycopg.connect(url, autocommit=True) as conn:
        import torch  # noqa: F401 (imported before the clock, as predict imports it)

        before = _rss("VmRSS")
        _reset_peak()
        start = time.perf_counter()
        if contender == "predict_one_connection":
            with conn.transaction():
                done = predict(conn, MODEL, "head", table, "id", spec["into"])
        else:
            done = predict(conn, MODEL, "head", table, "id", spec["into"])
        seconds = time.perf_counter() - start
        peak = (_rss("VmHWM") - before) / MB
        assert done.rows == (spec["rows"] if table == TABLE else spec["small_rows"]) and not done.skipped, done
        checksum = table_checksum(conn, spec["into"])
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(spec["into"])))
    return {"seconds": seconds, "peak_rss_mb": peak, "checksum": checksum}


def in_subprocess(contender: str, url: str, spec: dict) -> dict:
    command = ["nice", "-n", "5", sys.executable, __file__, "--measure", contender, url, json.dumps(spec)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{contender}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def prepare(url: str, rows: int, dim: int) -> None:
    """The rows as TABLE (and their first quarter as SMALL), and one version of MODEL to score them with."""
    import psycopg
    from bench_categorical import commit_version
    from psycopg import sql

    from dev import examples
    from pgtrain.config.params import TrainingConfig
    from pgtrain.planning.plan import plan_training

    features, labels = examples.synthetic(rows, dim, classes=10, seed=0)
    keys = examples.synthetic_keys(rows)
    small = rows // 4
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        for table, count in ((TABLE, rows), (SMALL, small)):
            examples.create_samples_table(conn, ("public", table))
            examples.insert_samples(conn, features[:count], labels[:count], ("public", table), keys=keys[:count])
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
        print(f"  wrote {rows} x {dim} real[] (and {small}) in {time.perf_counter() - start:.1f} s", flush=True)
        config = TrainingConfig(model_name=MODEL, world_size=1, source_table=f"public.{TABLE}", num_classes=10)
        commit_version(conn, plan_training(conn, config, "bench_predict", MODEL))


def summarize(measured: dict[str, list[dict]]) -> dict[str, float | int | str]:
    floors = [m["seconds"] for m in measured["floor"]]
    reference = measured["floor"][0]["checksum"]
    for name in ("floor", "predict", "predict_one_connection"):
        assert all(m["checksum"] == reference for m in measured[name]), f"{name}: checksums differ from the floor's"
    figures: dict[str, float | int | str] = {}
    for name, runs in measured.items():
        seconds = [m["seconds"] for m in runs]
        ratios = [s / f for s, f in zip(seconds, floors, strict=True)]
        figures |= {f"predict.{name}.seconds_median": round(statistics.median(seconds), 3),
                    f"predict.{name}.seconds_min": round(min(seconds), 3),
                    f"predict.{name}.vs_floor_median": round(statistics.median(ratios), 3),
                    f"predict.{name}.vs_floor_min": round(min(ratios), 3)}
    for part in ("read_1", "read_2", "forward", "write", "psycopg_read_1", "psycopg_read_2", "forward_one_tensor",
                 "psycopg_floor"):
        figures[f"predict.floor.{part}_seconds_median"] = round(statistics.median(m[part] for m in measured["floor"]),
                                                                3)
    big = max(m["peak_rss_mb"] for m in measured["predict"])
    small = max(m["peak_rss_mb"] for m in measured["predict_small"])
    figures |= {"predict.vs_floor": figures["predict.predict.vs_floor_median"],
                "predict.vs_floor_min": figures["predict.predict.vs_floor_min"],
                "predict.vs_psycopg_floor": round(statistics.median(
                    m["seconds"] / f["psycopg_floor"] for m, f in zip(measured["predict"], measured["floor"],
                                                                        strict=True)), 3),
                "predict.peak_rss_mb": round(big, 1), "predict.peak_rss_mb_small": round(small, 1),
                "predict.peak_rss_growth": round(big / small, 3)}
    print(f"  checksums equal across floor, predict, predict_one_connection: {reference}", flush=True)
    return figures


def main() -> None:
    rows, dim, rounds = size_and_rounds()
    with bench_database() as (_, url):
        load_average = os.getloadavg()[0]
        print(f"predict benchmark: {rows} rows x {dim} real[], {rounds} rounds, {machine()}, "
              f"load average {load_average:.1f}", flush=True)
        prepare(url, rows, dim)
        spec = {"rows": rows, "small_rows": rows // 4, "dim": dim}
        measured: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
        for round_, name in interleaved(CONTENDERS, rounds):
            result = in_subprocess(name, url, spec | {"into": f"scores_{name}_{round_}"})
            measured[name].append(result)
            print(f"  round {round_} {name:<24} {result['seconds']:7.3f} s peak {result.get('peak_rss_mb', 0):7.1f} MB",
                  flush=True)
        figures = {"predict.rows": rows, "predict.dim": dim, "predict.rounds": rounds,
                   "predict.load_average_start": round(load_average, 2), **summarize(measured),
                   "predict.load_average_end": round(os.getloadavg()[0], 2)}
    report(figures)


if __name__ == "__main__":
    entry(main, measure)
