"""Loader benchmark: load_shard against the plain COPY floors and the peers, every measurement in a fresh process.

    .venv/bin/python benchmarks/bench_loader.py [ROWS [DIM]]   # default 500,000 x 100
    PGTRAIN_BENCH_ROWS / PGTRAIN_BENCH_DIM set the size, PGTRAIN_BENCH_ROUNDS the rounds (default 3),
    PGTRAIN_BENCH_LAYOUTS a comma-separated subset of the layouts, PGTRAIN_BENCH_CONTENDERS a subset of the
    contenders; embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL. Peers need benchmarks/requirements.txt
    (connectorx, pyarrow, asyncpg); a peer that is not installed is left out and said so.

The same synthetic rows (dev.examples.synthetic) are stored three ways: ``real[]`` (float4_array), packed
float32 ``bytea``, and DIM ``real`` columns (scalar_columns), bigint keys, integer labels; each table is planned
as a one-rank run. Contenders, each timed in its own fresh process (imports and connections before the clock;
the whole call after it, so allocating and first touching the arrays counts), interleaved, their order rotated
every round:

- ``copy_floor``: ``COPY (SELECT <feature columns>, label FROM t WHERE id BETWEEN <the shard's keys>) TO STDOUT
  (FORMAT BINARY)`` drained with psycopg, nothing parsed: the one-connection floor;
- ``copy_floor_2``: the same for each half of the shard (split at its middle key), on two connections in
  parallel threads, drained: the two-connection floor, what a load on two connections is held against;
- ``server_floor``: the one-connection COPY ``TO '/dev/null'`` (the server alone; needs a superuser, as the
  embedded server's is; reported as not measured otherwise);
- ``c_floor``: the C-level drain: ``psql -c "COPY (<the same SELECT>) TO STDOUT (FORMAT BINARY)" > /dev/null``,
  psql's start included (psql hands each COPY message to ``fwrite``: no Python per message); ``c_floor_2``: two
  such psql processes, one for each half, in parallel. ``vs_c_floor`` divides by the faster of the two in the same
  round (issue 32: psycopg's drain pays Python per COPY message, which flattered the floors above);
- ``pgtrain``: ``loader.load_shard`` as a one-rank run calls it (its batched COPY on ``loader.streams_for(1)``
  = 2 connections, numpy arrays, the validation flag);
- ``pgtrain_one_stream``: the same on one connection, as each rank of a larger run loads (diagnostic);
- ``pgtrain_no_prefault``: ``pgtrain`` without the thread that maps the arrays' pages while the COPY streams
  (diagnostic: what first touching fresh memory costs);
- ``pgtrain_impute_all``: ``pgtrain`` replacing NULLs in every scalar feature column, as a plan from before
  ``shard_plans.nullable_columns`` does (diagnostic: what a ``coalesce`` per value costs; the table has no NULL);
- ``pgtrain_server``: pgtrain's batched COPY (one stream) ``TO '/dev/null'`` (diagnostic: what its query costs
  the server);
- peers producing the same arrays (features float32 rows x dim, labels int64): ``fetchall`` (the seed's way:
  SELECT, fetchall(), arrays from the Python rows), ``connectorx_1`` / ``connectorx_2`` (``read_sql`` to
  Arrow, 1 or 2 partitions on id, then numpy), ``adbc_1`` / ``adbc_2`` (ADBC's PostgreSQL driver,
  Arrow-native and C-level: ``fetch_arrow_table`` of the plain SELECT, or of each half on its own connection in
  two threads, then numpy), ``asyncpg`` (``copy_from_query`` binary parsed with one numpy
  dtype, every layout), ``asyncpg_fetch`` (bytea only: ``fetch`` + ``frombuffer``; elsewhere ``fetch`` makes a
  Python float per value).

Before its clock, each process touches and frees three times the features' bytes (``_prime_memory``: this VM's
host reclaims freed memory, which would otherwise favour whichever contender follows a memory-hungry one).
Every array-producing contender's checksum (integer sum of the float32 bit patterns, sum of the labels, rows)
must be equal, and the two halves must send the whole COPY's bytes. Each round's floor is the faster of
``copy_floor`` and ``copy_floor_2`` in that round; ``<contender>.ratio_to_floor_*`` is contender seconds / that
floor, per round (median and min over rounds). ``loader.<layout>.vs_floor`` is pgtrain's per-round median
ratio to that floor (``vs_one_connection_floor`` / ``vs_two_connection_floor`` to each floor alone);
``loader.<layout>.vs_c_floor`` is pgtrain's per-round median ratio to the faster of ``c_floor`` and
``c_floor_2``; ``loader.<layout>.vs_best_peer`` is pgtrain's per-round median ratio to the peer with the lowest
median seconds (``best_peer``), in the same rounds; ``rss_vs_arrays`` is pgtrain's largest peak RSS growth / the
bytes of the arrays it returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import bench_database, in_threads, machine, report

LAYOUTS = ("float4_array", "bytea", "scalar_columns")
FLOORS = ("copy_floor", "copy_floor_2", "c_floor", "c_floor_2", "server_floor")
PEERS = ("fetchall", "connectorx_1", "connectorx_2", "adbc_1", "adbc_2", "asyncpg", "asyncpg_fetch")
REQUIRED = ("copy_floor", "copy_floor_2", "c_floor", "c_floor_2", "pgtrain")  # every run measures these
FETCH_LAYOUTS = ("bytea",)  # elsewhere asyncpg's fetch builds a Python float per value, as fetchall does
CONTENDERS = (*FLOORS, "pgtrain", "pgtrain_one_stream", "pgtrain_no_prefault", "pgtrain_impute_all", "pgtrain_server",
              *PEERS)
MB = 1 << 20


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def _prime_memory(nbytes: int) -> None:
    """Touch ``nbytes`` and free them, before the clock. This VM hands the memory a process frees back to its
    host within seconds, and the next process to touch it waits for the host: populating 200 MB took 1.0-1.4 s
    here after a pause, 0.05-0.08 s right after another process freed 400 MB. Without this, a contender that
    follows a memory-hungry one in the order (the same one every round) looked about 1 s faster."""
    import numpy as np

    np.ones(nbytes, np.uint8)  # freed at once (munmap): the pages stay with this guest for the contender


def checksum(features, labels) -> list[int]:  # noqa: ANN001 (numpy arrays, imported in the measuring process)
    """Order-independent and exact: the float32 bit patterns summed as integers, the labels summed, the rows."""
    import numpy as np

    bits = np.ascontiguousarray(features, np.float32).view(np.uint32)
    return [int(bits.sum(dtype=np.uint64)), int(np.asarray(labels).sum(dtype=np.int64)), len(labels)]


def _plain_select(spec: dict, lo: int | None = None, hi: int | None = None):  # noqa: ANN202 (a sql.Composed)
    """SELECT the layout's feature column(s) and label of the shard's key range, or of keys ``lo``..``hi`` in
    it (no ORDER BY: a plain query)."""
    from psycopg import sql

    return sql.SQL("SELECT {}, label FROM {} WHERE id BETWEEN {} AND {}").format(
        sql.SQL(", ").join(map(sql.Identifier, spec["columns"])), sql.Identifier(*spec["table"]),
        sql.Literal(int(spec["lo"] if lo is None else lo)), sql.Literal(int(spec["hi"] if hi is None else hi)))


def _halves(spec: dict) -> list:
    """The plain SELECTs of the shard's two halves (split at its middle key, ``prepare`` finds it)."""
    return [_plain_select(spec, spec["lo"], spec["mid"] - 1), _plain_select(spec, spec["mid"], spec["hi"])]


def _drain_in_parallel(conns: list, queries: list) -> int:
    """Each query's binary COPY on its own connection, in parallel threads, drained (nothing parsed); the bytes
    received. psycopg releases the GIL while it waits, so the threads overlap as two clients would."""

    from psycopg import sql

    received = [0] * len(queries)

    def drain(i: int) -> None:
        with conns[i].cursor() as cur, cur.copy(
                sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(queries[i])) as copy:
            received[i] = sum(map(len, copy))

    in_threads(*(lambda i=i: drain(i) for i in range(len(queries))))
    return sum(received)


def _psql_environment(url: str) -> dict[str, str]:
    """libpq's environment for ``url`` (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE): psql reads its connection
    from there, so no password is on a command line."""
    import psycopg.conninfo

    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "password": "PGPASSWORD", "dbname": "PGDATABASE"}
    info = psycopg.conninfo.conninfo_to_dict(url)
    return {**os.environ, **{names[k]: str(v) for k, v in info.items() if k in names and v not in (None, "")}}


def _psql_drain(url: str, queries: list) -> None:
    """Each query's binary COPY drained by its own psql process into /dev/null, all in parallel; psql's start is
    part of the time (the C-level floor: psql writes each COPY message as it comes, no Python per message)."""
    from psycopg import sql

    env = _psql_environment(url)
    procs = [subprocess.Popen(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c",
                               sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(q).as_string(None)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env) for q in queries]
    for proc in procs:
        _, error = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"psql: {error.decode().strip()}")


def _arrow_into(table, spec: dict, features, labels, at: int) -> int:  # noqa: ANN001 (pyarrow table, numpy arrays)
    """Copy an Arrow table of the plain SELECT (features as the layout's column(s), label) into rows ``at``.. of
    ``features`` and ``labels``; the rows copied."""
    import numpy as np
    import pyarrow as pa

    count, dim = table.num_rows, spec["dim"]
    rows = slice(at, at + count)
    labels[rows] = table.column("label").to_numpy()
    if spec["layout"] == "float4_array":
        features[rows] = table.column("features").combine_chunks().flatten().to_numpy().reshape(count, dim)
    elif spec["layout"] == "bytea":
        column = table.column("features").combine_chunks()
        offsets = np.frombuffer(column.buffers()[1], np.int64 if pa.types.is_large_binary(column.type) else np.int32,
                                len(column) + 1, column.offset)
        assert (np.diff(offsets) == 4 * dim).all()
        features[rows] = np.frombuffer(column.buffers()[2], "<f4", count * dim, int(offsets[0])).reshape(count, dim)
    else:
        for i, name in enumerate(spec["columns"]):
            features[rows, i] = table.column(name).to_numpy()
    return count


def _adbc(url: str, queries: list, spec: dict):  # noqa: ANN202 (numpy arrays)
    """ADBC's PostgreSQL driver: each query's Arrow table on its own connection (in threads when more than one),
    copied into one pair of arrays."""

    import adbc_driver_postgresql.dbapi as adbc
    import numpy as np

    features, labels = np.empty((spec["rows"], spec["dim"]), np.float32), np.empty(spec["rows"], np.int64)
    tables: list = [None] * len(queries)

    def fetch(i: int) -> None:
        with adbc.connect(url) as conn, conn.cursor() as cur:
            cur.execute(queries[i].as_string(None))
            tables[i] = cur.fetch_arrow_table()

    in_threads(*(lambda i=i: fetch(i) for i in range(len(queries))))
    at = 0
    for table in tables:
        at += _arrow_into(table, spec, features, labels, at)
    assert at == spec["rows"], (at, spec["rows"])
    return features, labels


def _copy_row_dtype(spec: dict):  # noqa: ANN202 (a numpy dtype)
    """One row of the plain COPY's binary form (fixed width: no NULLs, every array of dim values)."""
    import numpy as np

    dim = spec["dim"]
    if spec["layout"] == "float4_array":
        features = [("flen", ">i4"), ("ndim", ">i4"), ("hasnull", ">i4"), ("elemtype", ">u4"), ("dim", ">i4"),
                    ("lbound", ">i4"), ("x", [("elen", ">i4"), ("v", ">f4")], (dim,))]
    elif spec["layout"] == "bytea":
        features = [("flen", ">i4"), ("x", [("v", "<f4")], (dim,))]
    else:
        features = [("x", [("elen", ">i4"), ("v", ">f4")], (dim,))]
    return np.dtype([("nfields", ">i2"), *features, ("llen", ">i4"), ("label", ">i4")])


def measure(contender: str, url: str, spec: dict) -> dict:
    """In this fresh process: one timed run of ``contender`` on the layout ``spec`` describes."""
    import numpy as np
    import psycopg
    from psycopg import sql

    from pgtrain.data import loader, manifest
    from pgtrain.data.source.snapshot import planned_rows, read_xid_clock, snapshot_transaction
    from pgtrain.runs import record

    dim, rows, result = spec["dim"], spec["rows"], {}
    plain = _plain_select(spec)
    arrays = None
    if contender.startswith("asyncpg"):
        import asyncpg

        loop = asyncio.new_event_loop()
        aconn = loop.run_until_complete(asyncpg.connect(url))
    if contender == "copy_floor_2":
        conns = [psycopg.connect(url, autocommit=True) for _ in range(2)]
    if contender in ("copy_floor", "server_floor", "pgtrain", "pgtrain_one_stream", "pgtrain_no_prefault",
                     "pgtrain_impute_all", "pgtrain_server", "fetchall"):
        conn = psycopg.connect(url, autocommit=True)
        run = record.get_run(conn, spec["run_id"])
        source = manifest.source_for(conn, run)
        shard = record.get_manifest(conn, run.run_id)[0]
        cfg = run.config
        if contender == "pgtrain_impute_all":
            source = dataclasses.replace(source, plan=dataclasses.replace(source.plan, nullable_columns=None))
    if contender == "connectorx_1" or contender == "connectorx_2":
        import connectorx
        import psycopg.conninfo

        info = psycopg.conninfo.conninfo_to_dict(url)
        host = info.get("host", "localhost")
        cx_url = (f"postgresql://{info.get('user', 'postgres')}@{host.replace('/', '%2F')}"
                  f"{':' + str(info['port']) if info.get('port') and not host.startswith('/') else ''}"
                  f"/{info['dbname']}")
    _prime_memory(3 * rows * dim * 4)  # the arrays and a copy as large as the peers' (pgtrain needs one)
    before = _rss("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    if contender == "copy_floor":
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(plain)) as copy:
            result["bytes"] = sum(map(len, copy))
    elif contender == "copy_floor_2":
        result["bytes"] = _drain_in_parallel(conns, _halves(spec))
    elif contender == "c_floor":
        _psql_drain(url, [plain])
    elif contender == "c_floor_2":
        _psql_drain(url, _halves(spec))
    elif contender == "server_floor":
        conn.execute(sql.SQL("COPY ({}) TO '/dev/null' (FORMAT BINARY)").format(plain))
    elif contender in ("pgtrain", "pgtrain_one_stream", "pgtrain_no_prefault", "pgtrain_impute_all"):
        if contender == "pgtrain_no_prefault":
            loader.prefault_in_background = lambda arrays: None
        streams = 1 if contender == "pgtrain_one_stream" else loader.streams_for(1)
        data = loader.load_shard(conn, source, shard, dim, cfg.validation_fraction, cfg.seed,
                                 streams=streams, test_fraction=cfg.test_fraction)
        assert data.streams == streams, f"loaded on {data.streams} connections, not {streams}"
        arrays = (data.features, data.labels)
    elif contender == "pgtrain_server":
        with snapshot_transaction(conn):
            clock = read_xid_clock(conn)
            query = loader.batch_query(source, shard, planned_rows(source, clock, loader.ROWS_ALIAS),
                                       cfg.validation_fraction, cfg.seed, test_fraction=cfg.test_fraction)
            conn.execute(sql.SQL("COPY ({}) TO '/dev/null' (FORMAT BINARY)").format(query))
    elif contender == "fetchall":
        records = conn.execute(plain).fetchall()
        if spec["layout"] == "float4_array":
            features = np.array([f for f, _ in records], np.float32)
        elif spec["layout"] == "bytea":
            features = np.frombuffer(b"".join(f for f, _ in records), "<f4").reshape(len(records), dim)
        else:
            features = np.array([r[:-1] for r in records], np.float32)
        arrays = (features, np.array([r[-1] for r in records], np.int64))
    elif contender.startswith("connectorx"):
        partitions = int(contender[-1])
        query = plain.as_string(None)  # partitions need the partition column in the result
        query = query if partitions == 1 else "SELECT id, " + query[len("SELECT "):]
        table = connectorx.read_sql(cx_url, query, return_type="arrow",
                                    **({"partition_on": "id", "partition_num": partitions} if partitions > 1 else {}))
        arrays = (np.empty((rows, dim), np.float32), np.empty(rows, np.int64))
        assert _arrow_into(table, spec, *arrays, 0) == rows
    elif contender.startswith("adbc"):
        arrays = _adbc(url, [plain] if contender == "adbc_1" else _halves(spec), spec)
    elif contender.startswith("asyncpg"):
        arrays = loop.run_until_complete(_asyncpg(aconn, plain.as_string(None), spec, contender == "asyncpg_fetch"))
    else:
        raise ValueError(contender)
    seconds = time.perf_counter() - start
    result |= {"seconds": seconds, "peak_rss_mb": (_rss("VmHWM") - before) / MB}
    if arrays is not None:
        features, labels = arrays
        assert features.shape == (rows, dim) and features.dtype == np.float32, (features.shape, features.dtype)
        result["checksum"] = checksum(features, labels)
        result["tensor_mb"] = (features.nbytes + len(labels) * 9) / MB  # + int64 labels, uint8 part of the split
    return result


async def _asyncpg(conn, query: str, spec: dict, fetch: bool):  # noqa: ANN001, ANN202 (asyncpg; numpy)
    """asyncpg's ``copy_from_query`` (binary, parsed with one numpy dtype), or (``fetch``, bytea only) ``fetch``
    and the features joined into one buffer."""
    import numpy as np

    if fetch:
        records = await conn.fetch(query)
        features = np.frombuffer(b"".join(r[0] for r in records), "<f4").reshape(len(records), spec["dim"])
        return features, np.array([r[1] for r in records], np.int64)
    buffer = bytearray()

    async def sink(chunk: bytes) -> None:
        buffer.extend(chunk)

    await conn.copy_from_query(query, output=sink, format="binary")
    layout = _copy_row_dtype(spec)
    records = np.frombuffer(buffer, layout, (len(buffer) - 21) // layout.itemsize, 19)  # header, trailer
    return records["x"]["v"].astype(np.float32), records["label"].astype(np.int64)


def in_subprocess(contender: str, url: str, spec: dict) -> dict | str:
    """The contender's figures, or why it could not run (the last line of its error)."""
    command = ["nice", "-n", "5", sys.executable, __file__, "--measure", contender, url, json.dumps(spec)]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return json.loads(proc.stdout.splitlines()[-1])


def prepare(url: str, rows: int, dim: int, layouts: list[str]) -> dict[str, dict]:
    """The same synthetic rows in each layout's table, each planned as a one-rank run; returns their specs."""
    import psycopg
    from psycopg import sql

    from dev import examples
    from pgtrain.config.params import TrainingConfig
    from pgtrain.planning.plan import plan_training
    from pgtrain.runs import record

    features, labels = examples.synthetic(rows, dim, classes=10, seed=0)
    specs = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for layout in layouts:
            table = ("public", f"bench_{layout}")
            start = time.perf_counter()
            if layout == "scalar_columns":
                names = [f"x{i}" for i in range(dim)]
                examples.load_scalar_table(conn, table, names, features, "label", labels, "integer",
                                           feature_type="real")
                params = {"features_column": None, "feature_columns": tuple(names)}
            else:
                names = ["features"]
                examples.create_samples_table(conn, table, feature_format=layout)
                examples.insert_samples(conn, features, labels, table, keys=examples.synthetic_keys(rows))
                params = {}
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(*table)))
            print(f"  wrote {rows} x {dim} as {layout} in {time.perf_counter() - start:.1f} s", flush=True)
            config = TrainingConfig(world_size=1, source_table=".".join(table), num_classes=10, **params)
            run = plan_training(conn, config, "bench_loader", layout)
            shard = record.get_manifest(conn, run.run_id)[0]
            (mid,) = conn.execute(sql.SQL("SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY id) FROM {} "
                                          "WHERE id BETWEEN %s AND %s").format(sql.Identifier(*table)),
                                  (int(shard.key_lo), int(shard.key_hi))).fetchone()
            specs[layout] = {"layout": layout, "table": table, "columns": names, "rows": rows, "dim": dim,
                             "run_id": run.run_id, "lo": shard.key_lo, "hi": shard.key_hi, "mid": mid}
    return specs


def _per_round(measured: dict[str, list[dict]], name: str) -> list[float]:
    return [m["seconds"] for m in measured.get(name, [])]


def _median_ratio(numerator: list[float], denominator: list[float]) -> tuple[float, float]:
    """(median, min) over rounds of numerator / denominator, each pair from the same round."""
    ratios = [n / d for n, d in zip(numerator, denominator, strict=True)]
    return round(statistics.median(ratios), 3), round(min(ratios), 3)


def summarize(layout: str, measured: dict[str, list[dict]], skipped: dict[str, str]) -> dict[str, float | str]:
    """Per contender: min and median seconds, ratio to the same round's floor (the faster of the one- and the
    two-connection plain COPY); pgtrain's ratios to the floor and to the fastest peer."""
    one, two = _per_round(measured, "copy_floor"), _per_round(measured, "copy_floor_2")
    floor = [min(pair) for pair in zip(one, two, strict=True)] if two else one
    c_floor = [min(pair) for pair in zip(_per_round(measured, "c_floor"), _per_round(measured, "c_floor_2"),
                                         strict=True)]
    figures: dict[str, float | str] = {}
    checksums = {name: runs[0]["checksum"] for name, runs in measured.items() if runs and "checksum" in runs[0]}
    for name, runs in measured.items():
        if not runs:
            continue
        seconds = _per_round(measured, name)
        key = f"loader.{layout}.{name}"
        median, least = _median_ratio(seconds, floor)
        figures |= {f"{key}.seconds_min": round(min(seconds), 3),
                    f"{key}.seconds_median": round(statistics.median(seconds), 3),
                    f"{key}.ratio_to_floor_median": median, f"{key}.ratio_to_floor_min": least,
                    f"{key}.peak_rss_mb": round(max(m["peak_rss_mb"] for m in runs), 1)}
        assert all(m.get("checksum") == runs[0].get("checksum") for m in runs), f"{name}: checksums differ"
    for name, reason in skipped.items():
        figures[f"loader.{layout}.{name}.not_measured"] = reason[:200]
    reference = checksums.get("pgtrain")
    unequal = [name for name, value in checksums.items() if value != reference]
    if unequal:
        raise AssertionError(f"{layout}: checksums differ from pgtrain's: {unequal} ({checksums})")
    if two and measured["copy_floor_2"][0]["bytes"] - measured["copy_floor"][0]["bytes"] != 19 + 2:
        raise AssertionError(f"{layout}: the halves' COPYs did not send the whole COPY's rows")  # + header, trailer
    pgtrain = _per_round(measured, "pgtrain")
    prefix = f"loader.{layout}"
    figures[f"{prefix}.vs_floor"], figures[f"{prefix}.vs_floor_min"] = _median_ratio(pgtrain, floor)
    figures[f"{prefix}.vs_one_connection_floor"] = _median_ratio(pgtrain, one)[0]
    figures[f"{prefix}.vs_c_floor"], figures[f"{prefix}.vs_c_floor_min"] = _median_ratio(pgtrain, c_floor)
    figures[f"{prefix}.c_floor_vs_floor"] = _median_ratio(c_floor, floor)[0]
    if two:
        figures[f"{prefix}.vs_two_connection_floor"] = _median_ratio(pgtrain, two)[0]
        figures[f"{prefix}.two_connection_floor_vs_one"] = _median_ratio(two, one)[0]
    figures[f"{prefix}.copy_mb"] = round(measured["copy_floor"][0]["bytes"] / MB, 1)
    figures[f"{prefix}.tensor_mb"] = round(measured["pgtrain"][0]["tensor_mb"], 1)
    figures[f"{prefix}.rss_vs_arrays"] = round(  # the whole call's peak RSS growth / the arrays it returns
        max(m["peak_rss_mb"] for m in measured["pgtrain"]) / measured["pgtrain"][0]["tensor_mb"], 3)
    peers = {name: statistics.median(_per_round(measured, name)) for name in PEERS if measured.get(name)}
    if peers:
        best = min(peers, key=peers.get)
        figures[f"{prefix}.vs_best_peer"], figures[f"{prefix}.vs_best_peer_min"] = _median_ratio(
            pgtrain, _per_round(measured, best))
        figures[f"{prefix}.best_peer"] = best
    if measured.get("fetchall"):
        figures[f"{prefix}.speedup_vs_fetchall"] = round(
            statistics.median(_per_round(measured, "fetchall")) / statistics.median(pgtrain), 2)
    print(f"  {layout}: checksums equal across {sorted(checksums)}: {reference}", flush=True)
    return figures


def main() -> None:
    args = [int(a) for a in sys.argv[1:3]]
    rows = args[0] if args else int(os.environ.get("PGTRAIN_BENCH_ROWS", 500_000))
    dim = args[1] if len(args) > 1 else int(os.environ.get("PGTRAIN_BENCH_DIM", 100))
    rounds = int(os.environ.get("PGTRAIN_BENCH_ROUNDS", 3))
    layouts = [x for x in os.environ.get("PGTRAIN_BENCH_LAYOUTS", ",".join(LAYOUTS)).split(",") if x]
    contenders = [x for x in os.environ.get("PGTRAIN_BENCH_CONTENDERS", ",".join(CONTENDERS)).split(",") if x]
    contenders = [c for c in CONTENDERS if c in contenders or c in REQUIRED]
    with bench_database() as (_, url):
        print(f"loader benchmark: {rows} rows x {dim} features, {rounds} rounds, {machine()}, "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
        specs = prepare(url, rows, dim, layouts)
        figures: dict[str, float | int | str] = {"loader.rows": rows, "loader.dim": dim, "loader.rounds": rounds}
        started = os.getloadavg()[0]
        for layout in layouts:
            layout_started = os.getloadavg()[0]
            measured: dict[str, list[dict]] = {name: [] for name in contenders}
            skipped: dict[str, str] = {} if layout in FETCH_LAYOUTS else {
                "asyncpg_fetch": "fetch builds one Python float per value here (as fetchall does): bytea only"}
            if layout != "scalar_columns":
                skipped["pgtrain_impute_all"] = "only scalar feature columns have NULLs to replace"
            for round_ in range(rounds):
                shift = round_ % len(contenders)
                for name in contenders[shift:] + contenders[:shift]:
                    if name in skipped:
                        continue
                    result = in_subprocess(name, url, specs[layout])
                    if isinstance(result, str):
                        if name in REQUIRED:
                            raise RuntimeError(f"{layout} {name}: {result}")
                        skipped[name] = result
                        measured[name] = []
                        print(f"  {layout} {name}: not measured: {result}", flush=True)
                        continue
                    measured[name].append(result)
                    print(f"  {layout} round {round_ + 1} {name:<15} {result['seconds']:7.3f} s "
                          f"peak {result['peak_rss_mb']:7.1f} MB", flush=True)
            figures |= summarize(layout, measured, skipped)
            figures[f"loader.{layout}.load_average"] = f"{layout_started:.2f}-{os.getloadavg()[0]:.2f}"
        # the 1-minute load average when the run (each layout: its own figure) began and ended
        figures["loader.load_average"] = f"{started:.2f}-{os.getloadavg()[0]:.2f}"
    report(figures)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))))
    else:
        main()
