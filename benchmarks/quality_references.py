"""bench_quality's references (issue 31 item 4): the libraries pgtrain's built-ins are measured against, fitted on
the rows bench_quality hands them, and the figures they are compared by.

References, each fitted on the run's training rows (the same inputs for all: ``inputs``) and scored on the rows every
figure is read on:

- ``logistic_regression`` (classification; max_iter 5000) or ``ridge`` (regression): the linear baselines;
- ``hist_gradient_boosting``, ``lightgbm``, ``xgb`` (the xgboost library's XGBClassifier / XGBRegressor) and
  ``catboost``: gradient-boosted trees at their library defaults (random seed 0, CatBoost silent); they see the
  training rows only: no early stopping (HistGradientBoosting's own "auto" stops on a slice of its training rows
  only above 10,000 of them, which no table here has);
- ``plain_mlp`` (3 hidden layers of 256, ReLU) and ``tabm`` (the ``tabm`` package's ``TabM.make`` defaults:
  3 blocks of 512 (or $PGTRAIN_BENCH_QUALITY_TABM_D_BLOCK), dropout 0.1, k = 32 shared-weight members, their mean
  the prediction): trained here with AdamW
  (plain_mlp 1e-3, weight decay 1e-4; tabm 2e-3, 3e-4 as its authors train it), batches of 256, the regression
  target standardized, up to ``NETWORK_EPOCHS`` epochs with early stopping on the validation rows (patience
  ``NETWORK_PATIENCE``, the best epoch's weights kept), as pgtrain's built-ins stop on them. A time limit per
  network ($PGTRAIN_BENCH_QUALITY_NETWORK_SECONDS, default 600) ends training early on a slow machine; the
  figures say how many epochs ran and whether the limit cut them.

Figures (``METRICS``: one function each, for a figure and for the bootstrap alike): accuracy, ROC AUC, R² and RMSE;
``bootstrap_difference``: the 95% paired bootstrap interval of a difference of two models' figures on the same rows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

LR, RIDGE, HGB = "logistic_regression", "ridge", "hist_gradient_boosting"
LIGHTGBM, XGB, CATBOOST, PLAIN_MLP, TABM = "lightgbm", "xgb", "catboost", "plain_mlp", "tabm"
TREES = (HGB, LIGHTGBM, XGB, CATBOOST)
NETWORKS = (PLAIN_MLP, TABM)
SEED = 0
NETWORK_EPOCHS, NETWORK_PATIENCE, NETWORK_BATCH = 200, 16, 256
LOWER_IS_BETTER = frozenset({"rmse"})  # every other figure (accuracy, roc_auc, r2): higher is better


def references(regression: bool) -> tuple[str, ...]:
    """Every reference for a task, linear baseline first; $PGTRAIN_BENCH_QUALITY_REFERENCES (comma-separated names)
    keeps only those named (a slow machine's way to leave TabM out)."""
    every = (RIDGE if regression else LR, *TREES, *NETWORKS)
    chosen = [n for n in os.environ.get("PGTRAIN_BENCH_QUALITY_REFERENCES", "").split(",") if n]
    unknown = sorted(set(chosen) - {LR, RIDGE, *TREES, *NETWORKS})
    if unknown:
        raise SystemExit(f"PGTRAIN_BENCH_QUALITY_REFERENCES: unknown references {unknown}: use some of "
                         f"{', '.join((LR, RIDGE, *TREES, *NETWORKS))}")
    return tuple(n for n in every if not chosen or n in chosen)


def best_reference(figures: dict[str, dict[str, float]], metric: str, names: Sequence[str]) -> tuple[str, float]:
    """(name, figure) of the reference that does best at ``metric`` among ``names`` (lowest for an RMSE; of equals,
    the first named)."""
    scored = [(n, figures[n][metric]) for n in names if metric in figures.get(n, {})]
    return (min if metric in LOWER_IS_BETTER else max)(scored, key=lambda pair: pair[1])


def vs_best_reference(ours: float, figures: dict[str, dict[str, float]], metric: str, names: Sequence[str]
                      ) -> tuple[str, float]:
    """(the best reference, ours minus its figure): negative = behind, except for an RMSE (lower is better), where
    negative = ahead."""
    name, value = best_reference(figures, metric, names)
    return name, ours - value


def accuracy(y: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """The share of rows whose most probable class is theirs; a leading axis of resamples gives one per resample."""
    return (probabilities.argmax(-1) == y).mean(-1)


def roc_auc(y: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """ROC AUC (binary: of class 1, the second in class order; else macro one-vs-rest) of class probabilities whose
    columns are the classes 0..k-1, as sklearn's roc_auc_score; a leading axis of resamples gives one per resample;
    NaN where it is undefined (a class missing from ``y``)."""
    classes = probabilities.shape[-1]
    return np.mean([_binary_roc_auc(y == c, probabilities[..., c]) for c in ([1] if classes == 2 else range(classes))],
                   axis=0)


def _binary_roc_auc(positive: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """The area under the ROC curve as the Mann-Whitney statistic: the chance that a positive row scores above a
    negative one, ties counting half (the rank sum of the positives, ties given their mean rank)."""
    from scipy.stats import rankdata

    positives = positive.sum(-1)
    pairs = positives * (positive.shape[-1] - positives)
    with np.errstate(invalid="ignore", divide="ignore"):  # no pairs: undefined, NaN
        return ((rankdata(scores, axis=-1) * positive).sum(-1) - positives * (positives + 1) / 2) / pairs


def r2(y: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """The coefficient of determination (as sklearn's r2_score); a leading axis of resamples gives one per resample."""
    residual = ((y - predicted) ** 2).sum(-1)
    return 1.0 - residual / ((y - y.mean(-1, keepdims=True)) ** 2).sum(-1)


def rmse(y: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    return np.sqrt(((y - predicted) ** 2).mean(-1))


METRICS = {"accuracy": accuracy, "roc_auc": roc_auc, "r2": r2, "rmse": rmse}  # each: (y, predicted) -> figure


def classification_figures(y: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    """accuracy and ROC AUC (``roc_auc``) of class probabilities whose columns are the classes 0..k-1."""
    return {"accuracy": float(accuracy(y, probabilities)), "roc_auc": float(roc_auc(y, probabilities))}


def regression_figures(y: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    return {"r2": float(r2(y, predicted)), "rmse": float(rmse(y, predicted))}


def bootstrap_difference(y: np.ndarray, ours: np.ndarray, theirs: np.ndarray, metric: str, resamples: int = 2000,
                         seed: int = 0) -> tuple[float, float]:
    """The 95% percentile interval of ``metric``(ours) - ``metric``(theirs) over ``resamples`` paired bootstrap
    resamples of the rows (both scored on the same drawn rows); ``ours``/``theirs``: predicted values, or class
    probabilities (a column per class). Resamples where the metric is undefined (ROC AUC of one class) are
    skipped."""
    function = METRICS[metric]
    rows = np.random.default_rng(seed).integers(0, len(y), size=(resamples, len(y)))
    differences = np.concatenate([function(y[chunk], ours[chunk]) - function(y[chunk], theirs[chunk])
                                  for chunk in np.array_split(rows, max(1, resamples // 100))])
    low, high = np.percentile(differences[np.isfinite(differences)], [2.5, 97.5])
    return float(low), float(high)


def inputs(frame: object, numeric: list, text: list, train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Every reference's inputs (float32): numbers mean-imputed (fitted on the training rows) with a "was missing"
    indicator where there are NULLs, and standardized; text one-hot (NULL a level of its own, a level unseen in
    training all zeros). The training rows' first, then each of ``others``' rows."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    prepare = ColumnTransformer([
        ("numbers", make_pipeline(SimpleImputer(strategy="mean", add_indicator=True), StandardScaler()), numeric),
        ("text", OneHotEncoder(handle_unknown="ignore", sparse_output=False), text)])
    first = prepare.fit_transform(frame[train])
    return [first.astype(np.float32), *(prepare.transform(frame[rows]).astype(np.float32) for rows in others)]


@dataclass(frozen=True)
class Data:
    """One table's reference inputs and targets (classes as 0..classes-1; ``classes`` 0 for a regression)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_validation: np.ndarray
    y_validation: np.ndarray
    x_scored: np.ndarray
    classes: int

    @property
    def regression(self) -> bool:
        return self.classes == 0


def fit_and_score(name: str, data: Data) -> tuple[np.ndarray, dict[str, float | int | bool]]:
    """(``name``'s predictions on the scored rows: values, or class probabilities with a column per class,
    what the fit reports: {"epochs": ..., "time_limited": ...} for a network, {} for the others)."""
    if name in NETWORKS:
        return _network(name, data)
    model = _library_model(name, data.regression).fit(data.x_train, data.y_train)
    if data.regression:
        return np.asarray(model.predict(data.x_scored), np.float64).ravel(), {}
    probabilities = np.zeros((len(data.x_scored), data.classes))
    seen = np.asarray(model.classes_, np.int64)  # a class missing from the training rows: probability 0
    probabilities[:, seen] = model.predict_proba(data.x_scored)
    return probabilities, {}


def _library_model(name: str, regression: bool):
    if name == LR:
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(max_iter=5000, random_state=SEED)
    if name == RIDGE:
        from sklearn.linear_model import Ridge

        return Ridge()
    if name == HGB:
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        return (HistGradientBoostingRegressor if regression else HistGradientBoostingClassifier)(random_state=SEED)
    if name == LIGHTGBM:
        import lightgbm

        return (lightgbm.LGBMRegressor if regression else lightgbm.LGBMClassifier)(random_state=SEED, verbose=-1)
    if name == XGB:
        import xgboost

        return (xgboost.XGBRegressor if regression else xgboost.XGBClassifier)(random_state=SEED)
    if name == CATBOOST:
        import catboost

        return (catboost.CatBoostRegressor if regression else catboost.CatBoostClassifier)(
            random_seed=SEED, verbose=False, allow_writing_files=False)
    raise ValueError(f"unknown reference {name!r}")


def _network(name: str, data: Data) -> tuple[np.ndarray, dict[str, float | int | bool]]:
    import torch

    torch.manual_seed(SEED)
    outputs = 1 if data.regression else data.classes
    width = data.x_train.shape[1]
    if name == TABM:
        import tabm

        # $PGTRAIN_BENCH_QUALITY_TABM_D_BLOCK: narrower blocks where the package's 512 does not fit in time
        d_block = int(os.environ.get("PGTRAIN_BENCH_QUALITY_TABM_D_BLOCK") or 512)
        model: torch.nn.Module = tabm.TabM.make(n_num_features=width, d_out=outputs, d_block=d_block)
        rate, decay = 2e-3, 3e-4
    else:
        layers: list[torch.nn.Module] = []
        for d_in in (width, 256, 256):
            layers += [torch.nn.Linear(d_in, 256), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(256, outputs))
        rate, decay = 1e-3, 1e-4
    limit = float(os.environ.get("PGTRAIN_BENCH_QUALITY_NETWORK_SECONDS") or 600)
    predicted, epochs, since = fit_network(model, data, rate, decay, NETWORK_BATCH, NETWORK_EPOCHS,
                                           NETWORK_PATIENCE, limit)
    time_limited = epochs < NETWORK_EPOCHS and since < NETWORK_PATIENCE
    return predicted, {"epochs": epochs, "best_epoch": epochs - since, "time_limited": time_limited}


def fit_network(model: torch.nn.Module, data: Data, rate: float, decay: float, batch: int, epochs: int,
                patience: int, seconds: float = float("inf")) -> tuple[np.ndarray, int, int]:
    """Train ``model`` (rows -> outputs, or rows -> members -> outputs) with AdamW on ``data``'s training rows, the
    regression target standardized, stopping early on the validation rows (``early_stopped``): (its predictions on
    the scored rows, in the target's units or as class probabilities; epochs run; epochs since the best)."""
    import torch

    mean, scale = (float(data.y_train.mean()), float(data.y_train.std()) or 1.0) if data.regression else (0.0, 1.0)

    def target(y: np.ndarray) -> torch.Tensor:
        return torch.tensor((y - mean) / scale, dtype=torch.float32) if data.regression else torch.tensor(y)

    def members(x: torch.Tensor) -> torch.Tensor:
        """(rows, members, outputs): TabM's k predictions, a plain network's one."""
        out = model(x)
        return out if out.ndim == 3 else out[:, None, :]

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each member's loss, averaged over the members (TabM trains its members this way)."""
        k = out.shape[1]
        if data.regression:
            return torch.nn.functional.mse_loss(out[..., 0], y[:, None].expand(-1, k))
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), y.repeat_interleave(k))

    @torch.no_grad()
    def predict(x: np.ndarray) -> torch.Tensor:
        """The members' mean: of the standardized value, or of the class probabilities."""
        model.eval()
        out = torch.cat([members(chunk) for chunk in torch.from_numpy(x).split(4096)])
        return out[..., 0].mean(1) if data.regression else out.softmax(-1).mean(1)

    def validation_loss() -> float:
        predicted, y = predict(data.x_validation), target(data.y_validation)
        if data.regression:
            return float(((predicted - y) ** 2).mean())
        return float(torch.nn.functional.nll_loss(predicted.clamp_min(1e-12).log(), y))

    optimizer = torch.optim.AdamW(model.parameters(), lr=rate, weight_decay=decay)
    ran, since = early_stopped(model, lambda x, y: loss(members(x), y), validation_loss, optimizer,
                               torch.from_numpy(data.x_train), target(data.y_train), batch, epochs, patience,
                               seconds)
    predicted = predict(data.x_scored).double().numpy()
    return (predicted * scale + mean if data.regression else predicted), ran, since


def early_stopped(model: torch.nn.Module, batch_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  validation_loss: Callable[[], float], optimizer: torch.optim.Optimizer, x: torch.Tensor,
                  y: torch.Tensor, batch: int, epochs: int, patience: int, seconds: float = float("inf")
                  ) -> tuple[int, int]:
    """Train ``model`` (torch) on ``x``, ``y`` in epochs of shuffled batches (``batch_loss(x, y)``, SEED's order)
    until ``epochs`` ran, ``patience`` epochs passed without a lower ``validation_loss()``, or ``seconds``; then
    load the best epoch's weights. (epochs run, epochs since the best)."""
    import torch

    start, best, best_state, since, ran = time.perf_counter(), float("inf"), None, 0, 0
    generator = torch.Generator().manual_seed(SEED)
    while ran < epochs and since < patience and time.perf_counter() - start < seconds:
        model.train()
        for rows in torch.randperm(len(x), generator=generator).split(batch):
            optimizer.zero_grad()
            batch_loss(x[rows], y[rows]).backward()
            optimizer.step()
        ran += 1
        current = validation_loss()
        if current < best:
            best, since = current, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            since += 1
    if best_state is None:
        raise RuntimeError(f"no epoch of {ran} had a finite validation loss: the network diverged")
    model.load_state_dict(best_state)
    return ran, since
