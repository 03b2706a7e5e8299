"""Where a real scheduler run's wall time goes: pgtrain_training triggered over the REST API of a running stack.

    .venv/bin/python benchmarks/bench_scheduler_run.py   # embedded PostgreSQL unless PGTRAIN_BENCH_DATABASE_URL

Starts the stack ``make ui`` starts (``dev.devstack``: api-server, scheduler, dag-processor, triggerer,
LocalExecutor, its settings unchanged) on a fresh metadata database and a fresh training database holding the
digits, unpauses pgtrain_training and triggers it over the REST API with no conf (the digits and the DAG's
defaults, as ``make demo``), one run after the other: once, then PGTRAIN_BENCH_SCHEDULER_ROUNDS times (default
3) interleaved with as many runs of ``bench_eager_training``, the same DAG as every task process parsed it
before the cut (``scheduler_run.before_cut.*``: the Kubernetes provider imported by each task; the benchmark
writes that file into a copy of dags/). The first run after the stack starts is reported apart
(``scheduler_run.first_run_*``): its first task pays the stack's one-time warm-up. Each run is split from
Airflow's metadata (dag_run.queued_at/start_date/end_date; per task scheduled_dttm, queued_dttm, start_date,
end_date), the timestamps of its task log lines and ``pgtrain.run_metrics``, per task:

- ``wait``: the previous task's end (the run's start for the first) until the scheduler schedules this one;
- ``queue``: scheduled until the task instance's start_date (queued, picked up by a LocalExecutor worker,
  the task process forked and registered with the execution API);
- ``startup``: start_date until the task process starts filling its DagBag (startup message, listeners,
  the DAG bundle);
- ``parse``: the DAG file parsed in the task process (Airflow's ``dag_file_parse_ms``: pgtrain's imports and
  the DAG's construction, every task pays it);
- ``pre_execute``: parse done until the task's code runs (template rendering, the context);
- ``code``: the task's code (``execute``), from Airflow's "Pre Execute" group end to "Post Execute";
- ``post``: "Post Execute" until end_date (XCom push, the final state call, the process exits).

Run level: ``run_queue`` (queued_at -> start_date), ``run_finish`` (the last task's end -> the run's
end_date), ``wall`` (queued_at -> end_date) and ``airflow_overhead`` = wall - the tasks' code. ``train``'s code
is also split into the epochs (``pgtrain.run_metrics``) and the rest. Figures are medians over the rounds
(min beside them), ``scheduler_run.*``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from common import REPO, bench_database, report
from psycopg import sql

from dev import devdb, devstack, examples

ROUNDS = int(os.environ.get("PGTRAIN_BENCH_SCHEDULER_ROUNDS", "3"))
DAG_ID = "pgtrain_training"
EAGER_DAG_ID = "bench_eager_training"
RECORDED = ("wall", "run_queue", "run_finish", "airflow_overhead", "client_wall")
TASKS = ("provision_tables", "plan_run", "compute_shards", "train", "commit_parameters", "report")
PHASES = ("wait", "queue", "startup", "parse", "pre_execute", "code", "post")


class Client:
    def __init__(self, stack: devstack.Stack) -> None:
        self._http = httpx.Client(base_url=stack.base_url, timeout=60)
        token = self._http.post("/auth/token", json={"username": stack.username, "password": stack.password})
        token.raise_for_status()
        self._headers = {"Authorization": f"Bearer {token.json()['access_token']}"}

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, headers=self._headers, **kwargs)
        response.raise_for_status()
        return response.json()

    def wait_for_dag(self, dag_id: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._http.get(f"/api/v2/dags/{dag_id}", headers=self._headers).status_code == 200:
                return
            time.sleep(1)
        raise RuntimeError(f"{dag_id} not parsed after {timeout} s")

    def run_once(self, dag_id: str, timeout: float = 900) -> tuple[str, float]:
        """Trigger a run and wait for it; (run id, trigger-to-success seconds as the client saw it)."""
        started = time.time()
        run_id = self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}})[
            "dag_run_id"]
        while time.time() - started < timeout:
            state = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if state == "success":
                return run_id, time.time() - started
            if state == "failed":
                raise RuntimeError(f"run {run_id} failed")
            time.sleep(0.25)
        raise RuntimeError(f"run {run_id} not done after {timeout} s")


def log_marks(path: Path) -> dict[str, float]:
    """Timestamps of the task log's landmarks (the first of each), and the parse time Airflow reports."""
    marks: dict[str, float] = {}
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        event, at = entry.get("event", ""), datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
        name = {"Filling up the DagBag": "fill", "Worker startup parse complete": "parsed",
                "::endgroup::": "pre_done", "::group::Post Execute": "post"}.get(
            next((k for k in ("Filling up the DagBag", "Worker startup parse complete") if event.startswith(k)),
                 event))
        if name in ("fill", "parsed", "pre_done", "post") and name not in marks:
            marks[name] = at.timestamp()
            if name == "parsed":
                marks["parse_seconds"] = entry["dag_file_parse_ms"] / 1000
    return marks


def split_run(metadata_url: str, training_url: str, logs: Path, dag_id: str, run_id: str) -> dict[str, float]:
    with psycopg.connect(metadata_url) as conn:
        queued, started, ended = conn.execute(
            "SELECT queued_at, start_date, end_date FROM dag_run WHERE dag_id = %s AND run_id = %s",
            (dag_id, run_id)).fetchone()
        rows = {task: (s, st, e) for task, s, st, e in conn.execute(
            "SELECT task_id, scheduled_dttm, start_date, end_date FROM task_instance "
            "WHERE dag_id = %s AND run_id = %s AND map_index = -1", (dag_id, run_id))}
    with psycopg.connect(training_url) as conn:
        epochs = conn.execute("SELECT coalesce(sum(seconds), 0) FROM pgtrain.run_metrics WHERE run_id = %s",
                              (f"{dag_id}/{run_id}",)).fetchone()[0]
    figures: dict[str, float] = {"wall": (ended - queued).total_seconds(),
                                 "run_queue": (started - queued).total_seconds()}
    previous_end = started.timestamp()
    for task in TASKS:
        scheduled, task_start, task_end = (t.timestamp() for t in rows[task])
        marks = log_marks(logs / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task}" / "attempt=1.log")
        figures.update({
            f"{task}.wait": scheduled - previous_end,
            f"{task}.queue": task_start - scheduled,
            f"{task}.startup": marks["fill"] - task_start,
            f"{task}.parse": marks["parse_seconds"],
            f"{task}.pre_execute": marks["pre_done"] - marks["fill"] - marks["parse_seconds"],
            f"{task}.code": marks["post"] - marks["pre_done"],
            f"{task}.post": task_end - marks["post"],
        })
        previous_end = task_end
    figures["run_finish"] = ended.timestamp() - previous_end
    for phase in PHASES:
        figures[f"all_tasks.{phase}"] = sum(figures[f"{task}.{phase}"] for task in TASKS)
    figures["train.epochs"] = float(epochs)
    figures["train.code_other"] = figures["train.code"] - float(epochs)
    figures["airflow_overhead"] = figures["wall"] - figures["all_tasks.code"]
    return figures


def show(label: str, figures: dict[str, float]) -> None:
    print(f"  {label}: wall {figures['wall']:.2f} s, Airflow outside the tasks' code {figures['airflow_overhead']:.2f}"
          f" s; run queue {figures['run_queue']:.2f}, finish {figures['run_finish']:.2f}", flush=True)
    print(f"    {'task':<18}" + "".join(f"{p:>12}" for p in PHASES), flush=True)
    for task in (*TASKS, "all_tasks"):
        print(f"    {task:<18}" + "".join(f"{figures[f'{task}.{p}']:>12.2f}" for p in PHASES), flush=True)


def dags_folder(folder: Path) -> None:
    """The repository's DAG files, and EAGER_DAG_ID: pgtrain_training as every task process parsed it when the
    train task was a KubernetesPodOperator whatever the launcher (the Kubernetes provider imported in every task)."""
    for path in (REPO / "dags").iterdir():
        if path.is_file():
            shutil.copy(path, folder / path.name)
    text = (REPO / "dags" / "pgtrain_training.py").read_text()
    text = text.replace(f'dag_id="{DAG_ID}"', f'dag_id="{EAGER_DAG_ID}"').replace(
        "\nfrom airflow.sdk import DAG, chain\n",
        "\nimport pgtrain.airflow.kubernetes.operator  # noqa: F401  (before)\nfrom airflow.sdk import DAG, chain\n")
    assert EAGER_DAG_ID in text and "kubernetes.operator" in text, "dags/pgtrain_training.py changed: fix the benchmark"
    (folder / "bench_eager_training.py").write_text(text)


def main() -> None:
    with (bench_database() as (admin, training_url),
          tempfile.TemporaryDirectory(prefix="pgtrain-bench-stack-") as state,
          tempfile.TemporaryDirectory(prefix="pgtrain-bench-dags-") as dags):
        dags_folder(Path(dags))
        metadata_db = f"airflow_bench_{uuid.uuid4().hex[:8]}"
        metadata_url = devdb.create_database(admin, metadata_db)
        try:
            with psycopg.connect(training_url, autocommit=True) as conn:
                examples.insert_samples(conn, *examples.digits())
            begun = time.monotonic()
            stack = devstack.start(state, metadata_url=metadata_url, training_url=training_url,
                                   extra_env={"AIRFLOW__CORE__DAGS_FOLDER": dags})
            try:
                stack_start = time.monotonic() - begun
                client = Client(stack)
                for dag_id in (DAG_ID, EAGER_DAG_ID):
                    client.wait_for_dag(dag_id)
                    client.call("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False},
                                params={"update_mask": "is_paused"})
                runs: dict[str, list[dict[str, float]]] = {DAG_ID: [], EAGER_DAG_ID: []}
                first = None
                for n, dag_id in enumerate([DAG_ID] + [d for _ in range(ROUNDS) for d in (DAG_ID, EAGER_DAG_ID)]):
                    run_id, seen = client.run_once(dag_id)
                    figures = split_run(metadata_url, training_url, stack.logs_dir / "tasks", dag_id, run_id)
                    figures["client_wall"] = seen
                    show("first run after the stack started" if n == 0 else f"round {(n + 1) // 2} {dag_id}",
                         figures)
                    if n == 0:
                        first = figures
                    else:
                        runs[dag_id].append(figures)
            finally:
                devstack.stop(state)
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(metadata_db)))
    after, before = runs[DAG_ID], runs[EAGER_DAG_ID]
    out: dict[str, float | int | str] = {"scheduler_run.rounds": ROUNDS,
                                         "scheduler_run.stack_start_seconds": round(stack_start, 1),
                                         "scheduler_run.load_average_1min": round(os.getloadavg()[0], 2)}
    out.update({f"scheduler_run.{key}_seconds": round(statistics.median(r[key] for r in after), 2)
                for key in after[0] if key in RECORDED or key.startswith(("all_tasks.", "train."))})
    for key in ("wall", "airflow_overhead", "all_tasks.parse"):
        out[f"scheduler_run.{key}_seconds_min"] = round(min(r[key] for r in after), 2)
    wall = out["scheduler_run.wall_seconds"]
    for key in ("airflow_overhead", *(f"all_tasks.{p}" for p in PHASES)):
        out[f"scheduler_run.{key}_share"] = round(out[f"scheduler_run.{key}_seconds"] / wall, 3)
    for key in ("wall", "airflow_overhead", "provision_tables.startup", "all_tasks.parse"):
        out[f"scheduler_run.first_run_{key}_seconds"] = round(first[key], 2)
    for key in ("wall", "airflow_overhead", "all_tasks.parse"):
        out[f"scheduler_run.before_cut.{key}_seconds"] = round(statistics.median(r[key] for r in before), 2)
        out[f"scheduler_run.before_cut.{key}_seconds_min"] = round(min(r[key] for r in before), 2)
    out["scheduler_run.parse_cut_seconds"] = round(
        out["scheduler_run.before_cut.all_tasks.parse_seconds"] - out["scheduler_run.all_tasks.parse_seconds"], 2)
    out["scheduler_run.wall_seconds_rounds"] = str([round(r["wall"], 1) for r in after])
    out["scheduler_run.before_cut.wall_seconds_rounds"] = str([round(r["wall"], 1) for r in before])
    report(out)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the stack and the embedded server on the way out
    main()
