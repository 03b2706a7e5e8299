"""What the trainer does with rows a rank alone read early (trainer.prefetch.take): uses them, raises the run's own
refusal, or reads again itself after a failure that is not the run's, or when the manifest is not the one read."""

from __future__ import annotations

import threading

import numpy as np
import psycopg
import pytest

from pgtrain.core.errors import SourceError
from pgtrain.runs.record import Shard
from trainer import prefetch

SHARDS = [Shard(rank=0, world_size=1, key_lo="1", key_hi="9", row_count=9, val_count=1, train_count=8)]


def early(**read: object) -> None:
    done = threading.Event()
    done.set()
    prefetch._pending[:] = [prefetch._Read(done, **read)]


def test_nothing_read_early_means_the_trainer_reads():
    prefetch._pending.clear()
    assert prefetch.take(SHARDS) is None


def test_rows_read_early_for_the_same_manifest_are_taken_once():
    rows = np.zeros(3)
    early(shards=list(SHARDS), data=rows, seconds=0.5)
    assert prefetch.take(SHARDS) == (rows, 0.5)
    assert prefetch.take(SHARDS) is None


def test_a_refusal_of_the_rows_is_the_run_s():
    early(shards=list(SHARDS), error=SourceError("rows changed since compute_shards"))
    with pytest.raises(SourceError, match="rows changed"):
        prefetch.take(SHARDS)


def test_a_failure_not_the_run_s_or_another_manifest_reads_again():
    early(error=psycopg.OperationalError("connection refused"))
    assert prefetch.take(SHARDS) is None
    other = [Shard(rank=0, world_size=1, key_lo="1", key_hi="8", row_count=8, val_count=1, train_count=7)]
    early(shards=other, data=np.zeros(3), seconds=0.5)
    assert prefetch.take(SHARDS) is None
