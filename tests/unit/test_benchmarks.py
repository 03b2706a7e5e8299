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


def test_the_figures_are_sklearn_s():
    """accuracy, ROC AUC, R² and RMSE (one function each, for the figures and the bootstrap) give sklearn's figures."""
    import numpy as np
    from sklearn.metrics import accuracy_score, mean_squared_error, r2_score, roc_auc_score

    refs = _quality_references()
    rng = np.random.default_rng(2)
    y, predicted = rng.normal(size=200), rng.normal(size=200)
    assert refs.regression_figures(y, predicted) == pytest.approx(
        {"r2": r2_score(y, predicted), "rmse": np.sqrt(mean_squared_error(y, predicted))}, abs=1e-12)
    classes = rng.integers(0, 3, 200)
    probabilities = rng.dirichlet(np.ones(3), 200)
    assert refs.classification_figures(classes, probabilities) == pytest.approx(
        {"accuracy": accuracy_score(classes, probabilities.argmax(1)),
         "roc_auc": roc_auc_score(classes, probabilities, multi_class="ovr", labels=[0, 1, 2])}, abs=1e-12)
    binary, tied = classes % 2, np.round(probabilities[:, :2] / probabilities[:, :2].sum(1, keepdims=True), 1)
    assert refs.classification_figures(binary, tied)["roc_auc"] == pytest.approx(roc_auc_score(binary, tied[:, 1]),
                                                                                abs=1e-12)
    # a leading axis of resamples: each resample's figure
    drawn = rng.integers(0, 200, (5, 200))
    assert refs.roc_auc(classes[drawn], probabilities[drawn]) == pytest.approx(
        [roc_auc_score(classes[d], probabilities[d], multi_class="ovr", labels=[0, 1, 2]) for d in drawn], abs=1e-12)
    assert refs.r2(y[drawn], predicted[drawn]) == pytest.approx([r2_score(y[d], predicted[d]) for d in drawn])


def test_the_bootstrap_interval_of_a_difference_is_paired():
    """bench_quality's vs_best_reference_ci95: the same model twice differs by exactly 0; a model whose every error
    is 5% smaller than the other's is ahead on every resample (the rows drawn alike for both: an unpaired bootstrap
    of these noisy rows would straddle 0); a clearly better classifier's interval excludes 0; the same seed, the
    same interval."""
    import numpy as np

    refs = _quality_references()
    rng = np.random.default_rng(3)
    y = rng.normal(size=300)
    theirs = y + rng.normal(scale=2.0, size=300)
    for metric in ("r2", "rmse"):
        assert refs.bootstrap_difference(y, theirs, theirs, metric) == (0.0, 0.0)
    ours = y + 0.95 * (theirs - y)
    r2_low, r2_high = refs.bootstrap_difference(y, ours, theirs, "r2")
    rmse_low, rmse_high = refs.bootstrap_difference(y, ours, theirs, "rmse")
    assert 0 < r2_low < r2_high and rmse_low < rmse_high < 0
    assert refs.bootstrap_difference(y, ours, theirs, "r2") == (r2_low, r2_high)
    assert refs.bootstrap_difference(y, ours, theirs, "r2", seed=1) != (r2_low, r2_high)

    classes = rng.integers(0, 2, 300)
    good = np.where(rng.random(300) < 0.9, classes, 1 - classes)  # right on ~90% of the rows
    poor = np.where(rng.random(300) < 0.6, classes, 1 - classes)  # ~60%
    good_p, poor_p = (np.stack([1 - 0.8 * c - 0.1, 0.8 * c + 0.1], 1) for c in (good, poor))
    for metric in ("accuracy", "roc_auc"):
        assert refs.bootstrap_difference(classes, good_p, good_p, metric) == (0.0, 0.0)
        low, high = refs.bootstrap_difference(classes, good_p, poor_p, metric, resamples=500)
        assert 0 < low < high


def test_resamples_without_a_class_are_left_out_of_a_roc_auc_interval():
    """ROC AUC is undefined on drawn rows of one class: such resamples are skipped, not NaN nor an error."""
    import warnings

    import numpy as np

    refs = _quality_references()
    classes = np.array([1] + [0] * 9)  # a third of the resamples (0.9^10 = 0.35) draw no 1
    scores = np.linspace(0.1, 0.9, 10)
    ours, theirs = (np.stack([1 - s, s], 1) for s in (scores, scores[::-1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low, high = refs.bootstrap_difference(classes, ours, theirs, "roc_auc", resamples=200)
    assert np.isfinite(low) and np.isfinite(high) and low <= high


def test_a_target_is_missed_beyond_noise_only_where_its_whole_interval_is_behind_the_margin():
    """bench_quality's targets_missed keeps its literal verdict; targets_missed_beyond_noise only those whose 95%
    interval's upper end is behind by more than the margin."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_quality
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    diabetes = bench_quality.TABLES["diabetes"]
    behind = {"mlp": {"r2": -0.04}, "xgboost": {"r2": -0.01}}
    missed, beyond = bench_quality.targets(diabetes, behind, {"mlp": {"r2": (-0.07, -0.02)},
                                                               "xgboost": {"r2": (-0.03, 0.01)}})
    assert missed == ["r2: the better built-in (xgboost) -0.0100 behind the best reference (margin 0.005)",
                      "r2: mlp -0.0400 behind the best reference (margin 0.015)"]
    assert beyond == ["r2: mlp -0.0400 behind the best reference (margin 0.015), 95% interval [-0.0700, -0.0200]"]
    # an upper end inside the margin: missed, but not beyond noise
    assert bench_quality.targets(diabetes, behind, {"mlp": {"r2": (-0.07, -0.01)}, "xgboost": {"r2": (-0.03, 0.01)}}
                                 ) == (missed, [])
    assert bench_quality.targets(diabetes, {"mlp": {"r2": 0.0}, "xgboost": {"r2": -0.01}},
                                 {"mlp": {"r2": (-0.03, 0.03)}, "xgboost": {"r2": (-0.03, 0.01)}}) == ([], [])


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
