"""A rank alone reads its rows while torch is imported (issue 32: a rank starts in a second).

Importing torch is most of a small run's start, and reading a shard needs none of it: psycopg, numpy and the
loader. A rank the local launcher started alone (``--alone``: rank 0 of 1, known before any collective) starts
the read in a thread before ``trainer.train`` imports torch (``start``, from ``python -m trainer``); the trainer
takes the rows where it would have read them (``take``), after the model and its starting weights are settled, so
a refusal of either still comes first and never waits for the read (the read is then wasted, and goes with the
process). A refusal of the rows themselves (the loader's SourceError) is raised where the trainer reads, as before.
Any other failure of the early read (a connection refused) is not the run's: the trainer reads again itself, on its
own retried connection. Ranks under a launcher learn their rank from their collectives, which need torch: they
read after it.
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass

import psycopg

from pgtrain.core.db import connect
from pgtrain.core.errors import PgtrainError
from pgtrain.data import loader, manifest
from pgtrain.launch.horovodrun import name_passfile
from pgtrain.runs import record


@dataclass
class _Read:
    done: threading.Event
    shards: list[record.Shard] | None = None
    data: loader.ShardData | None = None
    seconds: float = 0.0
    error: BaseException | None = None


_pending: list[_Read] = []
EARLY = "while torch was imported"  # what the rank's line says of rows read early


def read_shard(conn: psycopg.Connection, run: record.Run, shards: list[record.Shard], rank: int,
               size: int) -> loader.ShardData:
    """This rank's rows of its manifest row, streamed with COPY (validation rows last)."""
    # A manifest from before the test part has no test rows: its rows are split as they were planned.
    test_fraction = run.config.test_fraction if any(s.test_count for s in shards) else 0.0
    return loader.load_shard(conn, manifest.source_for(conn, run), shards[rank], run.input_dim,
                             run.config.validation_fraction, run.config.seed, streams=loader.streams_for(size),
                             validation_last=True, test_fraction=test_fraction)


def start(args: argparse.Namespace) -> None:
    """For a rank alone: read its rows in a thread, now (before ``import torch``)."""
    if not args.alone:
        return
    name_passfile()  # before the read connects (the trainer's own call then finds it named)
    read = _Read(threading.Event())
    _pending[:] = [read]
    threading.Thread(target=_read, args=(read, args.run_id, args.attempt), name="pgtrain-prefetch",
                     daemon=True).start()


def _read(read: _Read, run_id: str, attempt: int) -> None:
    try:
        with connect(attempt=attempt) as conn:
            run = record.get_run(conn, run_id)
            read.shards = record.get_manifest(conn, run_id)
            if len(read.shards) == 1:  # else the trainer refuses the job's size first
                started = time.perf_counter()
                read.data = read_shard(conn, run, read.shards, 0, 1)
                read.seconds = time.perf_counter() - started
    except BaseException as error:  # handed to the trainer, which decides
        read.error = error
    finally:
        read.done.set()


def take(shards: list[record.Shard]) -> tuple[loader.ShardData, float] | None:
    """(the rows read early, the read's seconds) when they are the rows of ``shards`` (the manifest the trainer
    read); None when nothing was read early, or the read failed for a reason not the run's."""
    if not _pending:
        return None
    read = _pending.pop()
    read.done.wait()
    if isinstance(read.error, PgtrainError):
        raise read.error
    if read.error is not None or read.data is None or read.shards != shards:
        return None
    return read.data, read.seconds
