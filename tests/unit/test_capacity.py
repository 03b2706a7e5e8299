"""plan_run's launch check: a job its launcher cannot lay out is refused before any row is scanned."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgtrain.config.params import TrainingConfig
from pgtrain.config.settings import AuthorSettings
from pgtrain.core.cpus import cgroup_cpu_quota, usable_cpus
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


def cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    return root


@pytest.mark.parametrize(("files", "quota"), [
    ({"cpu.max": "max 100000"}, None),  # cgroup v2 without a limit
    ({"cpu.max": "250000 100000"}, 2.5),
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),  # cgroup v1 without a limit
    ({"cpu,cpuacct/cpu.cfs_quota_us": "150000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 1.5),
    ({"cpu.max": "garbled"}, None),
    ({}, None),  # no cgroup files (not Linux, or not mounted)
])
def test_the_cgroup_cpu_limit_is_read_from_v2_or_v1_files(tmp_path, files, quota):
    assert cgroup_cpu_quota(cgroup(tmp_path, files)) == quota


def test_usable_cpus_are_the_affinity_capped_by_the_cgroup_limit_rounded_up(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(cgroup(tmp_path / "none", {"cpu.max": "max 100000"})) == affinity
    assert usable_cpus(cgroup(tmp_path / "half", {"cpu.max": "50000 100000"})) == 1
    assert usable_cpus(cgroup(tmp_path / "v1", {"cpu/cpu.cfs_quota_us": "150000",
                                                "cpu/cpu.cfs_period_us": "100000"})) == min(affinity, 2)
    assert usable_cpus(cgroup(tmp_path / "big", {"cpu.max": f"{(affinity + 8) * 100000} 100000"})) == affinity
    assert local_slots() == usable_cpus()  # what launcher=local may start
