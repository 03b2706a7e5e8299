"""Every benchmark script starts the way `make bench` starts it (`python benchmarks/bench_x.py`: its folder first on
sys.path): its imports resolve, the dev tools included. Running them is `make bench-quick`'s job."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPTS = sorted(p.stem for p in (REPO / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_imports_as_make_bench_starts_it(script):
    probe = f"import runpy, sys; sys.argv = [{script!r}]; runpy.run_path({script + '.py'!r}, run_name='bench')"
    result = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, ''); {probe}"],
                            cwd=REPO / "benchmarks", capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_benchmarks_are_found():
    assert {"bench_dag_parse", "bench_loader", "bench_manifest", "bench_quality", "bench_training"} <= set(SCRIPTS)


def test_the_gpu_benchmark_skips_cleanly_without_a_gpu():
    """Without a CUDA device bench_gpu.py says so, measures nothing (run_all's JSON line holds no figure) and exits
    0, before it starts a database (these machines have no GPU: its CUDA path has not run here)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: bench_gpu.py would measure (make bench)")
    result = subprocess.run([sys.executable, "bench_gpu.py"], cwd=REPO / "benchmarks", capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bench_gpu: skipped: no CUDA device here" in result.stdout
    assert result.stdout.splitlines()[-1] == "{}"


@pytest.mark.horovod  # the trainer's ranks, on both backends
def test_the_gpu_benchmark_s_cpu_parts_run_in_quick_mode():
    """--quick without a GPU: every variant of both model sizes and the trainer on both backends run on the CPU, and
    each size's figures are medians over its rounds (these prove the code, not a GPU)."""
    import json
    import os

    env = {**os.environ, "PGTRAIN_BENCH_GPU_ROWS": "2000", "PGTRAIN_BENCH_GPU_ROUNDS": "1"}
    result = subprocess.run([sys.executable, "bench_gpu.py", "--quick"], cwd=REPO / "benchmarks", capture_output=True,
                            text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.splitlines()[-1])
    for size in ("launch", "compute"):
        for variant in ("device", "device_bf16", "plain", "plain_bf16"):
            assert figures[f"gpu.{size}.{variant}.samples_per_s"] > 0
        assert figures[f"gpu.{size}.device_vs_plain"] > 0
    assert figures["gpu.trainer.torch_1_gpus_samples_per_s"] > 0
    assert figures["gpu.rounds"] == 1 and figures["gpu.rows"] == 2000


def test_the_gpu_check_script_fails_clearly_without_cuda():
    """scripts/gpu_check.sh on a machine without a usable GPU: exit 2 naming why, before any database or benchmark."""
    import os

    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: scripts/gpu_check.sh would measure")
    result = subprocess.run([str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "gpu_check: FAILED: no CUDA device is usable here" in result.stderr
    assert "make image-gpu" in result.stderr and "nothing was measured" in result.stderr
    assert "== bench_gpu" not in result.stdout


def _quality_references():
    import importlib

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module("quality_references")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_vs_best_reference_is_ours_minus_the_best_reference_lower_rmse_best():
    """bench_quality's quality.T.<built-in>.<metric>.vs_best_reference on real fits: the best reference is the
    highest R² but the lowest RMSE, and the difference is ours minus its figure (negative R² = behind, negative
    RMSE = ahead)."""
    import numpy as np

    refs = _quality_references()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3)).astype(np.float32)
    y = x[:, 0] * 3 + np.where(x[:, 1] > 0, 2.0, -2.0) + rng.normal(scale=0.1, size=400)  # a step: trees win
    data = refs.Data(x[:300], y[:300], x[300:350], y[300:350], x[350:], 0)
    figures = {name: refs.regression_figures(y[350:], refs.fit_and_score(name, data)[0])
               for name in (refs.RIDGE, refs.HGB)}
    assert figures[refs.HGB]["r2"] > figures[refs.RIDGE]["r2"]
    assert figures[refs.HGB]["rmse"] < figures[refs.RIDGE]["rmse"]
    names = (refs.RIDGE, refs.HGB)
    assert refs.vs_best_reference(0.5, figures, "r2", names) == (refs.HGB, 0.5 - figures[refs.HGB]["r2"])
    assert refs.vs_best_reference(1.0, figures, "rmse", names) == (refs.HGB, 1.0 - figures[refs.HGB]["rmse"])
    # only the names asked about count
    assert refs.vs_best_reference(0.5, figures, "r2", (refs.RIDGE,)) == (refs.RIDGE, 0.5 - figures[refs.RIDGE]["r2"])


def test_a_network_reference_stops_on_its_validation_rows():
    """The plain MLP reference trains on the training rows, keeps its best validation epoch and scores every row."""
    import numpy as np

    refs = _quality_references()
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    data = refs.Data(x[:200], y[:200], x[200:250], y[200:250], x[250:], 2)
    probabilities, info = refs.fit_and_score(refs.PLAIN_MLP, data)
    assert probabilities.shape == (50, 2) and np.allclose(probabilities.sum(1), 1, atol=1e-5)
    assert 1 <= info["best_epoch"] <= info["epochs"] <= refs.NETWORK_EPOCHS
    assert info["epochs"] - info["best_epoch"] == refs.NETWORK_PATIENCE or info["time_limited"] or \
        info["epochs"] == refs.NETWORK_EPOCHS
    assert refs.classification_figures(y[250:], probabilities)["accuracy"] > 0.85


def test_the_manifest_benchmark_s_run_is_admitted_on_any_machine(monkeypatch):
    """bench_manifest plans 8 shards: its run must be admitted where fewer CPUs are than ranks (a local launcher
    refuses world_size 8 on these 2 cores, and the benchmark then measured nothing)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_manifest
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    from pgtrain.config.settings import AuthorSettings
    from pgtrain.launch import capacity

    monkeypatch.setattr(capacity, "local_slots", lambda: 2)
    config = bench_manifest.config_for(8)
    capacity.check_launch(config, AuthorSettings())
    assert config.world_size == 8
