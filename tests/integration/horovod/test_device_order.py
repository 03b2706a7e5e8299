"""A rank's device order inside the real trainer: its GPU is selected before a row is loaded, and the GPU's free
memory is read after (the rows' size is known then); a CPU rank asks CUDA nothing more. The rank runs in this
process (Horovod with one rank) on a real PostgreSQL and the real loader; only ``torch.cuda`` is a recording
stand-in, which stops the rank where it would first put a tensor on the GPU (no GPU ran here).

And a CUDA out-of-memory error while training is the run's refusal, not a failure to retry (real ranks)."""

from __future__ import annotations

import logging
import os

import horovod.torch as hvd
import pytest

from pgtrain.core.database_url import DATABASE_URL_ENV
from pgtrain.core.errors import TrainingInputError
from pgtrain.data import loader
from pgtrain.launch import local as launch_local
from pgtrain.launch.attempt import start_attempt
from pgtrain.launch.mpijob.api import GPUS_PER_WORKER_ENV
from pgtrain.runs import record
from tests.conftest import REPO
from tests.db.test_verdicts import verdict
from tests.support import planned_run, seed_samples
from tests.unit.test_rank_device import RecordingCuda
from trainer import train as trainer

pytestmark = pytest.mark.horovod


class StopBeforeTheGpu(Exception):
    """Raised by the stand-in where the rank would next put a tensor on the GPU."""


class StoppingCuda(RecordingCuda):
    def mem_get_info(self, device: int) -> tuple[int, int]:
        super().mem_get_info(device)
        raise StopBeforeTheGpu


def rank_in_this_process(autocommit, db_url, monkeypatch, cuda: RecordingCuda) -> tuple[record.Run, int | None]:
    seed_samples(autocommit, rows=200, dim=6, classes=3)
    run = planned_run(autocommit, world_size=1, epochs=1)
    attempt = start_attempt(autocommit, run.run_id)
    monkeypatch.setenv(DATABASE_URL_ENV, db_url)
    real_load = loader.load_shard

    def load_shard(*args, **kwargs):
        cuda.calls.append("load_shard")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loader, "load_shard", load_shard)
    try:
        return run, trainer.train(trainer.parse_args(["--run-id", run.run_id, "--attempt", str(attempt)]), cuda)
    except StopBeforeTheGpu:
        return run, None
    finally:
        hvd.shutdown()


def test_a_gpu_rank_selects_its_gpu_before_it_loads_a_row(autocommit, db_url, monkeypatch):
    cuda = StoppingCuda(gpus=1, free=80 << 30)
    _, returned = rank_in_this_process(autocommit, db_url, monkeypatch, cuda)
    assert returned is None  # stopped at the memory check, before any tensor went to the GPU
    # the rank names its GPU once it is the current one (trainer.device.device_line), then loads
    assert cuda.calls == ["is_available", "device_count", "set_device 0", "get_device_name 0", "load_shard",
                          "mem_get_info 0"]


def test_a_cpu_rank_asks_cuda_nothing_but_whether_it_is_there(autocommit, db_url, monkeypatch):
    cuda = RecordingCuda(gpus=0)
    run, returned = rank_in_this_process(autocommit, db_url, monkeypatch, cuda)
    assert returned == 0
    assert cuda.calls == ["is_available", "load_shard"]
    assert record.get_run(autocommit, run.run_id).status == "trained"


def test_a_cuda_out_of_memory_error_while_training_is_the_run_s_refusal(autocommit, db_url, monkeypatch):
    # The ranks import the model factory from the unit test module, like a user's package.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    seed_samples(autocommit, rows=120, dim=4, classes=3)
    run = planned_run(autocommit, world_size=2, epochs=2, batch_size=24,
                      model="tests.unit.test_rank_device:out_of_memory_when_training")
    with pytest.raises(TrainingInputError) as failure:  # the train task's retry policy fails it for good
        launch_local.run_local(run.run_id, 2, db_url, logging.getLogger("test.oom"), timeout_seconds=300)
    status, reason = verdict(autocommit, run.run_id)
    assert status == "refused"
    assert reason == ("device cpu ran out of memory training batches of 24 rows per rank on 2 ranks (CUDA out of "
                      "memory); use a smaller batch_size, a smaller model, or more ranks (world_size: fewer rows "
                      "per GPU)")
    assert reason in str(failure.value)


def test_a_rank_whose_worker_holds_gpus_refuses_to_train_without_cuda(autocommit, db_url, monkeypatch):
    """What an MPIJob's rank does on a node whose driver is older than the build's floor (here: no CUDA at all, the
    real torch.cuda): it refuses before it loads a row, and the run's verdict is 'refused', which the train task
    does not retry."""
    monkeypatch.setenv(GPUS_PER_WORKER_ENV, "2")  # as the MPIJob sets it (the local launcher passes no such thing)
    monkeypatch.setenv(DATABASE_URL_ENV, db_url)
    seed_samples(autocommit, rows=120, dim=4, classes=3)
    run = planned_run(autocommit, world_size=1, epochs=1)
    attempt = start_attempt(autocommit, run.run_id)
    try:
        assert trainer.main(["--run-id", run.run_id, "--attempt", str(attempt)]) == 2
    finally:
        hvd.shutdown()
    status, reason = verdict(autocommit, run.run_id)
    assert status == "refused"
    assert reason.startswith("this rank's worker holds 2 GPUs (gpus_per_worker) but ")
    assert "make image-gpu" in reason or "driver must be R" in reason  # a CPU build here, a CUDA build on a node
    assert record.epoch_metrics(autocommit, run.run_id) == []  # nothing trained on the CPU
