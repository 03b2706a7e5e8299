"""Shared by the benchmark scripts: print a figure as it is measured, and finish with one JSON line."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))
sys.path.insert(0, str(REPO))  # the dev/ tools (embedded PostgreSQL, example data)


def machine() -> dict[str, object]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()}


@contextmanager
def stopwatch():
    """with stopwatch() as elapsed: ...; elapsed() -> seconds (frozen when the block ends)."""
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())


def report(figures: dict[str, float | int | str]) -> None:
    """Print each figure on its own line, then all of them as the final JSON line (read by run_all)."""
    for name, value in figures.items():
        print(f"  {name:<48} {value}")
    print(json.dumps(figures, sort_keys=True))


@contextmanager
def bench_database() -> Iterator[tuple[str, str]]:
    """(admin URL, URL of a fresh migrated database) on $PGTRAIN_BENCH_DATABASE_URL's server, else on an
    embedded one; the database is dropped (and the embedded server stopped) afterwards."""
    import psycopg
    from psycopg import sql

    from dev import devdb
    from pgtrain.core.migrations import apply_migrations

    explicit = os.environ.get("PGTRAIN_BENCH_DATABASE_URL")
    with tempfile.TemporaryDirectory(prefix="pgtrain-bench-pg-") as data_dir:
        admin = explicit or devdb.start(data_dir)
        name = f"pgtrain_bench_{uuid.uuid4().hex[:8]}"
        url = devdb.create_database(admin, name)
        try:
            with psycopg.connect(url) as conn:
                apply_migrations(conn)
            yield admin, url
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            if not explicit:
                devdb.stop(data_dir)


def write_synthetic(conn: psycopg.Connection, table: str, rows: int, dim: int, classes: int,
                    chunk: int = 500_000) -> None:
    """public.``table`` (unlogged; created) filled with ``rows`` synthetic rows (dev.examples.synthetic, keys
    1..rows), generated and written ``chunk`` rows at a time so that the bench process stays small."""
    import numpy as np
    from psycopg import sql

    from dev import examples

    examples.create_samples_table(conn, ("public", table), unlogged=True)
    for start in range(0, rows, chunk):
        count = min(chunk, rows - start)
        features, labels = examples.synthetic(count, dim, classes, seed=start)
        examples.insert_samples(conn, features, labels, ("public", table),
                                keys=np.arange(start + 1, start + count + 1, dtype=np.int64))
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier("public", table)))


def size_and_rounds(default_rows: int = 500_000, default_dim: int = 100) -> tuple[int, int, int]:
    """(rows, dim, rounds): ROWS [DIM] from the command line, else $PGTRAIN_BENCH_ROWS / $PGTRAIN_BENCH_DIM;
    $PGTRAIN_BENCH_ROUNDS (default 3)."""
    args = [int(a) for a in sys.argv[1:3]] + [None, None]
    env = os.environ.get
    rows = args[0] or int(env("PGTRAIN_BENCH_ROWS", default_rows))
    return rows, args[1] or int(env("PGTRAIN_BENCH_DIM", default_dim)), int(env("PGTRAIN_BENCH_ROUNDS", 3))


def interleaved(contenders: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round from 1, contender): every contender once a round, their order rotated every round."""
    for round_ in range(rounds):
        shift = round_ % len(contenders)
        for name in [*contenders[shift:], *contenders[:shift]]:
            yield round_ + 1, name


def entry(main: Callable[[], None], measure: Callable[[str, str, dict], dict]) -> None:
    """A benchmark script's start: ``--measure CONTENDER URL SPEC`` (a fresh process that measures once) prints
    ``measure``'s figures as one JSON line; anything else runs ``main``."""
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(measure(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))))
    else:
        main()


def in_threads(*calls: Callable[[], object]) -> None:
    """Run ``calls`` side by side, one thread each; the first error any raised is raised here, after all ended."""
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as error:  # re-raised below, in the measuring thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
