"""A real rank's start: the author's threads per rank reach it, and its training path imports neither torch._dynamo
nor what only other runs need (Horovod for one rank, the booster for a network)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.cpus import usable_cpus
from pgtrain.data import manifest, policy
from pgtrain.runs import record
from tests.support import planned_run, run_job, seed_samples

pytestmark = pytest.mark.horovod

# Imported at the start of every Python process that has its folder on PYTHONPATH (which the local launcher passes
# to the ranks): at exit, the process's command line and the modules it imported, in a file beside it.
PROBE = textwrap.dedent("""\
    import atexit, json, os, sys
    from pathlib import Path

    def _record():
        Path(__file__).with_name(f"modules-{os.getpid()}.json").write_text(
            json.dumps({"argv": sys.argv, "modules": sorted(sys.modules)}))

    atexit.register(_record)
    """)


def test_the_author_s_intra_op_threads_reach_the_rank(autocommit, db_url):
    seed_samples(autocommit, rows=300, dim=8, classes=3)
    threads = usable_cpus() + 1  # neither the automatic count nor one a test machine's $OMP_NUM_THREADS says
    config = policy.admit(autocommit, TrainingConfig.from_mapping({"epochs": 1, "world_size": 1}),
                          AuthorSettings(intra_op_threads=threads))
    run = record.plan_run(autocommit, "pgtrain_test", "author-threads", config)
    manifest.plan_shards(autocommit, run)
    assert record.get_run(autocommit, run.run_id).config.intra_op_threads == threads  # in the snapshot

    output = run_job(run, db_url)

    assert any(f"{threads} threads per rank, passive waits" in line for line in output), output


def test_a_rank_takes_a_second_thread_only_for_a_step_with_the_work_for_it(autocommit, db_url, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the automatic count, whatever this machine's says
    seed_samples(autocommit, rows=1400, dim=8, classes=3)  # about 1,120 training rows: 3 steps of 374 at batch 512
    # 8 -> 12 -> 3 at batch 64: 8k multiply-adds a step; 8 -> 256 -> 256 -> 256 -> 3, 374 rows: 50M
    for name, params, threads in (("small-step", {"hidden_sizes": [12], "batch_size": 64}, 1),
                                  ("large-step", {"hidden_sizes": [256, 256, 256], "batch_size": 512},
                                   min(2, usable_cpus()))):
        run = planned_run(autocommit, name, epochs=1, world_size=1, **params)
        output = run_job(run, db_url)
        assert any(f"{threads} threads per rank, passive waits" in line for line in output), (name, output)


def test_a_rank_trains_without_importing_torch_dynamo(autocommit, db_url, tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(PROBE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    seed_samples(autocommit, rows=300, dim=8, classes=3)
    # AdamW (the default) in one rank, then SGD in two (Horovod's DistributedOptimizer over it), checkpoints on
    for params in ({"epochs": 2, "world_size": 1}, {"epochs": 2, "world_size": 2, "optimizer": "sgd"}):
        run = planned_run(autocommit, f"no-dynamo-{params['world_size']}", **params)
        output = run_job(run, db_url)
        assert record.get_run(autocommit, run.run_id).status == "trained", output

    ranks = [json.loads(p.read_text()) for p in Path(tmp_path).glob("modules-*.json")]
    ranks = [r for r in ranks if any(arg.endswith(os.path.join("trainer", "__main__.py")) for arg in r["argv"][:1])]
    assert len(ranks) == 3  # the probe ran in every rank, and each trained (torch.optim loaded)
    for rank in ranks:
        assert "torch.optim" in rank["modules"]
        # The one-rank run's trainer started alone: no Horovod at all (trainer.collectives.solo).
        assert ("horovod.torch" in rank["modules"]) == ("--alone" not in rank["argv"]), rank["argv"]
        assert "torch._dynamo" not in rank["modules"]
        # A network's rank loads neither the booster's module nor a boosting library (only a boosted run does).
        assert not [m for m in rank["modules"] if m == "trainer.boosted" or m.startswith(("xgboost", "lightgbm"))]
