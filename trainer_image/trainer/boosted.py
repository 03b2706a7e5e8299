"""The gradient-boosted built-in (``model: xgboost``): XGBoost's hist trees, grown data-parallel across the run's
ranks with XGBoost's own collective, from the rows each rank loaded as the MLP's ranks load them.

Rank 0 starts XGBoost's tracker and shares its address through the run's collectives (``broadcast_object``:
Horovod or torch.distributed, local or on Kubernetes); every rank then joins XGBoost's communicator, which
merges the ranks' quantile sketches and gradient histograms each round, so every rank grows the same trees.
Category codes of the encoding are XGBoost categories (``categorical: native``), a numeric NULL is missing
(the encoding's "was missing" input says where: the imputed mean is put back to NaN), and early stopping follows
the validation rows. The version holds one tensor: ``booster``, the booster's UBJSON bytes as uint8;
pgtrain.models.booster scores with it behind the same ``forward`` as the MLP's model, so ``load_model``,
``load_predictor`` and ``predict`` use it unchanged. A warm start (``init_from``) adds rounds to the parent
version's trees.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import numpy as np
import psycopg
import torch

from pgtrain.config.boosted import BOOSTED, eval_metric
from pgtrain.config.metrics import REGRESSION
from pgtrain.core.errors import ConfigError, PgtrainError
from pgtrain.data import input_record
from pgtrain.data.encoding import UNSEEN_CLASS
from pgtrain.models.booster import BOOSTER, BoostedModel, build, xgboost_module
from pgtrain.runs import record
from pgtrain.store import model_store, tensors
from trainer import collectives
from trainer.evaluate import Task, balanced_class_weights, epoch_figures, test_figures
from trainer.start import check_encoding_parent, init_version
from trainer.stopping import BEST_EPOCH


def tracker_address(local_size: int, size: int) -> str:
    """Where the other ranks reach rank 0's tracker: loopback when every rank is on this host, else this host's
    address (a pod's IP on Kubernetes)."""
    return "127.0.0.1" if local_size >= size else socket.gethostbyname(socket.gethostname())


def warm_start(conn: psycopg.Connection, run: record.Run, rank: int) -> tuple[int | None, bytes | None]:
    """(parent version, its booster's bytes) on every rank: rank 0 reads them; a version without trees is a
    refusal every rank raises."""
    shared: dict[str, Any] = {"version": None, "raw": None, "error": None}
    if rank == 0:
        try:
            shared["version"] = init_version(conn, run)
            if shared["version"] is not None:
                _, arrays = model_store.load_tensors(conn, run.model_name, shared["version"])
                if set(arrays) != {BOOSTER}:
                    raise ConfigError(
                        f"init_from={run.config.init_from!r}: version {shared['version']} of model "
                        f"{run.model_name!r} is not a {BOOSTED} model: a boosted run adds trees to a boosted "
                        "version only; use init_from=scratch")
                shared["raw"] = bytes(arrays[BOOSTER].tobytes())
        except PgtrainError as error:
            shared["error"] = str(error)
    shared = collectives.broadcast_object(shared, "boosted_start")
    if shared["error"]:
        raise ConfigError(shared["error"])
    return shared["version"], shared["raw"]


def train_rank(conn: psycopg.Connection, run: record.Run, shards: list[record.Shard], local_size: int,
               device: torch.device, load: Callable[[], Any]) -> int:
    """One rank of a boosted run: load its rows (``load``: the MLP path's loader call), grow the trees with the
    other ranks, (rank 0) record every round's figures and stage the booster."""

    xgboost = xgboost_module()
    rank, size, config = collectives.rank(), collectives.size(), run.config
    regression = config.task == REGRESSION
    planned = input_record.of_run(run)
    output_dim = planned.output_dim
    model = build(planned.input_dim, output_dim, config.model_options_for_build, run.encoding, planned.task)
    options = model.options
    parent, parent_raw = warm_start(conn, run, rank)
    check_encoding_parent(run, parent)
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = load().split()
    labels = y_train.astype(np.float32) if regression else y_train
    weight = None
    if not regression and config.class_weight == "balanced":
        weight = balanced_class_weights(torch.from_numpy(y_train), output_dim).numpy()[y_train]
    known = y_val != UNSEEN_CLASS if not regression else np.ones(len(y_val), bool)  # no label XGBoost can score
    validation_rows = sum(s.val_count for s in shards)  # the test rows choose nothing: not even the round
    stop_on = eval_metric(config.early_stopping_metric, config.task, output_dim)
    loss_metric = "rmse" if regression else "logloss" if output_dim == 2 else "mlogloss"
    metrics = [loss_metric] + ([] if regression else ["error" if output_dim == 2 else "merror"])
    params = {
        "objective": "reg:squarederror" if regression else "binary:logistic" if output_dim == 2 else "multi:softprob",
        "eta": options["learning_rate"], "max_depth": options["max_depth"],
        "min_child_weight": options["min_child_weight"], "subsample": options["subsample"],
        "colsample_bytree": options["colsample_bytree"], "lambda": options["reg_lambda"],
        "alpha": options["reg_alpha"], "gamma": options["gamma"], "max_bin": options["max_bin"],
        "max_cat_to_onehot": options["max_cat_to_onehot"], "tree_method": "hist", "seed": config.seed,
        "nthread": torch.get_num_threads(), "eval_metric": [m for m in metrics if m != stop_on] + [stop_on],
        "device": f"cuda:{device.index}" if device.type == "cuda" else "cpu",
    }
    if not regression and output_dim > 2:
        params["num_class"] = output_dim
    stopping = bool(config.early_stopping_patience) and validation_rows > 0
    tracker = None
    if size > 1:
        if rank == 0:
            tracker = xgboost.tracker.RabitTracker(n_workers=size, host_ip=tracker_address(local_size, size),
                                                   port=0, sortby="task", timeout=int(config.collective_timeout))
            tracker.start()
        worker_args = collectives.broadcast_object(tracker.worker_args() if tracker else None, "xgboost_tracker")
        worker_args["dmlc_task_id"] = str(rank)  # XGBoost's rank is the run's (sortby="task"): the same row order
    history: dict[str, dict[str, list[float]]] = {}
    parent_booster = xgboost.Booster(model_file=bytearray(parent_raw)) if parent_raw else None
    # XGBoost counts a warm start's parent rounds in best_iteration; this run's rounds are numbered from 1
    parent_rounds = parent_booster.num_boosted_rounds() if parent_booster is not None else 0
    started = time.perf_counter()
    with xgboost.collective.CommunicatorContext(**worker_args) if size > 1 else nullcontext():
        dtrain = model.matrix(x_train, labels, weight)
        evals = [(dtrain, "train")]
        if validation_rows:
            evals.append((model.matrix(x_val[known], y_val[known].astype(np.float32)), "val"))
        callbacks = [xgboost.callback.EarlyStopping(rounds=options["early_stopping_rounds"], metric_name=stop_on,
                                                    data_name="val", save_best=True)] if stopping else []
        if rank == 0:  # the rounds so far, as they come: what the stall guard watches (progress_callback)
            callbacks.append(progress_callback(xgboost, conn, run.run_id, regression, started))
        booster = xgboost.train(params, dtrain, num_boost_round=options["n_estimators"], evals=evals,
                                evals_result=history, verbose_eval=False, callbacks=callbacks,
                                xgb_model=parent_booster)
    seconds = time.perf_counter() - started
    if tracker is not None:
        tracker.wait_for()
    model.set_booster(booster)
    rounds = len(history["train"][loss_metric])
    best = int(getattr(booster, "best_iteration", rounds - 1)) + 1 - parent_rounds if stopping else None
    kept = final_figures(model, run, (x_train, y_train, x_val, y_val), validation_rows, output_dim)
    test_rows = sum(s.test_count for s in shards)
    tested = kept_on_test_rows(model, run, x_test, y_test, test_rows, output_dim) if test_rows else None
    if rank == 0:
        if tested:
            record.set_test_metrics(conn, run.run_id, tested)
        record.set_model_layout(conn, run.run_id, {BOOSTER: {"shape": list(model.booster.shape), "dtype": "uint8"}})
        record.set_init_version(conn, run.run_id, parent)
        for number, figures in enumerate(round_figures(history, regression, seconds, rounds), start=1):
            if best is not None:
                figures[BEST_EPOCH] = best
            record.record_epoch(conn, run.run_id, number, {**figures, **kept} if number == (best or rounds)
                                else figures)
        tensors.write_staged(conn, run.run_id, {BOOSTER: model.booster.numpy()})
        record.set_status(conn, run.run_id, "trained")
        tensors.delete_checkpoints(conn, run.run_id)
        conn.close()
        print(f"{BOOSTED}: {rounds} rounds in {seconds:.2f} s on {size} rank{'s' if size > 1 else ''}"
              + (f", the best by {stop_on} is round {best}: its trees are the run's" if best else "")
              + f"; staged {len(model.booster)} bytes for run {run.run_id}", flush=True)
    collectives.shutdown()
    return 0


PROGRESS_SECONDS = 10.0  # how often rank 0 records the rounds so far while the trees grow


def progress_callback(xgboost: Any, conn: psycopg.Connection, run_id: str, regression: bool,
                      started: float) -> Any:
    """Rank 0's record of the rounds grown so far, at most every PROGRESS_SECONDS: a long boosted run shows its
    progress on the models page and to the stall guard (pgtrain.launch.stall), which would otherwise see no epoch
    until the last round. The final record (train_rank) rewrites these rows with the kept round's figures."""

    class Progress(xgboost.callback.TrainingCallback):
        def __init__(self) -> None:
            super().__init__()
            self.recorded = time.perf_counter()

        def after_iteration(self, model: Any, epoch: int, evals_log: Mapping[str, Any]) -> bool:
            now = time.perf_counter()
            if now - self.recorded >= PROGRESS_SECONDS:
                self.recorded = now
                rounds = len(next(iter(evals_log.get("train", {}).values()), []))
                if rounds:
                    figures = round_figures(evals_log, regression, now - started, rounds)[-1]
                    record.record_epoch(conn, run_id, rounds, figures)
            return False

    return Progress()


def round_figures(history: Mapping[str, Mapping[str, list[float]]], regression: bool, seconds: float,
                  rounds: int) -> list[dict[str, Any]]:
    """Each round's figures from XGBoost's evaluations (every rank's rows): the losses in the registry's sense
    (regression: mean squared error in the target's units; classification: log loss), RMSE or accuracy."""
    out = []
    for i in range(rounds):
        figures: dict[str, Any] = {"seconds": seconds / rounds, "samples_per_second": None}
        for part in ("train", "val"):
            found = history.get(part, {})
            for name, values in found.items():
                value = float(values[i])
                if name == "rmse":
                    figures[f"{part}_loss"] = value * value
                    if part == "val":
                        figures["val_rmse"] = value
                elif name in ("logloss", "mlogloss"):
                    figures[f"{part}_loss"] = value
                elif name in ("error", "merror"):
                    figures[f"{part}_accuracy"] = 1.0 - value
                elif name == "mae" and part == "val":
                    figures["val_mae"] = value
                elif name == "auc" and part == "val":
                    figures["val_roc_auc"] = value
        out.append(figures)
    return out


def kept_on_test_rows(model: BoostedModel, run: record.Run, x: np.ndarray, y: np.ndarray, test_rows: int,
                      output_dim: int) -> dict[str, Any]:
    """The kept trees' figures on the test rows of all ranks (rows that chose nothing), as the MLP's are read."""
    x_test, y_test = (torch.from_numpy(np.ascontiguousarray(a)) for a in (x, y))
    if model.regression:
        y_test = y_test.float().reshape(-1, 1)
    task = Task(model.regression, output_dim, torch.device("cpu"), None, input_record.of_run(run).classes)
    with torch.no_grad():
        return test_figures(task, model, x_test, y_test, y_test, test_rows)


def final_figures(model: BoostedModel, run: record.Run, rows: tuple[np.ndarray, ...], validation_rows: int,
                  output_dim: int) -> dict[str, Any]:
    """The kept trees' figures by the MLP's own code (trainer.evaluate): every metric of the registry, exact."""
    x_train, y_train, x_val, y_val = (torch.from_numpy(np.ascontiguousarray(a)) for a in rows)
    regression = model.regression
    if regression:
        y_train, y_val = y_train.float().reshape(-1, 1), y_val.float().reshape(-1, 1)
    task = Task(regression, output_dim, torch.device("cpu"), None, input_record.of_run(run).classes)
    train_sums = task.train_sums()
    with torch.no_grad():
        if len(x_train):
            out = model(x_train)
            task.add_train(train_sums, task.loss(out, y_train), out, y_train)
        gather = task.gathers(validation_rows)
        val_sums, probabilities = task.validation(model, x_val, y_val, y_val, gather)
    totals = collectives.allreduce_sum(torch.cat([train_sums, torch.tensor([float(len(x_train))], dtype=torch.float64),
                                                  val_sums, torch.tensor([float(len(x_val))], dtype=torch.float64)]),
                                       "boosted_totals")
    return epoch_figures(task, totals, task.exact_metrics(probabilities, y_val) if gather else None)
