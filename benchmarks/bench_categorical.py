"""Categorical benchmark: what text category columns cost planning, loading and predict, against the same rows
with those columns stored as integer codes and read as numbers.

    .venv/bin/python benchmarks/bench_categorical.py [ROWS [ROUNDS]]   # default 500,000 rows, 5 rounds
    PGTRAIN_BENCH_CATEGORICAL_ROWS (else PGTRAIN_BENCH_ROWS, which `make bench-quick` sets) and
    PGTRAIN_BENCH_CATEGORICAL_ROUNDS also set them; embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL.

Two tables of the same ROWS rows (bigint key "id", 20 ``real`` columns of pgtrain's synthetic features, 5
category columns of 100 equally likely levels, integer "label" 0..9, no NULLs):

- ``bench_cat_text``: the 5 columns are ``text`` ('level_0'..'level_99'): categories. Planning runs the extra
  vocabulary scan (``statistics.vocabularies``), the loader receives each value as its 64-bit hash and maps it
  to a level code (``encoding.Coder``), and the model one-hot encodes the codes;
- ``bench_cat_codes`` (the baseline): the same 5 columns as ``integer`` codes 0..99, read as numbers: 25 numeric
  features, no vocabulary scan, no hashing, the model standardizes them.

Both are trained on with feature_columns "*", label_column "label", world_size 2. Every round measures, for the
two tables in an order that alternates between rounds: ``plan_shards`` of a new run (``plan_run`` +
``manifest.plan_shards``), then ``loader.load_shard`` of both ranks' shards of one planned run (one connection,
as each rank of a 2-rank run loads), then ``predict`` of a committed version (built as the trainer builds it,
random weights: ``pgtrain.models.network.build_model`` with the run's encoding) over the whole table into a new table.
Ratios are per round (text table / integer-code table of the same round), reported as the median over rounds
(and the min):

- ``manifest.categorical_vs_numeric``: plan_shards seconds (target <= 1.3);
- ``loader.categorical.vs_integer_codes``: seconds to load every shard (target <= 1.3);
- ``predict.raw_vs_encoded``: predict seconds, raw text table / integer-code table (target <= 1.3).

Diagnostics: ``manifest.categorical.vocabulary_seconds`` (the vocabulary scan alone, in a snapshot of its own,
once per round), ``loader.categorical.coder_seconds`` (``encoding.Coder`` over every row's 5 hashes, numpy
only, once per round) and ``predict.{raw,encoded}_forward_seconds_median`` (the version's module, as
``pgtrain.load_model`` returns it, over the loaded input rows in predict's pages: the torch share of predict,
whose one-hot block makes the categorical model's first layer 530 inputs wide instead of 25). The load
average at the start and the end is reported: on a 2-core machine other work moves every figure.

Every load is checked: the two tables' loaded numeric inputs are equal, and each text row's codes are the
recorded codes of its integer twin's levels.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np
import psycopg
from common import bench_database, machine, report, stopwatch
from psycopg import sql

from pgtrain.config.params import TrainingConfig
from pgtrain.data import encoding, loader, manifest
from pgtrain.data.source.resolve import CATEGORY, source_from_config
from pgtrain.data.source.snapshot import snapshot_transaction
from pgtrain.data.statistics import vocabularies
from pgtrain.planning.plan import admit_run, author_admitting, plan_shards_checked
from pgtrain.runs import record

TEXT, CODES = "bench_cat_text", "bench_cat_codes"
TABLES = (CODES, TEXT)  # baseline first in odd rounds, the text table first in even ones
NUMERIC, CATEGORIES, LEVELS, CLASSES = 20, 5, 100, 10
X = [f"x{i}" for i in range(NUMERIC)]
C = [f"c{i}" for i in range(CATEGORIES)]
WORLD_SIZE = 2
DAG_ID = "bench_categorical"
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
_CHUNK = 100_000


def config_for(table: str) -> TrainingConfig:
    return TrainingConfig.from_mapping({
        "source_table": table, "key_column": "id", "feature_columns": "*", "label_column": "label",
        "world_size": WORLD_SIZE, "model_name": table})


def generate(conn: psycopg.Connection, rows: int) -> None:
    """The integer-code table with one binary COPY built with numpy, then its text twin from it (same rows, the
    codes written as 'level_<code>'); both with a primary key, vacuumed and analyzed."""
    from dev import examples

    features, labels = examples.synthetic(rows, NUMERIC, classes=CLASSES, seed=0)
    codes = np.random.default_rng(1).integers(0, LEVELS, (rows, CATEGORIES))
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint NOT NULL, {}, {}, label integer NOT NULL)").format(
        sql.Identifier(CODES), sql.SQL(", ").join(sql.SQL("{} real NOT NULL").format(sql.Identifier(x)) for x in X),
        sql.SQL(", ").join(sql.SQL("{} integer NOT NULL").format(sql.Identifier(c)) for c in C)))
    layout = np.dtype([("nfields", ">i2"), ("klen", ">i4"), ("key", ">i8"),
                       ("x", [("len", ">i4"), ("v", ">f4")], (NUMERIC,)),
                       ("c", [("len", ">i4"), ("v", ">i4")], (CATEGORIES,)), ("ylen", ">i4"), ("y", ">i4")])
    with conn.transaction(), conn.cursor() as cur, cur.copy(
            sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(sql.Identifier(CODES))) as copy:
        copy.write(_COPY_SIGNATURE)
        for start in range(0, rows, _CHUNK):
            stop = min(rows, start + _CHUNK)
            block = np.zeros(stop - start, layout)
            block["nfields"], block["klen"], block["key"] = 2 + NUMERIC + CATEGORIES, 8, np.arange(start + 1, stop + 1)
            block["x"]["len"], block["x"]["v"] = 4, features[start:stop]
            block["c"]["len"], block["c"]["v"] = 4, codes[start:stop]
            block["ylen"], block["y"] = 4, labels[start:stop]
            copy.write(block.tobytes())
        copy.write(b"\xff\xff")
    conn.execute(sql.SQL("CREATE TABLE {} AS SELECT id, {}, {}, label FROM {} ORDER BY id").format(
        sql.Identifier(TEXT), sql.SQL(", ").join(map(sql.Identifier, X)),
        sql.SQL(", ").join(sql.SQL("CAST('level_' || {c} AS text) AS {c}").format(c=sql.Identifier(c)) for c in C),
        sql.Identifier(CODES)))
    for table in TABLES:
        conn.execute(sql.SQL("ALTER TABLE {} ALTER label SET NOT NULL, ADD PRIMARY KEY (id)").format(
            sql.Identifier(table)))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))


def plan(conn: psycopg.Connection, table: str, name: str) -> tuple[record.Run, float]:
    """A new run of ``table`` planned as compute_shards does (plan_shards_checked): (the planned run, its
    seconds)."""
    config = config_for(table)
    author = author_admitting(conn, config)
    run = admit_run(conn, config, author, DAG_ID, name)
    with stopwatch() as planning:
        plan_shards_checked(conn, run.run_id, author)
    return record.get_run(conn, run.run_id), planning()


def vocabulary_scan(conn: psycopg.Connection) -> float:
    """The vocabulary scan of the text table alone (as plan_shards runs it: no bad rows, integer classes 0..9
    found complete by the lean scan, so no class vocabulary)."""
    config = config_for(TEXT)
    with snapshot_transaction(conn):
        source = source_from_config(conn, config)
        categorical = [c for c in source.feature_columns if c.kind == CATEGORY]
        assert len(categorical) == CATEGORIES, [(c.name, c.kind) for c in source.feature_columns]
        with stopwatch() as scanning:
            vocabularies(conn, source, categorical, False, config, None)
    return scanning()


def load_all(conn: psycopg.Connection, run: record.Run) -> tuple[np.ndarray, float]:
    """Every shard of ``run`` loaded with load_shard, one after the other: (features, seconds)."""
    cfg = run.config
    with stopwatch() as loading:
        source = manifest.source_for(conn, run)
        parts = [loader.load_shard(conn, source, shard, run.input_dim, cfg.validation_fraction, cfg.seed).features
                 for shard in record.get_manifest(conn, run.run_id)]
    return np.concatenate(parts), loading()


def check_loaded(text_run: record.Run, text: np.ndarray, codes: np.ndarray) -> None:
    """The numeric inputs equal; each text row's codes those the text run recorded for its twin's levels."""
    assert text.shape == codes.shape == (len(codes), NUMERIC + CATEGORIES), (text.shape, codes.shape)
    assert np.array_equal(text[:, :NUMERIC], codes[:, :NUMERIC]), "the numeric inputs differ"
    columns = encoding.columns_of(text_run.encoding)
    for i, column in enumerate(c for c in columns if c.kind == CATEGORY):
        want = np.full(LEVELS, encoding.OTHER, np.float32)
        for code, level in enumerate(column.levels):
            want[int(level.removeprefix("level_"))] = encoding.FIRST_LEVEL + code
        got = text[:, NUMERIC + i]
        assert np.array_equal(got, want[codes[:, NUMERIC + i].astype(np.int64)]), f"codes of {column.name} differ"


def coder_seconds(conn: psycopg.Connection, run: record.Run, rows: int) -> float:
    """encoding.Coder over ``rows`` rows of the 5 columns' hashes (every row a known level): numpy alone."""
    columns = encoding.columns_of(run.encoding)
    categorical = [c for c in columns if c.kind == CATEGORY]
    hashes = np.array([c.hashes for c in categorical], np.int64).T  # (levels, columns)
    picks = np.random.default_rng(2).integers(0, len(hashes), (rows, len(categorical)))
    hashed = np.ascontiguousarray(np.take_along_axis(hashes, picks, 0))
    coder = encoding.Coder(columns)
    start = time.perf_counter()
    out = coder(hashed)
    seconds = time.perf_counter() - start
    assert (out >= encoding.FIRST_LEVEL).all()
    return seconds


def commit_version(conn: psycopg.Connection, run: record.Run) -> None:
    """Make the planned ``run`` a version of its model, with the state dict the trainer would stage (random
    initial weights; the normalizer's statistics left at mean 0, std 1)."""
    from pgtrain.models.network import build_model, state_layout
    from pgtrain.store.model_store import commit_run
    from pgtrain.store.tensors import write_staged

    cfg = run.config
    model = build_model(cfg.model, run.input_dim, run.output_dim, cfg.model_options_for_build, cfg.seed,
                        run.encoding)
    record.set_model_layout(conn, run.run_id, state_layout(model))
    write_staged(conn, run.run_id, {k: v.numpy() for k, v in model.state_dict().items()})
    record.record_epoch(conn, run.run_id, 1, {"train_loss": 2.3, "train_accuracy": 0.1, "val_loss": 2.3,
                                              "val_accuracy": 0.1, "seconds": 1.0})
    record.set_status(conn, run.run_id, "trained")
    assert commit_run(conn, run.run_id, owner={"task_id": "bench"}).created


def forward_seconds(conn: psycopg.Connection, table: str, x: np.ndarray) -> float:
    """The head version's module (``pgtrain.load_model``) over input rows ``x`` in predict's pages: what predict
    spends in torch."""
    import torch

    from pgtrain.store.inference import DEFAULT_BATCH_ROWS, load_model

    model = load_model(conn, table)
    with stopwatch() as forwarding, torch.no_grad():
        for start in range(0, len(x), DEFAULT_BATCH_ROWS):
            model(torch.from_numpy(x[start:start + DEFAULT_BATCH_ROWS]))
    return forwarding()


def predict_seconds(conn: psycopg.Connection, table: str, into: str, rows: int) -> float:
    from pgtrain.store.inference import predict

    with stopwatch() as predicting:
        done = predict(conn, table, "head", table, "id", into)
    assert done.rows == rows and done.skipped == 0, done
    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(into)))
    return predicting()


def main() -> None:
    args = [int(a) for a in sys.argv[1:3]]
    env = os.environ.get
    rows = args[0] if args else int(env("PGTRAIN_BENCH_CATEGORICAL_ROWS") or env("PGTRAIN_BENCH_ROWS") or 500_000)
    rounds = args[1] if len(args) > 1 else int(env("PGTRAIN_BENCH_CATEGORICAL_ROUNDS") or 5)
    with bench_database() as (_, url):
        figures = run_benchmark(url, rows, rounds)
    report(figures)


def run_benchmark(url: str, rows: int, rounds: int) -> dict[str, float | int | str]:
    load_average = os.getloadavg()[0]
    print(f"categorical benchmark: {rows} rows x ({NUMERIC} real + {CATEGORIES} categories of {LEVELS} levels), "
          f"world_size {WORLD_SIZE}, {rounds} rounds, {machine()}, load average {load_average:.1f}",
          flush=True)
    seconds: dict[str, dict[str, list[float]]] = {
        phase: {t: [] for t in TABLES} for phase in ("plan", "load", "forward", "predict")}
    vocabulary, coder = [], []
    with psycopg.connect(url, autocommit=True) as conn:
        with stopwatch() as generating:
            generate(conn, rows)
        print(f"  generated both tables in {generating():.1f} s", flush=True)
        loaded_runs: dict[str, record.Run] = {}
        for table in TABLES:  # the versions predict scores with
            run, _ = plan(conn, table, f"{table}-version")
            commit_version(conn, run)
            loaded_runs[table] = run
        for round_ in range(rounds):
            order = TABLES if round_ % 2 == 0 else TABLES[::-1]
            for table in order:
                _, took = plan(conn, table, f"{table}-plan-{round_}")
                seconds["plan"][table].append(took)
            vocabulary.append(vocabulary_scan(conn))
            loaded = {}
            for table in order:
                loaded[table], took = load_all(conn, loaded_runs[table])
                seconds["load"][table].append(took)
            check_loaded(loaded_runs[TEXT], loaded[TEXT], loaded[CODES])
            for table in order:
                seconds["forward"][table].append(forward_seconds(conn, table, loaded[table]))
            del loaded
            coder.append(coder_seconds(conn, loaded_runs[TEXT], rows))
            for table in order:
                seconds["predict"][table].append(predict_seconds(conn, table, f"{table}_scores_{round_}", rows))
            print(f"  round {round_ + 1}: " + "; ".join(
                f"{phase} {s[TEXT][-1]:.3f} s vs {s[CODES][-1]:.3f} s ({s[TEXT][-1] / s[CODES][-1]:.2f}x)"
                for phase, s in seconds.items()) + f"; vocabulary scan {vocabulary[-1]:.3f} s, "
                f"coder {coder[-1]:.3f} s", flush=True)
    ratios = {phase: [t / c for t, c in zip(s[TEXT], s[CODES], strict=True)] for phase, s in seconds.items()}

    def median(values: list[float], digits: int = 3) -> float:
        return round(statistics.median(values), digits)

    plan_text, plan_codes = seconds["plan"][TEXT], seconds["plan"][CODES]
    load_text, load_codes = seconds["load"][TEXT], seconds["load"][CODES]
    predict_text, predict_codes = seconds["predict"][TEXT], seconds["predict"][CODES]
    return {
        "categorical.load_average_start": round(load_average, 2), "categorical.load_average_end": round(
            os.getloadavg()[0], 2),
        "categorical.rows": rows, "categorical.rounds": rounds, "categorical.numeric_columns": NUMERIC,
        "categorical.category_columns": CATEGORIES, "categorical.levels": LEVELS,
        "categorical.world_size": WORLD_SIZE, "categorical.generate_seconds": round(generating(), 1),
        "manifest.categorical_vs_numeric": median(ratios["plan"]),
        "manifest.categorical_vs_numeric_min": round(min(ratios["plan"]), 3),
        "manifest.categorical.plan_seconds": median(plan_text),
        "manifest.categorical.numeric_plan_seconds": median(plan_codes),
        "manifest.categorical.vocabulary_seconds": median(vocabulary),
        "manifest.categorical.vocabulary_share_of_plan": round(statistics.median(
            v / p for v, p in zip(vocabulary, plan_text, strict=True)), 3),
        "loader.categorical.vs_integer_codes": median(ratios["load"]),
        "loader.categorical.vs_integer_codes_min": round(min(ratios["load"]), 3),
        "loader.categorical.seconds_median": median(load_text),
        "loader.categorical.integer_codes_seconds_median": median(load_codes),
        "loader.categorical.coder_seconds": median(coder, 4),
        "predict.raw_vs_encoded": median(ratios["predict"]),
        "predict.raw_vs_encoded_min": round(min(ratios["predict"]), 3),
        "predict.raw_seconds_median": median(predict_text),
        "predict.encoded_seconds_median": median(predict_codes),
        "predict.raw_forward_seconds_median": median(seconds["forward"][TEXT]),
        "predict.encoded_forward_seconds_median": median(seconds["forward"][CODES]),
        "predict.raw_forward_vs_encoded": median(ratios["forward"]),
        "predict.raw_rows_per_second": round(rows / statistics.median(predict_text)),
        "predict.encoded_rows_per_second": round(rows / statistics.median(predict_codes)),
    }


if __name__ == "__main__":
    main()
