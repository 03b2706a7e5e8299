"""Test helpers shared by the test modules: seed rows, plan a run the way the DAG does."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from dev import examples
from pgtrain.config.params import TrainingConfig
from pgtrain.config.settings import AuthorSettings
from pgtrain.launch import local as launch_local
from pgtrain.planning.plan import plan_training
from pgtrain.runs import record


def seed_samples(conn: psycopg.Connection, rows: int, dim: int = 8, classes: int = 4, seed: int = 0) -> None:
    features, labels = examples.synthetic(rows, dim, classes, seed)
    examples.insert_samples(conn, features, labels)


def seed_noise(conn: psycopg.Connection, rows: int, dim: int = 8, seed: int = 3) -> None:
    """public.noise (id, features real[], label 0/1): labels independent of the features, so a model's validation
    loss rises once it memorizes its training rows (what early stopping is for)."""
    rng = np.random.default_rng(seed)
    conn.execute("CREATE TABLE public.noise (id bigint PRIMARY KEY, features real[] NOT NULL, label integer NOT NULL)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.noise VALUES (%s, %s, %s)",
                        [(i + 1, rng.normal(size=dim).tolist(), int(rng.integers(0, 2))) for i in range(rows)])


def planned_run(conn: psycopg.Connection, dag_run_id: str = "test-run", *, author: AuthorSettings | None = None,
                **params) -> record.Run:
    """A run triggered by hand, planned by the functions the DAG's plan_run and compute_shards call (admission,
    capacity, shards); returns the run with its dimensions. ``author``: the DAG's settings; by default ones that
    admit the params as they are."""
    return plan_training(conn, TrainingConfig.from_mapping(params), "pgtrain_test", dag_run_id, author)


# Params of the example tables of dev.examples (load them with examples.load_breast_cancer / load_diabetes).
def breast_cancer_params() -> dict[str, object]:
    """Classification on "Clinic"."Biopsies": 30 scalar double precision columns, smallint label "diagnosis"."""
    return {"source_table": '"Clinic"."Biopsies"', "key_column": "id", "features_column": None,
            "feature_columns": examples.breast_cancer()[0], "label_column": "diagnosis", "task": "classification"}


def diabetes_params() -> dict[str, object]:
    """Regression on public.diabetes: 10 scalar double precision columns, double precision target "progression"."""
    return {"source_table": "public.diabetes", "key_column": "id", "features_column": None,
            "feature_columns": examples.diabetes()[0], "label_column": "progression", "task": "regression"}


def run_job(run: record.Run, db_url: str, lines: list[str] | None = None) -> list[str]:
    """One attempt of the train task's local job (run_local starts a new attempt, as a retried task does);
    its log lines are appended to ``lines`` as they come, also when it fails."""
    lines = [] if lines is None else lines
    log = logging.getLogger(f"test.job.{run.run_id}")
    log.setLevel(logging.INFO)
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log.addHandler(handler)
    try:
        launch_local.run_local(run.run_id, run.config.world_size, db_url, log, timeout_seconds=300)
    finally:
        log.removeHandler(handler)
    return lines


def job_in_background(run: record.Run, db_url: str,
                      lines: list[str] | None = None) -> tuple[threading.Thread, list[BaseException]]:
    """run_job in a thread, started (a test kills a rank meanwhile): the thread, and the error it raised once it
    has ended (empty when the job succeeded)."""
    failure: list[BaseException] = []

    def attempt() -> None:
        try:
            run_job(run, db_url, lines)
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            failure.append(error)

    job = threading.Thread(target=attempt)
    job.start()
    return job, failure


def wait_for_checkpoint(db_url: str, run_id: str, epoch: int, seconds: float = 240) -> None:
    """Until the run's checkpoint is of ``epoch``."""
    with psycopg.connect(db_url, autocommit=True) as watcher:
        wait_for(lambda: watcher.execute("SELECT epoch FROM pgtrain.checkpoints WHERE run_id = %s",
                                         (run_id,)).fetchone() == (epoch,), seconds, f"the epoch-{epoch} checkpoint")


def wait_for(check: Callable[[], Any], seconds: float, what: str) -> Any:
    """Poll ``check`` until it returns something true; fail the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"gave up after {seconds:g} s waiting for {what}")


def with_password(url: str, password: str) -> str:
    """``postgresql://user@/db?host=...`` with a password added."""
    scheme, rest = url.split("://", 1)
    userinfo, at, hostpart = rest.partition("@")
    if not at:
        raise ValueError(f"expected a URL with a user part: {url}")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:{password}@{hostpart}"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # gone, or not ours to read
        return b""


class ProcessWatch:
    """Reads every process's command line and environment, over and over, looking for a secret."""

    def __init__(self, secret: str, run_id: str) -> None:
        self.secret = secret.encode()
        self.run_id = run_id.encode()
        self.leaks: list[str] = []
        self.rank_scans = 0
        self.gloo_command_lines = 0
        self.passfiles: set[str] = set()

    def during(self, work: Callable[[], object]) -> list[BaseException]:
        """Run ``work`` in a thread, scanning every 50 ms until it ends; what it raised, for the caller to assert."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                work()
            except BaseException as error:  # reported by the caller's asserts
                errors.append(error)

        worker = threading.Thread(target=run)
        worker.start()
        while worker.is_alive():
            self.scan()
            time.sleep(0.05)
        worker.join()
        return errors

    def scan(self) -> None:
        for proc in Path("/proc").glob("[0-9]*"):
            cmdline, environ = _read(proc / "cmdline"), _read(proc / "environ")
            for what, text in (("command line", cmdline), ("environment", environ)):
                if self.secret in text:
                    shown = cmdline.replace(bytes(1), b" ")[:300]
                    self.leaks.append(f"{what} of pid {proc.name}: {shown!r}")
            if b"HOROVOD_RANK=" in cmdline and self.run_id in cmdline:  # Gloo's `sh -c env ...` line
                self.gloo_command_lines += 1
            if b"trainer" in cmdline and self.run_id in cmdline and b"horovodrun" not in cmdline:
                variables = dict(v.split(b"=", 1) for v in environ.split(b"\0") if b"=" in v)
                if b"PGPASSFILE" in variables:
                    self.rank_scans += 1
                    self.passfiles.add(variables[b"PGPASSFILE"].decode())
                if b"PGPASSWORD" in variables:
                    self.leaks.append(f"PGPASSWORD in the environment of rank process {proc.name}")


# A table kept the way people keep one: text, varchar, char(1), enum and boolean columns, a date, NULLs in numeric
# and text columns, a free-text note and a text class label (species follows from island, colour, body mass).
MIXED_TABLE = """
CREATE TYPE public.cut AS ENUM ('Fair', 'Good', 'Very Good', 'Premium', 'Ideal');
CREATE TABLE public.penguins (
    id integer PRIMARY KEY, island text, sex varchar(8), colour char(1), cut public.cut NOT NULL,
    flagged boolean NOT NULL, body_mass double precision, bill real NOT NULL, seen date NOT NULL,
    species text)"""
ISLANDS, COLOURS, SPECIES = ["Biscoe", "Dream", "Torgersen"], ["a", "b", "c", "d"], ["Adelie", "Chinstrap", "Gentoo"]


def mixed_rows(rows: int, seed: int = 0, first_id: int = 1) -> list[tuple[Any, ...]]:
    """Rows of ``MIXED_TABLE``: about 10% NULL body masses, 5% NULL islands, 3% NULL sexes."""
    import datetime

    import numpy as np

    rng = np.random.default_rng(seed)
    island = rng.integers(0, 3, rows)
    colour = rng.integers(0, 4, rows)
    mass = rng.normal(4000.0, 600.0, rows)
    species = (island + (mass > 4200) + (colour == 3)) % 3
    out = []
    for i in range(rows):
        out.append((
            first_id + i, None if rng.random() < 0.05 else ISLANDS[island[i]],
            None if rng.random() < 0.03 else ("male", "female")[i % 2], COLOURS[colour[i]],
            ("Fair", "Good", "Very Good", "Premium", "Ideal")[i % 5], bool(i % 3 == 0),
            None if rng.random() < 0.1 else float(mass[i]), float(rng.normal(40.0, 5.0)),
            datetime.date(2020, 1, 1) + datetime.timedelta(days=int(i % 700)), SPECIES[species[i]]))
    return out


def make_mixed_table(conn: psycopg.Connection, rows: int, seed: int = 0) -> None:
    conn.execute(MIXED_TABLE)
    insert_mixed_rows(conn, mixed_rows(rows, seed))


def insert_mixed_rows(conn: psycopg.Connection, rows: list[tuple[Any, ...]]) -> None:
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.penguins VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", rows)


def mixed_params(**params: Any) -> dict[str, Any]:
    """Train on every column of public.penguins, predicting the text species."""
    return {"source_table": "public.penguins", "key_column": "id", "feature_columns": "*",
            "label_column": "species", "model_name": "penguins", "min_category_count": 1, **params}


def taken_by_another_run(db_url: str, claim: str, run_id: str) -> None:
    """What another run's acquire of the training claim ``claim`` writes once its lease has run out (its holder could
    not reach the database for a whole lease): a new token and owner, in one statement, so that no renewal of the
    holder slips in between."""
    from psycopg.types.json import Jsonb

    with psycopg.connect(db_url, autocommit=True) as conn:
        taken = conn.execute(
            "UPDATE pgtrain.locks SET token = nextval('pgtrain.fencing_tokens'), owner = %s, "
            "acquired_at = clock_timestamp(), heartbeat_at = clock_timestamp(), "
            "expires_at = clock_timestamp() + interval '300 seconds' WHERE name = %s AND owner IS NOT NULL",
            (Jsonb({"training_run": run_id, "host": "elsewhere", "pid": 1}), claim)).rowcount
    assert taken == 1
