"""A rank's peak memory against its shard's data, at two shard sizes: the slope (bytes per data byte) and the
constant.

    .venv/bin/python benchmarks/bench_rank_memory.py       # embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL
    PGTRAIN_BENCH_MEMORY_ROWS=100000,400000 .venv/bin/python benchmarks/bench_rank_memory.py

Synthetic rows x 64 ``real[]`` features, 4 classes (dev.examples.synthetic), the default mlp, validation_fraction
0.1, 2 epochs, one rank (``world_size`` 1: it loads on two connections) through ``launch_local.run_local``, i.e.
``horovodrun --gloo`` as the train task runs it. The rank's peak RSS is the largest ``ru_maxrss`` of the processes
under the one that starts the job (horovodrun and its helpers are far smaller than a rank that imports torch);
the shard's data is what the loader holds: features (float32), labels (int64) and the validation flags. In the
same run, the floor: a process that imports what a rank imports (torch, Horovod, the trainer) and fills arrays of
the same size.

Figures: ``training.peak_rss_over_data`` (at the larger size), ``training.peak_rss_slope`` (the peak's growth
over the data's between the two sizes: 1.0 is the data alone, 2.0 a second copy of it) and
``training.peak_rss_intercept_mb`` (what does not grow with the rows), the same for the floor, and per size
``training.memory_<rows>.peak_rss_mb`` and ``.data_mb``.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import psycopg
from common import bench_database, report, write_synthetic

from pgtrain.config.params import TrainingConfig
from pgtrain.planning.plan import plan_training

SIZES = [int(n) for n in os.environ.get("PGTRAIN_BENCH_MEMORY_ROWS", "1000000,4000000").split(",")]
DIM, CLASSES, EPOCHS = 64, 4, 2
ROW_BYTES = DIM * 4 + 8 + 1  # features (float32), label (int64), validation flag (bool)


def rank_peak(conn: psycopg.Connection, url: str, table: str) -> int:
    """Plan one run on ``table`` and train it in a fresh process; the rank's peak RSS in bytes."""
    config = TrainingConfig.from_mapping({"source_table": f"public.{table}", "epochs": EPOCHS,
                                          "checkpoint_every": 0, "world_size": 1})
    run = plan_training(conn, config, "bench_rank_memory", f"{table}-{time.time_ns()}")
    out = subprocess.run([sys.executable, __file__, "--job", run.run_id, url], check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    return json.loads(out.splitlines()[-1])["children_maxrss_kb"] * 1024


def job_main(run_id: str, url: str) -> None:
    """Run the job; print the largest RSS any process under this one reached (Linux: kB)."""
    from pgtrain.launch import local as launch_local

    log = logging.getLogger("bench.rank")
    log.addHandler(logging.StreamHandler(sys.stderr))
    log.setLevel(logging.INFO)
    launch_local.run_local(run_id, 1, url, log, timeout_seconds=3600)
    print(json.dumps({"children_maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))


def floor_peak(rows: int) -> int:
    """Peak RSS (bytes) of a fresh process that imports what a rank imports and fills a shard's arrays."""
    out = subprocess.run([sys.executable, __file__, "--floor", str(rows)], check=True, stdout=subprocess.PIPE,
                         text=True).stdout
    return json.loads(out.splitlines()[-1])["peak_kb"] * 1024


def floor_main(rows: int) -> None:
    import trainer.train  # noqa: F401  torch, Horovod and pgtrain, as a rank imports them

    arrays = (np.empty((rows, DIM), np.float32), np.empty(rows, np.int64), np.empty(rows, bool))
    for array in arrays:
        array.fill(1)
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    print(json.dumps({"peak_kb": int(status["VmHWM"].split()[0])}))  # ru_maxrss would count this process's parent


def line(peaks: dict[int, int]) -> tuple[float, float]:
    """(slope, intercept in bytes) of the peak over the data bytes, through the smallest and largest sizes."""
    small, large = min(peaks), max(peaks)
    slope = (peaks[large] - peaks[small]) / ((large - small) * ROW_BYTES)
    return slope, peaks[small] - slope * small * ROW_BYTES


def main() -> None:
    figures: dict[str, float | int | str] = {"training.memory_dim": DIM, "training.memory_epochs": EPOCHS}
    peaks, floors = {}, {}
    with bench_database() as (_, url), psycopg.connect(url, autocommit=True) as conn:
        for rows in SIZES:
            started = time.perf_counter()
            write_synthetic(conn, f"samples_{rows}", rows, DIM, CLASSES)
            print(f"{rows} rows written in {time.perf_counter() - started:.0f} s", flush=True)
        for rows in SIZES:  # the floor beside each rank, in fresh processes
            peaks[rows] = rank_peak(conn, url, f"samples_{rows}")
            floors[rows] = floor_peak(rows)
            data = rows * ROW_BYTES
            print(f"  {rows:>9} rows: data {data / 2**20:.0f} MiB, rank peak {peaks[rows] / 2**20:.0f} MiB "
                  f"({peaks[rows] / data:.2f}x), floor {floors[rows] / 2**20:.0f} MiB", flush=True)
            figures[f"training.memory_{rows}.data_mb"] = round(data / 2**20, 1)
            figures[f"training.memory_{rows}.peak_rss_mb"] = round(peaks[rows] / 2**20, 1)
            figures[f"training.memory_{rows}.floor_peak_rss_mb"] = round(floors[rows] / 2**20, 1)
            figures[f"training.memory_{rows}.peak_rss_over_data"] = round(peaks[rows] / data, 3)
    slope, intercept = line(peaks)
    floor_slope, floor_intercept = line(floors)
    largest = max(SIZES)
    figures.update({
        "training.memory_rows": ",".join(map(str, SIZES)),
        "training.peak_rss_over_data": round(peaks[largest] / (largest * ROW_BYTES), 3),
        "training.peak_rss_slope": round(slope, 3),
        "training.peak_rss_intercept_mb": round(intercept / 2**20, 1),
        "training.floor_peak_rss_slope": round(floor_slope, 3),
        "training.floor_peak_rss_intercept_mb": round(floor_intercept / 2**20, 1),
        "training.peak_rss_over_floor": round(peaks[largest] / floors[largest], 3),
    })
    report(figures)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--job":
        job_main(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--floor":
        floor_main(int(sys.argv[2]))
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the embedded server on the way out
        main()
