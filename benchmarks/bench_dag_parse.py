"""DAG parse time: what the scheduler's DAG processor pays for pgtrain_training on every parse.

Each figure is the median over fresh interpreters of the time to parse the DAG file once Airflow
itself is imported, beside two baselines parsed the same way: the same six tasks as a bare TaskFlow
chain with no params, and the same chain with `train` as a plain KubernetesPodOperator (what any DAG
that launches pods pays: the provider imports the kubernetes clients). The ratio against the second is
what pgtrain's own wiring (params, operators) adds.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, machine, report

RUNS = 7
TASKFLOW_DAG = '''
from datetime import datetime
from airflow.sdk import DAG, chain, task
names = ["provision_tables", "plan_run", "compute_shards", "train", "commit_parameters", "report"]
with DAG(dag_id="baseline", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False):
    chain(*[task(lambda: None, task_id=name)() for name in names])
'''
KPO_DAG = TASKFLOW_DAG.replace("from airflow.sdk import", "from airflow.providers.cncf.kubernetes.operators.pod "
                               "import KubernetesPodOperator\nfrom airflow.sdk import").replace(
    "chain(*[task(lambda: None, task_id=name)() for name in names])",
    "chain(*[KubernetesPodOperator(task_id=n, image='x') if n == 'train' else task(lambda: None, task_id=n)() "
    "for n in names])")
PROBE = '''
import json, sys, time
import airflow.sdk  # the floor every DAG file pays; not counted
from airflow.dag_processing.dagbag import DagBag
started = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
seconds = time.perf_counter() - started
assert not bag.import_errors, bag.import_errors
print(json.dumps({"seconds": seconds, "heavy": [m for m in ("torch", "psycopg", "numpy") if m in sys.modules]}))
'''


def parse_seconds(folder: Path) -> tuple[float, list[str]]:
    samples, heavy = [], []
    for _ in range(RUNS):
        out = subprocess.run([sys.executable, "-c", PROBE, str(folder)], capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        samples.append(result["seconds"])
        heavy = result["heavy"]
    return statistics.median(samples), heavy


def main() -> None:
    baselines = {}
    for name, text in (("taskflow", TASKFLOW_DAG), ("kpo", KPO_DAG)):
        with tempfile.TemporaryDirectory() as baseline_dir:
            (Path(baseline_dir) / "baseline.py").write_text(text)
            baselines[name], _ = parse_seconds(Path(baseline_dir))
    pgtrain, heavy = parse_seconds(REPO / "dags")
    print(f"DAG parse, median of {RUNS} fresh interpreters ({machine()})")
    report({
        "dag_parse.seconds": round(pgtrain, 4),
        "dag_parse.baseline_taskflow_seconds": round(baselines["taskflow"], 4),
        "dag_parse.baseline_kpo_seconds": round(baselines["kpo"], 4),
        "dag_parse.ratio_vs_baseline": round(pgtrain / baselines["kpo"], 2),
        "dag_parse.heavy_modules_imported": len(heavy),
    })


if __name__ == "__main__":
    main()
