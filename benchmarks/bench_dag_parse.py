"""DAG parse time: what the scheduler's DAG processor pays for pgtrain's DAG folder on every parse.

Each figure is the median over fresh interpreters of the time to parse the DAG folder once Airflow itself is
imported, beside two baselines parsed the same way: the same DAGs (ids and task ids, read from the folder's
own parse) as bare TaskFlow chains with no params (the floor: the fastest plain way to define those DAGs), and
the same with each `train` task a plain KubernetesPodOperator (what a DAG that launches pods the usual way
pays: the provider imports the kubernetes clients). ``ratio_vs_floor`` is what pgtrain's own wiring (params,
the settings and models files, four DAG files) adds; ``ratio_vs_kpo`` compares with the usual pod DAG.
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
# The floor: the DAGs the folder defines, each a bare TaskFlow chain of as many no-op tasks (no params, no
# settings, no providers); the KPO variant makes each DAG's `train` task a plain KubernetesPodOperator.
FLOOR_DAGS = '''
from datetime import datetime
from airflow.sdk import DAG, chain, task
{imports}
for dag_id, names in {shape!r}.items():
    with DAG(dag_id=dag_id, schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False):
        chain(*[{train} if name == "train" else task(lambda: None, task_id=name)() for name in names])
'''
KPO_IMPORT = "from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator"
PROBE = '''
import json, sys, time
import airflow.sdk  # the floor every DAG file pays; not counted
from airflow.dag_processing.dagbag import DagBag
started = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
seconds = time.perf_counter() - started
assert not bag.import_errors, bag.import_errors
print(json.dumps({"seconds": seconds, "heavy": [m for m in ("torch", "psycopg", "numpy") if m in sys.modules],
                  "shape": {d.dag_id: [t.task_id for t in d.tasks] for d in bag.dags.values()}}))
'''


def parse_seconds(folder: Path) -> tuple[float, dict]:
    samples, result = [], {}
    for _ in range(RUNS):
        out = subprocess.run([sys.executable, "-c", PROBE, str(folder)], capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        samples.append(result["seconds"])
    return statistics.median(samples), result


def main() -> None:
    pgtrain, parsed = parse_seconds(REPO / "dags")
    heavy, shape = parsed["heavy"], parsed["shape"]
    baselines = {}
    for name, imports, train in (("taskflow", "", "task(lambda: None, task_id=name)()"),
                                 ("kpo", KPO_IMPORT, "KubernetesPodOperator(task_id=name, image='x')")):
        with tempfile.TemporaryDirectory() as baseline_dir:
            (Path(baseline_dir) / "baseline.py").write_text(
                FLOOR_DAGS.format(imports=imports, shape=shape, train=train))
            baselines[name], _ = parse_seconds(Path(baseline_dir))
    print(f"DAG parse, median of {RUNS} fresh interpreters ({machine()})")
    report({
        "dag_parse.seconds": round(pgtrain, 4),
        "dag_parse.baseline_taskflow_seconds": round(baselines["taskflow"], 4),
        "dag_parse.baseline_kpo_seconds": round(baselines["kpo"], 4),
        "dag_parse.ratio_vs_floor": round(pgtrain / baselines["taskflow"], 2),
        "dag_parse.ratio_vs_kpo": round(pgtrain / baselines["kpo"], 2),
        "dag_parse.heavy_modules_imported": len(heavy),
    })


if __name__ == "__main__":
    main()
