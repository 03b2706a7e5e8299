"""A one-rank local run starts the trainer alone (no horovodrun, no pgtrain.launch.ranks, no rendezvous) and trains
exactly as that one rank does under the backend's launcher: the same parameters, bit for bit, the backend recorded;
its rows are read while it imports torch."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from pgtrain.launch import local as launch_local
from pgtrain.store import tensors
from tests.support import planned_run, run_job, seed_samples

pytestmark = pytest.mark.horovod


def test_the_one_rank_command_is_the_trainer_alone():
    for backend in ("horovod", "torch"):
        command = launch_local.local_command("d/r", 1, 4, backend, 30)
        assert command[:3] == [sys.executable, "-m", "trainer"] and command[-1] == "--alone"
        assert "horovodrun" not in " ".join(command) and "pgtrain.launch.ranks" not in command
    assert "pgtrain.launch.horovodrun" in launch_local.local_command("d/r", 2, 4)


@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_one_rank_alone_trains_as_one_rank_under_its_launcher(autocommit, db_url, monkeypatch, backend):
    seed_samples(autocommit, rows=120, dim=6, classes=3, seed=4)
    params = {"world_size": 1, "epochs": 2, "batch_size": 8, "hidden_sizes": [5], "backend": backend,
              "validation_fraction": 0.2, "test_fraction": 0, "seed": 3}
    alone = planned_run(autocommit, "alone", **params)
    output = run_job(alone, db_url)
    assert any("collectives: " + backend + " (1 rank)" in line for line in output), output
    # started alone, the rank read its rows in a thread while it imported torch (trainer.prefetch)
    assert any("rank 0/1: " in line and line.endswith(" while torch was imported") for line in output), output
    assert not any("horovodrun" in line or "pgtrain.launch.ranks" in line for line in output)
    assert autocommit.execute("SELECT backend FROM pgtrain.training_runs WHERE run_id = %s",
                              (alone.run_id,)).fetchone() == (backend,)

    launched = launch_local.local_command

    def under_the_launcher(run_id: str, world_size: int, attempt: int, *rest: object) -> list[str]:
        command = launched(run_id, 2, attempt, *rest)  # the launcher's command, for one rank
        if "pgtrain.launch.ranks" in command:
            command[command.index("pgtrain.launch.ranks") + 1] = "1"
        else:
            command[command.index("-np") + 1], command[command.index("-H") + 1] = "1", "localhost:1"
        return command

    monkeypatch.setattr(launch_local, "local_command", under_the_launcher)
    launched_run = planned_run(autocommit, "launched", **params)
    output = run_job(launched_run, db_url)
    assert any("starting 1 " + backend + " ranks" in line and ("horovodrun" in line or "ranks 1" in line)
               for line in output), output
    assert any("rank 0/1: " in line and "loaded in" in line and "while torch" not in line for line in output)
    one, other = tensors.read_staged(autocommit, alone.run_id), tensors.read_staged(autocommit, launched_run.run_id)
    assert one.keys() == other.keys()
    for name in one:
        np.testing.assert_array_equal(one[name], other[name], err_msg=name)
