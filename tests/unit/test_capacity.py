"""plan_run's launch check: a job its launcher cannot lay out is refused before any row is scanned."""

from __future__ import annotations

import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.errors import ConfigError
from pgtrain.launch.capacity import check_launch, local_slots


def kubernetes(world_size: int, **settings) -> tuple[TrainingConfig, AuthorSettings]:
    return (TrainingConfig(world_size=world_size, launcher="kubernetes"),
            AuthorSettings(launcher="kubernetes", kubernetes=settings))


def test_kubernetes_ranks_must_fill_whole_workers():
    check_launch(*kubernetes(8, gpus_per_worker=4))
    check_launch(*kubernetes(2, gpus_per_worker=4))  # fewer ranks than one worker's GPUs: one worker
    with pytest.raises(ConfigError, match="world_size=6 is not a multiple of gpus_per_worker=4"):
        check_launch(*kubernetes(6, gpus_per_worker=4))


def test_kubernetes_without_gpus_per_worker_uses_the_mpijob_default():
    check_launch(*kubernetes(3))  # one GPU per worker by default: any world size lays out


def test_local_ranks_must_fit_this_machines_cpus():
    check_launch(TrainingConfig(world_size=local_slots()), AuthorSettings())
    with pytest.raises(ConfigError, match="more ranks than this machine"):
        check_launch(TrainingConfig(world_size=local_slots() + 1), AuthorSettings())
